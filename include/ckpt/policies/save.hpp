#pragma once
// SavePolicy: decides, at each step end, epoch end and train end, whether to save.
//
// A SavePolicy P provides
//   bool should_save(const Progress&)  -- asked at every event; may keep state (timers)
//   void saved(const Progress&)        -- told after every save, whichever policy asked for it
//
// Members: Never, EverySteps, EveryEpochs, EverySeconds, OnTrainEnd, and AnyOf<...> to combine.

#include <chrono>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "../error.hpp"
#include "../progress.hpp"

namespace ckpt {

/// When to save: should_save(progress) is asked at every step end, epoch end and train end, and
/// saved(progress) is told of every save, whichever policy asked for it (a timer restarts there).
/// Members: Never, EverySteps, EveryEpochs, EverySeconds, OnTrainEnd, AnyOf.
template <class P>
concept SavePolicy = std::copy_constructible<P> && requires(P& p, const Progress& pr) {
    { p.should_save(pr) } -> std::convertible_to<bool>;
    p.saved(pr);
};

/// Saves nothing (the do-nothing member).
struct Never {
    bool should_save(const Progress&) const { return false; }
    void saved(const Progress&) const {}
};

/// Saves when the global step is a multiple of n (the seed's save_checkpoint_steps).
struct EverySteps {
    std::int64_t n = 1;
    explicit EverySteps(std::int64_t every = 1) : n(every) {
        if (n < 1) throw ConfigError("EverySteps needs n >= 1, got " + std::to_string(n));
    }
    bool should_save(const Progress& p) const { return p.event == Event::step_end && p.global_step % n == 0; }
    void saved(const Progress&) const {}
};

/// Saves at the end of every n-th epoch.
struct EveryEpochs {
    std::int64_t n = 1;
    explicit EveryEpochs(std::int64_t every = 1) : n(every) {
        if (n < 1) throw ConfigError("EveryEpochs needs n >= 1, got " + std::to_string(n));
    }
    bool should_save(const Progress& p) const { return p.event == Event::epoch_end && p.epoch % n == 0; }
    void saved(const Progress&) const {}
};

/// Saves at a step end once `seconds` have passed since the last save, or since the first
/// step seen (the seed's save_checkpoint_seconds).
struct EverySeconds {
    std::chrono::duration<double> interval;
    explicit EverySeconds(double seconds) : interval(seconds) {
        if (!(seconds > 0)) throw ConfigError("EverySeconds needs seconds > 0, got " + std::to_string(seconds));
    }
    bool should_save(const Progress& p) {
        if (!last_) last_ = p.now;
        return p.event == Event::step_end && p.now - *last_ >= interval;
    }
    void saved(const Progress& p) { last_ = p.now; }

private:
    std::optional<std::chrono::steady_clock::time_point> last_;
};

/// Saves when training ends (the seed saves the last step by default).
struct OnTrainEnd {
    bool should_save(const Progress& p) const { return p.event == Event::train_end; }
    void saved(const Progress&) const {}
};

/// Saves when any member says so; every member hears about every save.
template <SavePolicy... Ps>
struct AnyOf {
    std::tuple<Ps...> members;
    AnyOf() = default;
    explicit AnyOf(Ps... ps) : members(std::move(ps)...) {}
    bool should_save(const Progress& p) {
        // every member is asked (no short-circuit), so timers in all of them see every event
        bool any = false;
        std::apply([&](auto&... m) { ((any = m.should_save(p) || any), ...); }, members);
        return any;
    }
    void saved(const Progress& p) {
        std::apply([&](auto&... m) { (m.saved(p), ...); }, members);
    }
};

}  // namespace ckpt
