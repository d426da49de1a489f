// MpiComm with real processes under mpirun (scripts/mpirun.sh, the flags this host needs): the
// modes of tests/mpi_worker.cpp, checked from here against references computed here on
// ThreadComm; a real SIGKILL from outside.

#include <doctest/doctest.h>

#include <fault/fault.hpp>

#include "mpi_support.hpp"
#include "process.hpp"
#include "support.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = boost::filesystem;
using namespace std::chrono_literals;

/// mpi_worker `args` on `ranks` ranks under scripts/mpirun.sh; the output of every rank and
/// of mpirun goes to `log`.
std::unique_ptr<test::Process> start(int ranks, const std::vector<std::string>& args, const fs::path& log) {
    std::vector<std::string> argv{"/bin/bash", CKPT_MPIRUN, "-np", std::to_string(ranks), CKPT_MPI_WORKER};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<test::Process>(argv, log.string());
}

struct Finished {
    int status;
    std::string output;
};

/// Runs the job to its end; fails the test if it takes more than a minute.
Finished run(int ranks, const std::vector<std::string>& args, const fs::path& log) {
    auto job = start(ranks, args, log);
    const auto status = job->wait(60s);
    INFO(job->output());
    REQUIRE(status);
    return {*status, job->output()};
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
}

std::size_t count_lines(const std::string& text, const std::string& line) {
    const auto all = lines_of(text);
    return static_cast<std::size_t>(std::count(all.begin(), all.end(), line));
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Rank 0's parameters after the job of mpi_support.hpp on 4 ThreadComm ranks, which end
/// with equal parameters.
std::vector<float> thread_comm_params() {
    fault::ThreadGroup group(4, 20s);
    test::Params params(4);
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        test::DpJob<fault::ThreadComm> job(comm);
        job.trainer.train(test::mpi_epochs, job.data);
        params[static_cast<std::size_t>(comm.rank())] = test::flat(job.net.parameters());
    }).rethrow();
    for (std::size_t r = 1; r < params.size(); ++r) REQUIRE(params[r] == params[0]);
    return params[0];
}

std::vector<float> read_params(const fs::path& file) {
    std::ifstream in(file.string(), std::ios::binary);
    REQUIRE_MESSAGE(in, "no " << file);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<float> v(bytes.size() / sizeof(float));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
    return v;
}

}  // namespace

TEST_CASE("MpiComm: every call on 2, 3 and 4 ranks, sums bit-equal to ThreadComm's, disagreements refused on both sides, the program's own communicators") {
    for (const int ranks : {2, 3, 4}) {  // 3: a mean divides by 3, which is not exact as halving is
        CAPTURE(ranks);
        test::TempDir dir;
        const auto job = run(ranks, {"collectives"}, dir / "log");
        INFO(job.output);
        CHECK(job.status == 0);
        CHECK(count_lines(job.output, "ok") == static_cast<std::size_t>(ranks));
        // a receiver expecting 2 floats, sent 3: a ConfigError on each side, naming both sizes
        CHECK(has(job.output, "config_error: recv on rank 1: expected 2 floats from rank 0 (tag 5), it sent 3\n"));
        CHECK(has(job.output, "config_error: send on rank 0 to rank 1 (tag 5): sent 3 floats, rank 1 expected 2\n"));
        // ranks calling collectives that differ: every rank is told, naming its call and another's
        CHECK(has(job.output, ": rank 0 called allreduce(sum) of 10 floats, rank 1 allreduce(sum) of 11 floats\n"));
        CHECK(has(job.output, ": rank " + std::to_string(ranks - 1) + " called barrier, rank 0 broadcast of 10 floats from rank 0\n"));
        const auto lines = lines_of(job.output);
        CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
                  return l.rfind("config_error: collective #", 0) == 0;
              }) == 2 * ranks);
    }
}

TEST_CASE("MpiComm: MPI started without MPI_THREAD_MULTIPLE is refused, and so is a second start") {
    test::TempDir dir;
    const auto job = run(1, {"single"}, dir / "log");
    INFO(job.output);
    CHECK(job.status == 0);
    CHECK(has(job.output, "config_error: MpiComm: MPI was initialized with MPI_THREAD_SINGLE; it needs MPI_THREAD_MULTIPLE"));
    CHECK(has(job.output, "config_error: MpiSession: MPI is already initialized"));
}

TEST_CASE("MpiComm: a rank that does not come ends the others' calls in PeerFailure at the timeout, and spends the communicator") {
    test::TempDir dir;
    const auto job = run(4, {"timeout"}, dir / "log");
    INFO(job.output);
    CHECK(job.status == 0);
    CHECK(count_lines(job.output, "rank 1 stayed away") == 1);
    const std::regex failure(R"(peer_failure (\w+) ranks=([0-9,]+) after_ms=([0-9]+): (.*))");
    int barriers = 0, spent = 0;
    for (const auto& line : lines_of(job.output)) {
        std::smatch m;
        if (line.rfind("spent after_ms=", 0) == 0) {
            ++spent;
            CHECK(std::stol(line.substr(15)) < 100);  // at once
            CHECK(has(line, "the communicator failed earlier (barrier #1 on rank "));
        }
        if (!std::regex_match(line, m, failure)) continue;
        CAPTURE(line);
        const long after = std::stol(m[3]);
        CHECK(after >= 1000);  // the 1 s timeout, and not much more
        CHECK(after < 2000);
        if (m[1] == "barrier") {
            ++barriers;  // a collective: MPI does not say who is missing, every other rank is named
            const int rank = has(m[4], "on rank 0:") ? 0 : has(m[4], "on rank 2:") ? 2 : 3;
            std::string others;
            for (int q = 0; q < 4; ++q)
                if (q != rank) others += (others.empty() ? "" : ",") + std::to_string(q);
            CHECK(m[2] == others);
            CHECK(has(m[4], "did not complete within 1000 ms, waiting for one or more of ranks"));
        } else if (m[1] == "recv") {  // point to point: the peer
            CHECK(m[2] == "1");
            CHECK(m[4] == "recv on rank 0 from rank 1 (tag 7): rank 1 sent nothing within 1000 ms");
        } else {
            CHECK(m[1] == "send");
            CHECK(m[2] == "1");
            CHECK(m[4] == "send on rank 2 to rank 1 (tag 7): rank 1 did not come to receive within 1000 ms");
        }
    }
    CHECK(barriers == 3);
    CHECK(spent == 3);
    CHECK(has(job.output, "peer_failure recv ranks=1"));
    CHECK(has(job.output, "peer_failure send ranks=1"));
}

TEST_CASE("MpiComm: data-parallel training with the memory level equals ThreadComm's, a lost rank recovered from its partner") {
    test::TempDir dir;
    const auto job = run(4, {"memory", dir.path().string()}, dir / "log");
    INFO(job.output);
    REQUIRE(job.status == 0);
    // the snapshot of step 6: rank 2's from rank 3's memory, the others' from their own
    for (int r = 0; r < 4; ++r)
        CHECK(count_lines(job.output, "rank " + std::to_string(r) + " recovered step 6 from " +
                                          (r == 2 ? "rank 3's memory" : "its own memory")) == 1);
    const auto want = thread_comm_params();
    for (int r = 0; r < 4; ++r) CHECK(read_params(dir / ("params-" + std::to_string(r) + ".bin")) == want);
}

TEST_CASE("MpiComm: a step saved by 4 ranks with its global index loads into 2 ranks (load_resharded)") {
    test::TempDir dir;
    const auto saved = run(4, {"save", dir.path().string()}, dir / "save.log");
    INFO(saved.output);
    REQUIRE(saved.status == 0);
    CHECK(count_lines(saved.output, "ok") == 4);
    const auto index = ckpt::read_global_index(dir / "index-step_7.ckpt");
    CHECK(index.world_size == 4);
    CHECK(index.pieces.size() == 8);  // every rank's w and its piece of m
    const auto loaded = run(2, {"load", dir.path().string()}, dir / "load.log");
    INFO(loaded.output);
    CHECK(loaded.status == 0);
    CHECK(count_lines(loaded.output, "ok") == 2);  // each checked its piece: the saved values
}

TEST_CASE("MpiComm: a rank SIGKILLed ends the whole job, and the same command run again resumes from the last checkpoint") {
    test::TempDir dir;
    const std::vector<std::string> command{"train", dir.path().string(), "100"};
    {
        auto job = start(4, command, dir / "first.log");
        REQUIRE_MESSAGE(job->wait_for_output("step 7\n", 60s), job->output());  // step 6's index is committed
        std::smatch m;
        const std::string out = job->output();
        REQUIRE(std::regex_search(out, m, std::regex("rank 1 pid ([0-9]+)")));
        ::kill(static_cast<pid_t>(std::stol(m[1])), SIGKILL);
        const auto killed = std::chrono::steady_clock::now();
        const auto status = job->wait(20s);  // mpirun kills the others (SIGTERM, SIGKILL a second later)
        INFO(job->output());
        REQUIRE(status);
        CHECK(*status == 128 + SIGKILL);  // rank 1's own end
        CHECK(std::chrono::steady_clock::now() - killed < 10s);
        CHECK(has(job->output(), "exited on signal 9 (Killed)"));
        CHECK_FALSE(has(job->output(), "step 16\n"));
        CHECK_FALSE(fs::exists(dir / "params-0.bin"));
    }
    const auto again = run(4, command, dir / "again.log");
    INFO(again.output);
    REQUIRE(again.status == 0);
    std::smatch m;
    REQUIRE(std::regex_search(again.output, m, std::regex("rank 0 resumed at step ([0-9]+)")));
    const std::string step = m[1];
    CHECK((step == "6" || step == "8"));  // the newest index whole when rank 1 died
    for (int r = 1; r < 4; ++r) CHECK(count_lines(again.output, "rank " + std::to_string(r) + " resumed at step " + step) == 1);
    const auto want = thread_comm_params();
    for (int r = 0; r < 4; ++r) CHECK(read_params(dir / ("params-" + std::to_string(r) + ".bin")) == want);
}
