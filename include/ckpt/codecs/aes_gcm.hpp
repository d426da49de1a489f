#pragma once
// The AES-256-GCM body codec (CMake target ckpt::aes_gcm, OpenSSL's libcrypto from Debian
// libssl-dev). Including this header also lets every reader in the program decrypt.
//
// Stored form:
//   64-byte prefix: key id (8), salt (16, fresh random bytes for every file),
//                   segment size (u32; plaintext bytes per segment), zeros (36)
//   segments: each the ciphertext of `segment size` plaintext bytes (the last may be shorter,
//             even empty), then its 16-byte tag
// The file's key is HKDF-SHA256(key, salt, "ckpt aes-256-gcm body"): unique to the file, so
// segment nonces can simply count (segment index, u64, then 1 for the last segment, else 0).
// Every segment authenticates the header (header_associated_data: codecs, epoch, step, save
// time) and the prefix; the last-segment flag makes dropping whole segments detectable.
// The key id, HKDF-SHA256(key, "", "ckpt key id")[0..8], tells a wrong key from a damaged file
// without revealing the key.

#include <openssl/evp.h>
#include <openssl/kdf.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "codec.hpp"
#include "../detail/block_pipeline.hpp"
#include "../detail/verified_reader.hpp"
#include "../error.hpp"
#include "../tensor.hpp"

namespace ckpt {

/// Encrypts the body with AES-256-GCM under `key` (a fresh random salt and derived key per file).
struct AesGcm {
    static constexpr bool encrypts = true;  ///< Chain checks at compile time that it comes last
    Key key;
    AesGcm() = default;
    explicit AesGcm(Key k) : key(std::move(k)) {}
    CodecChain codecs() const { return {Codec{CodecId::aes_256_gcm, 0, key}}; }
};

namespace detail {

inline constexpr std::size_t aes_prefix_size = 64;
inline constexpr std::size_t aes_tag_size = 16;
inline constexpr std::size_t aes_segment_size = 1u << 20;

struct AesPrefix {
    std::array<unsigned char, 8> key_id{};
    std::array<unsigned char, 16> salt{};
    std::uint32_t segment_size = aes_segment_size;
};

[[noreturn]] inline void throw_openssl(const std::string& what, const std::string& path) {
    throw Error("OpenSSL failed " + what + " for '" + path + "'");
}

inline void hkdf_sha256(const unsigned char* key, std::size_t key_len, const unsigned char* salt, std::size_t salt_len,
                        std::string_view info, unsigned char* out, std::size_t out_len, const std::string& path) {
    std::unique_ptr<EVP_PKEY_CTX, void (*)(EVP_PKEY_CTX*)> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr),
                                                               &EVP_PKEY_CTX_free);
    std::size_t len = out_len;
    if (!ctx || EVP_PKEY_derive_init(ctx.get()) <= 0 || EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) <= 0 ||
        EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), key, static_cast<int>(key_len)) <= 0 ||
        (salt_len && EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), salt, static_cast<int>(salt_len)) <= 0) ||
        EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), reinterpret_cast<const unsigned char*>(info.data()),
                                    static_cast<int>(info.size())) <= 0 ||
        EVP_PKEY_derive(ctx.get(), out, &len) <= 0 || len != out_len)
        throw_openssl("deriving a key (HKDF-SHA256)", path);
}

inline std::array<unsigned char, 8> aes_key_id(const Key& key, const std::string& path) {
    std::array<unsigned char, 8> id{};
    hkdf_sha256(key.data(), Key::size, nullptr, 0, "ckpt key id", id.data(), id.size(), path);
    return id;
}

inline std::string hex_bytes(const unsigned char* p, std::size_t n) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s;
    for (std::size_t i = 0; i < n; ++i) s += {digits[p[i] >> 4], digits[p[i] & 15]};
    return s;
}

/// The file's own key, wiped when it goes.
class FileKey {
public:
    FileKey(const Key& key, const std::array<unsigned char, 16>& salt, const std::string& path) {
        hkdf_sha256(key.data(), Key::size, salt.data(), salt.size(), "ckpt aes-256-gcm body", bytes_.data(), bytes_.size(),
                    path);
    }
    ~FileKey() { ::explicit_bzero(bytes_.data(), bytes_.size()); }
    FileKey(const FileKey&) = delete;
    FileKey& operator=(const FileKey&) = delete;
    const unsigned char* data() const noexcept { return bytes_.data(); }

private:
    std::array<unsigned char, 32> bytes_{};
};

inline std::array<unsigned char, 12> aes_nonce(std::uint64_t segment, bool last) {
    std::array<unsigned char, 12> n{};
    put_le<std::uint64_t>(reinterpret_cast<std::byte*>(n.data()), segment);
    n[8] = last ? 1 : 0;
    return n;
}

/// Encrypts or decrypts one segment; false when a decryption's tag does not match.
class GcmSegments {
public:
    GcmSegments(const FileKey& key, std::vector<unsigned char> associated_data, bool encrypt, std::string path)
        : ctx_(EVP_CIPHER_CTX_new(), &EVP_CIPHER_CTX_free), aad_(std::move(associated_data)), encrypt_(encrypt),
          path_(std::move(path)) {
        if (!ctx_ || EVP_CipherInit_ex(ctx_.get(), EVP_aes_256_gcm(), nullptr, key.data(), nullptr, encrypt ? 1 : 0) != 1)
            throw_openssl("setting up AES-256-GCM", path_);
    }
    /// `tag` is written when encrypting, checked when decrypting.
    bool run(std::uint64_t segment, bool last, const std::byte* in, std::size_t n, std::byte* out, unsigned char* tag) {
        const auto nonce = aes_nonce(segment, last);
        int len = 0;
        if (EVP_CipherInit_ex(ctx_.get(), nullptr, nullptr, nullptr, nonce.data(), encrypt_ ? 1 : 0) != 1 ||
            EVP_CipherUpdate(ctx_.get(), nullptr, &len, aad_.data(), static_cast<int>(aad_.size())) != 1)
            throw_openssl("starting a segment", path_);
        // EVP takes int lengths: segments are far below 2 GiB, but go in pieces anyway.
        for (std::size_t done = 0; done < n;) {
            const int piece = static_cast<int>(std::min<std::size_t>(n - done, 1u << 30));
            if (EVP_CipherUpdate(ctx_.get(), reinterpret_cast<unsigned char*>(out + done), &len,
                                 reinterpret_cast<const unsigned char*>(in + done), piece) != 1)
                throw_openssl("encrypting a segment", path_);
            done += static_cast<std::size_t>(piece);
        }
        if (!encrypt_ && EVP_CIPHER_CTX_ctrl(ctx_.get(), EVP_CTRL_GCM_SET_TAG, aes_tag_size, tag) != 1)
            throw_openssl("setting a tag", path_);
        unsigned char end[16];
        if (EVP_CipherFinal_ex(ctx_.get(), end, &len) != 1) {
            if (encrypt_) throw_openssl("finishing a segment", path_);
            return false;
        }
        if (encrypt_ && EVP_CIPHER_CTX_ctrl(ctx_.get(), EVP_CTRL_GCM_GET_TAG, aes_tag_size, tag) != 1)
            throw_openssl("reading a tag", path_);
        return true;
    }

private:
    std::unique_ptr<EVP_CIPHER_CTX, void (*)(EVP_CIPHER_CTX*)> ctx_;
    std::vector<unsigned char> aad_;
    bool encrypt_;
    std::string path_;
};

inline std::vector<unsigned char> aes_associated_data(const std::array<std::byte, 56>& header, const std::byte* prefix) {
    std::vector<unsigned char> aad(header.size() + aes_prefix_size);
    std::memcpy(aad.data(), header.data(), header.size());
    std::memcpy(aad.data() + header.size(), prefix, aes_prefix_size);
    return aad;
}

static_assert(aes_segment_size == BlockPipeline::block_size);

/// Seals the body as 1 MiB segments through a BlockPipeline (one GCM context per thread).
class AesGcmEncoder final : public ByteSink {
public:
    AesGcmEncoder(const Codec& c, ByteSink& next, const EncodeContext& ctx) : next_(next), path_(ctx.path) {
        AesPrefix p;
        p.key_id = aes_key_id(c.key, path_);
        random_bytes(p.salt.data(), p.salt.size());
        std::memcpy(prefix_.data(), p.key_id.data(), 8);
        std::memcpy(prefix_.data() + 8, p.salt.data(), 16);
        put_le<std::uint32_t>(prefix_.data() + 24, p.segment_size);
        file_key_ = std::make_unique<FileKey>(c.key, p.salt, path_);
        next_.put(prefix_.data(), prefix_.size());
        const auto aad = aes_associated_data(ctx.associated_data, prefix_.data());
        pipeline_.emplace(next_, BlockPipeline::Options{aes_segment_size + aes_tag_size, false, false, {}},
                          [this](std::uint64_t index, const std::byte* in, std::size_t n, bool last, std::byte* out,
                                 unsigned worker) {
                              gcm_[worker]->run(index, last, in, n, out, reinterpret_cast<unsigned char*>(out + n));
                              return BlockPipeline::Encoded{n + aes_tag_size};
                          });
        gcm_.resize(pipeline_->threads());
        for (auto& g : gcm_) g = std::make_unique<GcmSegments>(*file_key_, aad, true, path_);
    }
    ~AesGcmEncoder() override { pipeline_.reset(); }  // its threads use gcm_

    void put(const std::byte* data, std::size_t n) override { pipeline_->put(data, n); }
    void put_lasting(const std::byte* data, std::size_t n) override { pipeline_->put(data, n, true); }
    void finish() override { pipeline_->finish(); }

private:
    ByteSink& next_;
    std::string path_;
    std::array<std::byte, aes_prefix_size> prefix_{};
    std::unique_ptr<FileKey> file_key_;
    std::vector<std::unique_ptr<GcmSegments>> gcm_;  // one per pipeline thread
    std::optional<BlockPipeline> pipeline_;
};

/// `segment` counts from 0; the message, for people, from 1 ("segment 1 of 3").
inline AuthenticationError aes_authentication_error(const std::string& path, std::uint64_t segment,
                                                    std::uint64_t segments) {
    return AuthenticationError("checkpoint '" + path + "' fails authentication in segment " + std::to_string(segment + 1) +
                                   " of " + std::to_string(segments) +
                                   ": its body or header was altered after it was encrypted",
                               path);
}

/// Where a stored body's segments are, from its prefix and length.
struct AesLayout {
    std::array<unsigned char, 16> salt{};
    std::uint32_t segment = 0;  ///< plaintext bytes per segment
    std::uint64_t sealed = 0, per = 0, segments = 0, plain = 0;
    std::size_t length(std::uint64_t i) const {  ///< plaintext bytes of segment i
        return i + 1 == segments ? static_cast<std::size_t>(sealed - i * per - aes_tag_size) : std::size_t{segment};
    }
};

/// Checks the prefix (`p`, the first aes_prefix_size of `n` stored bytes) against the body's
/// length and the key: FormatError if malformed, KeyError if sealed under another key.
inline AesLayout aes_layout(const std::byte* p, std::uint64_t n, const DecodeContext& ctx) {
    auto malformed = [&](const std::string& what) {
        return FormatError("checkpoint '" + ctx.path + "' has a malformed aes-256-gcm body: " + what, ctx.path);
    };
    if (n < aes_prefix_size + aes_tag_size) throw malformed("it is " + std::to_string(n) + " bytes, shorter than prefix and tag");
    for (std::size_t i = 28; i < aes_prefix_size; ++i)
        if (p[i] != std::byte{0}) throw malformed("reserved prefix bytes are not zero");
    AesLayout l;
    l.segment = get_le<std::uint32_t>(p + 24);
    if (l.segment == 0 || l.segment > (1u << 30)) throw malformed("segment size " + std::to_string(l.segment));
    const auto want = aes_key_id(ctx.key, ctx.path);
    if (std::memcmp(want.data(), p, 8) != 0)
        throw KeyError("checkpoint '" + ctx.path + "' was encrypted with another key (key id " +
                           hex_bytes(reinterpret_cast<const unsigned char*>(p), 8) + "; the key given has id " +
                           hex_bytes(want.data(), 8) + ")",
                       ctx.path);
    std::memcpy(l.salt.data(), p + 8, 16);
    l.sealed = n - aes_prefix_size;
    l.per = std::uint64_t{l.segment} + aes_tag_size;
    l.segments = l.sealed / l.per + (l.sealed % l.per != 0);
    if (l.sealed % l.per != 0 && l.sealed % l.per < aes_tag_size) throw malformed("the last segment is shorter than its tag");
    l.plain = l.sealed - l.segments * aes_tag_size;
    return l;
}

inline BodyBytes aes_gcm_decode(BodyBytes stored, const DecodeContext& ctx) {
    const std::byte* p = stored.data.get();
    const AesLayout l = aes_layout(p, stored.size, ctx);
    BodyBytes out{allocate_aligned(static_cast<std::size_t>(l.plain)), l.plain};
    const FileKey file_key(ctx.key, l.salt, ctx.path);
    const auto aad = aes_associated_data(ctx.associated_data, p);
    // Segments are independent: two threads halve the time of a large body.
    on_two_threads(l.segments, 2, [&](std::uint64_t first, std::uint64_t end) {
        GcmSegments gcm(file_key, aad, false, ctx.path);
        for (std::uint64_t i = first; i < end; ++i) {
            const std::byte* in = p + aes_prefix_size + i * l.per;
            const std::size_t len = l.length(i);
            unsigned char tag[aes_tag_size];
            std::memcpy(tag, in + len, aes_tag_size);
            if (!gcm.run(i, i + 1 == l.segments, in, len, out.data.get() + i * l.segment, tag))
                throw aes_authentication_error(ctx.path, i, l.segments);
        }
    });
    return out;
}

/// Reads the prefix of the stored body at `offset`; nothing when it does not open under the
/// key (a damaged prefix or another key: the whole-body path tells which).
inline std::optional<std::pair<std::array<std::byte, aes_prefix_size>, AesLayout>> aes_read_prefix(
    int fd, std::uint64_t offset, std::uint64_t n, const DecodeContext& ctx) {
    std::array<std::byte, aes_prefix_size> prefix{};
    if (n < aes_prefix_size) return std::nullopt;
    pread_exact(fd, reinterpret_cast<char*>(prefix.data()), prefix.size(), offset, ctx.path);
    try {
        return std::pair{prefix, aes_layout(prefix.data(), n, ctx)};
    } catch (const Error&) {
        return std::nullopt;
    }
}

/// The plaintext of an aes-256-gcm body as a stream. The segments that a read covers whole are
/// read straight into its destination and decrypted there in the background (on a second
/// thread, and by the caller in settle()), so decryption overlaps the parsing and reading of
/// what follows; the segment a read ends inside goes through one segment-sized buffer and is
/// decrypted at once, as the parser needs its bytes. A segment that fails authentication
/// throws its AuthenticationError, or, found in the background, is kept for failure(); the
/// caller checks the checksum first (drain_and_digest).
class AesGcmBodyStream final : public PlainBodyStream {
public:
    AesGcmBodyStream(int fd, std::uint64_t offset, std::uint64_t n, const DecodeContext& ctx,
                     std::array<std::byte, aes_prefix_size> prefix, const AesLayout& layout)
        : path_(ctx.path), layout_(layout), file_key_(ctx.key, layout.salt, ctx.path),
          aad_(aes_associated_data(ctx.associated_data, prefix.data())), gcm_(file_key_, aad_, false, ctx.path),
          buffer_(allocate_aligned(buffer_size(layout))),
          tags_(static_cast<std::size_t>(layout.segments) * aes_tag_size), reader_(fd, ctx.path, offset, n) {
        setg(nullptr, nullptr, nullptr);
        reader_.wait(reader_.read(reinterpret_cast<char*>(prefix.data()), prefix.size()));  // hashed before it goes
        if (n >= parallel_read_threshold && std::thread::hardware_concurrency() >= 2)
            helper_ = std::thread([this] { decrypt_in_background(); });
    }
    ~AesGcmBodyStream() override {
        if (!helper_.joinable()) return;
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        changed_.notify_all();
        helper_.join();  // it may be decrypting into caller memory: finish first
    }

    std::uint64_t position() const noexcept override {
        return handed_ - static_cast<std::uint64_t>(egptr() - gptr());
    }
    std::uint64_t length() const noexcept override { return layout_.plain; }

    void settle() noexcept override {
        decrypt_queued();  // the caller decrypts too rather than wait
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return queue_.empty() && busy_ == 0; });
    }

    std::uint64_t drain_and_digest() override {
        const AesLayout& l = layout_;
        settle();
        setg(nullptr, nullptr, nullptr);
        // A body that ends on a segment boundary ends with an empty segment the parser never
        // asks for: it still has to authenticate (it marks the end).
        if (!failure_ && next_ + 1 == l.segments && l.length(next_) == 0) {
            try {
                open_into_buffer();
            } catch (const AuthenticationError&) {  // kept in failure_
            }
        }
        next_ = l.segments;
        std::byte* scratch = buffer_.get();
        while (reader_.remaining() > 0) {
            const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(buffer_size(l), reader_.remaining()));
            reader_.wait(reader_.read(reinterpret_cast<char*>(scratch), len));
        }
        if (const auto bad = failed_.load(); !failure_ && bad != UINT64_MAX)
            failure_ = std::make_exception_ptr(aes_authentication_error(path_, bad, l.segments));
        return reader_.digest();
    }
    std::exception_ptr failure() const override { return failure_; }

protected:
    int_type underflow() override {
        if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
        while (next_ < layout_.segments) {  // skips the empty last segment
            open_into_buffer();
            if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
        }
        return traits_type::eof();
    }

    std::streamsize xsgetn(char* s, std::streamsize count) override {
        const AesLayout& l = layout_;
        const auto want = static_cast<std::size_t>(count);
        std::size_t got = std::min(want, static_cast<std::size_t>(egptr() - gptr()));
        if (got > 0) std::memcpy(s, gptr(), got);  // no get area yet: gptr() is null
        gbump(static_cast<int>(got));
        while (got < want && next_ < l.segments) {
            const std::size_t len = l.length(next_);
            if (len > want - got || len == 0) {  // ends inside this segment (or it is the empty last)
                open_into_buffer();
                const std::size_t take = std::min(want - got, static_cast<std::size_t>(egptr() - gptr()));
                std::memcpy(s + got, gptr(), take);
                gbump(static_cast<int>(take));
                got += take;
                continue;
            }
            const Pending p{next_, reinterpret_cast<std::byte*>(s + got), read_segment(s + got, len)};
            ++next_;
            handed_ += len;
            got += len;
            if (helper_.joinable()) {
                {
                    std::lock_guard lock(mutex_);
                    queue_.push_back(p);
                }
                changed_.notify_all();
            } else {
                open_in_place(gcm_, p);
            }
        }
        return static_cast<std::streamsize>(got);
    }

private:
    struct Pending {
        std::uint64_t segment;
        std::byte* at;           // ciphertext read there, decrypted in place
        std::uint64_t ticket;    // the reader's, for its tag
    };

    // One segment and its tag; no more than the body holds.
    static std::size_t buffer_size(const AesLayout& l) {
        return static_cast<std::size_t>(std::min<std::uint64_t>(l.segment, l.plain)) + aes_tag_size;
    }

    // Issues the reads of segment next_ (to `at`) and its tag; returns the tag's ticket.
    std::uint64_t read_segment(char* at, std::size_t len) {
        reader_.read(at, len);
        return reader_.read(reinterpret_cast<char*>(tags_.data() + next_ * aes_tag_size), aes_tag_size);
    }

    // Decrypts a segment once it is hashed; a failure goes to failed_ (the first one counts).
    void open_in_place(GcmSegments& gcm, const Pending& p) {
        const AesLayout& l = layout_;
        reader_.wait(p.ticket);
        bool ok = failed_.load() != UINT64_MAX ||  // one failure is enough: skip the rest
                  gcm.run(p.segment, p.segment + 1 == l.segments, p.at, l.length(p.segment), p.at,
                          tags_.data() + p.segment * aes_tag_size);
        if (!ok) {
            std::uint64_t seen = failed_.load();
            while (p.segment < seen && !failed_.compare_exchange_weak(seen, p.segment)) {
            }
        }
    }

    // Decrypts what is queued on the calling thread, until nothing is.
    void decrypt_queued() noexcept {
        for (;;) {
            std::unique_lock lock(mutex_);
            if (queue_.empty()) return;
            const Pending p = queue_.front();
            queue_.pop_front();
            lock.unlock();
            try {
                open_in_place(gcm_, p);
            } catch (...) {  // an I/O error: the checksum or the next read reports it
            }
        }
    }

    void decrypt_in_background() {
        try {
            GcmSegments gcm(file_key_, aad_, false, path_);
            std::unique_lock lock(mutex_);
            for (;;) {
                changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
                if (stop_) return;
                const Pending p = queue_.front();
                queue_.pop_front();
                ++busy_;
                lock.unlock();
                try {
                    open_in_place(gcm, p);
                } catch (...) {  // an I/O error: the caller's reads report it
                }
                lock.lock();
                --busy_;
                changed_.notify_all();
            }
        } catch (...) {  // no GCM context: the caller decrypts everything in settle()
        }
    }

    // Reads, authenticates and decrypts segment next_ into the buffer, which becomes the get area.
    void open_into_buffer() {
        const AesLayout& l = layout_;
        const std::size_t len = l.length(next_);
        std::byte* at = buffer_.get();
        reader_.read(reinterpret_cast<char*>(at), len);
        reader_.wait(reader_.read(reinterpret_cast<char*>(at + len), aes_tag_size));
        if (!gcm_.run(next_, next_ + 1 == l.segments, at, len, at, reinterpret_cast<unsigned char*>(at + len))) fail(next_);
        ++next_;
        handed_ += len;
        setg(reinterpret_cast<char*>(at), reinterpret_cast<char*>(at), reinterpret_cast<char*>(at + len));
    }

    [[noreturn]] void fail(std::uint64_t segment) {
        setg(nullptr, nullptr, nullptr);
        failure_ = std::make_exception_ptr(aes_authentication_error(path_, segment, layout_.segments));
        std::rethrow_exception(failure_);
    }

    std::string path_;
    AesLayout layout_;
    FileKey file_key_;
    std::vector<unsigned char> aad_;
    GcmSegments gcm_;                    // the caller's
    std::shared_ptr<std::byte> buffer_;  // one segment and its tag
    std::vector<unsigned char> tags_;    // every segment's, where the reader puts them
    VerifiedReader reader_;              // after what it reads into: stopped before they go
    std::uint64_t next_ = 0;             // the next segment to read
    std::uint64_t handed_ = 0;           // plaintext bytes put in the buffer or handed out directly
    std::exception_ptr failure_;         // the caller's
    std::atomic<std::uint64_t> failed_{UINT64_MAX};  // the first segment found failing in open_in_place
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<Pending> queue_;  // read, waiting to be decrypted
    unsigned busy_ = 0;          // segments the helper is decrypting
    bool stop_ = false;
    std::thread helper_;  // last: started after everything it uses
};

/// Reads a large aes-256-gcm body straight into its plaintext block through the stream: one
/// new block and one pass instead of two blocks and three passes, decryption overlapping reading.
inline StreamDecoded aes_gcm_read_decode(int fd, std::uint64_t offset, std::uint64_t n, const DecodeContext& ctx) {
    if (n < parallel_read_threshold) return {};
    auto opened = aes_read_prefix(fd, offset, n, ctx);
    if (!opened) return {};
    StreamDecoded result;
    result.body = {allocate_aligned(static_cast<std::size_t>(opened->second.plain)), opened->second.plain};
    AesGcmBodyStream stream(fd, offset, n, ctx, opened->first, opened->second);
    try {
        stream.sgetn(reinterpret_cast<char*>(result.body.data.get()), static_cast<std::streamsize>(result.body.size));
    } catch (const AuthenticationError&) {  // kept in failure(), reported after the checksum
    }
    result.stored_digest = stream.drain_and_digest();
    result.failure = stream.failure();
    return result;
}

inline std::unique_ptr<PlainBodyStream> aes_gcm_open_stream(int fd, std::uint64_t offset, std::uint64_t n,
                                                            const DecodeContext& ctx) {
    auto opened = aes_read_prefix(fd, offset, n, ctx);
    if (!opened) return nullptr;
    return std::make_unique<AesGcmBodyStream>(fd, offset, n, ctx, opened->first, opened->second);
}

inline std::unique_ptr<ByteSink> make_aes_gcm_encoder(const Codec& c, ByteSink& next, const EncodeContext& ctx) {
    return std::make_unique<AesGcmEncoder>(c, next, ctx);
}

inline const bool aes_gcm_registered =
    register_codec(CodecId::aes_256_gcm,
                   {&make_aes_gcm_encoder, &aes_gcm_decode, &aes_gcm_read_decode, &aes_gcm_open_stream});

}  // namespace detail
}  // namespace ckpt
