// Every input the reader's fuzzer (scripts/fuzz.sh) ever failed on, replayed: each must be
// read or refused with a ckpt::Error, never crash or end the process.

#include <doctest/doctest.h>

#include "../fuzz/reader_input.hpp"
#include "support.hpp"

#include <fstream>
#include <iterator>
#include <string>

TEST_CASE("the reader survives every input the fuzzer once failed on") {
    const test::fs::path dir = test::fs::path(CKPT_SOURCE_DIR) / "tests" / "fuzz_regressions";
    test::TempDir tmp;
    int replayed = 0;
    for (const auto& entry : test::fs::directory_iterator(dir)) {
        std::ifstream in(entry.path().string(), std::ios::binary);
        const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        CAPTURE(entry.path().filename().string());
        test::LogCapture quiet;
        CHECK_NOTHROW(fuzz::read_input(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(),
                                       (tmp / "input.ckpt").string()));
        ++replayed;
    }
    CHECK(replayed >= 1);
}

TEST_CASE("an xml body whose closing tag is damaged is a FormatError, not the end of the process") {
    test::TempDir tmp;
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(std::vector<float>{1, 2}, {2}));
    ckpt::SaveOptions o;
    o.archive = ckpt::ArchiveKind::xml;
    ckpt::save_checkpoint(d, tmp / "a.ckpt", o);
    std::ifstream in((tmp / "a.ckpt").string(), std::ios::binary);
    std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string body = file.substr(ckpt::header_size);
    const auto tag = body.rfind("</boost_serialization>");
    REQUIRE(tag != std::string::npos);
    body.resize(tag + 5);  // "</boo": the closing tag cut short
    body.insert(body.begin(), char(3));  // mode 3: an xml body under a valid header
    CHECK_NOTHROW(fuzz::read_input(reinterpret_cast<const std::uint8_t*>(body.data()), body.size(), (tmp / "b.ckpt").string()));
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(tmp / "b.ckpt"), doctest::Contains("does not end with </boost_serialization>"),
                         ckpt::FormatError);
}
