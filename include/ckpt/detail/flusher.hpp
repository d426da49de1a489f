#pragma once
// The durable level's copier (ManagerOptions::durable): checkpoints written to a fast local
// directory are copied, on a thread of their own, to a durable shared one. Each copy goes
// to a temporary, is checked while it is copied (the size and the body checksum its header
// announces: a damaged source is never published), made durable, and only then renamed into
// place; a process killed mid-copy leaves a temporary, which no listing takes and the next
// manager removes. The training thread only queues jobs: it never waits for a copy.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../format.hpp"
#include "../log.hpp"
#include "atomic_file.hpp"
#include "hash.hpp"
#include "posix_io.hpp"

namespace ckpt {

/// What the copies to the durable level did so far (CheckpointManager::flush_stats()).
struct FlushStats {
    std::int64_t flushed = 0;    ///< files copied, checked and in place on the durable level
    std::int64_t failed = 0;     ///< copies that failed (each logged; the local file stays)
    std::int64_t given_up = 0;   ///< global indexes whose files never reached the durable level in time
    /// Of the failed copies, those that found the durable level full (no space, or over
    /// quota) after its retention had made what room it could. The first of a run of them is
    /// a warning; the others are counted here.
    std::int64_t no_space = 0;
    std::int64_t pending = 0;    ///< queued or being copied now
    std::uint64_t bytes = 0;     ///< bytes copied
    double seconds = 0;          ///< copier time spent copying, pacing included
    std::string last_error;      ///< the newest failure's message
};

namespace detail {

/// Keeps a copy at or under `bytes_per_second` (0: no limit) by sleeping between blocks.
class Pacer {
public:
    explicit Pacer(double bytes_per_second) : rate_(bytes_per_second) {}
    /// The block size that keeps sleeps short (about a tenth of a second of copying).
    std::size_t block() const {
        constexpr std::size_t most = 4u << 20, least = 64u << 10;
        if (rate_ <= 0) return most;
        return std::clamp(static_cast<std::size_t>(rate_ / 10), least, most);
    }
    void start() {
        start_ = std::chrono::steady_clock::now();
        done_ = 0;
    }
    /// After `n` more bytes: sleeps until they are due.
    void account(std::size_t n) {
        done_ += n;
        if (rate_ <= 0) return;
        const auto due = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(static_cast<double>(done_) / rate_));
        std::this_thread::sleep_until(due);
    }

private:
    double rate_;
    std::chrono::steady_clock::time_point start_{};
    std::uint64_t done_ = 0;
};

/// Copies `src` to `dst` atomically and durably (temporary, fsync, rename, directory fsync).
/// The bytes are copied in the kernel (copy_file_range) where the two file systems allow it,
/// through a buffer where they do not, and each block's write to the disk is started at once.
/// With `checkpoint`, the copy must be a whole checkpoint: each block is read back from the
/// copy (from the page cache), its
/// header checked and its body hashed, and the copy is renamed into place only when the
/// body matches the header's checksum (ChecksumError or FormatError naming `src` otherwise):
/// a damaged source is never published. Returns the bytes copied. The previous file at
/// `dst`, if any, is replaced only by a whole, checked copy; on any error it is untouched
/// and no temporary is left.
inline std::uint64_t copy_file_checked(const fs::path& src, const fs::path& dst, bool checkpoint, Pacer& pace) {
    const std::string from = src.string(), to = dst.string();
    Fd in = open_for_read(from, checkpoint ? "checkpoint" : "file");
    const std::uint64_t size = file_size(in.get(), from);
    AtomicFile out(dst);
    Fd copy = checkpoint ? open_for_read(out.temp_path()) : Fd();
    auto buffer = std::make_unique_for_overwrite<std::byte[]>(pace.block());
    FileHeader header;
    Xxh3 hash;
    bool in_kernel = true;
    pace.start();
    for (std::uint64_t done = 0; done < size;) {
        const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(pace.block(), size - done));
        std::size_t got = 0;
        if (in_kernel) {
            const ssize_t r = ::copy_file_range(in.get(), nullptr, out.fd(), nullptr, want, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && done == 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
                in_kernel = false;
                continue;
            }
            if (r < 0) throw_io("copy '" + from + "' to", to);
            got = static_cast<std::size_t>(r);
            if (checkpoint && read_full(copy.get(), buffer.get(), got, to) != got)
                throw IoError("cannot read back the copy '" + out.temp_path() + "' of '" + from + "'", to, EIO);
        } else {
            got = read_full(in.get(), buffer.get(), want, from);
            write_all(out.fd(), buffer.get(), got, to);
        }
        if (got == 0) throw IoError("cannot copy '" + from + "' to '" + to + "': it shrank while it was copied", from, EIO);
        // start writing the block to the disk now, while the next ones are copied: commit()'s
        // fsync then has little left to wait for
        ::sync_file_range(out.fd(), static_cast<off_t>(done), static_cast<off_t>(got), SYNC_FILE_RANGE_WRITE);
        if (checkpoint) {
            std::size_t body_from = 0;
            if (done == 0) {
                header = decode_header(buffer.get(), got, size, from);
                body_from = header_size;
            }
            hash.update(buffer.get() + body_from, got - body_from);
        }
        done += got;
        pace.account(got);
    }
    if (checkpoint) {
        if (size == 0) decode_header(buffer.get(), 0, 0, from);  // says why
        if (hash.digest() != header.body_hash)
            throw ChecksumError("cannot copy checkpoint '" + from + "' to '" + to +
                                    "': its body does not match its checksum (the local copy is damaged)",
                                from);
    }
    out.commit();
    return size;
}

/// Copies files to the durable level in the order they were queued, on a thread of its own.
class Flusher {
public:
    struct Job {
        fs::path source, target;
        bool checkpoint = true;  ///< checked as it is copied (copy_file_checked)
        /// Copy only once these all exist (a global index: the ranks' files it names, which the
        /// ranks' own copiers bring); given up, with a warning, after waiting `patience` with
        /// nothing queued before it (so a long queue of this rank's own copies, paced, does not
        /// use up the time the other ranks' copies have).
        std::vector<fs::path> needs{};
        std::chrono::milliseconds patience{};
        std::optional<std::chrono::steady_clock::time_point> give_up{};
        /// After the copy is in place, on the copier's thread (the durable level's retention).
        std::function<void(const fs::path& target)> done{};
        /// Before a copy that would not fit in the space left where it goes, on the copier's
        /// thread: deletes what the durable level's retention would delete once it is there.
        std::function<void()> make_room{};
    };

    explicit Flusher(double bytes_per_second) : pace_(bytes_per_second), thread_([this] { run(); }) {}
    Flusher(const Flusher&) = delete;
    Flusher& operator=(const Flusher&) = delete;
    /// Finishes every job queued (so that a program that ends normally leaves its copies in place).
    ~Flusher() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        thread_.join();
    }

    /// Queues `job`; never waits for a copy.
    void submit(Job job) {
        {
            std::lock_guard lock(mutex_);
            queue_.push_back(std::move(job));
        }
        wake_.notify_all();
    }

    /// Whether `source` is queued or being copied (the local level's retention keeps it).
    bool pinned(const fs::path& source) const {
        std::lock_guard lock(mutex_);
        if (current_ && *current_ == source) return true;
        return std::any_of(queue_.begin(), queue_.end(), [&](const Job& j) { return j.source == source; });
    }

    /// Blocks until every job queued so far has ended: copied, failed or given up.
    FlushStats wait() {
        std::unique_lock lock(mutex_);
        idle_.wait(lock, [&] { return queue_.empty() && !current_; });
        return stats_locked();
    }

    FlushStats stats() const {
        std::lock_guard lock(mutex_);
        return stats_locked();
    }

    /// The error of the newest failed copy of `source`, if its newest copy failed.
    std::optional<std::string> failure_of(const fs::path& source) const {
        std::lock_guard lock(mutex_);
        if (last_failed_ == source) return stats_.last_error;
        return std::nullopt;
    }

private:
    FlushStats stats_locked() const {
        FlushStats s = stats_;
        s.pending = static_cast<std::int64_t>(queue_.size()) + (current_ ? 1 : 0);
        return s;
    }

    /// Whether `source` fits where `target` goes, by the space its file system says is left.
    static bool fits(const fs::path& source, const fs::path& target) {
        struct stat st {};
        struct statvfs fs {};
        if (::stat(source.c_str(), &st) != 0 || ::statvfs(target.parent_path().c_str(), &fs) != 0) return true;
        const auto left = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
        return left >= static_cast<std::uint64_t>(st.st_size) + fs.f_frsize;  // and a block of slack
    }

    static bool all_exist(const std::vector<fs::path>& files) {
        return std::all_of(files.begin(), files.end(), [](const fs::path& f) {
            struct stat st {};
            return ::stat(f.c_str(), &st) == 0;
        });
    }

    // The first job that can run now: in order, except that a job waiting for files lets later
    // jobs pass (a rank's own checkpoints must not wait for the other ranks'). A waiting job's
    // patience runs from the first time it is looked at, when nothing before it can run. Drops
    // the jobs whose files did not come in time.
    std::optional<Job> next_locked() {
        const auto now = std::chrono::steady_clock::now();
        for (auto it = queue_.begin(); it != queue_.end();) {
            if (it->needs.empty() || all_exist(it->needs)) {
                Job job = std::move(*it);
                queue_.erase(it);
                return job;
            }
            if (!it->give_up) it->give_up = now + it->patience;
            if (now < *it->give_up) {
                ++it;
                continue;
            }
            ++stats_.given_up;
            log(LogLevel::warning, "not copying '" + it->source.string() + "' to the durable level: '" +
                                       it->needs.front().string() + "' and the other files it names did not all arrive there in time");
            it = queue_.erase(it);
        }
        return std::nullopt;
    }

    void run() {
        std::unique_lock lock(mutex_);
        for (;;) {
            std::optional<Job> job = next_locked();
            if (!job) {
                if (queue_.empty()) {
                    idle_.notify_all();
                    if (stop_) return;
                    wake_.wait(lock);
                } else {
                    // files some job waits for: a few stat() calls, often enough not to add to a
                    // step's time on the durable level
                    wake_.wait_for(lock, std::chrono::milliseconds(10));
                }
                continue;
            }
            current_ = job->source;
            lock.unlock();
            const auto start = std::chrono::steady_clock::now();
            std::optional<std::string> error;
            bool full = false;
            std::uint64_t copied = 0;
            try {
                if (job->make_room && !fits(job->source, job->target)) job->make_room();
                copied = copy_file_checked(job->source, job->target, job->checkpoint, pace_);
            } catch (const IoError& e) {
                error = e.what();
                full = e.error_code() == ENOSPC || e.error_code() == EDQUOT;
            } catch (const std::exception& e) {
                error = e.what();
            }
            if (!error && job->done) {
                try {
                    job->done(job->target);
                } catch (const std::exception& e) {
                    log(LogLevel::warning, "after copying '" + job->target.string() + "': " + e.what());
                }
            }
            // a full durable level is said once, when it fills, and once when it has room again
            if (error && full && full_said_)
                log(LogLevel::info, "could not copy '" + job->source.string() + "' to the durable level, still full: " + *error);
            else if (error && full)
                log(LogLevel::warning, "the durable level is full: could not copy '" + job->source.string() + "' there (" +
                                           *error + "), after its retention made what room it could; copies fail "
                                           "until there is room, each counted in FlushStats::no_space, and the local "
                                           "level keeps its files meanwhile only as its own retention allows");
            else if (error)
                log(LogLevel::warning, "could not copy '" + job->source.string() + "' to the durable level: " + *error);
            else if (full_said_)
                log(LogLevel::notice, "the durable level has room again: copied '" + job->source.string() + "'");
            full_said_ = error ? full_said_ || full : false;
            const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            lock.lock();
            stats_.seconds += took;
            if (error) {
                ++stats_.failed;
                stats_.no_space += full;
                stats_.last_error = *error;
                last_failed_ = job->source;
            } else {
                ++stats_.flushed;
                stats_.bytes += copied;
                if (last_failed_ == job->source) last_failed_.reset();
            }
            current_.reset();
        }
    }

    Pacer pace_;  // the copier thread's own
    mutable std::mutex mutex_;
    std::condition_variable wake_, idle_;
    std::deque<Job> queue_;
    std::optional<fs::path> current_, last_failed_;
    FlushStats stats_;
    bool full_said_ = false;  // the copier thread's own
    bool stop_ = false;
    std::thread thread_;  // last: started once the rest is in place
};

}  // namespace detail
}  // namespace ckpt
