// What async checkpointing costs training: the seed's data-parallel network (784-512-5120-
// 5120-512-10, about 128 MiB of float32 parameters, as much again in Momentum state) trained
// on Fashion-MNIST, one process, BLAS on one thread, in a single training run cut into
// segments of K steps. Segments alternate: one starts with an async save of the whole state
// (ModelCheckpoint, EverySteps{2K}), the next has none. A VM's speed drifts by several
// percent over tens of seconds, so alternating segments of a few seconds is what makes a
// figure of 1-2 % measurable. The save's training-thread stall is set against a memcpy of
// the same state into a reused buffer, timed between segments (and left out of them).
//
// An epoch holds 2K + 1 batches, so that no save falls on an epoch's last step: ModelCheckpoint
// offers that step to the save policy at the epoch's end, after the step-end call whose time
// is the stall (a save step 2K·j is an epoch's last only from j = 2K + 1 on, past the run for
// P < 2K).
//
// OpenBLAS starts its threads when it is loaded, and idle ones spin on the core the writer
// thread needs: the bench runs itself again with OPENBLAS_NUM_THREADS=1 unless it is set.
//
//   async_ckpt [--every K] [--pairs P] [--net dp|small] [--dir DIR] [--data DIR]
// --net small: the 784-512-512-10 network of cluster_recover (2.6 MiB of state), for a
// quick run whose figures mean nothing but whose checks apply.
// Last line: async_ckpt slowdown=X stall/memcpy=Y
//   slowdown     time of the segments with a save / time of those without - 1: the cost of
//                saving every K steps
//   stall/memcpy median training-thread time of a save (ModelCheckpoint's whole step-end
//                call) / median memcpy of the state
// The first pair of segments (the save that allocates the snapshot buffer) is a warm-up and
// reported on its own. Exit status 1 if a save had to wait (persisting must take less than K
// steps), the writer was still busy when a segment without a save began, or the run did not
// time what it planned: P segments each beginning with one save, whose step-end call it
// timed, P without one, and stalls and copies no faster than memory.

#include <nn/nn.hpp>

#include "bench_support.hpp"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = boost::filesystem;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

using Checkpoint = nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepLast>;

// A memcpy of every tensor of `state` into `into` (allocated like a snapshot buffer, and
// touched): the baseline of the stall.
double memcpy_seconds(const ckpt::ParamDict& state, ckpt::ParamDict& into) {
    const auto t = Clock::now();
    auto b = into.begin();
    for (auto s = state.begin(); s != state.end(); ++s, ++b)
        if (const auto* from = s->value.get_if<ckpt::Tensor>())
            std::memcpy(b->value.get_if<ckpt::Tensor>()->data(), from->data(), from->nbytes());
    return seconds_since(t);
}

// Times segments of `every` steps around ModelCheckpoint (EverySteps{2 * every}), so that
// every other segment begins with a save. Segments 0-3 are a warm-up (segment 2 holds the
// save that allocates the snapshot buffer); segments 4 to 4 + 2P - 1 are timed, the even ones
// with a save.
struct Segments {
    Checkpoint& cb;
    std::int64_t every;
    int pairs;
    const ckpt::ParamDict& state;
    ckpt::ParamDict& copy_target;
    std::vector<double> with_save, without, stalls, copies;
    double first_stall = 0;
    int writer_busy = 0;   // segments without a save that began while the writer still wrote
    int off_pattern = 0;   // timed segments that did not hold the one save (or none) they should
    std::int64_t open = 0, saves_at_open = 0;  // the segment in progress, and the saves before it
    Clock::time_point start = Clock::now();

    bool timed(std::int64_t segment) const { return segment >= 4 && segment < 4 + 2 * pairs; }

    void on_step_end(nn::RunContext& ctx) {
        const std::int64_t step = ctx.global_step;
        if (step % every == 0) {  // close the segment that ends here, time a memcpy, open the next
            const std::int64_t closed = step / every - 1;
            const auto stats = cb.manager().async_stats();
            if (timed(closed)) {
                (closed % 2 == 0 ? with_save : without).push_back(seconds_since(start));
                if (stats.saves - saves_at_open != (closed % 2 == 0 ? 1 : 0)) ++off_pattern;
            }
            if (closed + 1 < 4 + 2 * pairs && (closed + 1) % 2 == 1 && stats.written != stats.saves) ++writer_busy;
            if (timed(closed + 1)) copies.push_back(memcpy_seconds(state, copy_target));
            open = closed + 1;
            saves_at_open = stats.saves;
            start = Clock::now();
        }
        const auto saves = cb.manager().async_stats().saves;
        const auto t = Clock::now();
        cb.on_step_end(ctx);
        const double s = seconds_since(t);
        if (cb.manager().async_stats().saves != saves) {
            if (saves == 0) first_stall = s;
            else if (timed(open)) stalls.push_back(s);
        }
    }
    // A save the epoch's end makes is left out of the stalls: the check of their count says so.
    void on_epoch_end(nn::RunContext& ctx) { cb.on_epoch_end(ctx); }
    void on_train_end(nn::RunContext& ctx) { cb.on_train_end(ctx); }
};

template <class Net>
int run(std::int64_t every, int pairs, const fs::path& dir, const fs::path& data_dir) {
    fs::remove_all(dir);
    bench::print_machine(dir.parent_path().string());
    // epochs of 2K + 1 steps (see the top), as many as the 4 + 2P segments need
    const std::int64_t epoch_steps = 2 * every + 1, steps = (4 + 2 * static_cast<std::int64_t>(pairs)) * every;
    nn::MnistDataset data(data_dir, nn::Usage::train);
    data.take(static_cast<std::size_t>(epoch_steps) * 32).map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()}).batch(32, true);
    if (data.steps_per_epoch() != epoch_steps)
        throw std::runtime_error("the data set holds " + std::to_string(data.steps_per_epoch()) +
                                 " batches of 32, not the " + std::to_string(epoch_steps) + " an epoch needs");

    Net net;
    nn::Momentum opt(net.parameters(), 0.01, 0.9);
    nn::Trainer<Net, nn::Momentum> trainer(net, opt);
    ckpt::ManagerOptions options;
    options.async_save = true;
    Checkpoint cb(dir, "async", options, ckpt::EverySteps{2 * every}, ckpt::KeepLast{2});

    ckpt::ParamDict state = net.state_dict();
    for (auto& [name, value] : opt.state_dict()) state.set(name, value);
    ckpt::ParamDict copy_target = ckpt::detail::snapshot(state, ckpt::ObjectEncoding::boost_binary);
    double state_mib = 0;
    for (const auto& e : state)
        if (const auto* t = e.value.get_if<ckpt::Tensor>()) state_mib += static_cast<double>(t->nbytes()) / (1 << 20);
    std::printf("%s + Momentum: %.1f MiB of state; batch 32; %d pairs of %lld-step segments, with and without an "
                "async save; epochs of %lld steps\n",
                std::is_same_v<Net, nn::DataParallelNet> ? "DataParallelNet" : "784-512-512-10", state_mib, pairs,
                static_cast<long long>(every), static_cast<long long>(epoch_steps));

    Segments segments{cb, every, pairs, state, copy_target};
    trainer.train((steps + epoch_steps - 1) / epoch_steps, data, nn::callbacks(segments));

    const auto stats = cb.manager().async_stats();
    double on = 0, off = 0;
    std::vector<double> pair_ratios;
    for (std::size_t i = 0; i < segments.with_save.size() && i < segments.without.size(); ++i) {
        on += segments.with_save[i];
        off += segments.without[i];
        pair_ratios.push_back(segments.with_save[i] / segments.without[i]);
    }
    const double stall = median(segments.stalls), copy = median(segments.copies);
    std::printf("segments: %.3f s with a save, %.3f s without (medians; %zu pairs); median of the pairs' ratios - 1: "
                "%+.4f\n",
                median(segments.with_save), median(segments.without), pair_ratios.size(), median(pair_ratios) - 1);
    std::printf("saves %lld, waited %lld, skipped %lld; writer still busy at %d quiet segments\n",
                static_cast<long long>(stats.saves), static_cast<long long>(stats.waited),
                static_cast<long long>(stats.skipped), segments.writer_busy);
    std::printf("writer thread per save: %.0f ms on average, longest %.0f ms; a segment is %.0f ms\n",
                1e3 * stats.write_seconds / static_cast<double>(stats.written), 1e3 * stats.max_write_seconds,
                1e3 * median(segments.without));
    std::printf("stall per save: median %.1f ms, max %.1f ms (first save, allocating the buffer: %.0f ms); memcpy of "
                "the state: median %.1f ms (%.2f GB/s)\n",
                1e3 * stall,
                1e3 * (segments.stalls.empty() ? 0 : *std::max_element(segments.stalls.begin(), segments.stalls.end())),
                1e3 * segments.first_stall, 1e3 * copy, state_mib * (1 << 20) / copy / 1e9);
    std::printf("async_ckpt slowdown=%.4f stall/memcpy=%.2f\n", on / off - 1, stall / copy);
    fs::remove_all(dir);

    bench::Checks check;
    const double state_bytes = state_mib * (1 << 20);
    check.count("segments with a save timed", pairs, static_cast<long long>(segments.with_save.size()));
    check.count("segments without a save timed", pairs, static_cast<long long>(segments.without.size()));
    check.count("timed segments holding one save (with) or none (without)", 2 * pairs,
                2 * pairs - segments.off_pattern);
    check.count("saves whose step-end call was timed (the stall), one per segment with a save", pairs,
                static_cast<long long>(segments.stalls.size()));
    check.count("memcpy baselines timed, one per segment", 2 * pairs, static_cast<long long>(segments.copies.size()));
    check.rate("stall per save (median), which copies the state", state_bytes, stall);
    check.rate("memcpy of the state (median)", state_bytes, copy);
    check.positive("time of the segments without a save", off);
    check.at_least("saves the writer finished", pairs, stats.written);
    if (stats.waited) std::fprintf(stderr, "async_ckpt: %lld save(s) waited for the writer\n", static_cast<long long>(stats.waited));
    if (segments.writer_busy)
        std::fprintf(stderr, "async_ckpt: the writer was still busy when %d segment(s) without a save began\n",
                     segments.writer_busy);
    return check.status(stats.waited || segments.writer_busy ? 1 : 0);
}

}  // namespace

int main(int argc, char** argv) {
    if (!std::getenv("OPENBLAS_NUM_THREADS")) {
        ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
        ::execv("/proc/self/exe", argv);
        std::perror("re-running with OPENBLAS_NUM_THREADS=1");
        return 2;
    }
    std::int64_t every = 50;
    int pairs = 20;
    bool small = false;
    fs::path dir = fs::temp_directory_path() / "ckpt_async_bench";
    fs::path data_dir = "/usr/share/datasets/fashion-mnist";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--every") every = std::atoll(argv[i + 1]);
        else if (a == "--pairs") pairs = std::atoi(argv[i + 1]);
        else if (a == "--net") small = std::string(argv[i + 1]) == "small";
        else if (a == "--dir") dir = argv[i + 1];
        else if (a == "--data") data_dir = argv[i + 1];
        else {
            std::fprintf(stderr, "unknown option '%s'\n", a.c_str());
            return 2;
        }
    }
    if (every < 1 || pairs < 1 || pairs >= 2 * every) {
        // from the pair 2K on, a save's step would be an epoch's last (see the top)
        std::fprintf(stderr, "async_ckpt: --every must be at least 1, --pairs from 1 to 2 x every - 1\n");
        return 2;
    }
    nn::set_blas_threads(1);
    try {
        return small ? run<nn::UceNet>(every, pairs, dir, data_dir) : run<nn::DataParallelNet>(every, pairs, dir, data_dir);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "async_ckpt: %s\n", e.what());
        return 2;
    }
}
