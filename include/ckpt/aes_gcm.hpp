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
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "codec.hpp"
#include "detail/block_pipeline.hpp"
#include "detail/verified_reader.hpp"
#include "error.hpp"
#include "tensor.hpp"

namespace ckpt {

/// Encrypts the body with AES-256-GCM under `key` (a fresh random salt and derived key per file).
struct AesGcm {
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
        pipeline_.emplace(next_, BlockPipeline::Options{aes_segment_size + aes_tag_size, false, false},
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

/// Runs f(0, n/2) on a second thread and f(n/2, n) here when `n` pieces are worth splitting
/// (segments are independent); rethrows the first failure after both are done.
template <class F>
void on_two_threads(std::uint64_t n, F&& f) {
    if (n < 2 || std::thread::hardware_concurrency() < 2) {
        f(0, n, 0);
        return;
    }
    const std::uint64_t split = n / 2;
    std::exception_ptr failed;
    std::thread second([&] {
        try {
            f(split, n, 1);
        } catch (...) {
            failed = std::current_exception();
        }
    });
    try {
        f(0, split, 0);
    } catch (...) {
        second.join();
        throw;
    }
    second.join();
    if (failed) std::rethrow_exception(failed);
}

inline AuthenticationError aes_authentication_error(const std::string& path, std::uint64_t segment,
                                                    std::uint64_t segments) {
    return AuthenticationError("checkpoint '" + path + "' fails authentication in segment " + std::to_string(segment) +
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
    on_two_threads(l.segments, [&](std::uint64_t first, std::uint64_t end, int) {
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

/// Reads a large aes-256-gcm body straight into its plaintext block: each segment's
/// ciphertext is read to where its plaintext goes (its tag aside), hashed there by the
/// VerifiedReader, then decrypted in place, by a second thread while the reads go on and by
/// the caller once it has issued them all. One new block and one pass instead of two blocks
/// and three passes, and decryption overlaps reading. Anything unexpected in the prefix (a
/// damaged file, another key) declines, so that the whole-body path names the problem.
inline StreamDecoded aes_gcm_read_decode(int fd, std::uint64_t offset, std::uint64_t n, const DecodeContext& ctx) {
    if (n < parallel_read_threshold) return {};
    std::array<std::byte, aes_prefix_size> prefix{};
    pread_exact(fd, reinterpret_cast<char*>(prefix.data()), prefix.size(), offset, ctx.path);
    AesLayout l;
    try {
        l = aes_layout(prefix.data(), n, ctx);
    } catch (const Error&) {  // a damaged prefix or another key: the whole-body path tells which
        return {};
    }

    StreamDecoded result;
    result.body = {allocate_aligned(static_cast<std::size_t>(l.plain)), l.plain};
    std::byte* const out = result.body.data.get();
    std::vector<unsigned char> tags(static_cast<std::size_t>(l.segments) * aes_tag_size);
    const FileKey file_key(ctx.key, l.salt, ctx.path);
    const auto aad = aes_associated_data(ctx.associated_data, prefix.data());

    VerifiedReader reader(fd, ctx.path, offset, n);
    reader.read(reinterpret_cast<char*>(prefix.data()), prefix.size());  // hashed with the rest
    constexpr std::uint64_t per_chunk = 4;  // segments handed to decryption at a time
    const std::uint64_t chunks = (l.segments + per_chunk - 1) / per_chunk;
    std::vector<std::uint64_t> tickets(static_cast<std::size_t>(chunks));
    std::mutex mutex;
    std::condition_variable issued_cv;
    std::uint64_t issued = 0;
    bool abandoned = false;
    std::atomic<std::uint64_t> next_chunk{0}, failed_segment{UINT64_MAX};
    std::exception_ptr helper_error;

    auto decrypt_chunks = [&](GcmSegments& gcm) {
        for (;;) {
            const std::uint64_t j = next_chunk.fetch_add(1);
            if (j >= chunks) return;
            std::uint64_t ticket = 0;
            {
                std::unique_lock lock(mutex);
                // Bounded: the caller issues reads without waiting on anyone, or gives up.
                issued_cv.wait(lock, [&] { return issued > j || abandoned; });
                if (issued <= j) return;
                ticket = tickets[static_cast<std::size_t>(j)];
            }
            reader.wait(ticket);  // hashed: the ciphertext may now be overwritten
            for (std::uint64_t i = j * per_chunk; i < std::min(l.segments, (j + 1) * per_chunk); ++i) {
                if (failed_segment.load() != UINT64_MAX) return;
                std::byte* at = out + i * l.segment;
                if (!gcm.run(i, i + 1 == l.segments, at, l.length(i), at, tags.data() + i * aes_tag_size)) {
                    std::uint64_t seen = failed_segment.load();
                    while (i < seen && !failed_segment.compare_exchange_weak(seen, i)) {
                    }
                    return;
                }
            }
        }
    };
    std::thread helper;
    if (std::thread::hardware_concurrency() >= 2)
        helper = std::thread([&] {
            try {
                GcmSegments gcm(file_key, aad, false, ctx.path);
                decrypt_chunks(gcm);
            } catch (...) {
                helper_error = std::current_exception();
            }
        });
    try {
        for (std::uint64_t j = 0; j < chunks; ++j) {
            std::uint64_t ticket = 0;
            for (std::uint64_t i = j * per_chunk; i < std::min(l.segments, (j + 1) * per_chunk); ++i) {
                reader.read(reinterpret_cast<char*>(out + i * l.segment), l.length(i));
                ticket = reader.read(reinterpret_cast<char*>(tags.data() + i * aes_tag_size), aes_tag_size);
            }
            {
                std::lock_guard lock(mutex);
                tickets[static_cast<std::size_t>(j)] = ticket;
                issued = j + 1;
            }
            issued_cv.notify_all();
        }
        GcmSegments gcm(file_key, aad, false, ctx.path);
        decrypt_chunks(gcm);
    } catch (...) {
        {
            std::lock_guard lock(mutex);
            abandoned = true;
        }
        issued_cv.notify_all();
        if (helper.joinable()) helper.join();  // it uses the reader and the block
        throw;
    }
    if (helper.joinable()) helper.join();
    result.stored_digest = reader.digest();
    if (helper_error) {
        result.failure = helper_error;
    } else if (const auto bad = failed_segment.load(); bad != UINT64_MAX) {
        result.failure = std::make_exception_ptr(aes_authentication_error(ctx.path, bad, l.segments));
    }
    return result;
}

inline std::unique_ptr<ByteSink> make_aes_gcm_encoder(const Codec& c, ByteSink& next, const EncodeContext& ctx) {
    return std::make_unique<AesGcmEncoder>(c, next, ctx);
}

inline const bool aes_gcm_registered =
    register_codec(CodecId::aes_256_gcm, {&make_aes_gcm_encoder, &aes_gcm_decode, &aes_gcm_read_decode});

}  // namespace detail
}  // namespace ckpt
