#pragma once
// How much a reader may decode from a file it did not write: the budget every reader of
// untrusted input (checkpoints' codec bodies, safetensors, npz, PyTorch files) holds its
// output to, taken before the memory is.
//
// The default is the larger of 256 MiB and 64 times the bytes stored. Real checkpoints
// compress modestly (weights 1.1 to 1.5 times, a fresh optimizer's zeros a few times overall),
// and torch.save stores its records, so 64 leaves them a wide margin, while a zstd frame of
// zeros expands 20,000 times and deflate 1,032 times; the floor lets small files decode to
// what any machine that reads checkpoints has. A file beyond it is refused, naming the figure;
// the caller who trusts it sets max_decoded_bytes (UINT64_MAX: no limit).

#include <algorithm>
#include <cstdint>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "../error.hpp"

namespace ckpt {

/// The default budget's floor and ratio: max(default_decoded_floor, default_decoded_ratio ×
/// the bytes stored).
inline constexpr std::uint64_t default_decoded_floor = std::uint64_t{256} << 20;
inline constexpr std::uint64_t default_decoded_ratio = 64;

namespace detail {

/// The most a read of `stored` bytes may decode to: `max` when set, else the default.
inline std::uint64_t decoded_budget(const std::optional<std::uint64_t>& max, std::uint64_t stored) {
    if (max) return *max;
    const std::uint64_t scaled = stored > UINT64_MAX / default_decoded_ratio ? UINT64_MAX : stored * default_decoded_ratio;
    return std::max(default_decoded_floor, scaled);
}

/// Where a budget comes from, for the message that refuses a file: `option` names the setting
/// ("LoadOptions::max_decoded_bytes").
inline std::string budget_origin(const std::optional<std::uint64_t>& max, std::uint64_t stored, const std::string& option) {
    if (max) return option;
    return "the default max_decoded_bytes: the larger of " + std::to_string(default_decoded_floor) + " bytes and " +
           std::to_string(default_decoded_ratio) + " times its " + std::to_string(stored) +
           " stored bytes; set " + option + " (ckpt --max-decoded-bytes) for a file you trust";
}

/// A read's budget: take() before allocating, and a file that would exceed it is a
/// FormatError naming the file, the figure and where it comes from.
class DecodeBudget {
public:
    /// `file`: how messages name the file ("npz file 'x.npz'").
    DecodeBudget(std::string file, std::string path, const std::optional<std::uint64_t>& max, std::uint64_t stored,
                 const std::string& option)
        : file_(std::move(file)), path_(std::move(path)), limit_(decoded_budget(max, stored)),
          origin_(budget_origin(max, stored, option)) {}

    /// Takes `n` bytes for what `what()` says (called only to word the refusal).
    template <class What>
    void take(std::uint64_t n, What&& what) {
        if (n <= limit_ - spent_) {
            spent_ += n;
            return;
        }
        refuse(what());
    }

    [[noreturn]] void refuse(const std::string& what) const {
        throw FormatError(file_ + " decodes to more than " + std::to_string(limit_) + " bytes: " + what + " (" + origin_ +
                              "): refused before decoding",
                          path_);
    }

    std::uint64_t limit() const noexcept { return limit_; }
    std::uint64_t spent() const noexcept { return spent_; }

private:
    std::string file_, path_;
    std::uint64_t limit_, spent_ = 0;
    std::string origin_;
};

/// Runs a read of `path`: std::bad_alloc becomes OutOfMemory and the standard library's length
/// errors FormatErrors, each naming the file, so that no reader lets them out unexplained. (A
/// file's claims are bounded by its size before anything is allocated: memory refused is this
/// process's shortage, not the file's damage.)
template <class F>
decltype(auto) reading(const std::string& path, F&& f) {
    try {
        return f();
    } catch (const Error&) {
        throw;
    } catch (const std::bad_alloc&) {
        throw OutOfMemory("cannot read '" + path +
                              "': it asked for more memory than this process could get (std::bad_alloc); the file "
                              "may be whole, and max_decoded_bytes refuses a file that claims too much before allocating",
                          path);
    } catch (const std::length_error& e) {
        throw FormatError("cannot read '" + path + "': a length in it is beyond any container's (" + e.what() + ")", path);
    }
}

}  // namespace detail
}  // namespace ckpt
