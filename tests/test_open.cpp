// ckpt::open(): one entry, or rows of a tensor, read and verified alone (format version 3,
// docs/FORMAT.md section 13), and older files verified whole.
#include <ckpt/ckpt.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <tuple>
#include <numeric>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

constexpr std::uint64_t chunk = ckpt::min_chunk_bytes;  // 4 KiB: several chunks from small tensors

/// A float32 [64, 256] tensor (64 KiB, 16 chunks of 4 rows), a small one, a column-major one
/// and scalars.
ckpt::ParamDict state() {
    ckpt::ParamDict d;
    std::vector<float> w(64 * 256);
    std::iota(w.begin(), w.end(), 0.0f);
    d.set("w", ckpt::Tensor::from(w, {64, 256}));
    d.set("b", ckpt::Tensor::from(std::vector<double>{0.5, -1.5, 2.5}));
    d.set("m", ckpt::Tensor::from(std::vector<std::int32_t>{1, 4, 2, 5, 3, 6}, {2, 3}, ckpt::Order::column_major));
    d.set("step", std::int64_t{1200});
    d.set("name", std::string("lenet"));
    return d;
}

ckpt::ParamDict rows_of_w(std::int64_t begin, std::int64_t end) {
    std::vector<float> w(static_cast<std::size_t>((end - begin) * 256));
    std::iota(w.begin(), w.end(), static_cast<float>(begin * 256));
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(w, {end - begin, 256}));
    return d;
}

/// The file offset of tensor `name`'s payload, found as FORMAT.md section 13 says.
std::uint64_t payload_offset(const test::fs::path& file, const std::string& name) {
    const auto c = ckpt::read_contents(file);
    return ckpt::detail::payload_offsets(c.entries, c.header.chunked()).at(name);
}

}  // namespace

TEST_SUITE("open") {

TEST_CASE("ckpt::open reads an entry or rows of a version 3 file, reading and checking only their chunks") {
    test::TempDir dir;
    const auto file = dir / "s.ckpt";
    const ckpt::ParamDict want = state();
    ckpt::save_checkpoint(want, file, {.chunk_bytes = chunk});
    CHECK(ckpt::read_header(file).version == 3);

    const ckpt::CheckpointReader r = ckpt::open(file);
    CHECK(r.verifies_pieces());
    std::vector<std::string> names;
    for (const auto& e : r.entries()) names.push_back(e.name);
    CHECK(names == std::vector<std::string>{"w", "b", "m", "step", "name"});  // the order record folded in
    CHECK(r.entry("w").chunk_hashes.size() == 16);
    CHECK(r.bytes_read() == 0);  // opening reads the table of contents only

    // rows 10 and 11 lie in chunk 2 (rows 8 to 11): one chunk is read
    ckpt::ParamDict got;
    got.set("w", r.read_rows("w", 10, 12));
    CHECK(got == rows_of_w(10, 12));
    CHECK(r.bytes_read() == chunk);
    // rows 3 to 9 span chunks 0 to 2
    got.set("w", r.read_rows("w", 3, 10));
    CHECK(got == rows_of_w(3, 10));
    CHECK(r.bytes_read() == 4 * chunk);
    got.set("w", r.read_rows("w", 7, 7));
    CHECK(got.tensor("w").shape() == ckpt::Shape{0, 256});

    CHECK(r.read("w") == want.at("w"));
    CHECK(r.bytes_read() == 4 * chunk + 64 * 256 * 4);
    CHECK(r.read("b") == want.at("b"));
    CHECK(r.read("m") == want.at("m"));
    CHECK(r.read("m").get_if<ckpt::Tensor>()->order() == ckpt::Order::column_major);
    CHECK(r.read("step") == want.at("step"));
    CHECK(r.read("name") == want.at("name"));

    // misuse: named, and nothing read
    CHECK_THROWS_WITH_AS(r.read("nope"), doctest::Contains("has no entry 'nope'"), ckpt::NotFound);
    CHECK_THROWS_WITH_AS(r.read_rows("w", 60, 65), doctest::Contains("it has 64 rows"), ckpt::LoadMismatch);
    CHECK_THROWS_WITH_AS(r.read_rows("m", 0, 1), doctest::Contains("column-major"), ckpt::LoadMismatch);
    CHECK_THROWS_AS(r.read_rows("step", 0, 1), ckpt::LoadMismatch);
}

TEST_CASE("a damaged chunk fails the reads that touch it, naming the tensor and the chunk, and only those") {
    test::TempDir dir;
    const auto file = dir / "s.ckpt";
    ckpt::save_checkpoint(state(), file, {.chunk_bytes = chunk});
    test::flip_bit(file, payload_offset(file, "w") + 5 * chunk + 100);  // chunk 5: rows 20 to 23

    const auto r = ckpt::open(file);
    ckpt::ParamDict got;
    got.set("w", r.read_rows("w", 0, 20));
    CHECK(got == rows_of_w(0, 20));
    got.set("w", r.read_rows("w", 24, 64));
    CHECK(got == rows_of_w(24, 64));
    CHECK_THROWS_WITH_AS(r.read_rows("w", 19, 21),
                         doctest::Contains("chunk 6 of 16 of tensor 'w' (bytes 20480 to 24576 of its payload) fails its checksum"),
                         ckpt::ChecksumError);
    CHECK_THROWS_AS(r.read("w"), ckpt::ChecksumError);
    CHECK_THROWS_AS(ckpt::verify_checkpoint(file), ckpt::ChecksumError);  // the body checksum covers every chunk
}

TEST_CASE("a damaged table of contents, or its check, is a ChecksumError at open") {
    test::TempDir dir;
    const auto file = dir / "s.ckpt";
    ckpt::save_checkpoint(state(), file, {.chunk_bytes = chunk});
    const auto intact = test::read_bytes(file);
    // FORMAT.md section 13: chunk_bytes at body offset 0, entries at 8, w's name length at 16,
    // its name at 24, then kind, dtype, rank, two dims and nbytes: its first hash at 61
    const std::size_t hash_of_chunk0 = ckpt::header_size + 61;
    // the name's length (unparsable, and the body checksum fails), a hash (the table's check
    // fails), chunk_bytes (no power of two)
    for (const std::size_t at : {std::size_t{ckpt::header_size + 17}, hash_of_chunk0 + 3, std::size_t{ckpt::header_size + 2}}) {
        CAPTURE(at);
        auto b = intact;
        b[at] = static_cast<char>(b[at] ^ 0x40);
        test::write_bytes(file, b);
        CHECK_THROWS_AS(ckpt::open(file), ckpt::ChecksumError);
    }
    // a table whose bytes and checksums agree, but whose check does not: still refused
    auto b = intact;
    const std::size_t name = ckpt::header_size + 24;  // w's name
    b[name] = 'v';
    test::reseal(b);
    test::write_bytes(file, b);
    CHECK_NOTHROW(ckpt::verify_checkpoint(file));
    CHECK_THROWS_WITH_AS(ckpt::open(file), doctest::Contains("corrupt table of contents"), ckpt::ChecksumError);
}

TEST_CASE("files of other versions and kinds are verified whole at open, and read the same") {
    test::TempDir dir;
    const ckpt::ParamDict want = state();
    struct Case {
        const char* name;
        ckpt::SaveOptions options;
        std::uint32_t version;
    };
    const Case cases[] = {{"v1.ckpt", {.chunk_bytes = 0}, 1}, {"text.ckpt", {.archive = ckpt::ArchiveKind::text}, 1}};
    for (const Case& c : cases) {
        CAPTURE(c.name);
        const auto file = dir / c.name;
        ckpt::save_checkpoint(want, file, c.options);
        const auto r = ckpt::open(file);
        CHECK(r.header().version == c.version);
        CHECK_FALSE(r.verifies_pieces());
        CHECK(r.read("w") == want.at("w"));
        CHECK(r.read("m") == want.at("m"));
        ckpt::ParamDict got;
        got.set("w", r.read_rows("w", 10, 12));
        CHECK(got == rows_of_w(10, 12));
        CHECK(r.bytes_read() == 0);
        test::flip_bit(file, test::read_bytes(file).size() - 3);
        CHECK_THROWS_AS(ckpt::open(file), ckpt::ChecksumError);
    }
}

TEST_CASE("chunk_bytes is a power of two from 4 KiB to 1 GiB, or 0 for a version 1 file") {
    test::TempDir dir;
    const auto file = dir / "s.ckpt";
    for (const std::uint64_t bad : {std::uint64_t{1000}, std::uint64_t{4097}, std::uint64_t{2048}, std::uint64_t{1} << 31}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(ckpt::save_checkpoint(state(), file, {.chunk_bytes = bad}),
                             doctest::Contains("is not a power of two from 4096 to 1073741824"), ckpt::ConfigError);
        CHECK_FALSE(test::fs::exists(file));
    }
    ckpt::save_checkpoint(state(), file, {.chunk_bytes = 0});
    CHECK(ckpt::read_header(file).version == 1);
    // codecs and text bodies have no chunks, whatever chunk_bytes says
    ckpt::save_checkpoint(state(), file, {.archive = ckpt::ArchiveKind::xml, .chunk_bytes = chunk});
    CHECK(ckpt::read_header(file).version == 1);
}

TEST_CASE("chunks hashed on several threads give the bytes one thread gives") {
    test::TempDir dir;
    ckpt::ParamDict d;
    std::vector<std::uint8_t> big(20u << 20);  // past the size where helpers start
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>(i * 2654435761u >> 24);
    d.set("big", ckpt::Tensor::view(std::span<std::uint8_t>(big), {static_cast<std::int64_t>(big.size())}));
    d.set("small", ckpt::Tensor::from(std::vector<float>{1, 2, 3}));
    ckpt::save_checkpoint(d, dir / "one.ckpt", {.hash_threads = 1});
    ckpt::save_checkpoint(d, dir / "four.ckpt", {.hash_threads = 4});
    auto one = test::read_bytes(dir / "one.ckpt"), four = test::read_bytes(dir / "four.ckpt");
    std::fill_n(one.begin() + 48, 8, '\0');  // the save time, and the header check over it
    std::fill_n(four.begin() + 48, 8, '\0');
    std::fill_n(one.begin() + 56, 8, '\0');
    std::fill_n(four.begin() + 56, 8, '\0');
    CHECK(one == four);
    const auto r = ckpt::open(dir / "four.ckpt");
    ckpt::ParamDict got;
    got.set("big", r.read_rows("big", 5u << 20, (5u << 20) + 10));
    CHECK(std::memcmp(got.tensor("big").data(), big.data() + (5u << 20), 10) == 0);
}

TEST_CASE("a version 3 header with another archive kind or a codec is malformed") {
    test::TempDir dir;
    const auto file = dir / "s.ckpt";
    ckpt::save_checkpoint(state(), file, {.chunk_bytes = chunk});
    for (const auto& [at, value, says] : {std::tuple{12, 1, "format version 3 holds binary bodies, not text ones"},
                                          std::tuple{13, 1, "malformed codec list"}}) {
        auto b = test::read_bytes(file);
        b[static_cast<std::size_t>(at)] = static_cast<char>(value);
        test::reseal(b);
        test::write_bytes(file, b);
        CHECK_THROWS_WITH_AS(ckpt::open(file), doctest::Contains(says), ckpt::FormatError);
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(file), doctest::Contains(says), ckpt::FormatError);
        ckpt::save_checkpoint(state(), file, {.chunk_bytes = chunk});
    }
}

}  // TEST_SUITE
