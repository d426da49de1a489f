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

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../ckpt/reshard.hpp"
#include "../nn/callbacks.hpp"
#include "communicator.hpp"
#include "global_index.hpp"
#include "membership.hpp"

namespace fault {

/// A state loaded for this rank from the newest whole global index.
struct ElasticResume {
    boost::filesystem::path index;  ///< the index loaded from
    std::int64_t global_step = 0;   ///< the step it holds
    int saved_by = 0;               ///< how many ranks saved it
    ckpt::ReshardedState state;
};

/// Every rank of a generation together: rank 0 finds the newest global index in `dir` whose
/// index verifies and whose files are all there (`dir` must be readable by every rank: a
/// shared filesystem across hosts), every rank loads its pieces of it for the places `places`
/// says (ckpt::load_resharded into tensors like `like`, each chunk checked; `opts`: the key of
/// encrypted files). When a rank's pieces do not load (a chunk that fails its checksum, a
/// damaged file), every rank says so and they go on to the next older index together, as
/// latest() falls back past a damaged file. Nothing when no index loads: a fresh start. A
/// collective.
///
/// With two levels (ckpt::DurableLevel), pass both directories of the indexes, the local one
/// first (every rank the same list): the newest index on either, the local copy first.
template <Communicator Comm>
std::optional<ElasticResume> load_latest_resharded(Comm& comm, const std::vector<ckpt::Path>& levels,
                                                   const ckpt::ParamDict& like, const ckpt::PieceMap& places = {},
                                                   const ckpt::LoadOptions& opts = {}) {
    struct Record {
        std::int64_t value;
    };
    struct Choice {
        std::int64_t step, level;
    };
    // rank 0's candidates: every level's indexes, newest step first, the first level's copy first
    std::vector<std::pair<std::int64_t, std::int64_t>> candidates;  // (step, level)
    if (comm.rank() == 0)
        for (std::size_t l = 0; l < levels.size(); ++l)
            for (const auto& [step, path] : detail::global_indexes(levels[l]))
                candidates.emplace_back(step, static_cast<std::int64_t>(l));
    std::stable_sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    auto next = candidates.begin();
    for (;;) {
        Choice mine{-1, 0};
        for (; comm.rank() == 0 && next != candidates.end(); ++next) {
            const auto path = global_index_path(levels[static_cast<std::size_t>(next->second)], next->first);
            if (auto why = detail::global_index_problem(path)) {
                ckpt::detail::log(ckpt::LogLevel::warning, "skipping global index '" + path.string() + "': " + *why);
                continue;
            }
            mine = {next->first, next->second};
            ++next;
            break;
        }
        const Choice chosen = detail::allgather_records(comm, mine)[0];
        const std::int64_t step = chosen.step;
        if (step < 0) return std::nullopt;
        ElasticResume r;
        r.index = global_index_path(levels.at(static_cast<std::size_t>(chosen.level)), step);
        std::string why;
        try {
            const ckpt::GlobalIndex index = ckpt::read_global_index(r.index);
            if (index.global_step != step)
                throw ckpt::FormatError("'" + r.index.string() + "' holds the index of step " +
                                            std::to_string(index.global_step) + ", rank 0 chose step " + std::to_string(step),
                                        r.index.string());
            r.global_step = step;
            r.saved_by = static_cast<int>(index.world_size);
            r.state = ckpt::load_resharded(r.index, like, places, opts);
        } catch (const ckpt::KeyError&) {
            throw;  // another key opens no older index either
        } catch (const ckpt::FormatError& e) {  // damage (ChecksumError among them): an older index may serve
            why = e.what();
        }
        // every rank learns which ranks could not load their pieces
        const auto failed = detail::allgather_records(comm, Record{why.empty() ? 0 : 1});
        std::string ranks;
        for (std::size_t i = 0; i < failed.size(); ++i)
            if (failed[i].value) ranks += (ranks.empty() ? "" : ", ") + std::to_string(i);
        if (ranks.empty()) return r;
        ckpt::detail::log(ckpt::LogLevel::warning,
                          "global index of step " + std::to_string(step) + " does not load on rank(s) " + ranks +
                              (why.empty() ? "" : " (here: " + why + ")") + "; trying the next index after '" +
                              r.index.string() + "'");
    }
}
template <Communicator Comm>
std::optional<ElasticResume> load_latest_resharded(Comm& comm, const ckpt::PathArg& dir, const ckpt::ParamDict& like,
                                                   const ckpt::PieceMap& places = {}, const ckpt::LoadOptions& opts = {}) {
    return load_latest_resharded(comm, std::vector<ckpt::Path>{ckpt::Path(dir)}, like, places, opts);
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
