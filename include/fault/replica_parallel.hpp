#pragma once
// Replica-parallel saves: when R ranks hold the same state (data-parallel replicas), each
// writes 1/R of it, so that a step's save puts every byte on storage once instead of R times.
//
//   fault::ReplicaParallel shared(comm, checkpoints, [&] { return opt.piece_map(); });
//   fault::GlobalIndexer indexer(comm, shared, dir, [&] { return shared.piece_map(); });
//   trainer.train(epochs, data, nn::callbacks(shared, indexer));   // not `checkpoints`
//   ...
//   auto resumed = fault::load_latest_resharded(comm, dir, trainer.load_target(), opt.piece_map());
//
// The tensors every rank holds alike (those a PieceMap leaves whole with Copies::same) are
// laid end to end in the state's order and cut into R runs of equal bytes, each cut moved to
// the nearest row of the tensor it falls in (replica_share()); rank k writes run k, as pieces
// of the global tensors. The pieces of sharded state (a ShardLayout's: each kept by the ranks
// of its replica group) are cut the same way among the ranks of their group. Everything else
// goes whole (its per-rank entries, values). The split depends only on the state's names,
// dtypes and shapes, so every rank computes the same one. A rank's file is then a part of the step, not
// a checkpoint of its own: the step is whole once its global index is committed (which
// checks that the pieces cover every tensor), and it is loaded through the index, on any
// number of ranks (fault::load_latest_resharded, ckpt::load_resharded).
//
// Loads the other way round: load_resharded_read_once() has the ranks that load the same
// tensors (or pieces, in a replica group) read them from storage once, each its run, and pass
// the runs over the communicator; every rank checks what it receives before it uses it.
// fault::load_latest_resharded does this.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../ckpt/detail/hash.hpp"
#include "../ckpt/param_dict.hpp"
#include "../ckpt/reshard.hpp"
#include "../nn/callbacks.hpp"
#include "communicator.hpp"

namespace fault {

/// Where a rank stands among the ranks that keep the same pieces of sharded state (a replica
/// group of a ShardLayout: ranks / shard_size ranks keep each piece): `size` ranks, of which it
/// is the `member`-th by rank. The default, a group of one, writes its pieces whole.
struct ReplicaGroup {
    int size = 1;
    int member = 0;
};

/// What one of R replicas writes of the state they hold alike (replica_share()).
struct ReplicaShare {
    /// Its runs of the shared tensors and of its group's pieces (views, named as the entries),
    /// then every other entry.
    ckpt::ParamDict state;
    /// Where its runs sit in the global tensors, for the global index: one PiecePlace for each
    /// entry it holds a part of; an entry it holds whole is not listed (its declared place, if
    /// any, is its place).
    ckpt::PieceMap places;
    std::uint64_t shared_bytes = 0;  ///< the shared tensors' bytes, all replicas' runs together
    std::uint64_t group_bytes = 0;   ///< its group's pieces' bytes, all members' runs together
    std::uint64_t own_bytes = 0;     ///< of those, this replica's runs
};

namespace detail {

/// The bytes of one row of `t` in its stored (row-major) form: a piece is whole rows of it.
inline std::uint64_t stored_row_bytes(const ckpt::Tensor& t) {
    std::uint64_t row = ckpt::itemsize(t.dtype());
    for (std::size_t d = 1; d < t.shape().size(); ++d) row *= static_cast<std::uint64_t>(t.shape()[d]);
    return row;
}

/// Rows [lo, hi) of `t`'s stored form, as a view that keeps `t`'s bytes alive.
inline ckpt::Tensor stored_rows(const ckpt::Tensor& t, std::uint64_t lo, std::uint64_t hi) {
    ckpt::Shape stored = t.shape();
    stored[0] = static_cast<std::int64_t>(hi - lo);
    const ckpt::Shape logical = t.order() == ckpt::Order::column_major ? ckpt::detail::reversed(stored) : stored;
    auto owner = std::make_shared<ckpt::Tensor>(t);
    std::byte* at = owner->data() + lo * stored_row_bytes(t);
    return ckpt::Tensor::aliasing(t.dtype(), logical, std::move(owner), at, t.order());
}

/// Whether entry `e` is one the replicas hold alike: a tensor that `declared` leaves whole,
/// with Copies::same.
inline bool shared_alike(const ckpt::ParamDict::Entry& e, const ckpt::PieceMap& declared) {
    if (!e.value.get_if<ckpt::Tensor>()) return false;
    const auto it = declared.find(e.name);
    return it == declared.end() || (it->second.whole() && it->second.copies == ckpt::Copies::same);
}

/// The place `declared` gives entry `e` when it is a piece of sharded state (a tensor placed
/// in a global one, with Copies::same), which the ranks of its replica group hold alike.
inline const ckpt::PiecePlace* group_piece(const ckpt::ParamDict::Entry& e, const ckpt::PieceMap& declared) {
    if (!e.value.get_if<ckpt::Tensor>()) return nullptr;
    const auto it = declared.find(e.name);
    if (it == declared.end() || it->second.whole() || it->second.copies != ckpt::Copies::same) return nullptr;
    return &it->second;
}

/// Run `part` of `parts` of some tensors laid end to end (`total` bytes): bytes [begin, end).
/// Each tensor is offered in turn (take()); it goes whole, in rows, or not at all.
class RunCutter {
public:
    RunCutter(std::uint64_t total, int parts, int part)
        : begin_(cut(total, static_cast<std::uint64_t>(parts), static_cast<std::uint64_t>(part))),
          end_(cut(total, static_cast<std::uint64_t>(parts), static_cast<std::uint64_t>(part) + 1)), first_(part == 0) {}

    /// Takes the run's part of entry `name`, tensor `t`, whose elements start at `place.first`
    /// of `place.global` (an entry of its own: a place with no global name), into `out`.
    void take(const std::string& name, const ckpt::Value& value, const ckpt::PiecePlace& place, ReplicaShare& out) {
        const ckpt::Tensor& t = *value.get_if<ckpt::Tensor>();
        const std::uint64_t n = t.nbytes(), at = offset_;
        offset_ += n;
        if (t.shape().empty() || n == 0) {  // one element, or none: whole, to the run its first byte is in
            if ((at >= begin_ && at < end_) || (n == 0 && first_)) {
                out.state.set(name, value);
                out.own_bytes += n;
            }
            return;
        }
        // the row a cut falls nearest to; the same function on both sides of a cut, so that
        // neighbouring runs meet
        const std::uint64_t row = stored_row_bytes(t), rows = n / row;
        auto row_of = [&](std::uint64_t byte) {
            const std::uint64_t inside = std::clamp(byte, at, at + n) - at;
            return (inside + row / 2) / row;
        };
        const std::uint64_t lo = row_of(begin_), hi = row_of(end_);
        if (lo >= hi) return;
        out.own_bytes += (hi - lo) * row;
        if (lo == 0 && hi == rows) {
            out.state.set(name, value);
            return;
        }
        out.state.set(name, stored_rows(t, lo, hi));
        ckpt::PiecePlace part = place;
        if (part.whole()) {
            part.global = name;
            part.global_shape = t.shape();
        }
        part.first += lo * (row / ckpt::itemsize(t.dtype()));
        out.places[name] = std::move(part);
    }

private:
    // floor(bytes * j / R), without the product
    static std::uint64_t cut(std::uint64_t bytes, std::uint64_t R, std::uint64_t j) { return bytes / R * j + bytes % R * j / R; }

    std::uint64_t begin_, end_;
    std::uint64_t offset_ = 0;  // of the next tensor
    bool first_;
};

}  // namespace detail

/// Replica `replica`'s share of `state`, which `replicas` ranks hold alike: see the top of this
/// header. `declared` is the state's PieceMap (a DataParallelOptimizer's piece_map()): entries
/// it declares per-rank or replicated, and values, are not shared and stay whole in every
/// share. The pieces of sharded state it places are held alike by this rank's replica group
/// (`group`): they are cut among its members as the shared tensors are among all replicas;
/// with a group of one, they stay whole. A tensor of rank 0 is never cut. Every replica must
/// pass a state of the same names, dtypes and shapes, in the same order, and the members of a
/// group the same pieces.
inline ReplicaShare replica_share(const ckpt::ParamDict& state, int replicas, int replica,
                                  const ckpt::PieceMap& declared = {}, ReplicaGroup group = {}) {
    if (replicas < 1 || replica < 0 || replica >= replicas)
        throw ckpt::ConfigError("replica_share: replica " + std::to_string(replica) + " of " + std::to_string(replicas));
    if (group.size < 1 || group.member < 0 || group.member >= group.size || group.size > replicas)
        throw ckpt::ConfigError("replica_share: member " + std::to_string(group.member) + " of a replica group of " +
                                std::to_string(group.size) + ", among " + std::to_string(replicas) + " replicas");
    ReplicaShare out;
    for (const auto& e : state) {
        if (detail::shared_alike(e, declared)) out.shared_bytes += e.value.get_if<ckpt::Tensor>()->nbytes();
        else if (detail::group_piece(e, declared)) out.group_bytes += e.value.get_if<ckpt::Tensor>()->nbytes();
    }
    detail::RunCutter shared(out.shared_bytes, replicas, replica), pieces(out.group_bytes, group.size, group.member);
    for (const auto& e : state) {
        if (detail::shared_alike(e, declared)) shared.take(e.name, e.value, {}, out);
        else if (const ckpt::PiecePlace* place = detail::group_piece(e, declared)) pieces.take(e.name, e.value, *place, out);
        else out.state.set(e.name, e.value);
    }
    return out;
}

namespace detail {

/// A key of the pieces of sharded state `declared` places in `state` (group_piece()): their
/// names, places, dtypes, orders and shapes. Ranks of equal keys are a replica group.
inline std::uint64_t pieces_key(const ckpt::ParamDict& state, const ckpt::PieceMap& declared) {
    ckpt::detail::Xxh3 h;
    for (const auto& e : state) {
        const ckpt::PiecePlace* place = group_piece(e, declared);
        if (!place) continue;
        const ckpt::Tensor& t = *e.value.get_if<ckpt::Tensor>();
        const std::uint64_t kind[] = {static_cast<std::uint64_t>(t.dtype()), static_cast<std::uint64_t>(t.order()),
                                      place->first, t.shape().size(), place->global_shape.size()};
        h.update(e.name.data(), e.name.size() + 1);
        h.update(place->global.data(), place->global.size() + 1);
        h.update(kind, sizeof kind);
        h.update(t.shape().data(), t.shape().size() * sizeof(t.shape()[0]));
        h.update(place->global_shape.data(), place->global_shape.size() * sizeof(place->global_shape[0]));
    }
    return h.digest();
}

/// load_resharded_read_once(); with `index` null, this rank failed before it could load
/// (its caller holds the error) and only tells the others so.
template <Communicator Comm>
ckpt::ReshardedState load_read_once(Comm& comm, const ckpt::GlobalIndex* index_or_null, const ckpt::PathArg& index_file,
                                    const ckpt::ParamDict& like, const ckpt::PieceMap& places,
                                    const ckpt::LoadOptions& opts) {
    if (comm.size() == 1) {
        if (!index_or_null) return {};
        return ckpt::load_resharded(*index_or_null, index_file, like, places, opts, comm.rank());
    }
    static const ckpt::GlobalIndex none;
    const ckpt::GlobalIndex& index = index_or_null ? *index_or_null : none;
    const std::string where = "global index '" + index_file.string() + "'";
    std::map<std::string_view, std::vector<const ckpt::TensorPiece*>> by_tensor;  // the index's pieces by tensor
    for (const auto& p : index.pieces) by_tensor[p.global].push_back(&p);
    // the tensors every rank loads alike, the pieces of sharded state this rank's replica group
    // loads alike, and the rest
    ckpt::ParamDict alike, pieces, own;
    std::uint64_t alike_bytes = 0, piece_bytes = 0;
    ckpt::detail::Xxh3 layout;  // of the tensors loaded alike: every rank must cut the same ones
    for (const auto& e : like) {
        const ckpt::Tensor* t = e.value.template get_if<ckpt::Tensor>();
        const auto place = places.find(e.name);
        if (group_piece(e, places)) {
            pieces.set(e.name, e.value);
            piece_bytes += t->nbytes();
            continue;
        }
        if (!t || (place != places.end() && !place->second.whole()) ||
            ckpt::detail::copies_of(e.name, places, index) != ckpt::Copies::same) {
            own.set(e.name, e.value);
            continue;
        }
        alike.set(e.name, e.value);
        alike_bytes += t->nbytes();
        const std::int64_t kind[] = {static_cast<std::int64_t>(t->dtype()), static_cast<std::int64_t>(t->order())};
        layout.update(e.name.data(), e.name.size() + 1);
        layout.update(kind, sizeof kind);
        layout.update(t->shape().data(), t->shape().size() * sizeof(t->shape()[0]));
    }
    // who reads: the ranks that can open the index file (a rank whose view of the shared
    // directory is gone gets everything it loads alike from the others)
    const bool reads = index_or_null && ::access(index_file.c_str(), R_OK) == 0;
    struct Plan {
        std::uint64_t reads, layout, group;
    };
    const auto plans = allgather_records(comm, Plan{reads ? 1u : 0u, layout.digest(), pieces_key(like, places)});
    const auto me = static_cast<std::size_t>(comm.rank());
    std::vector<int> readers, group_readers;  // all, and those of this rank's replica group
    bool same_layout = true;
    for (std::size_t r = 0; r < plans.size(); ++r) {
        if (plans[r].reads) readers.push_back(static_cast<int>(r));
        if (plans[r].reads && plans[r].group == plans[me].group) group_readers.push_back(static_cast<int>(r));
        same_layout = same_layout && plans[r].layout == plans[0].layout;
    }
    if (!same_layout) {  // every rank knows: each reads all it needs, no exchange
        if (!index_or_null) return {};
        return ckpt::load_resharded(index, index_file, like, places, opts, comm.rank());
    }
    if (group_readers.empty()) {  // no rank of the group can read them: this rank tries alone, and says why
        for (const auto& [name, value] : pieces) own.set(name, value);
        pieces = {};
        piece_bytes = 0;
    }
    // the runs' layout, one per reader, and of the group's pieces one per reader of the group
    // (replica_share only views `like`'s tensors: nothing is written there)
    const int nreaders = std::max<int>(1, static_cast<int>(readers.size()));
    const int ngroup = std::max<int>(1, static_cast<int>(group_readers.size()));
    auto share_of = [&](int reader) { return replica_share(alike, nreaders, reader); };
    auto group_share_of = [&](int member) { return replica_share(pieces, ngroup, member, places, {ngroup, member}); };
    auto index_in = [&](const std::vector<int>& ranks, int rank) {
        const auto it = std::find(ranks.begin(), ranks.end(), rank);
        return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
    };
    const int my_reader = index_in(readers, comm.rank()), my_member = index_in(group_readers, comm.rank());
    const ReplicaShare mine = my_reader >= 0 ? share_of(my_reader) : ReplicaShare{};
    const ReplicaShare my_pieces = my_member >= 0 ? group_share_of(my_member) : ReplicaShare{};
    // this rank's runs and what it loads alone; an error is kept until every rank has said how it went
    ckpt::ReshardedState run, alone;
    std::exception_ptr error;
    try {
        if (index_or_null) {
            // what a load of every tensor would refuse, every rank refuses, whatever its run
            for (const auto& e : like)
                if (const ckpt::Tensor* t = e.value.template get_if<ckpt::Tensor>())
                    ckpt::detail::sources_of(index, by_tensor, where, e.name, *t, places, comm.rank());
            if (readers.empty() && !alike.empty())
                throw ckpt::IoError("global index '" + index_file.string() + "': no rank can read it", index_file.string(),
                                    ENOENT);
            if (reads) {
                ckpt::ParamDict runs = mine.state;
                ckpt::PieceMap run_places = places;  // the loader's, for the values the load takes too
                for (const ReplicaShare* share : {&mine, &my_pieces}) {
                    for (const auto& [name, value] : share->state) runs.set(name, value);
                    for (const auto& [name, place] : share->places) run_places[name] = place;
                }
                run = ckpt::load_resharded(index, index_file, runs, run_places, opts, comm.rank());
            }
            alone = ckpt::load_resharded(index, index_file, own, places, opts, comm.rank());
        }
    } catch (const ckpt::Error&) {
        error = std::current_exception();
    }
    const bool failed = error || !index_or_null;
    // each run's parts go to the exchange at 64-byte boundaries, so that a tensor one run holds
    // whole is used where it arrives: first those of the tensors loaded alike, then those of
    // the group's pieces, with a checksum of the latter (they are checked against it when they
    // arrive, the former against the index)
    auto padded = [](std::uint64_t n) { return (n + 63) & ~std::uint64_t{63}; };
    std::uint64_t my_bytes = 0;
    ckpt::detail::Xxh3 pieces_sent;
    for (const ReplicaShare* share : {&mine, &my_pieces})
        for (const auto& [name, value] : share->state) my_bytes += padded(value.template get_if<ckpt::Tensor>()->nbytes());
    if (!failed)
        for (const auto& [name, value] : my_pieces.state) {
            const ckpt::Tensor& t = run.state.tensor(name);
            pieces_sent.update(t.data(), t.nbytes());
        }
    struct Status {
        std::uint64_t failed, run_bytes, pieces_digest;
    };
    const auto all = allgather_records(comm, Status{failed ? 1u : 0u, my_bytes, pieces_sent.digest()});
    std::string failing;
    std::uint64_t most = 0;
    for (std::size_t r = 0; r < all.size(); ++r) {
        if (all[r].failed) failing += (failing.empty() ? "" : ", ") + std::to_string(r);
        most = std::max(most, all[r].run_bytes);
    }
    if (error) std::rethrow_exception(error);
    if (!index_or_null) return {};
    if (!failing.empty())
        throw ckpt::FormatError("global index '" + index_file.string() + "': rank(s) " + failing +
                                    " could not read their part of the tensors the ranks load alike (each says why)",
                                index_file.string());
    // the runs, each in a slot of the longest's size, in one allgather; new memory, not
    // zero-filled (huge pages where the system gives them, as a load's block)
    const std::size_t slot = static_cast<std::size_t>(most);
    const auto in_block = ckpt::detail::allocate_aligned(slot);
    const auto all_block = ckpt::detail::allocate_aligned(slot * all.size());
    std::size_t at = 0;
    for (const ReplicaShare* share : {&mine, &my_pieces})
        for (const auto& [name, value] : share->state) {
            const ckpt::Tensor& t = run.state.tensor(name);
            std::memcpy(in_block.get() + at, t.data(), t.nbytes());
            at += static_cast<std::size_t>(padded(t.nbytes()));
        }
    if (slot > 0)  // every rank knows: nothing alike to load, nothing to exchange
        comm.allgather(std::span<const float>(reinterpret_cast<const float*>(in_block.get()), slot / sizeof(float)),
                       std::span<float>(reinterpret_cast<float*>(all_block.get()), slot * all.size() / sizeof(float)));
    // a tensor one run holds whole stays where it arrived; one cut between runs is joined
    ckpt::ParamDict got;
    auto join = [&](const ReplicaShare& theirs, const ckpt::ParamDict& of, std::byte*& from, ckpt::detail::Xxh3* hash) {
        for (const auto& [name, value] : theirs.state) {
            const ckpt::Tensor& part = *value.template get_if<ckpt::Tensor>();
            const ckpt::Tensor& t = of.tensor(name);
            if (hash) hash->update(from, part.nbytes());
            const auto place = theirs.places.find(name);
            if (place == theirs.places.end()) {
                got.set(name, ckpt::Tensor::aliasing(t.dtype(), t.logical_shape(), all_block, from, t.order()));
            } else {
                // elements from the start of the entry: a run of a whole tensor starts at its
                // first element, a run of a piece at the piece's
                const std::uint64_t start = ckpt::detail::place_of(name, t, places).first;
                if (!got.contains(name)) got.set(name, ckpt::Tensor::uninitialized(t.dtype(), t.logical_shape(), t.order()));
                std::memcpy(got.tensor(name).data() + (place->second.first - start) * ckpt::itemsize(t.dtype()), from,
                            part.nbytes());
            }
            from += padded(part.nbytes());
        }
    };
    for (std::size_t p = 0; p < readers.size(); ++p) {
        std::byte* from = all_block.get() + static_cast<std::size_t>(readers[p]) * slot;
        join(share_of(static_cast<int>(p)), alike, from, nullptr);
        const int member = index_in(group_readers, readers[p]);
        if (member < 0) continue;
        ckpt::detail::Xxh3 received;
        join(group_share_of(member), pieces, from, &received);
        if (received.digest() != all[static_cast<std::size_t>(readers[p])].pieces_digest)
            throw ckpt::ChecksumError(where + ": the pieces of sharded state rank " + std::to_string(readers[p]) +
                                          " read for its replica group, as received, do not match the checksum it sent",
                                      index_file.string());
    }
    // every chunk of the index's pieces that make up each tensor loaded alike, checked where it now lies
    for (const auto& [name, value] : got) {
        if (!alike.contains(name)) continue;
        const ckpt::Tensor& t = *value.template get_if<ckpt::Tensor>();
        auto& pieces_of = by_tensor[name];
        std::sort(pieces_of.begin(), pieces_of.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
        const std::uint64_t item = ckpt::itemsize(t.dtype());
        std::uint64_t covered = 0;
        for (const ckpt::TensorPiece* p : pieces_of) {
            if (p->first + p->count <= covered) continue;  // another rank's copy of what is checked
            const std::uint64_t bytes = p->count * item;
            for (std::uint64_t c = 0; c * index.chunk_bytes < bytes; ++c) {
                const std::uint64_t begin = c * index.chunk_bytes, end = std::min(bytes, begin + index.chunk_bytes);
                if (ckpt::detail::xxh3(t.data() + p->first * item + begin, static_cast<std::size_t>(end - begin)) !=
                    p->chunk_hashes.at(static_cast<std::size_t>(c)))
                    throw ckpt::ChecksumError(where + ": chunk " + std::to_string(c) + " of '" + p->entry + "' of '" +
                                                  p->file + "', as received from the rank that read it, does not match "
                                                  "its checksum",
                                              index_file.string());
            }
            covered = p->first + p->count;
        }
    }
    ckpt::ReshardedState out_state;  // the tensors in `like`'s order, then the values
    for (const auto& [name, value] : like)
        if (value.template get_if<ckpt::Tensor>())
            out_state.state.set(name, got.contains(name) ? got.at(name) : alone.state.at(name));
    for (const auto& [name, value] : alone.state)
        if (!value.template get_if<ckpt::Tensor>()) out_state.state.set(name, value);
    out_state.bytes_read = run.bytes_read + alone.bytes_read;
    out_state.bytes_needed = alike_bytes + piece_bytes + alone.bytes_needed;
    out_state.files_opened = run.files_opened + alone.files_opened;
    return out_state;
}

}  // namespace detail

/// ckpt::load_resharded() on every rank of `comm` together (a collective), each byte of the
/// tensors they all load alike read from storage once: those of `like` that `places` leaves
/// whole with Copies::same (a data-parallel job's parameters) are cut into runs as
/// replica_share() cuts a save, each rank reads its run (its chunks checked as it reads), and
/// the runs are exchanged in one allgather. Every rank then checks every chunk of those
/// tensors against the index's checksums before it returns them, so a run damaged in
/// transfer is a ChecksumError too. The pieces of sharded state `places` places (Copies::same)
/// are loaded alike by the ranks that place the same pieces, their replica group: they are cut
/// among the group's ranks as replica_share() cuts them, and travel in the same allgather with
/// a checksum from the rank that read (and checked) them, which every receiver checks. What a
/// rank loads alone (per-rank entries) it reads itself. The ranks must pass the same `index`.
/// `bytes_read` is what this rank read from storage.
///
/// Only the ranks that can open `index_file` read: one that cannot (its view of the shared
/// directory gone) gets what it loads alike from them, and reads only what it loads alone.
/// When the ranks' `like` differ in the tensors they load alike, each reads everything it
/// needs, as load_resharded() does. When a rank cannot read its part, every rank throws: that
/// rank its own error, the others FormatError naming it, so that they can go on to an older
/// index together (as load_latest_resharded() does).
template <Communicator Comm>
ckpt::ReshardedState load_resharded_read_once(Comm& comm, const ckpt::GlobalIndex& index,
                                              const ckpt::PathArg& index_file, const ckpt::ParamDict& like,
                                              const ckpt::PieceMap& places = {}, const ckpt::LoadOptions& opts = {}) {
    return detail::load_read_once(comm, &index, index_file, like, places, opts);
}

/// A checkpoint callback (an nn::ModelCheckpoint, or anything with its hooks, last_saved() and
/// manager()) whose saves write this rank's share of the state its replicas hold alike
/// (replica_share(), over all the communicator's ranks). List it instead of the callback it
/// wraps, before a GlobalIndexer given `piece_map()`. Exception saves (`_breakpoint` files) are
/// of the whole state. With `share` false it saves the whole state, as the wrapped callback
/// does: a program can choose at run time.
///
/// Pieces of sharded state (those `pieces` places, as a sharded DataParallelOptimizer's
/// piece_map() does) are shared too, among the ranks that keep the same pieces: the ranks
/// learn who those are by comparing what they declare (one small allgather per save), so a
/// ShardLayout{s} on R ranks writes each piece once, cut among its R / s keepers.
///
/// After each save the ranks compare checksums of the tensors they share (one small
/// allgather): a rank whose copy differs (its own random engine or data position, not declared
/// per-rank) would otherwise have another rank's bytes loaded into it. Every rank then throws
/// ConfigError naming the tensor and the ranks, before the step's index is committed.
///
/// A share is a part of its step, useless without the step's index: a save whose places
/// nobody asked for (piece_map()) before the next hook means no index is being committed, and
/// that hook throws ConfigError saying so, rather than training on with saves nothing can load.
template <class Files, Communicator Comm>
class ReplicaParallel {
public:
    ReplicaParallel(Comm& comm, Files& files, std::function<ckpt::PieceMap()> pieces = {}, bool share = true)
        : comm_(comm), files_(files), pieces_(std::move(pieces)), share_(share) {}

    void on_step_end(nn::RunContext& c) {
        sharing(c, [&] { files_.on_step_end(c); });
    }
    void on_epoch_end(nn::RunContext& c) {
        sharing(c, [&] { files_.on_epoch_end(c); });
    }
    void on_train_end(nn::RunContext& c) {
        sharing(c, [&] { files_.on_train_end(c); });
    }
    void on_exception(nn::RunContext& c) { files_.on_exception(c); }

    /// The places of the state's pieces (what `pieces` gives) and of this rank's runs of the
    /// shared tensors and pieces in its last save: what the global index of that save needs.
    ckpt::PieceMap piece_map() const {
        unindexed_.reset();
        ckpt::PieceMap out = pieces_ ? pieces_() : ckpt::PieceMap{};
        for (const auto& [name, place] : runs_) out[name] = place;
        return out;
    }
    /// The bytes of shared tensors and pieces this rank's last save wrote.
    std::uint64_t own_bytes() const noexcept { return own_bytes_; }
    /// The bytes of the tensors all ranks share, all their runs together.
    std::uint64_t shared_bytes() const noexcept { return shared_bytes_; }
    /// The ranks that keep the same pieces of sharded state as this one, its replica group, at
    /// the last save (every rank, when nothing is sharded; none before a save).
    std::vector<int> replica_group() const {
        std::vector<int> group;
        for (std::size_t r = 0; r < group_keys_.size(); ++r)
            if (group_keys_[r] == group_keys_[static_cast<std::size_t>(comm_.rank())]) group.push_back(static_cast<int>(r));
        return group;
    }

    auto& manager() noexcept { return files_.manager(); }
    const auto& last_saved() const noexcept { return files_.last_saved(); }
    Files& files() noexcept { return files_; }

private:
    template <class F>
    void sharing(nn::RunContext& c, F&& hook) {
        if (!share_) return hook();
        if (unindexed_)
            throw ckpt::ConfigError("replica-parallel save of global step " + std::to_string(*unindexed_) + " ('" +
                                    (last_saved() ? last_saved()->string() : std::string()) +
                                    "') holds only this rank's share of the state, and no global index of it is "
                                    "being committed: list a fault::GlobalIndexer given this callback's piece_map() "
                                    "after it");
        std::function<ckpt::ParamDict()> whole = c.state;
        struct Restore {
            nn::RunContext& c;
            std::function<ckpt::ParamDict()>& whole;
            ~Restore() { c.state = std::move(whole); }
        } restore{c, whole};
        bool saved = false;
        c.state = [this, &whole, &saved, step = c.global_step] {
            const ckpt::ParamDict state = whole();
            const ckpt::PieceMap declared = pieces_ ? pieces_() : ckpt::PieceMap{};
            ReplicaShare s = replica_share(state, comm_.size(), comm_.rank(), declared, find_group(state, declared));
            const std::string g = std::to_string(step);
            s.state.set(std::string(ckpt::detail::share_record_entry),
                        "rank " + std::to_string(comm_.rank()) + " of " + std::to_string(comm_.size()) +
                            "'s share of global step " + g + " of a replica-parallel save: it holds parts of the "
                            "tensors the ranks hold alike, not all of them. Load the step through its global index "
                            "(index-step_" + g + ".ckpt): fault::load_latest_resharded, or ckpt::load_resharded");
            hashes_.clear();
            piece_hashes_.clear();
            for (const auto& e : state) {
                const bool shared = detail::shared_alike(e, declared), piece = detail::group_piece(e, declared);
                if (!shared && !piece) continue;
                const ckpt::Tensor& t = *e.value.get_if<ckpt::Tensor>();
                ckpt::detail::Xxh3 h;
                h.update(e.name.data(), e.name.size());
                h.update(t.data(), t.nbytes());
                (shared ? hashes_ : piece_hashes_).push_back({e.name, h.digest()});
            }
            runs_ = std::move(s.places);
            own_bytes_ = s.own_bytes;
            shared_bytes_ = s.shared_bytes;
            saved = true;
            return std::move(s.state);
        };
        hook();
        if (!saved) return;
        check_replicas_agree(c.global_step);
        unindexed_ = c.global_step;
    }

    /// This rank's place in its replica group: the ranks whose pieces of sharded state have
    /// the same names, places, dtypes and shapes (group_keys_ says whose are). A collective.
    ReplicaGroup find_group(const ckpt::ParamDict& state, const ckpt::PieceMap& declared) {
        group_keys_ = detail::allgather_records(comm_, detail::pieces_key(state, declared));
        const std::vector<int> group = replica_group();
        const auto member = std::find(group.begin(), group.end(), comm_.rank()) - group.begin();
        return {static_cast<int>(group.size()), static_cast<int>(member)};
    }

    /// Throws ConfigError on every rank when the ranks' shared tensors differ, or the pieces of
    /// the ranks of a replica group (see above).
    void check_replicas_agree(std::int64_t step) const {
        struct Summary {
            std::uint64_t shared, pieces;  // how many of each
            std::uint64_t shared_digest, pieces_digest;
        };
        std::vector<std::uint64_t> mine;
        for (const auto& [name, hash] : hashes_) mine.push_back(hash);
        for (const auto& [name, hash] : piece_hashes_) mine.push_back(hash);
        auto digest = [](const std::uint64_t* at, std::size_t n) { return ckpt::detail::xxh3(at, n * sizeof(std::uint64_t)); };
        const auto all = detail::allgather_records(
            comm_, Summary{hashes_.size(), piece_hashes_.size(), digest(mine.data(), hashes_.size()),
                           digest(mine.data() + hashes_.size(), piece_hashes_.size())});
        // every rank is compared with rank 0 for the shared tensors, and with the first rank of
        // its replica group for its pieces; every rank finds the same
        auto leader_of = [&](std::size_t r) {
            return static_cast<std::size_t>(std::find(group_keys_.begin(), group_keys_.end(), group_keys_[r]) -
                                            group_keys_.begin());
        };
        auto shared_differ = [&](std::size_t r) {
            return all[r].shared != all[0].shared || all[r].shared_digest != all[0].shared_digest;
        };
        auto pieces_differ = [&](std::size_t r) {
            const Summary& l = all[leader_of(r)];
            return all[r].pieces != l.pieces || all[r].pieces_digest != l.pieces_digest;
        };
        std::vector<std::size_t> differ;
        bool any_shared = false;
        std::uint64_t most = 0;
        for (std::size_t r = 0; r < all.size(); ++r) {
            most = std::max(most, all[r].shared + all[r].pieces);
            any_shared = any_shared || shared_differ(r);
            if (shared_differ(r) || pieces_differ(r)) differ.push_back(r);
        }
        if (differ.empty()) return;
        // which tensor: every rank's checksums, padded to the longest list
        mine.resize(most);
        std::vector<float> in(most * 2), out(most * 2 * all.size());
        std::memcpy(in.data(), mine.data(), most * sizeof(std::uint64_t));
        comm_.allgather(std::span<const float>(in), std::span<float>(out));
        auto hash_of = [&](std::size_t r, std::uint64_t i) {
            std::uint64_t v;
            std::memcpy(&v, &out[(r * most + i) * 2], sizeof v);
            return v;
        };
        std::string ranks, tensor = "(the ranks hold different tensors)", than = "rank 0";
        if (any_shared) {
            for (const std::size_t r : differ)
                if (shared_differ(r)) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
            for (std::size_t i = 0; i < std::min<std::size_t>(all[0].shared, hashes_.size()); ++i) {
                bool same = true;
                for (std::size_t r = 1; same && r < all.size(); ++r) same = hash_of(r, i) == hash_of(0, i);
                if (!same) {
                    tensor = "'" + hashes_[i].first + "'";
                    break;
                }
            }
        } else {  // the first group whose pieces differ
            const std::size_t leader = leader_of(differ.front());
            for (const std::size_t r : differ)
                if (leader_of(r) == leader) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
            than = "rank " + std::to_string(leader) + ", of their replica group,";
            tensor = "their piece of sharded state";
            const bool in_group = leader_of(static_cast<std::size_t>(comm_.rank())) == leader;
            for (std::size_t i = 0; in_group && i < std::min<std::size_t>(all[leader].pieces, piece_hashes_.size()); ++i) {
                bool same = true;
                for (const std::size_t r : differ)
                    if (leader_of(r) == leader) same = same && hash_of(r, all[r].shared + i) == hash_of(leader, all[leader].shared + i);
                if (!same) {
                    tensor = "'" + piece_hashes_[i].first + "'";
                    break;
                }
            }
        }
        throw ckpt::ConfigError("replica-parallel save of global step " + std::to_string(step) + ": rank(s) " + ranks +
                                " hold other values than " + than + " for " + tensor +
                                ", which they should hold alike (by their checksums). Declare a rank's own entry "
                                "(a random engine, a data position) ckpt::PiecePlace::per_rank() in the PieceMap, and "
                                "place the pieces of sharded state");
    }

    Comm& comm_;
    Files& files_;
    std::function<ckpt::PieceMap()> pieces_;
    bool share_;
    ckpt::PieceMap runs_;
    std::vector<std::pair<std::string, std::uint64_t>> hashes_;  ///< of the shared tensors, at the last save
    std::vector<std::pair<std::string, std::uint64_t>> piece_hashes_;  ///< of this rank's pieces, at the last save
    std::vector<std::uint64_t> group_keys_;  ///< every rank's, at the last save: ranks of equal keys are a group
    std::uint64_t own_bytes_ = 0, shared_bytes_ = 0;
    mutable std::optional<std::int64_t> unindexed_;  ///< the step of a save whose places nobody took yet
};

}  // namespace fault
