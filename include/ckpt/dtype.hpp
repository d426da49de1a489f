#pragma once
// Element types a checkpoint tensor can hold, and the C++ types that map onto them.

#include <algorithm>
#include <bit>
#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace ckpt {

/// What the floating-point types C++ lacks share: the bit pattern (`Bits`), and conversions
/// to and from float through Self's to_float and from_float.
template <class Self, class Bits>
struct BitPatternFloat {
    Bits bits = 0;

    BitPatternFloat() = default;
    explicit BitPatternFloat(float f) : bits(Self::from_float(f)) {}
    explicit operator float() const { return Self::to_float(bits); }
    friend bool operator==(Self a, Self b) { return a.bits == b.bits; }
};

/// IEEE 754 binary16, stored as its bit pattern. Converts to and from float
/// (round to nearest even) so that float16 tensors can be read and written.
struct float16 : BitPatternFloat<float16, std::uint16_t> {
    using BitPatternFloat::BitPatternFloat;

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

/// bfloat16 (the upper half of an IEEE 754 binary32), stored as its bit pattern. Converts to
/// and from float (round to nearest even, NaN kept quiet), as PyTorch does.
struct bfloat16 : BitPatternFloat<bfloat16, std::uint16_t> {
    using BitPatternFloat::BitPatternFloat;

    static std::uint16_t from_float(float f) {
        const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
        if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
        return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
    }
    static float to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }
};

namespace detail {
/// The code (without sign) of the 8-bit float magnitude nearest `a`, ties to even (whatever the
/// rounding mode), for a format of `mant_bits` mantissa bits, exponent bias `bias` and smallest
/// normal exponent `min_exp`. `a` must be below the format's overflow threshold.
inline unsigned float8_magnitude(float a, int bias, int mant_bits, int min_exp) {
    if (a == 0.0f) return 0;
    int e = 0;
    std::frexp(a, &e);                   // a = m * 2^e, m in [0.5, 1)
    int exp = std::max(e - 1, min_exp);  // a's binade, or the subnormals'
    const float q = a / std::ldexp(1.0f, exp - mant_bits);  // exact: a power-of-two scale
    auto units = static_cast<unsigned>(q);
    const float rest = q - static_cast<float>(units);
    if (rest > 0.5f || (rest == 0.5f && (units & 1u))) ++units;
    const unsigned one = 1u << mant_bits;
    if (exp == min_exp && units < one) return units;  // subnormal (or rounded up into the normals below)
    if (units >= 2 * one) units /= 2, ++exp;          // rounded up into the next binade
    return (static_cast<unsigned>(exp + bias) << mant_bits) | (units - one);
}
}  // namespace detail

/// 8-bit floats of the OCP formats PyTorch and safetensors use, stored as their bit pattern:
/// E4M3FN (4 exponent bits, bias 7, no infinities, one NaN per sign: S.1111.111, largest
/// 448) and E5M2 (5 exponent bits, bias 15, with infinities: the upper byte of a binary16).
/// From float: round to nearest even; beyond the largest finite value E4M3FN gives NaN and
/// E5M2 infinity, as PyTorch's conversions do.
struct float8_e4m3fn : BitPatternFloat<float8_e4m3fn, std::uint8_t> {
    using BitPatternFloat::BitPatternFloat;

    static float to_float(std::uint8_t b) {
        const float sign = (b & 0x80u) ? -1.0f : 1.0f;
        const unsigned exp = (b >> 3) & 0xfu, mant = b & 0x7u;
        if (exp == 0xf && mant == 0x7) return std::bit_cast<float>(0x7fc00000u | ((b & 0x80u) ? 0x80000000u : 0u));
        if (exp == 0) return sign * static_cast<float>(mant) * 0x1p-9f;  // subnormal: mant * 2^-6 / 8
        return sign * std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, static_cast<int>(exp) - 7);
    }
    static std::uint8_t from_float(float f) {
        const std::uint8_t sign = std::signbit(f) ? 0x80u : 0u;
        if (std::isnan(f)) return static_cast<std::uint8_t>(sign | 0x7fu);
        const float a = std::fabs(f);
        // from 480 on, NaN; up to 464 (halfway, ties to 448's even code) rounding gives 448, and
        // above it the NaN code, as PyTorch's conversion does
        if (a >= 480.0f) return static_cast<std::uint8_t>(sign | 0x7fu);
        return static_cast<std::uint8_t>(sign | detail::float8_magnitude(a, 7, 3, -6));
    }

};

/// 8-bit float E5M2 (PyTorch's float8_e5m2): 5 exponent and 2 mantissa bits, with infinities and
/// NaN, stored as its bit pattern, the upper byte of the float16 of the same value. From float:
/// round to nearest even; from 61440 on (past the largest finite value, 57344), infinity.
struct float8_e5m2 : BitPatternFloat<float8_e5m2, std::uint8_t> {
    using BitPatternFloat::BitPatternFloat;

    static float to_float(std::uint8_t b) { return float16::to_float(static_cast<std::uint16_t>(b << 8)); }
    static std::uint8_t from_float(float f) {
        const std::uint8_t sign = std::signbit(f) ? 0x80u : 0u;
        if (std::isnan(f)) return static_cast<std::uint8_t>(sign | 0x7fu);
        const float a = std::fabs(f);
        // 61440 is halfway between 57344 (the largest) and 65536 (where infinity would be)
        if (a >= 61440.0f) return static_cast<std::uint8_t>(sign | 0x7cu);
        return static_cast<std::uint8_t>(sign | detail::float8_magnitude(a, 15, 2, -14));
    }
};

/// The codes are the file format's (docs/FORMAT.md, section 3): never renumbered; new dtypes
/// take new codes, which an older reader refuses by code.
enum class DType : std::uint8_t {
    float32 = 0,
    float64 = 1,
    float16 = 2,
    int32 = 3,
    int64 = 4,
    uint8 = 5,
    boolean = 6,
    int8 = 7,
    int16 = 8,
    uint16 = 9,
    uint32 = 10,
    uint64 = 11,
    bfloat16 = 12,
    float8_e4m3fn = 13,
    float8_e5m2 = 14,
    complex64 = 15,
    complex128 = 16,
};

inline constexpr int dtype_count = 17;

/// The bytes of one element of dtype `d` (both parts of a complex one).
constexpr std::size_t itemsize(DType d) {
    switch (d) {
        case DType::float32: return 4;
        case DType::float64: return 8;
        case DType::float16: return 2;
        case DType::int32: return 4;
        case DType::int64: return 8;
        case DType::uint8: return 1;
        case DType::boolean: return 1;
        case DType::int8: return 1;
        case DType::int16: return 2;
        case DType::uint16: return 2;
        case DType::uint32: return 4;
        case DType::uint64: return 8;
        case DType::bfloat16: return 2;
        case DType::float8_e4m3fn: return 1;
        case DType::float8_e5m2: return 1;
        case DType::complex64: return 8;
        case DType::complex128: return 16;
    }
    return 0;
}

/// The width of one number in an element: a complex's part, otherwise the element. Byte
/// order is swapped per number.
constexpr std::size_t number_size(DType d) {
    return d == DType::complex64 ? 4 : d == DType::complex128 ? 8 : itemsize(d);
}

/// The dtype's name as files, messages and `ckpt show` spell it: "float32", "bfloat16", "bool", …
constexpr std::string_view dtype_name(DType d) {
    switch (d) {
        case DType::float32: return "float32";
        case DType::float64: return "float64";
        case DType::float16: return "float16";
        case DType::int32: return "int32";
        case DType::int64: return "int64";
        case DType::uint8: return "uint8";
        case DType::boolean: return "bool";
        case DType::int8: return "int8";
        case DType::int16: return "int16";
        case DType::uint16: return "uint16";
        case DType::uint32: return "uint32";
        case DType::uint64: return "uint64";
        case DType::bfloat16: return "bfloat16";
        case DType::float8_e4m3fn: return "float8_e4m3fn";
        case DType::float8_e5m2: return "float8_e5m2";
        case DType::complex64: return "complex64";
        case DType::complex128: return "complex128";
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
template <> struct dtype_of<std::int8_t> { static constexpr DType value = DType::int8; };
template <> struct dtype_of<std::int16_t> { static constexpr DType value = DType::int16; };
template <> struct dtype_of<std::uint16_t> { static constexpr DType value = DType::uint16; };
template <> struct dtype_of<std::uint32_t> { static constexpr DType value = DType::uint32; };
template <> struct dtype_of<std::uint64_t> { static constexpr DType value = DType::uint64; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::bfloat16; };
template <> struct dtype_of<float8_e4m3fn> { static constexpr DType value = DType::float8_e4m3fn; };
template <> struct dtype_of<float8_e5m2> { static constexpr DType value = DType::float8_e5m2; };
template <> struct dtype_of<std::complex<float>> { static constexpr DType value = DType::complex64; };
template <> struct dtype_of<std::complex<double>> { static constexpr DType value = DType::complex128; };

/// A C++ element type that has a checkpoint dtype.
template <class T>
concept Element = requires { dtype_of<std::remove_cv_t<T>>::value; };

/// The dtype of element type T: `dtype_v<float>` is DType::float32, `dtype_v<ckpt::bfloat16>`
/// DType::bfloat16.
template <Element T> inline constexpr DType dtype_v = dtype_of<std::remove_cv_t<T>>::value;

static_assert(sizeof(bool) == 1, "bool tensors are stored one byte per element");
static_assert(sizeof(float16) == 2 && sizeof(bfloat16) == 2 && sizeof(float8_e4m3fn) == 1 && sizeof(float8_e5m2) == 1);
static_assert(std::is_trivially_copyable_v<bfloat16>, "tensors are copied as bytes");
static_assert(sizeof(std::complex<double>) == 16, "complex numbers are stored as (real, imaginary) pairs");

}  // namespace ckpt
