#pragma once
// What the training examples print when they resume.

#include <nn/trainer.hpp>

#include <cstdint>
#include <string>

namespace examples {

/// "resuming from FILE: saved at epoch E, step S of N (global step G); training goes on at
/// epoch E', step S'" — or, when the checkpoint ends training, "…; nothing left to train".
/// Epochs and steps count from 1, as the checkpoint names do.
inline std::string resume_message(const nn::ResumePoint& rp, std::int64_t steps_per_epoch, std::int64_t epochs) {
    const bool mid_epoch = rp.initial_step > 0;
    const std::int64_t epoch = mid_epoch ? rp.initial_epoch + 1 : rp.initial_epoch;
    const std::int64_t step = mid_epoch ? rp.initial_step : steps_per_epoch;
    std::string m = "resuming from " + (rp.file ? rp.file->string() : std::string("?")) + ": saved at epoch " +
                    std::to_string(epoch) + ", step " + std::to_string(step) + " of " + std::to_string(steps_per_epoch) +
                    " (global step " + std::to_string(rp.global_step) + "); ";
    if (rp.initial_epoch >= epochs) return m + "nothing left to train (epochs: " + std::to_string(epochs) + ")";
    return m + "training goes on at epoch " + std::to_string(rp.initial_epoch + 1) + ", step " +
           std::to_string(rp.initial_step + 1);
}

}  // namespace examples
