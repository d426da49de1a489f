#pragma once
// Deletes files on a thread of its own, for retention. Unlinking a large checkpoint that was
// just written frees every page of it the page cache holds: about 50 ms for 256 MiB on a
// 2-vCPU VM, half again the save that came before it. A save's caller need not wait for that.
// The file is first renamed, synchronously, to a hidden temporary name of this process
// (".{name}.tmp-{pid}-deleted-{random}", atomic_file.hpp's deleted_name), so that it is gone from every
// listing when retention returns; only the unlink is left to the thread. A process that dies
// first leaves the temporary, which the next manager of the series removes (its writer is
// gone) and `ckpt ls` lists.

#include <boost/filesystem.hpp>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "../log.hpp"
#include "atomic_file.hpp"

namespace ckpt::detail {

class Unlinker {
public:
    Unlinker() = default;
    Unlinker(const Unlinker&) = delete;
    Unlinker& operator=(const Unlinker&) = delete;
    /// Waits for every file handed over to be unlinked.
    ~Unlinker() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        if (thread_.joinable()) thread_.join();
    }

    /// Removes `file` from its directory now and frees it in the background. Throws nothing:
    /// `ec` is set when it cannot be renamed (then it is still there, as it was).
    void remove(const fs::path& file, boost::system::error_code& ec) {
        const fs::path hidden = file.parent_path() / deleted_name(file.filename().string());
        fs::rename(file, hidden, ec);
        if (ec) return;
        std::lock_guard lock(mutex_);
        pending_.push_back(hidden);
        if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
        wake_.notify_one();
    }

    /// Blocks until every file handed over so far is unlinked.
    void wait() {
        std::unique_lock lock(mutex_);
        idle_.wait(lock, [&] { return pending_.empty() && !busy_; });
    }

private:
    void run() {
        std::unique_lock lock(mutex_);
        for (;;) {
            wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
            if (pending_.empty()) return;  // stopping, and nothing left
            const fs::path file = std::move(pending_.front());
            pending_.pop_front();
            busy_ = true;
            lock.unlock();
            boost::system::error_code ec;
            fs::remove(file, ec);  // gone already is fine: a cleanup of the series' temporaries took it
            if (ec && ec != boost::system::errc::no_such_file_or_directory)
                log(LogLevel::warning, "retention could not free '" + file.string() + "' (renamed so, to be deleted): " +
                                           ec.message());
            lock.lock();
            busy_ = false;
            if (pending_.empty()) idle_.notify_all();
        }
    }

    std::mutex mutex_;
    std::condition_variable wake_, idle_;
    std::deque<fs::path> pending_;
    bool busy_ = false;
    bool stopping_ = false;
    std::thread thread_;  // started by the first file
};

}  // namespace ckpt::detail
