#pragma once
// The last-words checkpoint (the seed's "临终 CKPT"): when a data-parallel rank fails, the
// survivors save the newest consistent state from a healthy replica, so that resuming
// loses no steps. There is no controller: every survivor runs the same decision on the
// same reports, and any rank, rank 0 included, may be the one that failed.
//
//   fault::LastWordsCheckpoint last_words(comm, "ttp_checkpoints");
//   trainer.train(epochs, data, nn::callbacks(last_words));          // throws after saving
//   …
//   if (auto file = fault::latest_last_words("ttp_checkpoints")) trainer.resume_from(*file, data);
//
// On a rank's own failure (any exception but PeerFailure) the rank declares itself failed
// and takes no part. On PeerFailure, the survivors form a new group, exchange what each
// holds (completed global step, consistent or torn mid-update, epoch and step), take the
// newest step some survivor holds consistently, let the ReplicaSelector pick the saver
// among those, and the saver writes
//   {dir}/tft_saved_checkpoints-step_{g}/rank_{r}/ttp_rank_{r}-{epoch}_{step}.ckpt
// into a temporary directory that is renamed into place once complete and durable. The
// survivors then meet at a barrier, so each knows the save is durable before it rethrows.
// A second failure during the save (the saver's write fails, or it dies) never leaves a
// torn step directory: the saver removes its temporary, declares itself failed, and the
// remaining survivors agree again and another of them saves. When no survivor holds a
// consistent state, nothing is written and a warning says why.

#include <boost/filesystem.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <signal.h>
#include <string>
#include <vector>

#include "../ckpt/checkpoint.hpp"
#include "../ckpt/detail/atomic_file.hpp"
#include "../ckpt/detail/posix_io.hpp"
#include "../ckpt/latest.hpp"
#include "../ckpt/log.hpp"
#include "../ckpt/naming_policy.hpp"
#include "../nn/callbacks.hpp"
#include "communicator.hpp"
#include "replica_selector.hpp"
#include "termination.hpp"

namespace fault {

namespace fs = boost::filesystem;

/// What a survivor holds when the last words are decided.
struct SurvivorReport {
    std::int64_t job_rank = 0;
    std::int64_t global_step = 0;  ///< steps whose update this rank completed
    std::int64_t consistent = 1;   ///< 0 when the failure struck inside this rank's update
    std::int64_t epoch = 0;
    std::int64_t step = 0;         ///< steps completed in that epoch
};

namespace detail {

inline std::string step_dir_name(std::int64_t global_step) {
    return "tft_saved_checkpoints-step_" + std::to_string(global_step);
}

/// Removes temporary step directories whose writer process is gone.
inline void remove_stale_step_temporaries(const fs::path& dir) {
    boost::system::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.rfind(".tft_saved_checkpoints-step_", 0) != 0) continue;
        const auto pid = ckpt::detail::temporary_owner(name);
        if (!pid || ::kill(static_cast<pid_t>(*pid), 0) == 0 || errno != ESRCH) continue;
        boost::system::error_code rm;
        fs::remove_all(it->path(), rm);
        if (!rm) ckpt::detail::log(ckpt::LogLevel::info, "removed stale last-words temporary '" + it->path().string() + "'");
    }
}

}  // namespace detail

/// What the last words came to, as this survivor saw it.
struct LastWordsOutcome {
    bool took_part = false;                 ///< false on the rank that failed
    std::vector<SurvivorReport> reports;    ///< every survivor's, by job rank
    std::optional<std::int64_t> step;       ///< the global step saved, if any
    int saver = -1;                         ///< the job rank that saved it
    std::optional<fs::path> step_directory; ///< committed and durable, if the save succeeded
    std::string message;                    ///< why nothing was saved, when nothing was
    double seconds = 0;                     ///< from the failure's detection to the save being durable
};

template <RecoverableCommunicator Comm, ReplicaSelector Sel = LowestHealthyRank>
class LastWordsCheckpoint {
public:
    /// With `watch_signals`, a termination signal caught by TerminationSignals also leads
    /// to last words (see on_step_end), at the cost of a one-float allreduce per step.
    explicit LastWordsCheckpoint(Comm& comm, fs::path directory = "ttp_checkpoints", Sel selector = {},
                                 bool watch_signals = false)
        : comm_(comm), dir_(std::move(directory)), selector_(std::move(selector)), watch_signals_(watch_signals) {
        if (comm.size() < 2)
            throw ckpt::ConfigError("a last-words checkpoint needs a replica: a data-parallel job of at least 2 ranks, "
                                    "this one has " + std::to_string(comm.size()));
        boost::system::error_code ec;
        fs::create_directories(dir_, ec);
        if (ec) throw ckpt::IoError("cannot create last-words directory '" + dir_.string() + "': " + ec.message(), dir_.string(), ec.value());
        detail::remove_stale_step_temporaries(dir_);
    }

    /// Runs inside the trainer's exception handler (see the file comment).
    void on_exception(nn::RunContext& ctx) {
        const auto error = std::current_exception();
        if (detail::holds<Preempted>(error)) return;  // the last words are already written
        outcome_ = {};
        if (!detail::holds<PeerFailure>(error)) {
            comm_.declare_failed();  // this rank's own failure: its state is not to be trusted
            return;
        }
        const auto start = std::chrono::steady_clock::now();
        // A rank failing during the last words (the saver's disk, say) is a new failure:
        // the remaining survivors shrink again and try again, until one save is durable.
        Comm survivors = comm_.shrink();
        for (;;) {
            try {
                speak(survivors, ctx, start);
                return;
            } catch (const PeerFailure& again) {
                ckpt::detail::log(ckpt::LogLevel::warning,
                                  std::string("last words interrupted, trying again without the ranks gone: ") + again.what());
                outcome_ = {};
                survivors = survivors.shrink();
            }
        }
    }

    /// With termination signals watched (TerminationSignals), every step ends with a
    /// one-float allreduce telling whether any rank's process received one; if so, all
    /// ranks save the last words at this same step and training ends with Preempted.
    void on_step_end(nn::RunContext& ctx) {
        if (!watch_signals_) return;
        float requested = TerminationSignals::requested() ? 1.0f : 0.0f;
        comm_.allreduce(std::span<float>(&requested, 1), ReduceOp::sum);
        if (requested == 0.0f) return;
        outcome_ = {};
        speak(comm_, ctx, std::chrono::steady_clock::now());
        throw Preempted("training stopped by signal " + std::to_string(TerminationSignals::signal()) +
                            " after global step " + std::to_string(ctx.global_step) +
                            (outcome_.step_directory ? "; last words in '" + outcome_.step_directory->string() + "'"
                                                     : std::string("; no last words: ") + outcome_.message),
                        TerminationSignals::signal());
    }

    const LastWordsOutcome& outcome() const noexcept { return outcome_; }
    const fs::path& directory() const noexcept { return dir_; }

private:
    // The protocol among `group` (the survivors, or everyone on a signal): exchange
    // reports, pick the newest consistent step and its saver, write, meet at a barrier.
    void speak(Comm& group, nn::RunContext& ctx, std::chrono::steady_clock::time_point start) {
        outcome_.took_part = true;
        const SurvivorReport mine{comm_.job_rank(), ctx.global_step, ctx.consistent ? 1 : 0, ctx.epoch, ctx.step};
        outcome_.reports = detail::allgather_records(group, mine);

        std::int64_t newest = -1;
        for (const auto& r : outcome_.reports)
            if (r.consistent) newest = std::max(newest, r.global_step);
        std::vector<int> holders;
        const SurvivorReport* holder = nullptr;
        for (const auto& r : outcome_.reports)
            if (r.consistent && r.global_step == newest) {
                holders.push_back(static_cast<int>(r.job_rank));
                holder = &r;
            }
        if (holders.empty()) {
            outcome_.message = "last words: no survivor holds a consistent state (every one failed inside its update); "
                               "nothing written";
            ckpt::detail::log(ckpt::LogLevel::warning, outcome_.message);
            return;
        }
        outcome_.step = newest;
        outcome_.saver = selector_.choose(holders);
        const fs::path final_dir = dir_ / detail::step_dir_name(newest);
        bool committed = false;
        if (outcome_.saver == comm_.job_rank()) {
            try {
                committed = write(ctx, *holder, final_dir);
            } catch (...) {
                group.declare_failed();  // the others must not wait for a save that will not come
                throw;
            }
        }
        // Every survivor learns the save is durable, or learns of a second failure here.
        group.barrier();
        outcome_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (outcome_.saver == comm_.job_rank() && !committed) return;
        outcome_.step_directory = final_dir;
    }

    bool write(nn::RunContext& ctx, const SurvivorReport& at, const fs::path& final_dir) {
        if (fs::exists(final_dir)) {
            outcome_.message = "last words: '" + final_dir.string() + "' already exists; it is left as it is";
            ckpt::detail::log(ckpt::LogLevel::warning, outcome_.message);
            return false;
        }
        const fs::path tmp = dir_ / ckpt::detail::temporary_name(final_dir.filename().string());
        ckpt::Progress p;
        p.epoch = at.epoch;
        p.step = at.step;
        p.global_step = at.global_step;
        p.rank = comm_.job_rank();
        // the name below the step directory, as LastWordsNaming gives it
        const std::string name = ckpt::LastWordsNaming{}.checkpoint_name("", p, ckpt::SaveKind::regular);
        const fs::path file = tmp / name.substr(name.find('/') + 1);
        try {
            fs::create_directories(file.parent_path());
            ckpt::SaveOptions opts;
            opts.epoch = at.epoch;
            opts.step = at.step;
            ckpt::save_checkpoint(ctx.state(), file, opts);  // fsyncs the file and rank_{r}/
            ckpt::detail::fsync_directory(tmp.string());
            fs::rename(tmp, final_dir);
        } catch (...) {
            boost::system::error_code ec;
            fs::remove_all(tmp, ec);  // only our own temporary: nothing visible was written
            throw;
        }
        ckpt::detail::fsync_directory(dir_.string());
        return true;
    }

    Comm& comm_;
    fs::path dir_;
    Sel selector_;
    bool watch_signals_;
    LastWordsOutcome outcome_;
};

/// The newest last-words checkpoint in `dir` whose file verifies, or nothing.
inline std::optional<fs::path> latest_last_words(const fs::path& dir) {
    if (!fs::is_directory(dir)) return std::nullopt;
    return ckpt::latest(dir, "ttp", ckpt::LastWordsNaming{});
}

}  // namespace fault
