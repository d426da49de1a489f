#pragma once
// What the exchange formats share (interop/safetensors.hpp, interop/npz.hpp,
// interop/pytorch.hpp): InteropLoadOptions, which bounds what a file from elsewhere may decode
// to, and the small helpers of reading and writing one. Included by each format's header.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../detail/body.hpp"
#include "../detail/decode_budget.hpp"
#include "../error.hpp"
#include "../format.hpp"
#include "../param_dict.hpp"
#include "../tensor.hpp"

namespace ckpt {

/// How load_safetensors, load_npz and load_torch read a file from elsewhere.
struct InteropLoadOptions {
    /// A file whose tensors and values would take more than this is refused (FormatError)
    /// before the memory is taken: a deflated npz member or PyTorch record, a pickle's objects,
    /// views of one storage under many names. Unset: the larger of 256 MiB and 64 times the
    /// file's size (detail/decode_budget.hpp says why); UINT64_MAX: no limit.
    std::optional<std::uint64_t> max_decoded_bytes = std::nullopt;
};

namespace detail {
inline constexpr const char* interop_budget_option = "InteropLoadOptions::max_decoded_bytes";
}  // namespace detail

namespace detail {

/// Shortest text that reads back as the same double.
inline std::string double_text(double v) {
    std::array<char, 32> buf{};
    const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
    return std::string(buf.data(), r.ptr);
}

template <class T>
std::optional<T> parse_number(std::string_view s) {
    T v{};
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
    return v;
}

inline std::string value_kind_name(ValueKind k) {
    switch (k) {
        case ValueKind::int64: return "int64";
        case ValueKind::float64: return "float64";
        case ValueKind::boolean: return "bool";
        case ValueKind::string: return "string";
        case ValueKind::bytes: return "bytes";
        case ValueKind::strings: return "strings";
        case ValueKind::object: return "object";
        case ValueKind::tensor: return "tensor";
    }
    return "?";
}

/// `state` with its bindings read, for a file of `format` (safetensors or npz), which holds
/// tensors, numbers, bools and strings: bytes, lists of strings and objects are a ConfigError
/// naming the entry.
inline ParamDict exportable(const ParamDict& state, const std::string& path, std::string_view format) {
    ParamDict out;
    for (const auto& [name, value] : state) {
        Value v = materialized(value, ObjectEncoding::boost_binary);
        if (v.kind() == ValueKind::bytes || v.kind() == ValueKind::strings || v.kind() == ValueKind::object)
            throw ConfigError("cannot save '" + path + "': entry '" + name + "' is " + v.type_name() + ", which " +
                                  std::string(format) + " cannot hold; save it as a checkpoint");
        out.set(name, std::move(v));
    }
    return out;
}

/// Reverses the bytes of each `width`-byte element (big-endian files on little-endian hosts).
inline void swap_bytes(std::byte* p, std::size_t n, std::size_t width) {
    if (width < 2) return;
    for (std::size_t i = 0; i + width <= n; i += width) std::reverse(p + i, p + i + width);
}

/// Throws on a bool tensor holding a byte other than 0 and 1: the readers refuse those (a bool
/// read from any other byte is undefined behaviour), so no writer writes one.
inline void check_bool_bytes(const std::string& name, const Tensor& t, const std::string& path) {
    if (t.dtype() != DType::boolean) return;
    const std::byte* p = t.data();
    for (std::size_t i = 0; i < t.nbytes(); ++i)
        if (static_cast<unsigned>(p[i]) > 1)
            throw ConfigError("cannot save '" + path + "': bool tensor '" + name + "' holds the byte " +
                              std::to_string(static_cast<unsigned>(p[i])) + " at element " + std::to_string(i) +
                              ", neither 0 nor 1");
}

/// A read of `path` (detail::reading), nlohmann's exceptions too made FormatErrors naming it.
template <class F>
decltype(auto) reading_foreign(const std::string& path, F&& f) {
    return reading(path, [&]() -> decltype(auto) {
        try {
            return f();
        } catch (const nlohmann::json::exception& e) {
            throw FormatError("cannot read '" + path + "': " + e.what(), path);
        }
    });
}


/// The elements of a strided view of `src` (`stride[k]` elements apart along dimension k) into
/// `dst` in C (row-major) order; `width` bytes an element.
inline void gather_strided(const std::byte* src, std::byte* dst, const Shape& shape, const std::vector<std::size_t>& stride,
                           std::size_t width) {
    const std::size_t rank = shape.size();
    std::size_t numel = 1;
    for (auto d : shape) numel *= static_cast<std::size_t>(d);
    if (numel == 0) return;
    std::vector<std::size_t> index(rank, 0);
    std::size_t from = 0;
    for (std::size_t out = 0; out < numel; ++out) {
        std::memcpy(dst + out * width, src + from * width, width);
        for (std::size_t k = rank; k-- > 0;) {  // the last index moves fastest in C order
            from += stride[k];
            if (++index[k] < static_cast<std::size_t>(shape[k])) break;
            from -= stride[k] * index[k];
            index[k] = 0;
        }
    }
}

}  // namespace detail

}  // namespace ckpt
