#pragma once
// CheckpointManager: periodic checkpoints from any loop, with policies chosen at compile time.
//
//   ckpt::CheckpointManager mgr("ckpts", "heat", ckpt::EverySteps{100}, ckpt::KeepLast{3});
//   if (auto r = mgr.restore(state)) start = r->file.name.step + 1;   // resume if possible
//   for (...) { ...; mgr.on_step(ckpt::Progress::at_iteration(i), state); }
//
// Policies (each a concept in its own header, with its members):
//   SavePolicy S       when to save                  default EveryEpochs{1}
//   RetentionPolicy R  which older files to delete   default KeepLast{5}
//   NamingPolicy N     file names, runs, meta file   default MindSporeNaming
//   ArchivePolicy A    body archive                  default BinaryArchive
//   CodecPolicy C      compression, encryption       default NoCodec (codecs/codec.hpp)
//
// Retention runs after each save is durable, over the retention scope: the current run's
// files or every run's of the prefix (ManagerOptions::retention_scope, by default the naming
// policy's). It never deletes the file just written, the newest checkpoint that verifies, or
// the file restore() loaded until a newer checkpoint is durable; a run's meta file goes with
// its last checkpoint. Nothing is deleted when a save fails.
//
// A state is a ParamDict, a callable returning one (called only when saving), or an object
// with `ParamDict state_dict()` returning views of its tensors.

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "detail/manager_core.hpp"
#include "manager_options.hpp"

namespace ckpt {

/// Periodic checkpoints from any loop: on_step(), on_epoch_end() and on_train_end() save when
/// the save policy says so, retention prunes older files once a save is durable, and restore()
/// loads the newest checkpoint that verifies into the state. The policies are template
/// parameters (by default EveryEpochs, KeepLast, MindSporeNaming, BinaryArchive, NoCodec); a
/// state is a ParamDict, a callable returning one, or an object with state_dict(). Movable: it can be returned
/// from a factory and kept in a std::optional or a std::vector; saves in flight carry on.
/// A moved-from manager may only be destroyed or assigned to.
///
/// Its templates on the state only collect it and call the members that do not depend on its
/// type, which are defined outside the class: with CKPT_SEPARATE_COMPILATION, the library
/// compiles them once for the usual policies (impl/manager_instances.ipp).
template <SavePolicy S = EveryEpochs, RetentionPolicy R = KeepLast, NamingPolicy N = MindSporeNaming,
          ArchivePolicy A = BinaryArchive, CodecPolicy C = NoCodec>
class CheckpointManager {
    using Core = detail::ManagerCore<S, R, N, A, C>;

public:
    using save_policy = S;
    using retention_policy = R;
    using naming_policy = N;
    using archive_policy = A;
    using codec_policy = C;

    /// Creates `directory` if needed, removes temporaries that crashed writers left for this
    /// prefix, and picks this run's prefix (see the naming policy). `codec`'s chain is checked
    /// here (a missing key or codec fails now, not at the first save); its key, if any, also
    /// decrypts what restore() loads.
    /// @throws ConfigError an invalid prefix, options (async_buffers 0; a durable level
    ///         without a directory, or the checkpoint directory itself) or codec chain (a codec
    ///         not compiled in, encryption not last)
    /// @throws KeyError the codec encrypts without a key
    /// @throws SeriesLocked another writer holds the series (ManagerOptions::lock)
    /// @throws IoError a level's directory cannot be created, or its lock file opened
    CheckpointManager(PathArg directory, std::string prefix, S save = S{}, R retention = R{}, N naming = N{},
                      ManagerOptions options = {}, C codec = C{});
    CheckpointManager(CheckpointManager&&) noexcept;
    /// Waits for the saves in flight of the manager assigned over.
    CheckpointManager& operator=(CheckpointManager&&) noexcept;
    /// Waits for the saves in flight.
    ~CheckpointManager();

    const fs::path& directory() const noexcept;
    const std::string& prefix() const noexcept;
    /// The prefix this run's files use: the prefix, or "{prefix}_{N}" when earlier runs exist.
    const std::string& run_prefix() const noexcept;
    const ManagerOptions& options() const noexcept;
    /// How this manager's files are read back (the codec's key, if any).
    const LoadOptions& load_options() const noexcept;
    RetentionScope retention_scope() const noexcept;

    /// Call after each step; saves when the save policy says so. Returns the file written;
    /// with async_save, the file being written: it is durable once wait() (or on_train_end)
    /// returns, and a failure to write it is rethrown, naming it, by wait() or the next call.
    template <class State>
    std::optional<Path> on_step(Progress p, State&& state) {
        if (!due_at(p, Event::step_end)) return std::nullopt;
        return save_state(p, detail::collect_state(state));
    }
    template <class State>
    std::optional<Path> on_epoch_end(Progress p, State&& state) {
        if (!due_at(p, Event::epoch_end)) return std::nullopt;
        return save_state(p, detail::collect_state(state));
    }
    /// Saves the final step unless it is saved already (every save policy but Never), waits
    /// for every background save to be durable, then records that the series finished there
    /// ("{prefix}.finished": the final checkpoint, its position and `arguments`, what the loop
    /// was given, such as "epochs=10"). Saved already: by this run, or by the checkpoint a run
    /// that took no step started from, which is how a finished job run again ends with nothing
    /// saved and nothing deleted.
    template <class State>
    std::optional<Path> on_train_end(Progress p, State&& state, std::string_view arguments = {}) {
        std::optional<Path> file;
        if (due_at_train_end(p)) file = save_state(p, detail::collect_state(state));
        wait_flushed();
        record_finished(p, arguments);
        return file;
    }
    /// Blocks until every background save in flight is durable, and the files retention deleted
    /// (gone from the directory when it returned, freed by a thread of the manager's) are
    /// freed; rethrows the first error.
    void wait();
    /// With async_save: saves handed over, waited for and skipped, and the training thread's cost.
    AsyncSaveStats async_stats() const;
    /// With a durable level: waits for the saves in flight, then for every copy queued so far
    /// (the newest checkpoint's among them, queued now if no copy was due at its step).
    /// Throws IoError when the newest checkpoint's copy failed. on_train_end() calls it.
    /// Without one: wait().
    FlushStats wait_flushed();
    /// With a durable level: what its copies did so far.
    FlushStats flush_stats() const;
    /// The durable level's directory, or null without one.
    const fs::path* durable_directory() const noexcept;
    /// Whether `file`, the newest save, is being copied to the durable level (DurableLevel::every).
    bool copies_to_durable(const PathArg& file) const;
    /// Queues the copy of `source` to `target` on the durable level, checked like a checkpoint's,
    /// once every file of `needs` exists (given up after DurableLevel::index_timeout); `done`
    /// runs on the copier's thread once it is in place. For a step's global index, which may be
    /// copied only once every rank's file is there (fault::GlobalIndexer).
    void queue_durable_copy(const PathArg& source, const PathArg& target, std::vector<Path> needs = {},
                            std::function<void()> done = {}) const;
    /// Retention on either level keeps `file` (one of this manager's, under its directory; its
    /// copy on the durable level) until the next pin() names another: the file of this rank
    /// that the newest committed global index names, so that a rank's newer save does not
    /// break the one whole index before the next is committed (fault::index_saved_checkpoint
    /// pins each rank's).
    void pin(const PathArg& file);
    /// Retention on either level also keeps `file` until pin() names it or release() lets it
    /// go: a file whose global index is yet to be committed (fault::IndexCommitter holds each
    /// rank's while its index waits for the others).
    void hold(const PathArg& file);
    void release(const PathArg& file);
    /// Whether the save of `file` (a path on_step() or save() returned) is durable, its
    /// retention done; never blocks. Always, after a synchronous save. A failed save counts
    /// as done: wait_for() says what it failed with.
    bool durable(const PathArg& file) const;
    /// With async_save: blocks until the save of `file` is durable, not the saves handed over
    /// after it, and rethrows what it failed with (which the training thread's next call
    /// rethrows too). Any thread may call it while the manager lives. Returns at once after a
    /// synchronous save.
    void wait_for(const PathArg& file);
    /// Call when the loop fails: with exception_save on, writes "…_breakpoint.ckpt".
    template <class State>
    std::optional<Path> on_exception(const Progress& p, State&& state) {
        if (!options().exception_save) return std::nullopt;
        return save_exception(p, detail::collect_state(state));
    }
    /// Saves now, whatever the save policy says, then applies retention. With async_save the
    /// file is written in the background: the returned path is where it will be once wait()
    /// (or the next save) returns.
    /// @throws ConfigError the state holds a name starting with "__ckpt." (but the share record
    ///         "__ckpt.share" of a replica-parallel save), or one append_info sets to another
    ///         value, or what the archive cannot hold; a metric has no name
    /// @throws IoError the file (or the run's meta file) cannot be written
    /// @throws Error with async_save: what an earlier background save failed with, naming its file
    template <class State>
    Path save(const Progress& p, State&& state) {
        check_background();
        return save_state(p, detail::collect_state(state));
    }
    /// The newest valid checkpoint of this prefix, across all runs (see latest_checkpoint()).
    std::optional<StoredCheckpoint> latest(std::vector<SkippedCheckpoint>* skipped = nullptr) const;
    /// Loads the newest valid checkpoint into `target` (a ParamDict of views or an object with
    /// state_dict()), falling back to older files when one turns out corrupt. Nothing when
    /// no checkpoint loads. Strict by default: a checkpoint that does not fit the target
    /// throws LoadMismatch rather than resuming half a model. Retention keeps the file loaded
    /// until this manager has saved a newer one.
    /// A target that shapes itself after the file (ShapedByCheckpoint) is asked for views of
    /// each file tried, and its loaded() runs once one has loaded.
    /// @throws LoadMismatch strict, and the newest usable checkpoint does not fit the target
    ///         (not passed over for an older one)
    /// @throws UnreadableCheckpoints under OnUnreadable::refuse (ManagerOptions::on_unreadable):
    ///         the newest checkpoint cannot be read by this program, or checkpoints exist and
    ///         none can be used
    /// @throws IoError the directory cannot be listed, or a verified file cannot be read
    template <class Target>
    std::optional<Restored> restore(Target& target, bool strict = true,
                                    std::vector<SkippedCheckpoint>* skipped = nullptr) const {
        if constexpr (ShapedByCheckpoint<Target>) {
            ParamDict views;
            const auto shape = detail::shaper_of(target);
            auto done = restore_into(views, strict, skipped, false, &shape);
            if (done) detail::naming_source("'" + done->file.path.string() + "'", [&] { target.loaded(done->report); });
            return done;
        } else if constexpr (HasStateDict<Target>) {
            ParamDict views = target.state_dict();
            return restore_into(views, strict, skipped, true, nullptr);
        } else {
            static_assert(std::is_convertible_v<Target&, ParamDict&>,
                          "restore() loads into a ckpt::ParamDict of views or an object with `ckpt::ParamDict state_dict()`");
            return restore_into(static_cast<ParamDict&>(target), strict, skipped, false, nullptr);
        }
    }
    /// This run's checkpoints with readable headers, oldest first.
    std::vector<StoredCheckpoint> run_checkpoints(int rank = -1) const;
    /// The checkpoints retention manages (its scope), with readable headers, oldest first.
    std::vector<StoredCheckpoint> managed_checkpoints(int rank = -1) const;

private:
    bool due_at(Progress& p, Event e);
    bool due_at_train_end(Progress& p);
    void record_finished(const Progress& p, std::string_view arguments);
    void check_background();
    Path save_state(const Progress& p, ParamDict dict);
    Path save_exception(const Progress& p, ParamDict dict);
    std::optional<Restored> restore_into(ParamDict& target, bool strict, std::vector<SkippedCheckpoint>* skipped,
                                         bool values_are_copies, const detail::TargetShaper* shape) const;

    std::unique_ptr<Core> core_;
};


template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
CheckpointManager<S, R, N, A, C>::CheckpointManager(PathArg directory, std::string prefix, S save, R retention,
                                                    N naming, ManagerOptions options, C codec)
    : core_(std::make_unique<Core>(std::move(directory), std::move(prefix), std::move(save), std::move(retention),
                                   std::move(naming), std::move(options), std::move(codec))) {}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
CheckpointManager<S, R, N, A, C>::CheckpointManager(CheckpointManager&&) noexcept = default;

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
CheckpointManager<S, R, N, A, C>& CheckpointManager<S, R, N, A, C>::operator=(CheckpointManager&&) noexcept = default;

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
CheckpointManager<S, R, N, A, C>::~CheckpointManager() = default;

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
const fs::path& CheckpointManager<S, R, N, A, C>::directory() const noexcept { return core_->directory(); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
const std::string& CheckpointManager<S, R, N, A, C>::prefix() const noexcept { return core_->prefix(); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
const std::string& CheckpointManager<S, R, N, A, C>::run_prefix() const noexcept { return core_->run_prefix(); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
const ManagerOptions& CheckpointManager<S, R, N, A, C>::options() const noexcept { return core_->options(); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
const LoadOptions& CheckpointManager<S, R, N, A, C>::load_options() const noexcept {
    return core_->load_options();
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
RetentionScope CheckpointManager<S, R, N, A, C>::retention_scope() const noexcept {
    return core_->retention_scope();
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
void CheckpointManager<S, R, N, A, C>::wait() { core_->wait(); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
AsyncSaveStats CheckpointManager<S, R, N, A, C>::async_stats() const { return core_->async_stats(); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
FlushStats CheckpointManager<S, R, N, A, C>::wait_flushed() { return core_->wait_flushed(); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
FlushStats CheckpointManager<S, R, N, A, C>::flush_stats() const { return core_->flush_stats(); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
const fs::path* CheckpointManager<S, R, N, A, C>::durable_directory() const noexcept {
    return core_->durable_directory();
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
bool CheckpointManager<S, R, N, A, C>::copies_to_durable(const PathArg& file) const {
    return core_->copies_to_durable(file);
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
void CheckpointManager<S, R, N, A, C>::queue_durable_copy(const PathArg& source, const PathArg& target,
                                                          std::vector<Path> needs, std::function<void()> done) const {
    core_->queue_durable_copy(source, target, std::vector<fs::path>(needs.begin(), needs.end()), std::move(done));
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
std::optional<StoredCheckpoint> CheckpointManager<S, R, N, A, C>::latest(
    std::vector<SkippedCheckpoint>* skipped) const {
    return core_->latest(skipped);
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
std::vector<StoredCheckpoint> CheckpointManager<S, R, N, A, C>::run_checkpoints(int rank) const {
    return core_->run_checkpoints(rank);
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
std::vector<StoredCheckpoint> CheckpointManager<S, R, N, A, C>::managed_checkpoints(int rank) const {
    return core_->managed_checkpoints(rank);
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
bool CheckpointManager<S, R, N, A, C>::due_at(Progress& p, Event e) { return core_->due_at(p, e); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
bool CheckpointManager<S, R, N, A, C>::due_at_train_end(Progress& p) { return core_->due_at_train_end(p); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
void CheckpointManager<S, R, N, A, C>::pin(const PathArg& file) {
    core_->pin(file);
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
void CheckpointManager<S, R, N, A, C>::hold(const PathArg& file) {
    core_->hold(file);
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
void CheckpointManager<S, R, N, A, C>::release(const PathArg& file) {
    core_->release(file);
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
bool CheckpointManager<S, R, N, A, C>::durable(const PathArg& file) const {
    return core_->durable(file);
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
void CheckpointManager<S, R, N, A, C>::wait_for(const PathArg& file) {
    core_->wait_for(file);
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
void CheckpointManager<S, R, N, A, C>::record_finished(const Progress& p, std::string_view arguments) {
    core_->record_finished(p, arguments);
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
void CheckpointManager<S, R, N, A, C>::check_background() { core_->check_background(); }

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
Path CheckpointManager<S, R, N, A, C>::save_state(const Progress& p, ParamDict dict) {
    return core_->save_state(p, std::move(dict));
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
Path CheckpointManager<S, R, N, A, C>::save_exception(const Progress& p, ParamDict dict) {
    return core_->save_exception(p, std::move(dict));
}

template <SavePolicy S, RetentionPolicy R, NamingPolicy N, ArchivePolicy A, CodecPolicy C>
std::optional<Restored> CheckpointManager<S, R, N, A, C>::restore_into(ParamDict& target, bool strict,
                                                                       std::vector<SkippedCheckpoint>* skipped,
                                                                       bool values_are_copies,
                                                                       const detail::TargetShaper* shape) const {
    return core_->restore_into(target, strict, skipped, values_are_copies, shape);
}

}  // namespace ckpt

#ifdef CKPT_SEPARATE_COMPILATION
#define CKPT_INSTANCE extern
#include "impl/manager_instances.ipp"
#undef CKPT_INSTANCE
#endif
