#pragma once
// Elastic training: a job that goes on when its number of ranks changes. Every rank saves
// its own checkpoints and a GlobalIndexer commits the global index of each save; when the
// ranks of a generation change (a worker lost for good, or a worker taken in), every rank of
// the new generation loads its pieces of the newest whole index for its new place:
//
//   auto resumed = fault::load_latest_resharded(comm, dir, trainer.load_target(), opt.piece_map());
//   if (resumed) { opt.claim_resharded(resumed->state.state); trainer.resume_from_state(resumed->state.state, …); }
//
// and, listed after the indexer, TakeInJoiners ends a generation at a committed index when
// workers wait to join (an elastic GlooComm: waiting_to_join()), so that the caller forms the
// bigger generation (grow()) and every rank resumes from that index: no step is redone.
//
//   try { trainer.train(…, nn::callbacks(files, indexer, joiners)); }
//   catch (const fault::JoinersWaiting&) { comm = comm.grow(); /* resume as above */ }

#include <boost/filesystem.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../ckpt/reshard.hpp"
#include "../nn/callbacks.hpp"
#include "communicator.hpp"
#include "global_index.hpp"
#include "membership.hpp"
#include "replica_parallel.hpp"

namespace fault {

/// A state loaded for this rank from the newest whole global index.
struct ElasticResume {
    boost::filesystem::path index;  ///< the index loaded from
    std::int64_t global_step = 0;   ///< the step it holds
    int saved_by = 0;               ///< how many ranks saved it
    ckpt::ReshardedState state;
};

namespace detail {

/// load_latest_resharded(), the state of each index loaded into what `like_for(index)` gives,
/// and `loaded(like, resume)` run once every rank has loaded it.
template <Communicator Comm, class LikeFor, class Loaded>
std::optional<ElasticResume> load_latest_resharded_with(Comm& comm, const std::vector<ckpt::Path>& levels,
                                                        LikeFor&& like_for, Loaded&& loaded,
                                                        const ckpt::PieceMap& places, const ckpt::LoadOptions& opts,
                                                        ckpt::OnUnreadable on_unreadable) {
    // what a rank's load of an index came to
    enum Outcome : std::int64_t { ok = 0, damaged = 1, unsupported = 2, failed = 3 };
    struct Record {
        std::int64_t value;
    };
    // rank 0's choice: an index (step, level), none left (-1), or none left of several that
    // cannot be used (-2), or one this program cannot read (-3)
    struct Choice {
        std::int64_t step, level;
    };
    std::string levels_text;
    for (const auto& l : levels) levels_text += (levels_text.empty() ? "'" : " nor '") + l.string() + "'";
    // rank 0's candidates: every level's indexes, newest step first, the first level's copy first
    std::vector<std::pair<std::int64_t, std::int64_t>> candidates;  // (step, level)
    if (comm.rank() == 0)
        for (std::size_t l = 0; l < levels.size(); ++l)
            for (const auto& [step, path] : detail::global_indexes(levels[l]))
                candidates.emplace_back(step, static_cast<std::int64_t>(l));
    std::stable_sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<ckpt::SkippedCheckpoint> passed;  // rank 0's
    auto refusal = [&](std::int64_t code) -> ckpt::UnreadableCheckpoints {
        std::string list;
        for (const auto& p : passed) list += (list.empty() ? "" : "; ") + ("'" + p.path.string() + "': " + p.reason);
        if (comm.rank() != 0) list = "rank 0 says which and why";
        return ckpt::UnreadableCheckpoints(
            code == -3 ? "the newest global index in " + levels_text + " cannot be read by this program (" + list +
                             "). Not resuming from an older step, which would redo its steps: read it with a program "
                             "that can (a newer ckpt, its codec, its key), or pass OnUnreadable::fall_back"
                       : "global indexes in " + levels_text + " exist, but none can be used (" + list +
                             "). Not starting over, which would take them for none: repair or move them away, or pass "
                             "OnUnreadable::fall_back to start from the beginning",
            passed);
    };
    auto next = candidates.begin();
    for (;;) {
        Choice mine{-1, 0};
        for (; comm.rank() == 0 && next != candidates.end(); ++next) {
            const auto path = global_index_path(levels[static_cast<std::size_t>(next->second)], next->first);
            const auto issue = detail::global_index_issue(path);
            if (!issue) {
                mine = {next->first, next->second};
                ++next;
                break;
            }
            passed.push_back({path, issue->why, issue->unsupported});
            if (issue->unsupported && on_unreadable == ckpt::OnUnreadable::refuse) {
                mine = {-3, 0};
                break;
            }
            ckpt::detail::log(ckpt::LogLevel::warning, "skipping global index '" + path.string() + "': " + issue->why);
        }
        if (comm.rank() == 0 && mine.step == -1 && !passed.empty() && on_unreadable == ckpt::OnUnreadable::refuse)
            mine.step = -2;
        const Choice chosen = detail::allgather_records(comm, mine)[0];
        const std::int64_t step = chosen.step;
        if (step == -1) return std::nullopt;
        if (step < -1) throw refusal(step);
        ElasticResume r;
        r.index = global_index_path(levels.at(static_cast<std::size_t>(chosen.level)), step);
        std::string why;
        Outcome outcome = ok;
        std::exception_ptr error;
        ckpt::ParamDict like;
        std::optional<ckpt::GlobalIndex> index;
        bool unreachable = false;
        auto note_failure = [&](const ckpt::Error& e) {
            why = e.what();
            // damage (ChecksumError among them): an older index may serve; what this program
            // cannot read, or a state that does not fit, ends the load on every rank
            outcome = ckpt::detail::unsupported_here(e) ? unsupported
                      : dynamic_cast<const ckpt::FormatError*>(&e) ? damaged
                                                                   : failed;
            if (outcome != damaged) error = std::current_exception();
        };
        try {
            index = ckpt::read_global_index(r.index);
            if (index->global_step != step)
                throw ckpt::FormatError("'" + r.index.string() + "' holds the index of step " +
                                            std::to_string(index->global_step) + ", rank 0 chose step " + std::to_string(step),
                                        r.index.string());
            r.global_step = step;
            r.saved_by = static_cast<int>(index->world_size);
            like = like_for(*index);
        } catch (const ckpt::Error& e) {
            note_failure(e);
            unreachable = dynamic_cast<const ckpt::IoError*>(&e) != nullptr;
            index.reset();
        }
        // a rank that cannot reach the index (its view of the shared directory gone) gets it
        // from the lowest rank that read it, and the read-once load brings it what it loads
        // alike; what it loads alone it still has to read
        struct Has {
            std::uint64_t state;  // 0 read it, 1 cannot reach it, 2 failed otherwise
        };
        const auto has = detail::allgather_records(comm, Has{index ? 0u : unreachable ? 1u : 2u});
        int from = -1;
        bool wanted = false;
        for (std::size_t q = 0; q < has.size(); ++q) {
            if (has[q].state == 0 && from < 0) from = static_cast<int>(q);
            wanted = wanted || has[q].state == 1;
        }
        if (wanted && from >= 0) {
            PackedState packed;
            if (comm.rank() == from) packed.pack(ckpt::index_to_dict(*index), step);
            struct Words {
                std::uint64_t n;
            };
            const auto sizes = detail::allgather_records(comm, Words{comm.rank() == from ? packed.words().size() : 0u});
            std::vector<float> words(static_cast<std::size_t>(sizes[static_cast<std::size_t>(from)].n));
            if (comm.rank() == from) std::copy(packed.words().begin(), packed.words().end(), words.begin());
            comm.broadcast(std::span<float>(words), from);
            if (has[static_cast<std::size_t>(comm.rank())].state == 1) {
                try {
                    const std::string what = "the global index of step " + std::to_string(step) + " from rank " +
                                             std::to_string(from);
                    index = detail::index_from_words(words, what);
                    r.global_step = step;
                    r.saved_by = static_cast<int>(index->world_size);
                    like = like_for(*index);
                    why.clear();  // not reaching the index was this rank's only trouble
                    outcome = ok;
                    error = nullptr;
                } catch (const ckpt::Error& e) {
                    note_failure(e);
                    index.reset();
                }
            }
        }
        // every rank takes part in the read-once load, a rank that failed above to say so
        try {
            r.state = detail::load_read_once(comm, index ? &*index : nullptr, r.index, like, places, opts);
        } catch (const ckpt::Error& e) {
            note_failure(e);
        }
        // every rank learns which ranks could not load their pieces, and why
        const auto outcomes = detail::allgather_records(comm, Record{outcome});
        std::string ranks, failing;
        bool any_unsupported = false;
        for (std::size_t i = 0; i < outcomes.size(); ++i) {
            if (outcomes[i].value != ok) ranks += (ranks.empty() ? "" : ", ") + std::to_string(i);
            if (outcomes[i].value == failed) failing += (failing.empty() ? "" : ", ") + std::to_string(i);
            any_unsupported = any_unsupported || outcomes[i].value == unsupported;
        }
        if (ranks.empty()) {
            loaded(like, r);
            return r;
        }
        if (!failing.empty() || (any_unsupported && on_unreadable == ckpt::OnUnreadable::refuse)) {
            if (error) std::rethrow_exception(error);
            throw ckpt::LoadMismatch("global index '" + r.index.string() + "' does not load on rank(s) " + ranks +
                                     " (each says why); not trying an older one");
        }
        if (comm.rank() == 0) passed.push_back({r.index, "does not load on rank(s) " + ranks, false});
        ckpt::detail::log(ckpt::LogLevel::warning,
                          "global index of step " + std::to_string(step) + " does not load on rank(s) " + ranks +
                              (why.empty() ? "" : " (here: " + why + ")") + "; trying the next index after '" +
                              r.index.string() + "'");
    }
}

}  // namespace detail

/// Every rank of a generation together: rank 0 finds the newest global index in `dir` whose
/// index verifies and whose files are all there (`dir` must be readable by every rank: a
/// shared filesystem across hosts), every rank loads its pieces of it for the places `places`
/// says (ckpt::load_resharded into tensors like `like`, each chunk checked; `opts`: the key of
/// encrypted files), reading each byte of what the ranks load alike once between them
/// (load_resharded_read_once); a rank that cannot reach the index gets it from one that
/// read it. When a rank's pieces do not load (a chunk that fails its checksum, a
/// damaged file), every rank says so and they go on to the next older index together, as
/// latest() falls back past a damaged file. Nothing when there is no index: a fresh start.
/// Indexes that exist when none can be used, or a newest one this program cannot read, end it
/// on every rank with ckpt::UnreadableCheckpoints, unless `on_unreadable` is
/// OnUnreadable::fall_back; so does, on every rank, a state that does not fit. A collective.
///
/// With two levels (ckpt::DurableLevel), pass both directories of the indexes, the local one
/// first (every rank the same list): the newest index on either, the local copy first.
/// @throws ckpt::UnreadableCheckpoints (every rank) under OnUnreadable::refuse: the newest
///         index cannot be read by this program, or indexes exist and none can be used
/// @throws ckpt::LoadMismatch a rank's state does not fit (elements no file holds, a tensor of
///         another dtype or shape) or, under OnUnreadable::refuse, a rank cannot read its files:
///         that rank throws its own error (ckpt::LoadMismatch, ckpt::VersionError,
///         ckpt::KeyError, …), every other rank LoadMismatch naming the ranks
/// @throws PeerFailure a rank failed, or did not take part in time
template <Communicator Comm>
std::optional<ElasticResume> load_latest_resharded(Comm& comm, const std::vector<ckpt::Path>& levels,
                                                   const ckpt::ParamDict& like, const ckpt::PieceMap& places = {},
                                                   const ckpt::LoadOptions& opts = {},
                                                   ckpt::OnUnreadable on_unreadable = ckpt::OnUnreadable::refuse) {
    return detail::load_latest_resharded_with(
        comm, levels, [&](const ckpt::GlobalIndex&) { return like; }, [](const ckpt::ParamDict&, const ElasticResume&) {},
        places, opts, on_unreadable);
}

/// load_latest_resharded() into `target`, an object that shapes itself after what it loads
/// (ckpt::ShapedByCheckpoint: EigenState, TorchState, a growing history): shaped after each
/// index tried (ckpt::index_entries()), written (strictly) once every rank has loaded its
/// state, then finished by its loaded(). A state loaded in several parts loads the other parts
/// from the same step with ckpt::load_resharded_into(resumed->index, …).
template <Communicator Comm, ckpt::ShapedByCheckpoint T>
std::optional<ElasticResume> load_latest_resharded(Comm& comm, const std::vector<ckpt::Path>& levels, T& target,
                                                   const ckpt::PieceMap& places = {}, const ckpt::LoadOptions& opts = {},
                                                   ckpt::OnUnreadable on_unreadable = ckpt::OnUnreadable::refuse) {
    ckpt::ParamDict views;
    return detail::load_latest_resharded_with(
        comm, levels,
        [&](const ckpt::GlobalIndex& index) {
            views = target.state_dict_for(ckpt::index_entries(index, places));
            return views;
        },
        [&](const ckpt::ParamDict&, const ElasticResume& r) {
            ckpt::LoadReport report;
            try {
                report = ckpt::load_param_into_net(views, r.state.state, /*strict=*/true);
            } catch (const ckpt::LoadMismatch& e) {
                throw ckpt::LoadMismatch("global index '" + r.index.string() + "' does not fit: " + e.what());
            }
            target.loaded(report);
        },
        places, opts, on_unreadable);
}
template <Communicator Comm, ckpt::ShapedByCheckpoint T>
std::optional<ElasticResume> load_latest_resharded(Comm& comm, const ckpt::PathArg& dir, T& target,
                                                   const ckpt::PieceMap& places = {}, const ckpt::LoadOptions& opts = {},
                                                   ckpt::OnUnreadable on_unreadable = ckpt::OnUnreadable::refuse) {
    return load_latest_resharded(comm, std::vector<ckpt::Path>{ckpt::Path(dir)}, target, places, opts, on_unreadable);
}
template <Communicator Comm>
std::optional<ElasticResume> load_latest_resharded(Comm& comm, const ckpt::PathArg& dir, const ckpt::ParamDict& like,
                                                   const ckpt::PieceMap& places = {}, const ckpt::LoadOptions& opts = {},
                                                   ckpt::OnUnreadable on_unreadable = ckpt::OnUnreadable::refuse) {
    return load_latest_resharded(comm, std::vector<ckpt::Path>{ckpt::Path(dir)}, like, places, opts, on_unreadable);
}

/// Thrown by TakeInJoiners on every rank of a generation at the same step, once that step's
/// global index is committed: the workers `nodes` wait to join.
class JoinersWaiting : public ckpt::Error {
public:
    JoinersWaiting(std::int64_t step, std::vector<int> nodes)
        : ckpt::Error("after global step " + std::to_string(step) + ", worker(s) " + detail::join_ids(nodes, ", ") +
                      " wait to join"),
          step_(step), nodes_(std::move(nodes)) {}
    std::int64_t step() const noexcept { return step_; }
    const std::vector<int>& nodes() const noexcept { return nodes_; }

private:
    std::int64_t step_;
    std::vector<int> nodes_;
};

/// The callback that, after each committed global index (list it after `indexer`), asks
/// whether workers wait to join the next generation (rank 0 asks `comm.waiting_to_join()`,
/// every rank gets its answer) and if so throws JoinersWaiting on every rank.
template <Communicator Comm, class Indexer>
class TakeInJoiners {
public:
    TakeInJoiners(Comm& comm, const Indexer& indexer) : comm_(comm), indexer_(indexer) {}

    void on_step_end(nn::RunContext& c) { check(c); }
    void on_epoch_end(nn::RunContext& c) { check(c); }

private:
    void check(nn::RunContext& c) {
        const auto& index = indexer_.last_index();
        if (!index || index == seen_) return;
        seen_ = index;
        struct Waiting {
            std::int32_t count;
            std::int32_t nodes[15];
        };
        Waiting mine{};
        if (comm_.rank() == 0)
            for (int node : comm_.waiting_to_join())
                if (mine.count < 15) mine.nodes[mine.count++] = node;
        const Waiting first = detail::allgather_records(comm_, mine)[0];
        if (first.count == 0) return;
        throw JoinersWaiting(c.global_step, std::vector<int>(first.nodes, first.nodes + first.count));
    }

    Comm& comm_;
    const Indexer& indexer_;
    std::optional<boost::filesystem::path> seen_;
};

}  // namespace fault
