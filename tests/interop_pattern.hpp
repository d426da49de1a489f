#pragma once
// The state tests/python/pattern.py builds with NumPy, built here: every dtype, ranks 0 to 4,
// an empty tensor, non-ASCII names and a scalar of every kind. Element k of a tensor is a
// fixed function of k, so C++ and Python agree bit for bit without sharing a file.

#include <ckpt/ckpt.hpp>

#include <complex>
#include <cstdint>
#include <string>

namespace test {

inline ckpt::Tensor pattern_tensor(ckpt::DType dtype, const ckpt::Shape& shape) {
    ckpt::Tensor t = ckpt::Tensor::uninitialized(dtype, shape);
    for (std::size_t k = 0; k < t.numel(); ++k) {
        const auto i = static_cast<std::int64_t>(k);
        const double f = static_cast<double>(i % 251) * 0.25 - 17.5;
        switch (dtype) {
            case ckpt::DType::float32: t.values<float>()[k] = static_cast<float>(f); break;
            case ckpt::DType::float64: t.values<double>()[k] = f; break;
            case ckpt::DType::float16: t.values<ckpt::float16>()[k] = ckpt::float16(static_cast<float>(f)); break;
            case ckpt::DType::int32: t.values<std::int32_t>()[k] = static_cast<std::int32_t>(i * 7919 - 100000); break;
            case ckpt::DType::int64: t.values<std::int64_t>()[k] = i * 1234567891011 - 5000000000000000; break;
            case ckpt::DType::uint8: t.values<std::uint8_t>()[k] = static_cast<std::uint8_t>((i * 37) % 256); break;
            case ckpt::DType::boolean: t.values<bool>()[k] = i % 3 == 0; break;
            case ckpt::DType::int8: t.values<std::int8_t>()[k] = static_cast<std::int8_t>((i * 37) % 256 - 128); break;
            case ckpt::DType::int16: t.values<std::int16_t>()[k] = static_cast<std::int16_t>((i * 4099) % 65536 - 32768); break;
            case ckpt::DType::uint16: t.values<std::uint16_t>()[k] = static_cast<std::uint16_t>((i * 4099) % 65536); break;
            case ckpt::DType::uint32: t.values<std::uint32_t>()[k] = static_cast<std::uint32_t>(k * 2654435761u); break;
            case ckpt::DType::uint64: t.values<std::uint64_t>()[k] = k * 11400714819323198485ull; break;
            case ckpt::DType::bfloat16: t.values<ckpt::bfloat16>()[k] = ckpt::bfloat16(static_cast<float>(f)); break;  // exact
            case ckpt::DType::float8_e4m3fn: t.values<ckpt::float8_e4m3fn>()[k].bits = static_cast<std::uint8_t>((i * 37 + 11) % 256); break;
            case ckpt::DType::float8_e5m2: t.values<ckpt::float8_e5m2>()[k].bits = static_cast<std::uint8_t>((i * 53 + 7) % 256); break;
            case ckpt::DType::complex64: t.values<std::complex<float>>()[k] = {static_cast<float>(f), static_cast<float>(-f / 2)}; break;
            case ckpt::DType::complex128: t.values<std::complex<double>>()[k] = {f, -f / 2}; break;
        }
    }
    return t;
}

/// The file formats the pattern goes through: a checkpoint holds every dtype, safetensors no
/// complex one, npz (NumPy) no bfloat16 nor float8.
enum class PatternFor { checkpoint, safetensors, npz };

inline bool pattern_holds(PatternFor format, ckpt::DType dtype) {
    using D = ckpt::DType;
    if (format == PatternFor::safetensors) return dtype != D::complex64 && dtype != D::complex128;
    if (format == PatternFor::npz) return dtype != D::bfloat16 && dtype != D::float8_e4m3fn && dtype != D::float8_e5m2;
    return true;
}

inline ckpt::ParamDict pattern_state(PatternFor format = PatternFor::checkpoint) {
    static const ckpt::Shape shapes[] = {{}, {5}, {3, 4}, {2, 3, 4}, {2, 1, 3, 2}};
    ckpt::ParamDict d;
    for (int c = 0; c < ckpt::dtype_count; ++c) {
        const auto dtype = static_cast<ckpt::DType>(c);
        if (!pattern_holds(format, dtype)) continue;
        for (std::size_t rank = 0; rank < 5; ++rank)
            d.set(std::string(ckpt::dtype_name(dtype)) + ".rank" + std::to_string(rank), pattern_tensor(dtype, shapes[rank]));
    }
    d.set("empty", ckpt::Tensor(ckpt::DType::float32, {0, 3}));
    d.set("größe.gewicht", pattern_tensor(ckpt::DType::float32, {2, 2}));
    d.set("层.权重", pattern_tensor(ckpt::DType::int64, {3}));
    d.set("epoch_num", std::int64_t{6});
    d.set("lr", 0.01);
    d.set("nesterov", true);
    d.set("note", std::string("ünïcode \"quoted\"\ttab"));
    d.set("empty_string", std::string());
    return d;
}

}  // namespace test
