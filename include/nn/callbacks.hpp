#pragma once
// What callbacks see and the monitors the seed uses.
//
// A callback is any object with some of these members (each optional):
//   on_train_begin(RunContext&)  on_epoch_begin(RunContext&)  on_step_begin(RunContext&)
//   on_before_update(RunContext&)  // gradients computed (and averaged), parameters not yet changed
//   on_step_end(RunContext&)     on_epoch_end(RunContext&)    on_train_end(RunContext&)
//   on_exception(RunContext&)    // the loop failed; the exception is rethrown afterwards
//   StepRecovery on_step_failed(RunContext&)
//       a step threw (the exception is current): repair the state in place and return redo
//       (run the step again) or done (the step's result was restored), else none. The
//       strongest answer of all callbacks wins; with none, the loop fails as usual.
// Pass several with nn::callbacks(a, b, …); they run in that order at every hook.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <tuple>

#include "../ckpt/param_dict.hpp"
#include "../ckpt/progress.hpp"

namespace nn {

/// What on_step_failed did about a failed step.
enum class StepRecovery { none, redo, done };

/// The loop's position and state, handed to every hook (the seed's run_context).
struct RunContext {
    std::int64_t epoch = 0;            ///< current epoch, counted from 1
    std::int64_t epochs = 0;           ///< the last epoch this train() call runs
    std::int64_t step = 0;             ///< steps completed in the current epoch
    std::int64_t steps_per_epoch = 0;
    std::int64_t global_step = 0;      ///< steps completed since training began
    int rank = 0;                      ///< data-parallel rank (0 when training alone)
    float loss = 0.0f;                 ///< loss of the last step
    /// False while an optimizer update is partly applied: the state is then not a state any
    /// step produced, and no checkpoint may be taken of it.
    bool consistent = true;
    bool stop_requested = false;       ///< set by a callback to end training after this step
    /// What callbacks measured of the state at this hook ("val_loss", "accuracy"): a checkpoint
    /// a later callback of the same hook saves records them (ckpt::KeepBest ranks by them),
    /// so list an evaluating callback before nn::ModelCheckpoint. The trainer clears them
    /// after each step's and each epoch's hooks: they never describe a later state.
    ckpt::Metrics metrics;
    std::function<ckpt::ParamDict()> state;  ///< everything a checkpoint holds, as views

    ckpt::Progress progress(ckpt::Event event) const {
        ckpt::Progress p;
        p.epoch = epoch;
        p.step = step;
        p.global_step = global_step;
        p.event = event;
        p.rank = rank;
        p.metrics = metrics;
        return p;
    }
};

/// nn::callbacks(a, b): the callbacks, by reference, in the order they run.
template <class... Cbs>
std::tuple<Cbs&...> callbacks(Cbs&... cbs) {
    return std::tuple<Cbs&...>(cbs...);
}

namespace detail {
#define NN_DEFINE_HOOK(hook)                                                  \
    template <class Cb>                                                       \
    void hook(Cb& cb, RunContext& ctx) {                                      \
        if constexpr (requires { cb.hook(ctx); }) cb.hook(ctx);               \
    }
NN_DEFINE_HOOK(on_train_begin)
NN_DEFINE_HOOK(on_epoch_begin)
NN_DEFINE_HOOK(on_step_begin)
NN_DEFINE_HOOK(on_before_update)
NN_DEFINE_HOOK(on_step_end)
NN_DEFINE_HOOK(on_epoch_end)
NN_DEFINE_HOOK(on_train_end)
NN_DEFINE_HOOK(on_exception)
#undef NN_DEFINE_HOOK
template <class Cb>
StepRecovery on_step_failed(Cb& cb, RunContext& ctx) {
    if constexpr (requires { cb.on_step_failed(ctx); }) return cb.on_step_failed(ctx);
    else return StepRecovery::none;
}
}  // namespace detail

/// Prints the loss every `per_print_times` steps, as the seed does:
/// "epoch: 1 step: 1875, loss is 0.4370".
class LossMonitor {
public:
    explicit LossMonitor(std::int64_t per_print_times = 1, std::ostream& out = std::cout)
        : every_(per_print_times), out_(&out) {}
    void on_step_end(RunContext& ctx) {
        if (every_ > 0 && ctx.step % every_ == 0) {
            char loss[32];
            std::snprintf(loss, sizeof loss, "%.4f", static_cast<double>(ctx.loss));
            *out_ << "epoch: " << ctx.epoch << " step: " << ctx.step << ", loss is " << loss << "\n";
        }
    }

private:
    std::int64_t every_;
    std::ostream* out_;
};

/// Prints each epoch's time, as the seed does: "epoch time: 812.3 ms, per step time: 0.433 ms".
class TimeMonitor {
public:
    explicit TimeMonitor(std::ostream& out = std::cout) : out_(&out) {}
    void on_epoch_begin(RunContext& ctx) {
        start_ = std::chrono::steady_clock::now();
        first_step_ = ctx.step;
    }
    void on_epoch_end(RunContext& ctx) {
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
        const auto steps = std::max<std::int64_t>(ctx.step - first_step_, 1);
        char line[96];
        std::snprintf(line, sizeof line, "epoch time: %.1f ms, per step time: %.3f ms", ms, ms / static_cast<double>(steps));
        *out_ << line << "\n";
    }

private:
    std::ostream* out_;
    std::chrono::steady_clock::time_point start_;
    std::int64_t first_step_ = 0;
};

}  // namespace nn
