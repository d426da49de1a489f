// The shared corpus of hostile files (tests/hostile/cases.json, written by
// tests/hostile/make_hostile.cpp): every case read by its C++ reader with the default options,
// as `ckpt import` and a program reading a file from elsewhere do. Each must give the verdict
// the manifest says (the Python suite checks its own readers against the same manifest).
#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/interop.hpp>
#include <ckpt/codecs/zstd.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "alloc_tracker.hpp"
#include "support.hpp"

namespace hostile {

const test::fs::path& dir() {
    static const test::fs::path d = test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile";
    return d;
}

nlohmann::json manifest() {
    std::ifstream in((dir() / "cases.json").string());
    return nlohmann::json::parse(in);
}

/// The most derived of the error classes the manifest names (those of both languages).
std::string class_of(const ckpt::Error& e) {
    if (dynamic_cast<const ckpt::AuthenticationError*>(&e)) return "AuthenticationError";
    if (dynamic_cast<const ckpt::ChecksumError*>(&e)) return "ChecksumError";
    if (dynamic_cast<const ckpt::VersionError*>(&e)) return "VersionError";
    if (dynamic_cast<const ckpt::FormatError*>(&e)) return "FormatError";
    if (dynamic_cast<const ckpt::KeyError*>(&e)) return "KeyError";
    if (dynamic_cast<const ckpt::IoError*>(&e)) return "IoError";
    if (dynamic_cast<const ckpt::ConfigError*>(&e)) return "ConfigError";
    return "Error";
}

/// Reads `path` whole with the reader of `format`.
void read(const std::string& format, const std::string& path) {
    if (format == "ckpt") ckpt::load_checkpoint(path);
    else if (format == "safetensors") ckpt::load_safetensors(path);
    else if (format == "npz") ckpt::load_npz(path);
    else if (format == "pt") ckpt::load_torch(path);
    else FAIL("unknown format '" << format << "' in cases.json");
}

}  // namespace hostile

TEST_SUITE("hostile") {

TEST_CASE("the hostile corpus: every case gets its verdict from the C++ readers, and the message names the file") {
    const auto cases = hostile::manifest();
    REQUIRE(cases.is_array());
    REQUIRE(cases.size() >= 10);
    std::uintmax_t corpus_bytes = 0;
    for (const auto& c : cases) {
        const std::string file = c.at("file"), format = c.at("format"), expect = c.at("expect"), contains = c.at("contains");
        CAPTURE(file);
        REQUIRE(c.at("why").get<std::string>().size() > 0);
        const std::string path = (hostile::dir() / file).string();
        REQUIRE(test::fs::exists(path));
        corpus_bytes += test::fs::file_size(path);
        // No reader may ask for more than the default budget's floor in one piece for these small
        // files: a request above it fails, and then the verdict does too.
        test::AllocationWatch watch(std::size_t{256} << 20);
        std::string got = "ok", message;
        try {
            hostile::read(format, path);
        } catch (const ckpt::Error& e) {
            got = hostile::class_of(e);
            message = e.what();
        } catch (const std::exception& e) {
            got = std::string("a foreign exception: ") + e.what();
        }
        watch.stop();
        INFO(message);
        CHECK(got == expect);
        if (expect != "ok") {
            CHECK(message.find(contains) != std::string::npos);
            CHECK(message.find("'" + path + "'") != std::string::npos);
        }
    }
    CHECK(corpus_bytes < (1u << 20));
}

}  // TEST_SUITE
