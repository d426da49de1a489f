#pragma once
// The exceptions ckpt throws. Every message names the file, tensor or key involved
// and what was expected, so that a failed resume can be diagnosed from the log alone.
//
//   Error                      anything ckpt throws
//   ├── IoError                open/read/write/fsync/rename/mkdir failed (carries errno)
//   ├── FormatError            not a checkpoint, truncated, bad length, unknown dtype/kind
//   │   ├── ChecksumError      header check or body xxh3 does not match
//   │   │   └── AuthenticationError  an encrypted body fails its authentication tag
//   │   └── VersionError       format version this reader does not know
//   ├── KeyError               an encrypted checkpoint and no key, or another key than its own
//   ├── NotFound               no such key in a ParamDict
//   ├── TypeMismatch           typed access asked for the wrong type
//   ├── LoadMismatch           strict load found missing, unexpected or mismatched tensors
//   ├── ConfigError            invalid policy or configuration values
//   │   └── SeriesLocked       another writer holds the series (series.hpp)
//   └── UnreadableCheckpoints  checkpoints exist, but the newest cannot be read here or none
//                              can be used (latest.hpp)

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace ckpt {

namespace detail {
/// `text` safe to print whatever bytes a damaged or hostile file put in it: valid UTF-8 stays
/// as it is but for control characters (C0 other than newline and tab, DEL, C1: terminal
/// escape sequences), which become \xNN, as does every byte of an invalid sequence.
inline std::string printable(std::string_view text) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(text.size());
    auto escape = [&](unsigned char b) {
        out += "\\x";
        out += hex[b >> 4];
        out += hex[b & 15];
    };
    for (std::size_t i = 0; i < text.size();) {
        const auto b = static_cast<unsigned char>(text[i]);
        if (b < 0x80) {
            if ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7f) escape(b);
            else out += static_cast<char>(b);
            ++i;
            continue;
        }
        // a multi-byte sequence: its length, smallest code point and continuation bytes checked
        const std::size_t n = b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
        std::uint32_t cp = n == 2 ? b & 0x1fu : n == 3 ? b & 0x0fu : b & 0x07u;
        bool valid = n != 0 && i + n <= text.size();
        for (std::size_t k = 1; valid && k < n; ++k) {
            const auto c = static_cast<unsigned char>(text[i + k]);
            valid = (c & 0xc0) == 0x80;
            cp = (cp << 6) | (c & 0x3fu);
        }
        valid = valid && !(n == 3 && cp < 0x800) && !(n == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
                !(cp >= 0xd800 && cp <= 0xdfff);
        if (!valid) {
            escape(b);
            ++i;
        } else if (cp >= 0x80 && cp <= 0x9f) {  // C1 controls
            for (std::size_t k = 0; k < n; ++k) escape(static_cast<unsigned char>(text[i + k]));
            i += n;
        } else {
            out.append(text.substr(i, n));
            i += n;
        }
    }
    return out;
}
}  // namespace detail

/// Its message is printable whatever bytes of a file it quotes (detail::printable).
class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(detail::printable(what)) {}
};

/// A file or directory operation failed (open, read, write, fsync, rename, mkdir, lock):
/// path() names it, error_code() is the errno (0 when there is none).
class IoError : public Error {
public:
    IoError(const std::string& what, std::string path, int err = 0)
        : Error(what), path_(std::move(path)), errno_(err) {}
    const std::string& path() const noexcept { return path_; }
    int error_code() const noexcept { return errno_; }

private:
    std::string path_;
    int errno_;
};

/// Not a checkpoint, or not a whole one: a wrong magic, a truncated file, a length, shape or
/// entry that does not fit, a body that would decode to more than the load allows. path()
/// names the file.
class FormatError : public Error {
public:
    FormatError(const std::string& what, std::string path) : Error(what), path_(std::move(path)) {}
    const std::string& path() const noexcept { return path_; }

private:
    std::string path_;
};

/// The header check or the body's xxh3-64 checksum does not match: the file was torn or altered
/// after it was written. Lookups (latest(), restore()) pass over such files for older ones.
class ChecksumError : public FormatError {
public:
    using FormatError::FormatError;
};

/// The stored bytes match their checksum, the key is the file's own, and still the body or
/// the header fails authentication: altered after it was written, checksum recomputed.
class AuthenticationError : public ChecksumError {
public:
    using ChecksumError::ChecksumError;
};

/// An intact file this reader cannot read: a newer format version, or an archive kind, codec,
/// dtype or value kind it does not know. Lookups count it as unreadable here rather than
/// damaged (SkippedCheckpoint::unsupported).
class VersionError : public FormatError {
public:
    using FormatError::FormatError;
};

/// Reading an encrypted checkpoint without a key, or with another key than the one it was
/// written with. Messages name the file and key ids, never key bytes.
class KeyError : public Error {
public:
    KeyError(const std::string& what, std::string path) : Error(what), path_(std::move(path)) {}
    const std::string& path() const noexcept { return path_; }

private:
    std::string path_;
};

/// Reading a file needed memory this process could not get (std::bad_alloc): the file may be
/// whole. path() names it. Lookups (restore(), latest()) count it as unreadable here, not as
/// damaged: they do not pass over it for an older state (SkippedCheckpoint::unsupported).
class OutOfMemory : public Error {
public:
    OutOfMemory(const std::string& what, std::string path) : Error(what), path_(std::move(path)) {}
    const std::string& path() const noexcept { return path_; }

private:
    std::string path_;
};

/// No entry of that name in a ParamDict (ParamDict::at(), get(), tensor()).
class NotFound : public Error {
public:
    using Error::Error;
};

/// A value read as a type it does not hold: ParamDict::get<T>() of another kind (or an integer
/// that does not fit T), Tensor::values<T>() of another dtype, a view whose element count does
/// not match its shape. The message names the key or tensor and both types.
class TypeMismatch : public Error {
public:
    using Error::Error;
};

/// A load that does not fit its target: a strict load that finds tensors missing, unexpected or
/// of another dtype or shape (naming all of them, before anything is written), a bound variable
/// that cannot take its stored value, a resharding load that cannot fill a tensor.
class LoadMismatch : public Error {
public:
    using Error::Error;
};

/// An invalid policy, option or argument (KeepLast{0}, a prefix another run could produce,
/// async_buffers 0, a codec this program was built without), or a file that needs a codec this
/// program lacks. The message names the setting or the file.
class ConfigError : public Error {
public:
    using Error::Error;
};

}  // namespace ckpt
