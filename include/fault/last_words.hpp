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
// On a rank's own failure (any exception but PeerFailure or Interrupted, which mean another
// rank failed) the rank declares itself failed and takes no part. The survivors form a new
// group and exchange what each holds (completed global step, consistent or torn
// mid-update, epoch and step, optimizer-state piece). They take the newest step at which
// every replica group (ShardLayout: the ranks keeping the same piece of the optimizer
// state; all ranks when it is not sharded) has a survivor holding it consistently; the
// ReplicaSelector picks one saver per group, and each saver writes
//   {dir}/tft_saved_checkpoints-step_{g}/rank_{r}/ttp_rank_{r}-{epoch}_{step}.ckpt
// into a temporary step directory. Once all have written, the saver of piece 0 renames it
// into place and makes that durable, and the survivors meet at a barrier, so each knows
// the save is durable before it rethrows. A second failure during the save (a saver's
// write fails, or it dies) never leaves a torn step directory: the temporary is not
// renamed, the failed saver declares itself failed, and the remaining survivors agree
// again and save again. When some replica group has no consistent survivor, nothing is
// written and the message says which group. The committer also writes the step's global
// index into the temporary (LastWordsOptions::pieces), so the step directory is loadable
// on another number of ranks (ckpt::load_resharded) from the moment it appears.

#include <boost/filesystem.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <signal.h>
#include <string>
#include <vector>

#include "../ckpt/checkpoint.hpp"
#include "../ckpt/detail/atomic_file.hpp"
#include "../ckpt/detail/flusher.hpp"
#include "../ckpt/detail/posix_io.hpp"
#include "../ckpt/latest.hpp"
#include "../ckpt/log.hpp"
#include "../ckpt/policies/naming.hpp"
#include "../ckpt/reshard.hpp"
#include "../nn/callbacks.hpp"
#include "communicator.hpp"
#include "data_parallel.hpp"
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
    std::int64_t shard = 0;        ///< the piece of the optimizer state it keeps
    std::int64_t pid = 0;          ///< names the temporary step directory, when it commits
    std::int64_t attempt = 0;
};

/// How the last words are taken: who saves, how the optimizer state is split, signals.
template <ReplicaSelector Sel = LowestHealthyRank>
struct LastWordsOptions {
    Sel selector{};
    ShardLayout layout{};        ///< the optimizer's; the replica groups follow from it
    /// Also on SIGTERM/SIGINT/SIGUSR1 (see LastWordsCheckpoint::on_step_end), watched for as
    /// long as the checkpoint lives when the program does not handle them itself. false:
    /// signals are left to the program, and a launcher's SIGTERM may end a survivor before
    /// it saves.
    bool watch_signals = true;
    /// Where this rank's optimizer-state pieces sit (a DataParallelOptimizer's piece_map).
    /// With it, or without sharding, the step directory also holds a global index,
    /// index-step_{g}.ckpt, to load the last words on another number of ranks.
    std::function<ckpt::PieceMap()> pieces{};
    /// Set: once committed, the step directory is copied here as well (a durable shared
    /// directory, see ckpt::DurableLevel): every file checked against its checksum as it is
    /// copied, the copy renamed into place whole. A failed copy is logged; the local step
    /// directory stands.
    std::optional<ckpt::Path> durable{};
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

inline std::string ranks_text(const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s;
}

/// What the survivors decided: the step to save and one saver per replica group, or why
/// nothing can be saved.
struct LastWordsPlan {
    std::int64_t step = -1;
    std::vector<int> savers;  ///< job ranks, by optimizer-state piece
    std::string problem;      ///< set when nothing can be saved
};

/// The newest step at which every replica group has a consistent survivor, and its savers.
template <ReplicaSelector Sel>
LastWordsPlan plan_last_words(const std::vector<SurvivorReport>& reports, const ShardLayout& layout, int job_size,
                              const Sel& selector) {
    std::vector<std::int64_t> steps;
    for (const auto& r : reports)
        if (r.consistent) steps.push_back(r.global_step);
    std::sort(steps.rbegin(), steps.rend());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    auto holders = [&](std::int64_t step, int piece) {
        std::vector<int> h;
        for (const auto& r : reports)
            if (r.consistent && r.global_step == step && r.shard == piece) h.push_back(static_cast<int>(r.job_rank));
        std::sort(h.begin(), h.end());
        return h;
    };
    LastWordsPlan plan;
    for (const std::int64_t step : steps) {
        std::vector<int> savers;
        for (int j = 0; j < layout.shard_size; ++j)
            if (auto h = holders(step, j); !h.empty()) savers.push_back(selector.choose(h));
        if (static_cast<int>(savers.size()) == layout.shard_size) {
            plan.step = step;
            plan.savers = std::move(savers);
            return plan;
        }
    }
    // Say, for the newest step anyone holds, which group has nobody and what became of it.
    std::string why;
    const std::int64_t newest = steps.empty() ? -1 : steps.front();
    for (int j = 0; j < layout.shard_size; ++j) {
        if (newest >= 0 && !holders(newest, j).empty()) continue;
        const auto members = layout.replica_group(j, job_size);
        why += (why.empty() ? "" : "; ") + std::string("replica group ") + std::to_string(j) + " (" +
               ranks_text(members) + "):";
        for (int m : members) {
            auto it = std::find_if(reports.begin(), reports.end(), [&](const SurvivorReport& r) { return r.job_rank == m; });
            why += " rank " + std::to_string(m) + " " +
                   (it == reports.end() ? std::string("failed")
                    : !it->consistent  ? std::string("was torn inside its update")
                                       : "holds step " + std::to_string(it->global_step));
            why += m == members.back() ? "" : ",";
        }
    }
    plan.problem = "last words: no step is held consistently by every replica group" +
                   (newest >= 0 ? " (newest: global step " + std::to_string(newest) + ")" : std::string()) + "; " + why +
                   "; nothing written";
    return plan;
}

/// One file per replica group in `step_dir` that verifies (a rank_{r} directory whose rank
/// keeps that piece), by piece; nothing if some piece has none.
inline std::optional<std::vector<fs::path>> complete_step(const std::vector<ckpt::StoredCheckpoint>& files,
                                                          std::int64_t step, const ShardLayout& layout) {
    std::vector<fs::path> by_piece(static_cast<std::size_t>(layout.shard_size));
    for (auto f : files) {
        if (f.name.global_step != step) continue;
        auto& slot = by_piece[static_cast<std::size_t>(layout.shard_of(f.name.rank))];
        if (!slot.empty()) continue;
        if (auto why = ckpt::checkpoint_problem(f)) {
            ckpt::detail::log(ckpt::LogLevel::warning, "skipping last-words file '" + f.path.string() + "': " + *why);
            continue;
        }
        slot = f.path;
    }
    for (std::size_t j = 0; j < by_piece.size(); ++j)
        if (by_piece[j].empty()) return std::nullopt;
    return by_piece;
}

inline std::int64_t next_attempt() {
    static std::atomic<std::int64_t> n{0};
    return n.fetch_add(1);
}

}  // namespace detail

/// What the last words came to, as this survivor saw it.
struct LastWordsOutcome {
    bool took_part = false;                 ///< false on the rank that failed
    std::vector<SurvivorReport> reports;    ///< every survivor's, by job rank
    std::optional<std::int64_t> step;       ///< the global step saved, if any
    int saver = -1;                         ///< the job rank that saved piece 0 (all of it, unsharded)
    std::vector<int> savers;                ///< the job rank that saved each piece
    std::optional<fs::path> step_directory; ///< committed and durable, if the save succeeded
    std::string message;                    ///< why nothing was saved, when nothing was
    double seconds = 0;                     ///< from the failure's detection to the save being durable
};

/// The callback that saves the last words when a rank fails: the survivors agree on the newest
/// step every replica group holds consistently, one rank of each group saves it into
/// {dir}/tft_saved_checkpoints-step_{g}/…, and the failure is rethrown once that is durable. Any
/// rank may fail, rank 0 included. It also stops every rank at the same step, with last words,
/// on a termination signal (LastWordsOptions::watch_signals).
template <ShrinkableCommunicator Comm, ReplicaSelector Sel = LowestHealthyRank>
class LastWordsCheckpoint {
public:
    LastWordsCheckpoint(Comm& comm, ckpt::PathArg directory = "ttp_checkpoints", LastWordsOptions<Sel> options = {})
        : comm_(comm), dir_(std::move(directory)), options_(std::move(options)), job_size_(comm.size()) {
        options_.layout.require_replicas(comm.size(), "a last-words checkpoint");
        if (options_.watch_signals) signals_ = std::make_shared<detail::WatchedSignals>();
        boost::system::error_code ec;
        fs::create_directories(dir_, ec);
        if (ec) throw ckpt::IoError("cannot create last-words directory '" + dir_.string() + "': " + ec.message(), dir_.string(), ec.value());
        detail::remove_stale_step_temporaries(dir_);
    }

    /// Runs inside the trainer's exception handler: on this rank's own failure it declares the
    /// rank failed and takes no part; on another's (PeerFailure, Interrupted) it saves the last
    /// words with the other survivors. outcome() says what came of it.
    void on_exception(nn::RunContext& ctx) {
        const auto error = std::current_exception();
        if (detail::holds<Preempted>(error)) return;  // the last words are already written
        outcome_ = {};
        if (!detail::holds<PeerFailure>(error) && !detail::holds<Interrupted>(error)) {
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
        if (!options_.watch_signals) return;
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
    // reports, plan, write, commit, meet at a barrier.
    void speak(Comm& group, nn::RunContext& ctx, std::chrono::steady_clock::time_point start) {
        outcome_.took_part = true;
        const int me = comm_.job_rank();
        const SurvivorReport mine{me,
                                  ctx.global_step,
                                  ctx.consistent ? 1 : 0,
                                  ctx.epoch,
                                  ctx.step,
                                  options_.layout.shard_of(me),
                                  static_cast<std::int64_t>(::getpid()),
                                  detail::next_attempt()};
        outcome_.reports = detail::allgather_records(group, mine);
        const auto plan = detail::plan_last_words(outcome_.reports, options_.layout, job_size_, options_.selector);
        if (plan.step < 0) {
            outcome_.message = plan.problem;
            ckpt::detail::log(ckpt::LogLevel::warning, outcome_.message);
            return;
        }
        outcome_.step = plan.step;
        outcome_.savers = plan.savers;
        outcome_.saver = plan.savers.front();
        const std::string final_name = detail::step_dir_name(plan.step);
        const fs::path final_dir = dir_ / final_name;
        if (fs::exists(final_dir)) {  // every survivor sees it: nobody writes
            const auto files = ckpt::list_checkpoints(dir_, "ttp", ckpt::LastWordsNaming{});
            if (detail::complete_step(files, plan.step, options_.layout)) {
                outcome_.step_directory = final_dir;  // a save of this step before a second failure
            } else {
                outcome_.message = "last words: '" + final_dir.string() + "' already exists and is incomplete; it is left as it is";
                ckpt::detail::log(ckpt::LogLevel::warning, outcome_.message);
            }
            return;
        }
        // The committer's temporary: its name carries the committer's pid, so a later start
        // removes it if that process died before renaming it.
        const int committer = plan.savers.front();
        const auto& cr = *std::find_if(outcome_.reports.begin(), outcome_.reports.end(),
                                       [&](const SurvivorReport& r) { return r.job_rank == committer; });
        const std::string staging_name = "." + final_name + std::string(ckpt::detail::temp_marker) +
                                         std::to_string(cr.pid) + "-" + std::to_string(cr.attempt);
        const fs::path staging = dir_ / staging_name;
        if (std::find(plan.savers.begin(), plan.savers.end(), me) != plan.savers.end()) write(group, ctx, staging);
        group.barrier();  // every piece is written and durable in the temporary
        if (me == committer) commit(group, ctx, plan.savers, staging, final_dir, final_name, staging_name);
        group.barrier();  // the step directory is in place and durable
        outcome_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        outcome_.step_directory = final_dir;
    }

    // Saver `rank`'s file in the step directory: rank_{r}/ttp_rank_{r}-{epoch}_{step}.ckpt.
    static std::string saver_file(const nn::RunContext& ctx, int rank) {
        ckpt::Progress p;
        p.epoch = ctx.epoch;
        p.step = ctx.step;
        p.global_step = ctx.global_step;
        p.rank = rank;
        const std::string name = ckpt::LastWordsNaming{}.checkpoint_name("", p, ckpt::SaveKind::regular);
        return name.substr(name.find('/') + 1);
    }

    // This saver's file, inside the temporary.
    void write(Comm& group, nn::RunContext& ctx, const fs::path& staging) {
        const fs::path file = staging / saver_file(ctx, comm_.job_rank());
        try {
            fs::create_directories(file.parent_path());
            ckpt::SaveOptions opts;
            opts.epoch = ctx.epoch;
            opts.step = ctx.step;
            ckpt::save_checkpoint(ctx.state(), file, opts);  // fsyncs the file and rank_{r}/
            ckpt::detail::fsync_directory(staging.string());
        } catch (...) {
            boost::system::error_code ec;
            fs::remove_all(file.parent_path(), ec);  // only our own part: nothing visible was written
            group.declare_failed();                  // the others must not wait for a save that will not come
            throw;
        }
    }

    // The global index of the savers' files, in the temporary. A saver of piece j holds
    // piece j of every sharded tensor: the committer's own places, moved to piece j.
    void write_index(const nn::RunContext& ctx, const std::vector<int>& savers, const fs::path& staging) {
        const ShardLayout& layout = options_.layout;
        if (layout.shard_size > 1 && !options_.pieces) return;  // where the pieces sit is not known
        const ckpt::PieceMap mine = options_.pieces ? options_.pieces() : ckpt::PieceMap{};
        ckpt::GlobalIndex index;
        index.global_step = ctx.global_step;
        index.world_size = job_size_;
        for (const int saver : savers) {
            ckpt::PieceMap places = mine;
            for (auto& [name, place] : places)
                place.first = layout.piece(ckpt::detail::numel_of(place.global_shape), layout.shard_of(saver)).first;
            const std::string relative = saver_file(ctx, saver);
            const ckpt::GlobalIndex theirs = ckpt::describe_checkpoint(staging / relative, relative, saver, places);
            if (index.pieces.empty()) {
                index.values = theirs.values;
                index.chunk_bytes = theirs.chunk_bytes;
            }
            index.pieces.insert(index.pieces.end(), theirs.pieces.begin(), theirs.pieces.end());
        }
        ckpt::SaveOptions opts;
        opts.step = ctx.global_step;
        ckpt::save_checkpoint(ckpt::index_to_dict(index), staging / ("index-step_" + std::to_string(ctx.global_step) + ".ckpt"),
                              opts);
    }

    void commit(Comm& group, const nn::RunContext& ctx, const std::vector<int>& savers, const fs::path& staging,
                const fs::path& final_dir, const std::string& final_name, const std::string& staging_name) {
        try {
            write_index(ctx, savers, staging);
            // temporaries of earlier attempts at this step: their writers have all moved on
            boost::system::error_code ec;
            for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
                const std::string n = it->path().filename().string();
                if (n != staging_name && n.rfind("." + final_name + std::string(ckpt::detail::temp_marker), 0) == 0) {
                    boost::system::error_code rm;
                    fs::remove_all(it->path(), rm);
                }
            }
            fs::rename(staging, final_dir);
            ckpt::detail::fsync_directory(dir_.string());
        } catch (...) {
            boost::system::error_code ec;
            fs::remove_all(staging, ec);
            group.declare_failed();
            throw;
        }
        if (options_.durable) copy_to_durable(final_dir, final_name);
    }

    // The committed step directory, copied whole to the durable level: into a temporary
    // there, each file checked, then renamed into place.
    void copy_to_durable(const fs::path& final_dir, const std::string& final_name) const {
        const fs::path to = *options_.durable / final_name;
        const fs::path staging = *options_.durable / ckpt::detail::temporary_name(final_name);
        try {
            fs::create_directories(*options_.durable);
            ckpt::detail::Pacer unpaced(0);
            for (fs::recursive_directory_iterator it(final_dir), end; it != end; ++it) {
                const fs::path target = staging / fs::relative(it->path(), final_dir);
                if (fs::is_directory(it->status())) {
                    fs::create_directories(target);
                    continue;
                }
                fs::create_directories(target.parent_path());
                ckpt::detail::copy_file_checked(it->path(), target, it->path().extension() == ".ckpt", unpaced);
            }
            boost::system::error_code ec;
            fs::remove_all(to, ec);  // an earlier, incomplete attempt at this step
            fs::rename(staging, to);
            ckpt::detail::fsync_directory(options_.durable->string());
            ckpt::detail::log(ckpt::LogLevel::info, "last words copied to the durable level: '" + to.string() + "'");
        } catch (const std::exception& e) {
            boost::system::error_code ec;
            fs::remove_all(staging, ec);
            ckpt::detail::log(ckpt::LogLevel::warning, "could not copy the last words '" + final_dir.string() +
                                                           "' to the durable level '" + options_.durable->string() +
                                                           "': " + e.what());
        }
    }

    std::shared_ptr<detail::WatchedSignals> signals_;  // SIGTERM and co. turned into a flag while this lives
    Comm& comm_;
    fs::path dir_;
    LastWordsOptions<Sel> options_;
    int job_size_;
    LastWordsOutcome outcome_;
};

/// The file to resume from for `rank`: in the newest last-words step of `dir` that is
/// complete (every replica group of `layout` has a file there that verifies), the file of
/// the rank that saved this rank's piece of the optimizer state. Nothing if no step is
/// complete. All ranks get the same step.
///
/// With two levels (LastWordsOptions::durable), pass both directories, the local one first:
/// the newest complete step on either, the local copy first.
inline std::optional<fs::path> latest_last_words(const std::vector<ckpt::Path>& levels, const ShardLayout& layout = {},
                                                 int rank = 0) {
    std::vector<std::vector<ckpt::StoredCheckpoint>> files(levels.size());
    std::vector<std::pair<std::int64_t, std::size_t>> steps;  // (step, level), newest first, the first level first
    for (std::size_t l = 0; l < levels.size(); ++l) {
        if (!fs::is_directory(levels[l])) continue;
        files[l] = ckpt::list_checkpoints(levels[l], "ttp", ckpt::LastWordsNaming{});
        for (const auto& f : files[l])
            if (steps.empty() || steps.back() != std::pair(f.name.global_step, l)) steps.emplace_back(f.name.global_step, l);
    }
    std::stable_sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    for (const auto& [step, l] : steps) {
        if (auto pieces = detail::complete_step(files[l], step, layout)) {
            if (l > 0)
                ckpt::detail::log(ckpt::LogLevel::notice, "last words of step " + std::to_string(step) + " from '" +
                                                              levels[l].string() + "': '" + levels.front().string() +
                                                              "' holds no complete copy of them");
            return (*pieces)[static_cast<std::size_t>(layout.shard_of(rank))];
        }
        ckpt::detail::log(ckpt::LogLevel::warning, "skipping last-words step " + std::to_string(step) + " in '" +
                                                       levels[l].string() + "': some replica group has no file that verifies");
    }
    return std::nullopt;
}
inline std::optional<fs::path> latest_last_words(const ckpt::PathArg& dir, const ShardLayout& layout = {}, int rank = 0) {
    return latest_last_words(std::vector<ckpt::Path>{ckpt::Path(dir)}, layout, rank);
}

}  // namespace fault
