#pragma once
// ModelCheckpoint: the seed's checkpoint callback, on the core CheckpointManager.
//
//   nn::ModelCheckpoint<ckpt::EveryEpochs, ckpt::KeepLast> cb(
//       "./lenet", "lenet", {.append_info = {"epoch_num", "step_num", ckpt::ParamDict{{"lr", 0.01}}}});
//   auto cb2 = nn::make_model_checkpoint("./lenet", "lenet", config);   // from a CheckpointConfig
//
// The directory comes first, then the prefix, as everywhere in ckpt (CheckpointManager,
// latest, resume_or_start); MindSpore's ModelCheckpoint(prefix, directory) has them the other
// way round, and a prefix with '/' in it (a directory given second) is refused.
//
// With save_on_signal and a ckpt::TerminationSignals installed, SIGTERM, SIGINT or SIGUSR1
// ends training at the end of the step in progress: that step is saved (durably), then
// train() throws ckpt::Preempted (exit with ckpt::preempted_exit_status).

#include <boost/filesystem.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "../ckpt/config.hpp"
#include "../ckpt/log.hpp"
#include "../ckpt/manager.hpp"
#include "../ckpt/preemption.hpp"
#include "callbacks.hpp"

namespace nn {

template <ckpt::SavePolicy S = ckpt::EveryEpochs, ckpt::RetentionPolicy R = ckpt::KeepLast,
          ckpt::NamingPolicy N = ckpt::MindSporeNaming, ckpt::ArchivePolicy A = ckpt::BinaryArchive,
          ckpt::CodecPolicy C = ckpt::NoCodec>
/// The seed's checkpoint callback: a CheckpointManager driven by the trainer's hooks. It saves the
/// trainer's state when its save policy says so and at the end of training, an exception save
/// when training fails (exception_save), and with save_on_signal ends training at a termination
/// signal. Directory first, then prefix.
class ModelCheckpoint {
public:
    using Manager = ckpt::CheckpointManager<S, R, N, A, C>;

    ModelCheckpoint(ckpt::PathArg directory, std::string prefix, ckpt::ManagerOptions options = {},
                    S save = S{}, R retention = R{}, N naming = N{}, C codec = C{})
        : manager_(std::move(directory), std::move(prefix), std::move(save), std::move(retention), std::move(naming),
                   std::move(options), std::move(codec)) {}

    void on_step_end(RunContext& ctx) {
        // An epoch's last step goes to the save policy after the epoch's hooks that come before
        // this one, so that its file records what an evaluation there measured: a policy that
        // saves at that step (every N steps) writes the file the epoch's end would have, with
        // the metrics (KeepBest ranks it).
        if (ctx.step == ctx.steps_per_epoch && !signalled()) {
            deferred_ = ctx.metrics;
            last_.reset();
            return;
        }
        last_ = manager_.on_step(ctx.progress(ckpt::Event::step_end), ctx.state);
        if (!signalled()) return;
        // preempted: this step is the last; save it unless the policy just did, make it durable
        if (!last_) last_ = manager_.save(ctx.progress(ckpt::Event::step_end), ctx.state);
        manager_.wait_flushed();  // and on the durable level, if there is one
        throw ckpt::Preempted("training stopped by signal " + std::to_string(ckpt::TerminationSignals::signal()) +
                                  " after global step " + std::to_string(ctx.global_step) + "; saved '" + last_->string() +
                                  "'",
                              ckpt::TerminationSignals::signal());
    }
    void on_epoch_end(RunContext& ctx) {
        save_deferred_step(ctx);
        if (auto f = manager_.on_epoch_end(ctx.progress(ckpt::Event::epoch_end), ctx.state)) last_ = f;
    }
    /// Saves the final step unless it is saved, and records that the series finished, with
    /// the epochs the run was given.
    void on_train_end(RunContext& ctx) {
        const std::string arguments = "epochs=" + std::to_string(ctx.epochs) + " steps_per_epoch=" +
                                      std::to_string(ctx.steps_per_epoch);
        if (auto f = manager_.on_train_end(ctx.progress(ckpt::Event::train_end), ctx.state, arguments)) last_ = f;
    }
    /// Writes "{prefix}-{epoch}_{step}_breakpoint.ckpt" when exception_save is on, unless the
    /// failure struck inside an optimizer update (then the state is torn and is not saved).
    void on_exception(RunContext& ctx) {
        save_deferred_step(ctx);  // an epoch-end hook before this one failed: the step is whole
        if (!manager_.options().exception_save) return;
        try {  // a preemption has saved already
            throw;
        } catch (const ckpt::Preempted&) {
            return;
        } catch (...) {
        }
        if (!ctx.consistent) {
            ckpt::detail::log(ckpt::LogLevel::warning,
                              "no breakpoint checkpoint: the failure interrupted an optimizer update at global step " +
                                  std::to_string(ctx.global_step + 1));
            return;
        }
        last_ = manager_.on_exception(ctx.progress(ckpt::Event::step_end), ctx.state);
    }

    Manager& manager() noexcept { return manager_; }
    const Manager& manager() const noexcept { return manager_; }
    /// The file the last save wrote (or is writing, with async_save).
    const std::optional<ckpt::Path>& last_saved() const noexcept { return last_; }

private:
    bool signalled() const { return manager_.options().save_on_signal && ckpt::TerminationSignals::requested(); }

    /// Offers the epoch's last step to the save policy, with the step's metrics and the epoch's.
    void save_deferred_step(RunContext& ctx) {
        if (!deferred_) return;
        ckpt::Progress p = ctx.progress(ckpt::Event::step_end);
        ckpt::Metrics metrics = std::move(*deferred_);
        deferred_.reset();
        for (auto& m : p.metrics) {
            auto same = std::find_if(metrics.begin(), metrics.end(), [&](const auto& e) { return e.first == m.first; });
            if (same != metrics.end()) same->second = m.second;
            else metrics.push_back(std::move(m));
        }
        p.metrics = std::move(metrics);
        last_ = manager_.on_step(std::move(p), ctx.state);
    }

    Manager manager_;
    std::optional<ckpt::Path> last_;
    std::optional<ckpt::Metrics> deferred_;  ///< the epoch's last step, not offered yet: its metrics
};

/// A ModelCheckpoint configured the seed's way, by a CheckpointConfig.
template <ckpt::NamingPolicy N = ckpt::MindSporeNaming, ckpt::ArchivePolicy A = ckpt::BinaryArchive>
ModelCheckpoint<ckpt::ConfiguredSave, ckpt::ConfiguredRetention, N, A, ckpt::ConfiguredCodec> make_model_checkpoint(
    ckpt::PathArg directory, std::string prefix, const ckpt::CheckpointConfig& config, N naming = {}) {
    return ModelCheckpoint<ckpt::ConfiguredSave, ckpt::ConfiguredRetention, N, A, ckpt::ConfiguredCodec>(
        std::move(directory), std::move(prefix), ckpt::detail::manager_options(config), ckpt::ConfiguredSave(config),
        ckpt::ConfiguredRetention(config), std::move(naming), ckpt::ConfiguredCodec(config));
}

}  // namespace nn
