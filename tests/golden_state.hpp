#pragma once
// The entries of every golden checkpoint file (tests/golden/v1-*.ckpt): written once by
// tools/make_golden.cpp, recomputed by tests/test_golden.cpp. A fixed function of nothing (no
// clock, no randomness). Never change it for an existing format version: the checked-in files
// hold these values.

#include <ckpt/ckpt.hpp>

#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace test {

inline ckpt::ParamDict golden_state() {
    using ckpt::Shape;
    using ckpt::Tensor;
    ckpt::ParamDict d;
    d.set("f32.rank2", Tensor::from(std::vector<float>{-1.5f, -0.25f, 0.0f, 0.5f, 3.140625f, 1.0e-3f}, Shape{2, 3}));
    d.set("int64", std::int64_t{-9007199254740993});  // -(2^53 + 1): not a double
    d.set("f64.rank1", Tensor::from(std::vector<double>{1.0 / 3.0, -0.0, 1.0e300, -std::numeric_limits<double>::infinity(),
                                                        std::bit_cast<double>(std::uint64_t{0x7ff8000000000001})},
                                    Shape{5}));
    d.set("double", 0.1);
    std::vector<ckpt::float16> halves(4);
    const std::uint16_t half_bits[4] = {0x3c00, 0xc000, 0x7bff, 0x0001};  // 1, -2, 65504, 2^-24
    for (int i = 0; i < 4; ++i) halves[static_cast<std::size_t>(i)].bits = half_bits[i];
    d.set("f16.rank3", Tensor::from(halves, Shape{2, 1, 2}));
    d.set("bool.true", true);
    d.set("i32.rank1", Tensor::from(std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min(), -1, 0, 1,
                                                              std::numeric_limits<std::int32_t>::max()},
                                    Shape{5}));
    d.set("string", std::string("hello"));
    d.set("i64.rank2", Tensor::from(std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), -2, 3,
                                                              std::numeric_limits<std::int64_t>::max()},
                                    Shape{2, 2}));
    d.set("string.empty", std::string());
    // 96 bytes, so that its base64 in text and xml bodies takes two lines
    std::vector<std::uint8_t> octets{0, 1, 2, 127, 128, 200, 254, 255};
    for (unsigned i = 8; i < 96; ++i) octets.push_back(static_cast<std::uint8_t>(i * 37 + 11));
    d.set("u8.rank3", Tensor::from(octets, Shape{2, 3, 16}));
    d.set("string.utf8", std::string("Gr\u00fc\u00dfe \u65e5\u672c \u2713 <a & b> \"q\" 'x'\ttab"));
    Tensor mask(ckpt::DType::boolean, Shape{5});  // zero-filled: false
    for (std::size_t i : {0u, 3u, 4u}) mask.values<bool>()[i] = true;
    d.set("bool.rank1", mask);
    d.set("bool.false", false);
    d.set("f32.rank0", Tensor::from(std::vector<float>{42.5f}, Shape{}));
    d.set("f32.empty", Tensor(ckpt::DType::float32, Shape{0, 3}));
    return d;
}

}  // namespace test
