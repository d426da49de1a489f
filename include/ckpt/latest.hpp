#pragma once
// Finding checkpoints again after a restart: by the run, epoch and step in their names,
// confirmed by their headers and verified by their checksums. Never by file times.

#include <sys/stat.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint.hpp"
#include "detail/atomic_file.hpp"
#include "error.hpp"
#include "log.hpp"
#include "naming_policy.hpp"
#include "path.hpp"
#include "retention_policy.hpp"

namespace ckpt {

/// A checkpoint latest() passed over, and why.
struct SkippedCheckpoint {
    fs::path path;
    std::string reason;
};

namespace detail {

/// Names relative to `dir`, down to `depth` levels of sub-directories; temporaries excluded.
inline std::vector<std::string> list_names(const fs::path& dir, int depth) {
    std::vector<std::string> names;
    boost::system::error_code ec;
    if (!fs::exists(dir, ec)) return names;
    if (!fs::is_directory(dir, ec))
        throw IoError("checkpoint directory '" + dir.string() + "' is not a directory", dir.string(), ENOTDIR);
    fs::recursive_directory_iterator it(dir, ec), end;
    if (ec) throw IoError("cannot list '" + dir.string() + "': " + ec.message(), dir.string(), ec.value());
    for (; it != end; it.increment(ec)) {
        if (ec) throw IoError("cannot list '" + dir.string() + "': " + ec.message(), dir.string(), ec.value());
        const std::string leaf = it->path().filename().string();
        if (temporary_owner(leaf)) continue;
        if (fs::is_directory(it->status())) {
            if (it.depth() >= depth) it.disable_recursion_pending();
            continue;
        }
        names.push_back(it->path().lexically_relative(dir).generic_string());
    }
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace detail

/// Every checkpoint of `prefix` (all runs) that `naming` recognises in `dir`, oldest first by
/// (run, epoch, step). Headers are not read here: header fields are left default.
template <NamingPolicy N = MindSporeNaming>
std::vector<StoredCheckpoint> list_checkpoints(const PathArg& dir, std::string_view prefix, const N& naming = {},
                                               SaveKind kind = SaveKind::regular) {
    std::vector<StoredCheckpoint> out;
    for (const auto& name : detail::list_names(dir, naming.depth()))
        if (auto parts = naming.parse(prefix, name); parts && parts->kind == kind)
            out.push_back({dir / name, std::move(*parts), {}});
    std::stable_sort(out.begin(), out.end(), [](const StoredCheckpoint& a, const StoredCheckpoint& b) {
        return std::tie(a.name.run, a.name.global_step, a.name.epoch, a.name.step) <
               std::tie(b.name.run, b.name.global_step, b.name.epoch, b.name.step);
    });
    return out;
}

/// Checks that `file` is a whole, uncorrupted checkpoint whose header agrees with its name.
/// Returns the reason it is not, or nothing when it is.
inline std::optional<std::string> checkpoint_problem(StoredCheckpoint& file) {
    try {
        file.header = verify_checkpoint(file.path);
    } catch (const Error& e) {
        return std::string(e.what());
    }
    if (file.name.positioned && (file.header.epoch != file.name.epoch || file.header.step != file.name.step))
        return "its name says epoch " + std::to_string(file.name.epoch) + " step " + std::to_string(file.name.step) +
               " but its header says epoch " + std::to_string(file.header.epoch) + " step " +
               std::to_string(file.header.step);
    return std::nullopt;
}

/// The newest valid checkpoint of `prefix` in `dir`, or nothing (also when `dir` does not
/// exist). Newer files that fail verification are skipped, each with a warning and, when
/// `skipped` is given, an entry saying why; older ones are tried in turn.
template <NamingPolicy N = MindSporeNaming>
std::optional<StoredCheckpoint> latest_checkpoint(const PathArg& dir, std::string_view prefix, const N& naming = {},
                                                  std::vector<SkippedCheckpoint>* skipped = nullptr) {
    auto files = list_checkpoints(dir, prefix, naming);
    for (auto it = files.rbegin(); it != files.rend(); ++it) {
        if (auto why = checkpoint_problem(*it)) {
            detail::log(LogLevel::warning, "skipping checkpoint '" + it->path.string() + "': " + *why);
            if (skipped) skipped->push_back({it->path, *why});
            continue;
        }
        return std::move(*it);
    }
    return std::nullopt;
}

/// Path form of latest_checkpoint(), named after the seed's "find the latest checkpoint".
template <NamingPolicy N = MindSporeNaming>
std::optional<fs::path> latest(const PathArg& dir, std::string_view prefix, const N& naming = {},
                               std::vector<SkippedCheckpoint>* skipped = nullptr) {
    if (auto c = latest_checkpoint(dir, prefix, naming, skipped)) return c->path;
    return std::nullopt;
}

}  // namespace ckpt
