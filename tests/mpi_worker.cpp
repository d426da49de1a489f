// One rank of an MpiComm job, started under mpirun (scripts/mpirun.sh) by the mpi tests.
//
//   mpi_worker collectives        every call of the concept, results checked: sums and means
//                                 bit-equal to ThreadComm's on the same inputs, broadcasts from
//                                 every root, allgather, barrier, sends around a ring (in
//                                 several pieces, small, empty); ranks disagreeing on a
//                                 collective, and a send/recv size mismatch, are ConfigErrors
//                                 on both sides (printed "config_error: …"), after which the
//                                 communicator still works; MpiComm over MPI_COMM_WORLD beside
//                                 the program's own messages with the same tags, and over a
//                                 part of the ranks. Prints "ok".
//   mpi_worker timeout            rank 1 stays away (3 s): the others' barrier, rank 0's recv
//                                 from rank 1 and rank 2's send to it end in PeerFailure (1 s
//                                 timeout), printed "peer_failure CALL ranks=R,… after_ms=T";
//                                 a call on the spent communicator then "spent after_ms=T".
//   mpi_worker single             MPI_Init (MPI_THREAD_SINGLE): MpiComm refuses it, MpiSession
//                                 refuses a second start; "config_error: …" for each
//   mpi_worker save DIR           every rank saves "w" and its piece of "m" as step 7 and
//                                 commits the global index; prints "ok"
//   mpi_worker load DIR           every rank loads its piece of "m" for this world's layout,
//                                 and "w", from DIR's index (load_resharded); prints "ok"
//   mpi_worker train DIR SLOW_MS  the data-parallel job of tests/mpi_support.hpp with each
//                                 rank's checkpoints every 2 steps and the global index of
//                                 each, resumed from DIR's newest whole index if there is one
//                                 ("resumed at step S"); prints "rank R pid P" and, on rank 0,
//                                 "step S" after each step, which takes SLOW_MS at least;
//                                 writes DIR/params-R.bin
//   mpi_worker memory DIR         the same job with the memory level (copies sent on a thread
//                                 of their own) for an epoch; then rank 2 loses its memory,
//                                 every rank recovers in a new MpiComm ("rank R recovered
//                                 step S from SOURCE") and trains to the end; writes
//                                 DIR/params-R.bin
// A failed check or an unexpected error: the message on stderr and exit 1 at once, before
// MPI_Finalize, so that mpirun ends the job.

#include <unistd.h>

#include <fault/fault.hpp>
#include <fault/mpi_comm.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mpi_support.hpp"

namespace {

namespace fs = boost::filesystem;
using namespace std::chrono_literals;

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "%s\n", what.c_str());
    std::fflush(stderr);
    std::exit(1);
}

void expect(bool ok, const std::string& what) {
    if (!ok) fail("check failed: " + what);
}

void say(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
}

std::string ranks_text(const std::vector<int>& ranks) {
    std::string s;
    for (int q : ranks) s += (s.empty() ? "" : ",") + std::to_string(q);
    return s;
}

long ms_since(std::chrono::steady_clock::time_point t) {
    return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t).count());
}

/// Rank q's contribution to a sum of `count` floats: magnitudes from 1e-3 to 1e3, so that
/// adding them in another order gives other bits.
std::vector<float> summand(int q, std::size_t count) {
    std::mt19937 gen(static_cast<unsigned>(1000 * q + count));
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-10, 10);
    std::vector<float> v(count);
    for (float& x : v) x = std::ldexp(mantissa(gen), exponent(gen));
    return v;
}

/// What ThreadComm's allreduce gives `n` ranks contributing summand(q, count).
std::vector<float> thread_comm_allreduce(int n, std::size_t count, fault::ReduceOp op) {
    fault::ThreadGroup group(n, 10s);
    std::vector<float> result;
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto v = summand(comm.rank(), count);
        comm.allreduce(v, op);
        if (comm.rank() == 0) result = std::move(v);
    }).rethrow();
    return result;
}

/// Runs `call`, which must throw a ConfigError; prints its message.
template <class F>
void expect_config_error(F&& call, const std::string& what) {
    try {
        call();
    } catch (const ckpt::ConfigError& e) {
        say(std::string("config_error: ") + e.what());
        return;
    }
    fail(what + ": no ConfigError");
}

void collectives(fault::MpiComm& comm) {
    const int r = comm.rank(), n = comm.size();
    // sums and means: ThreadComm's bits, for sizes under the number of ranks, between, and of
    // several pieces
    for (const std::size_t count : {std::size_t(1), std::size_t(3), std::size_t(1001), std::size_t(1 << 20) + 3})
        for (const auto op : {fault::ReduceOp::sum, fault::ReduceOp::mean}) {
            auto v = summand(r, count);
            comm.allreduce(v, op);
            const auto want = thread_comm_allreduce(n, count, op);
            expect(std::memcmp(v.data(), want.data(), count * sizeof(float)) == 0,
                   "allreduce(" + std::string(op == fault::ReduceOp::sum ? "sum" : "mean") + ") of " + std::to_string(count) +
                       " floats: the bits of ThreadComm's");
        }
    std::vector<float> none;
    comm.allreduce(none, fault::ReduceOp::sum);
    for (int root = 0; root < n; ++root) {
        std::vector<float> b(5, -1.0f);
        if (r == root) std::iota(b.begin(), b.end(), static_cast<float>(10 * root));
        comm.broadcast(b, root);
        for (std::size_t i = 0; i < b.size(); ++i)
            expect(b[i] == static_cast<float>(10 * root) + static_cast<float>(i), "broadcast from rank " + std::to_string(root));
    }
    const std::vector<float> mine{static_cast<float>(r), static_cast<float>(100 * r), 0.5f * static_cast<float>(r)};
    std::vector<float> all(3 * static_cast<std::size_t>(n));
    comm.allgather(mine, all);
    for (int q = 0; q < n; ++q)
        expect(all[3 * q] == static_cast<float>(q) && all[3 * q + 1] == static_cast<float>(100 * q) &&
                   all[3 * q + 2] == 0.5f * static_cast<float>(q),
               "allgather");
    comm.barrier();
    // around a ring, rank 0 sending first: 10 MB (three pieces), 3 floats, nothing
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<float> big((5u << 20) / 2), got(big.size()), small(3), empty;
    auto pass_on = [&] {
        for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(r) + static_cast<float>(i);
        comm.send(big, next, 4);
        comm.send(std::vector<float>{static_cast<float>(r), 1, 2}, next, 9);
        comm.send(empty, next, 0);
    };
    if (r == 0) pass_on();
    comm.recv(got, prev, 4);
    for (std::size_t i = 0; i < got.size(); i += 4099)
        expect(got[i] == static_cast<float>(prev) + static_cast<float>(i), "recv of 10 MB at " + std::to_string(i));
    expect(got.back() == static_cast<float>(prev) + static_cast<float>(got.size() - 1), "recv of 10 MB, its end");
    comm.recv(small, prev, 9);
    expect(small == std::vector<float>{static_cast<float>(prev), 1, 2}, "recv of 3 floats");
    comm.recv(empty, prev, 0);
    if (r != 0) pass_on();

    // ranks that disagree: every rank's call fails alike, and the next one goes through
    std::vector<float> ten(r == 1 ? 11 : 10, 1.0f);
    expect_config_error([&] { comm.allreduce(ten, fault::ReduceOp::sum); }, "allreduce of 10 floats, 11 on rank 1");
    expect_config_error(
        [&] {
            if (r == n - 1) comm.barrier();
            else comm.broadcast(ten, 0);
        },
        "a barrier on the last rank, a broadcast on the others");
    std::vector<float> one{1.0f};
    comm.allreduce(one, fault::ReduceOp::sum);
    expect(one[0] == static_cast<float>(n), "allreduce after the disagreements");
    // a receiver expecting 2 floats, sent 3: both sides fail; then 2 go through
    if (r == 0) expect_config_error([&] { comm.send(std::vector<float>{1, 2, 3}, 1, 5); }, "send of 3 floats to a recv of 2");
    if (r == 1) {
        std::vector<float> two(2);
        expect_config_error([&] { comm.recv(two, 0, 5); }, "recv of 2 floats from a send of 3");
        comm.recv(two, 0, 5);
        expect(two == std::vector<float>{4, 5}, "recv after the size mismatch");
    }
    if (r == 0) comm.send(std::vector<float>{4, 5}, 1, 5);
    comm.barrier();
}

/// MpiComm over communicators the program owns: MPI_COMM_WORLD, whose own messages with the
/// same tags never meet ckpt's, and a part of the ranks (MPI_Comm_split).
void own_communicators(fault::MpiSession& mpi) {
    const int r = mpi.rank();
    fault::MpiComm comm(MPI_COMM_WORLD, {.timeout = 20s});
    if (r == 0) {
        const float theirs = 42;
        MPI_Send(&theirs, 1, MPI_FLOAT, 1, 9, MPI_COMM_WORLD);  // sent first, received last
        comm.send(std::vector<float>{1, 2}, 1, 9);
    }
    if (r == 1) {
        std::vector<float> two(2);
        comm.recv(two, 0, 9);
        expect(two == std::vector<float>{1, 2}, "ckpt's message beside the program's, same tag");
        float theirs = 0;
        MPI_Recv(&theirs, 1, MPI_FLOAT, 0, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        expect(theirs == 42, "the program's message beside ckpt's, same tag");
    }
    MPI_Comm half = MPI_COMM_NULL;  // the even ranks, and the odd ones
    MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &half);
    {
        fault::MpiComm part(half, {.timeout = 20s});
        std::vector<float> v{static_cast<float>(r)};
        part.allreduce(v, fault::ReduceOp::sum);
        float want = 0;
        for (int q = r % 2; q < mpi.size(); q += 2) want += static_cast<float>(q);
        expect(v[0] == want && part.size() == (mpi.size() + 1 - r % 2) / 2, "allreduce over the ranks of one parity");
    }
    MPI_Comm_free(&half);
}

/// MPI started by the program without MPI_THREAD_MULTIPLE: MpiComm refuses it, and a second
/// start is refused to MpiSession.
int single() {
    MPI_Init(nullptr, nullptr);
    expect_config_error([] { fault::MpiComm comm(MPI_COMM_WORLD); }, "MpiComm on MPI_THREAD_SINGLE");
    expect_config_error([] { fault::MpiSession again; }, "MpiSession after MPI_Init");
    MPI_Finalize();
    return 0;
}

int timeout(fault::MpiSession& mpi) {
    fault::MpiComm comm(mpi, {.timeout = 1000ms}), peer(mpi, {.timeout = 1000ms});
    const int r = comm.rank();
    comm.barrier();
    if (r == 1) {
        std::this_thread::sleep_for(3s);
        say("rank 1 stayed away");
        return 0;
    }
    auto report = [&](const std::string& call, auto&& f) {
        const auto t = std::chrono::steady_clock::now();
        try {
            f();
        } catch (const fault::PeerFailure& e) {
            say("peer_failure " + call + " ranks=" + ranks_text(e.ranks()) + " after_ms=" + std::to_string(ms_since(t)) + ": " +
                e.what());
            return;
        }
        fail(call + " on rank " + std::to_string(r) + " went through without rank 1");
    };
    report("barrier", [&] { comm.barrier(); });
    const auto t = std::chrono::steady_clock::now();
    try {
        std::vector<float> v(4, 1.0f);
        comm.allreduce(v, fault::ReduceOp::sum);
        fail("a call on the spent communicator went through");
    } catch (const fault::PeerFailure& e) {
        say("spent after_ms=" + std::to_string(ms_since(t)) + ": " + e.what());
    }
    std::vector<float> v(3);
    if (r == 0) report("recv", [&] { peer.recv(v, 1, 7); });
    if (r == 2) report("send", [&] { peer.send(v, 1, 7); });
    return 0;
}

/// "w" (3×5, whole on every rank) and "m" (512×64, rank r's piece of `ranks`), as in test_reshard.cpp.
constexpr std::int64_t rows = 512;
std::vector<float> iota_of(std::size_t n, float first) {
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), first);
    return v;
}

void save(fault::MpiComm& comm, const fs::path& dir) {
    const std::uint64_t n = rows * 64;
    const auto [lo, hi] = fault::ShardLayout{comm.size()}.piece(n, comm.rank());
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(iota_of(15, 0), {3, 5}));
    d.set("m", ckpt::Tensor::from(iota_of(hi - lo, static_cast<float>(lo)), {static_cast<std::int64_t>(hi - lo)}));
    d.set("trainer.global_step", std::int64_t{7});
    const fs::path file = dir / ("rank_" + std::to_string(comm.rank())) / "step_7.ckpt";
    fs::create_directories(file.parent_path());
    ckpt::save_checkpoint(d, file);
    fault::commit_global_index(comm, dir, 7, file, {{"m", {"m", {rows, 64}, lo}}}, 16 << 10);
    say("ok");
}

void load(fault::MpiComm& comm, const fs::path& dir) {
    const auto [lo, hi] = fault::ShardLayout{comm.size()}.piece(rows * 64, comm.rank());
    ckpt::ParamDict like;
    like.set("w", ckpt::Tensor(ckpt::DType::float32, {3, 5}));
    like.set("m", ckpt::Tensor(ckpt::DType::float32, {static_cast<std::int64_t>(hi - lo)}));
    const auto got = ckpt::load_resharded(dir / "index-step_7.ckpt", like, {{"m", {"m", {rows, 64}, lo}}});
    expect(got.state.at("m") == ckpt::Value(ckpt::Tensor::from(iota_of(hi - lo, static_cast<float>(lo)),
                                                               {static_cast<std::int64_t>(hi - lo)})),
           "the loaded piece of m");
    expect(got.state.at("w") == ckpt::Value(ckpt::Tensor::from(iota_of(15, 0), {3, 5})), "the loaded w");
    expect(got.state.get<std::int64_t>("trainer.global_step") == 7, "the loaded step");
    say("ok");
}

void write_params(const fs::path& dir, int rank, const std::vector<nn::Parameter*>& params) {
    const auto v = test::flat(params);
    std::ofstream out((dir / ("params-" + std::to_string(rank) + ".bin")).string(), std::ios::binary);
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    if (!out) fail("cannot write the parameters of rank " + std::to_string(rank));
}

void train(fault::MpiComm& comm, const fs::path& dir, int slow_ms) {
    const int r = comm.rank();
    say("rank " + std::to_string(r) + " pid " + std::to_string(::getpid()));
    test::DpJob<fault::MpiComm> job(comm);
    nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepLast> files(dir / ("rank_" + std::to_string(r)), "net", {},
                                                                ckpt::EverySteps{2}, ckpt::KeepLast{2});
    fault::GlobalIndexer indexer(comm, files, dir, [&] { return job.opt().piece_map(); });
    std::int64_t initial_epoch = 0;
    if (auto resumed = fault::load_latest_resharded(comm, dir, job.trainer.load_target(), job.opt().piece_map())) {
        job.opt().claim_resharded(resumed->state.state);
        const auto rp = job.trainer.resume_from_state(resumed->state.state, resumed->index.string(), job.data);
        job.opt().set_completed_steps(rp.global_step);
        initial_epoch = rp.initial_epoch;
        say("rank " + std::to_string(r) + " resumed at step " + std::to_string(rp.global_step));
    }
    struct Progress {
        int rank, slow_ms;
        void on_step_end(nn::RunContext& c) {
            std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
            if (rank == 0) say("step " + std::to_string(c.global_step));
        }
    } progress{r, slow_ms};
    job.trainer.train(test::mpi_epochs, job.data, nn::callbacks(files, indexer, progress), initial_epoch);
    write_params(dir, r, job.net.parameters());
}

void memory(fault::MpiSession& mpi, const fs::path& dir) {
    fault::MemoryLevel level;
    {
        fault::MpiComm comm(mpi, {.timeout = 20s});
        test::DpJob<fault::MpiComm> job(comm);
        fault::MemoryCheckpoint<fault::MpiComm> every_3(comm, level, 3);  // steps 3 and 6
        job.trainer.train(1, job.data, every_3);
    }
    if (mpi.rank() == 2) level = fault::MemoryLevel{};  // its process lost: its memory is gone
    fault::MpiComm comm(mpi, {.timeout = 20s});         // the next generation
    test::DpJob<fault::MpiComm> job(comm);
    const auto got = level.recover(comm);
    if (!got) fail("rank " + std::to_string(comm.rank()) + " recovered nothing from the memory level");
    say("rank " + std::to_string(comm.rank()) + " recovered step " + std::to_string(got->step) + " from " + got->source);
    const auto rp = job.trainer.resume_from_state(got->state, "memory, step " + std::to_string(got->step), job.data);
    job.opt().set_completed_steps(rp.global_step);
    fault::MemoryCheckpoint<fault::MpiComm> every_3(comm, level, 3);
    job.trainer.train(test::mpi_epochs, job.data, every_3, rp.initial_epoch);
    write_params(dir, comm.rank(), job.net.parameters());
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    try {
        if (mode == "single") return single();
        fault::MpiSession mpi(argc, argv);
        if (mode == "timeout") return timeout(mpi);
        if (mode == "memory" && argc == 3) {
            memory(mpi, argv[2]);
            return 0;
        }
        fault::MpiComm comm(mpi, {.timeout = 20s});
        if (mode == "collectives") {
            collectives(comm);
            own_communicators(mpi);
            say("ok");
        }
        else if (mode == "save" && argc == 3) save(comm, argv[2]);
        else if (mode == "load" && argc == 3) load(comm, argv[2]);
        else if (mode == "train" && argc == 4) train(comm, argv[2], std::atoi(argv[3]));
        else fail("usage: mpi_worker collectives|timeout|single|save DIR|load DIR|train DIR SLOW_MS|memory DIR");
    } catch (const std::exception& e) {
        fail(std::string("error: ") + e.what());
    }
    return 0;
}
