// Every input the readers' fuzzer (scripts/fuzz.sh) ever failed on, replayed: each must be
// read or refused with a ckpt::Error, never crash or end the process.

#include <doctest/doctest.h>

#include "../fuzz/reader_input.hpp"
#include "support.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

TEST_SUITE("fuzz regressions") {

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

TEST_CASE("the fuzz harness frames safetensors header text and wraps npy members into files the readers take") {
    test::TempDir tmp;
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(std::vector<float>{1, 2, 3}, {3}));
    d.set("epoch_num", std::int64_t{4});
    ckpt::save_safetensors(d, tmp / "a.safetensors");
    std::ifstream in((tmp / "a.safetensors").string(), std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::uint64_t len = 0;
    std::memcpy(&len, file.data(), 8);
    // mode 5: the header text, a NUL, the buffer; the harness puts the length back in front
    const std::string json = char(fuzz::safetensors_json) + file.substr(8, len) + '\0' + file.substr(8 + len);
    CHECK(fuzz::file_bytes(reinterpret_cast<const std::uint8_t*>(json.data()), json.size()) == file);

    // mode 7: one npy member, zipped by the harness with its CRC and the scalar comment
    std::string npy = "\x93NUMPY\x01";
    npy += '\0';
    std::string dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (), }";
    dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');  // the data 64-byte aligned, as NumPy writes it
    dict += '\n';
    npy += static_cast<char>(dict.size());
    npy += '\0';
    npy += dict;
    const std::int64_t seven = 7;
    npy.append(reinterpret_cast<const char*>(&seven), 8);
    const std::string input = char(fuzz::npy_member) + npy;
    const std::string zip = fuzz::file_bytes(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
    std::ofstream((tmp / "b.npz").string(), std::ios::binary) << zip;
    const ckpt::ParamDict got = ckpt::load_npz(tmp / "b.npz");
    REQUIRE(got.contains("w"));
    CHECK(got.at("w") == ckpt::Value(std::int64_t{7}));
}

TEST_CASE("the fuzz harness puts codec bodies under headers that let the reader decode them") {
    // Otherwise modes 8 to 10 would stop at the checksum or the tag, never reaching zstd and
    // the parser.
    test::TempDir tmp;
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
    d.set("note", std::string("codec"));
    ckpt::save_checkpoint(d, tmp / "plain.ckpt", {.chunk_bytes = 0});  // the body a codec encodes
    const auto plain = test::read_bytes(tmp / "plain.ckpt");
    const std::string body(plain.begin() + ckpt::header_size, plain.end());
    const std::string zstd = fuzz::encode(ckpt::Zstd{3}.codecs(), fuzz::codec_header({ckpt::CodecId::zstd}), body);
    const std::string aes = fuzz::encode(ckpt::AesGcm{fuzz::fuzz_key()}.codecs(),
                                         fuzz::codec_header({ckpt::CodecId::aes_256_gcm}), body);
    CHECK(zstd.size() < body.size());
    CHECK(aes.size() == 64 + body.size() + 16);
    const struct {
        int mode;
        const std::string& rest;
        const char* codecs;
    } cases[] = {{fuzz::zstd_body, zstd, "zstd"},
                 {fuzz::aes_body, aes, "aes-256-gcm"},
                 {fuzz::zstd_in_aes, zstd, "zstd+aes-256-gcm"}};
    ckpt::LoadOptions with_key;
    with_key.key = fuzz::fuzz_key();
    for (const auto& c : cases) {
        CAPTURE(c.codecs);
        const std::string input = char(c.mode) + c.rest;
        REQUIRE(fuzz::mode_of(reinterpret_cast<const std::uint8_t*>(input.data()), input.size()) == c.mode);
        std::ofstream((tmp / "c.ckpt").string(), std::ios::binary)
            << fuzz::file_bytes(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
        const ckpt::FileHeader h = ckpt::read_header(tmp / "c.ckpt");
        CHECK(h.version == 2);
        CHECK(h.codec_names() == c.codecs);
        CHECK(ckpt::load_checkpoint(tmp / "c.ckpt", with_key) == d);
    }
}

}  // TEST_SUITE
