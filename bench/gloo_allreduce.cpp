// GlooComm::allreduce against Gloo's own allreduce on the same buffers, the same processes
// and the same connections' kind: R ranks (processes forked from this one) on loopback,
// meeting through a file store. For each size the two run alternately, several times; the
// ratio is of bandwidths (GlooComm over raw Gloo), from the medians.
//
//   gloo_allreduce [--ranks R] [--reps N] [--max-mib M] [--dir DIR]
// --max-mib M: sizes up to M MiB (default 128: 0.25, 4, 32 and 128 MiB).
// Last line: gloo_allreduce bandwidth GlooComm/raw=X (the largest size)
// Exit status 1 if the run did not time what it planned: every timed allreduce, of either,
// summed every rank's buffer (each element R afterwards), no faster than memory.

#include <fault/gloo_comm.hpp>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/file_store.h>

#include "bench_support.hpp"

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
    if (v.empty()) return 0;  // the checks say what is missing
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int run_rank(const std::string& store_dir, int rank, int ranks, int reps, std::size_t max_mib) {
    fault::FileStore store(store_dir);
    fault::GlooComm comm(store, rank, ranks, {.prefix = "comm/"});
    // raw Gloo: its own context and device, its own FileStore on its own directory
    gloo::rendezvous::FileStore raw_store(store_dir + "/raw");
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
    ctx->setTimeout(std::chrono::seconds(60));
    ctx->connectFullMesh(raw_store, device);

    double last_ratio = 0;
    bench::Checks check;
    // every element of every rank's 1.0 summed: the allreduce happened, over the whole buffer
    auto summed = [&](const std::vector<float>& b) {
        return std::all_of(b.begin(), b.end(), [&](float v) { return v == static_cast<float>(ranks); });
    };
    for (const std::size_t floats : {std::size_t(1) << 16, std::size_t(1) << 20, std::size_t(1) << 23, std::size_t(1) << 25}) {
        if (floats * sizeof(float) > (max_mib << 20)) break;
        std::vector<float> buf(floats, 1.0f);
        std::vector<double> raw_s, comm_s;
        int raw_summed = 0, comm_summed = 0;
        auto raw_allreduce = [&] {
            comm.barrier();
            const auto t = Clock::now();
            gloo::AllreduceOptions o(ctx);
            o.setOutput(buf.data(), buf.size());
            o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
            gloo::allreduce(o);
            const double s = std::chrono::duration<double>(Clock::now() - t).count();
            raw_summed += summed(buf);
            std::fill(buf.begin(), buf.end(), 1.0f);
            return s;
        };
        auto comm_allreduce = [&] {
            comm.barrier();
            const auto t = Clock::now();
            comm.allreduce(buf, fault::ReduceOp::sum);
            const double s = std::chrono::duration<double>(Clock::now() - t).count();
            comm_summed += summed(buf);
            std::fill(buf.begin(), buf.end(), 1.0f);
            return s;
        };
        for (int i = 0; i < reps + 1; ++i) {  // the first of each is a warm-up; who goes first alternates
            double raw = 0, mine = 0;
            if (i % 2 == 0) raw = raw_allreduce(), mine = comm_allreduce();
            else mine = comm_allreduce(), raw = raw_allreduce();
            if (i > 0) raw_s.push_back(raw), comm_s.push_back(mine);
        }
        const double bytes = static_cast<double>(floats * sizeof(float));
        const std::string size = "rank " + std::to_string(rank) + ", " + std::to_string(floats * sizeof(float) >> 10) + " KiB: ";
        check.count(size + "raw Gloo allreduces that summed every element (warm-up included)", reps + 1, raw_summed);
        check.count(size + "GlooComm allreduces that summed every element (warm-up included)", reps + 1, comm_summed);
        check.rate(size + "raw Gloo allreduce (median)", bytes, median(raw_s));
        check.rate(size + "GlooComm allreduce (median)", bytes, median(comm_s));
        // rank 0's medians speak for all: every rank waits for the slowest in each call
        const double mib = static_cast<double>(floats * sizeof(float)) / (1 << 20);
        last_ratio = median(raw_s) / median(comm_s);
        if (rank == 0)
            std::printf("%8.2f MiB: raw Gloo %8.2f ms (%7.1f MiB/s), GlooComm %8.2f ms (%7.1f MiB/s), ratio %.3f\n", mib,
                        1e3 * median(raw_s), mib / median(raw_s), 1e3 * median(comm_s), mib / median(comm_s), last_ratio);
        std::fflush(stdout);
    }
    if (rank == 0) std::printf("gloo_allreduce bandwidth GlooComm/raw=%.3f\n", last_ratio);
    check.positive("rank " + std::to_string(rank) + ": sizes timed", last_ratio);
    return check.status();
}

}  // namespace

int main(int argc, char** argv) {
    int ranks = 4, reps = 15;
    std::size_t max_mib = 128;
    std::string base = "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--ranks") ranks = std::atoi(argv[i + 1]);
        else if (a == "--reps") reps = std::atoi(argv[i + 1]);
        else if (a == "--max-mib") max_mib = std::strtoul(argv[i + 1], nullptr, 10);
        else if (a == "--dir") base = argv[i + 1];
    }
    if (ranks < 2 || reps < 1 || max_mib < 1) {
        std::fprintf(stderr, "gloo_allreduce: --ranks must be at least 2, --reps and --max-mib at least 1\n");
        return 2;
    }
    std::string tmpl = base + "/ckpt-bench-gloo-XXXXXX";
    if (!::mkdtemp(tmpl.data()) || ::mkdir((tmpl + "/raw").c_str(), 0755) != 0) return 1;
    std::printf("%d ranks (processes) on loopback, allreduce(sum) of float32, medians of %d\n", ranks, reps);
    std::fflush(stdout);
    std::vector<pid_t> children;
    for (int r = 0; r < ranks; ++r) {  // forked before any thread exists
        const pid_t pid = ::fork();
        if (pid == 0) {
            int rc = 1;
            try {
                rc = run_rank(tmpl, r, ranks, reps, max_mib);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "rank %d: %s\n", r, e.what());
            }
            std::fflush(stdout);
            ::_exit(rc);
        }
        children.push_back(pid);
    }
    int failures = 0;
    for (pid_t pid : children) {
        int st = 0;
        ::waitpid(pid, &st, 0);
        failures += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    std::system(("rm -rf '" + tmpl + "'").c_str());
    return failures == 0 ? 0 : 1;
}
