// What async checkpointing costs training: the seed's data-parallel network (784-512-5120-
// 5120-512-10, about 128 MiB of float32 parameters, as much again in Momentum state) trained
// on Fashion-MNIST, one process, BLAS on one thread, in a single training run cut into
// segments of K steps. Segments alternate: one starts with an async save of the whole state
// (ModelCheckpoint, EverySteps{2K}), the next has none. A VM's speed drifts by several
// percent over tens of seconds, so alternating segments of a few seconds is what makes a
// figure of 1-2 % measurable. The save's training-thread stall is set against a memcpy of
// the same state into a reused buffer, timed between segments (and left out of them).
//
// OpenBLAS starts its threads when it is loaded, and idle ones spin on the core the writer
// thread needs: the bench runs itself again with OPENBLAS_NUM_THREADS=1 unless it is set.
//
//   async_ckpt [--every K] [--pairs P] [--dir DIR] [--data DIR]
// Last line: async_ckpt slowdown=X stall/memcpy=Y
//   slowdown     time of the segments with a save / time of those without - 1: the cost of
//                saving every K steps
//   stall/memcpy median training-thread time of a save (ModelCheckpoint's whole step-end
//                call) / median memcpy of the state
// The first pair of segments (the save that allocates the snapshot buffer) is a warm-up and
// reported on its own. Exit status 1 if a save had to wait (persisting must take less than K
// steps) or the writer was still busy when a segment without a save began.

#include <nn/nn.hpp>

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
// save that allocates the snapshot buffer); from segment 4 on, even ones hold a save.
struct Segments {
    Checkpoint& cb;
    std::int64_t every;
    const ckpt::ParamDict& state;
    ckpt::ParamDict& copy_target;
    std::vector<double> with_save, without, stalls, copies;
    double first_stall = 0;
    int writer_busy = 0;  // segments without a save that began while the writer still wrote
    Clock::time_point start = Clock::now();

    void on_step_end(nn::RunContext& ctx) {
        const std::int64_t step = ctx.global_step;
        if (step % every == 0) {  // close the segment that ends here, time a memcpy, open the next
            const std::int64_t closed = step / every - 1;
            if (closed >= 4) (closed % 2 == 0 ? with_save : without).push_back(seconds_since(start));
            const auto stats = cb.manager().async_stats();
            if ((closed + 1) % 2 == 1 && stats.written != stats.saves) ++writer_busy;
            copies.push_back(memcpy_seconds(state, copy_target));
            start = Clock::now();
        }
        const auto saves = cb.manager().async_stats().saves;
        const auto t = Clock::now();
        cb.on_step_end(ctx);
        const double s = seconds_since(t);
        if (cb.manager().async_stats().saves != saves) {
            if (saves == 0) first_stall = s;
            else stalls.push_back(s);
        }
    }
    void on_train_end(nn::RunContext& ctx) { cb.on_train_end(ctx); }
};

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
    fs::path dir = fs::temp_directory_path() / "ckpt_async_bench";
    fs::path data_dir = "/usr/share/datasets/fashion-mnist";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--every") every = std::atoll(argv[i + 1]);
        else if (a == "--pairs") pairs = std::atoi(argv[i + 1]);
        else if (a == "--dir") dir = argv[i + 1];
        else if (a == "--data") data_dir = argv[i + 1];
        else {
            std::fprintf(stderr, "unknown option '%s'\n", a.c_str());
            return 2;
        }
    }
    nn::set_blas_threads(1);
    fs::remove_all(dir);
    nn::MnistDataset data(data_dir, nn::Usage::train);
    data.take(static_cast<std::size_t>(2 * every) * 32).map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()}).batch(32, true);

    nn::DataParallelNet net;
    nn::Momentum opt(net.parameters(), 0.01, 0.9);
    nn::Trainer<nn::DataParallelNet, nn::Momentum> trainer(net, opt);
    ckpt::ManagerOptions options;
    options.async_save = true;
    Checkpoint cb(dir, "async", options, ckpt::EverySteps{2 * every}, ckpt::KeepLast{2});

    ckpt::ParamDict state = net.state_dict();
    for (auto& [name, value] : opt.state_dict()) state.set(name, value);
    ckpt::ParamDict copy_target = ckpt::detail::snapshot(state);
    double state_mib = 0;
    for (const auto& e : state)
        if (const auto* t = e.value.get_if<ckpt::Tensor>()) state_mib += static_cast<double>(t->nbytes()) / (1 << 20);
    std::printf("DataParallelNet + Momentum: %.1f MiB of state; batch 32; %d pairs of %lld-step segments, with and "
                "without an async save\n",
                state_mib, pairs, static_cast<long long>(every));

    Segments segments{cb, every, state, copy_target};
    trainer.train(2 + pairs, data, nn::callbacks(segments));  // each epoch is two segments

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
    return stats.waited || segments.writer_busy ? 1 : 0;
}
