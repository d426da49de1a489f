// GlooComm::allreduce against Gloo's own allreduce on the same buffers, the same processes
// and the same connections' kind: R ranks (processes forked from this one) on loopback,
// meeting through a file store. For each size the two run alternately, several times; the
// ratio is of bandwidths (GlooComm over raw Gloo), from the medians.
//
//   gloo_allreduce [--ranks R] [--reps N] [--dir DIR]
// Last line: gloo_allreduce bandwidth GlooComm/raw=X (the largest size)

#include <fault/gloo_comm.hpp>
#include <gloo/rendezvous/file_store.h>

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
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int run_rank(const std::string& store_dir, int rank, int ranks, int reps) {
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
    for (const std::size_t floats : {std::size_t(1) << 16, std::size_t(1) << 20, std::size_t(1) << 23, std::size_t(1) << 25}) {
        std::vector<float> buf(floats, 1.0f);
        std::vector<double> raw_s, comm_s;
        auto raw_allreduce = [&] {
            comm.barrier();
            const auto t = Clock::now();
            gloo::AllreduceOptions o(ctx);
            o.setOutput(buf.data(), buf.size());
            o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
            gloo::allreduce(o);
            return std::chrono::duration<double>(Clock::now() - t).count();
        };
        auto comm_allreduce = [&] {
            comm.barrier();
            const auto t = Clock::now();
            comm.allreduce(buf, fault::ReduceOp::sum);
            return std::chrono::duration<double>(Clock::now() - t).count();
        };
        for (int i = 0; i < reps + 1; ++i) {  // the first of each is a warm-up; who goes first alternates
            double raw = 0, mine = 0;
            if (i % 2 == 0) raw = raw_allreduce(), mine = comm_allreduce();
            else mine = comm_allreduce(), raw = raw_allreduce();
            std::fill(buf.begin(), buf.end(), 1.0f);  // keep the values finite
            if (i > 0) raw_s.push_back(raw), comm_s.push_back(mine);
        }
        // rank 0's medians speak for all: every rank waits for the slowest in each call
        const double mib = static_cast<double>(floats * sizeof(float)) / (1 << 20);
        last_ratio = median(raw_s) / median(comm_s);
        if (rank == 0)
            std::printf("%8.2f MiB: raw Gloo %8.2f ms (%7.1f MiB/s), GlooComm %8.2f ms (%7.1f MiB/s), ratio %.3f\n", mib,
                        1e3 * median(raw_s), mib / median(raw_s), 1e3 * median(comm_s), mib / median(comm_s), last_ratio);
        std::fflush(stdout);
    }
    if (rank == 0) std::printf("gloo_allreduce bandwidth GlooComm/raw=%.3f\n", last_ratio);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    int ranks = 4, reps = 15;
    std::string base = "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--ranks") ranks = std::atoi(argv[i + 1]);
        else if (a == "--reps") reps = std::atoi(argv[i + 1]);
        else if (a == "--dir") base = argv[i + 1];
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
                rc = run_rank(tmpl, r, ranks, reps);
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
