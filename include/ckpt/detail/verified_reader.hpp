#pragma once
// Reading a checkpoint body from its file into memory, hashing it in file order.
//
// Large bodies are read by two threads: both pread 1 MiB chunks, and the second one also
// hashes the chunks that are read, in order, as soon as they are. Reading from the page cache
// is a memory copy, so two threads copy nearly twice as fast as one, and the hash, which must
// run in order on one thread, overlaps the copying instead of following it.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "../error.hpp"
#include "hash.hpp"
#include "posix_io.hpp"

namespace ckpt::detail {

/// Bodies at least this large are read by two threads.
inline constexpr std::uint64_t parallel_read_threshold = 8u << 20;
inline constexpr std::size_t read_chunk = 1u << 20;

inline void pread_exact(int fd, char* dst, std::size_t len, std::uint64_t offset, const std::string& path) {
    while (len > 0) {
        const ssize_t r = ::pread(fd, dst, len, static_cast<off_t>(offset));
        if (r < 0) {
            if (errno == EINTR) continue;
            throw_io("read", path);
        }
        if (r == 0)
            throw FormatError("checkpoint '" + path + "' ended before its body did (truncated while reading?)", path);
        dst += r;
        len -= static_cast<std::size_t>(r);
        offset += static_cast<std::uint64_t>(r);
    }
}

class VerifiedReader {
public:
    /// Reads the `length` bytes that start at `offset` of `fd`, in order, through read().
    VerifiedReader(int fd, std::string path, std::uint64_t offset, std::uint64_t length)
        : fd_(fd), path_(std::move(path)), offset_(offset), remaining_(length) {
        if (length >= parallel_read_threshold) worker_ = std::thread([this] { work(); });
    }
    VerifiedReader(const VerifiedReader&) = delete;
    VerifiedReader& operator=(const VerifiedReader&) = delete;
    ~VerifiedReader() {
        if (!worker_.joinable()) return;
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
            changed();
        }
        worker_.join();  // it may be reading into or hashing caller memory: finish first
    }

    std::uint64_t remaining() const noexcept { return remaining_; }

    /// Reads the next `len` body bytes into `dst`. Returns a ticket: the bytes may still be
    /// being hashed, so `dst` must not change until wait(ticket) or digest() returns.
    std::uint64_t read(char* dst, std::size_t len) {
        if (len > remaining_)
            throw FormatError("checkpoint '" + path_ + "': a read past the end of the body", path_);
        const std::uint64_t at = offset_;
        offset_ += len;
        remaining_ -= len;
        if (!worker_.joinable()) {
            pread_exact(fd_, dst, len, at, path_);
            hash_.update(dst, len);
            hashed_ = ++queued_;
            return queued_;
        }
        std::uint64_t last;
        {
            std::lock_guard lock(mutex_);
            for (std::size_t off = 0; off < len; off += read_chunk)
                chunks_.push_back({dst + off, std::min(read_chunk, len - off), at + off, false, false});
            last = queued_ += (len + read_chunk - 1) / read_chunk;
            changed();
        }
        std::unique_lock lock(mutex_);
        for (;;) {
            if (error_) std::rethrow_exception(error_);
            if (Chunk* c = claim()) {
                read_chunk_unlocked(*c, lock);
                continue;
            }
            if (read_through(last)) return last;
            const auto seen = events_.load(std::memory_order_relaxed);
            await(lock, progress_cv_, [&] { return events_.load(std::memory_order_relaxed) != seen; });
        }
    }

    /// Returns once everything up to `ticket` is hashed.
    void wait(std::uint64_t ticket) {
        if (!worker_.joinable()) return;
        std::unique_lock lock(mutex_);
        await(lock, progress_cv_, [&] { return hashed_ >= ticket || error_; });
        if (error_) std::rethrow_exception(error_);
    }

    /// The xxh3 of everything read so far.
    std::uint64_t digest() {
        wait(queued_);
        return hash_.digest();
    }

private:
    struct Chunk {
        char* dst;
        std::size_t len;
        std::uint64_t offset;
        bool claimed;
        bool read;
    };

    // With the lock held: the oldest chunk nobody reads yet.
    Chunk* claim() {
        for (auto& c : chunks_)
            if (!c.claimed) {
                c.claimed = true;
                return &c;
            }
        return nullptr;
    }
    // With the lock held: whether every chunk up to sequence number `last` is read.
    bool read_through(std::uint64_t last) const {
        std::uint64_t seq = hashed_;
        for (const auto& c : chunks_) {
            if (++seq > last) break;
            if (!c.read) return false;
        }
        return true;
    }
    // Reads one claimed chunk with the lock released. Chunks stay put in the deque until they
    // are hashed, so `c` stays valid.
    void read_chunk_unlocked(Chunk& c, std::unique_lock<std::mutex>& lock) {
        lock.unlock();
        std::exception_ptr failed;
        try {
            pread_exact(fd_, c.dst, c.len, c.offset, path_);
        } catch (...) {
            failed = std::current_exception();
        }
        lock.lock();
        if (failed && !error_) error_ = failed;
        c.read = !failed;
        changed();
    }

    // With the lock held: wakes whoever waits for the state just changed.
    void changed() {
        events_.fetch_add(1, std::memory_order_relaxed);
        progress_cv_.notify_all();
        work_cv_.notify_one();
    }

    // Waits for `ready` (checked with the lock held). Spins briefly first: the other thread
    // usually answers within microseconds, and a virtual CPU put to sleep on a condition
    // variable can take far longer than that to be woken again.
    template <class Ready>
    void await(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Ready ready) {
        if (ready()) return;
        const auto seen = events_.load(std::memory_order_relaxed);
        lock.unlock();
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
        while (events_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        lock.lock();
        cv.wait(lock, ready);
    }

    void work() {
        std::unique_lock lock(mutex_);
        for (;;) {
            await(lock, work_cv_, [&] {
                return stop_ || error_ || (!chunks_.empty() && chunks_.front().read) ||
                       std::any_of(chunks_.begin(), chunks_.end(), [](const Chunk& c) { return !c.claimed; });
            });
            if (stop_) return;
            if (error_) {  // nothing more will be hashed; wait to be stopped
                work_cv_.wait(lock, [&] { return stop_; });
                return;
            }
            if (chunks_.front().read) {  // hashing first: only this thread can do it
                const Chunk c = chunks_.front();
                lock.unlock();
                hash_.update(c.dst, c.len);
                lock.lock();
                chunks_.pop_front();
                ++hashed_;
                changed();
            } else if (Chunk* c = claim()) {
                read_chunk_unlocked(*c, lock);
            }
        }
    }

    int fd_;
    std::string path_;
    std::uint64_t offset_;
    std::uint64_t remaining_;
    Xxh3 hash_;
    std::uint64_t queued_ = 0;  // chunks handed in (sequence number of the last)
    std::uint64_t hashed_ = 0;  // chunks hashed; guarded by mutex_ when threaded
    std::deque<Chunk> chunks_;  // not yet hashed, in file order
    std::exception_ptr error_;
    bool stop_ = false;
    std::atomic<std::uint64_t> events_{0};  // bumped at every change, for waiters that spin
    std::mutex mutex_;
    std::condition_variable work_cv_, progress_cv_;
    std::thread worker_;  // last: started after everything it uses
};

}  // namespace ckpt::detail
