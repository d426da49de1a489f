#pragma once
// A series: the checkpoints of one prefix in one directory, and its life (docs/FORMAT.md §12).
//
// One writer at a time. A CheckpointManager holds an exclusive lock on "{dir}/{prefix}.lock"
// for as long as it lives; a second writer of the same series (the same job started twice, a
// second job given the same name) is refused with the holder named:
//
//   ckpt::SeriesLocked: prefix 'heat' in 'runs' is held by pid 4242 on host node17 since 2026-11-26 12:01:07 UTC
//
// The kernel releases the lock when its holder dies, however it dies; the next writer takes
// the series over and says so.
//
// A series that ended says so. on_train_end() writes "{dir}/{prefix}.finished", naming the
// final checkpoint, its position and what the loop was given; a later run that restores that
// checkpoint learns the series is finished (Restored::finished), and a loop that runs to the
// same end saves and deletes nothing.

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <boost/filesystem.hpp>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint.hpp"
#include "detail/atomic_file.hpp"
#include "detail/posix_io.hpp"
#include "error.hpp"
#include "log.hpp"
#include "policies/naming.hpp"
#include "path.hpp"

namespace ckpt {

/// A series (directory, prefix) is held by another writer: another process, or another
/// manager of this one. The message names the holder.
class SeriesLocked : public ConfigError {
public:
    using ConfigError::ConfigError;
};

/// What "{prefix}.finished" records: the series ended at this checkpoint.
struct FinishedRecord {
    std::string file;             ///< the final checkpoint, relative to the series' directory
    std::uint64_t body_hash = 0;  ///< its header's body checksum
    std::int64_t epoch = 0, step = 0, global_step = 0;
    std::string arguments;        ///< what the loop was given ("epochs=10"), as the program said
    std::string finished;         ///< when, UTC ("2026-11-26T12:31:40Z")
};

namespace detail {

inline std::string lock_file_name(std::string_view prefix) { return std::string(prefix) + ".lock"; }
inline std::string finished_file_name(std::string_view prefix) { return std::string(prefix) + ".finished"; }

/// "2026-11-26T12:01:07Z": now, UTC, to the second.
inline std::string utc_now_iso() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

/// "2026-11-26T12:01:07Z" as "2026-11-26 12:01:07 UTC", for messages; other text as it is.
inline std::string readable_time(std::string iso) {
    if (iso.size() == 20 && iso[10] == 'T' && iso[19] == 'Z') return iso.substr(0, 10) + " " + iso.substr(11, 8) + " UTC";
    return iso;
}

inline std::string host_name() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
    return buf;
}

/// The "key value" lines of a series file (FORMAT.md §12): the first 4096 bytes, lines
/// without a space left out.
inline std::vector<std::pair<std::string, std::string>> parse_series_lines(std::string_view text) {
    std::vector<std::pair<std::string, std::string>> out;
    text = text.substr(0, 4096);
    while (!text.empty()) {
        const auto end = text.find('\n');
        const std::string_view line = text.substr(0, end);
        text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
        const auto space = line.find(' ');
        if (space == std::string_view::npos) continue;
        out.emplace_back(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
    }
    return out;
}

inline std::string series_value(const std::vector<std::pair<std::string, std::string>>& lines, std::string_view key) {
    for (const auto& [k, v] : lines)
        if (k == key) return v;
    return {};
}

/// Reads at most 4096 bytes of `fd` from its start.
inline std::string read_head(int fd) {
    std::string text(4096, '\0');
    ssize_t n;
    do n = ::pread(fd, text.data(), text.size(), 0);
    while (n < 0 && errno == EINTR);
    text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    return text;
}

/// "pid 4242 on host node17 since 2026-11-26 12:01:07 UTC", from a lock file's lines; empty
/// when they name no holder.
inline std::string holder_text(const std::vector<std::pair<std::string, std::string>>& lines) {
    const std::string pid = series_value(lines, "pid");
    if (pid.empty()) return {};
    std::string out = "pid " + pid;
    if (const auto host = series_value(lines, "host"); !host.empty()) {
        out += " on host " + host;
        if (host == host_name() && pid == std::to_string(::getpid())) out += " (this process: another writer of it)";
    }
    if (const auto since = series_value(lines, "started"); !since.empty()) out += " since " + readable_time(since);
    return out;
}

/// The exclusive lock of a series, held from construction to destruction (FORMAT.md §12.1).
class SeriesLock {
public:
    SeriesLock() = default;

    /// Takes the lock of `prefix` in `dir` (which must exist), or throws SeriesLocked naming
    /// its holder. Unlocked (held() false), with a note, where the directory cannot be written
    /// and holds no lock file, or where the file system has no flock.
    SeriesLock(const fs::path& dir, std::string_view prefix) {
        const fs::path file = dir / lock_file_name(prefix);
        const std::string path = file.string();
        const std::string series = "prefix '" + std::string(prefix) + "' in '" + dir.string() + "'";
        int fd;
        do fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        while (fd < 0 && errno == EINTR);
        writable_ = fd >= 0;
        if (fd < 0 && (errno == EROFS || errno == EACCES || errno == EPERM)) {
            const int why = errno;
            do fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
            while (fd < 0 && errno == EINTR);
            if (fd < 0) {
                log(LogLevel::info, series + " is not locked: its lock file '" + path + "' cannot be created (" +
                                        errno_text(why) + "), so nothing can be saved there either");
                return;
            }
        }
        if (fd < 0) throw_io("open the lock file of " + series + ",", path);
        fd_ = Fd(fd);
        // Refused for a moment, the lock may be another's brief look (ckpt ls); asked again
        // every 10 ms for 200 ms before the series counts as held.
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
        for (;;) {
            if (::flock(fd_.get(), LOCK_EX | LOCK_NB) == 0) break;
            const int err = errno;
            if (err == EINTR) continue;
            if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL || err == EBADF) {
                log(LogLevel::warning, series + " is not locked: the file system of '" + dir.string() +
                                           "' has no flock (" + errno_text(err) +
                                           "); make sure no other job writes this series (docs/ROBUSTNESS.md)");
                fd_.reset();
                return;
            }
            if (err != EWOULDBLOCK) throw_io("lock", path, err);
            if (std::chrono::steady_clock::now() >= give_up) {
                const std::string holder = holder_text(parse_series_lines(read_head(fd_.get())));
                throw SeriesLocked(series + " is held by " +
                                   (holder.empty() ? "another writer, which has not said who it is yet" : holder) +
                                   ": one job writes a series at a time; give this one another prefix or directory, "
                                   "or stop the other first (" + path + ")");
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        held_ = true;
        // A holder named in the file ended without releasing it: it was killed.
        if (const std::string before = holder_text(parse_series_lines(read_head(fd_.get()))); !before.empty())
            log(LogLevel::notice, "taking over " + series + " from " + before + ", which ended without releasing it");
        if (!writable_) return;
        const std::string text = "ckpt-lock 1\npid " + std::to_string(::getpid()) + "\nhost " + host_name() +
                                 "\nstarted " + utc_now_iso() + "\n";
        if (::ftruncate(fd_.get(), 0) != 0) throw_io("truncate", path);
        pwrite_all(fd_.get(), text.data(), text.size(), 0, path);
    }
    SeriesLock(SeriesLock&&) noexcept = default;
    SeriesLock& operator=(SeriesLock&& o) noexcept {
        if (this != &o) {
            release();
            fd_ = std::move(o.fd_);
            held_ = std::exchange(o.held_, false);
            writable_ = o.writable_;
        }
        return *this;
    }
    ~SeriesLock() { release(); }

    bool held() const noexcept { return held_; }

private:
    /// Says the series is free (an empty file), then closes it, which releases the lock.
    void release() noexcept {
        if (held_ && writable_) [[maybe_unused]] const int r = ::ftruncate(fd_.get(), 0);
        held_ = false;
        fd_.reset();
    }

    Fd fd_;
    bool held_ = false;
    bool writable_ = false;
};

}  // namespace detail

/// The record of `prefix` in `dir` that the series finished, or nothing when there is none,
/// it does not parse, or it is stale: its file is gone or holds another body than it names.
/// Whether a newer checkpoint exists is the caller's to check.
inline std::optional<FinishedRecord> read_finished(const PathArg& dir, std::string_view prefix) {
    const fs::path path = dir / detail::finished_file_name(prefix);
    int fd;
    do fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return std::nullopt;
    const detail::Fd owned(fd);
    const auto lines = detail::parse_series_lines(detail::read_head(fd));
    if (detail::series_value(lines, "ckpt-finished") != "1") return std::nullopt;
    FinishedRecord r;
    r.file = detail::series_value(lines, "file");
    r.arguments = detail::series_value(lines, "arguments");
    r.finished = detail::series_value(lines, "finished");
    const auto number = [&](std::string_view key, std::int64_t& out) {
        const auto n = detail::parse_count(detail::series_value(lines, key));
        if (n) out = *n;
        return n.has_value();
    };
    const std::string hash = detail::series_value(lines, "body_xxh3");
    if (r.file.empty() || hash.size() != 16 || !number("epoch", r.epoch) || !number("step", r.step) ||
        !number("global_step", r.global_step))
        return std::nullopt;
    auto [ptr, ec] = std::from_chars(hash.data(), hash.data() + hash.size(), r.body_hash, 16);
    if (ec != std::errc() || ptr != hash.data() + hash.size()) return std::nullopt;
    // a name that leaves the directory is no file of the series
    if (r.file.front() == '/' || r.file.find("..") != std::string::npos) return std::nullopt;
    try {
        if (read_header(dir / r.file).body_hash != r.body_hash) return std::nullopt;
    } catch (const Error&) {
        return std::nullopt;
    }
    return r;
}

namespace detail {

/// Writes the record that `prefix` in `dir` finished with `record` (atomically, durably).
inline void write_finished(const fs::path& dir, std::string_view prefix, const FinishedRecord& record) {
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(record.body_hash));
    std::string arguments = record.arguments;
    for (char& c : arguments)
        if (c == '\n' || c == '\r') c = ' ';
    const std::string text = "ckpt-finished 1\nfile " + record.file + "\nbody_xxh3 " + hash + "\nepoch " +
                             std::to_string(record.epoch) + "\nstep " + std::to_string(record.step) +
                             "\nglobal_step " + std::to_string(record.global_step) + "\narguments " + arguments +
                             "\nfinished " + record.finished + "\n";
    const fs::path file = dir / finished_file_name(prefix);
    AtomicFile out(file);
    write_all(out.fd(), text.data(), text.size(), file.string());
    out.commit();
}

/// "finished at epoch 10, step 1875 (global step 18750) with 'epochs=10' on 2026-11-26 12:31:40 UTC".
inline std::string finished_text(const FinishedRecord& r) {
    return "finished at epoch " + std::to_string(r.epoch) + ", step " + std::to_string(r.step) + " (global step " +
           std::to_string(r.global_step) + ")" + (r.arguments.empty() ? "" : " with '" + r.arguments + "'") +
           (r.finished.empty() ? "" : " on " + readable_time(r.finished));
}

}  // namespace detail

}  // namespace ckpt
