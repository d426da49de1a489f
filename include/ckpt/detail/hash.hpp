#pragma once
// Streaming xxh3-64, the checksum of checkpoint bodies. On x86-64 the library's dispatcher
// picks the widest vector unit at run time. Loads of large bodies hash on a second thread,
// in order, while the first one reads the next bytes, so that verifying costs little on top
// of the read.

#include <xxhash.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#define CKPT_XXH3_UPDATE XXH3_64bits_update_dispatch
#define CKPT_XXH3_ONESHOT XXH3_64bits_dispatch
#else
#define CKPT_XXH3_UPDATE XXH3_64bits_update
#define CKPT_XXH3_ONESHOT XXH3_64bits
#endif

namespace ckpt::detail {

class Xxh3 {
public:
    Xxh3() : state_(XXH3_createState(), &XXH3_freeState) {
        if (!state_) throw std::bad_alloc();
        XXH3_64bits_reset(state_.get());
    }
    void update(const void* data, std::size_t n) {
        if (n) CKPT_XXH3_UPDATE(state_.get(), data, n);
    }
    std::uint64_t digest() const { return XXH3_64bits_digest(state_.get()); }

private:
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
};

inline std::uint64_t xxh3(const void* data, std::size_t n) { return CKPT_XXH3_ONESHOT(data, n); }

/// Bodies at least this large are hashed on a second thread when loaded.
inline constexpr std::uint64_t parallel_hash_threshold = 8u << 20;

/// xxh3 over a sequence of memory ranges, hashed in the order given. With `threaded`, a
/// worker thread does the hashing: update() only queues the range, whose memory must then
/// stay unchanged until wait(ticket) (or digest()) returns.
class OrderedHasher {
public:
    explicit OrderedHasher(bool threaded) {
        if (threaded) worker_ = std::thread([this] { run(); });
    }
    OrderedHasher(const OrderedHasher&) = delete;
    OrderedHasher& operator=(const OrderedHasher&) = delete;
    ~OrderedHasher() {
        if (!worker_.joinable()) return;
        {
            std::lock_guard lock(mutex_);
            stop_ = true;  // queued ranges may be gone during unwinding: drop them
            queue_.clear();
        }
        wake_worker_.notify_one();
        worker_.join();
    }

    /// Queues (or, unthreaded, hashes) a range; returns its ticket.
    std::uint64_t update(const void* data, std::size_t n) {
        if (!worker_.joinable()) {
            hash_.update(data, n);
            return ++queued_;
        }
        std::uint64_t ticket;
        {
            std::lock_guard lock(mutex_);
            queue_.emplace_back(data, n);
            ticket = ++queued_;
        }
        wake_worker_.notify_one();
        return ticket;
    }

    /// Returns once the range with this ticket, and all before it, are hashed.
    void wait(std::uint64_t ticket) {
        if (!worker_.joinable()) return;
        std::unique_lock lock(mutex_);
        hashed_cv_.wait(lock, [&] { return hashed_ >= ticket; });
    }
    void wait_all() { wait(queued_); }

    std::uint64_t digest() {
        wait_all();
        return hash_.digest();
    }

private:
    void run() {
        std::unique_lock lock(mutex_);
        for (;;) {
            wake_worker_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (stop_) return;
            const auto [data, n] = queue_.front();
            lock.unlock();
            hash_.update(data, n);
            lock.lock();
            queue_.pop_front();
            ++hashed_;
            hashed_cv_.notify_all();
        }
    }

    Xxh3 hash_;
    std::uint64_t queued_ = 0;  // written by the owner only
    std::uint64_t hashed_ = 0;  // guarded by mutex_
    std::deque<std::pair<const void*, std::size_t>> queue_;
    bool stop_ = false;
    std::mutex mutex_;
    std::condition_variable wake_worker_, hashed_cv_;
    std::thread worker_;  // last: started after, and joined before, everything it uses
};

}  // namespace ckpt::detail
