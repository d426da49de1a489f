#pragma once
// The fixed 64-byte header in front of every checkpoint body. All fields little-endian.
//
//   offset  size  field
//        0     8  magic "\x89CKPT\r\n\x1a" (the \r\n and \x1a catch text-mode mangling)
//        8     4  format version: 3 for a binary body with chunk checksums in its table of
//                 contents, 2 when the body passed through codecs, 1 otherwise
//       12     1  archive kind of the body: 0 binary, 1 text, 2 xml
//       13     3  codecs the body passed through, in the order applied, one byte each:
//                 0 none (unused slots), 1 zstd, 2 aes-256-gcm (version 1: all three 0)
//       16     8  body length in bytes (the file is exactly 64 + body length)
//       24     8  xxh3-64 of the body
//       32     8  epoch recorded by the writer (0 when none)
//       40     8  step recorded by the writer (0 when none)
//       48     8  save time, nanoseconds since the Unix epoch
//       56     8  xxh3-64 of bytes 0..55 (the header check)
//
// The body checksum covers the stored bytes, after the codecs: verifying needs no key.
// Nothing after the header is trusted before the header check and then the body checksum pass.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "detail/hash.hpp"
#include "error.hpp"

namespace ckpt {

/// The Boost archive a body was written with, as the header records it (an ArchivePolicy picks
/// it when saving): binary (read back on the same platform only), text or xml (portable).
enum class ArchiveKind : std::uint32_t { binary = 0, text = 1, xml = 2 };

constexpr std::string_view archive_kind_name(ArchiveKind k) {
    switch (k) {
        case ArchiveKind::binary: return "binary";
        case ArchiveKind::text: return "text";
        case ArchiveKind::xml: return "xml";
    }
    return "unknown";
}

/// Body codecs, as the header records them (codecs/codec.hpp describes each).
enum class CodecId : std::uint8_t { none = 0, zstd = 1, aes_256_gcm = 2 };

constexpr std::string_view codec_name(CodecId c) {
    switch (c) {
        case CodecId::none: return "none";
        case CodecId::zstd: return "zstd";
        case CodecId::aes_256_gcm: return "aes-256-gcm";
    }
    return "unknown";
}

/// The newest format version this reader knows. Binary bodies without codecs are written as
/// version 3 (chunk checksums for partial reads), or version 1, which every reader since the
/// first one reads, when SaveOptions::chunk_bytes is 0; bodies with codecs as version 2; text
/// and xml bodies without codecs as version 1.
inline constexpr std::uint32_t format_version = 3;
inline constexpr std::uint32_t format_version_plain = 1;
inline constexpr std::uint32_t format_version_codecs = 2;
inline constexpr std::uint32_t format_version_chunked = 3;
/// The chunk sizes a version 3 table of contents may name: powers of two in this range.
inline constexpr std::uint64_t min_chunk_bytes = std::uint64_t{1} << 12;
inline constexpr std::uint64_t max_chunk_bytes = std::uint64_t{1} << 30;
constexpr bool valid_chunk_bytes(std::uint64_t n) {
    return n >= min_chunk_bytes && n <= max_chunk_bytes && (n & (n - 1)) == 0;
}
/// What save_checkpoint() checksums a version 3 file's payloads by: a piece read checks at
/// most this much more than it needs, and the table grows by 8 bytes per chunk.
inline constexpr std::uint64_t default_chunk_bytes = std::uint64_t{1} << 20;
/// Format versions above this, in a header that fails its check, are taken for damage rather
/// than for a newer writer's (decode_header).
inline constexpr std::uint32_t max_plausible_format_version = 255;
inline constexpr std::size_t max_codec_stages = 3;
inline constexpr std::size_t header_size = 64;
inline constexpr std::array<unsigned char, 8> file_magic = {0x89, 'C', 'K', 'P', 'T', '\r', '\n', 0x1a};

/// The 64-byte header in front of every body (its layout is at the top of format.hpp), as
/// read_header() returns it: format version, archive kind, codecs, body length and checksum,
/// and the position and time the writer recorded.
struct FileHeader {
    std::uint32_t version = format_version_plain;
    ArchiveKind archive = ArchiveKind::binary;
    std::array<CodecId, max_codec_stages> codecs{};  ///< in the order applied; CodecId::none after the last
    std::uint64_t body_length = 0;
    std::uint64_t body_hash = 0;
    std::int64_t epoch = 0;
    std::int64_t step = 0;
    std::int64_t save_time_ns = 0;

    bool encoded() const noexcept { return codecs[0] != CodecId::none; }
    /// Version 3: the table of contents checksums each chunk of each payload (a piece of the
    /// file can be read and verified alone).
    bool chunked() const noexcept { return version == format_version_chunked; }
    bool encrypted() const noexcept {
        for (auto c : codecs)
            if (c == CodecId::aes_256_gcm) return true;
        return false;
    }
    /// "zstd+aes-256-gcm", or "none".
    std::string codec_names() const {
        std::string s;
        for (auto c : codecs)
            if (c != CodecId::none) {
                if (!s.empty()) s += '+';
                s += codec_name(c);
            }
        return s.empty() ? "none" : s;
    }
};

namespace detail {
template <class T>
void put_le(std::byte* p, T v) {
    auto u = static_cast<std::make_unsigned_t<T>>(v);
    for (std::size_t i = 0; i < sizeof u; ++i) p[i] = static_cast<std::byte>((u >> (8 * i)) & 0xffu);
}
template <class T>
T get_le(const std::byte* p) {
    std::make_unsigned_t<T> u = 0;
    for (std::size_t i = 0; i < sizeof u; ++i) u |= static_cast<std::make_unsigned_t<T>>(p[i]) << (8 * i);
    return static_cast<T>(u);
}
}  // namespace detail

inline std::array<std::byte, header_size> encode_header(const FileHeader& h) {
    std::array<std::byte, header_size> b{};
    std::memcpy(b.data(), file_magic.data(), file_magic.size());
    detail::put_le<std::uint32_t>(b.data() + 8, h.version);
    b[12] = static_cast<std::byte>(h.archive);
    for (std::size_t i = 0; i < max_codec_stages; ++i) b[13 + i] = static_cast<std::byte>(h.codecs[i]);
    detail::put_le<std::uint64_t>(b.data() + 16, h.body_length);
    detail::put_le<std::uint64_t>(b.data() + 24, h.body_hash);
    detail::put_le<std::int64_t>(b.data() + 32, h.epoch);
    detail::put_le<std::int64_t>(b.data() + 40, h.step);
    detail::put_le<std::int64_t>(b.data() + 48, h.save_time_ns);
    detail::put_le<std::uint64_t>(b.data() + 56, detail::xxh3(b.data(), 56));
    return b;
}

/// What a codec authenticates of the header (aes-256-gcm's associated data): bytes 0..55 with
/// the body length and checksum zeroed, as those describe the stored bytes the codec makes.
inline std::array<std::byte, 56> header_associated_data(const std::byte* header) {
    std::array<std::byte, 56> a{};
    std::memcpy(a.data(), header, a.size());
    std::memset(a.data() + 16, 0, 16);
    return a;
}
inline std::array<std::byte, 56> header_associated_data(const FileHeader& h) {
    return header_associated_data(encode_header(h).data());
}

/// Parses and checks a header read from `path`, whose total size is `file_size`.
/// Throws FormatError (not a checkpoint, truncated, bad kind or length), VersionError or ChecksumError.
inline FileHeader decode_header(const std::byte* b, std::size_t available, std::uint64_t file_size,
                                const std::string& path) {
    if (available < header_size || std::memcmp(b, file_magic.data(), file_magic.size()) != 0) {
        if (available >= file_magic.size() && std::memcmp(b, file_magic.data(), file_magic.size()) == 0)
            throw FormatError("checkpoint '" + path + "' is truncated: " + std::to_string(file_size) +
                                  " bytes, shorter than the " + std::to_string(header_size) + "-byte header",
                              path);
        constexpr std::string_view npy_magic = "\x93NUMPY";
        if (available >= npy_magic.size() && std::memcmp(b, npy_magic.data(), npy_magic.size()) == 0)
            throw FormatError("'" + path +
                                  "' is not a ckpt checkpoint: it is a NumPy .npy file, a single array (ckpt reads "
                                  "npz archives of named arrays: np.savez('x.npz', name=array))",
                              path);
        throw FormatError("'" + path + "' is not a ckpt checkpoint (bad magic bytes)", path);
    }
    FileHeader h;
    h.version = detail::get_le<std::uint32_t>(b + 8);
    const bool header_checks = detail::get_le<std::uint64_t>(b + 56) == detail::xxh3(b, 56);
    // A version this reader does not know is a newer writer's (whose header may be laid out
    // otherwise, its check elsewhere), unless the number is one no writer would reach and the
    // header fails its check here: a bit flipped in the version field.
    if (h.version < format_version_plain || h.version > format_version) {
        if (!header_checks && (h.version == 0 || h.version > max_plausible_format_version))
            throw ChecksumError("checkpoint '" + path + "' has a corrupt header (format version field reads " +
                                    std::to_string(h.version) + ", header check mismatch)",
                                path);
        throw VersionError("checkpoint '" + path + "' has format version " + std::to_string(h.version) +
                               "; this reader knows versions 1 to " + std::to_string(format_version),
                           path);
    }
    if (!header_checks)
        throw ChecksumError("checkpoint '" + path + "' has a corrupt header (header check mismatch)", path);
    const auto kind = std::to_integer<std::uint32_t>(b[12]);
    if (kind > static_cast<std::uint32_t>(ArchiveKind::xml))
        throw VersionError("checkpoint '" + path + "' names archive kind " + std::to_string(kind) +
                               ", which this version of ckpt does not know (written by a newer version?)",
                           path);
    h.archive = static_cast<ArchiveKind>(kind);
    if (h.chunked() && h.archive != ArchiveKind::binary)
        throw FormatError("checkpoint '" + path + "' is malformed: format version 3 holds binary bodies, not " +
                              std::string(archive_kind_name(h.archive)) + " ones",
                          path);
    bool ended = false;
    for (std::size_t i = 0; i < max_codec_stages; ++i) {
        const auto id = std::to_integer<std::uint32_t>(b[13 + i]);
        if (id > static_cast<std::uint32_t>(CodecId::aes_256_gcm))
            throw VersionError("checkpoint '" + path + "' names codec " + std::to_string(id) +
                                   ", which this version of ckpt does not know (written by a newer version?)",
                               path);
        h.codecs[i] = static_cast<CodecId>(id);
        if (id != 0 && (ended || h.version != format_version_codecs))
            throw FormatError("checkpoint '" + path + "' has a malformed codec list (header bytes 13 to 15)", path);
        ended = ended || id == 0;
    }
    h.body_length = detail::get_le<std::uint64_t>(b + 16);
    h.body_hash = detail::get_le<std::uint64_t>(b + 24);
    h.epoch = detail::get_le<std::int64_t>(b + 32);
    h.step = detail::get_le<std::int64_t>(b + 40);
    h.save_time_ns = detail::get_le<std::int64_t>(b + 48);
    if (file_size - header_size != h.body_length)
        throw FormatError("checkpoint '" + path + "' is " + std::to_string(file_size) +
                              " bytes but its header announces a body of " + std::to_string(h.body_length) +
                              " bytes after the " + std::to_string(header_size) + "-byte header" +
                              (file_size - header_size < h.body_length ? " (truncated)" : " (trailing bytes)"),
                          path);
    return h;
}

}  // namespace ckpt
