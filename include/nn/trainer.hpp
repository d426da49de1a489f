#pragma once
// Trainer<Net, Opt, Data>: the seed's Model.train loop, with callbacks, evaluation and exact
// resume.
//
//   nn::LeNet5 net;
//   nn::Momentum opt(net.parameters(), 0.01, 0.9);
//   nn::Trainer trainer(net, opt);
//   nn::ModelCheckpoint<ckpt::EveryEpochs, ckpt::KeepLast> ckpt_cb("./lenet", "lenet");
//   auto from = trainer.resume_or_start("./lenet", "lenet", data);   // latest valid, or fresh
//   trainer.train(10, data, nn::callbacks(ckpt_cb), from.initial_epoch);
//
// A checkpoint taken by the trainer holds the parameters, the optimizer state and
// hyperparameters, the position (trainer.epoch, trainer.step, trainer.global_step) and the
// data order (data.shuffle, data.seed, data.steps_per_epoch). Resuming from it replays the
// remaining steps exactly: the final parameters equal those of a run that never stopped.

#include <boost/filesystem.hpp>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../ckpt/checkpoint.hpp"
#include "../ckpt/latest.hpp"
#include "../ckpt/series.hpp"
#include "../ckpt/log.hpp"
#include "../ckpt/policies/naming.hpp"
#include "callbacks.hpp"
#include "core.hpp"
#include "data.hpp"
#include "loss.hpp"
#include "models.hpp"
#include "optim.hpp"

namespace nn {

/// What the Trainer steps: step() applies the gradients, state_dict() holds its state (views,
/// saved with the parameters) and hyperparameters() its settings (saved as values). Momentum,
/// SGD and fault::DataParallelOptimizer model it.
template <class O>
concept Optimizer = requires(O& o, const O& co) {
    o.step();
    { o.state_dict() } -> std::same_as<ckpt::ParamDict>;
    { co.hyperparameters() } -> std::same_as<ckpt::ParamDict>;
};

namespace detail {
template <class T>
inline constexpr bool is_tuple = false;
template <class... Ts>
inline constexpr bool is_tuple<std::tuple<Ts...>> = true;
}  // namespace detail

/// Where a resumed run starts: train(epochs, data, callbacks, initial_epoch) continues with
/// step `initial_step` of epoch initial_epoch + 1 (already set on the data set).
struct ResumePoint {
    std::optional<ckpt::Path> file;  ///< the checkpoint loaded; empty for a fresh start
    std::int64_t initial_epoch = 0;
    std::int64_t initial_step = 0;
    std::int64_t global_step = 0;
    ckpt::ParamDict rest;  ///< the checkpoint's other values (epoch_num, lr, …)
    /// Set when `file` is the final checkpoint of a series that finished: a run given as many
    /// epochs has nothing left to train, one given more goes on.
    std::optional<ckpt::FinishedRecord> finished;
};

/// The training loop (the seed's Model.train): train() runs epochs of the data through the
/// network, the loss and the optimizer, calling the callbacks at every hook; evaluate() scores a
/// data set; resume_from() and resume_or_start() restore a checkpoint of it exactly (parameters,
/// optimizer state, position and data order). `rank` is the data-parallel rank it reports.
template <Network Net, Optimizer Opt, class Data = MnistDataset, class Loss = SoftmaxCrossEntropyWithLogits>
class Trainer {
public:
    Trainer(Net& net, Opt& opt, Loss loss = Loss{}, int rank = 0)
        : net_(net), opt_(opt), loss_(std::move(loss)), rank_(rank) {}

    Net& network() noexcept { return net_; }
    Opt& optimizer() noexcept { return opt_; }

    /// Trains epochs initial_epoch + 1 … epochs (the seed's Model.train), starting the first
    /// of them at the data set's init step. `cbs` is one callback or nn::callbacks(a, b, …).
    /// On an exception, every callback's on_exception runs (ModelCheckpoint writes the
    /// breakpoint file), then the exception propagates. A run resumed at or past the end
    /// (a finished job run again) trains nothing and says so; its callbacks see the train's
    /// beginning and end at the position resumed from (ModelCheckpoint saves nothing there).
    template <class Cbs = std::tuple<>>
    void train(std::int64_t epochs, Data& data, Cbs&& cbs = {}, std::int64_t initial_epoch = 0) {
        if (epochs < 1 || initial_epoch < 0)
            throw ckpt::ConfigError("train(" + std::to_string(epochs) + " epochs, initial_epoch " +
                                    std::to_string(initial_epoch) +
                                    "): epochs is the last epoch to train, counted from 1, and initial_epoch the "
                                    "epochs done, at least 0");
        const std::int64_t steps = data.steps_per_epoch();
        if (steps < 1) throw DataError("the data set yields no batch (size " + std::to_string(data.size()) + ")");
        check_input(data);
        const std::int64_t init_step = data.take_init_step();

        RunContext ctx;
        ctx.epochs = epochs;
        ctx.steps_per_epoch = steps;
        ctx.rank = rank_;
        ctx.global_step = initial_epoch * steps + init_step;
        if (initial_epoch >= epochs) {  // where the resumed checkpoint stands
            ctx.epoch = init_step ? initial_epoch + 1 : initial_epoch;
            ctx.step = init_step ? init_step : steps;
            ckpt::detail::log(ckpt::LogLevel::notice,
                              "nothing left to train: epoch " + std::to_string(ctx.epoch) + ", step " +
                                  std::to_string(ctx.step) + " is done, and this run trains " +
                                  std::to_string(epochs) + " epoch(s)");
        }
        ctx.state = [this, &data, &ctx] {
            ckpt::ParamDict d = state_dict(data);
            d.set("trainer.epoch", ctx.epoch);
            d.set("trainer.step", ctx.step);
            d.set("trainer.global_step", ctx.global_step);
            return d;
        };
        auto each = [&](auto hook) {
            if constexpr (detail::is_tuple<std::remove_cvref_t<Cbs>>) std::apply([&](auto&... cb) { (hook(cb, ctx), ...); }, cbs);
            else hook(cbs, ctx);
        };
        try {
            each([](auto& cb, RunContext& c) { detail::on_train_begin(cb, c); });
            for (std::int64_t epoch = initial_epoch + 1; epoch <= epochs && !ctx.stop_requested; ++epoch) {
                ctx.epoch = epoch;
                ctx.step = epoch == initial_epoch + 1 ? init_step : 0;
                each([](auto& cb, RunContext& c) { detail::on_epoch_begin(cb, c); });
                for (std::int64_t s = ctx.step; s < steps && !ctx.stop_requested; ++s) {
                    for (int attempt = 1;; ++attempt) {
                        try {
                            each([](auto& cb, RunContext& c) { detail::on_step_begin(cb, c); });
                            data.load_batch(epoch, s, batch_);
                            ctx.loss = train_step(ctx, [&] {
                                each([](auto& cb, RunContext& c) { detail::on_before_update(cb, c); });
                            });
                            break;
                        } catch (...) {
                            // a callback may repair the state in place (UCE repair) and have
                            // the step redone, or restore the step's result from a replica
                            StepRecovery recovery = StepRecovery::none;
                            each([&](auto& cb, RunContext& c) {
                                recovery = std::max(recovery, detail::on_step_failed(cb, c));
                            });
                            if (recovery == StepRecovery::none || attempt >= max_step_attempts) throw;
                            ctx.consistent = true;
                            if (recovery == StepRecovery::done) break;
                        }
                    }
                    ctx.step = s + 1;
                    ++ctx.global_step;
                    each([](auto& cb, RunContext& c) { detail::on_step_end(cb, c); });
                    ctx.metrics.clear();
                }
                each([](auto& cb, RunContext& c) { detail::on_epoch_end(cb, c); });
                ctx.metrics.clear();
            }
            each([](auto& cb, RunContext& c) { detail::on_train_end(cb, c); });
        } catch (...) {
            each([](auto& cb, RunContext& c) {
                try {
                    detail::on_exception(cb, c);
                } catch (const std::exception& e) {  // the original error is the one to report
                    ckpt::detail::log(ckpt::LogLevel::warning, std::string("on_exception failed: ") + e.what());
                }
            });
            throw;
        }
    }

    /// Fraction of the data set's samples whose largest logit is their label.
    double evaluate(const Data& data) {
        check_input(data);
        std::size_t correct = 0, total = 0;
        Batch b;
        for (std::int64_t s = 0; s < data.steps_per_epoch(); ++s) {
            data.load_batch(1, s, b);
            const Array& logits = net_.forward(b.images);
            const std::size_t classes = logits.shape()[1];
            for (std::size_t i = 0; i < b.labels.size(); ++i) {
                const float* row = logits.data() + i * classes;
                const auto best = static_cast<std::int32_t>(std::max_element(row, row + classes) - row);
                correct += best == b.labels[i];
            }
            total += b.labels.size();
        }
        return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
    }

    /// The parameters, optimizer state and hyperparameters and the data order (tensors as
    /// views of the live state). Checkpoints taken in train() add the position.
    ckpt::ParamDict state_dict(const Data& data) {
        ckpt::ParamDict d = load_target();
        for (const auto& [name, value] : opt_.hyperparameters()) d.set(name, value);
        for (const auto& [name, value] : data.state()) d.set(name, value);
        return d;
    }

    /// The tensors a checkpoint is loaded into: the network's and the optimizer's.
    ckpt::ParamDict load_target() {
        ckpt::ParamDict d = net_.state_dict();
        for (auto& [name, value] : opt_.state_dict()) d.set(name, std::move(value));
        return d;
    }

    /// Loads `file` (strictly: every parameter and optimizer tensor must be there, with its
    /// shape) and positions the trainer and `data` at the step after it. Nothing in memory
    /// changes when the file does not fit. `opts.key` opens an encrypted file.
    ResumePoint resume_from(const ckpt::PathArg& file, Data& data, const ckpt::LoadOptions& opts = {}) {
        const ckpt::ParamDict dict = ckpt::load_checkpoint(file, opts);
        ResumePoint rp;
        try {
            rp = resume_from_state(dict, "checkpoint '" + file.string() + "'", data);
        } catch (const ckpt::LoadMismatch& e) {
            // one rank's share of a step cannot fit a whole state: say what the file is (its
            // table only is read again)
            if (const auto share = ckpt::detail::share_in(ckpt::read_contents(file, opts).entries))
                throw ckpt::LoadMismatch(std::string(e.what()) + ". The file is " + *share);
            throw;
        }
        rp.file = file;
        return rp;
    }

    /// As resume_from, from a state already in memory (a checkpoint's entries: the memory
    /// level's snapshot, say); `where` names it in errors.
    ResumePoint resume_from_state(const ckpt::ParamDict& dict, const std::string& where, Data& data) {
        ResumePoint rp;
        if (dict.contains("trainer.epoch")) {
            const auto epoch = dict.get<std::int64_t>("trainer.epoch");
            const auto step = dict.get<std::int64_t>("trainer.step");
            rp.global_step = dict.get<std::int64_t>("trainer.global_step");
            const std::int64_t steps = data.steps_per_epoch();
            if (epoch < 1 || step < 0 || step > steps)
                throw ckpt::LoadMismatch(where + " is at epoch " + std::to_string(epoch) + " step " +
                                         std::to_string(step) + ", outside an epoch of " + std::to_string(steps) + " steps");
            rp.initial_epoch = step == steps ? epoch : epoch - 1;
            rp.initial_step = step == steps ? 0 : step;
        } else if (dict.contains("epoch_num")) {  // a checkpoint with only the seed's append_info
            rp.initial_epoch = dict.get<std::int64_t>("epoch_num");
            rp.global_step = rp.initial_epoch * data.steps_per_epoch();
        } else {
            throw ckpt::LoadMismatch(where + " holds no position (trainer.epoch or epoch_num): cannot resume from it");
        }
        // an optimizer keeping a piece of the state (sharded) checks it is this rank's piece
        if constexpr (requires { opt_.check_checkpoint(dict, where); }) opt_.check_checkpoint(dict, where);
        ckpt::ParamDict target = load_target();
        try {
            data.load_state(dict);  // validates steps per epoch before anything is loaded
            rp.rest = ckpt::load_param_into_net(target, dict, /*strict=*/true).rest;
        } catch (const ckpt::LoadMismatch& e) {
            throw ckpt::LoadMismatch(where + " does not fit: " + e.what());
        }
        if (rp.initial_step) data.set_init_step(rp.initial_step);
        return rp;
    }

    /// Resumes from the newest valid checkpoint of `prefix` in `dir` (damaged files are
    /// skipped, with a warning), or starts fresh when there is none, saying so. Checkpoints
    /// that exist but cannot be used (a newer format version; none that verifies) end it with
    /// ckpt::UnreadableCheckpoints unless `on_unreadable` is OnUnreadable::fall_back. Without a
    /// naming it finds MindSporeNaming's and StepNaming's names; `opts.key` opens encrypted
    /// files.
    /// @throws ckpt::ConfigError `prefix` holds '/' (the directory comes first)
    /// @throws ckpt::UnreadableCheckpoints under OnUnreadable::refuse: the newest checkpoint
    ///         cannot be read by this program, or checkpoints exist and none of them verifies
    /// @throws ckpt::LoadMismatch the checkpoint does not fit the network, optimizer or data
    ///         (nothing in memory changes then)
    /// @throws ckpt::KeyError the checkpoint is encrypted and `opts.key` is not its key
    template <ckpt::NamingPolicy N = ckpt::detail::AnyRunNaming>
    ResumePoint resume_or_start(const ckpt::PathArg& dir, std::string_view prefix, Data& data, const N& naming = {},
                                const ckpt::LoadOptions& opts = {},
                                ckpt::OnUnreadable on_unreadable = ckpt::OnUnreadable::refuse) {
        if (prefix.find('/') != std::string_view::npos)
            throw ckpt::ConfigError("resume_or_start: prefix '" + std::string(prefix) +
                                    "' holds '/': the directory comes first, then the prefix");
        if (!boost::filesystem::is_directory(dir)) {
            ckpt::detail::log(ckpt::LogLevel::notice, "no checkpoint directory '" + dir.string() +
                                                          "': starting from the beginning");
            return {};
        }
        if (auto latest = ckpt::latest_checkpoint(dir, prefix, naming, nullptr, opts, on_unreadable)) {
            ResumePoint rp = resume_from(latest->path, data, opts);
            if (auto record = ckpt::read_finished(dir, prefix);
                record && dir / record->file == latest->path && record->body_hash == latest->header.body_hash) {
                ckpt::detail::log(ckpt::LogLevel::notice, "resuming from '" + latest->path.string() + "': prefix '" +
                                                              std::string(prefix) + "' in '" + dir.string() + "' " +
                                                              ckpt::detail::finished_text(*record));
                rp.finished = std::move(record);
            }
            return rp;
        }
        ckpt::detail::log(ckpt::LogLevel::notice, "no checkpoint of prefix '" + std::string(prefix) + "' in '" +
                                                      dir.string() + "': starting from the beginning");
        return {};
    }
    /// The same, with the default naming and `opts` (the key of encrypted files).
    ResumePoint resume_or_start(const ckpt::PathArg& dir, std::string_view prefix, Data& data,
                                const ckpt::LoadOptions& opts) {
        return resume_or_start(dir, prefix, data, ckpt::detail::AnyRunNaming{}, opts);
    }

    /// Resumes from what `checkpoints` (a ModelCheckpoint) writes: its directory, prefix and
    /// naming, and its codec's key for encrypted files; or starts fresh, saying so.
    template <class Checkpoints>
        requires requires(const Checkpoints& c) { c.manager().load_options(); }
    ResumePoint resume_or_start(const Checkpoints& checkpoints, Data& data) {
        const auto& m = checkpoints.manager();
        using Naming = typename std::remove_cvref_t<decltype(m)>::naming_policy;
        return resume_or_start(m.directory(), m.prefix(), data, Naming{}, m.load_options(), m.options().on_unreadable);
    }

private:
    void check_input(const Data& data) {
        if constexpr (requires { net_.input_shape(); }) {
            const auto& want = net_.input_shape();
            const auto& got = data.sample_shape();
            if (!std::equal(want.begin(), want.end(), got.begin(), got.end()))
                throw ShapeError("the network takes samples of shape " + shape_string(want) + ", the data set gives " +
                                 shape_string(got) + " (check Resize and HWC2CHW)");
        }
    }

    // One step: forward, loss, backward, gradient synchronization (data parallel), the
    // before-update hooks, then the update, during which the state is marked inconsistent.
    template <class BeforeUpdate>
    float train_step(RunContext& ctx, BeforeUpdate&& before_update) {
        const Array& logits = net_.forward(batch_.images);
        const float loss = loss_.forward(logits, std::span<const std::int32_t>(batch_.labels));
        net_.backward(loss_.backward());
        // A data-parallel optimizer averages the gradients over the ranks here; a failure
        // in it leaves the parameters as the previous step left them.
        if constexpr (requires { opt_.synchronize_gradients(); }) opt_.synchronize_gradients();
        before_update();
        ctx.consistent = false;
        try {
            opt_.step();
        } catch (...) {
            // an optimizer that undoes a failed update (a sharded one) says the state is whole
            if constexpr (requires { { opt_.consistent() } -> std::convertible_to<bool>; }) ctx.consistent = opt_.consistent();
            throw;
        }
        ctx.consistent = true;
        return loss;
    }

    static constexpr int max_step_attempts = 3;  // a step failing again after two repairs ends training

    Net& net_;
    Opt& opt_;
    Loss loss_;
    int rank_;
    Batch batch_;
};

}  // namespace nn
