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
// of the global tensors, plus everything else whole (its per-rank entries, pieces of sharded
// state, values). The split depends only on the state's names, dtypes and shapes, so every
// rank computes the same one with no exchange. A rank's file is then a part of the step, not
// a checkpoint of its own: the step is whole once its global index is committed (which
// checks that the pieces cover every tensor), and it is loaded through the index, on any
// number of ranks (fault::load_latest_resharded, ckpt::load_resharded).
//
// Loads the other way round: load_resharded_read_once() has the ranks that load the same
// tensors read them from storage once, each its run, and pass the runs over the communicator;
// every rank checks every chunk it uses against the index. fault::load_latest_resharded does
// this.

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

/// What one of R replicas writes of the state they hold alike (replica_share()).
struct ReplicaShare {
    /// Its runs of the shared tensors (views, named as the tensors), then every other entry.
    ckpt::ParamDict state;
    /// Where its runs sit in the shared tensors, for the global index: one PiecePlace for each
    /// tensor it holds a part of; a tensor it holds whole is not listed.
    ckpt::PieceMap places;
    std::uint64_t shared_bytes = 0;  ///< the shared tensors' bytes, all replicas' runs together
    std::uint64_t own_bytes = 0;     ///< of those, this replica's run
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

}  // namespace detail

/// Replica `replica`'s share of `state`, which `replicas` ranks hold alike: see the top of this
/// header. `declared` is the state's PieceMap (a DataParallelOptimizer's piece_map()): the
/// entries it places (pieces of sharded state) or declares per-rank or replicated are not
/// shared, and stay whole in every share. A tensor of rank 0 is never cut. Every replica must
/// pass a state of the same names, dtypes and shapes, in the same order.
inline ReplicaShare replica_share(const ckpt::ParamDict& state, int replicas, int replica,
                                  const ckpt::PieceMap& declared = {}) {
    if (replicas < 1 || replica < 0 || replica >= replicas)
        throw ckpt::ConfigError("replica_share: replica " + std::to_string(replica) + " of " + std::to_string(replicas));
    auto shared = [&](const ckpt::ParamDict::Entry& e) { return detail::shared_alike(e, declared); };
    ReplicaShare out;
    for (const auto& e : state)
        if (shared(e)) out.shared_bytes += e.value.get_if<ckpt::Tensor>()->nbytes();
    const auto R = static_cast<std::uint64_t>(replicas), k = static_cast<std::uint64_t>(replica);
    // run k is bytes [cut(k), cut(k + 1)) of the shared tensors laid end to end:
    // floor(bytes * j / R), without the product
    auto cut = [&](std::uint64_t j) { return out.shared_bytes / R * j + out.shared_bytes % R * j / R; };
    const std::uint64_t run_begin = cut(k), run_end = cut(k + 1);
    std::uint64_t offset = 0;  // of the current tensor in the shared bytes
    for (const auto& e : state) {
        if (!shared(e)) {
            out.state.set(e.name, e.value);
            continue;
        }
        const ckpt::Tensor& t = *e.value.get_if<ckpt::Tensor>();
        const std::uint64_t n = t.nbytes(), at = offset;
        offset += n;
        if (t.shape().empty() || n == 0) {  // one element, or none: whole, to the run its first byte is in
            if ((at >= run_begin && at < run_end) || (n == 0 && replica == 0)) {
                out.state.set(e.name, e.value);
                out.own_bytes += n;
            }
            continue;
        }
        // the row a cut falls nearest to; the same function on both sides of a cut, so that
        // neighbouring runs meet
        const std::uint64_t row = detail::stored_row_bytes(t), rows = n / row;
        auto row_of = [&](std::uint64_t byte) {
            const std::uint64_t inside = std::clamp(byte, at, at + n) - at;
            return (inside + row / 2) / row;
        };
        const std::uint64_t first = row_of(run_begin), hi = row_of(run_end);
        if (first >= hi) continue;
        out.own_bytes += (hi - first) * row;
        if (first == 0 && hi == rows) {
            out.state.set(e.name, e.value);
            continue;
        }
        out.state.set(e.name, detail::stored_rows(t, first, hi));
        out.places[e.name] = ckpt::PiecePlace{e.name, t.shape(), first * (row / ckpt::itemsize(t.dtype()))};
    }
    return out;
}

namespace detail {

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
    // the tensors every rank loads alike, and the rest
    ckpt::ParamDict alike, own;
    std::uint64_t alike_bytes = 0;
    ckpt::detail::Xxh3 layout;  // of the tensors loaded alike: every rank must cut the same ones
    for (const auto& e : like) {
        const ckpt::Tensor* t = e.value.template get_if<ckpt::Tensor>();
        const auto place = places.find(e.name);
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
        std::uint64_t reads, layout;
    };
    const auto plans = allgather_records(comm, Plan{reads ? 1u : 0u, layout.digest()});
    std::vector<int> readers;
    bool same_layout = true;
    for (std::size_t r = 0; r < plans.size(); ++r) {
        if (plans[r].reads) readers.push_back(static_cast<int>(r));
        same_layout = same_layout && plans[r].layout == plans[0].layout;
    }
    if (!same_layout) {  // every rank knows: each reads all it needs, no exchange
        if (!index_or_null) return {};
        return ckpt::load_resharded(index, index_file, like, places, opts, comm.rank());
    }
    // the runs' layout, one per reader (replica_share only views `like`'s tensors: nothing is
    // written there)
    const int nreaders = std::max<int>(1, static_cast<int>(readers.size()));
    auto share_of = [&](int reader) { return replica_share(alike, nreaders, reader); };
    const auto me = std::find(readers.begin(), readers.end(), comm.rank());
    const ReplicaShare mine = me != readers.end() ? share_of(static_cast<int>(me - readers.begin())) : ReplicaShare{};
    // this rank's run and what it loads alone; an error is kept until every rank has said how it went
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
                ckpt::PieceMap run_places = places;  // the loader's, for the values the load takes too
                for (const auto& [name, place] : mine.places) run_places[name] = place;
                run = ckpt::load_resharded(index, index_file, mine.state, run_places, opts, comm.rank());
            }
            alone = ckpt::load_resharded(index, index_file, own, places, opts, comm.rank());
        }
    } catch (const ckpt::Error&) {
        error = std::current_exception();
    }
    const bool failed = error || !index_or_null;
    // each run's parts go to the exchange at 64-byte boundaries, so that a tensor one run holds
    // whole is used where it arrives
    auto padded = [](std::uint64_t n) { return (n + 63) & ~std::uint64_t{63}; };
    std::uint64_t my_bytes = 0;
    for (const auto& [name, value] : mine.state) my_bytes += padded(value.template get_if<ckpt::Tensor>()->nbytes());
    struct Status {
        std::uint64_t failed, run_bytes;
    };
    const auto all = allgather_records(comm, Status{failed ? 1u : 0u, my_bytes});
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
    for (const auto& [name, value] : mine.state) {
        const ckpt::Tensor& t = run.state.tensor(name);
        std::memcpy(in_block.get() + at, t.data(), t.nbytes());
        at += static_cast<std::size_t>(padded(t.nbytes()));
    }
    if (slot > 0)  // every rank knows: nothing alike to load, nothing to exchange
        comm.allgather(std::span<const float>(reinterpret_cast<const float*>(in_block.get()), slot / sizeof(float)),
                       std::span<float>(reinterpret_cast<float*>(all_block.get()), slot * all.size() / sizeof(float)));
    // a tensor one run holds whole stays where it arrived; one cut between runs is joined
    ckpt::ParamDict got;
    for (std::size_t p = 0; p < readers.size(); ++p) {
        std::byte* from = all_block.get() + static_cast<std::size_t>(readers[p]) * slot;
        const ReplicaShare theirs = share_of(static_cast<int>(p));
        for (const auto& [name, value] : theirs.state) {
            const ckpt::Tensor& part = *value.template get_if<ckpt::Tensor>();
            const ckpt::Tensor& t = alike.tensor(name);
            const auto place = theirs.places.find(name);
            if (place == theirs.places.end()) {
                got.set(name, ckpt::Tensor::aliasing(t.dtype(), t.logical_shape(), all_block, from, t.order()));
            } else {
                if (!got.contains(name)) got.set(name, ckpt::Tensor::uninitialized(t.dtype(), t.logical_shape(), t.order()));
                std::memcpy(got.tensor(name).data() + place->second.first * ckpt::itemsize(t.dtype()), from, part.nbytes());
            }
            from += padded(part.nbytes());
        }
    }
    // every chunk of the index's pieces that make up each tensor, checked where it now lies
    for (const auto& [name, value] : got) {
        const ckpt::Tensor& t = *value.template get_if<ckpt::Tensor>();
        auto& pieces = by_tensor[name];
        std::sort(pieces.begin(), pieces.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
        const std::uint64_t item = ckpt::itemsize(t.dtype());
        std::uint64_t covered = 0;
        for (const ckpt::TensorPiece* p : pieces) {
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
    out_state.bytes_needed = alike_bytes + alone.bytes_needed;
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
/// transfer is a ChecksumError too. What a rank loads alone (pieces of sharded state, per-rank
/// entries) it reads itself. The ranks must pass the same `index`. `bytes_read` is what this
/// rank read from storage.
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
    /// shared tensors in its last save: what the global index of that save needs.
    ckpt::PieceMap piece_map() const {
        unindexed_.reset();
        ckpt::PieceMap out = pieces_ ? pieces_() : ckpt::PieceMap{};
        for (const auto& [name, place] : runs_) out[name] = place;
        return out;
    }
    /// The bytes of shared tensors this rank's last save wrote, and all replicas' together.
    std::uint64_t own_bytes() const noexcept { return own_bytes_; }
    std::uint64_t shared_bytes() const noexcept { return shared_bytes_; }

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
        c.state = [this, &whole, &saved] {
            const ckpt::ParamDict state = whole();
            const ckpt::PieceMap declared = pieces_ ? pieces_() : ckpt::PieceMap{};
            ReplicaShare s = replica_share(state, comm_.size(), comm_.rank(), declared);
            hashes_.clear();
            for (const auto& e : state) {
                if (!detail::shared_alike(e, declared)) continue;
                const ckpt::Tensor& t = *e.value.get_if<ckpt::Tensor>();
                ckpt::detail::Xxh3 h;
                h.update(e.name.data(), e.name.size());
                h.update(t.data(), t.nbytes());
                hashes_.push_back({e.name, h.digest()});
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

    /// Throws ConfigError on every rank when the ranks' shared tensors differ (see above).
    void check_replicas_agree(std::int64_t step) const {
        struct Summary {
            std::uint64_t count, digest;
        };
        std::vector<std::uint64_t> mine;
        for (const auto& [name, hash] : hashes_) mine.push_back(hash);
        const auto all = detail::allgather_records(
            comm_, Summary{mine.size(), ckpt::detail::xxh3(mine.data(), mine.size() * sizeof(std::uint64_t))});
        std::vector<int> differ;
        std::uint64_t most = 0;
        for (std::size_t r = 0; r < all.size(); ++r) {
            most = std::max(most, all[r].count);
            if (all[r].count != all[0].count || all[r].digest != all[0].digest) differ.push_back(static_cast<int>(r));
        }
        if (differ.empty()) return;
        // which tensor: every rank's checksums, padded to the longest list
        mine.resize(most);
        std::vector<float> in(most * 2), out(most * 2 * all.size());
        std::memcpy(in.data(), mine.data(), most * sizeof(std::uint64_t));
        comm_.allgather(std::span<const float>(in), std::span<float>(out));
        std::string ranks, tensor = "(the ranks hold different tensors)";
        for (const int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        for (std::size_t i = 0; i < std::min<std::size_t>(all[0].count, hashes_.size()); ++i) {
            bool same = true;
            for (std::size_t r = 1; same && r < all.size(); ++r)
                same = std::memcmp(&out[r * most * 2 + i * 2], &out[i * 2], sizeof(std::uint64_t)) == 0;
            if (!same) {
                tensor = "'" + hashes_[i].first + "'";
                break;
            }
        }
        throw ckpt::ConfigError("replica-parallel save of global step " + std::to_string(step) + ": rank(s) " + ranks +
                                " hold other values than rank 0 for " + tensor +
                                ", which every rank should hold alike (by their checksums). Declare a rank's own entry "
                                "(a random engine, a data position) ckpt::PiecePlace::per_rank() in the PieceMap, and "
                                "place the pieces of sharded state");
    }

    Comm& comm_;
    Files& files_;
    std::function<ckpt::PieceMap()> pieces_;
    bool share_;
    ckpt::PieceMap runs_;
    std::vector<std::pair<std::string, std::uint64_t>> hashes_;  ///< of the shared tensors, at the last save
    std::uint64_t own_bytes_ = 0, shared_bytes_ = 0;
    mutable std::optional<std::int64_t> unindexed_;  ///< the step of a save whose places nobody took yet
};

}  // namespace fault
