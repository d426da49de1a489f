#pragma once
// One checkpoint write at a time on a background thread, for the seed's async_save. The
// caller hands over a snapshot it no longer touches; an error in the background is kept and
// rethrown to the caller at its next call, never swallowed.

#include <atomic>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "../log.hpp"

namespace ckpt::detail {

class BackgroundSave {
public:
    BackgroundSave() = default;
    BackgroundSave(const BackgroundSave&) = delete;
    BackgroundSave& operator=(const BackgroundSave&) = delete;
    ~BackgroundSave() {
        try {
            wait();
        } catch (const std::exception& e) {  // nobody left to tell but the log
            log(LogLevel::warning, std::string("a background checkpoint save failed: ") + e.what());
        }
    }

    /// Starts `job` once the save in flight, if any, is done (rethrowing its error).
    void start(std::function<void()> job) {
        wait();
        done_ = false;
        thread_ = std::thread([this, job = std::move(job)] {
            try {
                job();
            } catch (...) {
                error_ = std::current_exception();
            }
            done_.store(true, std::memory_order_release);
        });
    }

    /// Blocks until the save in flight is durable; rethrows its error.
    void wait() {
        if (thread_.joinable()) thread_.join();
        if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }

    /// Rethrows the error of a save that has finished; never blocks.
    void check() {
        if (thread_.joinable() && done_.load(std::memory_order_acquire)) wait();
    }

    bool in_flight() const { return thread_.joinable() && !done_.load(std::memory_order_acquire); }

private:
    std::thread thread_;
    std::exception_ptr error_;  // written by the thread before done_, read after join
    std::atomic<bool> done_{true};
};

}  // namespace ckpt::detail
