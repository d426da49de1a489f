#pragma once
// Where a computation stands when a policy is asked whether to save.

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {

/// Named measurements of the state being saved ("val_loss", "accuracy"): recorded in the
/// checkpoint (KeepBest keeps the best by one, best() finds it).
using Metrics = std::vector<std::pair<std::string, double>>;

/// The moment at which the manager is called.
enum class Event { step_end, epoch_end, train_end };

/// Where the loop stands when it calls the manager (on_step, on_epoch_end, save, …): epoch, step
/// and global step, the event, the rank for per-rank names, the time for EverySeconds, and the
/// metrics to record with the file. Progress::at_iteration(i) for a loop without epochs.
struct Progress {
    std::int64_t epoch = 1;        ///< current epoch, counted from 1 (the seed's cur_epoch_num)
    std::int64_t step = 0;         ///< steps completed in this epoch, counted from 1
    std::int64_t global_step = 0;  ///< steps completed since training began (the seed's cur_step_num)
    Event event = Event::step_end;
    int rank = 0;  ///< data-parallel rank of the caller, for per-rank naming
    std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
    /// Recorded with the checkpoint saved at this point, if any (finite values only: a NaN or
    /// infinite one is left out, with a notice).
    Metrics metrics;

    /// For loops without epochs (a solver): iteration i is epoch 1, step i.
    static Progress at_iteration(std::int64_t i) {
        Progress p;
        p.step = i;
        p.global_step = i;
        return p;
    }
};

}  // namespace ckpt
