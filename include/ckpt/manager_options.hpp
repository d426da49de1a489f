#pragma once
// What a CheckpointManager is configured with and what it reports: ManagerOptions (async
// saves, the durable level, the series' lock, what to do with unreadable files), the
// statistics of async saves, and Restored, what restore() loaded. Included by manager.hpp.

#include <boost/filesystem.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "append_info.hpp"
#include "checkpoint.hpp"
#include "latest.hpp"
#include "policies/retention.hpp"
#include "series.hpp"

namespace ckpt {

/// What an async save the policy asks for does while every snapshot buffer is in flight.
enum class WhenBusy {
    wait,  ///< wait for the oldest save in flight to be durable: no save is lost
    skip,  ///< drop this save (logged, counted in AsyncSaveStats::skipped): training never waits
};

/// What async saving cost the training thread, and what it left out.
struct AsyncSaveStats {
    std::int64_t saves = 0;          ///< handed to the background writer
    std::int64_t waited = 0;         ///< of those, saves that first waited for a free buffer
    std::int64_t skipped = 0;        ///< policy saves dropped under WhenBusy::skip
    double blocked_seconds = 0;      ///< training-thread time in async saves: waiting, then the snapshot
    double max_blocked_seconds = 0;  ///< the longest single one
    std::int64_t written = 0;        ///< of the saves handed over, those finished (failed ones included)
    double write_seconds = 0;        ///< writer-thread time persisting those
    double max_write_seconds = 0;    ///< the longest single one: keep the save interval above it
};

/// The durable level of a two-level manager (ManagerOptions::durable). The manager writes
/// each checkpoint to its own directory, the fast level (a node-local disk), and a thread of
/// its own copies them to `directory`, the durable level (a shared file system), where the
/// level's own `retention` keeps them. Saving never waits for a copy; the local level's
/// retention keeps every file until its copy is done. A copy is checked against the file's
/// checksum before it is renamed into place, so a process killed mid-copy leaves nothing
/// that latest() or restore() would take. restore() and latest() look at both levels and
/// take the newest checkpoint that verifies, the local copy first; when the local level is
/// gone or damaged they take the durable one and say so.
struct DurableLevel {
    Path directory;                       ///< created when missing
    AnyRetention retention = KeepLast{};  ///< this level's own; KeepUnion{KeepLast{20}, KeepOnePerMinutes{60}}
    /// Copy every `every`-th checkpoint of the run (the first copied is the `every`-th); the
    /// end of training's and exception saves are always copied.
    std::int64_t every = 1;
    /// Pace the copies to this many bytes per second, so that they leave the shared file
    /// system's bandwidth to others; 0: as fast as they go.
    double max_bytes_per_second = 0;
    /// How long the copy of a global index waits for the files it names (the other ranks'
    /// copies) to reach the durable level before it is given up (fault::GlobalIndexer),
    /// counted from when this rank's copier has nothing else before it to copy.
    std::chrono::milliseconds index_timeout = std::chrono::minutes(2);
};

/// What a CheckpointManager does besides its policies (the constructor's sixth argument): values
/// added to every file, exception, async and signal saves, the retention scope, a durable second
/// level, the series' lock, and what restore() does with checkpoints it cannot read.
struct ManagerOptions {
    AppendInfo append_info;       ///< values added to every checkpoint (the seed's append_info)
    bool exception_save = false;  ///< on_exception() writes a "_breakpoint" checkpoint
    bool write_meta = true;       ///< write "{run prefix}-graph.meta" at the run's first save
    /// Snapshot the state and write it on a background thread (the seed's async_save): the
    /// training thread only copies the state into a reused buffer. A background error is
    /// rethrown by the next call into the manager; on_train_end() waits for the last save.
    bool async_save = false;
    /// Snapshot buffers, so also the most saves in flight at once (memory: this many copies
    /// of the state).
    std::size_t async_buffers = 1;
    /// What a policy save does when every buffer is still being written. Explicit save(),
    /// on_train_end() and preemption always wait.
    WhenBusy when_busy = WhenBusy::wait;
    /// With TerminationSignals installed: once a signal arrived, the step in progress ends,
    /// is saved (waiting for the save to be durable) and training stops with Preempted
    /// (nn::ModelCheckpoint acts on it).
    bool save_on_signal = false;
    /// Which runs' files retention manages: the current run's, or every run's of the prefix
    /// (a bound across restarts). Unset: the naming policy's default (MindSporeNaming: the
    /// current run, StepNaming: every run).
    std::optional<RetentionScope> retention_scope;
    /// Set: checkpoints are copied in the background to a second, durable directory (see
    /// DurableLevel); restore() and latest() look at both.
    std::optional<DurableLevel> durable;
    /// What restore() and latest() do when the newest checkpoints cannot be used: refuse
    /// (UnreadableCheckpoints) when this program cannot read the newest, or when none of those
    /// found can be used; or fall back to an older one, or to none (see OnUnreadable).
    OnUnreadable on_unreadable = OnUnreadable::refuse;
    /// Hold the series' lock ("{prefix}.lock" in each level's directory) for the manager's
    /// lifetime, so that a second writer of the series is refused (SeriesLocked). false: no
    /// lock, for a file system whose flock misbehaves; one job per series is then yours to
    /// ensure, as on a file system without flock (docs/ROBUSTNESS.md).
    bool lock = true;
};

/// A checkpoint restore() loaded: which file, and what the load reported (report.rest holds
/// the values that were not loaded into the target, such as epoch_num and step_num).
struct Restored {
    StoredCheckpoint file;
    LoadReport report;
    /// Set when the file is the final checkpoint of a series that finished (on_train_end): a
    /// loop that runs to the same end has nothing left to do, and one that runs further goes on.
    std::optional<FinishedRecord> finished;
};

}  // namespace ckpt
