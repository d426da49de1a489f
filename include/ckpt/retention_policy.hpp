#pragma once
// RetentionPolicy: after each save, which of the run's older checkpoints to delete.
//
// A RetentionPolicy R provides
//   std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint> files) const
//       `files` are this run's readable checkpoints, oldest first; the last one is the file
//       just written. Returns indices into `files`, ascending.
//
// The manager never deletes the file just written, whatever a policy returns, and only ever
// shows a policy its own run's files.
//
// Members: KeepAll (the do-nothing member), KeepLast, KeepOnePerMinutes, and KeepUnion<...>,
// which keeps a file if any member keeps it.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "error.hpp"
#include "format.hpp"
#include "naming_policy.hpp"

namespace ckpt {

/// A checkpoint file found in a directory: where it is, what its name says, what its header says.
struct StoredCheckpoint {
    boost::filesystem::path path;
    NameParts name;
    FileHeader header;
};

template <class R>
concept RetentionPolicy = std::copy_constructible<R> && requires(const R& r, std::span<const StoredCheckpoint> files) {
    { r.to_delete(files) } -> std::same_as<std::vector<std::size_t>>;
};

/// Deletes nothing.
struct KeepAll {
    std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint>) const { return {}; }
};

/// Keeps the newest n files (the seed's keep_checkpoint_max, default 5).
struct KeepLast {
    std::size_t n = 5;
    explicit KeepLast(std::int64_t keep = 5) : n(static_cast<std::size_t>(keep)) {
        if (keep < 1) throw ConfigError("KeepLast needs n >= 1, got " + std::to_string(keep));
    }
    std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint> files) const {
        std::vector<std::size_t> out;
        for (std::size_t i = 0; i + n < files.size(); ++i) out.push_back(i);
        return out;
    }
};

/// Keeps one file per `minutes` of saving time (the seed's keep_checkpoint_per_n_minutes):
/// walking oldest to newest, a file is kept when it was saved at least `minutes` after the
/// last kept one; the newest file is always kept.
struct KeepOnePerMinutes {
    double minutes = 1;
    explicit KeepOnePerMinutes(double m = 1) : minutes(m) {
        if (!(m > 0)) throw ConfigError("KeepOnePerMinutes needs minutes > 0, got " + std::to_string(m));
    }
    std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint> files) const {
        std::vector<std::size_t> out;
        const auto window = static_cast<std::int64_t>(minutes * 60e9);
        std::int64_t last_kept = 0;
        for (std::size_t i = 0; i < files.size(); ++i) {
            const std::int64_t t = files[i].header.save_time_ns;
            const bool newest = i + 1 == files.size();
            if (i == 0 || newest || t - last_kept >= window) {
                last_kept = t;
            } else {
                out.push_back(i);
            }
        }
        return out;
    }
};

/// Keeps a file when any member keeps it: deletes only what every member deletes.
template <RetentionPolicy... Rs>
struct KeepUnion {
    std::tuple<Rs...> members;
    KeepUnion() = default;
    explicit KeepUnion(Rs... rs) : members(std::move(rs)...) {}
    std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint> files) const {
        std::vector<int> votes(files.size(), 0);
        std::apply([&](const auto&... m) { ((count(m.to_delete(files), votes)), ...); }, members);
        std::vector<std::size_t> out;
        for (std::size_t i = 0; i < files.size(); ++i)
            if (votes[i] == static_cast<int>(sizeof...(Rs))) out.push_back(i);
        return out;
    }

private:
    static void count(const std::vector<std::size_t>& idx, std::vector<int>& votes) {
        for (auto i : idx)
            if (i < votes.size()) ++votes[i];
    }
};

}  // namespace ckpt
