#pragma once
// The state tests/python/pattern.py builds with NumPy, built here: every dtype, ranks 0 to 4,
// an empty tensor, non-ASCII names and a scalar of every kind. Element k of a tensor is a
// fixed function of k, so C++ and Python agree bit for bit without sharing a file.

#include <ckpt/ckpt.hpp>

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
        }
    }
    return t;
}

inline ckpt::ParamDict pattern_state() {
    static const ckpt::Shape shapes[] = {{}, {5}, {3, 4}, {2, 3, 4}, {2, 1, 3, 2}};
    ckpt::ParamDict d;
    for (int c = 0; c < ckpt::dtype_count; ++c) {
        const auto dtype = static_cast<ckpt::DType>(c);
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
