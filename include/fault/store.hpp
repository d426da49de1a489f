#pragma once
// Stores: the small key-value service that ranks in separate processes (or on separate
// hosts) meet through. Gloo's rendezvous publishes each rank's address there; membership and
// liveness live there too, so no rank is special.
//
//   fault::FileStore store("/shared/dir");            // one host (or a shared file system)
//   store.set("gen/1/ready", "yes");
//   auto v = store.wait("gen/1/ready", std::chrono::seconds(10));
//
// Keys are strings of any bytes; values are byte strings. Every wait has a timeout.
// RedisStore (redis_store.hpp) is the same interface over a Redis server, for several hosts.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../ckpt/error.hpp"

namespace fault {

/// The store could not be reached, or did not answer in time; the message names the store
/// and the key.
class StoreError : public ckpt::Error {
public:
    using ckpt::Error::Error;
};

/// The key-value service ranks in separate processes meet through: set, get, an atomic create and
/// add, erase, and wait with a timeout. Keys are strings of any bytes, values byte strings.
/// FileStore, RedisStore and PrefixStore implement it.
class Store {
public:
    virtual ~Store() = default;
    /// Sets `key` to `value`, replacing what was there.
    virtual void set(const std::string& key, std::string_view value) = 0;
    /// The value of `key`, or nothing if it is not set.
    virtual std::optional<std::string> get(const std::string& key) = 0;
    /// Sets `key` only if it is not set; true if this call set it. Atomic: of several
    /// callers racing for one key, exactly one wins.
    virtual bool create(const std::string& key, std::string_view value) = 0;
    /// Adds `delta` to the integer at `key` (absent counts as 0) and returns the sum; atomic.
    virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
    /// Removes `key` (nothing if it is not set).
    virtual void erase(const std::string& key) = 0;
    /// Where the store is, for messages: "file:///dir", "redis://host:port".
    virtual std::string url() const = 0;

    /// Waits until `key` is set and returns its value; StoreError once `timeout` passes.
    std::string wait(const std::string& key, std::chrono::milliseconds timeout) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        auto pause = std::chrono::microseconds(200);
        for (;;) {
            if (auto v = get(key)) return *v;
            if (std::chrono::steady_clock::now() >= deadline)
                throw StoreError(url() + ": key '" + key + "' not set within " + std::to_string(timeout.count()) + " ms");
            std::this_thread::sleep_for(pause);
            pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
        }
    }
};

/// A store on a directory: one file per key, replaced by rename so that readers see whole
/// values; counters are updated under an flock. Not fsynced: a store holds what a job's
/// processes tell each other while they run, not what must survive a power cut.
class FileStore final : public Store {
public:
    explicit FileStore(std::string dir) : dir_(std::move(dir)) {
        while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
        if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST)
            throw StoreError("file store " + dir_ + ": cannot create the directory: " + std::strerror(errno));
        struct stat st {};
        if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
            throw StoreError("file store " + dir_ + ": not a directory");
    }

    void set(const std::string& key, std::string_view value) override {
        const std::string tmp = write_temporary(key, value);
        if (::rename(tmp.c_str(), path(key).c_str()) != 0) {
            const int err = errno;
            ::unlink(tmp.c_str());
            fail("set", key, err);
        }
    }
    std::optional<std::string> get(const std::string& key) override {
        const int fd = ::open(path(key).c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) return std::nullopt;
            fail("get", key, errno);
        }
        std::string out;
        char buf[4096];
        for (;;) {
            const ssize_t n = ::read(fd, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                const int err = errno;
                ::close(fd);
                fail("get", key, err);
            }
            if (n == 0) break;
            out.append(buf, static_cast<std::size_t>(n));
        }
        ::close(fd);
        return out;
    }
    bool create(const std::string& key, std::string_view value) override {
        const std::string tmp = write_temporary(key, value);
        const int rc = ::link(tmp.c_str(), path(key).c_str());  // fails if the key exists: atomic
        const int err = errno;
        ::unlink(tmp.c_str());
        if (rc == 0) return true;
        if (err == EEXIST) return false;
        fail("create", key, err);
    }
    std::int64_t add(const std::string& key, std::int64_t delta) override {
        const std::string lock_path = path(key, "/l-");
        const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (lock < 0) fail("add", key, errno);
        while (::flock(lock, LOCK_EX) != 0)
            if (errno != EINTR) {
                const int err = errno;
                ::close(lock);
                fail("add", key, err);
            }
        try {
            std::int64_t value = delta;
            if (auto cur = get(key)) value += parse_integer(key, *cur);
            set(key, std::to_string(value));
            ::close(lock);  // releases the flock
            return value;
        } catch (...) {
            ::close(lock);
            throw;
        }
    }
    void erase(const std::string& key) override {
        if (::unlink(path(key).c_str()) != 0 && errno != ENOENT) fail("erase", key, errno);
    }
    std::string url() const override { return "file://" + dir_; }

private:
    // Keys become flat file names: bytes other than [A-Za-z0-9._-] are written as %XX, so no
    // key can name a file outside the directory, nor collide with a temporary (".tmp-…") or
    // a counter's lock ("l-…": values are "k-…", whatever the key).
    std::string path(const std::string& key, const char* kind = "/k-") const {
        static constexpr char hex[] = "0123456789ABCDEF";
        std::string name = dir_ + kind;
        for (const unsigned char c : key) {
            if (std::isalnum(c) || c == '.' || c == '_' || c == '-') name += static_cast<char>(c);
            else {
                name += '%';
                name += hex[c >> 4];
                name += hex[c & 15];
            }
        }
        return name;
    }
    std::string write_temporary(const std::string& key, std::string_view value) {
        static std::atomic<std::uint64_t> counter{0};
        const std::string tmp = dir_ + "/.tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) fail("set", key, errno);
        std::size_t done = 0;
        while (done < value.size()) {
            const ssize_t n = ::write(fd, value.data() + done, value.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                const int err = errno;
                ::close(fd);
                ::unlink(tmp.c_str());
                fail("set", key, err);
            }
            done += static_cast<std::size_t>(n);
        }
        ::close(fd);
        return tmp;
    }
    std::int64_t parse_integer(const std::string& key, const std::string& text) const {
        try {
            std::size_t used = 0;
            const long long v = std::stoll(text, &used);
            if (used == text.size()) return v;
        } catch (const std::exception&) {
        }
        throw StoreError(url() + ": add to key '" + key + "': it holds '" + text.substr(0, 40) + "', not an integer");
    }
    [[noreturn]] void fail(const char* op, const std::string& key, int err) const {
        throw StoreError(url() + ": " + op + " of key '" + key + "' failed: " + std::strerror(err));
    }

    std::string dir_;
};

/// A store's keys under a prefix ("gen/3/" + key): one store serves several generations
/// of a job, or several jobs, without their keys meeting.
class PrefixStore final : public Store {
public:
    PrefixStore(Store& inner, std::string prefix) : inner_(inner), prefix_(std::move(prefix)) {}
    void set(const std::string& key, std::string_view value) override { inner_.set(prefix_ + key, value); }
    std::optional<std::string> get(const std::string& key) override { return inner_.get(prefix_ + key); }
    bool create(const std::string& key, std::string_view value) override { return inner_.create(prefix_ + key, value); }
    std::int64_t add(const std::string& key, std::int64_t delta) override { return inner_.add(prefix_ + key, delta); }
    void erase(const std::string& key) override { inner_.erase(prefix_ + key); }
    std::string url() const override { return prefix_.empty() ? inner_.url() : inner_.url() + " (keys under '" + prefix_ + "')"; }

private:
    Store& inner_;
    std::string prefix_;
};

}  // namespace fault
