#pragma once
// Termination signals for data-parallel training: the core's flag (ckpt/preemption.hpp),
// agreed on by every rank through LastWordsCheckpoint (watch_signals, on by default). A
// LastWordsCheckpoint watches them for as long as it lives when the program does not handle
// SIGTERM itself: a launcher stopping the job (ckpt-run, after a worker failed for good)
// then ends training at a step with last words instead of killing the survivors before
// they save.
//
//   fault::LastWordsCheckpoint last_words(comm, dir);   // SIGTERM: last words, then Preempted
//   try { trainer.train(…); } catch (const fault::Preempted& p) { return fault::preempted_exit_status; }

#include <signal.h>

#include <mutex>
#include <optional>

#include "../ckpt/preemption.hpp"

namespace fault {

using ckpt::preempted_exit_status;
using ckpt::Preempted;
using ckpt::TerminationSignals;

namespace detail {

/// Termination signals watched while any holder lives (one installation per process, for
/// ranks on threads too), unless the program already handles SIGTERM (its own
/// TerminationSignals among others): then nothing is installed.
class WatchedSignals {
public:
    WatchedSignals() {
        std::lock_guard lock(mutex());
        if (users()++ > 0) return;
        struct sigaction current {};
        if (::sigaction(SIGTERM, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) installed().emplace();
    }
    ~WatchedSignals() {
        std::lock_guard lock(mutex());
        if (--users() == 0) installed().reset();
    }
    WatchedSignals(const WatchedSignals&) = delete;
    WatchedSignals& operator=(const WatchedSignals&) = delete;

private:
    static std::mutex& mutex() {
        static std::mutex m;
        return m;
    }
    static int& users() {
        static int n = 0;
        return n;
    }
    static std::optional<TerminationSignals>& installed() {
        static std::optional<TerminationSignals> s;
        return s;
    }
};

}  // namespace detail

}  // namespace fault
