// Writes the golden checkpoint files of tests/golden/: one per archive kind, all holding the
// same entries (golden_state() below), for tests/test_golden.cpp and docs/FORMAT.md.
//
// Golden files are never regenerated for an existing format version. The files of format
// version 1 (tests/golden/v1-*.ckpt) were written once, by this program, and are checked in:
// every later version of ckpt must still read them, byte for byte as they are. When a new
// format version is introduced, add its files next to the old ones (v2-*.ckpt, written by
// the code of that version: change the names in main() below) and keep the old ones. This program refuses to replace an
// existing file.
//
// Build and run from the source tree (no CMake target):
//
//   g++ -std=c++20 -O1 -Iinclude tools/make_golden.cpp -o /tmp/make_golden -lboost_serialization -lboost_filesystem -lxxhash
//   /tmp/make_golden tests/golden
//
// The values are a fixed function of nothing (no clock, no randomness), so the test
// recomputes them; tests/test_golden.cpp holds its own copy of golden_state(), which must
// stay identical to this one. The save time in each header is the only field that depends
// on when the files were written.

#include <ckpt/checkpoint.hpp>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace {

ckpt::ParamDict golden_state() {
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

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s OUTPUT_DIR   (e.g. tests/golden)\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const ckpt::ParamDict state = golden_state();
    struct File {
        const char* name;
        ckpt::ArchiveKind archive;
        std::int64_t epoch, step;
    };
    const File files[] = {{"v1-binary.ckpt", ckpt::ArchiveKind::binary, 3, 1200},
                          {"v1-text.ckpt", ckpt::ArchiveKind::text, 4, 1600},
                          {"v1-xml.ckpt", ckpt::ArchiveKind::xml, 5, 2000}};
    try {
        for (const File& f : files) {
            const std::string path = dir + "/" + f.name;
            ckpt::save_checkpoint(state, path, {.archive = f.archive, .epoch = f.epoch, .step = f.step, .overwrite = false});
            if (!(ckpt::load_checkpoint(path) == state)) {
                std::fprintf(stderr, "%s does not read back as written\n", path.c_str());
                return 1;
            }
            std::printf("wrote %s\n", path.c_str());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "make_golden: %s\n", e.what());
        return 1;
    }
    return 0;
}
