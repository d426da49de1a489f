#pragma once
// --fresh where a new run would otherwise pick up the files already there (last words,
// per-rank checkpoints, StepNaming runs): the old directory is moved aside, not deleted.

#include <boost/filesystem.hpp>

#include <optional>
#include <string>

namespace examples {

/// Renames `dir` to "{dir}.old-{N}", N the first free number, and returns the new name;
/// nothing when `dir` is absent or empty.
inline std::optional<boost::filesystem::path> move_aside(const boost::filesystem::path& dir) {
    namespace fs = boost::filesystem;
    if (!fs::exists(dir) || (fs::is_directory(dir) && fs::is_empty(dir))) return std::nullopt;
    std::string name = dir.string();
    while (name.size() > 1 && name.back() == '/') name.pop_back();  // "dir/" names the same directory
    for (int n = 1;; ++n) {
        fs::path aside = name + ".old-" + std::to_string(n);
        if (fs::exists(aside)) continue;
        fs::rename(dir, aside);
        return aside;
    }
}

}  // namespace examples
