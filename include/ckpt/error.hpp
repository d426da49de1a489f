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
//   └── ConfigError            invalid policy or configuration values

#include <stdexcept>
#include <string>
#include <utility>

namespace ckpt {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

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

class FormatError : public Error {
public:
    FormatError(const std::string& what, std::string path) : Error(what), path_(std::move(path)) {}
    const std::string& path() const noexcept { return path_; }

private:
    std::string path_;
};

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

class NotFound : public Error {
public:
    using Error::Error;
};

class TypeMismatch : public Error {
public:
    using Error::Error;
};

class LoadMismatch : public Error {
public:
    using Error::Error;
};

class ConfigError : public Error {
public:
    using Error::Error;
};

}  // namespace ckpt
