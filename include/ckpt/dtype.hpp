#pragma once
// Element types a checkpoint tensor can hold, and the C++ types that map onto them.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace ckpt {

/// IEEE 754 binary16, stored as its bit pattern. Converts to and from float
/// (round to nearest even) so that float16 tensors can be read and written.
struct float16 {
    std::uint16_t bits = 0;

    float16() = default;
    explicit float16(float f) : bits(from_float(f)) {}
    explicit operator float() const { return to_float(bits); }
    friend bool operator==(float16 a, float16 b) { return a.bits == b.bits; }

    static std::uint16_t from_float(float f) {
        const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
        const std::uint32_t sign = (x >> 16) & 0x8000u;
        const std::uint32_t absx = x & 0x7fffffffu;
        if (absx >= 0x7f800000u)  // inf or nan (keep nan quiet)
            return static_cast<std::uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
        if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow
        if (absx < 0x38800000u) {  // subnormal or zero in half precision
            const float tiny = std::bit_cast<float>(absx) + 0.5f;  // lets the FPU round to 2^-24 units
            return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(tiny) - 0x3f000000u));
        }
        const std::uint32_t mant_odd = (absx >> 13) & 1u;
        const std::uint32_t rounded = absx + 0xc8000fffu + mant_odd;  // rebias exponent, round to even
        return static_cast<std::uint16_t>(sign | (rounded >> 13));
    }

    static float to_float(std::uint16_t h) {
        const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
        const std::uint32_t exp = (h >> 10) & 0x1fu;
        const std::uint32_t mant = h & 0x3ffu;
        if (exp == 0) {
            const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
            return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | sign);
        }
        if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
        return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
    }
};

enum class DType : std::uint8_t { float32 = 0, float64 = 1, float16 = 2, int32 = 3, int64 = 4, uint8 = 5, boolean = 6 };

inline constexpr int dtype_count = 7;

constexpr std::size_t itemsize(DType d) {
    switch (d) {
        case DType::float32: return 4;
        case DType::float64: return 8;
        case DType::float16: return 2;
        case DType::int32: return 4;
        case DType::int64: return 8;
        case DType::uint8: return 1;
        case DType::boolean: return 1;
    }
    return 0;
}

constexpr std::string_view dtype_name(DType d) {
    switch (d) {
        case DType::float32: return "float32";
        case DType::float64: return "float64";
        case DType::float16: return "float16";
        case DType::int32: return "int32";
        case DType::int64: return "int64";
        case DType::uint8: return "uint8";
        case DType::boolean: return "bool";
    }
    return "unknown";
}

/// The dtype for a code read from a file, or nothing when the code is unknown.
constexpr std::optional<DType> dtype_from_code(std::uint64_t code) {
    if (code < static_cast<std::uint64_t>(dtype_count)) return static_cast<DType>(code);
    return std::nullopt;
}

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::float64; };
template <> struct dtype_of<float16> { static constexpr DType value = DType::float16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::int32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::int64; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::uint8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };

/// A C++ element type that has a checkpoint dtype.
template <class T>
concept Element = requires { dtype_of<std::remove_cv_t<T>>::value; };

template <Element T> inline constexpr DType dtype_v = dtype_of<std::remove_cv_t<T>>::value;

static_assert(sizeof(bool) == 1, "bool tensors are stored one byte per element");

}  // namespace ckpt
