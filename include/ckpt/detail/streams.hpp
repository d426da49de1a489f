#pragma once
// Stream buffers between Boost.Serialization archives and checkpoint files. They hash every
// body byte as it passes, count positions (for payload alignment), and let large tensor
// payloads bypass the buffer: written from and read into the tensor's own memory.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <streambuf>
#include <string>

#include "../codecs/codec.hpp"
#include "../error.hpp"
#include "../format.hpp"
#include "hash.hpp"
#include "posix_io.hpp"
#include "verified_reader.hpp"

namespace ckpt::detail {

inline constexpr std::size_t stream_buffer_size = 64 * 1024;

/// Writes the body to a file descriptor, hashing it on the way. A save waits on fsync far
/// longer than on the hash, and hashing a payload just before its write() measured faster
/// than handing it to a second thread, so saves hash on the calling thread.
/// With an `encoder` (the head of a codec chain), bytes go to it instead; the chain's end
/// hashes and writes what is stored.
class BodyWriter final : public std::streambuf {
public:
    /// `large_writes_last`: every write larger than the buffer comes from memory that stays
    /// valid until the save ends (binary archives: tensor payloads and strings of the dict).
    BodyWriter(int fd, std::string path, ByteSink* encoder = nullptr, bool large_writes_last = false)
        : file_(fd, std::move(path), header_size), buf_(new char[stream_buffer_size]), encoder_(encoder),
          lasting_(large_writes_last) {
        setp(buf_.get(), buf_.get() + stream_buffer_size);
    }

    /// Bytes the archive wrote so far (before any codec): payload alignment counts these.
    std::uint64_t position() const noexcept { return flushed_ + static_cast<std::uint64_t>(pptr() - pbase()); }
    std::uint64_t digest() const { return hash_.digest(); }
    /// The XXH3-64 of the body written so far, buffered bytes included (without an encoder:
    /// a version 3 body's toc_check).
    std::uint64_t digest_so_far() {
        flush_buffer();
        return hash_.digest();
    }

    /// Writes what is buffered; rethrows the first error met inside the archive's calls.
    void finish() {
        rethrow_pending();
        flush_buffer();
    }
    void rethrow_pending() {
        if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }

protected:
    int_type overflow(int_type ch) override {
        if (!guard([&] { flush_buffer(); })) return traits_type::eof();
        if (!traits_type::eq_int_type(ch, traits_type::eof())) {
            *pptr() = traits_type::to_char_type(ch);
            pbump(1);
        }
        return traits_type::not_eof(ch);
    }

    std::streamsize xsputn(const char* s, std::streamsize n) override {
        const auto count = static_cast<std::size_t>(n);
        const auto room = static_cast<std::size_t>(epptr() - pptr());
        if (count <= room) {
            std::memcpy(pptr(), s, count);
            pbump(static_cast<int>(count));
            return n;
        }
        // Large block (a tensor payload): hashed and written straight from the caller's memory.
        const bool ok = guard([&] {
            flush_buffer();
            emit(s, count, lasting_);
        });
        return ok ? n : 0;
    }

    int sync() override { return guard([&] { flush_buffer(); }) ? 0 : -1; }

private:
    void flush_buffer() {
        const auto n = static_cast<std::size_t>(pptr() - pbase());
        if (n == 0) return;
        emit(pbase(), n);
        setp(buf_.get(), buf_.get() + stream_buffer_size);
    }
    void emit(const char* data, std::size_t n, bool lasting = false) {
        if (encoder_) {
            const auto* bytes = reinterpret_cast<const std::byte*>(data);
            lasting ? encoder_->put_lasting(bytes, n) : encoder_->put(bytes, n);
        } else {
            hash_.update(data, n);
            file_.write(data, n);
        }
        flushed_ += n;
    }
    // std::ostream swallows exceptions from its buffer; keep the first one to rethrow later.
    template <class F>
    bool guard(F&& f) {
        try {
            f();
            return true;
        } catch (...) {
            if (!error_) error_ = std::current_exception();
            return false;
        }
    }

    AppendingWriter file_;
    std::unique_ptr<char[]> buf_;
    ByteSink* encoder_;
    bool lasting_;
    std::uint64_t flushed_ = 0;
    Xxh3 hash_;
    std::exception_ptr error_;
};

/// Reads the body that follows the header, hashing it; large reads go straight into the
/// caller's memory (see VerifiedReader). Used by loads into existing tensors.
class BodyReader final : public std::streambuf {
public:
    BodyReader(int fd, std::string path, std::uint64_t length)
        : length_(length), buf_(new char[stream_buffer_size]), reader_(fd, std::move(path), header_size, length) {
        setg(buf_.get(), buf_.get(), buf_.get());
    }

    std::uint64_t position() const noexcept {
        return length_ - reader_.remaining() - static_cast<std::uint64_t>(egptr() - gptr());
    }
    std::uint64_t length() const noexcept { return length_; }

    /// Returns once the reader no longer touches memory handed out (it may still be hashing it).
    void settle() noexcept {
        try {
            reader_.digest();
        } catch (...) {  // a read failed: the reader stopped
        }
    }

    /// Reads and hashes whatever the parser left, then returns the digest of the whole body.
    std::uint64_t drain_and_digest() {
        setg(buf_.get(), buf_.get(), buf_.get());
        while (reader_.remaining() > 0) fill();
        return reader_.digest();
    }

protected:
    int_type underflow() override {
        if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
        if (reader_.remaining() == 0) return traits_type::eof();
        fill();
        return traits_type::to_int_type(*gptr());
    }

    std::streamsize xsgetn(char* s, std::streamsize n) override {
        const auto want = static_cast<std::size_t>(n);
        std::size_t got = std::min(want, static_cast<std::size_t>(egptr() - gptr()));
        std::memcpy(s, gptr(), got);
        gbump(static_cast<int>(got));
        while (got < want && reader_.remaining() > 0) {
            const std::size_t left = want - got;
            if (left < stream_buffer_size) {
                fill();
                const std::size_t take = std::min(left, static_cast<std::size_t>(egptr() - gptr()));
                std::memcpy(s + got, gptr(), take);
                gbump(static_cast<int>(take));
                got += take;
            } else {  // a payload: straight into the destination
                const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(left, reader_.remaining()));
                reader_.read(s + got, len);
                got += len;
            }
        }
        return static_cast<std::streamsize>(got);
    }

private:
    void fill() {
        reader_.wait(buffer_ticket_);  // the buffer may still be being hashed
        const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(stream_buffer_size, reader_.remaining()));
        buffer_ticket_ = reader_.read(buf_.get(), len);
        setg(buf_.get(), buf_.get(), buf_.get() + len);
    }

    std::uint64_t length_;
    std::unique_ptr<char[]> buf_;
    VerifiedReader reader_;  // after buf_: stopped before the buffer goes away
    std::uint64_t buffer_ticket_ = 0;
};

/// Reads the body through a small buffer with pread(), hashing nothing: for reading the
/// table of contents alone, which stops long before the payloads.
class UncheckedBodyReader final : public std::streambuf {
public:
    UncheckedBodyReader(int fd, std::string path, std::uint64_t length)
        : fd_(fd), path_(std::move(path)), length_(length), buf_(new char[stream_buffer_size]) {
        setg(buf_.get(), buf_.get(), buf_.get());
    }
    std::uint64_t position() const noexcept { return filled_ - static_cast<std::uint64_t>(egptr() - gptr()); }
    std::uint64_t length() const noexcept { return length_; }

protected:
    int_type underflow() override {
        if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
        if (filled_ == length_) return traits_type::eof();
        const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(stream_buffer_size, length_ - filled_));
        pread_exact(fd_, buf_.get(), len, header_size + filled_, path_);
        filled_ += len;
        setg(buf_.get(), buf_.get(), buf_.get() + len);
        return traits_type::to_int_type(*gptr());
    }

private:
    int fd_;
    std::string path_;
    std::uint64_t length_, filled_ = 0;
    std::unique_ptr<char[]> buf_;
};

/// Reads from a body already in memory and verified; lets tensors alias their payloads.
class MemoryReader final : public std::streambuf {
public:
    MemoryReader(char* data, std::size_t n) { setg(data, data, data + n); }
    std::uint64_t position() const noexcept { return static_cast<std::uint64_t>(gptr() - eback()); }
    std::uint64_t length() const noexcept { return static_cast<std::uint64_t>(egptr() - eback()); }
    char* current() const noexcept { return gptr(); }
    void skip(std::size_t n) { setg(eback(), gptr() + n, egptr()); }

protected:
    std::streamsize xsgetn(char* s, std::streamsize n) override {
        const auto take = std::min<std::streamsize>(n, egptr() - gptr());
        std::memcpy(s, gptr(), static_cast<std::size_t>(take));
        setg(eback(), gptr() + take, egptr());  // not gbump: payloads can exceed INT_MAX bytes
        return take;
    }
};

}  // namespace ckpt::detail
