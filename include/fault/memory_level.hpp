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
// Each rank keeps its two newest snapshots and, of each partner, the two newest copies it
// received whole: a copy is received into the older of the two and counts only once all of
// it has arrived and its checksum matches, so a transfer cut by a failure leaves the previous
// copy in use. Recovery takes the newest step at which every rank's state is held somewhere
// (its own snapshot, or a partner's copy); when a rank and all its partners were lost there
// is none, and recover() says why and returns nothing: the caller falls back to files.
//
// A snapshot is one block (PackedState): 32 bytes of header (magic, step, payload length,
// xxh3-64 of the payload), then the entries, each 8-byte aligned: u32 name length, u8 kind,
// 3 bytes of padding, the name (padded to 8); a tensor: u8 dtype, u8 rank, 6 bytes of padding,
// i64 dims, u64 byte length, the bytes (padded); int64 / double: 8 bytes; bool: 8 bytes (0 or
// 1); string: u64 length, the bytes (padded). It lives only in memory and on the wire between
// ranks of one job, which run the same build.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../ckpt/detail/hash.hpp"
#include "../ckpt/error.hpp"
#include "../ckpt/log.hpp"
#include "../ckpt/param_dict.hpp"
#include "../ckpt/tensor.hpp"
#include "../nn/callbacks.hpp"
#include "communicator.hpp"

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

    bool empty() const noexcept { return words_.empty(); }
    /// The global step of the packed state (-1 when empty).
    std::int64_t step() const noexcept { return empty() ? -1 : read<std::int64_t>(8); }
    std::size_t bytes() const noexcept { return words_.size() * sizeof(float); }
    std::span<const float> words() const noexcept { return words_; }
    void clear() noexcept { words_.clear(); }

    /// Packs `dict` (tensors copied) as the state at global step `step`.
    void pack(const ckpt::ParamDict& dict, std::int64_t step) {
        std::size_t n = header_bytes + 8;
        for (const auto& [name, value] : dict) n += entry_bytes(name, value);
        words_.resize(n / sizeof(float));
        std::byte* base = data();
        std::size_t at = header_bytes;
        put<std::uint64_t>(at, dict.size());
        for (const auto& [name, value] : dict) {
            put<std::uint32_t>(at, static_cast<std::uint32_t>(name.size()));
            base[at] = static_cast<std::byte>(value.kind());
            std::memset(base + at + 1, 0, 3);
            at += 4;
            put_bytes(at, name.data(), name.size());
            if (const ckpt::Tensor* t = value.get_if<ckpt::Tensor>()) {
                std::memset(base + at, 0, 8);
                base[at] = static_cast<std::byte>(t->dtype());
                base[at + 1] = static_cast<std::byte>(t->rank());
                at += 8;
                for (const auto d : t->shape()) put<std::int64_t>(at, d);
                put<std::uint64_t>(at, t->nbytes());
                put_bytes(at, t->data(), t->nbytes());
            } else if (const auto* i = value.get_if<std::int64_t>()) {
                put<std::int64_t>(at, *i);
            } else if (const auto* d = value.get_if<double>()) {
                put<double>(at, *d);
            } else if (const auto* b = value.get_if<bool>()) {
                put<std::uint64_t>(at, *b ? 1 : 0);
            } else {
                const auto& s = *value.get_if<std::string>();
                put<std::uint64_t>(at, s.size());
                put_bytes(at, s.data(), s.size());
            }
        }
        std::size_t h = 0;
        put<std::uint64_t>(h, magic);
        put<std::int64_t>(h, step);
        put<std::uint64_t>(h, n - header_bytes);
        put<std::uint64_t>(h, ckpt::detail::xxh3(base + header_bytes, n - header_bytes));
    }

    /// Makes room for a packed state of `bytes` bytes arriving from another rank.
    std::span<float> receive_buffer(std::size_t bytes) {
        words_.resize(bytes / sizeof(float));
        return words_;
    }

    /// Whether the block is a whole packed state: magic, length and checksum.
    bool intact() const noexcept {
        if (bytes() < header_bytes + 8 || bytes() % 8 || read<std::uint64_t>(0) != magic) return false;
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
                    at += 8;
                    if (!dtype) throw CorruptState(what + ": tensor '" + name + "' has an unknown dtype");
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
                    out.set(std::move(name), ckpt::Tensor::view(*dtype, std::move(shape), const_cast<std::byte*>(base + at)));
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
                case ckpt::ValueKind::string: {
                    const std::uint64_t len = take_u64();
                    need(padded(len));
                    out.set(std::move(name), std::string(reinterpret_cast<const char*>(base + at), len));
                    at += padded(len);
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
        return n + 8;
    }
    std::byte* data() noexcept { return reinterpret_cast<std::byte*>(words_.data()); }
    const std::byte* data() const noexcept { return reinterpret_cast<const std::byte*>(words_.data()); }
    template <class T>
    void put(std::size_t& at, T v) {
        std::memcpy(data() + at, &v, sizeof v);
        at += sizeof v;
    }
    void put_bytes(std::size_t& at, const void* p, std::size_t n) {
        if (n) std::memcpy(data() + at, p, n);
        std::memset(data() + at + n, 0, padded(n) - n);
        at += padded(n);
    }
    template <class T>
    T read(std::size_t at) const noexcept {
        T v;
        std::memcpy(&v, data() + at, sizeof v);
        return v;
    }

    std::vector<float> words_;
};

/// What recover() gives a rank: its state at the agreed step.
struct MemoryRecovery {
    ckpt::ParamDict state;  ///< tensors are views into the memory level's blocks
    std::int64_t step = 0;  ///< the global step every rank rolled back to
    std::string source;     ///< "its own memory" or "rank R's memory", for messages
    int restored_from_partners = 0;  ///< ranks that got their state from a partner
};

namespace detail {

/// Who holds what, as one rank tells the others when recovering (fixed size, for allgather).
struct MemoryOffer {
    static constexpr std::size_t max_copies = 8;  // replicas (≤ 4) × 2 generations
    std::int64_t world = 0;                       // the world size its blocks were saved in
    std::int64_t own[2];                          // steps of its own snapshots, -1: none
    std::int64_t copy_owner[max_copies];          // ranks whose copies it holds, -1: none
    std::int64_t copy_step[max_copies];
};

/// The position of `rank` on its cycle of the permutation r -> r + d (mod n), and the cycle's
/// length: ranks at even positions send first, so a ring of rendezvous sends cannot deadlock.
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
    /// The step of this rank's newest snapshot (-1: none).
    std::int64_t newest_step() const noexcept { return std::max(own_[0].step(), own_[1].step()); }
    /// Bytes of memory the level holds (own snapshots and partners' copies).
    std::size_t bytes() const noexcept {
        std::size_t n = own_[0].bytes() + own_[1].bytes();
        for (const auto& c : copies_) n += c[0].bytes() + c[1].bytes();
        return n;
    }

    /// Snapshots `state` as global step `step` and exchanges copies with the partners; a
    /// collective of every rank of `comm`. Throws PeerFailure when a rank is lost meanwhile:
    /// the copies then held stay usable.
    template <Communicator Comm>
    void save(Comm& comm, const ckpt::ParamDict& state, std::int64_t step) {
        bind(comm.size());
        PackedState& mine = older(own_);
        mine.pack(state, step);
        const int n = comm.size(), me = comm.rank(), partners = std::min(replicas_, n - 1);
        for (int d = 1; d <= partners; ++d) {
            const int to = (me + d) % n, from = (me - d + n) % n;
            PackedState& into = older(copies_[d - 1]);
            const std::int64_t before = into.step();
            auto send = [&] { send_state(comm, mine, to); };
            auto receive = [&] {
                into.clear();  // torn until whole: never offered
                receive_state(comm, into, from);
                if (!into.intact())
                    throw CorruptState("memory level: the copy of rank " + std::to_string(from) + "'s state at step " +
                                       std::to_string(step) + " arrived damaged (was at step " + std::to_string(before) + ")");
            };
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
    /// rank and all its partners were lost); then the reason is logged. A collective.
    template <Communicator Comm>
    std::optional<MemoryRecovery> recover(Comm& comm) {
        const int n = comm.size(), me = comm.rank();
        detail::MemoryOffer mine{};
        mine.world = world_;
        for (int i = 0; i < 2; ++i) mine.own[i] = world_ == n ? own_[i].step() : -1;
        std::fill(std::begin(mine.copy_owner), std::end(mine.copy_owner), -1);
        std::fill(std::begin(mine.copy_step), std::end(mine.copy_step), -1);
        if (world_ == n)
            for (int d = 1; d <= replicas_; ++d)
                for (int i = 0; i < 2; ++i) {
                    mine.copy_owner[2 * (d - 1) + i] = copies_[d - 1][i].empty() ? -1 : (me - d + n) % n;
                    mine.copy_step[2 * (d - 1) + i] = copies_[d - 1][i].step();
                }
        const auto offers = detail::allgather_records(comm, mine);

        // candidate steps: any rank's own snapshots, newest first
        std::vector<std::int64_t> steps;
        for (const auto& o : offers)
            for (const auto s : o.own)
                if (s >= 0) steps.push_back(s);
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
        // who gives each rank its state at step s: itself (-1), a partner, or nobody (-2)
        auto plan_for = [&](std::int64_t s) {
            std::vector<int> source(n, -2);
            for (int q = 0; q < n; ++q) {
                if (offers[q].own[0] == s || offers[q].own[1] == s) {
                    source[q] = -1;
                    continue;
                }
                for (int d = 1; d <= replicas_ && source[q] == -2; ++d) {
                    const int p = (q + d) % n;
                    for (std::size_t i = 0; i < detail::MemoryOffer::max_copies; ++i)
                        if (offers[p].copy_owner[i] == q && offers[p].copy_step[i] == s) source[q] = p;
                }
            }
            return source;
        };
        std::optional<std::int64_t> agreed;
        std::vector<int> source;
        for (const auto s : steps) {
            source = plan_for(s);
            if (std::none_of(source.begin(), source.end(), [](int v) { return v == -2; })) {
                agreed = s;
                break;
            }
        }
        if (!agreed) {
            source = plan_for(steps.front());
            std::string lost;
            for (int q = 0; q < n; ++q)
                if (source[q] == -2) lost += (lost.empty() ? "" : ", ") + std::to_string(q);
            ckpt::detail::log(ckpt::LogLevel::warning,
                              "memory level: no step has every rank's state in memory: rank(s) " + lost +
                                  " lost their state together with every partner keeping a copy (newest step " +
                                  std::to_string(steps.front()) + "); falling back to files");
            return std::nullopt;
        }
        const std::int64_t s = *agreed;
        // transfers in rank order: each involves two ranks, both walking the same list
        PackedState received;
        for (int q = 0; q < n; ++q) {
            const int p = source[q];
            if (p < 0) continue;
            if (me == p) send_state(comm, *copy_of(q, me, s, n), q);
            if (me == q) {
                receive_state(comm, received, p);
                if (!received.intact() || received.step() != s)
                    throw CorruptState("memory level: rank " + std::to_string(me) + "'s state from rank " + std::to_string(p) +
                                       "'s memory arrived damaged");
            }
        }
        bind(n);
        // the timeline after s was abandoned: what is newer goes
        for (auto& b : own_)
            if (b.step() > s) b.clear();
        for (auto& c : copies_)
            for (auto& b : c)
                if (b.step() > s) b.clear();
        MemoryRecovery out;
        out.step = s;
        out.restored_from_partners = static_cast<int>(std::count_if(source.begin(), source.end(), [](int v) { return v >= 0; }));
        if (source[me] >= 0) {
            PackedState& slot = older(own_);
            slot = std::move(received);  // this rank's state again, as if it had taken it
            out.source = "rank " + std::to_string(source[me]) + "'s memory";
            out.state = slot.unpack("memory level: rank " + std::to_string(me) + "'s state at step " + std::to_string(s));
        } else {
            const PackedState& slot = own_[0].step() == s ? own_[0] : own_[1];
            out.source = "its own memory";
            out.state = slot.unpack("memory level: rank " + std::to_string(me) + "'s state at step " + std::to_string(s));
        }
        return out;
    }

private:
    /// Of two blocks, the one to write next: an empty one, else the older.
    static PackedState& older(std::array<PackedState, 2>& pair) {
        if (pair[0].empty()) return pair[0];
        if (pair[1].empty()) return pair[1];
        return pair[0].step() <= pair[1].step() ? pair[0] : pair[1];
    }
    /// The copy of rank q's state at step s that this rank holds.
    const PackedState* copy_of(int q, int me, std::int64_t s, int n) const {
        const int d = (me - q + n) % n;
        if (d < 1 || d > replicas_) return nullptr;
        for (const auto& b : copies_[d - 1])
            if (b.step() == s) return &b;
        return nullptr;
    }
    /// The blocks belong to one world size; another one starts them afresh.
    void bind(int n) {
        if (world_ == n) return;
        for (auto& b : own_) b.clear();
        for (auto& c : copies_)
            for (auto& b : c) b.clear();
        world_ = n;
    }
    template <Communicator Comm>
    static void send_state(Comm& comm, const PackedState& s, int to) {
        const auto head = detail::to_floats(static_cast<std::uint64_t>(s.bytes()));
        comm.send(std::span<const float>(head), to, tag);
        comm.send(s.words(), to, tag);
    }
    template <Communicator Comm>
    static void receive_state(Comm& comm, PackedState& into, int from) {
        std::vector<float> head(sizeof(std::uint64_t) / sizeof(float));
        comm.recv(std::span<float>(head), from, tag);
        const auto bytes = detail::from_floats<std::uint64_t>(head).at(0);
        comm.recv(into.receive_buffer(static_cast<std::size_t>(bytes)), from, tag);
    }

    int replicas_;
    int world_ = 0;  // the world size the blocks were saved in (0: none yet)
    std::array<PackedState, 2> own_;
    std::array<std::array<PackedState, 2>, max_replicas> copies_;  // [d - 1]: copies of rank r - d
};

/// The callback that takes the memory level's snapshots: every `every` global steps, at the
/// end of the step, on every rank of `comm`.
template <Communicator Comm>
class MemoryCheckpoint {
public:
    MemoryCheckpoint(Comm& comm, MemoryLevel& level, std::int64_t every) : comm_(comm), level_(level), every_(every) {
        if (every < 1) throw ckpt::ConfigError("memory level: every must be at least 1 step, not " + std::to_string(every));
    }
    void on_step_end(nn::RunContext& ctx) {
        if (ctx.global_step % every_ != 0 || !ctx.consistent) return;
        level_.save(comm_, ctx.state(), ctx.global_step);
    }

private:
    Comm& comm_;
    MemoryLevel& level_;
    std::int64_t every_;
};

}  // namespace fault
