#pragma once
// What retention remembers between runs of a CheckpointManager's policy, and asks before it
// deletes: the metrics each file records (read once per file and body), the files found intact
// without an owner record (left alone, said once), and the file a committed global index names
// (pinned). Retention runs on the writer thread with async_save, so all of it is under a mutex.

#include <boost/filesystem.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../checkpoint.hpp"
#include "../error.hpp"
#include "../latest.hpp"
#include "../log.hpp"
#include "../policies/naming.hpp"

namespace ckpt::detail {

class RetentionMemory {
public:
    explicit RetentionMemory(std::string prefix) : prefix_(std::move(prefix)) {}

    /// Keeps the file at `relative` (to either level's directory) from retention: a committed
    /// global index names it.
    void pin(fs::path relative) {
        std::lock_guard lock(mutex_);
        held_.erase(relative);
        pinned_ = std::move(relative);
    }
    /// Keeps the file at `relative` from retention too, until pin() names it or release():
    /// a global index of it is being committed.
    void hold(fs::path relative) {
        std::lock_guard lock(mutex_);
        held_.insert(std::move(relative));
    }
    void release(const fs::path& relative) {
        std::lock_guard lock(mutex_);
        held_.erase(relative);
    }
    /// Whether `file` in `dir` is the pinned file or a held one.
    bool pinned(const fs::path& file, const fs::path& dir) const {
        const auto relative = file.lexically_relative(dir);
        std::lock_guard lock(mutex_);
        return (pinned_ && relative == *pinned_) || held_.contains(relative);
    }
    /// Forgets what was read of `file`, deleted.
    void forget(const fs::path& file) {
        std::lock_guard lock(mutex_);
        metrics_read_.erase(file.string());
    }

    /// The metrics `f` records (StoredCheckpoint::metrics), read once per file and body: a
    /// file's table of contents, or its whole body when it passed through codecs. None when
    /// they cannot be read (a damaged file): such a file is never the best.
    std::map<std::string, double> metrics_of(const StoredCheckpoint& f, const LoadOptions& load_options) const {
        {
            std::lock_guard lock(mutex_);
            if (const auto it = metrics_read_.find(f.path.string());
                it != metrics_read_.end() && it->second.first == f.header.body_hash)
                return it->second.second;
        }
        std::map<std::string, double> metrics;
        try {
            metrics = metrics_in(read_contents(f.path, load_options).entries);
        } catch (const Error& e) {
            log(LogLevel::info, "retention reads no metrics from '" + f.path.string() + "': " + e.what());
        }
        std::lock_guard lock(mutex_);
        metrics_read_[f.path.string()] = {f.header.body_hash, metrics};
        return metrics;
    }

    /// Whether retention may delete `f`: a file whose owner record says it is this prefix's,
    /// of the run its name says, or a damaged one (its record is no evidence either way; a
    /// damaged file of its name was always retention's to delete). A file that records no owner
    /// (written without a manager, or by an older version) has only its name for evidence and
    /// is left alone, as is one whose record another key hides.
    bool may_delete(const StoredCheckpoint& f, const LoadOptions& load_options) const {
        if (f.owner == OwnerRecord::matches) return true;
        std::optional<std::string> why;
        if (f.owner == OwnerRecord::absent) {
            // A damaged file may have lost its record: verified once, then remembered.
            {
                std::lock_guard lock(mutex_);
                if (const auto it = unowned_intact_.find(f.path.string());
                    it != unowned_intact_.end() && it->second == f.header.body_hash)
                    return false;
            }
            try {
                verify_checkpoint(f.path);
            } catch (const Error&) {
                return true;  // damaged: what it records is no evidence, and its name says it is ours
            }
            std::lock_guard lock(mutex_);
            unowned_intact_[f.path.string()] = f.header.body_hash;
            log(LogLevel::notice, "retention leaves alone '" + f.path.string() +
                                              "': it records no owner (written without a manager or by an older "
                                              "version), so only its name says it is prefix '" + prefix_ +
                                              "''s; delete it by hand when it is no longer needed");
            return false;
        } else if (f.header.encoded()) {
            try {
                const auto owner = read_owner(f.path, load_options);
                why = owner ? foreign_owner(owner, prefix_, f.name)
                            : std::optional<std::string>("it records no owner, so only its name says it is this prefix's");
            } catch (const KeyError& e) {
                why = std::string("its owner record cannot be read: ") + e.what();
            } catch (const Error&) {  // damaged
            }
        }
        if (why) log(LogLevel::info, "retention leaves alone '" + f.path.string() + "': " + *why);
        return !why;
    }

private:
    std::string prefix_;
    mutable std::mutex mutex_;
    std::optional<fs::path> pinned_;
    std::set<fs::path> held_;
    mutable std::map<std::string, std::uint64_t> unowned_intact_;
    mutable std::map<std::string, std::pair<std::uint64_t, std::map<std::string, double>>> metrics_read_;
};

/// Deletes the meta file of each run (but `current_run`) whose every checkpoint in `all`
/// (readable or not, any rank) is in `doomed`. Before the checkpoints themselves, so that
/// a process killed in between leaves no meta file without checkpoints behind.
template <NamingPolicy N>
void remove_meta_of_emptied_runs(const fs::path& dir, const N& naming, const std::string& current_run,
                                 const std::vector<const StoredCheckpoint*>& doomed,
                                 const std::vector<StoredCheckpoint>& all) {
    std::vector<std::string> runs;
    for (const StoredCheckpoint* f : doomed)
        if (f->name.run_prefix != current_run) runs.push_back(f->name.run_prefix);
    std::sort(runs.begin(), runs.end());
    runs.erase(std::unique(runs.begin(), runs.end()), runs.end());
    for (const auto& run : runs) {
        const auto meta = naming.meta_name(run);
        auto is_doomed = [&](const StoredCheckpoint& f) {
            return std::any_of(doomed.begin(), doomed.end(),
                                   [&](const StoredCheckpoint* d) { return d->path == f.path; });
        };
        const bool left = std::any_of(all.begin(), all.end(), [&](const StoredCheckpoint& f) {
            return f.name.run_prefix == run && !is_doomed(f);
        });
        if (meta.empty() || left) continue;
        boost::system::error_code ec;
        if (fs::remove(dir / meta, ec))
            log(LogLevel::info, "retention deleted '" + (dir / meta).string() +
                                                "' with the last checkpoints of run " + run);
        else if (ec)
            log(LogLevel::warning,
                        "retention could not delete '" + (dir / meta).string() + "': " + ec.message());
    }
}

}  // namespace ckpt::detail
