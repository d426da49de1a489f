#pragma once
// Termination signals (SIGTERM, SIGINT, SIGUSR1: what a scheduler sends before it preempts
// a job) turned into a flag the training loop polls at step boundaries. The handler only
// sets the flag; everything else happens on the training threads.
//
//   ckpt::TerminationSignals signals;             // installs; the destructor restores
//   nn::ModelCheckpoint<…> cb(dir, prefix, {.save_on_signal = true});   // saves, then stops
//   try { trainer.train(…); } catch (const ckpt::Preempted&) { return ckpt::preempted_exit_status; }

#include <signal.h>

#include <atomic>
#include <initializer_list>
#include <string>
#include <vector>

#include "error.hpp"

namespace ckpt {

/// Training stopped because of a termination signal, after saving what it could.
class Preempted : public Error {
public:
    Preempted(const std::string& what, int signal) : Error(what), signal_(signal) {}
    int signal() const noexcept { return signal_; }

private:
    int signal_;
};

/// The exit status after a preemption: 128 + SIGTERM, as a shell reports a process ended
/// by that signal.
inline constexpr int preempted_exit_status = 128 + SIGTERM;

/// Installs handlers of termination signals (SIGTERM, SIGINT and SIGUSR1 by default) that only set
/// a process-wide flag, for the loop to poll at step boundaries (requested(), signal()); the
/// destructor puts the previous handlers back. Constructing one clears the flag.
class TerminationSignals {
public:
    explicit TerminationSignals(std::initializer_list<int> signals = {SIGTERM, SIGINT, SIGUSR1}) {
        reset();
        for (int sig : signals) {
            struct sigaction sa {}, old{};
            sa.sa_handler = &TerminationSignals::handle;
            sigemptyset(&sa.sa_mask);
            if (::sigaction(sig, &sa, &old) != 0)
                throw ConfigError("cannot install a handler for signal " + std::to_string(sig));
            saved_.push_back({sig, old});
        }
    }
    ~TerminationSignals() {
        for (auto& [sig, old] : saved_) ::sigaction(sig, &old, nullptr);
    }
    TerminationSignals(const TerminationSignals&) = delete;
    TerminationSignals& operator=(const TerminationSignals&) = delete;

    /// Whether a watched signal arrived, and which (0 if none).
    static bool requested() noexcept { return flag().load(std::memory_order_relaxed) != 0; }
    static int signal() noexcept { return flag().load(std::memory_order_relaxed); }
    static void reset() noexcept { flag().store(0); }

private:
    static std::atomic<int>& flag() noexcept {
        static std::atomic<int> f{0};
        return f;
    }
    static void handle(int sig) { flag().store(sig, std::memory_order_relaxed); }  // async-signal-safe: lock-free store
    struct Saved {
        int sig;
        struct sigaction old;
    };
    std::vector<Saved> saved_;
};

static_assert(std::atomic<int>::is_always_lock_free);

}  // namespace ckpt
