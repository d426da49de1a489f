#pragma once
// The seed's async_save: the training thread copies the state into a snapshot buffer (one
// memcpy per tensor) and a writer thread persists it. A fixed number of buffers, reused
// from save to save, bounds memory and the number of saves in flight; saves are written in
// the order they were handed over. A background error is kept and rethrown to the training
// thread at its next call, never swallowed.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../log.hpp"
#include "../param_dict.hpp"

namespace ckpt::detail {

/// A deep copy of `dict`: the caller may change its tensors and bound variables as soon as
/// this returns. Bindings are read in `boost`, the checkpoint's encoding of serialize() types.
inline ParamDict snapshot(const ParamDict& dict, ObjectEncoding boost) {
    ParamDict copy;
    for (const auto& [name, value] : dict)
        if (const Tensor* t = value.get_if<Tensor>()) copy.set(name, t->clone());
        else copy.set(name, materialized(value, boost));
    return copy;
}

/// Makes `buffer` a deep copy of `dict`. When `buffer` holds the same names with tensors of
/// the same types, shapes and orders (a model saved again), their memory is reused: one
/// memcpy per tensor, no allocation and no page faults. Otherwise it is rebuilt.
inline void snapshot_into(ParamDict& buffer, const ParamDict& dict, ObjectEncoding boost) {
    bool same_layout = buffer.size() == dict.size();
    auto b = buffer.begin();
    for (auto d = dict.begin(); same_layout && d != dict.end(); ++b, ++d) {
        const Tensor* from = d->value.get_if<Tensor>();
        const Tensor* to = b->value.get_if<Tensor>();
        same_layout = b->name == d->name && (from == nullptr) == (to == nullptr) &&
                      (!from || (from->dtype() == to->dtype() && from->shape() == to->shape() &&
                                 from->order() == to->order() && !to->is_view()));
    }
    if (!same_layout) {
        buffer = snapshot(dict, boost);
        return;
    }
    b = buffer.begin();
    for (auto d = dict.begin(); d != dict.end(); ++b, ++d) {
        if (const Tensor* from = d->value.get_if<Tensor>()) {
            if (from->nbytes()) std::memcpy(b->value.get_if<Tensor>()->data(), from->data(), from->nbytes());
        } else {
            b->value = materialized(d->value, boost);
        }
    }
}

class BackgroundSaver {
public:
    /// The job persists the snapshot it is given; it runs on the background thread.
    using Job = std::function<void(const ParamDict&)>;

    explicit BackgroundSaver(std::size_t buffers = 1) : buffers_(buffers < 1 ? 1 : buffers) {}
    BackgroundSaver(const BackgroundSaver&) = delete;
    BackgroundSaver& operator=(const BackgroundSaver&) = delete;
    ~BackgroundSaver() {
        try {
            wait();
        } catch (...) {  // nobody left to tell but the log
            log_failure(std::current_exception());
        }
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        work_.notify_one();
        if (thread_.joinable()) thread_.join();
    }

    /// Whether a buffer is free now (no save would have to wait for one).
    bool buffer_free() const {
        std::lock_guard lock(mutex_);
        return has_free_buffer();
    }

    /// Snapshots `state` into a free buffer, waiting for one if every buffer is in flight,
    /// and queues `job` on it. Rethrows the error of a finished save first. Returns whether
    /// it had to wait.
    bool submit(const ParamDict& state, ObjectEncoding boost, Job job) {
        std::unique_lock lock(mutex_);
        rethrow_error();
        const bool waited = !has_free_buffer();
        done_.wait(lock, [&] { return has_free_buffer(); });
        rethrow_error();
        Buffer* free = free_buffer();
        free->busy = true;  // the training thread's until queued: the writer never touches it
        lock.unlock();
        try {
            snapshot_into(free->state, state, boost);
        } catch (...) {
            lock.lock();
            free->busy = false;
            throw;
        }
        lock.lock();
        queued_.push_back({free, std::move(job), ++submitted_});
        if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
        lock.unlock();
        work_.notify_one();
        return waited;
    }

    /// Blocks until every queued save is durable; rethrows the first error.
    void wait() {
        std::unique_lock lock(mutex_);
        done_.wait(lock, [&] { return queued_.empty() && !writing_; });
        rethrow_error();
    }

    /// How many saves were queued so far: the number of the last one (they are written in turn).
    std::int64_t submitted() const {
        std::lock_guard lock(mutex_);
        return submitted_;
    }
    /// Whether save number `n` (submitted() after it was queued) is finished; never blocks.
    bool finished(std::int64_t n) const {
        std::lock_guard lock(mutex_);
        return written_ >= n;
    }
    /// Blocks until save number `n` is finished, not the saves queued after it. What it failed
    /// with, or nothing when it is durable. The failure stays to be rethrown by the next
    /// submit(), wait() or check(), for the training thread: any thread may call this.
    std::exception_ptr wait_for(std::int64_t n) {
        std::unique_lock lock(mutex_);
        done_.wait(lock, [&] { return written_ >= n; });
        const auto failed = failures_.find(n);
        return failed == failures_.end() ? nullptr : failed->second;
    }

    /// Rethrows the error of a save that has finished; never blocks.
    void check() {
        std::lock_guard lock(mutex_);
        rethrow_error();
    }

    struct Written {
        std::int64_t saves;  ///< finished, failed ones included
        double seconds;      ///< the writer thread's time on them
        double max_seconds;  ///< the longest one
    };
    Written written() const {
        std::lock_guard lock(mutex_);
        return {written_, write_seconds_, max_write_seconds_};
    }

private:
    struct Buffer {
        ParamDict state;
        bool busy = false;  // snapshotting, queued or being written
    };
    struct Queued {
        Buffer* buffer;
        Job job;
        std::int64_t number;
    };

    Buffer* free_buffer() {
        for (auto& b : buffers_)
            if (!b.busy) return &b;
        return nullptr;
    }
    bool has_free_buffer() const {
        return std::any_of(buffers_.begin(), buffers_.end(), [](const Buffer& b) { return !b.busy; });
    }

    static void log_failure(std::exception_ptr failed) {
        log(LogLevel::warning, "a background checkpoint save failed: " + message_of(failed));
    }

    void rethrow_error() {
        if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }

    void run() {
        std::unique_lock lock(mutex_);
        for (;;) {
            work_.wait(lock, [&] { return stopping_ || !queued_.empty(); });
            if (queued_.empty()) return;  // stopping, and nothing left to write
            Queued next = std::move(queued_.front());
            queued_.pop_front();
            writing_ = true;
            lock.unlock();
            std::exception_ptr failed;
            const auto start = std::chrono::steady_clock::now();
            try {
                next.job(next.buffer->state);
            } catch (...) {
                failed = std::current_exception();
            }
            next.job = nullptr;  // release what the job captured before the buffer is reused
            const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            lock.lock();
            ++written_;
            write_seconds_ += took;
            max_write_seconds_ = std::max(max_write_seconds_, took);
            if (failed) {  // for wait_for(); the last few are enough, it asks about saves in flight
                failures_.emplace(next.number, failed);
                if (failures_.size() > 8) failures_.erase(failures_.begin());
            }
            if (failed && !error_) error_ = failed;
            else if (failed) log_failure(failed);  // an earlier error is still to be reported
            next.buffer->busy = false;
            writing_ = false;
            done_.notify_all();
        }
    }

    mutable std::mutex mutex_;
    std::condition_variable work_;  // the writer: a save was queued, or stop
    std::condition_variable done_;  // the training thread: a save finished
    std::vector<Buffer> buffers_;
    std::deque<Queued> queued_;
    bool writing_ = false;
    bool stopping_ = false;
    std::int64_t submitted_ = 0, written_ = 0;
    std::map<std::int64_t, std::exception_ptr> failures_;  // by number, the newest few
    double write_seconds_ = 0, max_write_seconds_ = 0;
    std::exception_ptr error_;
    std::thread thread_;
};

}  // namespace ckpt::detail
