#pragma once
// The entries of the golden checkpoint files (tests/golden/*.ckpt): written once by
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

/// The entries of tests/golden/v1-column-major.ckpt: column-major tensors (stored as their
/// transposes, each with its storage order record), a row-major one of the same matrix beside
/// them. Each tensor's values are listed in memory order.
inline ckpt::ParamDict golden_column_major_state() {
    using ckpt::Order;
    using ckpt::Shape;
    using ckpt::Tensor;
    ckpt::ParamDict d;
    // m(i, j) = 10 i + j + 0.5: column by column, then the same matrix row by row
    d.set("f64.column_major", Tensor::from(std::vector<double>{0.5, 10.5, 1.5, 11.5, 2.5, 12.5}, Shape{2, 3},
                                           Order::column_major));
    d.set("f64.row_major", Tensor::from(std::vector<double>{0.5, 1.5, 2.5, 10.5, 11.5, 12.5}, Shape{2, 3}));
    d.set("step", std::int64_t{3600});
    // c(i, j, k) = 100 i + 10 j + k, the first index fastest
    std::vector<float> cube;
    for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 3; ++j)
            for (int i = 0; i < 2; ++i) cube.push_back(static_cast<float>(100 * i + 10 * j + k));
    d.set("f32.rank3", Tensor::from(cube, Shape{2, 3, 4}, Order::column_major));
    // s(i, j) = 3 i + j - 4: a square matrix, which read as row-major would be its transpose
    d.set("i32.square", Tensor::from(std::vector<std::int32_t>{-4, -1, 2, -3, 0, 3, -2, 1, 4}, Shape{3, 3},
                                     Order::column_major));
    d.set("f32.empty", Tensor(ckpt::DType::float32, Shape{0, 3}, Order::column_major));
    return d;
}

}  // namespace test
