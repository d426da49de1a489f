#pragma once
// Body codecs: what the archive's bytes pass through on their way to the file, chosen at
// compile time like the other policies.
//
//   ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming, ckpt::BinaryArchive,
//                           ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>>
//       mgr(dir, "run", ckpt::EverySteps{100}, ckpt::KeepLast{3}, {}, {},
//           ckpt::Chain{ckpt::Zstd{3}, ckpt::AesGcm{ckpt::Key::from_file("run.key")}});
//
// A CodecPolicy C provides `CodecChain codecs() const`: the stages, in the order applied.
// Members: NoCodec (the default: the body is stored as the archive wrote it), Zstd{level}
// (<ckpt/codecs/zstd.hpp>, target ckpt::zstd), AesGcm{key} (<ckpt/codecs/aes_gcm.hpp>, target
// ckpt::aes_gcm) and Chain<C...>, which applies its members in turn (compress, then encrypt).
//
// The header records the stages, so a reader needs no policy: load_checkpoint() decodes any
// file whose codecs are compiled in (including their header is enough), and says which header
// to include when one is not. The body checksum covers the stored bytes: verify_checkpoint()
// and latest() need no key. The core depends on neither libzstd nor OpenSSL.

#include <string.h>  // explicit_bzero

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <streambuf>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "../detail/hash.hpp"
#include "../detail/posix_io.hpp"
#include "../error.hpp"
#include "../format.hpp"
#include "../path.hpp"

namespace ckpt {

/// A 256-bit key. Copies share one block of memory, wiped when the last copy goes; it is
/// never printed (errors name a key by the id aes_gcm.hpp derives from it).
class Key {
public:
    static constexpr std::size_t size = 32;

    Key() = default;  ///< no key

    static Key from_bytes(std::span<const unsigned char> bytes) {
        if (bytes.size() != size)
            throw ConfigError("an AES-256 key is " + std::to_string(size) + " bytes, got " +
                              std::to_string(bytes.size()) + " bytes");
        Key k;
        k.bytes_ = std::shared_ptr<Block>(new Block, [](Block* b) {
            ::explicit_bzero(b->data(), b->size());
            delete b;
        });
        std::memcpy(k.bytes_->data(), bytes.data(), size);
        return k;
    }
    static Key from_bytes(std::string_view bytes) {
        return from_bytes({reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()});
    }

    /// A key file holds the 32 key bytes, or 64 hexadecimal digits (a trailing newline allowed).
    static Key from_file(const PathArg& file) {
        const std::string path = file.string();
        detail::Fd fd = detail::open_for_read(path, "key file");
        std::array<unsigned char, 2 * size + 3> buf{};
        const std::size_t n = detail::read_full(fd.get(), buf.data(), buf.size(), path);
        Key k;
        std::size_t digits = n;
        while (digits > 0 && (buf[digits - 1] == '\n' || buf[digits - 1] == '\r')) --digits;
        if (digits == 2 * size && all_hex(buf.data(), digits)) {
            std::array<unsigned char, size> raw{};
            for (std::size_t i = 0; i < size; ++i) raw[i] = static_cast<unsigned char>(hex(buf[2 * i]) << 4 | hex(buf[2 * i + 1]));
            k = from_bytes(raw);
            ::explicit_bzero(raw.data(), raw.size());
        } else if (n == size) {
            k = from_bytes(std::span<const unsigned char>(buf.data(), size));
        }
        ::explicit_bzero(buf.data(), buf.size());
        if (k.empty())
            throw ConfigError("key file '" + path + "' holds " + (n == buf.size() ? "more than " : "") +
                              std::to_string(n) + " bytes; expected " + std::to_string(size) + " raw bytes or " +
                              std::to_string(2 * size) + " hexadecimal digits");
        return k;
    }

    /// A new key from the system's random source.
    static Key random() {
        std::array<unsigned char, size> raw{};
        detail::random_bytes(raw.data(), raw.size());
        Key k = from_bytes(raw);
        ::explicit_bzero(raw.data(), raw.size());
        return k;
    }

    bool empty() const noexcept { return !bytes_; }
    explicit operator bool() const noexcept { return !empty(); }
    const unsigned char* data() const noexcept { return bytes_ ? bytes_->data() : nullptr; }

private:
    using Block = std::array<unsigned char, size>;
    static bool all_hex(const unsigned char* p, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i)
            if (hex(p[i]) < 0) return false;
        return true;
    }
    static int hex(unsigned char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    }
    std::shared_ptr<Block> bytes_;
};

/// One stage of a body's codecs, described: which codec and its parameters.
struct Codec {
    CodecId id = CodecId::none;
    int level = 0;  ///< zstd: the compression level
    Key key;        ///< aes-256-gcm: the key
};
/// A body's codec stages, in the order applied: what a CodecPolicy gives and SaveOptions::codecs
/// takes.
using CodecChain = std::vector<Codec>;

/// What a manager's bodies pass through between the archive and the file: `CodecChain codecs()
/// const`, the stages in the order applied. Loading needs no policy: the header records the
/// stages. Members: NoCodec, Zstd, AesGcm, Chain.
template <class C>
concept CodecPolicy = std::copy_constructible<C> && requires(const C& c) {
    { c.codecs() } -> std::same_as<CodecChain>;
};

/// Stores the body as the archive wrote it.
struct NoCodec {
    CodecChain codecs() const { return {}; }
};

namespace detail {
/// Whether a codec policy encrypts (its `static constexpr bool encrypts`).
template <class C>
constexpr bool encrypts() {
    if constexpr (requires { { C::encrypts } -> std::convertible_to<bool>; }) return C::encrypts;
    else return false;
}
template <class... Cs>
constexpr bool encryption_last() {
    constexpr bool flags[] = {false, encrypts<Cs>()...};
    for (std::size_t i = 1; i + 1 < sizeof...(Cs) + 1; ++i)
        if (flags[i]) return false;
    return true;
}
}  // namespace detail

/// Applies its members in turn: Chain<Zstd, AesGcm> compresses, then encrypts.
template <CodecPolicy... Cs>
struct Chain {
    static_assert(detail::encryption_last<Cs...>(),
                  "ckpt::Chain: encryption must come last (Chain<Zstd, AesGcm>): encrypted bytes do not compress, and "
                  "a reader decrypts first");
    static constexpr bool encrypts = (detail::encrypts<Cs>() || ...);
    std::tuple<Cs...> members;
    Chain() = default;
    explicit Chain(Cs... cs) : members(std::move(cs)...) {}
    CodecChain codecs() const {
        CodecChain out;
        std::apply([&](const auto&... m) { (append(out, m.codecs()), ...); }, members);
        return out;
    }

private:
    static void append(CodecChain& out, CodecChain more) {
        for (auto& c : more) out.push_back(std::move(c));
    }
};

/// A piece of memory passed on as it is (ByteSink::put_pieces).
struct ConstBytes {
    const std::byte* data = nullptr;
    std::size_t size = 0;
};

/// Where a stage sends its output: the next stage, or the file.
class ByteSink {
public:
    virtual ~ByteSink() = default;
    virtual void put(const std::byte* data, std::size_t n) = 0;
    /// As put(), for memory that stays valid and unchanged until finish() returns (a tensor's
    /// payload while it is saved): a stage may then keep working on it after this returns.
    virtual void put_lasting(const std::byte* data, std::size_t n) { put(data, n); }
    /// put() of each piece in turn, which a file takes in one writev (blocks and their headers).
    virtual void put_pieces(std::span<const ConstBytes> pieces) {
        for (const ConstBytes& p : pieces) put(p.data, p.size);
    }
    virtual void finish() = 0;  ///< no more input: flush everything downstream
};

/// What an encoder knows of the file it writes: its path (for errors) and the header fields a
/// codec may authenticate (header_associated_data).
struct EncodeContext {
    std::string path;
    std::array<std::byte, 56> associated_data{};
};

/// A body in memory: the verified stored bytes, then each decoded stage in turn.
struct BodyBytes {
    std::shared_ptr<std::byte> data;  ///< 64-byte aligned (payloads in it are aliased, not copied)
    std::uint64_t size = 0;
};

struct DecodeContext {
    std::string path;
    std::array<std::byte, 56> associated_data{};
    Key key;
    std::uint64_t max_decoded_bytes = UINT64_MAX;  ///< the budget (LoadOptions::max_decoded_bytes, or its default)
    std::string budget_origin = "LoadOptions::max_decoded_bytes";  ///< where the budget comes from, for messages
};

/// What a codec made of a body it read from the file itself (CodecImpl::read_decode).
struct StreamDecoded {
    BodyBytes body;                   ///< null data: the codec declined; read the body whole instead
    std::uint64_t stored_digest = 0;  ///< xxh3 of the stored bytes, checked before anything else
    std::exception_ptr failure;       ///< a decoding failure, reported if the checksum matches
};

/// The plaintext of a stored body, read from its file as a parser asks for it (for loading
/// straight into existing tensors): large reads go to their destination with no block between.
class PlainBodyStream : public std::streambuf {
public:
    virtual std::uint64_t position() const noexcept = 0;  ///< plaintext bytes handed out
    virtual std::uint64_t length() const noexcept = 0;    ///< plaintext bytes in all
    /// Reads and hashes whatever stored bytes the parser left, then returns the xxh3 of them
    /// all; decoding failures found meanwhile go to failure().
    virtual std::uint64_t drain_and_digest() = 0;
    /// A decoding failure found by a read or by drain_and_digest(), reported if the checksum
    /// matches.
    virtual std::exception_ptr failure() const { return nullptr; }
    /// Returns once nothing more is written into memory the stream handed out (reads and
    /// decoding may go on in the background), before that memory may go.
    virtual void settle() noexcept {}
};

/// A codec's implementation, registered by its header (zstd.hpp, aes_gcm.hpp).
struct CodecImpl {
    std::unique_ptr<ByteSink> (*make_encoder)(const Codec&, ByteSink& next, const EncodeContext&) = nullptr;
    BodyBytes (*decode)(BodyBytes stored, const DecodeContext&) = nullptr;
    /// Optional, for the outermost stage: reads the stored body (`length` bytes at `offset`
    /// of `fd`), hashing it, and decodes it as it arrives rather than after.
    StreamDecoded (*read_decode)(int fd, std::uint64_t offset, std::uint64_t length, const DecodeContext&) = nullptr;
    /// Optional, for a body with this one stage: its plaintext as a stream, hashing the stored
    /// bytes as they are read. Null: declined; decode the body whole instead.
    std::unique_ptr<PlainBodyStream> (*open_stream)(int fd, std::uint64_t offset, std::uint64_t length,
                                                    const DecodeContext&) = nullptr;
};

namespace detail {

inline std::array<CodecImpl, 256>& codec_registry() {
    static std::array<CodecImpl, 256> registry{};
    return registry;
}

/// Registers a codec's implementation; its header calls this while the program starts.
inline bool register_codec(CodecId id, CodecImpl impl) {
    codec_registry()[static_cast<std::size_t>(id)] = impl;
    return true;
}

inline std::string codec_header_hint(CodecId id) {
    switch (id) {
        case CodecId::zstd: return "include <ckpt/codecs/zstd.hpp> and link ckpt::zstd";
        case CodecId::aes_256_gcm: return "include <ckpt/codecs/aes_gcm.hpp> and link ckpt::aes_gcm";
        default: return "no codec of that number exists";
    }
}

inline const CodecImpl& codec_impl(CodecId id, const std::string& path, const char* doing) {
    const CodecImpl& impl = codec_registry()[static_cast<std::size_t>(id)];
    if (!impl.decode)
        throw ConfigError(std::string(doing) + " '" + path + "' needs the " + std::string(codec_name(id)) +
                          " codec, which this program does not have: " + codec_header_hint(id));
    return impl;
}

/// Checks a chain before anything is written: known, compiled-in stages, at most three,
/// encryption last (encrypted bytes do not compress), keys present.
inline void check_chain(const CodecChain& chain, const std::string& path) {
    if (chain.size() > max_codec_stages)
        throw ConfigError("cannot save '" + path + "': " + std::to_string(chain.size()) + " codec stages, at most " +
                          std::to_string(max_codec_stages));
    for (std::size_t i = 0; i < chain.size(); ++i) {
        const Codec& c = chain[i];
        if (c.id == CodecId::none)
            throw ConfigError("cannot save '" + path + "': codec stage " + std::to_string(i) + " is 'none'");
        codec_impl(c.id, path, "saving");
        if (c.id == CodecId::aes_256_gcm) {
            if (c.key.empty()) throw KeyError("cannot save '" + path + "' encrypted: the AesGcm codec has no key", path);
            if (i + 1 != chain.size())
                throw ConfigError("cannot save '" + path +
                                  "': encryption must be the last codec stage (encrypted bytes do not compress)");
        }
    }
}

/// The end of the chain: hashes the stored bytes and writes them to the file.
class FileSink final : public ByteSink {
public:
    FileSink(int fd, std::string path, std::uint64_t offset) : file_(fd, std::move(path), offset) {}
    void put(const std::byte* data, std::size_t n) override {
        hash_.update(data, n);
        file_.write(data, n);
        written_ += n;
    }
    void put_pieces(std::span<const ConstBytes> pieces) override {
        for (const ConstBytes& p : pieces) {
            hash_.update(p.data, p.size);
            written_ += p.size;
        }
        file_.write_pieces(pieces);
    }
    void finish() override {}
    std::uint64_t written() const noexcept { return written_; }
    std::uint64_t digest() const { return hash_.digest(); }

private:
    AppendingWriter file_;
    Xxh3 hash_;
    std::uint64_t written_ = 0;
};

/// The encoders of `chain`, each feeding the next, the last feeding `file`.
class EncoderChain {
public:
    EncoderChain(const CodecChain& chain, ByteSink& file, const EncodeContext& ctx) {
        ByteSink* next = &file;
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
            stages_.push_back(codec_impl(it->id, ctx.path, "saving").make_encoder(*it, *next, ctx));
            next = stages_.back().get();
        }
        head_ = next;
    }
    ByteSink& head() noexcept { return *head_; }

private:
    std::vector<std::unique_ptr<ByteSink>> stages_;  // last stage first
    ByteSink* head_ = nullptr;
};

inline void require_key(const FileHeader& h, const DecodeContext& ctx) {
    if (h.encrypted() && ctx.key.empty())
        throw KeyError("checkpoint '" + ctx.path + "' is encrypted (" + h.codec_names() +
                           "): reading it needs its key (LoadOptions::key, or --key-file for the ckpt tool)",
                       ctx.path);
}

/// Undoes a verified stored body's codecs, last applied first, from stage `stages` - 1 down
/// (all of them by default).
inline BodyBytes decode_body(const FileHeader& h, BodyBytes body, const DecodeContext& ctx,
                             std::size_t stages = max_codec_stages) {
    require_key(h, ctx);
    for (std::size_t i = stages; i-- > 0;) {
        if (h.codecs[i] == CodecId::none) continue;
        body = codec_impl(h.codecs[i], ctx.path, "reading").decode(std::move(body), ctx);
    }
    return body;
}

}  // namespace detail
}  // namespace ckpt
