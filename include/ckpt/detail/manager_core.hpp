#pragma once
// The engine behind CheckpointManager (manager.hpp): saves, synchronous or on the writer
// thread, retention after each is durable, the copy to the durable level, restore() across
// both levels, the series' lock and the record that it finished. Not for direct use.

#include <boost/filesystem.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../append_info.hpp"
#include "../checkpoint.hpp"
#include "../codecs/codec.hpp"
#include "../error.hpp"
#include "../latest.hpp"
#include "../log.hpp"
#include "../manager_options.hpp"
#include "../param_dict.hpp"
#include "../policies/archive.hpp"
#include "../policies/naming.hpp"
#include "../policies/retention.hpp"
#include "../policies/save.hpp"
#include "../progress.hpp"
#include "../series.hpp"
#include "atomic_file.hpp"
#include "background_save.hpp"
#include "flusher.hpp"
#include "retention_memory.hpp"
#include "unlinker.hpp"


namespace ckpt {

namespace detail {

template <class State>
ParamDict collect_state(State& state) {
    if constexpr (std::is_invocable_r_v<ParamDict, State&>) {
        return state();
    } else if constexpr (HasStateDict<State>) {
        return state.state_dict();
    } else {
        static_assert(std::is_convertible_v<State&, const ParamDict&>,
                      "a checkpoint state must be a ckpt::ParamDict, a callable returning one, or an object with "
                      "`ckpt::ParamDict state_dict()`");
        return state;
    }
}

/// The readable description of a run's saved state: one line per entry, name and type.
inline std::string describe_state(const ParamDict& dict, std::string_view run_prefix) {
    std::string text = "# ckpt state of run '" + std::string(run_prefix) + "': name <TAB> type\n";
    for (const auto& [name, value] : dict) text += name + "\t" + value.type_name() + "\n";
    return text;
}

inline void write_text_file(const fs::path& file, const std::string& text) {
    AtomicFile out(file);
    write_all(out.fd(), text.data(), text.size(), file.string());
    out.commit();
}

}  // namespace detail

namespace detail {

/// The manager itself. CheckpointManager holds it on the heap, so that background saves,
/// which reach it through `this`, survive the manager being moved.
template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
class ManagerCore {
public:
    /// See CheckpointManager's constructor.
    ManagerCore(PathArg directory, std::string prefix, S save, R retention, N naming, ManagerOptions options, C codec)
        : dir_(std::move(directory)), prefix_(std::move(prefix)), save_(std::move(save)),
          retention_(std::move(retention)), naming_(std::move(naming)), options_(std::move(options)),
          codecs_(codec.codecs()) {
        detail::check_prefix(prefix_);
        detail::check_chain(codecs_, (dir_ / prefix_).string());
        for (const auto& c : codecs_)
            if (!c.key.empty()) load_options_.key = c.key;
        if (options_.async_buffers == 0) throw ConfigError("async_buffers must be at least 1, got 0");
        prepare_directory(dir_, lock_);
        if (const auto& d = options_.durable) {
            if (d->directory.empty()) throw ConfigError("the durable level of prefix '" + prefix_ + "' has no directory");
            if (d->every < 1) throw ConfigError("DurableLevel::every must be at least 1, got " + std::to_string(d->every));
            if (!(d->max_bytes_per_second >= 0))
                throw ConfigError("DurableLevel::max_bytes_per_second must be 0 (no limit) or positive, got " +
                                  std::to_string(d->max_bytes_per_second));
            durable_dir_ = d->directory;
            create_directory(durable_dir_);
            if (fs::equivalent(dir_, durable_dir_))
                throw ConfigError("the durable level '" + durable_dir_.string() + "' is the checkpoint directory '" +
                                  dir_.string() + "' itself: give it a directory of its own");
            prepare_directory(durable_dir_, durable_lock_);
            flusher_ = std::make_unique<detail::Flusher>(d->max_bytes_per_second);
        }
        // a run's files may be on either level (the local one lost, say): number runs after both
        run_prefix_ = naming_.run_prefix(prefix_, level_names(), SaveKind::regular);
        boost::system::error_code ec;
        drop_finished_ = fs::exists(dir_ / detail::finished_file_name(prefix_), ec) ||
                         (flusher_ && fs::exists(durable_dir_ / detail::finished_file_name(prefix_), ec));
    }

    const fs::path& directory() const noexcept { return dir_; }
    const std::string& prefix() const noexcept { return prefix_; }
    /// The prefix this run's files use: the prefix, or "{prefix}_{N}" when earlier runs exist.
    const std::string& run_prefix() const noexcept { return run_prefix_; }
    const ManagerOptions& options() const noexcept { return options_; }
    const LoadOptions& load_options() const noexcept { return load_options_; }

    // CheckpointManager's templates on the state only collect it (a callable state is called
    // only when a save is due) and hand it to the members here, which do not depend on its
    // type: with CKPT_SEPARATE_COMPILATION the library compiles those once for the usual
    // policies.

    /// At the end of a step or an epoch (`e`): whether to save now (see save_due()).
    bool due_at(Progress& p, Event e) {
        background_.check();
        p.event = e;
        stepped_ = true;
        return save_due(p);
    }
    /// At the end of training: whether to save the final step. It is saved unless it is saved
    /// already, with every save policy but Never: the end of training is the state most worth
    /// keeping, and a job run again after it finished finds it. Saved already: by this run, or,
    /// when this run took no step, by the checkpoint it started from (a finished job run again).
    bool due_at_train_end(Progress& p) {
        p.event = Event::train_end;
        if (last_saved_ && *last_saved_ == p.global_step) return false;
        if (!stepped_)
            if (auto held = newest_at(p)) {
                final_file_ = held->path;
                return false;
            }
        if (!save_due(p) && std::is_same_v<S, Never>) return false;
        background_.check();
        return true;
    }

    /// See CheckpointManager::on_train_end(): records that the series finished at `p` (after
    /// wait_flushed()), naming the checkpoint that holds it.
    void record_finished(const Progress& p, std::string_view arguments) {
        std::optional<fs::path> file = final_file_;
        if (last_file_ && last_progress_.global_step == p.global_step) file = last_file_;
        if (!file) return;  // no checkpoint holds the end (the save policy is Never)
        const bool durable = on_durable_level(*file);
        const fs::path& level = durable ? durable_dir_ : dir_;
        const std::string series = detail::series_text(dir_, prefix_);
        try {
            FinishedRecord r;
            r.file = file->lexically_relative(level).generic_string();
            r.body_hash = read_header(*file).body_hash;
            if (auto before = read_finished(level, prefix_); before && before->file == r.file && before->body_hash == r.body_hash) {
                detail::log(LogLevel::notice, series + " had already " + detail::finished_text(*before) +
                                                  ": nothing saved, nothing deleted");
                return;
            }
            r.epoch = p.epoch;
            r.step = p.step;
            r.global_step = p.global_step;
            r.arguments = std::string(arguments);
            r.finished = detail::utc_now_iso();
            detail::write_finished(level, prefix_, r);
            // the durable level's copy of the final checkpoint says so too
            if (!durable && flusher_)
                if (boost::system::error_code ec; fs::exists(durable_dir_ / r.file, ec) &&
                                                  read_header(durable_dir_ / r.file).body_hash == r.body_hash)
                    detail::write_finished(durable_dir_, prefix_, r);
        } catch (const Error& e) {  // only a record: the checkpoint is durable, a re-run checks it
            detail::log(LogLevel::warning, "cannot record that " + series + " finished at '" + file->string() +
                                               "': " + e.what());
        }
    }

    /// Blocks until every background save in flight is durable and the files retention
    /// deleted are freed; rethrows the first error.
    void wait() {
        background_.wait();
        unlinker_.wait();
    }

    /// With async_save: saves handed over, waited for and skipped, and the training thread's cost.
    AsyncSaveStats async_stats() const {
        AsyncSaveStats stats = async_stats_;
        const auto w = background_.written();
        stats.written = w.saves;
        stats.write_seconds = w.seconds;
        stats.max_write_seconds = w.max_seconds;
        return stats;
    }

    /// Writes "…_breakpoint.ckpt" (on_exception() with exception_save on).
    Path save_exception(const Progress& p, ParamDict dict) {
        if (breakpoint_prefix_.empty())
            breakpoint_prefix_ =
                naming_.run_prefix(prefix_, level_names(), SaveKind::breakpoint);
        background_.wait();  // the breakpoint is the newest state: let no older save land after it
        const fs::path file = dir_ / naming_.checkpoint_name(breakpoint_prefix_, p, SaveKind::breakpoint);
        check_state(dict, p);
        write(file, p, dict, {prefix_, breakpoint_prefix_, run_prefix_});
        if (flusher_) {  // the newest state, and the process may be about to end: copied now
            queue_copy(file, p, restored_);
            flusher_->wait();
        }
        return file;
    }

    /// Rethrows the error of a background save, if one failed.
    void check_background() { background_.check(); }

    /// See CheckpointManager::pin(), hold() and release().
    void pin(const fs::path& file) { memory_.pin(file.lexically_relative(dir_)); }
    void hold(const fs::path& file) { memory_.hold(file.lexically_relative(dir_)); }
    void release(const fs::path& file) { memory_.release(file.lexically_relative(dir_)); }

    /// See CheckpointManager::durable().
    bool durable(const fs::path& file) const {
        const auto n = save_number(file);
        return !n || background_.finished(*n);
    }
    /// See CheckpointManager::wait_for().
    void wait_for(const fs::path& file) {
        if (const auto n = save_number(file))
            if (const auto failed = background_.wait_for(*n)) std::rethrow_exception(failed);
    }

    /// See CheckpointManager::wait_flushed().
    FlushStats wait_flushed() {
        background_.wait();
        unlinker_.wait();  // the end of a run (on_train_end) leaves nothing being freed
        if (!flusher_) return {};
        if (last_file_ && !last_copied_) {  // the newest state, saved when no copy was due
            queue_copy(*last_file_, last_progress_, restored_);
            last_copied_ = true;
        }
        FlushStats stats = flusher_->wait();
        if (last_file_)
            if (auto why = flusher_->failure_of(*last_file_))
                throw IoError("the newest checkpoint '" + last_file_->string() + "' is not on the durable level '" +
                                  durable_dir_.string() + "': " + *why,
                              last_file_->string());
        return stats;
    }
    FlushStats flush_stats() const { return flusher_ ? flusher_->stats() : FlushStats{}; }
    const fs::path* durable_directory() const noexcept { return flusher_ ? &durable_dir_ : nullptr; }
    bool copies_to_durable(const fs::path& file) const { return last_copied_ && last_file_ == file; }
    void queue_durable_copy(const fs::path& source, const fs::path& target, std::vector<fs::path> needs,
                            std::function<void()> done) const {
        if (!flusher_) throw ConfigError("prefix '" + prefix_ + "' has no durable level to copy '" + source.string() + "' to");
        detail::Flusher::Job job;
        job.source = source;
        job.target = target;
        job.needs = std::move(needs);
        job.patience = options_.durable->index_timeout;
        if (done) job.done = [done = std::move(done)](const fs::path&) { done(); };
        flusher_->submit(std::move(job));
    }

    /// Saves `dict` now, then applies retention (with async_save, in the background).
    Path save_state(const Progress& p, ParamDict dict) {
        check_state(dict, p);
        const fs::path file = dir_ / naming_.checkpoint_name(run_prefix_, p, SaveKind::regular);
        if (const auto meta = options_.write_meta ? naming_.meta_name(run_prefix_) : std::string(); !meta.empty()) {
            auto write_meta = [&] {
                detail::write_text_file(dir_ / meta, detail::describe_state(with_append_info(dict, p), run_prefix_));
            };
            if (!meta_written_) {
                try {
                    write_meta();
                } catch (const IoError& e) {  // the run's first save: name what was being saved
                    throw IoError("cannot save checkpoint '" + file.string() + "': writing its run's description '" +
                                      meta + "' failed: " + e.what(),
                                  file.string(), e.error_code());
                }
                meta_written_ = true;
            } else if (boost::system::error_code ec; !fs::exists(dir_ / meta, ec)) {
                // A concurrent run of the prefix (every run in its retention scope) took it with
                // this run's checkpoints. Only a description: a failure here fails no save.
                try {
                    write_meta();
                } catch (const Error& e) {
                    detail::log(LogLevel::warning, std::string("cannot write the meta file again: ") + e.what());
                }
            }
        }
        // the every-th save of the run goes to the durable level, and the end of training's
        const bool copy = flusher_ && (++saves_ % options_.durable->every == 0 || p.event == Event::train_end);
        last_file_ = file;
        last_progress_ = p;
        last_copied_ = copy;
        if (options_.async_save) {
            const auto start = std::chrono::steady_clock::now();
            const bool waited = background_.submit(dict, detail::boost_encoding(A::kind), [this, file, p, copy, restored = restored_](const ParamDict& snap) {
                write(file, p, snap, {prefix_, run_prefix_, {}});
                drop_finished_record();
                if (copy) queue_copy(file, p, restored);
                apply_retention(file, p, restored);
            });
            {
                std::lock_guard lock(numbers_mutex_);
                save_numbers_[file] = background_.submitted();  // only the training thread submits
                if (save_numbers_.size() > 16) {  // forget the oldest finished one, never one in flight
                    auto oldest = save_numbers_.end();
                    for (auto it = save_numbers_.begin(); it != save_numbers_.end(); ++it)
                        if (background_.finished(it->second) && (oldest == save_numbers_.end() || it->second < oldest->second))
                            oldest = it;
                    if (oldest != save_numbers_.end()) save_numbers_.erase(oldest);
                }
            }
            const double blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            ++async_stats_.saves;
            async_stats_.waited += waited;
            async_stats_.blocked_seconds += blocked;
            async_stats_.max_blocked_seconds = std::max(async_stats_.max_blocked_seconds, blocked);
        } else {
            write(file, p, dict, {prefix_, run_prefix_, {}});
            drop_finished_record();
            if (copy) queue_copy(file, p, restored_);
            apply_retention(file, p, restored_);
        }
        last_saved_ = p.global_step;  // only once the save is written (or handed over)
        final_file_.reset();
        save_.saved(p);
        return file;
    }

    /// The newest valid checkpoint of this prefix, across all runs (see latest_checkpoint()).
    /// With a durable level, the newest on either level, the local copy first.
    std::optional<StoredCheckpoint> latest(std::vector<SkippedCheckpoint>* skipped = nullptr) const {
        if (!flusher_) return latest_checkpoint(dir_, prefix_, naming_, skipped, load_options_, options_.on_unreadable);
        auto files = level_checkpoints(nullptr);
        std::optional<StoredCheckpoint> found;
        detail::PassedOver passed(series_text(), options_.on_unreadable, skipped);
        for (auto it = files.rbegin(); it != files.rend() && !found; ++it) {
            if (auto issue = detail::checkpoint_issue(*it)) passed.add(*it, *issue);
            else found = std::move(*it);
        }
        if (auto bp = newer_breakpoint(found, skipped)) {
            detail::log(LogLevel::notice, "the newest state of prefix '" + prefix_ + "' is the exception save '" +
                                              bp->path.string() + "', written after every regular checkpoint");
            return bp;
        }
        if (found) say_if_durable(*found, "the newest checkpoint is");
        if (!found) passed.none_used();
        return found;
    }

    /// CheckpointManager::restore() into views; an object's state_dict() values are copies
    /// (`values_are_copies`).
    std::optional<Restored> restore_into(ParamDict& target, bool strict, std::vector<SkippedCheckpoint>* skipped,
                                         bool values_are_copies, const detail::TargetShaper* shape) const {
        auto files = level_checkpoints(skipped);
        detail::PassedOver passed(series_text(), options_.on_unreadable, skipped);
        std::optional<Restored> done;
        // A load that failed its checksum after writing into the target's memory (a binary
        // body streams straight into it): the tensors an older file then leaves unfilled
        // still hold what the damaged file gave them.
        std::optional<fs::path> damaged_in_place;
        // Loads `f` into the target, verifying its body as it reads it (the lookup read only
        // the header: one pass over the file, not two), or says why it cannot.
        auto load = [&](StoredCheckpoint& f) -> std::optional<detail::CheckpointIssue> {
            try {
                // the owner of an encoded body is read here, with the key (list_checkpoints
                // checked the others)
                if (f.header.encoded())
                    if (auto why = detail::foreign_owner(read_owner(f.path, load_options_), prefix_, f.name))
                        return detail::CheckpointIssue{*why, false};
                done = Restored{f, detail::load_file_into(f.path, target, strict, load_options_, values_are_copies, shape), {}};
                restored_ = f;
                done->finished = finished_at(f);
                if (damaged_in_place && !done->report.param_not_load.empty()) {
                    std::string names;
                    for (const auto& n : done->report.param_not_load) names += (names.empty() ? "'" : ", '") + n + "'";
                    detail::log(LogLevel::warning, "restored '" + f.path.string() + "' after '" +
                                                       damaged_in_place->string() + "' failed its checksum while "
                                                       "loading into the target; " + names + ", which '" +
                                                       f.path.string() + "' does not hold, keep what the damaged "
                                                       "file gave them");
                }
                say_restored(*done);
                return std::nullopt;
            } catch (const ChecksumError& e) {
                damaged_in_place = f.path;
                return detail::CheckpointIssue{e.what(), false};
            } catch (const FormatError& e) {  // damaged, changed since it was listed, or a dtype unknown here
                return detail::CheckpointIssue{e.what(), detail::unsupported_here(e)};
            } catch (const KeyError& e) {
                return detail::CheckpointIssue{e.what(), true};
            } catch (const ConfigError& e) {  // a codec this program lacks
                return detail::CheckpointIssue{e.what(), true};
            } catch (const OutOfMemory& e) {  // this process's shortage, not the file's damage
                return detail::CheckpointIssue{e.what(), true};
            }
        };
        std::optional<fs::path> failed_breakpoint;
        bool breakpoints_looked_at = false;  // what they hold that is damaged is said once
        for (auto it = files.rbegin();; ++it) {
            const bool end = it == files.rend();
            std::optional<detail::CheckpointIssue> issue = end ? std::nullopt : detail::header_issue(*it);
            // Before each regular checkpoint that may be loaded (or once none is left): an
            // exception save written after it is the newer state.
            if (end || !issue) {
                const auto regular = end ? std::nullopt : std::optional<StoredCheckpoint>(*it);
                auto bp = newer_breakpoint(regular, breakpoints_looked_at ? nullptr : skipped);
                breakpoints_looked_at = true;
                if (bp && bp->path != failed_breakpoint) {
                    if (auto failed = load(*bp)) {
                        failed_breakpoint = bp->path;
                        passed.add(*bp, *failed);
                    } else {
                        detail::log(LogLevel::notice, "restored the exception save '" + bp->path.string() +
                                                          "', written after every regular checkpoint of prefix '" +
                                                          prefix_ + "'");
                        return done;
                    }
                }
            }
            if (end) break;
            if (!issue && !(issue = load(*it))) {
                say_if_durable(*it, "restoring");
                return done;
            }
            passed.add(*it, *issue);
        }
        if (files.empty()) {
            detail::warn_unreadable(dir_, prefix_, naming_);
            detail::log(LogLevel::notice, "no checkpoint of prefix '" + prefix_ + "' in '" + dir_.string() +
                                              (flusher_ ? "' nor in '" + durable_dir_.string() : std::string()) +
                                              "': starting from the beginning");
        } else {
            passed.none_used();
            detail::log(LogLevel::notice, "none of the " + std::to_string(passed.passed().size()) + " checkpoint(s) of " +
                                              series_text() + " can be used (OnUnreadable::fall_back): starting from "
                                              "the beginning");
        }
        return std::nullopt;
    }

    /// This run's checkpoints with readable headers, oldest first.
    std::vector<StoredCheckpoint> run_checkpoints(int rank = -1) const {
        return readable_checkpoints(RetentionScope::current_run, rank, list_checkpoints(dir_, prefix_, naming_));
    }

    /// Which runs' files retention manages (ManagerOptions::retention_scope, else the naming
    /// policy's default).
    RetentionScope retention_scope() const noexcept {
        return options_.retention_scope.value_or(default_retention_scope<N>());
    }

    /// The checkpoints retention manages, with readable headers, oldest first by (run,
    /// position): this run's, or every run's of the prefix (see retention_scope()).
    std::vector<StoredCheckpoint> managed_checkpoints(int rank = -1) const {
        return readable_checkpoints(retention_scope(), rank, list_checkpoints(dir_, prefix_, naming_));
    }

    /// Whether the save policy asks for a save at `p` that is not made yet and not dropped
    /// (WhenBusy::skip).
    bool save_due(const Progress& p) {
        if (!save_.should_save(p)) return false;
        if (last_saved_ && *last_saved_ == p.global_step) return false;  // already saved at this step
        if (options_.async_save && options_.when_busy == WhenBusy::skip && p.event != Event::train_end &&
            !background_.buffer_free()) {
            ++async_stats_.skipped;
            detail::log(LogLevel::info, "skipped the checkpoint of global step " + std::to_string(p.global_step) +
                                            ": every snapshot buffer is still being written (the newest holds global step " +
                                            std::to_string(last_saved_.value_or(-1)) + ")");
            return false;
        }
        return true;
    }

private:
    /// Every level's regular checkpoints, oldest first by (run, position); at the same position
    /// the durable copy before the local one, so that a walk from the newest tries the local
    /// copy first.
    std::vector<StoredCheckpoint> level_checkpoints(std::vector<SkippedCheckpoint>* skipped) const {
        auto local = list_checkpoints(dir_, prefix_, naming_, SaveKind::regular, skipped);
        if (!flusher_) return local;
        auto files = list_checkpoints(durable_dir_, prefix_, naming_, SaveKind::regular, skipped);
        files.insert(files.end(), std::make_move_iterator(local.begin()), std::make_move_iterator(local.end()));
        std::stable_sort(files.begin(), files.end(), [](const StoredCheckpoint& a, const StoredCheckpoint& b) {
            return position(a.name) < position(b.name);
        });
        return files;
    }

    /// An exception save written after `regular` (see detail::newer_breakpoint): the local
    /// level's, else the durable level's.
    std::optional<StoredCheckpoint> newer_breakpoint(const std::optional<StoredCheckpoint>& regular,
                                                     std::vector<SkippedCheckpoint>* skipped) const {
        auto bp = detail::newer_breakpoint(dir_, prefix_, naming_, regular, load_options_, skipped);
        if (!bp && flusher_) bp = detail::newer_breakpoint(durable_dir_, prefix_, naming_, regular, load_options_, skipped);
        return bp;
    }

    bool on_durable_level(const fs::path& file) const {
        return flusher_ && file.string().starts_with(durable_dir_.string() + "/");
    }
    bool on_durable_level(const StoredCheckpoint& f) const { return on_durable_level(f.path); }

    /// Says so when `f`, the file taken, is the durable level's: the local level lost it or
    /// holds a damaged copy.
    void say_if_durable(const StoredCheckpoint& f, const std::string& what) const {
        if (!on_durable_level(f)) return;
        boost::system::error_code ec;
        const bool local_gone = !fs::exists(dir_ / f.path.lexically_relative(durable_dir_), ec);
        detail::log(LogLevel::notice, what + " '" + f.path.string() + "', on the durable level: the local level '" +
                                          dir_.string() + "' " +
                                          (local_gone ? "has no copy of it" : "has a copy that does not verify") +
                                          " and nothing newer that verifies");
    }

    /// Creates `dir` when missing, takes the series' lock there (`lock`), and removes the
    /// temporaries crashed writers left: every one of the series once the lock is held (no
    /// other writer of it can be writing them), others only when their writer is gone.
    void prepare_directory(const fs::path& dir, detail::SeriesLock& lock) const {
        create_directory(dir);
        if (options_.lock) lock = detail::SeriesLock(dir, prefix_);
        detail::remove_stale_temporaries(dir, prefix_, [&](std::string_view final_name) {
            return lock.held() && is_series_file(final_name);
        });
    }

    static void create_directory(const fs::path& dir) {
        boost::system::error_code ec;
        fs::create_directories(dir, ec);
        if (ec || !fs::is_directory(dir))
            throw IoError("cannot create checkpoint directory '" + dir.string() + "': " +
                              (ec ? ec.message() : std::string("a file of that name exists")),
                          dir.string(), ec.value());
    }

    /// Whether `name`, in a level's directory, is one of the series' files: a checkpoint, a
    /// run's meta file, or the record that it finished.
    bool is_series_file(std::string_view name) const {
        if (naming_.parse(prefix_, name) || name == detail::finished_file_name(prefix_)) return true;
        constexpr std::string_view meta_tail = "-graph.meta";
        if (!name.ends_with(meta_tail)) return false;
        const std::string run(name.substr(0, name.size() - meta_tail.size()));
        return detail::run_number(prefix_, run) >= 0 && naming_.meta_name(run) == name;
    }

    std::string series_text() const {
        return detail::series_text(dir_, prefix_) + (flusher_ ? " (and '" + durable_dir_.string() + "')" : "");
    }

    /// The record that the series finished, when `f` (just loaded) is the checkpoint it names.
    std::optional<FinishedRecord> finished_at(const StoredCheckpoint& f) const {
        const fs::path& level = on_durable_level(f) ? durable_dir_ : dir_;
        auto record = read_finished(level, prefix_);
        if (!record || (level / record->file).lexically_normal() != fs::path(f.path).lexically_normal() ||
            record->body_hash != f.header.body_hash)
            return std::nullopt;
        return record;
    }

    /// Says which file restore() loaded, at which position, and whether the series finished there.
    void say_restored(const Restored& r) const {
        const auto& f = r.file;
        std::string text = "restored '" + f.path.string() + "': epoch " + std::to_string(f.header.epoch) + ", step " +
                           std::to_string(f.header.step);
        if (!f.name.epoch_in_name && f.name.positioned) text += " (global step " + std::to_string(f.name.global_step) + ")";
        if (r.finished)
            text += "; " + detail::series_text(dir_, prefix_) + " " + detail::finished_text(*r.finished) +
                    ": a loop run to that end again has nothing left to do";
        detail::log(LogLevel::notice, text);
    }

    /// The newest checkpoint of the series, when it holds position `p` (a run that took no
    /// step since it was restored, or since it started).
    std::optional<StoredCheckpoint> newest_at(const Progress& p) const {
        std::optional<StoredCheckpoint> newest = restored_;
        if (!newest) {
            try {
                newest = latest();
            } catch (const Error&) {
                return std::nullopt;
            }
        }
        if (!newest || newest->header.epoch != p.epoch || newest->header.step != p.step ||
            (newest->name.positioned && !newest->name.epoch_in_name && newest->name.global_step != p.global_step))
            return std::nullopt;
        return newest;
    }

    /// Removes the record that the series finished, once a newer checkpoint is durable (a run
    /// that goes on past the end it records). On the writer thread with async_save.
    void drop_finished_record() const {
        if (!drop_finished_.exchange(false)) return;
        for (const fs::path* level : {&dir_, flusher_ ? &durable_dir_ : nullptr}) {
            if (!level) continue;
            boost::system::error_code ec;
            fs::remove(*level / detail::finished_file_name(prefix_), ec);
            if (ec) detail::log(LogLevel::warning, "cannot remove the record that " + detail::series_text(*level, prefix_) +
                                                       " finished: " + ec.message());
        }
    }

    /// The names on every level: the local one's, and the durable one's.
    std::vector<std::string> level_names() const {
        auto names = detail::list_names(dir_, naming_.depth());
        if (flusher_) {
            auto more = detail::list_names(durable_dir_, naming_.depth());
            names.insert(names.end(), more.begin(), more.end());
            std::sort(names.begin(), names.end());
            names.erase(std::unique(names.begin(), names.end()), names.end());
        }
        return names;
    }

    ParamDict with_append_info(ParamDict dict, const Progress& p) const {
        options_.append_info.apply(dict, p);
        return dict;
    }

    /// What a state may not hold: names the manager's own entries use, and names append_info
    /// also sets to another value (one would silently replace the other in the file).
    void check_state(const ParamDict& dict, const Progress& p) const {
        for (const auto& [name, value] : dict)
            if (detail::is_reserved_name(name) && name != detail::share_record_entry)
                throw ConfigError("the state of checkpoint prefix '" + prefix_ + "' holds '" + name +
                                  "': names starting with '__ckpt.' are the manager's own");
        options_.append_info.check_disjoint(dict, p, prefix_);
    }

    // Runs on the background thread with async_save: it reads only members that do not
    // change after construction.
    void write(const fs::path& file, const Progress& p, const ParamDict& state, const CheckpointOwner& owner) const {
        if (naming_.depth() > 0) {
            boost::system::error_code ec;
            fs::create_directories(file.parent_path(), ec);
            if (ec)
                throw IoError("cannot create '" + file.parent_path().string() + "': " + ec.message(),
                              file.parent_path().string(), ec.value());
        }
        SaveOptions opts;
        opts.archive = A::kind;
        opts.epoch = p.epoch;
        opts.step = p.step;
        opts.codecs = codecs_;
        ParamDict stored = with_append_info(state, p);  // the entries are views: nothing is copied
        detail::record_owner(stored, owner);
        for (const auto& name : detail::record_metrics(stored, p.metrics))
            detail::log(LogLevel::notice, "metric '" + name + "' of '" + file.string() +
                                              "' is not finite: not recorded (a checkpoint without it is never the best)");
        save_checkpoint(stored, file, opts);
    }

    /// The order of latest(): by run, then by position in the run.
    static auto position(const NameParts& n) { return std::tie(n.run, n.global_step, n.epoch, n.step); }

    /// Of `all` (the prefix's checkpoints), those in `scope` and of `rank` whose header reads.
    std::vector<StoredCheckpoint> readable_checkpoints(RetentionScope scope, int rank,
                                                       std::vector<StoredCheckpoint> all) const {
        std::vector<StoredCheckpoint> out;
        for (auto& f : all) {
            if (scope == RetentionScope::current_run && f.name.run_prefix != run_prefix_) continue;
            if (f.name.rank >= 0 && rank >= 0 && f.name.rank != rank) continue;  // another rank's to manage
            try {
                f.header = read_header(f.path);
            } catch (const Error& e) {
                detail::log(LogLevel::warning, "retention leaves alone '" + f.path.string() + "': " + e.what());
                continue;
            }
            out.push_back(std::move(f));
        }
        std::stable_sort(out.begin(), out.end(), [](const StoredCheckpoint& a, const StoredCheckpoint& b) {
            return std::tuple_cat(position(a.name), std::tie(a.header.save_time_ns)) <
                   std::tuple_cat(position(b.name), std::tie(b.header.save_time_ns));
        });
        return out;
    }

    // Runs on the writer thread with async_save: besides its arguments it reads only members
    // that do not change after construction. `restored` is what restore() had loaded when the
    // save was asked for. Called only once `just_written` is durable.
    void apply_retention(const fs::path& just_written, const Progress& p,
                         const std::optional<StoredCheckpoint>& restored) const {
        retain(dir_, retention_, just_written, p, restored);
    }

    /// Retention over the checkpoints in `dir` (a level), by `policy`. `incoming`, when given, is
    /// `just_written` before it is there (its header and metrics those of the file to be copied
    /// there): retention as it will be once it is, to make room for it.
    template <RetentionPolicy Policy>
    void retain(const fs::path& dir, const Policy& policy, const fs::path& just_written, const Progress& p,
                const std::optional<StoredCheckpoint>& restored, const StoredCheckpoint* incoming = nullptr) const {
        const auto all = list_checkpoints(dir, prefix_, naming_);
        auto files = readable_checkpoints(retention_scope(), p.rank, all);
        if (detail::ranks_by_metrics(policy))
            for (auto& f : files) f.metrics = memory_.metrics_of(f, load_options_);
        if (incoming) {
            files.push_back(*incoming);
            std::stable_sort(files.begin(), files.end(), [](const StoredCheckpoint& a, const StoredCheckpoint& b) {
                return std::tuple_cat(position(a.name), std::tie(a.header.save_time_ns)) <
                       std::tuple_cat(position(b.name), std::tie(b.header.save_time_ns));
            });
        }
        const auto it = std::find_if(files.begin(), files.end(),
                                     [&](const StoredCheckpoint& f) { return f.path == just_written; });
        if (it == files.end()) return;
        const auto w = static_cast<std::size_t>(it - files.begin());
        std::vector<bool> keep(files.size(), false);
        // The newest checkpoint that verifies: the file just written, unless files sort after
        // it (a rollback, a concurrent later run); then the newest of those that verifies.
        for (std::size_t j = files.size(); j-- > w + 1;)
            if (!checkpoint_problem(files[j])) {
                keep[j] = true;
                break;
            }
        // The file restore() loaded, until the file just written is newer.
        if (restored && position(files[w].name) <= position(restored->name))
            for (std::size_t j = 0; j < files.size(); ++j) keep[j] = keep[j] || files[j].path == restored->path;
        // Files still to be copied to the durable level.
        if (flusher_ && dir == dir_)
            for (std::size_t j = 0; j < files.size(); ++j) keep[j] = keep[j] || flusher_->pinned(files[j].path);
        // The file a committed global index names, on either level (pin()).
        for (std::size_t j = 0; j < files.size(); ++j) keep[j] = keep[j] || memory_.pinned(files[j].path, dir);
        // The file just written goes last whatever its name says; it is never deleted.
        std::rotate(files.begin() + static_cast<std::ptrdiff_t>(w), files.begin() + static_cast<std::ptrdiff_t>(w) + 1,
                    files.end());
        keep.erase(keep.begin() + static_cast<std::ptrdiff_t>(w));
        keep.push_back(true);
        std::vector<const StoredCheckpoint*> doomed;
        for (std::size_t i : policy.to_delete(std::span<const StoredCheckpoint>(files)))
            if (i < files.size() && !keep[i]) {
                keep[i] = true;  // a policy may name a file twice
                if (memory_.may_delete(files[i], load_options_)) doomed.push_back(&files[i]);
            }
        detail::remove_meta_of_emptied_runs(dir, naming_, run_prefix_, doomed, all);
        for (const StoredCheckpoint* f : doomed) {
            boost::system::error_code ec;
            // the local level's in the background (see detail/unlinker.hpp); the durable level's
            // now, as a copy may be waiting for the room
            if (dir == dir_) unlinker_.remove(f->path, ec);
            else fs::remove(f->path, ec);
            if (ec)
                detail::log(LogLevel::warning,
                            "retention could not delete '" + f->path.string() + "': " + ec.message());
            else
                detail::log(LogLevel::info, "retention deleted '" + f->path.string() + "'");
            memory_.forget(f->path);
        }
    }

    /// Queues the copy of `file` (just written, durable) to the durable level; once it is in
    /// place, the durable level's retention runs and the run's meta file follows it there.
    /// `restored` is kept there as on the local level.
    void queue_copy(const fs::path& file, const Progress& p, const std::optional<StoredCheckpoint>& restored) const {
        detail::Flusher::Job job;
        job.source = file;
        job.target = durable_dir_ / file.lexically_relative(dir_);
        // a copy that would not fit first deletes what the durable level's retention deletes
        // once it is there
        job.make_room = [this, file, target = job.target, p, restored] {
            auto parts = naming_.parse(prefix_, target.lexically_relative(durable_dir_).generic_string());
            if (!parts) return;
            StoredCheckpoint incoming{Path(file), std::move(*parts), {}};
            incoming.header = read_header(file);
            incoming.owner = OwnerRecord::matches;
            if (detail::ranks_by_metrics(options_.durable->retention)) incoming.metrics = memory_.metrics_of(incoming, load_options_);
            incoming.path = target;
            detail::log(LogLevel::info, "making room on the durable level for '" + target.string() + "'");
            retain(durable_dir_, options_.durable->retention, target, p, restored, &incoming);
        };
        job.done = [this, p, restored](const fs::path& copied) {
            retain(durable_dir_, options_.durable->retention, copied, p, restored);
            const auto meta = options_.write_meta ? naming_.meta_name(run_prefix_) : std::string();
            if (boost::system::error_code ec; !meta.empty() && !fs::exists(durable_dir_ / meta, ec) && fs::exists(dir_ / meta, ec)) {
                detail::Pacer unpaced(0);
                detail::copy_file_checked(dir_ / meta, durable_dir_ / meta, false, unpaced);
            }
        };
        flusher_->submit(std::move(job));
    }

    fs::path dir_;
    std::string prefix_;
    // the series' locks, on each level; released after the copier and the writer are drained
    detail::SeriesLock lock_, durable_lock_;
    S save_;
    R retention_;
    N naming_;
    ManagerOptions options_;
    CodecChain codecs_;
    LoadOptions load_options_;  // the codec's key, for restore()
    std::string run_prefix_;
    std::string breakpoint_prefix_;
    std::optional<std::int64_t> last_saved_;
    bool stepped_ = false;                   // on_step or on_epoch_end called: the state changed
    std::optional<fs::path> final_file_;     // the checkpoint that holds the end, when this run saved none
    mutable std::atomic<bool> drop_finished_{false};  // a record that the series finished is to go
    bool meta_written_ = false;
    // What restore() last loaded; read on the training thread only (a save hands a copy to
    // its retention).
    mutable std::optional<StoredCheckpoint> restored_;
    AsyncSaveStats async_stats_;
    fs::path durable_dir_;                      // with ManagerOptions::durable
    std::int64_t saves_ = 0;                    // regular saves of this run (DurableLevel::every)
    std::optional<fs::path> last_file_;         // the newest regular save, its position, whether it is copied
    Progress last_progress_;
    bool last_copied_ = false;
    // what retention reads once and remembers, and the file a global index pinned
    mutable RetentionMemory memory_{prefix_};
    // frees the local level's files retention deletes; drained after the writer and the copier
    mutable detail::Unlinker unlinker_;
    // The copier, then the writer, last: drained before the members their jobs read (the writer
    // queues copies, so it is drained first).
    std::unique_ptr<detail::Flusher> flusher_;
    detail::BackgroundSaver background_{options_.async_buffers};
    // the number of each recent async save, by file, for durable() and wait_for() (which other
    // threads may call)
    mutable std::mutex numbers_mutex_;
    std::map<fs::path, std::int64_t> save_numbers_;

    std::optional<std::int64_t> save_number(const fs::path& file) const {
        std::lock_guard lock(numbers_mutex_);
        const auto it = save_numbers_.find(file);
        return it == save_numbers_.end() ? std::nullopt : std::optional<std::int64_t>(it->second);
    }
};

}  // namespace detail

}  // namespace ckpt
