#pragma once
// ReplicaSelector: which rank of a replica group writes the last-words checkpoint.
//
// A selector S provides
//   int choose(std::span<const int> candidates) const
//       given the job ranks (ascending, never empty) of one replica group that hold the
//       newest consistent state, the one that saves it.
// Every survivor runs the same selector on the same reports, so they agree without a
// controller.
//
// Members: LowestHealthyRank (the default), PreferenceOrder{ranks…}, AvoidRanks{ranks…}.

#include <algorithm>
#include <concepts>
#include <span>
#include <vector>

namespace fault {

/// Which rank of a replica group saves the last words (or serves a UCE repair): choose(candidates)
/// picks one of the job ranks (ascending, never empty) that hold the newest consistent state.
/// Every survivor runs it on the same reports, so they agree. Members: LowestHealthyRank,
/// PreferenceOrder, AvoidRanks.
template <class S>
concept ReplicaSelector = std::copy_constructible<S> && requires(const S& s, std::span<const int> candidates) {
    { s.choose(candidates) } -> std::convertible_to<int>;
};

/// The lowest-numbered candidate.
struct LowestHealthyRank {
    int choose(std::span<const int> candidates) const { return candidates.front(); }
};

/// The first rank of `order` that is a candidate (for instance the ranks on the host with
/// the fastest disk), else the lowest candidate.
struct PreferenceOrder {
    std::vector<int> order;
    int choose(std::span<const int> candidates) const {
        for (int r : order)
            if (std::find(candidates.begin(), candidates.end(), r) != candidates.end()) return r;
        return candidates.front();
    }
};

/// The lowest candidate not in `avoid` (for instance ranks sharing a host with the failed
/// one), else the lowest candidate: a save from an avoided rank beats no save.
struct AvoidRanks {
    std::vector<int> avoid;
    int choose(std::span<const int> candidates) const {
        for (int r : candidates)
            if (std::find(avoid.begin(), avoid.end(), r) == avoid.end()) return r;
        return candidates.front();
    }
};

}  // namespace fault
