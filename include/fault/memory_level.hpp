#pragma once
// The memory level: every K steps each rank packs its whole state (parameters, optimizer
// state, position, data order: what a checkpoint file holds) into its own RAM and sends a
// copy to its partners, the next `replicas` ranks of a ring (rank r keeps the copies of
// ranks r-1 … r-replicas). When a worker dies and is started again, it gets its state back
// from a partner's memory, the survivors roll back to the same step from their own, and
// nobody reads a file.
//
//   fault::MemoryLevel memory;                                   // outlives generations
//   …in each generation (comm: this generation's communicator):
//   if (auto got = memory.recover(comm)) trainer.resume_from_state(got->state, got->source, data);
//   else …the file level (agree_on_checkpoint)
//   fault::MemoryCheckpoint mem(comm, memory, K);
//   trainer.train(epochs, data, nn::callbacks(mem, file_checkpoints, …), initial_epoch);
//
// The training thread packs the snapshot; MemoryCheckpoint sends the copies on a thread of
// its own while the next steps train (one transfer in flight; the next snapshot waits for it).
// Each rank keeps its two newest snapshots and, of each partner, the two newest copies it
// received whole: a copy is received into the older of the two and counts only once all of
// it has arrived, so a transfer cut by a failure leaves the previous copy in use; checksums
// are checked when recovery is about to use a block. Recovery takes the newest step at which every rank's state is held somewhere
// (its own snapshot, or a partner's copy); when a rank and all its partners were lost there
// is none, and recover() says why and returns nothing: the caller falls back to files.
//
// Last words in memory (MemoryCheckpointOptions::last_words): when another rank's failure
// ends training, each survivor whose state is consistent keeps it, at the step it reached, as
// its last words. Data-parallel replicas hold equal states, so recovery may give a survivor's
// last words to any rank of its replica group, the restarted one included: the survivors do
// not roll back at all, and no step is redone.
//
// A snapshot is one block (PackedState): 32 bytes of header (magic, step, payload length,
// xxh3-64 of the payload), then the entries, each 8-byte aligned: u32 name length, u8 kind,
// 3 bytes of padding, the name (padded to 8); a tensor: u8 dtype, u8 rank, u8 order (0 row-major,
// 1 column-major), 5 bytes of padding, i64 dims as stored, u64 byte length, the bytes (padded); int64 / double: 8 bytes; bool: 8 bytes (0 or
// 1); string: u64 length, the bytes (padded). It lives only in memory and on the wire between
// ranks of one job, which run the same build.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../ckpt/detail/hash.hpp"
#include "../ckpt/error.hpp"
#include "../ckpt/log.hpp"
#include "../ckpt/param_dict.hpp"
#include "../ckpt/tensor.hpp"
#include "../nn/callbacks.hpp"
#include "communicator.hpp"
#include "data_parallel.hpp"

namespace fault {

/// A packed state did not unpack: torn, damaged, or not a packed state.
class CorruptState : public ckpt::Error {
public:
    using ckpt::Error::Error;
};

/// A ParamDict packed into one block of floats, so that it travels over a Communicator as is.
/// Packing again reuses the block.
class PackedState {
public:
    static constexpr std::uint64_t magic = 0x314d454d54504b43ull;  // "CKPTMEM1"
    static constexpr std::size_t header_bytes = 32;

    /// Nothing whole in it: never packed, cleared, or being received.
    bool empty() const noexcept { return !whole_; }
    /// The global step of the packed state (-1 when empty).
    std::int64_t step() const noexcept { return empty() ? -1 : read<std::int64_t>(8); }
    std::size_t bytes() const noexcept { return size_; }
    std::span<const float> words() const noexcept {
        return {reinterpret_cast<const float*>(block_.get()), size_ / sizeof(float)};
    }

    PackedState() = default;
    PackedState(PackedState&&) noexcept = default;
    PackedState& operator=(PackedState&&) noexcept = default;
    PackedState(const PackedState& o) : whole_(o.whole_) {
        resize(o.size_);
        if (size_) std::memcpy(data(), o.data(), size_);
    }
    PackedState& operator=(const PackedState& o) {
        if (this != &o) *this = PackedState(o);
        return *this;
    }
    void clear() noexcept { whole_ = false; }  // keeps the memory for the next use

    /// Packs `dict` (tensors copied) as the state at global step `step`.
    void pack(const ckpt::ParamDict& state, std::int64_t step) {
        std::optional<ckpt::ParamDict> read;  // bound variables, read once
        if (ckpt::detail::has_bindings(state)) read = ckpt::detail::materialized(state, ckpt::ObjectEncoding::boost_binary);
        const ckpt::ParamDict& dict = read ? *read : state;
        whole_ = false;
        std::size_t n = header_bytes + 8;
        for (const auto& [name, value] : dict) n += entry_bytes(name, value);
        resize(n);
        Writer w{data(), header_bytes, {}, header_bytes};
        w.put<std::uint64_t>(dict.size());
        for (const auto& [name, value] : dict) {
            w.put<std::uint32_t>(static_cast<std::uint32_t>(name.size()));
            w.put<std::uint8_t>(static_cast<std::uint8_t>(value.kind()));
            w.zeros(3);
            w.put_bytes(name.data(), name.size());
            if (const ckpt::Tensor* t = value.get_if<ckpt::Tensor>()) {
                w.put<std::uint8_t>(static_cast<std::uint8_t>(t->dtype()));
                w.put<std::uint8_t>(static_cast<std::uint8_t>(t->rank()));
                w.put<std::uint8_t>(static_cast<std::uint8_t>(t->order()));
                w.zeros(5);
                for (const auto d : t->shape()) w.put<std::int64_t>(d);
                w.put<std::uint64_t>(t->nbytes());
                w.put_bytes(t->data(), t->nbytes());
            } else if (const auto* i = value.get_if<std::int64_t>()) {
                w.put<std::int64_t>(*i);
            } else if (const auto* d = value.get_if<double>()) {
                w.put<double>(*d);
            } else if (const auto* b = value.get_if<bool>()) {
                w.put<std::uint64_t>(*b ? 1 : 0);
            } else if (const auto* list = value.get_if<ckpt::Strings>()) {
                w.put<std::uint64_t>(list->size());
                for (const auto& item : *list) w.put_text(item);
            } else if (const auto* o = value.get_if<ckpt::Object>()) {
                w.put_text(o->type);
                w.put<std::uint64_t>(static_cast<std::uint64_t>(o->encoding));
                w.put_text(o->data);
            } else {
                w.put_text(value.kind() == ckpt::ValueKind::bytes ? value.get_if<ckpt::Bytes>()->data
                                                                   : *value.get_if<std::string>());
            }
        }
        w.hash_up_to(n);
        const std::uint64_t header[4] = {magic, static_cast<std::uint64_t>(step), n - header_bytes, w.hash.digest()};
        std::memcpy(data(), header, sizeof header);
        whole_ = true;
    }

    /// Makes room for a packed state of `bytes` bytes arriving from another rank; it counts
    /// once received() says all of it is there.
    std::span<float> receive_buffer(std::size_t bytes) {
        whole_ = false;
        resize(bytes / sizeof(float) * sizeof(float));
        return {reinterpret_cast<float*>(block_.get()), size_ / sizeof(float)};
    }
    void received() noexcept { whole_ = true; }

    /// Whether the block is a whole packed state: magic, length and checksum.
    bool intact() const noexcept {
        if (!whole_ || bytes() < header_bytes + 8 || bytes() % 8 || read<std::uint64_t>(0) != magic) return false;
        if (read<std::uint64_t>(16) != bytes() - header_bytes) return false;
        return ckpt::detail::xxh3(data() + header_bytes, bytes() - header_bytes) == read<std::uint64_t>(24);
    }

    /// The packed entries; tensors are views into this block (valid while it is not packed
    /// or received into again). `what` names the state in errors.
    ckpt::ParamDict unpack(const std::string& what) const {
        if (!intact()) throw CorruptState(what + ": not a whole packed state (torn, damaged or never received)");
        const std::byte* base = data();
        const std::size_t end = bytes();
        std::size_t at = header_bytes;
        auto need = [&](std::size_t n) {
            if (n > end - at) throw CorruptState(what + ": an entry runs past the end of the packed state");
        };
        auto take_u64 = [&] {
            need(8);
            const auto v = read<std::uint64_t>(at);
            at += 8;
            return v;
        };
        auto take_text = [&] {
            const std::uint64_t len = take_u64();
            need(padded(len));
            std::string text(reinterpret_cast<const char*>(base + at), static_cast<std::size_t>(len));
            at += padded(len);
            return text;
        };
        ckpt::ParamDict out;
        const std::uint64_t count = take_u64();
        for (std::uint64_t e = 0; e < count; ++e) {
            need(8);
            const auto name_len = read<std::uint32_t>(at);
            const auto kind = static_cast<ckpt::ValueKind>(base[at + 4]);
            at += 8;
            need(padded(name_len));
            std::string name(reinterpret_cast<const char*>(base + at), name_len);
            at += padded(name_len);
            switch (kind) {
                case ckpt::ValueKind::tensor: {
                    need(8);
                    const auto dtype = ckpt::dtype_from_code(static_cast<std::uint8_t>(base[at]));
                    const auto rank = static_cast<std::size_t>(base[at + 1]);
                    const auto order = static_cast<std::uint8_t>(base[at + 2]);
                    at += 8;
                    if (!dtype) throw CorruptState(what + ": tensor '" + name + "' has an unknown dtype");
                    if (order > 1 || (order == 1 && rank < 2))
                        throw CorruptState(what + ": tensor '" + name + "' has an impossible storage order");
                    ckpt::Shape shape;
                    for (std::size_t d = 0; d < rank; ++d) shape.push_back(static_cast<std::int64_t>(take_u64()));
                    const std::uint64_t nbytes = take_u64();
                    need(padded(nbytes));
                    std::size_t count = 0;
                    try {
                        count = ckpt::detail::checked_numel(shape, end);
                    } catch (const ckpt::FormatError&) {
                        throw CorruptState(what + ": tensor '" + name + "' has a shape larger than the packed state");
                    }
                    if (nbytes != count * ckpt::itemsize(*dtype))
                        throw CorruptState(what + ": tensor '" + name + "' holds " + std::to_string(nbytes) +
                                           " bytes, not what its shape needs");
                    const auto stored_order = order == 1 ? ckpt::Order::column_major : ckpt::Order::row_major;
                    if (stored_order == ckpt::Order::column_major) shape = ckpt::detail::reversed(std::move(shape));
                    out.set(std::move(name), ckpt::Tensor::view(*dtype, std::move(shape), const_cast<std::byte*>(base + at),
                                                                stored_order));
                    at += padded(nbytes);
                    break;
                }
                case ckpt::ValueKind::int64: out.set(std::move(name), static_cast<std::int64_t>(take_u64())); break;
                case ckpt::ValueKind::float64: {
                    const std::uint64_t bits = take_u64();
                    double d;
                    std::memcpy(&d, &bits, sizeof d);
                    out.set(std::move(name), d);
                    break;
                }
                case ckpt::ValueKind::boolean: out.set(std::move(name), take_u64() != 0); break;
                case ckpt::ValueKind::string: out.set(std::move(name), take_text()); break;
                case ckpt::ValueKind::bytes: out.set(std::move(name), ckpt::Bytes{take_text()}); break;
                case ckpt::ValueKind::strings: {
                    const std::uint64_t n = take_u64();
                    if (n > (end - at) / 8) throw CorruptState(what + ": entry '" + name + "' counts more strings than the packed state holds");
                    ckpt::Strings list;
                    for (std::uint64_t k = 0; k < n; ++k) list.push_back(take_text());
                    out.set(std::move(name), std::move(list));
                    break;
                }
                case ckpt::ValueKind::object: {
                    ckpt::Object o;
                    o.type = take_text();
                    const std::uint64_t encoding = take_u64();
                    if (encoding > ckpt::max_object_encoding)
                        throw CorruptState(what + ": object '" + name + "' has an unknown encoding");
                    o.encoding = static_cast<ckpt::ObjectEncoding>(encoding);
                    o.data = take_text();
                    out.set(std::move(name), std::move(o));
                    break;
                }
                default: throw CorruptState(what + ": entry '" + name + "' has an unknown kind");
            }
        }
        return out;
    }

private:
    static constexpr std::size_t padded(std::uint64_t n) { return static_cast<std::size_t>((n + 7) & ~std::uint64_t{7}); }
    static std::size_t entry_bytes(const std::string& name, const ckpt::Value& value) {
        std::size_t n = 8 + padded(name.size());
        if (const ckpt::Tensor* t = value.get_if<ckpt::Tensor>()) return n + 8 + 8 * t->rank() + 8 + padded(t->nbytes());
        if (const auto* s = value.get_if<std::string>()) return n + 8 + padded(s->size());
        if (const auto* b = value.get_if<ckpt::Bytes>()) return n + 8 + padded(b->data.size());
        if (const auto* list = value.get_if<ckpt::Strings>()) {
            n += 8;
            for (const auto& item : *list) n += 8 + padded(item.size());
            return n;
        }
        if (const auto* o = value.get_if<ckpt::Object>()) return n + 8 + padded(o->type.size()) + 8 + 8 + padded(o->data.size());
        return n + 8;
    }
    std::byte* data() noexcept { return block_.get(); }
    const std::byte* data() const noexcept { return block_.get(); }
    /// A block from allocate_aligned (huge pages when large: a state of hundreds of MiB is
    /// first touched in 2 MiB pages, not 4 KiB ones), kept when the size shrinks.
    void resize(std::size_t n) {
        if (n > capacity_) {
            block_ = ckpt::detail::allocate_aligned(n);
            capacity_ = n;
        }
        size_ = n;
    }
    template <class T>
    T read(std::size_t at) const noexcept {
        T v;
        std::memcpy(&v, data() + at, sizeof v);
        return v;
    }

    /// What pack() writes the entries with, hashing them as it goes.
    struct Writer {
        std::byte* base;
        std::size_t at;
        ckpt::detail::Xxh3 hash;
        std::size_t hashed;  // the hash covers [header_bytes, hashed)

        template <class T>
        void put(T v) {
            std::memcpy(base + at, &v, sizeof v);
            at += sizeof v;
        }
        void zeros(std::size_t n) {
            std::memset(base + at, 0, n);
            at += n;
        }
        /// Copies in pieces that stay in cache until they are hashed: one pass over memory, not two.
        void put_bytes(const void* p, std::size_t n) {
            constexpr std::size_t piece = 128u << 10;
            const auto* from = static_cast<const std::byte*>(p);
            for (std::size_t done = 0; done < n; done += piece) {
                const std::size_t len = std::min(piece, n - done);
                std::memcpy(base + at + done, from + done, len);
                if (n > piece) hash_up_to(at + done + len);
            }
            at += n;
            zeros(padded(n) - n);
        }
        void put_text(const std::string& s) {
            put<std::uint64_t>(s.size());
            put_bytes(s.data(), s.size());
        }
        void hash_up_to(std::size_t end) {
            hash.update(base + hashed, end - hashed);
            hashed = end;
        }
    };

    std::shared_ptr<std::byte> block_;  // owned alone: copies copy it
    std::size_t size_ = 0, capacity_ = 0;
    bool whole_ = false;
};

/// What recover() gives a rank: its state at the agreed step.
struct MemoryRecovery {
    ckpt::ParamDict state;  ///< tensors are views into the memory level's blocks
    std::int64_t step = 0;  ///< the global step every rank rolled back to
    std::string source;     ///< "its own memory", "rank R's memory" or "rank R's last words", for messages
    int from_rank = -1;     ///< the rank this rank's state came from; -1: its own memory
    int restored_from_partners = 0;  ///< ranks that got their state from another rank
    double seconds = 0;              ///< moving the states once every rank agreed (transfers, unpacking)
};

namespace detail {

/// Sends a packed state to rank `to`: its length, then its bytes.
template <Communicator Comm>
void send_packed(Comm& comm, const PackedState& s, int to, int tag) {
    const auto head = to_floats(static_cast<std::uint64_t>(s.bytes()));
    comm.send(std::span<const float>(head), to, tag);
    comm.send(s.words(), to, tag);
}
/// Receives what send_packed sent; leaves `into` whole only once every byte has arrived.
template <Communicator Comm>
void receive_packed(Comm& comm, PackedState& into, int from, int tag) {
    std::vector<float> head(sizeof(std::uint64_t) / sizeof(float));
    comm.recv(std::span<float>(head), from, tag);
    const auto bytes = from_floats<std::uint64_t>(head).at(0);
    comm.recv(into.receive_buffer(static_cast<std::size_t>(bytes)), from, tag);
    into.received();
}

/// Who holds what, as one rank tells the others when recovering (fixed size, for allgather).
struct MemoryOffer {
    static constexpr std::size_t max_copies = 8;  // replicas (≤ 4) × 2 generations
    std::int64_t world = 0;                       // the world size its blocks were saved in
    std::int64_t own[2];                          // steps of its own snapshots, -1: none
    std::int64_t copy_owner[max_copies];          // ranks whose copies it holds, -1: none
    std::int64_t copy_step[max_copies];
    std::int64_t last_words;                      // step of its last words, -1: none
    std::int64_t last_words_shards;               // its optimizer shard size: who its replicas are
};

/// Where a rank's state comes from at the agreed step.
struct StateSource {
    static constexpr int itself = -1, nobody = -2;
    int rank = nobody;        ///< itself, or the rank that sends it
    bool last_words = false;  ///< that rank's last words (a replica's state), not its copy of this rank's
};

/// Whether `rank` sends before it receives when each rank sends to r + d (mod n): those at
/// even positions of their cycle do, so a ring of rendezvous sends cannot deadlock.
inline bool sends_first(int rank, int d, int n) {
    int pos = 0;
    for (int r = rank % std::gcd(n, d); r != rank; r = (r + d) % n) ++pos;
    return pos % 2 == 0;
}

}  // namespace detail

/// A rank's memory level: its own snapshots and its partners' copies. Keep it for the whole
/// life of the process (across generations of the communicator).
class MemoryLevel {
public:
    static constexpr int max_replicas = 4;
    static constexpr int tag = 0x4d454d;  // point-to-point tag of the level's transfers

    /// `replicas`: how many partners keep a copy of each rank's state (1 … 4).
    explicit MemoryLevel(int replicas = 1) : replicas_(replicas) {
        if (replicas < 1 || replicas > max_replicas)
            throw ckpt::ConfigError("memory level: replicas must be 1 … " + std::to_string(max_replicas) + ", not " +
                                    std::to_string(replicas));
    }

    int replicas() const noexcept { return replicas_; }
    /// The copy this rank holds of the state at `step` of the rank `distance` places before
    /// it in the ring (1 … replicas()); null when it holds none.
    PackedState* copy(int distance, std::int64_t step) {
        if (distance < 1 || distance > replicas_) return nullptr;
        for (auto& b : copies_[distance - 1])
            if (b.step() == step) return &b;
        return nullptr;
    }
    /// The step of this rank's newest snapshot (-1: none).
    std::int64_t newest_step() const noexcept { return std::max(own_[0].step(), own_[1].step()); }
    /// The step of this rank's last words (-1: none).
    std::int64_t last_words_step() const noexcept { return last_words_.step(); }
    /// Bytes of memory the level holds (own snapshots, last words and partners' copies).
    std::size_t bytes() const noexcept {
        std::size_t n = own_[0].bytes() + own_[1].bytes() + last_words_.bytes();
        for (const auto& c : copies_) n += c[0].bytes() + c[1].bytes();
        return n;
    }

    /// Snapshots `state` as global step `step` and exchanges copies with the partners; a
    /// collective of every rank of `comm`. Throws PeerFailure when a rank is lost meanwhile:
    /// the copies then held stay usable. A copy is not checked when it arrives (a transfer
    /// either completes or throws) but when recovery uses it.
    template <Communicator Comm>
    void save(Comm& comm, const ckpt::ParamDict& state, std::int64_t step) {
        snapshot(comm.size(), state, step);
        exchange(comm, step);
    }

    /// The first half of save(): packs `state` into this rank's own memory (`world`: the
    /// communicator's size).
    void snapshot(int world, const ckpt::ParamDict& state, std::int64_t step) {
        bind(world);
        older(own_).pack(state, step);
    }

    /// Keeps `state`, this rank's consistent state at global step `step` when another rank
    /// failed, as its last words: recovery may give them to any rank of its replica group
    /// (`layout`: the ranks keeping the same piece of the optimizer state, whose states are
    /// equal; all ranks when it is not sharded). Only for such replicas: with states that
    /// differ by rank (model parallelism), keep no last words.
    void keep_last_words(int world, const ckpt::ParamDict& state, std::int64_t step, const ShardLayout& layout = {}) {
        layout.check(world);
        bind(world);
        last_words_.pack(state, step);
        last_words_shards_ = layout.shard_size;
    }

    /// The second half: sends this rank's snapshot of `step` to its partners and receives
    /// theirs, each into the older of its two blocks for that partner. It may run on another
    /// thread while training goes on (MemoryCheckpoint does), as long as nothing else uses the
    /// level meanwhile.
    template <Communicator Comm>
    void exchange(Comm& comm, std::int64_t step) {
        const PackedState* mine = own_at(step);
        if (!mine) throw ckpt::ConfigError("memory level: no snapshot of step " + std::to_string(step) + " to send");
        const int n = comm.size(), me = comm.rank(), partners = std::min(replicas_, n - 1);
        for (int d = 1; d <= partners; ++d) {
            const int to = (me + d) % n, from = (me - d + n) % n;
            PackedState& into = older(copies_[d - 1]);
            auto send = [&] { detail::send_packed(comm, *mine, to, tag); };
            auto receive = [&] { detail::receive_packed(comm, into, from, tag); };  // torn until it returns: never offered
            if (detail::sends_first(me, d, n)) {
                send();
                receive();
            } else {
                receive();
                send();
            }
        }
    }

    /// After a failure, in the generation that replaces it: agrees with every rank of `comm`
    /// on the newest step whose state every rank can have, moves each restarted rank's state
    /// to it from a partner, and returns this rank's state at that step. Empty, on every rank
    /// alike, when there is no such step (nothing saved yet, the world size changed, or a
    /// rank and all its partners were lost); then the reason is logged. Every block a rank
    /// is to use or send is checked first; a damaged one is dropped, logged, and the ranks
    /// agree again without it. A collective.
    template <Communicator Comm>
    std::optional<MemoryRecovery> recover(Comm& comm) {
        const int n = comm.size(), me = comm.rank();
        for (;;) {
            const auto offers = detail::allgather_records(comm, offer(me, n));
            const auto plan = agree(offers, n);
            if (!plan) return std::nullopt;
            const std::int64_t s = plan->first;  // not a structured binding: lambdas capture it (clang 14)
            const std::vector<detail::StateSource>& source = plan->second;
            // check what this rank uses and sends; any damage, and every rank agrees again
            std::int64_t damaged = 0;
            auto check = [&](PackedState* b, const std::string& what) {
                if (b && b->intact()) return;
                ckpt::detail::log(ckpt::LogLevel::warning, "memory level: rank " + std::to_string(me) + "'s " + what +
                                                               " at step " + std::to_string(s) +
                                                               " is damaged: dropped, agreeing again without it");
                if (b) b->clear();
                damaged = 1;
            };
            if (source[me].rank == detail::StateSource::itself) check(own_at(s), "own state");
            for (int q = 0; q < n; ++q)
                if (source[q].rank == me)
                    check(sent_to(q, source[q], s, n),
                          source[q].last_words ? std::string("last words") : "copy of rank " + std::to_string(q) + "'s state");
            const auto verdicts = detail::allgather_records(comm, damaged);
            if (std::any_of(verdicts.begin(), verdicts.end(), [](std::int64_t v) { return v != 0; })) continue;
            const auto began = std::chrono::steady_clock::now();
            MemoryRecovery out = take(comm, s, source);
            out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
            return out;
        }
    }

private:
    /// What this rank holds, for the others (nothing when its blocks are of another world size).
    detail::MemoryOffer offer(int me, int n) const {
        detail::MemoryOffer o{};
        o.world = world_;
        for (int i = 0; i < 2; ++i) o.own[i] = world_ == n ? own_[i].step() : -1;
        std::fill(std::begin(o.copy_owner), std::end(o.copy_owner), -1);
        std::fill(std::begin(o.copy_step), std::end(o.copy_step), -1);
        o.last_words = world_ == n ? last_words_.step() : -1;
        o.last_words_shards = last_words_shards_;
        if (world_ == n)
            for (int d = 1; d <= replicas_; ++d)
                for (int i = 0; i < 2; ++i) {
                    o.copy_owner[2 * (d - 1) + i] = copies_[d - 1][i].empty() ? -1 : (me - d + n) % n;
                    o.copy_step[2 * (d - 1) + i] = copies_[d - 1][i].step();
                }
        return o;
    }

    /// The newest step every rank's state is held at, and who gives each rank its state
    /// then: itself, a partner's copy, or a replica's last words. Every rank computes the
    /// same from the same offers.
    std::optional<std::pair<std::int64_t, std::vector<detail::StateSource>>> agree(
        const std::vector<detail::MemoryOffer>& offers, int n) const {
        using Source = detail::StateSource;
        std::vector<std::int64_t> steps;  // any rank's own snapshots and last words, newest first
        for (const auto& o : offers) {
            for (const auto s : o.own)
                if (s >= 0) steps.push_back(s);
            if (o.last_words >= 0) steps.push_back(o.last_words);
        }
        std::sort(steps.rbegin(), steps.rend());
        steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
        if (steps.empty()) {
            const auto other = std::find_if(offers.begin(), offers.end(), [n](const auto& o) { return o.world != 0 && o.world != n; });
            if (other != offers.end())
                ckpt::detail::log(ckpt::LogLevel::warning, "memory level: the snapshots were taken by " +
                                                               std::to_string(other->world) + " ranks, this generation has " +
                                                               std::to_string(n) + "; falling back to files");
            return std::nullopt;
        }
        auto sources_at = [&](std::int64_t s) {
            std::vector<Source> source(static_cast<std::size_t>(n));
            for (int q = 0; q < n; ++q) {
                const auto& o = offers[q];
                if (o.own[0] == s || o.own[1] == s || o.last_words == s) {
                    source[q].rank = Source::itself;
                    continue;
                }
                for (int d = 1; d <= replicas_ && source[q].rank == Source::nobody; ++d) {
                    const int p = (q + d) % n;
                    for (std::size_t i = 0; i < detail::MemoryOffer::max_copies; ++i)
                        if (offers[p].copy_owner[i] == q && offers[p].copy_step[i] == s) source[q].rank = p;
                }
                // the lowest replica whose last words are of step s
                for (int p = 0; p < n && source[q].rank == Source::nobody; ++p)
                    if (offers[p].last_words == s && (p - q) % offers[p].last_words_shards == 0) source[q] = {p, true};
            }
            return source;
        };
        auto nobody = [](const Source& v) { return v.rank == Source::nobody; };
        for (const auto s : steps)
            if (auto source = sources_at(s); std::none_of(source.begin(), source.end(), nobody))
                return std::pair{s, std::move(source)};
        const auto source = sources_at(steps.front());
        std::string lost;
        for (int q = 0; q < n; ++q)
            if (nobody(source[q])) {
                if (!lost.empty()) lost += ", ";
                lost += std::to_string(q);
            }
        ckpt::detail::log(ckpt::LogLevel::warning,
                          "memory level: no step has every rank's state in memory: rank(s) " + lost +
                              " lost their state together with every partner keeping a copy (newest step " +
                              std::to_string(steps.front()) + "); falling back to files");
        return std::nullopt;
    }

    /// Moves the states of the ranks that do not hold theirs from partners and replicas (in
    /// rank order: each transfer involves two ranks, both walking the same list) and returns
    /// this rank's.
    template <Communicator Comm>
    MemoryRecovery take(Comm& comm, std::int64_t s, const std::vector<detail::StateSource>& source) {
        const int n = comm.size(), me = comm.rank();
        PackedState received;
        for (int q = 0; q < n; ++q) {
            const int p = source[q].rank;
            if (p < 0) continue;
            if (me == p) detail::send_packed(comm, *sent_to(q, source[q], s, n), q, tag);
            if (me == q) {
                detail::receive_packed(comm, received, p, tag);
                if (!received.intact() || received.step() != s)
                    throw CorruptState("memory level: rank " + std::to_string(me) + "'s state from rank " + std::to_string(p) +
                                       "'s memory arrived damaged");
            }
        }
        bind(n);
        // the timeline after s was abandoned: what is newer goes
        for (auto& b : own_)
            if (b.step() > s) b.clear();
        if (last_words_.step() > s) last_words_.clear();
        for (auto& c : copies_)
            for (auto& b : c)
                if (b.step() > s) b.clear();
        MemoryRecovery out;
        out.step = s;
        out.restored_from_partners = static_cast<int>(
            std::count_if(source.begin(), source.end(), [](const detail::StateSource& v) { return v.rank >= 0; }));
        const std::string what = "memory level: rank " + std::to_string(me) + "'s state at step " + std::to_string(s);
        if (source[me].rank >= 0) {
            PackedState& slot = older(own_);
            slot = std::move(received);  // this rank's state again, as if it had taken it
            out.from_rank = source[me].rank;
            out.source = "rank " + std::to_string(out.from_rank) + (source[me].last_words ? "'s last words" : "'s memory");
            out.state = slot.unpack(what);
        } else {
            out.source = "its own memory";
            out.state = own_at(s)->unpack(what);
        }
        return out;
    }

    /// Of two blocks, the one to write next: an empty one, else the older.
    static PackedState& older(std::array<PackedState, 2>& pair) {
        if (pair[0].empty()) return pair[0];
        if (pair[1].empty()) return pair[1];
        return pair[0].step() <= pair[1].step() ? pair[0] : pair[1];
    }
    /// This rank's own state at step s: a snapshot or its last words.
    PackedState* own_at(std::int64_t s) {
        for (auto& b : own_)
            if (b.step() == s) return &b;
        return last_words_.step() == s ? &last_words_ : nullptr;
    }
    /// What this rank sends rank q as q's state at step s.
    PackedState* sent_to(int q, const detail::StateSource& from, std::int64_t s, int n) {
        if (!from.last_words) return copy_of(q, from.rank, s, n);
        return last_words_.step() == s ? &last_words_ : nullptr;
    }
    /// The copy of rank q's state at step s that this rank holds.
    PackedState* copy_of(int q, int me, std::int64_t s, int n) { return copy((me - q + n) % n, s); }
    /// The blocks belong to one world size; another one starts them afresh.
    void bind(int n) {
        if (world_ == n) return;
        for (auto& b : own_) b.clear();
        last_words_.clear();
        for (auto& c : copies_)
            for (auto& b : c) b.clear();
        world_ = n;
    }
    int replicas_;
    int world_ = 0;  // the world size the blocks were saved in (0: none yet)
    std::array<PackedState, 2> own_;
    PackedState last_words_;  // this rank's state when another rank failed (keep_last_words)
    int last_words_shards_ = 1;
    std::array<std::array<PackedState, 2>, max_replicas> copies_;  // [d - 1]: copies of rank r - d
};

/// How MemoryCheckpoint sends the copies.
struct MemoryCheckpointOptions {
    /// On a thread of its own, while the next steps train: the training thread waits only for
    /// the snapshot (and, at the next snapshot, for the previous transfer to have ended). Off:
    /// at the end of the step, on the training thread.
    bool background = true;
    /// When another rank's failure ends training (PeerFailure, Interrupted), keep this rank's
    /// state, if consistent, as its last words (MemoryLevel::keep_last_words), so that
    /// recovery resumes at the step the survivors reached. Only for data-parallel replicas.
    bool last_words = false;
    /// The optimizer's: which ranks are replicas of each other, for the last words.
    ShardLayout layout{};
};

/// The callback that takes the memory level's snapshots: every `every` global steps, at the
/// end of the step, on every rank of `comm`. In the background, a transfer's failure (a rank
/// lost) is thrown at the next snapshot or at the end of training, unless training has met
/// it first; the destructor waits for a transfer in flight, so a generation's communicator
/// outlives it.
template <Communicator Comm>
class MemoryCheckpoint {
public:
    MemoryCheckpoint(Comm& comm, MemoryLevel& level, std::int64_t every, MemoryCheckpointOptions options = {})
        : comm_(comm), level_(level), every_(every), options_(options) {
        if (every < 1) throw ckpt::ConfigError("memory level: every must be at least 1 step, not " + std::to_string(every));
    }
    MemoryCheckpoint(const MemoryCheckpoint&) = delete;
    MemoryCheckpoint& operator=(const MemoryCheckpoint&) = delete;
    ~MemoryCheckpoint() {
        if (transfer_.joinable()) transfer_.join();
    }

    void on_step_end(nn::RunContext& ctx) {
        if (ctx.global_step % every_ != 0 || !ctx.consistent) return;
        wait();
        if (!options_.background) {
            level_.save(comm_, ctx.state(), ctx.global_step);
            return;
        }
        level_.snapshot(comm_.size(), ctx.state(), ctx.global_step);
        transfer_ = std::thread([this, step = ctx.global_step] {
            try {
                level_.exchange(comm_, step);
            } catch (...) {
                error_ = std::current_exception();
            }
        });
    }
    void on_train_end(nn::RunContext&) { wait(); }

    /// Training ended by an error: the transfer in flight has met it too (its own error is
    /// dropped); with last words on and another rank to blame, keeps this rank's state.
    void on_exception(nn::RunContext& ctx) {
        if (transfer_.joinable()) transfer_.join();
        error_ = nullptr;
        const auto error = std::current_exception();
        if (!options_.last_words || !ctx.consistent || !(detail::holds<PeerFailure>(error) || detail::holds<Interrupted>(error)))
            return;
        level_.keep_last_words(comm_.size(), ctx.state(), ctx.global_step, options_.layout);
    }

    /// Waits for the transfer in flight, if any; rethrows its failure.
    void wait() {
        if (transfer_.joinable()) transfer_.join();
        if (auto e = std::exchange(error_, nullptr)) std::rethrow_exception(e);
    }

private:
    Comm& comm_;
    MemoryLevel& level_;
    std::int64_t every_;
    MemoryCheckpointOptions options_;
    std::thread transfer_;
    std::exception_ptr error_;  // the transfer's, read after joining it
};

}  // namespace fault
