#pragma once
// PathArg: what every ckpt function that takes a path accepts. A boost::filesystem::path (the
// library's own path type, which it derives from), a std::filesystem::path, or a string.
//
//   ckpt::save_checkpoint(state, std::filesystem::path("ckpts") / "a.ckpt");
//   ckpt::load_checkpoint("ckpts/a.ckpt");
//
// Paths are byte strings on POSIX: a std::filesystem::path converts through native(), so
// no name is re-encoded. What ckpt returns is a Path, which converts to either kind.

#include <boost/filesystem/path.hpp>

#include <filesystem>
#include <string>
#include <string_view>

namespace ckpt {

/// What every function of ckpt that takes a path takes: a boost::filesystem::path, a
/// std::filesystem::path (converted through native(): no name is re-encoded) or a string.
class PathArg : public boost::filesystem::path {
public:
    PathArg(const boost::filesystem::path& p) : path(p) {}
    PathArg(boost::filesystem::path&& p) noexcept : path(std::move(p)) {}
    PathArg(const std::filesystem::path& p) : path(p.native()) {}
    PathArg(const std::string& s) : path(s) {}
    PathArg(std::string_view s) : path(std::string(s)) {}
    PathArg(const char* s) : path(s) {}

    /// The same path as a std::filesystem::path.
    std::filesystem::path std_path() const { return std::filesystem::path(native()); }
};

/// The path type ckpt returns (the file a save wrote, what latest() found): a
/// boost::filesystem::path that converts to a std::filesystem::path as well, so that either
/// kind of variable takes it:
///
/// ```
/// std::filesystem::path written = mgr.save(p, state);
/// std::optional<std::filesystem::path> newest = ckpt::latest("ckpts", "run");
/// ```
class Path : public boost::filesystem::path {
public:
    Path() = default;
    Path(const boost::filesystem::path& p) : path(p) {}
    Path(boost::filesystem::path&& p) noexcept : path(std::move(p)) {}
    Path(const std::filesystem::path& p) : path(p.native()) {}
    Path(const std::string& s) : path(s) {}
    Path(const char* s) : path(s) {}

    operator std::filesystem::path() const { return std::filesystem::path(native()); }
};

}  // namespace ckpt
