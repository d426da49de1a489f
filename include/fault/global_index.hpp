#pragma once
// The global index of a saved step (ckpt/reshard.hpp), committed by every rank together:
// each rank saves its own file, durably, then calls
//
//   fault::commit_global_index(comm, dir, global_step, my_file, dp.piece_map());
//
// Each rank describes its file (its pieces' places, file offsets and chunk checksums); the
// descriptions are gathered (an allgather) and the lowest rank writes {dir}/index-step_{g}.ckpt
// atomically and durably; the ranks then meet at a barrier, so that on return every rank
// knows the index is in place. A rank lost before the index is written leaves no index of
// that step (its files alone), never a partial one.
//
// GlobalIndexer does this after every save of a per-rank nn::ModelCheckpoint, and removes
// the indexes whose files the retention policy deleted; latest_global_index() finds the
// newest step whose index and files are all there.

#include <boost/filesystem.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../ckpt/checkpoint.hpp"
#include "../ckpt/latest.hpp"
#include "../ckpt/log.hpp"
#include "../ckpt/reshard.hpp"
#include "../nn/callbacks.hpp"
#include "communicator.hpp"
#include "memory_level.hpp"

namespace fault {

/// Where the global index of `global_step` lives in `dir`.
inline boost::filesystem::path global_index_path(const ckpt::PathArg& dir, std::int64_t global_step) {
    return dir / ("index-step_" + std::to_string(global_step) + ".ckpt");
}

namespace detail {

/// The index packed in `words` (PackedState::pack of ckpt::index_to_dict), as another rank
/// sent it; `what` names it in errors.
inline ckpt::GlobalIndex index_from_words(std::span<const float> words, const std::string& what) {
    PackedState packed;
    const std::span<float> to = packed.receive_buffer(words.size() * sizeof(float));
    std::copy(words.begin(), words.end(), to.begin());
    packed.received();
    return ckpt::index_from_dict(packed.unpack(what), what);
}

}  // namespace detail

/// This rank's part of the global index: describe_checkpoint() of `my_file`, named relative to
/// `dir`, which it must lie under. Reads the file once.
inline ckpt::GlobalIndex describe_rank_file(const ckpt::PathArg& dir, const ckpt::PathArg& my_file, int rank,
                                            const ckpt::PieceMap& places = {}, std::uint64_t chunk_bytes = 1u << 20,
                                            const ckpt::LoadOptions& opts = {}) {
    const auto relative = boost::filesystem::relative(my_file, dir);
    if (relative.empty() || *relative.begin() == "..")
        throw ckpt::ConfigError("global index: '" + my_file.string() + "' is not under '" + dir.string() + "'");
    return ckpt::describe_checkpoint(my_file, relative.generic_string(), rank, places, chunk_bytes, opts);
}

/// Writes the global index of `global_step` ({dir}/index-step_{g}.ckpt) once every rank has
/// saved its own file: each rank describes its file (pieces, file offsets, chunk checksums),
/// the descriptions are gathered, the lowest rank writes the index atomically and durably, and
/// the ranks meet at a barrier, so that on return the index is in place. A rank lost before
/// then leaves no index of the step. `mine` is this rank's file described (describe_rank_file();
/// the overload below describes it). Returns the index's path. A collective.
template <Communicator Comm>
boost::filesystem::path commit_global_index(Comm& comm, const ckpt::PathArg& dir, std::int64_t global_step,
                                            const ckpt::GlobalIndex& mine);

namespace detail {

/// The global index of `global_step` from every rank's description (`mine`, this rank's),
/// built and checked on every rank alike: commit_global_index() without the write. A collective.
template <Communicator Comm>
ckpt::GlobalIndex gather_global_index(Comm& comm, const ckpt::PathArg& dir, std::int64_t global_step,
                                      const ckpt::GlobalIndex& mine) {
    // every description to every rank by allgather, not by sends to rank 0: a collective fails
    // at once when a rank dies, as the training's own calls do, where a send already queued
    // to a dead peer may wait for its timeout (see GlooComm)
    PackedState packed;
    packed.pack(ckpt::index_to_dict(mine), global_step);
    struct Words {
        std::uint64_t n;
    };
    const auto sizes = detail::allgather_records(comm, Words{packed.words().size()});
    std::uint64_t most = 0;
    for (const Words& w : sizes) most = std::max(most, w.n);
    std::vector<float> in(static_cast<std::size_t>(most)), all(static_cast<std::size_t>(most) * sizes.size());
    std::copy(packed.words().begin(), packed.words().end(), in.begin());
    comm.allgather(std::span<const float>(in), std::span<float>(all));
    // every rank builds the index and checks it, so that a step whose pieces do not fit
    // together fails on every rank alike, and nothing is written
    std::vector<ckpt::GlobalIndex> described(static_cast<std::size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) {
        const auto at = static_cast<std::size_t>(r);
        if (r == comm.rank()) {
            described[at] = mine;
            continue;
        }
        const std::string what = "global index: rank " + std::to_string(r) + "'s description of step " +
                                 std::to_string(global_step);
        described[at] = detail::index_from_words(
            std::span<const float>(all).subspan(static_cast<std::size_t>(at * most), static_cast<std::size_t>(sizes[at].n)),
            what);
        if (described[at].chunk_bytes != mine.chunk_bytes)
            throw ckpt::ConfigError(what + " uses chunks of " + std::to_string(described[at].chunk_bytes) + " bytes, rank " +
                                    std::to_string(comm.rank()) + "'s " + std::to_string(mine.chunk_bytes));
    }
    ckpt::GlobalIndex index = std::move(described[0]);
    index.global_step = global_step;
    index.world_size = comm.size();
    for (std::size_t r = 1; r < described.size(); ++r) {
        const ckpt::GlobalIndex& theirs = described[r];
        index.pieces.insert(index.pieces.end(), theirs.pieces.begin(), theirs.pieces.end());
        // a value of theirs that is not the lowest rank's: a load checks whether it may differ
        for (const auto& [name, value] : theirs.values)
            if (!index.values.contains(name) || !(index.values.at(name) == value))
                index.rank_values[static_cast<std::int64_t>(r)].set(name, value);
        for (const auto& [name, copies] : theirs.copies) index.copies.emplace(name, copies);
    }
    ckpt::detail::check_pieces_fit(index, "global index of step " + std::to_string(global_step) + " in '" + dir.string() + "'");
    return index;
}

/// Writes `index` to `path`, atomically and durably.
inline void write_global_index(const ckpt::GlobalIndex& index, const boost::filesystem::path& path) {
    ckpt::SaveOptions save;
    save.step = index.global_step;
    ckpt::save_checkpoint(ckpt::index_to_dict(index), path, save);
}

}  // namespace detail

template <Communicator Comm>
boost::filesystem::path commit_global_index(Comm& comm, const ckpt::PathArg& dir, std::int64_t global_step,
                                            const ckpt::GlobalIndex& mine) {
    const auto index = detail::gather_global_index(comm, dir, global_step, mine);
    const auto path = global_index_path(dir, global_step);
    if (comm.rank() == 0) detail::write_global_index(index, path);
    comm.barrier();
    return path;
}

/// commit_global_index() of this rank's saved `my_file`, described here: it must lie under
/// `dir` (the index names it relative to `dir`); `opts` reads it when it has codecs (the key
/// of an encrypted one).
template <Communicator Comm>
boost::filesystem::path commit_global_index(Comm& comm, const ckpt::PathArg& dir, std::int64_t global_step,
                                            const ckpt::PathArg& my_file, const ckpt::PieceMap& places = {},
                                            std::uint64_t chunk_bytes = 1u << 20, const ckpt::LoadOptions& opts = {}) {
    return commit_global_index(comm, dir, global_step,
                               describe_rank_file(dir, my_file, comm.rank(), places, chunk_bytes, opts));
}


namespace detail {

/// The global indexes in `dir`, newest step first.
inline std::vector<std::pair<std::int64_t, boost::filesystem::path>> global_indexes(const ckpt::PathArg& dir) {
    std::vector<std::pair<std::int64_t, boost::filesystem::path>> out;
    boost::system::error_code ec;
    for (boost::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (const auto step = ckpt::global_index_step(it->path().filename().string())) out.emplace_back(*step, it->path());
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    return out;
}

/// See ckpt::detail::global_index_issue().
inline std::optional<ckpt::detail::CheckpointIssue> global_index_issue(const boost::filesystem::path& path) {
    return ckpt::detail::global_index_issue(path);
}

/// Why the index at `path` cannot be used, or nothing (global_index_issue()).
inline std::optional<std::string> global_index_problem(const boost::filesystem::path& path) {
    if (auto issue = global_index_issue(path)) return issue->why;
    return std::nullopt;
}

}  // namespace detail

namespace detail {

/// Why a file the index at `path` names fails its checksum, or nothing when all verify.
inline std::optional<std::string> global_index_files_problem(const boost::filesystem::path& path) {
    try {
        const auto index = ckpt::read_global_index(path);
        std::vector<std::string> checked;
        for (const auto& p : index.pieces) {
            if (std::find(checked.begin(), checked.end(), p.file) != checked.end()) continue;
            checked.push_back(p.file);
            ckpt::verify_checkpoint(path.parent_path() / p.file);
        }
    } catch (const ckpt::Error& e) {
        return e.what();
    }
    return std::nullopt;
}

}  // namespace detail

/// The newest global index in `dir` that verifies, whose files are all there and, with
/// `verify_files` (the default), whose files pass their checksums, as latest() checks a
/// checkpoint; older indexes are tried in turn, each one passed over with a warning saying
/// why. Nothing when there is none. Verifying reads every file of the step; without it,
/// each piece's chunks are still checked when it is loaded.
///
/// With two levels (ckpt::DurableLevel), pass both directories of the indexes, the local one
/// first: the newest step whose index is whole on either, the first level's copy first.
inline std::optional<boost::filesystem::path> latest_global_index(const std::vector<ckpt::Path>& levels,
                                                                  bool verify_files = true,
                                                                  std::int64_t before_step = INT64_MAX) {
    std::vector<std::pair<std::int64_t, boost::filesystem::path>> indexes;
    for (const auto& dir : levels) {
        auto more = detail::global_indexes(dir);
        indexes.insert(indexes.end(), more.begin(), more.end());
    }
    std::stable_sort(indexes.begin(), indexes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [step, path] : indexes) {
        if (step >= before_step) continue;
        auto why = detail::global_index_problem(path);
        if (!why && verify_files) why = detail::global_index_files_problem(path);
        if (!why) return path;
        ckpt::detail::log(ckpt::LogLevel::warning, "skipping global index of step " + std::to_string(step) + " in '" +
                                                       path.parent_path().string() + "': " + *why);
    }
    return std::nullopt;
}
inline std::optional<boost::filesystem::path> latest_global_index(const ckpt::PathArg& dir, bool verify_files = true,
                                                                  std::int64_t before_step = INT64_MAX) {
    return latest_global_index(std::vector<ckpt::Path>{ckpt::Path(dir)}, verify_files, before_step);
}

/// Removes the global indexes in `dir` whose files are gone (deleted by a retention policy);
/// one that is damaged, or that this program cannot read, is left as evidence.
inline void remove_stale_global_indexes(const ckpt::PathArg& dir) {
    for (const auto& [step, path] : detail::global_indexes(dir)) {
        bool broken = false;
        if (!ckpt::detail::global_index_issue(path, &broken) || !broken) continue;
        boost::system::error_code ec;
        boost::filesystem::remove(path, ec);
    }
}

namespace detail {

/// Rank 0's part once the global index at `index` is written: removes the indexes whose files
/// retention deleted and, when `copied` (the ranks' files go to the durable level), queues the
/// index's copy there.
template <class Manager>
void publish_global_index(Manager& manager, const ckpt::PathArg& dir, const boost::filesystem::path& index, bool copied) {
    remove_stale_global_indexes(dir);
    const auto* durable = manager.durable_directory();
    if (!durable || !copied) return;
    const auto target_dir = (*durable / boost::filesystem::relative(dir, manager.directory())).lexically_normal();
    std::vector<ckpt::Path> needs;
    for (const auto& p : ckpt::read_global_index(index).pieces)
        if (const auto f = target_dir / p.file; std::find(needs.begin(), needs.end(), f) == needs.end()) needs.push_back(f);
    manager.queue_durable_copy(index, target_dir / index.filename(), std::move(needs),
                               [target_dir] { remove_stale_global_indexes(target_dir); });
}

/// What follows the commit of `index`, the global index naming this rank's `file`: the
/// manager keeps the file until the next index is committed; rank 0 publishes the index
/// (publish_global_index()).
template <class Manager>
void after_index_commit(int rank, Manager& manager, const ckpt::PathArg& dir, const boost::filesystem::path& index,
                        const ckpt::PathArg& file, bool copied) {
    if constexpr (requires { manager.pin(file); }) manager.pin(file);
    if (rank == 0) publish_global_index(manager, dir, index, copied);
}

}  // namespace detail

/// After every rank's `manager` saved `file` at `global_step` (each its own, under `dir`):
/// waits for the save to be durable, commits the step's global index in `dir`
/// (commit_global_index), and on rank 0 removes the indexes whose files retention deleted.
/// With a durable level (ckpt::DurableLevel) the index follows the ranks' files there once
/// they have all arrived (each rank's manager copies its own; rank 0's copier waits for the
/// others', up to DurableLevel::index_timeout), so an index on the durable level never
/// names a file that is not there yet. Its place there mirrors its place beside the
/// manager's directory: with the manager in {dir}/rank_0 and its durable level in
/// {shared}/rank_0, the index goes to {shared}. Every rank copies the same steps
/// (DurableLevel::every counts saves), so the files come. Returns the index's path. A
/// collective; a loop without nn's callbacks calls it after each save (GlobalIndexer does).
/// Each rank's manager keeps its file of the newest committed index (CheckpointManager::pin()),
/// whatever its retention says, until the next one is committed: a retention of one file
/// never leaves the job without a whole index.
/// With async_save the training thread waits here for the save's write: IndexCommitter
/// commits the index without waiting.
template <Communicator Comm, class Manager>
boost::filesystem::path index_saved_checkpoint(Comm& comm, Manager& manager, const ckpt::PathArg& dir,
                                               std::int64_t global_step, const ckpt::PathArg& file,
                                               const ckpt::PieceMap& places = {}) {
    if constexpr (requires { manager.wait_for(file); }) manager.wait_for(file);  // durable before it is described
    else manager.wait();
    const bool copied = manager.copies_to_durable(file);
    const auto index = commit_global_index(comm, dir, global_step, file, places, 1u << 20, manager.load_options());
    detail::after_index_commit(comm.rank(), manager, dir, index, file, copied);
    return index;
}

/// Commits the global index of each step a rank's `manager` saves, as index_saved_checkpoint()
/// does, and with async_save without making the training thread wait for the writes: a thread
/// of its own waits until this rank's file is durable and describes it (reading it back to
/// checksum its chunks), the ranks exchange the descriptions at the first poll() where every
/// rank's file is described, and rank 0 writes the index on a thread of its own. The ranks ask
/// each other at the 1st, 2nd, 4th, 8th… poll() after a save (one allgather of two words each),
/// and commit at the next save or finish() at the latest, waiting then. Until its index is
/// committed a step is not saved: latest_global_index() and the loads find the previous one,
/// whose files the managers keep (pin()) as they keep the pending step's (hold()), whatever
/// their retention says; the index before it keeps its files too until rank 0 says, at the
/// next exchange, that the new one is written.
///
///   fault::IndexCommitter commits(comm, manager, dir);
///   for (...) {
///       ...
///       if (auto file = manager.on_step(p, state)) commits.saved(step, *file, places);
///       else commits.poll();
///   }
///   if (auto file = manager.on_train_end(p, state)) commits.saved(step, *file, places);
///   commits.finish();
///
/// Every rank must call it at the same steps (the calls are collectives). A rank whose save
/// failed tells the others, and the step is given up on every rank (a warning names the
/// rank); its manager rethrows the failure at its next call. An index rank 0 could not write
/// is given up alike, at the next exchange. Destroy it before the manager.
/// With synchronous saves, saved() is index_saved_checkpoint() and poll() does nothing.
template <Communicator Comm, class Manager>
class IndexCommitter {
public:
    IndexCommitter(Comm& comm, Manager& manager, ckpt::PathArg dir) : comm_(comm), manager_(manager), dir_(std::move(dir)) {}
    IndexCommitter(const IndexCommitter&) = delete;
    IndexCommitter& operator=(const IndexCommitter&) = delete;
    /// Waits for its threads. The pending step's file is let go: its index will not be
    /// committed. The files of the last two indexes stay kept while the manager lives.
    ~IndexCommitter() {
        if (writing_.valid()) writing_.wait();
        if (!pending_) return;
        pending_->description.wait();
        manager_.release(pending_->file);
    }

    /// After this rank's manager saved `file` at `global_step`: commits the pending step's index
    /// first (waiting for it), then this step's, at once with synchronous saves. Returns the
    /// index committed now, if any (with async_save, rank 0 may still be writing it). A
    /// collective.
    std::optional<boost::filesystem::path> saved(std::int64_t global_step, const ckpt::PathArg& file,
                                                 ckpt::PieceMap places = {}) {
        if (!manager_.options().async_save) {
            last_index_ = index_saved_checkpoint(comm_, manager_, dir_, global_step, file, places);
            return last_index_;
        }
        auto committed = pending_ ? commit(true) : std::nullopt;
        manager_.hold(file);
        Pending& p = pending_.emplace();
        p.step = global_step;
        p.file = file;
        p.copied = manager_.copies_to_durable(file);  // asked now: only of the newest save
        p.description = std::async(std::launch::async, [&manager = manager_, dir = dir_, file = p.file,
                                                        rank = comm_.rank(), places = std::move(places)] {
            manager.wait_for(file);
            return describe_rank_file(dir, file, rank, places, 1u << 20, manager.load_options());
        }).share();
        return committed;
    }

    /// Commits the pending step's index if every rank's file is described, asking the others
    /// at the 1st, 2nd, 4th, 8th… call after the save. Returns the index committed, if any. A
    /// collective at those calls.
    std::optional<boost::filesystem::path> poll() {
        if (!pending_) return std::nullopt;
        const std::int64_t n = ++pending_->polls;
        if (n & (n - 1)) return std::nullopt;
        return commit(false);
    }

    /// Waits for the pending step's file on every rank and commits its index, then for rank 0
    /// to have written it. Returns it, if one was pending. A collective.
    std::optional<boost::filesystem::path> finish() {
        auto committed = pending_ ? commit(true) : std::nullopt;
        if (unconfirmed_) settle(detail::allgather_records(comm_, Status{described, write_outcome()})[0].index);
        return committed;
    }

    /// The step whose index is yet to be committed, if any.
    std::optional<std::int64_t> pending_step() const {
        return pending_ ? std::optional<std::int64_t>(pending_->step) : std::nullopt;
    }
    /// The index this rank last committed (with async_save, rank 0 may still be writing it).
    const std::optional<boost::filesystem::path>& last_index() const noexcept { return last_index_; }

private:
    struct Pending {
        std::int64_t step = 0;
        boost::filesystem::path file;
        bool copied = false;
        std::int64_t polls = 0;
        std::shared_future<ckpt::GlobalIndex> description;  // from a thread of its own
    };
    struct Committed {
        boost::filesystem::path file;   // this rank's, which the index names
        boost::filesystem::path index;
    };
    enum Code : std::int64_t { busy = 0, described = 1, failed = 2, none = 3, written = 4 };
    struct Status {
        std::int64_t file;   // this rank's description: busy, described or failed
        std::int64_t index;  // rank 0's write of the index committed last: none, written or failed
    };

    /// Rank 0: how its write of the last index ended (waiting for it); others: none.
    std::int64_t write_outcome() {
        if (!writing_.valid()) return none;
        try {
            writing_.get();
            return written;
        } catch (...) {
            write_failure_ = ckpt::detail::message_of(std::current_exception());
            return failed;
        }
    }

    /// What every rank learns of rank 0's last write (`outcome`): written, the new index's files
    /// are the ones to keep; failed, the step is given up and the index before stays the newest.
    void settle(std::int64_t outcome) {
        if (!unconfirmed_ || outcome == none) return;
        if (outcome == written) {
            if (confirmed_) manager_.release(confirmed_->file);
            confirmed_ = std::move(unconfirmed_);
        } else {
            ckpt::detail::log(ckpt::LogLevel::warning,
                              "global index '" + unconfirmed_->index.string() + "' could not be written" +
                                  (comm_.rank() == 0 ? ": " + write_failure_ : std::string(" (rank 0 says why)")) +
                                  "; its step is not saved");
            last_index_ = confirmed_ ? std::optional<boost::filesystem::path>(confirmed_->index) : std::nullopt;
        }
        unconfirmed_.reset();
    }

    std::optional<boost::filesystem::path> commit(bool wait) {
        Pending& p = *pending_;
        if (wait) p.description.wait();
        const bool ready = p.description.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
        std::optional<ckpt::GlobalIndex> mine;
        std::exception_ptr failure;
        if (ready) {
            try {
                mine = p.description.get();
            } catch (...) {
                failure = std::current_exception();
            }
        }
        const auto statuses = detail::allgather_records(
            comm_, Status{!ready ? busy : mine ? described : failed, write_outcome()});
        settle(statuses[0].index);
        if (std::any_of(statuses.begin(), statuses.end(), [](const Status& s) { return s.file == busy; })) return std::nullopt;
        std::string failed_ranks;
        for (std::size_t r = 0; r < statuses.size(); ++r)
            if (statuses[r].file == failed) failed_ranks += (failed_ranks.empty() ? "" : ", ") + std::to_string(r);
        if (!failed_ranks.empty()) {
            ckpt::detail::log(ckpt::LogLevel::warning,
                              "global index of step " + std::to_string(p.step) + " in '" + dir_.string() +
                                  "' not committed: the save of rank(s) " + failed_ranks + " failed" +
                                  (failure ? " (rank " + std::to_string(comm_.rank()) + "'s: " +
                                                 ckpt::detail::message_of(failure) + ")"
                                           : std::string()));
            manager_.release(p.file);
            pending_.reset();
            // a write that failed is the manager's to rethrow, at its next call; a misuse
            // (a file not under the index's directory) stops this rank now, as a synchronous save would
            if (failure) {
                try {
                    std::rethrow_exception(failure);
                } catch (const ckpt::ConfigError&) {
                    throw;
                } catch (...) {
                }
            }
            return std::nullopt;
        }
        const auto path = global_index_path(dir_, p.step);
        try {
            auto index = detail::gather_global_index(comm_, dir_, p.step, *mine);
            if (comm_.rank() == 0)  // written, old indexes removed and the copy queued, on a thread of its own
                writing_ = std::async(std::launch::async, [&manager = manager_, dir = dir_, path, copied = p.copied,
                                                           index = std::move(index)] {
                    detail::write_global_index(index, path);
                    detail::publish_global_index(manager, dir, path, copied);
                });
        } catch (...) {  // not tried again
            manager_.release(p.file);
            pending_.reset();
            throw;
        }
        // the files of the index before stay until this one is known to be written
        if (confirmed_) manager_.hold(confirmed_->file);
        manager_.pin(p.file);
        unconfirmed_ = Committed{p.file, path};
        pending_.reset();
        last_index_ = path;
        return path;
    }

    Comm& comm_;
    Manager& manager_;
    boost::filesystem::path dir_;
    std::optional<Pending> pending_;
    std::optional<Committed> confirmed_, unconfirmed_;  // the newest index known written, and the one being written
    std::future<void> writing_;                         // rank 0's write of the newest index
    std::string write_failure_;                         // rank 0: why it failed
    std::optional<boost::filesystem::path> last_index_;
};

/// The callback that commits the global index of each step `files` saves (an
/// nn::ModelCheckpoint of this rank, saving into a directory under `dir`); list it after
/// them. `pieces` says where sharded state sits (a DataParallelOptimizer's piece_map);
/// without it every tensor is whole. Every rank must save at the same steps. See
/// index_saved_checkpoint() for what it does; with async_save it is an IndexCommitter
/// polled at every step's and epoch's end, and finished at the end of training.
template <Communicator Comm, class Files>
class GlobalIndexer {
public:
    GlobalIndexer(Comm& comm, Files& files, ckpt::PathArg dir, std::function<ckpt::PieceMap()> pieces = {})
        : files_(files), pieces_(std::move(pieces)), commits_(comm, files.manager(), std::move(dir)) {}

    void on_step_end(nn::RunContext& c) { index(c); }
    void on_epoch_end(nn::RunContext& c) { index(c); }
    void on_train_end(nn::RunContext& c) {
        index(c);
        commits_.finish();
    }

    /// The index this rank last committed.
    const std::optional<boost::filesystem::path>& last_index() const noexcept { return commits_.last_index(); }

private:
    void index(nn::RunContext& c) {
        const auto& saved = files_.last_saved();
        if (!saved || saved == indexed_) {
            commits_.poll();
            return;
        }
        indexed_ = saved;
        commits_.saved(c.global_step, *saved, pieces_ ? pieces_() : ckpt::PieceMap{});
    }

    Files& files_;
    std::function<ckpt::PieceMap()> pieces_;
    IndexCommitter<Comm, std::remove_reference_t<decltype(std::declval<Files&>().manager())>> commits_;
    std::optional<boost::filesystem::path> indexed_;
};

}  // namespace fault
