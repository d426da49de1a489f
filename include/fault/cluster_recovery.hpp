#pragma once
// Cluster recovery (the seed's disaster recovery in a dynamic cluster): every worker saves
// its own checkpoints (one directory per rank); when a worker dies and comes back, every
// worker rolls back to the newest step that all ranks hold a valid checkpoint of, and
// training goes on from there.
//
//   auto agreed = fault::agree_on_checkpoint(comm, dir / ("rank_" + std::to_string(rank)), "net");
//   if (agreed.file) trainer.resume_from(*agreed.file, data);   // else: from the start
//
// Each rank verifies its files (header and checksum) before offering them, so a file torn by
// the crash is never chosen: the agreement falls back to an older step that every rank has.

#include <boost/filesystem.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "../ckpt/latest.hpp"
#include "../ckpt/log.hpp"
#include "communicator.hpp"

namespace fault {

/// The step every rank agreed to resume from, and this rank's file of it.
struct AgreedCheckpoint {
    std::optional<boost::filesystem::path> file;  ///< empty: no step is held by every rank; start afresh
    std::int64_t epoch = 0;                       ///< as named in the file (the seed's "{prefix}-{epoch}_{step}")
    std::int64_t step = 0;
    /// Without a file: what the ranks hold and why none of it can be used ("rank 0 holds epoch
    /// 2 step 80 and 1 older; ranks 2, 3 hold none"), the same on every rank; when no rank
    /// holds a checkpoint of the prefix, the checkpoints of another prefix or naming in this
    /// rank's directory, if any; empty when there are none. Say it: a fresh start over
    /// checkpoints that exist is never silent.
    std::string why_none;
};

namespace detail {

/// One rank's offer: the (epoch, step) of its newest valid checkpoints, newest first,
/// padded with -1.
struct CheckpointOffer {
    static constexpr std::size_t slots = 16;
    std::int64_t epoch[slots];
    std::int64_t step[slots];
};

/// What the offers hold, when no step is in all of them; empty when none holds anything.
inline std::string why_no_common_step(const std::vector<CheckpointOffer>& offers, std::string_view prefix) {
    std::string held, none;
    std::size_t holders = 0;
    for (std::size_t r = 0; r < offers.size(); ++r) {
        std::size_t n = 0;
        while (n < CheckpointOffer::slots && offers[r].step[n] >= 0) ++n;
        if (n == 0) {
            none += (none.empty() ? "" : ", ") + std::to_string(r);
            continue;
        }
        ++holders;
        held += (held.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " holds epoch " +
                                             std::to_string(offers[r].epoch[0]) + " step " +
                                             std::to_string(offers[r].step[0])) +
                (n > 1 ? " and " + std::to_string(n - 1) + " older" : "");
    }
    if (holders == 0) return {};
    return "no step of prefix '" + std::string(prefix) + "' is held by every rank: " + held +
           (none.empty() ? "" : "; rank(s) " + none + " hold none (another number of ranks, prefix or directory?)");
}

}  // namespace detail

/// Agrees over `comm` on the newest (epoch, step) of which every rank holds a valid
/// checkpoint of `prefix` in its own `dir` (each rank passes its own directory), and returns
/// this rank's file of it. Every rank must call it; a collective.
///
/// With two levels (ckpt::DurableLevel), pass both of this rank's directories, the local one
/// first: a step counts as held when either holds a copy that verifies, and the local copy
/// is taken when both do (the durable one is said).
template <Communicator Comm, ckpt::NamingPolicy N = ckpt::MindSporeNaming>
AgreedCheckpoint agree_on_checkpoint(Comm& comm, const std::vector<ckpt::Path>& levels, std::string_view prefix,
                                     const N& naming = {}) {
    using Key = std::pair<std::int64_t, std::int64_t>;
    if (levels.empty()) throw ckpt::ConfigError("agree_on_checkpoint: no directory given");
    const ckpt::Path& dir = levels.front();
    // this rank's valid files, newest first; of two files of one step (runs before and after
    // a rollback), the newer run's; of two copies of one file, the first level's
    std::vector<ckpt::StoredCheckpoint> files;
    for (const auto& level : levels) {
        auto more = ckpt::list_checkpoints(level, prefix, naming);
        files.insert(files.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    }
    std::stable_sort(files.begin(), files.end(), [](const ckpt::StoredCheckpoint& a, const ckpt::StoredCheckpoint& b) {
        return std::tie(a.name.epoch, a.name.step, a.name.run) > std::tie(b.name.epoch, b.name.step, b.name.run);
    });
    std::vector<std::pair<Key, boost::filesystem::path>> valid;
    for (auto& f : files) {
        if (valid.size() == detail::CheckpointOffer::slots) break;
        const Key key{f.name.epoch, f.name.step};
        if (!f.name.positioned || (!valid.empty() && valid.back().first == key)) continue;
        if (auto why = ckpt::checkpoint_problem(f)) {
            ckpt::detail::log(ckpt::LogLevel::warning, "cluster recovery: not offering '" + f.path.string() + "': " + *why);
            continue;
        }
        valid.emplace_back(key, f.path);
    }
    detail::CheckpointOffer mine{};
    for (std::size_t i = 0; i < detail::CheckpointOffer::slots; ++i) {
        mine.epoch[i] = i < valid.size() ? valid[i].first.first : -1;
        mine.step[i] = i < valid.size() ? valid[i].first.second : -1;
    }
    const auto offers = detail::allgather_records(comm, mine);
    // the newest of this rank's steps that every offer holds (each rank computes the same)
    for (const auto& candidate : valid) {
        const auto& key = candidate.first;  // a name, not a structured binding: lambdas capture it everywhere
        const bool everyone = std::all_of(offers.begin(), offers.end(), [&](const detail::CheckpointOffer& o) {
            for (std::size_t i = 0; i < detail::CheckpointOffer::slots; ++i)
                if (o.epoch[i] == key.first && o.step[i] == key.second) return true;
            return false;
        });
        if (!everyone) continue;
        if (candidate.second.parent_path() != dir && !candidate.second.string().starts_with(dir.string() + "/"))
            ckpt::detail::log(ckpt::LogLevel::notice, "cluster recovery: resuming from '" + candidate.second.string() +
                                                          "': '" + dir.string() + "' holds no copy of that step that verifies");
        return {candidate.second, key.first, key.second, {}};
    }
    std::string why = detail::why_no_common_step(offers, prefix);
    if (why.empty() && files.empty()) {  // nothing of this prefix anywhere: of another, here?
        std::vector<std::string> others;
        for (const auto& name : ckpt::detail::list_names(dir, naming.depth()))
            if (name.ends_with(".ckpt")) others.push_back(name);
        if (!others.empty())
            why = "no checkpoint of prefix '" + std::string(prefix) + "' on any rank, but '" + dir.string() + "' holds " +
                  std::to_string(others.size()) + " checkpoint(s) of another prefix or naming, such as '" + others.back() +
                  "'";
    }
    return {std::nullopt, 0, 0, why};
}

/// One directory per rank: see above.
template <Communicator Comm, ckpt::NamingPolicy N = ckpt::MindSporeNaming>
AgreedCheckpoint agree_on_checkpoint(Comm& comm, const ckpt::PathArg& dir, std::string_view prefix,
                                     const N& naming = {}) {
    return agree_on_checkpoint(comm, std::vector<ckpt::Path>{ckpt::Path(dir)}, prefix, naming);
}

}  // namespace fault
