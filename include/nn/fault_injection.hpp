#pragma once
// Faults on purpose, for tests (yours too): callbacks that throw InjectedFault at a chosen
// point, once, on one rank or on all. Relative to the optimizer update of global step s:
//   FailBeforeUpdate(s)   gradients computed and averaged, parameters unchanged
//   FailingOptimizer      inside the update: the step is applied, then the throw (a torn state)
//   FailAtStep(s)         after the update
//
//   nn::FailAtEpochEnd crash(6);                 // the seed's "Some errors happen." after epoch 6
//   CHECK_THROWS_AS(trainer.train(10, data, nn::callbacks(ckpt_cb, crash)), nn::InjectedFault);

#include <concepts>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../ckpt/param_dict.hpp"
#include "callbacks.hpp"

namespace nn {

/// The failure the fault-injection callbacks throw (FailAtStep, FailAtEpochEnd, FailBeforeUpdate,
/// FailingOptimizer): rank() is the rank it struck, global_step() the step.
class InjectedFault : public std::runtime_error {
public:
    InjectedFault(const std::string& what, int rank, std::int64_t global_step)
        : std::runtime_error(what), rank_(rank), global_step_(global_step) {}
    int rank() const noexcept { return rank_; }
    std::int64_t global_step() const noexcept { return global_step_; }

private:
    int rank_;
    std::int64_t global_step_;
};

/// Throws at the end of epoch `epoch` (after the callbacks before it in the list ran).
class FailAtEpochEnd {
public:
    explicit FailAtEpochEnd(std::int64_t epoch, int rank = -1) : epoch_(epoch), rank_(rank) {}
    void on_epoch_end(RunContext& ctx) {
        if (fired_ || ctx.epoch != epoch_ || (rank_ >= 0 && ctx.rank != rank_)) return;
        fired_ = true;
        throw InjectedFault("injected fault at the end of epoch " + std::to_string(epoch_) + " on rank " +
                                std::to_string(ctx.rank),
                            ctx.rank, ctx.global_step);
    }
    bool fired() const noexcept { return fired_; }

private:
    std::int64_t epoch_;
    int rank_;
    bool fired_ = false;
};

/// Throws in global step `global_step` (counted from 1) after its gradients are computed
/// (and, data parallel, averaged over the ranks) and before its update.
class FailBeforeUpdate {
public:
    explicit FailBeforeUpdate(std::int64_t global_step, int rank = -1) : step_(global_step), rank_(rank) {}
    void on_before_update(RunContext& ctx) {
        if (fired_ || ctx.global_step + 1 != step_ || (rank_ >= 0 && ctx.rank != rank_)) return;
        fired_ = true;
        throw InjectedFault("injected fault before the update of global step " + std::to_string(step_) + " on rank " +
                                std::to_string(ctx.rank),
                            ctx.rank, step_);
    }
    bool fired() const noexcept { return fired_; }

private:
    std::int64_t step_;
    int rank_;
    bool fired_ = false;
};

/// An optimizer that fails inside the update of global step `global_step` when `armed`: it
/// applies the update, then throws, so the trainer sees a failure with the state marked
/// torn. Wraps any optimizer; `rank` only names the rank in the message.
template <class Opt>
class FailingOptimizer {
public:
    FailingOptimizer(Opt& inner, std::int64_t global_step, int rank = 0, bool armed = true)
        : inner_(inner), step_(global_step), rank_(rank), armed_(armed) {}
    void step() {
        inner_.step();
        if (++done_ == step_ && armed_) {
            torn_ = true;
            throw InjectedFault("injected fault inside the update of global step " + std::to_string(step_) +
                                    " on rank " + std::to_string(rank_),
                                rank_, step_);
        }
    }
    /// False after the injected failure (a torn update); otherwise the inner optimizer's
    /// word, for one that undoes a failed update.
    bool consistent() const
        requires requires(const Opt& o) { { o.consistent() } -> std::convertible_to<bool>; }
    {
        return !torn_ && inner_.consistent();
    }
    void synchronize_gradients()
        requires requires(Opt& o) { o.synchronize_gradients(); }
    {
        inner_.synchronize_gradients();
    }
    ckpt::ParamDict state_dict() { return inner_.state_dict(); }
    ckpt::ParamDict hyperparameters() const { return inner_.hyperparameters(); }
    void check_checkpoint(const ckpt::ParamDict& dict, const std::string& where) const
        requires requires(const Opt& o, const ckpt::ParamDict& d, const std::string& w) { o.check_checkpoint(d, w); }
    {
        inner_.check_checkpoint(dict, where);
    }
    decltype(auto) parameters() const { return inner_.parameters(); }
    /// Counts `n` steps as done, after a resume at global step n.
    void set_completed_steps(std::int64_t n) { done_ = n; }

private:
    Opt& inner_;
    std::int64_t step_;
    int rank_;
    bool armed_;
    bool torn_ = false;
    std::int64_t done_ = 0;
};

/// Throws at the end of global step `global_step` (counted from 1), after its update.
class FailAtStep {
public:
    explicit FailAtStep(std::int64_t global_step, int rank = -1) : step_(global_step), rank_(rank) {}
    void on_step_end(RunContext& ctx) {
        if (fired_ || ctx.global_step != step_ || (rank_ >= 0 && ctx.rank != rank_)) return;
        fired_ = true;
        throw InjectedFault("injected fault at global step " + std::to_string(step_) + " on rank " +
                                std::to_string(ctx.rank),
                            ctx.rank, ctx.global_step);
    }
    bool fired() const noexcept { return fired_; }

private:
    std::int64_t step_;
    int rank_;
    bool fired_ = false;
};

}  // namespace nn
