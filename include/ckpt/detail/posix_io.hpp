#pragma once
// Thin POSIX file helpers: every failure becomes an IoError naming the path and errno.
// The standard library and Boost.Filesystem have no fsync, which durability needs.

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "../error.hpp"

namespace ckpt::detail {

inline std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

[[noreturn]] inline void throw_io(const std::string& action, const std::string& path, int err = errno) {
    throw IoError("cannot " + action + " '" + path + "': " + errno_text(err), path, err);
}

/// An owned file descriptor.
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    Fd& operator=(Fd&& o) noexcept {
        if (this != &o) {
            reset();
            fd_ = std::exchange(o.fd_, -1);
        }
        return *this;
    }
    ~Fd() { reset(); }
    int get() const noexcept { return fd_; }
    explicit operator bool() const noexcept { return fd_ >= 0; }
    void reset() noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    /// Closes and reports the error close() returns (NFS can report write errors only here).
    void close_checked(const std::string& path) {
        const int fd = std::exchange(fd_, -1);
        if (fd >= 0 && ::close(fd) != 0 && errno != EINTR) throw_io("close", path);
    }

private:
    int fd_ = -1;
};

/// `what` names the file in errors: "cannot open checkpoint '…'", "cannot open key file '…'".
inline Fd open_for_read(const std::string& path, const char* what = "checkpoint") {
    int fd;
    do fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        const int err = errno;
        throw_io(std::string("open ") + what, path, err);
    }
    return Fd(fd);
}

inline std::uint64_t file_size(int fd, const std::string& path) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_io("stat", path);
    if (!S_ISREG(st.st_mode)) throw IoError("'" + path + "' is not a regular file", path, 0);
    return static_cast<std::uint64_t>(st.st_size);
}

inline void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
    auto* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            throw_io("write", path);
        }
        p += w;
        n -= static_cast<std::size_t>(w);
    }
}

/// After a writev() of v[first..] that wrote `done` bytes: drops them from the front of those
/// pieces and returns the index of the first piece with bytes left (a short write resumes there).
inline std::size_t drop_written(std::vector<iovec>& v, std::size_t first, std::size_t done) {
    while (done > 0) {
        const std::size_t take = std::min(done, v[first].iov_len);
        v[first].iov_base = static_cast<char*>(v[first].iov_base) + take;
        v[first].iov_len -= take;
        done -= take;
        if (v[first].iov_len == 0) ++first;
    }
    return first;
}

/// Appends to a file being saved and starts the disk writing what is complete, every
/// `step` bytes (Linux: sync_file_range). Without it the kernel holds a fresh checkpoint in
/// the page cache until the final fsync; with it the device can work while the rest is
/// encoded and copied (how much fsync is left to wait for depends on the device: a virtual
/// disk whose host flushes at fsync gains little). Durability still rests on that fsync: a
/// failed start is ignored, fsync reports errors.
class AppendingWriter {
public:
    static constexpr std::uint64_t step = 8u << 20;
    AppendingWriter(int fd, std::string path, std::uint64_t offset)
        : fd_(fd), path_(std::move(path)), end_(offset), started_(offset) {}
    void write(const void* data, std::size_t n) {
        write_all(fd_, data, n, path_);
        advance(n);
    }
    /// The pieces (each with `data` and `size`) in as few system calls as the kernel allows.
    template <class Piece>
    void write_pieces(std::span<const Piece> pieces) {
        std::vector<iovec> v;
        v.reserve(pieces.size());
        std::size_t total = 0;
        for (const Piece& p : pieces) {
            v.push_back({const_cast<std::byte*>(p.data), p.size});
            total += p.size;
        }
        for (std::size_t first = 0, left = total; left > 0;) {
            const ssize_t w = ::writev(fd_, v.data() + first, static_cast<int>(std::min<std::size_t>(v.size() - first, IOV_MAX)));
            if (w < 0) {
                if (errno == EINTR) continue;
                throw_io("write", path_);
            }
            left -= static_cast<std::size_t>(w);
            first = drop_written(v, first, static_cast<std::size_t>(w));
        }
        advance(total);
    }

private:
    void advance(std::size_t n) {
        end_ += n;
#ifdef __linux__
        if (end_ - started_ >= step) {
            ::sync_file_range(fd_, static_cast<off_t>(started_), static_cast<off_t>(end_ - started_), SYNC_FILE_RANGE_WRITE);
            started_ = end_;
        }
#endif
    }

    int fd_;
    std::string path_;
    std::uint64_t end_, started_;
};

inline void pwrite_all(int fd, const void* data, std::size_t n, std::uint64_t offset, const std::string& path) {
    auto* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
        if (w < 0) {
            if (errno == EINTR) continue;
            throw_io("write", path);
        }
        p += w;
        n -= static_cast<std::size_t>(w);
        offset += static_cast<std::uint64_t>(w);
    }
}

/// Reads up to n bytes; returns fewer only at end of file.
inline std::size_t read_full(int fd, void* data, std::size_t n, const std::string& path) {
    auto* p = static_cast<char*>(data);
    std::size_t done = 0;
    while (done < n) {
        const ssize_t r = ::read(fd, p + done, n - done);
        if (r < 0) {
            if (errno == EINTR) continue;
            throw_io("read", path);
        }
        if (r == 0) break;
        done += static_cast<std::size_t>(r);
    }
    return done;
}

inline void fsync_fd(int fd, const std::string& path) {
    while (::fsync(fd) != 0)
        if (errno != EINTR) throw_io("fsync", path);
}

/// Makes a rename or unlink in `dir` durable.
inline void fsync_directory(const std::string& dir) {
    int fd;
    do fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) throw_io("open directory", dir);
    Fd guard(fd);
    fsync_fd(fd, dir);
}

/// Fills `data` from the kernel's random source (getrandom(2)): keys, nonces.
inline void random_bytes(void* data, std::size_t n) {
    auto* p = static_cast<unsigned char*>(data);
    while (n > 0) {
        const ssize_t got = ::getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            throw IoError("getrandom failed: " + errno_text(errno), "getrandom", errno);
        }
        p += got;
        n -= static_cast<std::size_t>(got);
    }
}

}  // namespace ckpt::detail
