// What the memory level costs training: the seed's data-parallel network (784-512-5120-5120-
// 512-10 with Momentum, 243 MiB of state per rank) trained on Fashion-MNIST by 2 ranks as
// threads (ThreadComm, BLAS on one thread each: the machine's two cores), data parallel, in
// one run cut into segments of K steps. Segments alternate: in one a memory checkpoint ends
// every E-th step (MemoryCheckpoint every E: the state packed into the rank's memory and a
// copy sent to its partner), in the next none; the order flips every pair (ABBA), as a VM's
// speed drifts over tens of seconds. Pairs are measured from the first one that begins
// after two saves (every block of the level allocated).
//
// The copies travel on a thread of their own while training goes on (MemoryCheckpoint's
// default), or with --foreground on the training thread at the end of the step.
//
//   memory_level [--steps K] [--pairs P] [--every E] [--foreground] [--net dp|small] [--data DIR]
// --net small: the 784-512-512-10 network of cluster_recover (2.6 MiB of state).
// Last line: memory_level every=E background=0|1 step_with/without=R pack_ms=A callback_ms=B step_ms=C
//   R   mean step time of the segments with memory checkpoints / of those without (with E
//       = 1, medians of the steps)
//   A   median time to pack the state into the rank's memory (rank 0)
//   B   median training-thread time in the callback (pack, and the exchange in the
//       foreground; in the background, waiting for the previous transfer)
//   C   median step time without
// Exit status 1 if the run did not time what it planned: at least P pairs of whole segments,
// a memory checkpoint at every E-th step of those with them (the state's step in the rank's
// memory after the callback, the partner's copy there at the segment's end), and packing no
// faster than memory.

#include <fault/fault.hpp>

#include "bench_support.hpp"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Options {
    std::int64_t steps = 4;  // per segment
    std::int64_t every = 1;
    bool background = true;
    int pairs = 6;
    bool small = false;
    std::string data = "/usr/share/datasets/fashion-mnist";
};

struct Results {
    std::vector<double> with, without, pack, save;
    int snapshots = 0;        // timed callbacks after which the rank's memory held the step
    int segments = 0;         // timed segments with memory checkpoints
    int copies_held = 0;      // of those, ends at which the partner's copy of the step was here
    double packed_bytes = 0;  // rank 0's state, packed
};

/// Whether the segment holding global step g (counted from 1) takes memory checkpoints.
bool with_memory(std::int64_t g, std::int64_t steps) {
    const std::int64_t segment = (g - 1) / steps, pair = segment / 2;
    return (segment % 2 == 0) == (pair % 2 == 0);
}

template <class Net>
void run_rank(fault::ThreadComm& comm, const Options& o, Results& out) {
    // the pairs measured, after those up to the first pair that begins after two saves
    const std::int64_t saves_per_pair = o.steps / o.every;
    const std::int64_t warm_up = 2 * o.steps * ((2 + saves_per_pair - 1) / saves_per_pair + 1);
    const std::int64_t total = 2 * o.steps * o.pairs + warm_up;
    nn::MnistDataset data(o.data, nn::Usage::train);
    data.take(static_cast<std::size_t>(total) * 32 * 2)
        .map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()})
        .map_label(nn::TypeCast(ckpt::DType::int32))
        .batch(64, true)
        .shard(2, static_cast<std::size_t>(comm.rank()));
    Net net;
    nn::Momentum inner(net.parameters(), 0.01, 0.9);
    fault::DataParallelOptimizer<nn::Momentum, fault::ThreadComm> opt(inner, comm);
    nn::Trainer<Net, decltype(opt)> trainer(net, opt, {}, comm.rank());
    fault::MemoryLevel level;
    fault::MemoryCheckpoint<fault::ThreadComm> every_step(comm, level, o.every, {.background = o.background});
    struct Timed {
        const Options& o;
        fault::MemoryCheckpoint<fault::ThreadComm>& every_step;
        fault::MemoryLevel& level;
        Results& out;
        bool rank0;
        Clock::time_point last = Clock::now();
        int saves = 0;
        bool warm = false;  // from the first pair that begins after two saves (both blocks allocated)
        void on_step_end(nn::RunContext& c) {
            if (!warm && saves >= 2 && (c.global_step - 1) % (2 * o.steps) == 0) warm = true;
            const bool on = with_memory(c.global_step, o.steps);
            if (on && c.global_step % o.every == 0) {
                const auto t0 = Clock::now();
                every_step.on_step_end(c);
                // the segment's last transfer is waited for within it, not in the next one
                if (c.global_step % o.steps == 0) every_step.wait();
                ++saves;
                if (rank0 && warm) {
                    out.save.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
                    out.snapshots += level.newest_step() == c.global_step;
                    if (c.global_step % o.steps == 0) {
                        ++out.segments;
                        out.copies_held += level.copy(1, c.global_step) != nullptr;
                    }
                }
            }
            const auto now = Clock::now();
            if (rank0 && warm) (on ? out.with : out.without).push_back(std::chrono::duration<double>(now - last).count());
            last = now;
        }
    } timed{o, every_step, level, out, comm.rank() == 0};
    trainer.train(1, data, nn::callbacks(timed));
    if (comm.rank() == 0) {
        // the packing alone, on the trained state, as often as there were saves
        fault::PackedState p;
        const auto state = trainer.state_dict(data);
        for (std::size_t i = 0; i < out.save.size(); ++i) {
            const auto t0 = Clock::now();
            p.pack(state, static_cast<std::int64_t>(i));
            out.pack.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        out.packed_bytes = static_cast<double>(p.bytes());
        std::printf("state per rank: %.1f MiB packed; memory level holds %.1f MiB per rank\n",
                    static_cast<double>(p.bytes()) / (1 << 20), static_cast<double>(level.bytes()) / (1 << 20));
    }
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--foreground") o.background = false;
        else if (a == "--steps") o.steps = std::atoll(value().c_str());
        else if (a == "--pairs") o.pairs = std::atoi(value().c_str());
        else if (a == "--every") o.every = std::atoll(value().c_str());
        else if (a == "--net") o.small = value() == "small";
        else if (a == "--data") o.data = value();
        else if (a == "--help") {
            std::printf("memory_level [--steps K] [--pairs P] [--every E] [--foreground] [--net dp|small] [--data DIR]\n");
            return 0;
        } else {
            std::fprintf(stderr, "unknown option '%s'\n", a.c_str());
            return 2;
        }
    }
    if (o.steps < 1 || o.pairs < 2 || o.every < 1 || o.steps % o.every) {
        std::fprintf(stderr, "--steps must be a multiple of --every (at least 1), --pairs at least 2\n");
        return 2;
    }
    nn::set_blas_threads(1);
    std::printf("%s network, 2 ranks as threads, batch 32 per rank; %d pairs of %lld-step segments, with a memory "
                "checkpoint every %lld step(s) and without\n",
                o.small ? "784-512-512-10" : "784-512-5120-5120-512-10", o.pairs, static_cast<long long>(o.steps),
                static_cast<long long>(o.every));
    Results r;
    fault::ThreadGroup group(2, std::chrono::minutes(5));
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        if (o.small) run_rank<nn::UceNet>(comm, o, r);
        else run_rank<nn::DataParallelNet>(comm, o, r);
    });
    for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
    auto mean = [](const std::vector<double>& v) { return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); };
    const double with = o.every == 1 ? median(r.with) : mean(r.with), without = o.every == 1 ? median(r.without) : mean(r.without);
    const double pack = median(r.pack), save = median(r.save);
    std::printf("%s step: %.1f ms with a memory checkpoint (%zu steps), %.1f ms without (%zu)\n", o.every == 1 ? "median" : "mean", 1e3 * with,
                r.with.size(), 1e3 * without, r.without.size());
    std::printf("memory checkpoint on rank 0's training thread: %.1f ms (pack %.1f ms); copies sent %s\n", 1e3 * save,
                1e3 * pack, o.background ? "in the background" : "on the training thread");
    std::printf("memory_level every=%lld background=%d step_with/without=%.3f pack_ms=%.1f callback_ms=%.1f step_ms=%.1f\n",
                static_cast<long long>(o.every), o.background ? 1 : 0, with / without, 1e3 * pack, 1e3 * save,
                1e3 * without);

    bench::Checks check;
    const long long steps_timed = static_cast<long long>(r.with.size());
    check.at_least("steps timed with memory checkpoints (whole segments of P pairs)", o.pairs * o.steps, steps_timed);
    check.count("steps timed without, as many as with", steps_timed, static_cast<long long>(r.without.size()));
    check.count("memory checkpoints timed, one every E-th step with them", steps_timed / o.every,
                static_cast<long long>(r.save.size()));
    check.count("memory checkpoints after which the rank's memory held the step", steps_timed / o.every, r.snapshots);
    check.count("segments with memory checkpoints that ended with the partner's copy held", r.segments, r.copies_held);
    check.rate("packing the state (median)", r.packed_bytes, pack);
    check.rate("memory checkpoint on the training thread, which packs the state (median)", r.packed_bytes, save);
    check.positive("step time without", without);
    return check.status();
}
