#pragma once
// Finding checkpoints again after a restart: by the run, epoch and step in their names,
// confirmed by their headers and verified by their checksums. Never by file times.

#include <sys/stat.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint.hpp"
#include "detail/atomic_file.hpp"
#include "error.hpp"
#include "log.hpp"
#include "policies/naming.hpp"
#include "path.hpp"
#include "policies/retention.hpp"

namespace ckpt {

/// A checkpoint latest() passed over, and why.
struct SkippedCheckpoint {
    Path path;
    std::string reason;
    /// Intact, but this program cannot read it: a newer format version, a dtype or codec it
    /// lacks, a key it was not given, or more memory than it could get. Otherwise damaged
    /// (torn, truncated, altered).
    bool unsupported = false;
};

/// What a lookup (restore(), latest(), resume_or_start, load_latest_resharded) does when the
/// newest checkpoints cannot be used.
enum class OnUnreadable {
    /// A damaged checkpoint is passed over, with a warning, for the next older one. One that
    /// this program cannot read (see SkippedCheckpoint::unsupported) stops the lookup with
    /// UnreadableCheckpoints, as do checkpoints that exist when none of them can be used:
    /// checkpoints are never taken for none, nor an older one for the newest.
    refuse,
    /// Every checkpoint that cannot be used is passed over, with a warning, for an older one,
    /// or for none (a fresh start).
    fall_back,
};

/// Checkpoints were found, but the newest cannot be read by this program, or none can be used
/// (see OnUnreadable). The message names each file and why; files() has them.
class UnreadableCheckpoints : public Error {
public:
    UnreadableCheckpoints(const std::string& what, std::vector<SkippedCheckpoint> files)
        : Error(what), files_(std::move(files)) {}
    const std::vector<SkippedCheckpoint>& files() const noexcept { return files_; }

private:
    std::vector<SkippedCheckpoint> files_;
};

namespace detail {

/// Calls `visit(path, status)` for every entry of `dir` but directories, down to `depth`
/// levels of sub-directories. Entries that vanish while the directory is read (a concurrent
/// writer's temporary renamed, a file retention frees) are passed over: they must not end the
/// listing early, as an error of a recursive iterator's increment does.
template <class Visit>
void visit_entries(const fs::path& dir, int depth, Visit&& visit) {
    boost::system::error_code ec;
    auto cannot_list = [&](const fs::path& d, const boost::system::error_code& e) {
        return IoError("cannot list '" + d.string() + "': " + e.message(), d.string(), e.value());
    };
    std::vector<std::pair<fs::path, int>> pending{{dir, 0}};  // directories still to read, at their depth
    while (!pending.empty()) {
        const auto [here, level] = pending.back();
        pending.pop_back();
        fs::directory_iterator it(here, ec), end;
        if (ec == boost::system::errc::no_such_file_or_directory && here != dir) continue;  // a sub-directory gone
        if (ec) throw cannot_list(here, ec);
        for (; it != end; it.increment(ec)) {
            // a directory is entered only when it is one itself, not a link to one (which may
            // lead back up); a link to a file is visited as the file
            const fs::file_status link = it->symlink_status(ec);
            if (ec == boost::system::errc::no_such_file_or_directory) continue;  // gone since it was read
            if (ec) throw cannot_list(here, ec);
            if (fs::is_directory(link)) {
                if (level < depth) pending.emplace_back(it->path(), level + 1);
                continue;
            }
            const fs::file_status status = fs::is_symlink(link) ? it->status(ec) : link;
            if (ec && ec != boost::system::errc::no_such_file_or_directory) throw cannot_list(here, ec);
            ec.clear();  // a dangling link is visited as what it is (no file)
            if (!fs::is_directory(status)) visit(it->path(), status);
        }
        if (ec) throw cannot_list(here, ec);
    }
}

/// Names relative to `dir`, down to `depth` levels of sub-directories; temporaries excluded.
inline std::vector<std::string> list_names(const fs::path& dir, int depth) {
    std::vector<std::string> names;
    boost::system::error_code ec;
    if (!fs::exists(dir, ec)) return names;
    if (!fs::is_directory(dir, ec))
        throw IoError("checkpoint directory '" + dir.string() + "' is not a directory", dir.string(), ENOTDIR);
    visit_entries(dir, depth, [&](const fs::path& path, const fs::file_status&) {
        if (!temporary_owner(path.filename().string())) names.push_back(path.lexically_relative(dir).generic_string());
    });
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace detail

/// The owner record of `file` (see CheckpointOwner), or nothing when it holds none. Reads the
/// table of contents only; a body that passed through codecs is decoded whole (an encrypted
/// one needs opts.key).
inline std::optional<CheckpointOwner> read_owner(const PathArg& file, const LoadOptions& opts = {}) {
    return detail::owner_in(read_contents(file, opts).entries);
}

namespace detail {

/// Why the owner record of `owner` says the file named `name` is not a checkpoint of `prefix`,
/// or nothing when it is (or records no owner).
inline std::optional<std::string> foreign_owner(const std::optional<CheckpointOwner>& owner, std::string_view prefix,
                                                const NameParts& name) {
    if (!owner) return std::nullopt;
    if (owner->prefix == prefix && (owner->run_prefix == name.run_prefix || owner->run_prefix.empty()))
        return std::nullopt;
    return "it belongs to prefix '" + owner->prefix + "' (run '" + owner->run_prefix + "'), not to run '" +
           name.run_prefix + "' of prefix '" + std::string(prefix) + "' as its name suggests";
}

/// Why `file`, named as a checkpoint of `prefix`, is another's by its owner record, read where
/// that is cheap (one open and the table of contents, when the body did not pass through
/// codecs; encoded ones are checked when they are loaded or deleted); nothing when it is not.
/// `record` says what was learned. A record naming another owner counts only once the file
/// verifies: a damaged file's record is no evidence.
inline std::optional<std::string> recorded_elsewhere(const fs::path& file, std::string_view prefix,
                                                     const NameParts& name, OwnerRecord& record) {
    record = OwnerRecord::unread;
    try {
        const std::string path = file.string();
        auto c = open_checkpoint(path, {});
        const auto owner = owner_in(contents_of(c, path, {}, /*decode_encoded=*/false).entries);
        if (c.header.encoded()) return std::nullopt;
        auto why = foreign_owner(owner, prefix, name);
        if (why) verify_checkpoint(file);
        record = owner ? OwnerRecord::matches : OwnerRecord::absent;  // (a foreign one is left out)
        return why;
    } catch (const Error&) {
        return std::nullopt;  // damaged: verification says what is wrong with it
    }
}

/// The naming used when none is given: MindSporeNaming's names and StepNaming's, as `ckpt ls`
/// reads them, so that a lookup without a naming finds the files of either.
struct AnyRunNaming : MindSporeNaming {
    std::optional<NameParts> parse(std::string_view base, std::string_view name) const {
        if (auto p = MindSporeNaming{}.parse(base, name)) return p;
        return StepNaming{}.parse(base, name);
    }
};

/// Names in `dir` that other namings would read as files of `prefix`: what a lookup with
/// `naming` cannot see. For the message when it finds nothing.
template <class N>
std::vector<std::string> unreadable_names(const fs::path& dir, std::string_view prefix, const N& naming) {
    std::vector<std::string> out;
    boost::system::error_code ec;
    if (!fs::is_directory(dir, ec)) return out;
    for (const auto& name : list_names(dir, 0)) {
        if (naming.parse(prefix, name)) continue;
        if (MindSporeNaming{}.parse(prefix, name) || StepNaming{}.parse(prefix, name) ||
            SingleFileNaming{}.parse(prefix, name))
            out.push_back(name);
    }
    return out;
}

/// Warns when `dir` holds files of `prefix` that `naming` does not read (another naming's).
template <class N>
void warn_unreadable(const fs::path& dir, std::string_view prefix, const N& naming) {
    const auto names = unreadable_names(dir, prefix, naming);
    if (names.empty()) return;
    detail::log(LogLevel::warning, "no checkpoint of prefix '" + std::string(prefix) + "' in '" + dir.string() +
                                       "' follows this naming, but " + std::to_string(names.size()) +
                                       " file(s) of that prefix follow another, such as '" + names.front() +
                                       "': pass the naming policy that wrote them (MindSporeNaming writes "
                                       "'{prefix}-{epoch}_{step}.ckpt', StepNaming '{prefix}-{step}.ckpt', "
                                       "SingleFileNaming '{prefix}.ckpt')");
}

}  // namespace detail

/// Every checkpoint of `prefix` (all runs) that `naming` recognises in `dir`, oldest first by
/// (run, epoch, step). Headers are not read here: header fields are left default. A file
/// whose owner record names another prefix or run is left out, whatever its name says (see
/// CheckpointOwner; `foreign`, when given, gets those, each with the reason); the record of a
/// body that passed through codecs is checked when it is loaded or deleted.
template <NamingPolicy N = detail::AnyRunNaming>
std::vector<StoredCheckpoint> list_checkpoints(const PathArg& dir, std::string_view prefix, const N& naming = {},
                                               SaveKind kind = SaveKind::regular,
                                               std::vector<SkippedCheckpoint>* foreign = nullptr) {
    std::vector<StoredCheckpoint> out;
    for (const auto& name : detail::list_names(dir, naming.depth()))
        if (auto parts = naming.parse(prefix, name); parts && parts->kind == kind) {
            const fs::path file = dir / name;
            OwnerRecord record = OwnerRecord::unread;
            if (auto why = detail::recorded_elsewhere(file, prefix, *parts, record)) {
                if (foreign) foreign->push_back({file, *why});
                continue;
            }
            StoredCheckpoint& f = out.emplace_back();
            f.path = file;
            f.name = std::move(*parts);
            f.owner = record;
        }
    std::stable_sort(out.begin(), out.end(), [](const StoredCheckpoint& a, const StoredCheckpoint& b) {
        return std::tie(a.name.run, a.name.global_step, a.name.epoch, a.name.step) <
               std::tie(b.name.run, b.name.global_step, b.name.epoch, b.name.step);
    });
    return out;
}

namespace detail {

/// Whether `e`, thrown reading an intact file, says this program cannot read it (a newer
/// format version, a dtype or codec it lacks, a key it was not given, memory it could not
/// get, a file it may not open), rather than that the file is damaged. A file gone since it
/// was listed (ENOENT) is neither: it is passed over.
inline bool unsupported_here(const Error& e) {
    if (const auto* io = dynamic_cast<const IoError*>(&e)) return io->error_code() != ENOENT;
    return dynamic_cast<const VersionError*>(&e) || dynamic_cast<const KeyError*>(&e) ||
           dynamic_cast<const ConfigError*>(&e) || dynamic_cast<const OutOfMemory*>(&e);
}

/// Why a checkpoint cannot be used, and whether it is damaged or unsupported here.
struct CheckpointIssue {
    std::string why;
    bool unsupported = false;
};

/// Why the verified header of `file` disagrees with its name, or nothing.
inline std::optional<std::string> name_disagrees(const StoredCheckpoint& file) {
    if (!file.name.positioned) return std::nullopt;
    if (file.name.epoch_in_name) {
        if (file.header.epoch != file.name.epoch || file.header.step != file.name.step)
            return "its name says epoch " + std::to_string(file.name.epoch) + " step " + std::to_string(file.name.step) +
                   " but its header says epoch " + std::to_string(file.header.epoch) + " step " +
                   std::to_string(file.header.step);
    } else if (file.header.epoch == 1 ? file.header.step != file.name.step : file.header.step > file.name.step) {
        // a global step in the name: in the first epoch it is the step; later, no step of an
        // epoch is past it
        return "its name says global step " + std::to_string(file.name.step) + " but its header says epoch " +
               std::to_string(file.header.epoch) + " step " + std::to_string(file.header.step);
    }
    return std::nullopt;
}

/// What is wrong with `file` once `read` (verify_checkpoint or read_header) has given its
/// header, and whether the file is unsupported here rather than damaged.
template <class Read>
std::optional<CheckpointIssue> issue_after(StoredCheckpoint& file, Read read) {
    try {
        file.header = read(file.path);
    } catch (const Error& e) {
        return CheckpointIssue{e.what(), unsupported_here(e)};
    }
    if (auto why = name_disagrees(file)) return CheckpointIssue{*why, false};
    return std::nullopt;
}

/// checkpoint_problem(), saying also whether the file is unsupported here rather than damaged.
inline std::optional<CheckpointIssue> checkpoint_issue(StoredCheckpoint& file) {
    return issue_after(file, [](const fs::path& p) { return verify_checkpoint(p); });
}

/// checkpoint_issue() but for the body's checksum: the header, and whether it agrees with the
/// name. For a lookup that loads the file next, which verifies the body as it reads it.
inline std::optional<CheckpointIssue> header_issue(StoredCheckpoint& file) {
    return issue_after(file, [](const fs::path& p) { return read_header(p); });
}

}  // namespace detail

/// Checks that `file` is a whole, uncorrupted checkpoint whose header agrees with its name.
/// Returns the reason it is not, or nothing when it is.
inline std::optional<std::string> checkpoint_problem(StoredCheckpoint& file) {
    if (auto issue = detail::checkpoint_issue(file)) return issue->why;
    return std::nullopt;
}

namespace detail {

inline void note_skipped(const StoredCheckpoint& f, const std::string& why, std::vector<SkippedCheckpoint>* skipped,
                         bool unsupported = false) {
    detail::log(LogLevel::warning, "skipping checkpoint '" + f.path.string() + "': " + why);
    if (skipped) skipped->push_back({f.path, why, unsupported});
}

/// The checkpoints a lookup passes over, newest first, under its OnUnreadable rule.
class PassedOver {
public:
    /// `series` names what is looked up ("prefix 'heat' in 'runs'"); `skipped`, when given,
    /// gets every file passed over.
    PassedOver(std::string series, OnUnreadable rule, std::vector<SkippedCheckpoint>* skipped)
        : series_(std::move(series)), rule_(rule), skipped_(skipped) {}

    /// `f` cannot be used: passed over, with a warning, or, when this program cannot read it
    /// and the rule refuses, the lookup ends with UnreadableCheckpoints.
    void add(const StoredCheckpoint& f, const CheckpointIssue& issue) {
        if (issue.unsupported && rule_ == OnUnreadable::refuse) {
            std::string before;
            for (const auto& p : passed_) before += "; passed over before it, '" + p.path.string() + "': " + p.reason;
            auto files = passed_;
            files.push_back({f.path, issue.why, true});
            throw UnreadableCheckpoints(
                "checkpoint '" + f.path.string() + "' of " + series_ + " cannot be read by this program: " + issue.why +
                    before + ". Not resuming from an older checkpoint, which would redo its steps: read it with a "
                    "program that can (a newer ckpt, its codec, its key), or pass OnUnreadable::fall_back to resume "
                    "from the newest checkpoint this program reads",
                std::move(files));
        }
        note_skipped(f, issue.why, skipped_, issue.unsupported);
        passed_.push_back({f.path, issue.why, issue.unsupported});
    }

    /// The lookup used none of the checkpoints it found: under the refusing rule, when it found
    /// any, the lookup ends with UnreadableCheckpoints.
    void none_used() const {
        if (passed_.empty() || rule_ != OnUnreadable::refuse) return;
        std::string list;
        for (const auto& p : passed_) list += (list.empty() ? "" : "; ") + ("'" + p.path.string() + "': " + p.reason);
        throw UnreadableCheckpoints(std::to_string(passed_.size()) + " checkpoint(s) of " + series_ +
                                        " exist, but none can be used: " + list +
                                        ". Not starting over, which would take them for none: repair or move them "
                                        "away, or pass OnUnreadable::fall_back to start from the beginning",
                                    passed_);
    }

    const std::vector<SkippedCheckpoint>& passed() const noexcept { return passed_; }

private:
    std::string series_;
    OnUnreadable rule_;
    std::vector<SkippedCheckpoint>* skipped_;
    std::vector<SkippedCheckpoint> passed_;
};

inline std::string series_text(const fs::path& dir, std::string_view prefix) {
    return "prefix '" + std::string(prefix) + "' in '" + dir.string() + "'";
}

/// The run number of `run_prefix` among the runs of `prefix` ("exp_2": 2), or -1.
inline std::int64_t run_number(std::string_view prefix, std::string_view run_prefix) {
    if (run_prefix == prefix) return 0;
    if (!consume(run_prefix, prefix) || !consume(run_prefix, "_")) return -1;
    return parse_count(run_prefix).value_or(-1);
}

/// The newest exception save ("…_breakpoint.ckpt") that verifies and was written after
/// `regular` (the newest regular checkpoint that verifies, if any): by the run of regular
/// checkpoints it records it continues, then by position. An exception save is written only
/// at a step boundary, so it holds a whole state. One without an owner record cannot be
/// placed and is passed over, with a note.
template <class N>
std::optional<StoredCheckpoint> newer_breakpoint(const fs::path& dir, std::string_view prefix, const N& naming,
                                                 const std::optional<StoredCheckpoint>& regular, const LoadOptions& opts,
                                                 std::vector<SkippedCheckpoint>* skipped) {
    auto files = list_checkpoints(dir, prefix, naming, SaveKind::breakpoint);
    auto position = [](const NameParts& n) { return std::tie(n.global_step, n.epoch, n.step); };
    for (auto it = files.rbegin(); it != files.rend(); ++it) {
        if (auto why = checkpoint_problem(*it)) {
            note_skipped(*it, why.value(), skipped);
            continue;
        }
        std::optional<CheckpointOwner> owner;
        try {
            owner = read_owner(it->path, opts);
        } catch (const Error& e) {
            note_skipped(*it, e.what(), skipped);
            continue;
        }
        if (auto why = foreign_owner(owner, prefix, it->name)) continue;
        if (!owner || owner->follows_run.empty()) {
            detail::log(LogLevel::info, "exception save '" + it->path.string() +
                                            "' does not record the run it continues (written by an older version): "
                                            "not resumed from; load it by name to use it");
            continue;
        }
        const std::int64_t run = run_number(prefix, owner->follows_run);
        if (regular && (run < regular->name.run || (run == regular->name.run && position(it->name) <= position(regular->name))))
            return std::nullopt;  // the newest regular checkpoint is newer
        return std::move(*it);
    }
    return std::nullopt;
}

}  // namespace detail

/// The newest valid checkpoint of `prefix` in `dir`, or nothing (also when `dir` does not
/// exist). Newer files that are damaged are skipped, each with a warning and, when `skipped`
/// is given, an entry saying why; older ones are tried in turn. A file this program cannot
/// read (a newer format version), or files of which none verifies, end the lookup with
/// UnreadableCheckpoints unless `on_unreadable` is OnUnreadable::fall_back. An exception save
/// ("…_breakpoint.ckpt") written after every regular checkpoint is the newest state, and is
/// returned (with a note saying so). When nothing of this naming is found but files of the
/// prefix follow another naming, a warning names them. `opts` (the key of encrypted files)
/// is needed only to read the owner record of an encrypted exception save.
/// @throws UnreadableCheckpoints under OnUnreadable::refuse: the newest checkpoint cannot be
///         read by this program, or checkpoints exist and none of them verifies
/// @throws IoError `dir` is not a directory, or cannot be listed
template <NamingPolicy N = detail::AnyRunNaming>
std::optional<StoredCheckpoint> latest_checkpoint(const PathArg& dir, std::string_view prefix, const N& naming = {},
                                                  std::vector<SkippedCheckpoint>* skipped = nullptr,
                                                  const LoadOptions& opts = {},
                                                  OnUnreadable on_unreadable = OnUnreadable::refuse) {
    auto files = list_checkpoints(dir, prefix, naming);
    std::optional<StoredCheckpoint> found;
    detail::PassedOver passed(detail::series_text(dir, prefix), on_unreadable, skipped);
    for (auto it = files.rbegin(); it != files.rend() && !found; ++it) {
        if (auto issue = detail::checkpoint_issue(*it)) passed.add(*it, *issue);
        else found = std::move(*it);
    }
    if (auto bp = detail::newer_breakpoint(dir, prefix, naming, found, opts, skipped)) {
        detail::log(LogLevel::notice, "the newest state of prefix '" + std::string(prefix) + "' is the exception save '" +
                                        bp->path.string() + "', written after every regular checkpoint" +
                                        (found ? " (the newest: '" + found->path.string() + "')" : ""));
        return bp;
    }
    if (!found && files.empty()) detail::warn_unreadable(dir, prefix, naming);
    if (!found) passed.none_used();
    return found;
}

/// The checkpoint of `prefix` in `dir` with the best value of `metric` (see KeepBest: what
/// the save recorded, or else an int64 or double value of that name) that verifies, with its
/// metrics; nothing when no file records a finite value of it. Better files that fail
/// verification are skipped, each with a warning and an entry in `skipped`; so are files whose
/// contents cannot be read. Of equal values the newer file wins. `opts` holds the key of
/// encrypted files.
template <NamingPolicy N = detail::AnyRunNaming>
std::optional<StoredCheckpoint> best_checkpoint(const PathArg& dir, std::string_view prefix, const std::string& metric,
                                                Mode mode = Mode::min, const N& naming = {},
                                                std::vector<SkippedCheckpoint>* skipped = nullptr,
                                                const LoadOptions& opts = {}) {
    auto files = list_checkpoints(dir, prefix, naming);
    for (auto& f : files) {
        try {
            f.metrics = detail::metrics_in(read_contents(f.path, opts).entries);
        } catch (const Error& e) {
            detail::note_skipped(f, e.what(), skipped);
        }
    }
    for (const std::size_t i : KeepBest(1, metric, mode).ranking(files)) {
        if (auto why = checkpoint_problem(files[i])) detail::note_skipped(files[i], *why, skipped);
        else return std::move(files[i]);
    }
    return std::nullopt;
}

/// Path form of best_checkpoint().
template <NamingPolicy N = detail::AnyRunNaming>
std::optional<Path> best(const PathArg& dir, std::string_view prefix, const std::string& metric, Mode mode = Mode::min,
                         const N& naming = {}, std::vector<SkippedCheckpoint>* skipped = nullptr) {
    if (auto c = best_checkpoint(dir, prefix, metric, mode, naming, skipped)) return c->path;
    return std::nullopt;
}

/// Path form of latest_checkpoint(), named after the seed's "find the latest checkpoint".
/// @throws UnreadableCheckpoints under OnUnreadable::refuse: the newest checkpoint cannot be
///         read by this program, or checkpoints exist and none of them verifies
/// @throws IoError `dir` is not a directory, or cannot be listed
template <NamingPolicy N = detail::AnyRunNaming>
std::optional<Path> latest(const PathArg& dir, std::string_view prefix, const N& naming = {},
                           std::vector<SkippedCheckpoint>* skipped = nullptr,
                           OnUnreadable on_unreadable = OnUnreadable::refuse) {
    if (auto c = latest_checkpoint(dir, prefix, naming, skipped, {}, on_unreadable)) return c->path;
    return std::nullopt;
}

}  // namespace ckpt
