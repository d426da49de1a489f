#pragma once
// Faults on purpose, for tests (yours too): callbacks that throw InjectedFault at a chosen
// point, once, on one rank or on all.
//
//   nn::FailAtEpochEnd crash(6);                 // the seed's "Some errors happen." after epoch 6
//   CHECK_THROWS_AS(trainer.train(10, data, nn::callbacks(ckpt_cb, crash)), nn::InjectedFault);

#include <cstdint>
#include <stdexcept>
#include <string>

#include "callbacks.hpp"

namespace nn {

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
