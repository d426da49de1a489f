#pragma once
// RetentionPolicy: after each save, which older checkpoints to delete.
//
// A RetentionPolicy R provides
//   std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint> files) const
//       `files` are the readable checkpoints in the manager's retention scope, oldest first by
//       (run, position); the last one is the file just written. Returns indices into `files`,
//       ascending.
//
// The scope (RetentionScope, naming_policy.hpp) is the current run's files, or every run's of
// the prefix; the naming policy picks the default (MindSporeNaming: the current run,
// StepNaming: every run) and ManagerOptions::retention_scope overrides it. Either way the
// policy sees only the manager's prefix and, for per-rank names, its own rank.
//
// Retention runs only once the save is durable. Whatever a policy returns, the manager never
// deletes the file just written, the newest checkpoint that verifies, or the file restore()
// loaded until the manager has saved a newer one; it leaves alone files whose header does not
// read (with a warning); and with a run's last checkpoints it deletes that run's meta file
// (never the current run's).
//
// A policy that ranks files by a metric says so with `static constexpr bool uses_metrics =
// true`: the manager then reads each file's recorded metrics into StoredCheckpoint::metrics
// (once per file) before asking it.
//
// Members: KeepAll (the do-nothing member), KeepLast, KeepOnePerMinutes, KeepWithinBytes,
// KeepBest (the k best by a metric), KeepUnion<...> (keeps a file if any member keeps it) and
// KeepIntersection<...> (keeps a file only if every member keeps it).

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "../error.hpp"
#include "../format.hpp"
#include "../log.hpp"
#include "naming.hpp"
#include "../path.hpp"

namespace ckpt {

/// What a listing learned of a file's owner record (see CheckpointOwner in checkpoint.hpp).
enum class OwnerRecord : std::uint8_t {
    unread,    ///< not read: the body passed through codecs, or the file is damaged
    matches,   ///< the file records the prefix and run its name says
    absent,    ///< the file records no owner (written without a manager, or by an older version)
};

/// A checkpoint file found in a directory: where it is, what its name says, what its header says.
struct StoredCheckpoint {
    Path path;
    NameParts name;
    FileHeader header;
    OwnerRecord owner = OwnerRecord::unread;
    /// What the file records of its metrics (Progress::metrics), and its other int64 and double
    /// values, by name; filled only where a metric is asked for (KeepBest, best()).
    std::map<std::string, double> metrics{};

    /// The file's size on disk, as its header says (a header that reads checked it against
    /// the file's size).
    std::uint64_t file_size() const noexcept { return header_size + header.body_length; }
};

/// Which older checkpoints to delete once a save is durable: to_delete(files) gets the readable
/// checkpoints of the retention scope, oldest first (the last is the file just written), and
/// returns the indices to delete, ascending. The manager never deletes the file just written,
/// the newest that verifies, or the one restore() loaded. Members: KeepAll, KeepLast,
/// KeepOnePerMinutes, KeepWithinBytes, KeepBest, KeepUnion, KeepIntersection.
template <class R>
concept RetentionPolicy = std::copy_constructible<R> && requires(const R& r, std::span<const StoredCheckpoint> files) {
    { r.to_delete(files) } -> std::same_as<std::vector<std::size_t>>;
};

namespace detail {
/// Whether retention policy R ranks files by their metrics (see the top of this file).
template <class R>
constexpr bool uses_metrics() {
    if constexpr (requires { R::uses_metrics; }) return R::uses_metrics;
    else return false;
}
}  // namespace detail

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

/// Keeps the newest files whose sizes on disk add up to at most `bytes`: walking from the
/// newest file to the oldest, the first one that would overflow the budget is deleted, and so
/// is every older one. The newest file is always kept, even when it alone is over budget.
struct KeepWithinBytes {
    std::uint64_t bytes;
    template <std::integral T>
    explicit KeepWithinBytes(T n) : bytes(static_cast<std::uint64_t>(n)) {
        if (std::cmp_less(n, 1))
            throw ConfigError("KeepWithinBytes needs a budget of at least 1 byte, got " + std::to_string(n));
    }
    std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint> files) const {
        if (files.empty()) return {};
        std::size_t kept = files.size() - 1;  // the oldest file kept so far
        std::uint64_t total = files[kept].file_size();
        while (kept > 0 && total <= bytes && files[kept - 1].file_size() <= bytes - total)
            total += files[--kept].file_size();
        std::vector<std::size_t> out(kept);
        for (std::size_t i = 0; i < kept; ++i) out[i] = i;
        return out;
    }
};

/// Whether a smaller or a larger value of a metric is better.
enum class Mode { min, max };

/// Keeps the k files with the best value of `metric` (a loss: Mode::min; an accuracy:
/// Mode::max), as Lightning's save_top_k, Keras's save_best_only and Orbax's best_fn do. The
/// metric is what the save recorded (Progress::metrics), or else an int64 or double value of
/// that name in the file (append_info's, a value the state saves; not a view of a scalar,
/// which is a 0-d tensor whose payload a listing does not read). A file without
/// it, or whose value is not finite, is never among the best. Of equal values the newer file
/// is the better. Alone it deletes every other file but those the manager always keeps (the
/// newest that verifies, the one just written, the one restored); KeepUnion<KeepLast,
/// KeepBest> keeps the newest n and the best k.
struct KeepBest {
    static constexpr bool uses_metrics = true;
    std::size_t k;
    std::string metric;
    Mode mode;
    KeepBest(std::int64_t keep, std::string metric_name, Mode m = Mode::min)
        : k(static_cast<std::size_t>(keep)), metric(std::move(metric_name)), mode(m) {
        if (keep < 1) throw ConfigError("KeepBest needs k >= 1, got " + std::to_string(keep));
        if (metric.empty()) throw ConfigError("KeepBest needs the name of a metric");
    }
    /// The value `f` has for the metric, when it is one that can rank.
    std::optional<double> value(const StoredCheckpoint& f) const {
        const auto it = f.metrics.find(metric);
        if (it == f.metrics.end() || !std::isfinite(it->second)) return std::nullopt;
        return it->second;
    }
    /// Whether a file of value `a` at position `ia` is better than one of `b` at `ib` (files
    /// are oldest first: a higher index is newer).
    bool better(double a, std::size_t ia, double b, std::size_t ib) const {
        if (a != b) return mode == Mode::min ? a < b : a > b;
        return ia > ib;
    }
    /// The indices of the files that have a value of the metric, the best first.
    std::vector<std::size_t> ranking(std::span<const StoredCheckpoint> files) const {
        std::vector<std::pair<double, std::size_t>> ranked;
        for (std::size_t i = 0; i < files.size(); ++i)
            if (const auto v = value(files[i])) ranked.emplace_back(*v, i);
        std::sort(ranked.begin(), ranked.end(),
                  [&](const auto& a, const auto& b) { return better(a.first, a.second, b.first, b.second); });
        std::vector<std::size_t> out;
        for (const auto& r : ranked) out.push_back(r.second);
        return out;
    }
    std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint> files) const {
        const auto ranked = ranking(files);
        // a metric never recorded, or misspelled: say so, once (files saved between the
        // checkpoints that measure it, such as step saves before the first epoch end, would
        // repeat it at every save)
        if (ranked.empty() && !files.empty() && !std::exchange(said_unranked_, true))
            detail::log(LogLevel::notice, "KeepBest ranks by '" + metric + "', but none of the " +
                                              std::to_string(files.size()) +
                                              " checkpoint(s) in its scope records a finite value of it, so it keeps "
                                              "none of them (a save records it in Progress::metrics)");
        std::vector<bool> keep(files.size(), false);
        for (std::size_t r = 0; r < ranked.size() && r < k; ++r) keep[ranked[r]] = true;
        std::vector<std::size_t> out;
        for (std::size_t i = 0; i < files.size(); ++i)
            if (!keep[i]) out.push_back(i);
        return out;
    }

private:
    // retention of one manager runs on one thread at a time
    mutable bool said_unranked_ = false;
};

/// Keeps a file when any member keeps it: deletes only what every member deletes.
template <RetentionPolicy... Rs>
struct KeepUnion {
    static constexpr bool uses_metrics = (detail::uses_metrics<Rs>() || ...);
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

/// Keeps a file only when every member keeps it: deletes what any member deletes.
/// KeepIntersection(KeepLast{5}, KeepWithinBytes{10LL << 30}) keeps the newest 5 files, fewer
/// when those do not fit in 10 GiB.
template <RetentionPolicy... Rs>
struct KeepIntersection {
    static constexpr bool uses_metrics = (detail::uses_metrics<Rs>() || ...);
    std::tuple<Rs...> members;
    KeepIntersection() = default;
    explicit KeepIntersection(Rs... rs) : members(std::move(rs)...) {}
    std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint> files) const {
        std::vector<bool> doomed(files.size(), false);
        std::apply([&](const auto&... m) { ((mark(m.to_delete(files), doomed)), ...); }, members);
        std::vector<std::size_t> out;
        for (std::size_t i = 0; i < files.size(); ++i)
            if (doomed[i]) out.push_back(i);
        return out;
    }

private:
    static void mark(const std::vector<std::size_t>& idx, std::vector<bool>& doomed) {
        for (auto i : idx)
            if (i < doomed.size()) doomed[i] = true;
    }
};

/// Any retention policy, held by value and chosen at run time: for the durable level of a
/// two-level manager (DurableLevel), whose policy is a setting rather than a template
/// parameter, and for programs that read their policy from a configuration. It runs once per
/// save, so the indirection costs nothing measurable.
class AnyRetention {
public:
    template <class R>
        requires(!std::same_as<R, AnyRetention> && RetentionPolicy<R>)  // in this order: no recursion
    AnyRetention(R policy)  // NOLINT: implicit, so that any policy converts
        : to_delete_([p = std::move(policy)](std::span<const StoredCheckpoint> files) { return p.to_delete(files); }),
          uses_metrics_(detail::uses_metrics<R>()) {}

    std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint> files) const { return to_delete_(files); }
    /// Whether the policy ranks files by their metrics (KeepBest), which are then read for it.
    bool uses_metrics() const noexcept { return uses_metrics_; }

private:
    std::function<std::vector<std::size_t>(std::span<const StoredCheckpoint>)> to_delete_;
    bool uses_metrics_;
};

namespace detail {
/// Whether `policy` ranks files by their metrics: known at compile time but for AnyRetention.
template <RetentionPolicy R>
bool ranks_by_metrics(const R& policy) {
    if constexpr (std::same_as<R, AnyRetention>) return policy.uses_metrics();
    else return uses_metrics<R>();
}
}  // namespace detail

}  // namespace ckpt
