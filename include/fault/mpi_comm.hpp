#pragma once
// MpiComm: the Communicator for ranks started by mpirun, over MPI (Debian's Open MPI). Link
// ckpt::mpi.
//
//   int main(int argc, char** argv) {
//       fault::MpiSession mpi(argc, argv);    // MPI_Init_thread(MPI_THREAD_MULTIPLE) … MPI_Finalize
//       fault::MpiComm comm(mpi, {.timeout = std::chrono::seconds(30)});   // every rank of the job
//       comm.allreduce(grads, fault::ReduceOp::mean);
//   }
//
//   mpirun -np 4 ./train       (scripts/mpirun.sh: the flags a shared or containerized host needs)
//
// A program that initializes MPI itself (with MPI_THREAD_MULTIPLE) passes its communicator
// instead, MpiComm(MPI_COMM_WORLD) or any intracommunicator: ckpt works on duplicates of it,
// so that its messages never match the program's own.
//
// Calls are ThreadComm's, with the same results to the bit: a sum adds the ranks' values in
// rank order (each rank adds one slice of the buffer after an all-to-all of the slices, then
// the slices are gathered; MPI_Allreduce's order is not rank order), and a mean divides that
// sum by the number of ranks. Every collective first exchanges what each rank called (which
// collective, root and size): ranks that disagree all get a ConfigError naming both calls,
// not a hang or a truncated message, and the communicator stays usable. send() is a
// rendezvous: it returns once the receiver has taken the data; a receiver expecting another
// size fails with a ConfigError naming both sizes, and so does the sender.
//
// Every call has the timeout (MpiOptions::timeout): MPI is driven by nonblocking calls, tested
// until they complete or the deadline passes. Then PeerFailure names the ranks that did not
// come, where MPI can tell (the peer of a send or receive), else every other rank; the
// communicator is spent and its later calls throw at once, saying so. MPI cannot withdraw a
// call it has begun, so MPI only ever reads and writes buffers the communicator owns (every
// call copies its data in and its result out, as ThreadComm does; large messages travel in
// pieces of 4 MiB), and a spent communicator leaves them, and its MPI communicators, to MPI.
//
// Threads: the memory level (memory_level.hpp) sends its copies on a thread of its own while
// training calls collectives, so MpiComm needs MPI_THREAD_MULTIPLE and refuses to start
// without it. Collectives must come from one thread at a time (their order is what matches
// them across ranks); sends and receives from any.
//
// Failures: with Debian's Open MPI (4.1, without ULFM) a rank's death ends the whole job.
// When a rank is killed, or exits before MPI_Finalize (with any status), mpirun prints which
// rank it was and sends every other rank SIGCONT at once, SIGTERM a second later and SIGKILL
// a second after that (odls_base_sigkill_timeout), then exits with the dead rank's status:
// 128 + the signal when it was killed (137 for SIGKILL), its exit status otherwise (1 for a
// rank that exited with 0 before MPI_Finalize). The survivors get no PeerFailure and save
// nothing: they are killed where they stand (a SIGTERM handler, ckpt::TerminationSignals,
// cannot finish its step, whose collectives wait on the dead rank, before the SIGKILL). So an
// MPI job recovers by being run again, with the same command: each rank saves its
// checkpoints and a GlobalIndexer commits the global index of each save, and the new run
// resumes from the newest whole one (load_latest_resharded, elastic.hpp), on the same number
// of ranks or another. MpiComm therefore models neither ShrinkableCommunicator nor
// RecoverableCommunicator: no rank outlives another's death to shrink or repair, so last
// words (last_words.hpp) and UCE repair (uce_repair.hpp) need ThreadComm or GlooComm. What
// the timeout catches is a rank that is alive but does not come (a hang, a rank that went
// elsewhere); PeerFailure then ends the ranks that wait, and MpiSession ends the job.

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../ckpt/error.hpp"
#include "../ckpt/log.hpp"
#include "communicator.hpp"

namespace fault {

/// How long an MpiComm waits for other ranks.
struct MpiOptions {
    /// Every wait for other ranks: a collective, a send's receiver, a receive's sender, each
    /// 4 MiB piece of a large message. PeerFailure when it passes.
    std::chrono::milliseconds timeout = std::chrono::seconds(30);
};

struct MpiSessionOptions {
    /// How long the end of the job (the destructor) waits for every rank to reach it before
    /// MPI_Finalize, which would wait without a limit: past it, MPI_Abort ends the job. Keep
    /// it above MpiOptions::timeout, so that a rank still in a call gets there.
    std::chrono::milliseconds finalize_timeout = std::chrono::seconds(60);
};

namespace detail {

using MpiClock = std::chrono::steady_clock;

/// Tests `done()` (one MPI_Test… call) until it says so or `deadline` passes; false then.
/// Open MPI moves data only inside its calls, so the wait polls, as MPI's own blocking calls
/// do: it yields the core between polls (to the other ranks of an oversubscribed host), and
/// after 100 ms sleeps 100 µs between them, so that a rank waiting long (for one that saves
/// a checkpoint) leaves the core to the ranks that work. Sleeping sooner slows large
/// transfers, which move only while polled: a 64 MiB allreduce of 2 ranks took 170 ms when
/// the wait slept after 5 ms, 63 ms when it polled throughout.
template <class Done>
bool mpi_poll(Done&& done, MpiClock::time_point deadline) {
    const auto start = MpiClock::now();
    for (;;) {
        if (done()) return true;
        const auto now = MpiClock::now();
        if (now >= deadline) return false;
        if (now - start < std::chrono::milliseconds(100)) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
}

inline std::string mpi_error_text(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
    return std::string(text, static_cast<std::size_t>(len));
}

inline std::string mpi_ranks_text(const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s;
}

inline int mpi_thread_level() {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    return provided;
}

inline const char* mpi_thread_level_name(int level) {
    switch (level) {
        case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
        case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
        case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
        case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    }
    return "an unknown thread level";
}

}  // namespace detail

/// MPI for the life of the program: MPI_Init_thread with MPI_THREAD_MULTIPLE (what MpiComm
/// needs) on construction; on destruction, a barrier of every rank within
/// MpiSessionOptions::finalize_timeout, then MPI_Finalize, or MPI_Abort (status 1) when some
/// rank does not get there in time. One per process, before any MpiComm.
class MpiSession {
public:
    MpiSession(int& argc, char**& argv, MpiSessionOptions options = {}) : options_(options) { init(&argc, &argv); }
    /// Without the command line (MPI does not need it under mpirun).
    explicit MpiSession(MpiSessionOptions options = {}) : options_(options) { init(nullptr, nullptr); }
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;

    ~MpiSession() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized) return;
        MPI_Request end = MPI_REQUEST_NULL;
        bool all_here = MPI_Ibarrier(MPI_COMM_WORLD, &end) == MPI_SUCCESS;
        all_here = all_here && detail::mpi_poll(
                                   [&] {
                                       int done = 0;
                                       MPI_Test(&end, &done, MPI_STATUS_IGNORE);
                                       return done != 0;
                                   },
                                   detail::MpiClock::now() + options_.finalize_timeout);
        if (!all_here) {
            ckpt::detail::log(ckpt::LogLevel::warning, "MpiSession: rank " + std::to_string(rank_) + ": not every rank ended within " +
                                                           std::to_string(options_.finalize_timeout.count()) +
                                                           " ms: MPI_Abort ends the job");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        MPI_Finalize();
    }

    /// This process's rank in the job (MPI_COMM_WORLD) and the job's size.
    int rank() const noexcept { return rank_; }
    int size() const noexcept { return size_; }

private:
    void init(int* argc, char*** argv) {
        if (options_.finalize_timeout.count() <= 0)
            throw ckpt::ConfigError("MpiSessionOptions::finalize_timeout must be positive, got " +
                                    std::to_string(options_.finalize_timeout.count()) + " ms");
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (initialized)
            throw ckpt::ConfigError("MpiSession: MPI is already initialized; pass the program's communicator to "
                                    "fault::MpiComm instead");
        int provided = MPI_THREAD_SINGLE;
        if (const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided); rc != MPI_SUCCESS)
            throw ckpt::ConfigError("MpiSession: MPI_Init_thread failed: " + detail::mpi_error_text(rc));
        if (provided < MPI_THREAD_MULTIPLE) {
            MPI_Finalize();
            throw ckpt::ConfigError(std::string("MpiSession: this MPI library provides ") +
                                    detail::mpi_thread_level_name(provided) +
                                    ", and MpiComm needs MPI_THREAD_MULTIPLE (the memory level sends on a thread of its own "
                                    "while training calls collectives)");
        }
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
    }

    MpiSessionOptions options_;
    int rank_ = 0, size_ = 1;
};

/// The Communicator for ranks that mpirun starts: every call has the timeout (MpiOptions),
/// results are ThreadComm's to the bit (sums in rank order), and ranks that call different
/// collectives all get a ConfigError naming both calls. A rank's death ends an Open MPI job,
/// so it neither shrinks nor regroups: a job recovers by being run again.
class MpiComm {
public:
    /// Every rank of the job (a duplicate of MPI_COMM_WORLD). A collective.
    explicit MpiComm(MpiSession&, MpiOptions options = {}) : MpiComm(MPI_COMM_WORLD, options) {}
    /// The ranks of `comm`, an intracommunicator the program owns: ckpt works on duplicates of
    /// it. MPI must be initialized with MPI_THREAD_MULTIPLE. A collective of `comm`'s ranks.
    explicit MpiComm(MPI_Comm comm, MpiOptions options = {}) : s_(std::make_unique<State>(options)) {
        if (options.timeout.count() <= 0)
            throw ckpt::ConfigError("MpiOptions::timeout must be positive, got " + std::to_string(options.timeout.count()) +
                                    " ms");
        int initialized = 0, finalized = 0;
        MPI_Initialized(&initialized);
        MPI_Finalized(&finalized);
        if (!initialized || finalized)
            throw ckpt::ConfigError(std::string("MpiComm: MPI is ") + (finalized ? "finalized" : "not initialized") +
                                    ": create a fault::MpiSession first, and the communicators after it");
        if (const int level = detail::mpi_thread_level(); level < MPI_THREAD_MULTIPLE)
            throw ckpt::ConfigError(std::string("MpiComm: MPI was initialized with ") + detail::mpi_thread_level_name(level) +
                                    "; it needs MPI_THREAD_MULTIPLE (the memory level sends on a thread of its own while "
                                    "training calls collectives): use fault::MpiSession, or MPI_Init_thread with "
                                    "MPI_THREAD_MULTIPLE");
        if (comm == MPI_COMM_NULL) throw ckpt::ConfigError("MpiComm: the communicator is MPI_COMM_NULL");
        int inter = 0;
        MPI_Comm_test_inter(comm, &inter);
        if (inter) throw ckpt::ConfigError("MpiComm: an intercommunicator; MpiComm needs an intracommunicator");
        MPI_Comm_rank(comm, &s_->rank);
        MPI_Comm_size(comm, &s_->size);
        // two duplicates: one for the collectives and the data of sends, one for the receivers'
        // "ready" messages, which travel the other way with the same tags
        MPI_Request dups[2];
        MPI_Comm_idup(comm, &s_->data, &dups[0]);
        MPI_Comm_idup(comm, &s_->ready, &dups[1]);
        for (MPI_Request& dup : dups)
            if (const int rc = test_until_deadline(dup); rc != MPI_SUCCESS) {
                const auto late = others();
                const int me = rank();
                (void)s_.release();  // MPI may still write the duplicates' handles into it
                throw PeerFailure("MpiComm on rank " + std::to_string(me) + ": duplicating the communicator " +
                                      (rc == timed_out ? "did not complete within " + std::to_string(options.timeout.count()) +
                                                             " ms, waiting for one or more of " + detail::mpi_ranks_text(late) +
                                                             " (MPI does not say which)"
                                                       : "failed: " + detail::mpi_error_text(rc)),
                                  late);
            }
        for (MPI_Comm c : {s_->data, s_->ready}) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
        int* tag_ub = nullptr;
        int has_tag_ub = 0;
        MPI_Comm_get_attr(s_->data, MPI_TAG_UB, &tag_ub, &has_tag_ub);
        if (has_tag_ub && tag_ub) s_->tag_ub = *tag_ub;
    }

    MpiComm(MpiComm&&) noexcept = default;
    MpiComm& operator=(MpiComm&& other) noexcept {
        MpiComm old(std::move(*this));  // ends as the destructor says
        s_ = std::move(other.s_);
        return *this;
    }

    /// Frees the duplicates; a spent communicator leaves them and its buffers to MPI, which
    /// may still complete the calls its failure abandoned.
    ~MpiComm() {
        if (!s_) return;
        if (s_->failure.spent) {
            (void)s_.release();
            return;
        }
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (finalized) return;
        for (MPI_Comm* c : {&s_->data, &s_->ready})
            if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }

    int rank() const noexcept { return s_->rank; }
    int size() const noexcept { return s_->size; }

    void allreduce(std::span<float> data, ReduceOp op) {
        const Kind kind = op == ReduceOp::sum ? Kind::allreduce_sum : Kind::allreduce_mean;
        agree(kind, 0, data.size());
        if (data.empty() || size() == 1) return;
        State& s = *s_;
        const std::size_t n = static_cast<std::size_t>(s.size), me = static_cast<std::size_t>(s.rank), count = data.size();
        // rank q sums slice q: every rank sends it slice q of its buffer
        auto lo = [&](std::size_t q) { return count * q / n; };
        const std::size_t mine = lo(me + 1) - lo(me);
        s.counts.resize(4 * n);
        int* slice = s.counts.data();  // slice q: its size, its place in the buffer, and what this rank receives
        int* at = slice + n;
        int* from_each = at + n;
        int* from_at = from_each + n;
        for (std::size_t q = 0; q < n; ++q) {
            slice[q] = static_cast<int>(lo(q + 1) - lo(q));
            at[q] = static_cast<int>(lo(q));
            from_each[q] = static_cast<int>(mine);
            from_at[q] = static_cast<int>(q * mine);
        }
        float* out = s.stage(s.out, count);
        float* in = s.stage(s.in, mine * n);
        std::copy(data.begin(), data.end(), out);
        MPI_Request req = MPI_REQUEST_NULL;
        collective(MPI_Ialltoallv(out, slice, at, MPI_FLOAT, in, from_each, from_at, MPI_FLOAT, s.data, &req), req, kind,
                   "the all-to-all of the slices");
        // this rank's slice, added as ThreadComm adds it: rank 0's values, plus rank 1's, …
        float* sum = out + lo(me);
        std::copy(in, in + mine, sum);
        for (std::size_t q = 1; q < n; ++q) {
            const float* theirs = in + q * mine;
            for (std::size_t i = 0; i < mine; ++i) sum[i] += theirs[i];
        }
        if (kind == Kind::allreduce_mean) {
            const auto div = static_cast<float>(s.size);
            for (std::size_t i = 0; i < mine; ++i) sum[i] /= div;
        }
        collective(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, slice, at, MPI_FLOAT, s.data, &req), req, kind,
                   "the gathering of the summed slices");
        std::copy(out, out + count, data.begin());
    }

    void broadcast(std::span<float> data, int root) {
        check_peer(root, "broadcast");
        agree(Kind::broadcast, root, data.size());
        if (data.empty() || size() == 1) return;
        State& s = *s_;
        float* buf = s.stage(s.out, data.size());
        if (s.rank == root) std::copy(data.begin(), data.end(), buf);
        MPI_Request req = MPI_REQUEST_NULL;
        collective(MPI_Ibcast(buf, static_cast<int>(data.size()), MPI_FLOAT, root, s.data, &req), req, Kind::broadcast,
                   "the broadcast");
        if (s.rank != root) std::copy(buf, buf + data.size(), data.begin());
    }

    void allgather(std::span<const float> in, std::span<float> out) {
        if (out.size() != in.size() * static_cast<std::size_t>(size()))
            throw ckpt::ConfigError("allgather: the output holds " + std::to_string(out.size()) + " floats, " +
                                    std::to_string(size()) + " ranks of " + std::to_string(in.size()) + " need " +
                                    std::to_string(in.size() * static_cast<std::size_t>(size())));
        agree(Kind::allgather, 0, out.size());
        if (in.empty()) return;
        if (size() == 1) {
            std::copy(in.begin(), in.end(), out.begin());
            return;
        }
        State& s = *s_;
        float* mine = s.stage(s.in, in.size());
        float* all = s.stage(s.out, out.size());
        std::copy(in.begin(), in.end(), mine);
        MPI_Request req = MPI_REQUEST_NULL;
        const int count = static_cast<int>(in.size());
        collective(MPI_Iallgather(mine, count, MPI_FLOAT, all, count, MPI_FLOAT, s.data, &req), req, Kind::allgather,
                   "the allgather");
        std::copy(all, all + out.size(), out.begin());
    }

    /// Returns once every rank has called it (the exchange of calls is the barrier).
    void barrier() { agree(Kind::barrier, 0, 0); }

    /// Returns once `dst` has taken the data: its receive has begun, and every piece has
    /// been matched. Two ranks must not both send to each other before receiving.
    void send(std::span<const float> data, int dst, int tag) {
        check_peer(dst, "send");
        check_tag(tag, "send");
        State& s = *s_;
        const auto where = [&] {
            return "send on rank " + std::to_string(s.rank) + " to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")";
        };
        throw_if_spent(where);
        Stage stage(s);
        // the receiver says how many floats it expects, once it is ready for them
        MPI_Request ready = MPI_REQUEST_NULL, head = MPI_REQUEST_NULL;
        started(MPI_Irecv(&stage.words()[0], 1, MPI_UINT64_T, dst, tag, s.ready, &ready), where, dst);
        wait(ready, where, dst, "did not come to receive");
        const std::uint64_t expected = stage.words()[0];
        stage.words()[1] = data.size();
        started(MPI_Isend(&stage.words()[1], 1, MPI_UINT64_T, dst, tag, s.data, &head), where, dst);
        wait(head, where, dst, "did not take the size");
        if (expected != data.size())
            throw ckpt::ConfigError(where() + ": sent " + std::to_string(data.size()) + " floats, rank " + std::to_string(dst) +
                                    " expected " + std::to_string(expected));
        // the data in pieces, each copied into one half of the stage while the other travels
        const auto* bytes = reinterpret_cast<const std::byte*>(data.data());
        const std::size_t total = data.size_bytes();
        MPI_Request sent[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        for (std::size_t k = 0; k * piece_bytes < total; ++k) {
            const std::size_t half = k % 2, len = std::min(piece_bytes, total - k * piece_bytes);
            wait(sent[half], where, dst, "stopped receiving");
            std::memcpy(stage.half(half), bytes + k * piece_bytes, len);
            started(MPI_Issend(stage.half(half), static_cast<int>(len), MPI_BYTE, dst, tag, s.data, &sent[half]), where, dst);
        }
        for (MPI_Request& r : sent) wait(r, where, dst, "stopped receiving");
    }

    void recv(std::span<float> data, int src, int tag) {
        check_peer(src, "recv");
        check_tag(tag, "recv");
        State& s = *s_;
        const auto where = [&] {
            return "recv on rank " + std::to_string(s.rank) + " from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")";
        };
        throw_if_spent(where);
        Stage stage(s);
        // the receives of the size and of the first two pieces are posted before "ready" goes
        // out, so the data never waits for them (MPI matches them in the order they were posted)
        const std::size_t total = data.size_bytes();
        const std::size_t pieces = (total + piece_bytes - 1) / piece_bytes;
        auto piece_len = [&](std::size_t k) { return static_cast<int>(std::min(piece_bytes, total - k * piece_bytes)); };
        MPI_Request head = MPI_REQUEST_NULL, ready = MPI_REQUEST_NULL, got[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        started(MPI_Irecv(&stage.words()[1], 1, MPI_UINT64_T, src, tag, s.data, &head), where, src);
        for (std::size_t k = 0; k < std::min<std::size_t>(pieces, 2); ++k)
            started(MPI_Irecv(stage.half(k), piece_len(k), MPI_BYTE, src, tag, s.data, &got[k]), where, src);
        stage.words()[0] = data.size();
        started(MPI_Isend(&stage.words()[0], 1, MPI_UINT64_T, src, tag, s.ready, &ready), where, src);
        wait(head, where, src, "sent nothing");
        wait(ready, where, src, "did not take the ready message");
        if (const std::uint64_t sent = stage.words()[1]; sent != data.size()) {
            for (MPI_Request& r : got)  // never matched: no data follows a wrong size
                if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
            for (MPI_Request& r : got) wait(r, where, src, "left a receive that could not be withdrawn");
            throw ckpt::ConfigError("recv on rank " + std::to_string(s.rank) + ": expected " + std::to_string(data.size()) +
                                    " floats from rank " + std::to_string(src) + " (tag " + std::to_string(tag) +
                                    "), it sent " + std::to_string(sent));
        }
        auto* bytes = reinterpret_cast<std::byte*>(data.data());
        for (std::size_t k = 0; k < pieces; ++k) {
            const std::size_t half = k % 2;
            wait(got[half], where, src, "stopped sending");
            std::memcpy(bytes + k * piece_bytes, stage.half(half), static_cast<std::size_t>(piece_len(k)));
            if (k + 2 < pieces)
                started(MPI_Irecv(stage.half(half), piece_len(k + 2), MPI_BYTE, src, tag, s.data, &got[half]), where, src);
        }
    }

private:
    static constexpr std::size_t piece_bytes = std::size_t{4} << 20;  // a large message's pieces

    enum class Kind : std::uint32_t { barrier, allreduce_sum, allreduce_mean, broadcast, allgather };
    // What a rank called, exchanged before every collective.
    struct Call {
        Kind kind;
        std::int32_t root;
        std::uint64_t count;
        bool operator==(const Call&) const = default;
    };
    static const char* name(Kind k) {
        static const char* const names[] = {"barrier", "allreduce(sum)", "allreduce(mean)", "broadcast", "allgather"};
        return names[static_cast<std::uint32_t>(k)];
    }
    static std::string describe(const Call& c) {
        std::string s = name(c.kind);
        if (c.kind == Kind::barrier) return s;
        s += " of " + std::to_string(c.count) + " floats";
        if (c.kind == Kind::broadcast) s += " from rank " + std::to_string(c.root);
        return s;
    }

    struct State {
        explicit State(MpiOptions o) : options(o) {}
        MpiOptions options;
        MPI_Comm data = MPI_COMM_NULL, ready = MPI_COMM_NULL;
        int rank = 0, size = 1;
        int tag_ub = 32767;  // the least MPI promises
        std::uint64_t seq = 0;  // collectives called, for messages
        // what the collectives hand to MPI, grown as needed
        std::vector<float> out, in;
        std::vector<int> counts;  // an all-to-all's counts and places, which MPI reads until it completes
        std::vector<Call> calls;
        Call mine{};
        // the sends' and receives' stages (two pieces and two words each), reused
        std::mutex stages_mutex;
        std::vector<std::unique_ptr<std::byte[]>> free_stages;
        struct Failure {
            std::mutex mutex;
            std::atomic<bool> spent{false};
            std::string reason;
            std::vector<int> ranks;
        } failure;

        float* stage(std::vector<float>& v, std::size_t n) {
            if (v.size() < n) v.resize(n);
            return v.data();
        }
    };

    // A send's or receive's own buffers, back to the pool unless the communicator failed
    // (a request MPI still holds may point into them).
    class Stage {
    public:
        explicit Stage(State& s) : s_(s) {
            std::lock_guard lock(s.stages_mutex);
            if (!s.free_stages.empty()) {
                block_ = std::move(s.free_stages.back());
                s.free_stages.pop_back();
            }
            if (!block_) block_ = std::make_unique_for_overwrite<std::byte[]>(2 * piece_bytes + 2 * sizeof(std::uint64_t));
        }
        Stage(const Stage&) = delete;
        Stage& operator=(const Stage&) = delete;
        ~Stage() {
            if (s_.failure.spent) {
                (void)block_.release();
                return;
            }
            std::lock_guard lock(s_.stages_mutex);
            s_.free_stages.push_back(std::move(block_));
        }
        std::byte* half(std::size_t k) { return block_.get() + k * piece_bytes; }
        std::uint64_t* words() { return reinterpret_cast<std::uint64_t*>(block_.get() + 2 * piece_bytes); }

    private:
        State& s_;
        std::unique_ptr<std::byte[]> block_;
    };

    // "allreduce(sum) #12 on rank 0": the collective in progress, for messages.
    std::string call_text(Kind kind) const {
        return std::string(name(kind)) + " #" + std::to_string(s_->seq - 1) + " on rank " + std::to_string(s_->rank);
    }
    std::vector<int> others() const {
        std::vector<int> v;
        for (int q = 0; q < s_->size; ++q)
            if (q != s_->rank) v.push_back(q);
        return v;
    }

    // Marks the communicator spent and throws PeerFailure; the first failure's reason is
    // what later calls report.
    [[noreturn]] void fail(const std::string& what, std::vector<int> ranks) {
        auto& f = s_->failure;
        {
            std::lock_guard lock(f.mutex);
            if (!f.spent) {
                f.reason = what;
                f.ranks = ranks;
                f.spent = true;
            }
        }
        throw PeerFailure(what, std::move(ranks));
    }
    template <class Where>
    void throw_if_spent(const Where& where) {
        auto& f = s_->failure;
        if (!f.spent) return;
        std::lock_guard lock(f.mutex);
        throw PeerFailure(where() + ": the communicator failed earlier (" + f.reason +
                              "); an MPI job does not go on after a failure: run it again to resume from its checkpoints",
                          f.ranks);
    }

    void check_peer(int peer, const char* what) const {
        if (peer < 0 || peer >= size())
            throw ckpt::ConfigError(std::string(what) + ": rank " + std::to_string(peer) + " is not in a group of " +
                                    std::to_string(size()));
    }
    void check_tag(int tag, const char* what) const {
        if (tag < 0 || tag > s_->tag_ub)
            throw ckpt::ConfigError(std::string(what) + ": tag " + std::to_string(tag) + " is outside MPI's 0 … " +
                                    std::to_string(s_->tag_ub));
    }

    // Starts collective `kind`: exchanges this rank's call with every rank's. Every rank
    // throws a ConfigError naming its call and another's when they differ; MPI's int counts
    // bound the size.
    void agree(Kind kind, int root, std::size_t count) {
        State& s = *s_;
        ++s.seq;
        throw_if_spent([&] { return call_text(kind); });
        if (count > static_cast<std::size_t>(INT_MAX))
            throw ckpt::ConfigError(call_text(kind) + ": " + std::to_string(count) + " floats; MPI counts are int, at most " +
                                    std::to_string(INT_MAX) + " a call");
        if (s.size == 1) return;
        s.mine = Call{kind, root, count};
        s.calls.resize(static_cast<std::size_t>(s.size));
        MPI_Request req = MPI_REQUEST_NULL;
        collective(MPI_Iallgather(&s.mine, sizeof(Call), MPI_BYTE, s.calls.data(), sizeof(Call), MPI_BYTE, s.data, &req), req,
                   kind, "the exchange of every rank's call");
        for (int q = 0; q < s.size; ++q)
            if (!(s.calls[static_cast<std::size_t>(q)] == s.mine))
                throw ckpt::ConfigError("collective #" + std::to_string(s.seq - 1) + ": rank " + std::to_string(s.rank) +
                                        " called " + describe(s.mine) + ", rank " + std::to_string(q) + " " +
                                        describe(s.calls[static_cast<std::size_t>(q)]));
    }

    // Waits for the collective that `rc` started (`req`), a step of `kind` that `what` names
    // ("the broadcast"); PeerFailure naming every other rank (MPI does not say which did not
    // come) at the timeout.
    void collective(int rc, MPI_Request& req, Kind kind, const char* what) {
        if (rc == MPI_SUCCESS) rc = test_until_deadline(req);
        if (rc == timed_out) {
            const auto late = others();
            fail(call_text(kind) + ": " + what + " did not complete within " + std::to_string(s_->options.timeout.count()) +
                     " ms, waiting for one or more of " + detail::mpi_ranks_text(late) + " (MPI does not say which)",
                 late);
        }
        if (rc != MPI_SUCCESS) fail(call_text(kind) + ": " + what + ": " + detail::mpi_error_text(rc), others());
    }

    // The start of a send's or receive's request; PeerFailure naming the peer if it failed.
    template <class Where>
    void started(int rc, const Where& where, int peer) {
        if (rc != MPI_SUCCESS) fail(where() + ": " + detail::mpi_error_text(rc), {peer});
    }
    // Waits for a send's or receive's request (nothing when it is null); PeerFailure naming the
    // peer at the timeout, `what` saying what it did not do ("did not come to receive").
    template <class Where>
    void wait(MPI_Request& req, const Where& where, int peer, const char* what) {
        if (req == MPI_REQUEST_NULL) return;
        const int rc = test_until_deadline(req);
        if (rc == timed_out)
            fail(where() + ": rank " + std::to_string(peer) + " " + what + " within " +
                     std::to_string(s_->options.timeout.count()) + " ms",
                 {peer});
        if (rc != MPI_SUCCESS) fail(where() + ": " + detail::mpi_error_text(rc), {peer});
    }

    static constexpr int timed_out = -1;  // not an MPI error code (they are ≥ 0)
    // MPI_Test until `req` completes (MPI_SUCCESS) or fails (its error), or timed_out.
    int test_until_deadline(MPI_Request& req) const {
        int rc = MPI_SUCCESS;
        const bool done = detail::mpi_poll(
            [&] {
                int flag = 0;
                rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
                return rc != MPI_SUCCESS || flag;
            },
            detail::MpiClock::now() + s_->options.timeout);
        return done ? rc : timed_out;
    }
    std::unique_ptr<State> s_;
};

static_assert(Communicator<MpiComm>);
// No rank outlives another's death under Debian's Open MPI: nothing to shrink to or repair.
static_assert(!ShrinkableCommunicator<MpiComm>);

}  // namespace fault
