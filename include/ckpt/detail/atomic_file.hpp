#pragma once
// Atomic, durable file replacement: write a temporary in the same directory, fsync it,
// rename it over the final name, fsync the directory. A crash at any point leaves either
// the old state or the complete new file; the temporary is removed on every error path.
//
// The directory may be shared (a 1777 scratch directory): the temporary's name ends in 64
// random bits, so another user cannot create it first, and a name that exists all the same is
// given up for another, a bounded number of times. The temporary is created with O_EXCL and
// O_NOFOLLOW, so no symlink planted under its name is followed, and rename() replaces a
// symlink at the final name rather than writing through it.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/filesystem.hpp>

#include <array>
#include <cerrno>
#include <charconv>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "../error.hpp"
#include "../log.hpp"
#include "posix_io.hpp"

namespace ckpt::detail {

namespace fs = boost::filesystem;

inline constexpr std::string_view temp_marker = ".tmp-";

/// 16 hex digits from the system's random source.
inline std::string random_suffix() {
    static constexpr char hex[] = "0123456789abcdef";
    std::array<unsigned char, 8> raw{};
    random_bytes(raw.data(), raw.size());
    std::string out;
    for (const auto b : raw) out += {hex[b >> 4], hex[b & 15]};
    return out;
}

/// Where temporaries' suffixes come from (random_suffix); the tests replace it to make names
/// collide.
inline std::string (*&temporary_suffix_source())() {
    static std::string (*source)() = &random_suffix;
    return source;
}

/// The temporary for `final_name`: ".{final_name}.tmp-{pid}{after_pid}{random}". The leading
/// dot keeps it out of listings, the pid tells a later cleanup whether its writer is still alive.
inline std::string temporary_name(const std::string& final_name, std::string_view after_pid = "-") {
    return "." + final_name + std::string(temp_marker) + std::to_string(::getpid()) + std::string(after_pid) +
           temporary_suffix_source()();
}

/// What follows the pid in the name of a file retention deleted and a thread of the manager
/// is freeing (detail/unlinker.hpp): ".{final_name}.tmp-{pid}-deleted-{random}". Cleaned up
/// as any temporary, and told apart from a save's in listings.
inline constexpr std::string_view deleted_marker = "-deleted-";

/// The hidden name under which retention's deletion of `final_name` is freed.
inline std::string deleted_name(const std::string& final_name) { return temporary_name(final_name, deleted_marker); }

/// Whether the temporary `name` is a file retention deleted, being freed, rather than a save.
inline bool is_deleted_temporary(std::string_view name) {
    const auto at = name.rfind(temp_marker);
    return at != std::string_view::npos && name.find(deleted_marker, at) != std::string_view::npos;
}

/// How many temporary names a writer tries before it gives up: each taken one is someone
/// else's (64 random bits do not collide by chance).
inline constexpr int temporary_attempts = 16;

/// The writer's pid if `name` is one of our temporaries.
inline std::optional<long> temporary_owner(std::string_view name) {
    if (name.empty() || name.front() != '.') return std::nullopt;
    const auto at = name.rfind(temp_marker);
    if (at == std::string_view::npos) return std::nullopt;
    long pid = 0;
    const char* first = name.data() + at + temp_marker.size();
    const char* last = name.data() + name.size();
    auto [ptr, ec] = std::from_chars(first, last, pid);
    if (ec != std::errc() || ptr == last || *ptr != '-' || pid <= 0) return std::nullopt;
    return pid;
}

inline std::string directory_of(const fs::path& file) {
    const fs::path parent = file.parent_path();
    return parent.empty() ? std::string(".") : parent.string();
}

inline void require_directory(const std::string& dir, const std::string& for_file) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
        const int err = errno;
        throw IoError("cannot save '" + for_file + "': directory '" + dir + "' " +
                          (err == ENOENT ? std::string("does not exist") : errno_text(err)),
                      for_file, err);
    }
    if (!S_ISDIR(st.st_mode))
        throw IoError("cannot save '" + for_file + "': '" + dir + "' is not a directory", for_file, ENOTDIR);
}

class AtomicFile {
public:
    /// `overwrite` false makes commit() fail with EEXIST instead of replacing an existing file.
    explicit AtomicFile(const fs::path& final_path, bool overwrite = true)
        : final_(final_path.string()), dir_(directory_of(final_path)), overwrite_(overwrite) {
        require_directory(dir_, final_);
        if (!overwrite_ && ::access(final_.c_str(), F_OK) == 0)
            throw IoError("cannot save '" + final_ + "': the file exists and overwriting was not allowed", final_,
                          EEXIST);
        for (int attempt = 0;; ++attempt) {
            temp_ = (fs::path(dir_) / temporary_name(final_path.filename().string())).string();
            int fd;
            do fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
            while (fd < 0 && errno == EINTR);
            if (fd >= 0) {
                fd_ = Fd(fd);
                break;
            }
            const int err = errno;
            if (err == EEXIST && attempt + 1 < temporary_attempts) continue;  // another's: another name
            if (err == EEXIST)
                throw IoError("cannot save '" + final_ + "': " + std::to_string(temporary_attempts) +
                                  " temporary names in '" + dir_ + "' were all taken (as '" + temp_ +
                                  "' is): another process creates them",
                              final_, err);
            throw IoError("cannot save '" + final_ + "': cannot create a file in '" + dir_ + "': " + errno_text(err),
                          final_, err);
        }
    }
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    ~AtomicFile() {
        if (!committed_) {
            fd_.reset();
            ::unlink(temp_.c_str());
        }
    }

    int fd() const noexcept { return fd_.get(); }
    const std::string& final_path() const noexcept { return final_; }
    const std::string& temp_path() const noexcept { return temp_; }

    /// For writers that replace the temporary by a file of their own (libzip renames its own
    /// temporary over it): commit() then makes that file durable, not the one first opened.
    void reopen_replaced() {
        int fd;
        do fd = ::open(temp_.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        while (fd < 0 && errno == EINTR);
        if (fd < 0) throw_io("reopen the temporary of", final_);
        fd_ = Fd(fd);
    }

    void commit() {
        fsync_fd(fd_.get(), final_);
        fd_.close_checked(final_);
        if (overwrite_) {
            if (::rename(temp_.c_str(), final_.c_str()) != 0) throw_io("rename a temporary file to", final_);
        } else {
            if (::link(temp_.c_str(), final_.c_str()) != 0) throw_io("create", final_);  // fails if it exists
            ::unlink(temp_.c_str());
        }
        committed_ = true;
        fsync_directory(dir_);
    }

private:
    std::string final_, dir_, temp_;
    bool overwrite_;
    Fd fd_;
    bool committed_ = false;
};

/// Removes temporaries in `dir` whose name starts with ".{prefix}" and whose writer is gone:
/// those whose final name `ours` says are of a series the caller holds the lock of, and the
/// others whose writer process is gone (a crash mid-save). Temporaries of live writers of other
/// series are left alone.
inline void remove_stale_temporaries(const fs::path& dir, std::string_view prefix,
                                     const std::function<bool(std::string_view)>& ours = {}) {
    boost::system::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.size() < prefix.size() + 1 || name.compare(1, prefix.size(), prefix) != 0) continue;
        const auto pid = temporary_owner(name);
        if (!pid) continue;
        const std::string_view final_name = std::string_view(name).substr(1, name.rfind(temp_marker) - 1);
        const bool series = ours && ours(final_name);
        if (!series && (::kill(static_cast<pid_t>(*pid), 0) == 0 || errno != ESRCH)) continue;
        if (::unlink(it->path().c_str()) == 0)
            log(LogLevel::info, "removed stale temporary '" + it->path().string() + "' left by process " +
                                    std::to_string(*pid));
    }
}

}  // namespace ckpt::detail
