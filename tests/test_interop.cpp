// safetensors and npz exchange (ckpt/interop.hpp): round trips, files to and from NumPy, and
// damaged inputs.
#include <ckpt/interop.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <tuple>

#include "alloc_tracker.hpp"
#include "interop_pattern.hpp"
#include "python_scripts.hpp"
#include "support.hpp"

namespace {

/// Same entries (by name, in any order), same kinds, same bytes.
void require_same_entries(const ckpt::ParamDict& got, const ckpt::ParamDict& want) {
    CHECK(got.size() == want.size());
    for (const auto& entry : want) {
        const std::string& name = entry.name;  // not a structured binding: CAPTURE's lambda takes it
        const ckpt::Value& value = entry.value;
        CAPTURE(name);
        const ckpt::Value* v = got.find(name);
        REQUIRE(v != nullptr);
        CHECK(v->type_name() == value.type_name());
        CHECK(*v == value);
    }
}

// --- safetensors surgery: header text and buffer, reassembled with a new length prefix.
struct SafetensorsParts {
    std::string header;
    std::string buffer;
};

SafetensorsParts split_safetensors(const test::fs::path& p) {
    const auto raw = test::read_bytes(p);
    std::uint64_t n = 0;
    std::memcpy(&n, raw.data(), 8);
    return {std::string(raw.begin() + 8, raw.begin() + 8 + static_cast<long>(n)),
            std::string(raw.begin() + 8 + static_cast<long>(n), raw.end())};
}

void write_safetensors(const test::fs::path& p, const std::string& header, const std::string& buffer) {
    std::vector<char> out(8);
    const std::uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), buffer.begin(), buffer.end());
    test::write_bytes(p, out);
}

void require_format_error(const std::function<void()>& load, const std::string& path, const std::string& fragment) {
    try {
        load();
        FAIL("no error for a damaged file; expected one mentioning: " << fragment);
    } catch (const ckpt::FormatError& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find(path) != std::string::npos);
        CHECK(what.find(fragment) != std::string::npos);
        CHECK(e.path() == path);
    }
}

}  // namespace

TEST_SUITE("interop") {

TEST_CASE("safetensors round trip: every dtype, ranks 0 to 4, empty tensors, scalars, non-ASCII names") {
    test::TempDir dir;
    const auto want = test::pattern_state(test::PatternFor::safetensors);
    ckpt::save_safetensors(want, dir / "p.safetensors");
    require_same_entries(ckpt::load_safetensors(dir / "p.safetensors"), want);
    // And the library's own sample, with NaN-free doubles at their extremes.
    const auto sample = test::sample_state();
    ckpt::save_safetensors(sample, dir / "s.safetensors");
    require_same_entries(ckpt::load_safetensors(dir / "s.safetensors"), sample);
    // A buffer offset not a multiple of the element size still loads (into a block of its own).
    ckpt::ParamDict odd{{"bytes", ckpt::Tensor::from(std::vector<std::uint8_t>{1, 2, 3})},
                        {"after", ckpt::Tensor::from(std::vector<double>{0.5, -1.25})}};
    ckpt::save_safetensors(odd, dir / "odd.safetensors");
    require_same_entries(ckpt::load_safetensors(dir / "odd.safetensors"), odd);
    // Values before tensors come back where they were: the dict compares equal.
    ckpt::ParamDict mixed{{"lr", 0.5}, {"w", ckpt::Tensor::from(std::vector<float>{1, 2})}, {"note", "x"},
                          {"b", ckpt::Tensor::from(std::vector<std::int32_t>{3})}};
    ckpt::save_safetensors(mixed, dir / "mixed.safetensors");
    CHECK(ckpt::load_safetensors(dir / "mixed.safetensors") == mixed);
    // Nothing at all.
    ckpt::save_safetensors({}, dir / "none.safetensors");
    CHECK(ckpt::load_safetensors(dir / "none.safetensors").empty());
}

TEST_CASE("npz round trip, stored and deflated: every dtype, ranks 0 to 4, empty tensors, scalars") {
    test::TempDir dir;
    const auto want = test::pattern_state(test::PatternFor::npz);
    for (bool compressed : {false, true}) {
        CAPTURE(compressed);
        ckpt::save_npz(want, dir / "p.npz", compressed);
        require_same_entries(ckpt::load_npz(dir / "p.npz"), want);
        ckpt::save_npz(test::sample_state(), dir / "s.npz", compressed);
        require_same_entries(ckpt::load_npz(dir / "s.npz"), test::sample_state());
    }
    // Deflating pays on compressible data.
    ckpt::ParamDict zeros{{"z", ckpt::Tensor(ckpt::DType::float32, {256, 256})}};
    ckpt::save_npz(zeros, dir / "stored.npz", false);
    ckpt::save_npz(zeros, dir / "deflated.npz", true);
    CHECK(test::fs::file_size(dir / "deflated.npz") * 50 < test::fs::file_size(dir / "stored.npz"));
    // A view with no memory behind it holds no bytes, and stays a tensor.
    ckpt::ParamDict hollow{{"v", ckpt::Tensor::view(ckpt::DType::int64, {0}, nullptr)}};
    ckpt::save_npz(hollow, dir / "hollow.npz");
    require_same_entries(ckpt::load_npz(dir / "hollow.npz"), hollow);
    ckpt::save_npz({}, dir / "none.npz");
    CHECK(ckpt::load_npz(dir / "none.npz").empty());
}

TEST_CASE("empty tensors whose zero is not the first dimension load from safetensors and npz") {
    test::TempDir dir;
    // alone in the file: no data bytes at all to weigh the shape against
    for (const ckpt::Shape& shape : {ckpt::Shape{2, 0}, ckpt::Shape{3, 1, 0}, ckpt::Shape{0, 5}}) {
        CAPTURE(ckpt::shape_string(shape));
        const ckpt::ParamDict d{{"e", ckpt::Tensor(ckpt::DType::float32, shape)}};
        ckpt::save_safetensors(d, dir / "e.safetensors");
        CHECK(ckpt::load_safetensors(dir / "e.safetensors") == d);
        ckpt::save_npz(d, dir / "e.npz");
        CHECK(ckpt::load_npz(dir / "e.npz") == d);
    }
}

TEST_CASE("NumPy reads ckpt's npz and safetensors files with identical values") {
    test::TempDir dir;
    const auto npz = test::pattern_state(test::PatternFor::npz);
    ckpt::save_npz(npz, dir / "pattern.npz", false);
    ckpt::save_npz(npz, dir / "pattern_compressed.npz", true);
    ckpt::save_safetensors(test::pattern_state(test::PatternFor::safetensors), dir / "pattern.safetensors");
    const ckpt::ParamDict column_major{
        {"matrix", test::pattern_tensor(ckpt::DType::float32, {3, 4}).in_order(ckpt::Order::column_major)},
        {"cube", test::pattern_tensor(ckpt::DType::int64, {2, 3, 4}).in_order(ckpt::Order::column_major)}};
    ckpt::save_npz(column_major, dir / "column_major.npz");
    ckpt::save_safetensors(column_major, dir / "column_major.safetensors");
    test::run_python("check_ckpt_exports.py", dir.path());
}

TEST_CASE("column-major tensors go to npz as they lie, Fortran-ordered, and to safetensors transposed") {
    test::TempDir dir;
    const auto matrix = test::pattern_tensor(ckpt::DType::float64, {3, 3}).in_order(ckpt::Order::column_major);
    const ckpt::ParamDict d{{"square", matrix}, {"v", test::pattern_tensor(ckpt::DType::int32, {4})}};
    ckpt::save_npz(d, dir / "m.npz");
    const auto raw = test::read_bytes(dir / "m.npz");
    const std::string text(raw.begin(), raw.end());
    CHECK(text.find("{'descr': '<f8', 'fortran_order': True, 'shape': (3, 3), }") != std::string::npos);
    CHECK(text.find(std::string(reinterpret_cast<const char*>(matrix.data()), matrix.nbytes())) != std::string::npos);
    const auto npz = ckpt::load_npz(dir / "m.npz");
    CHECK(npz == d);  // column-major again, bit for bit
    CHECK(npz.tensor("square").order() == ckpt::Order::column_major);
    ckpt::save_safetensors(d, dir / "m.safetensors");
    const auto st = ckpt::load_safetensors(dir / "m.safetensors");
    CHECK(st.tensor("square") == test::pattern_tensor(ckpt::DType::float64, {3, 3}));  // row-major, the same matrix
    CHECK(st.tensor("v") == d.tensor("v"));
}

TEST_CASE("files written by np.savez, np.savez_compressed and a Python safetensors writer import identically") {
    test::TempDir dir;
    test::run_python("write_numpy_files.py", dir.path());
    auto want = test::pattern_state(test::PatternFor::npz);
    for (const char* file : {"numpy.npz", "numpy_compressed.npz"}) {
        CAPTURE(file);
        const auto got = ckpt::load_npz(dir / file);
        for (const auto& entry : want) {
            CAPTURE(entry.name);
            REQUIRE(got.contains(entry.name));
            if (entry.value.is_tensor()) CHECK(got.at(entry.name) == entry.value);
        }
        // NumPy's scalars are 0-d arrays; without ckpt's mark they stay 0-d tensors, strings strings.
        CHECK(got.tensor("epoch_num") == ckpt::Tensor::from(std::vector<std::int64_t>{6}, ckpt::Shape{}));
        CHECK(got.tensor("lr") == ckpt::Tensor::from(std::vector<double>{0.01}, ckpt::Shape{}));
        CHECK(got.get<std::string>("note") == want.get<std::string>("note"));
        CHECK(got.get<std::string>("empty_string").empty());
        // Fortran order comes back column-major, its bytes as they were; big-endian in the host's order.
        CHECK(got.at("fortran") == ckpt::Value(test::pattern_tensor(ckpt::DType::float32, {3, 4})
                                                   .in_order(ckpt::Order::column_major)));
        CHECK(got.at("bigendian") == ckpt::Value(test::pattern_tensor(ckpt::DType::int32, {2, 3})));
    }
    const auto got = ckpt::load_safetensors(dir / "python.safetensors");
    want = test::pattern_state(test::PatternFor::safetensors);
    for (const auto& entry : want)
        if (entry.value.is_tensor()) {
            CAPTURE(entry.name);
            REQUIRE(got.contains(entry.name));
            CHECK(got.at(entry.name) == entry.value);
        }
    CHECK(got.get<std::string>("format") == "pt");
    CHECK(got.get<std::string>("note") == want.get<std::string>("note"));
}

TEST_CASE("damaged safetensors files are FormatErrors naming the file and the field") {
    test::TempDir dir;
    test::LogCapture quiet;
    ckpt::ParamDict d{{"a", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4}, {2, 2})},
                      {"b", ckpt::Tensor::from(std::vector<std::int32_t>{5, 6})}};
    const auto good = dir / "good.safetensors";
    ckpt::save_safetensors(d, good);
    const auto parts = split_safetensors(good);
    const auto bad = dir / "bad.safetensors";
    const std::string path = bad.string();
    auto load = [&] { ckpt::load_safetensors(bad); };
    auto with_header = [&](const std::string& h, const std::string& buffer) { write_safetensors(bad, h, buffer); };

    SUBCASE("shorter than the length prefix") {
        test::write_bytes(bad, {'\x10', '\0', '\0'});
        require_format_error(load, path, "too short for the 8-byte header length");
    }
    SUBCASE("truncated in the buffer") {
        auto raw = test::read_bytes(good);
        raw.resize(raw.size() - 3);
        test::write_bytes(bad, raw);
        require_format_error(load, path, "tensor 'b' has data_offsets [16, 24] outside the 21-byte buffer");
    }
    SUBCASE("header length past the end") {
        auto raw = test::read_bytes(good);
        const std::uint64_t n = raw.size();
        std::memcpy(raw.data(), &n, 8);
        test::write_bytes(bad, raw);
        require_format_error(load, path, "runs past the end");
    }
    SUBCASE("header that is not JSON") {
        with_header("{\"a\": [", parts.buffer);
        require_format_error(load, path, "not valid JSON");
    }
    SUBCASE("a header with bytes no terminal should get: the message quotes them escaped") {
        auto message = [&] {
            try {
                load();
            } catch (const ckpt::FormatError& e) {
                return std::string(e.what());
            }
            FAIL("loaded");
            return std::string();
        };
        // JSON's \u escapes put an escape sequence in a tensor name
        with_header("{\"\\u001b]0;owned\\u0007\":{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                    parts.buffer);
        auto msg = message();
        CHECK(msg.find_first_of("\x1b\x07") == std::string::npos);
        CHECK(msg.find("tensor '\\x1b]0;owned\\x07' has dtype Q9,") != std::string::npos);
        // a byte that is not UTF-8, quoted by the JSON parser's message
        with_header("{\"a\xff\":1}", parts.buffer);
        msg = message();
        CHECK(msg.find("not valid JSON") != std::string::npos);
        CHECK(msg.find('\xff') == std::string::npos);
    }
    SUBCASE("offsets out of range") {
        with_header(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"I32","shape":[2],"data_offsets":[16,40]}})",
                    parts.buffer);
        require_format_error(load, path, "tensor 'b' has data_offsets [16, 40] outside the 24-byte buffer");
    }
    SUBCASE("overlapping offsets") {
        with_header(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"I32","shape":[2],"data_offsets":[12,20]}})",
                    parts.buffer);
        require_format_error(load, path, "overlaps");
    }
    SUBCASE("a hole in the buffer") {
        with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[2],"data_offsets":[16,24]}})",
                    parts.buffer);
        require_format_error(load, path, "bytes [8, 16) of the buffer belong to no tensor");
    }
    SUBCASE("dtype size that does not match the shape") {
        with_header(R"({"a":{"dtype":"F64","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"I32","shape":[2],"data_offsets":[16,24]}})",
                    parts.buffer);
        require_format_error(load, path, "tensor 'a' of float64[2, 2] needs 32 bytes, its data_offsets hold 16");
    }
    SUBCASE("a dtype ckpt does not hold") {
        with_header(R"({"a":{"dtype":"C64","shape":[2],"data_offsets":[0,16]},"b":{"dtype":"I32","shape":[2],"data_offsets":[16,24]}})",
                    parts.buffer);
        require_format_error(load, path, "tensor 'a' has dtype C64");
    }
    SUBCASE("a bool that is neither 0 nor 1") {
        with_header(R"({"a":{"dtype":"BOOL","shape":[24],"data_offsets":[0,24]}})", parts.buffer);
        require_format_error(load, path, "tensor 'a' holds a BOOL byte that is neither 0 nor 1");
    }
    SUBCASE("a name twice") {
        with_header(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"a":{"dtype":"I32","shape":[2],"data_offsets":[16,24]}})",
                    parts.buffer);
        require_format_error(load, path, "tensor 'a' appears twice");
    }
    SUBCASE("a shape that overflows") {
        with_header(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,24]}})",
                    parts.buffer);
        require_format_error(load, path, "impossible shape");
    }
    SUBCASE("metadata that is not strings") {
        with_header(R"({"__metadata__":{"epoch":6},"a":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", parts.buffer);
        require_format_error(load, path, "__metadata__ 'epoch' is not a string");
    }
    SUBCASE("a typed metadata value that does not parse") {
        with_header(R"({"__metadata__":{"epoch":"six","ckpt.kinds":"{\"epoch\":\"int64\"}"},"a":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})",
                    parts.buffer);
        require_format_error(load, path, "__metadata__ 'epoch' = 'six' is not a int64");
    }
}

TEST_CASE("damaged npz files are FormatErrors naming the file and the member") {
    test::TempDir dir;
    ckpt::ParamDict d{{"w", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3})}};
    const auto good = dir / "good.npz";
    ckpt::save_npz(d, good, false);
    const auto raw = test::read_bytes(good);
    const auto bad = dir / "bad.npz";
    const std::string path = bad.string();
    auto load = [&] { ckpt::load_npz(bad); };
    // Where the member's npy data starts: after the local header (30 bytes + name "w.npy").
    const std::size_t npy_at = 30 + 5;
    REQUIRE(std::string(raw.begin() + npy_at + 1, raw.begin() + npy_at + 6) == "NUMPY");

    SUBCASE("not a zip") {
        test::write_bytes(bad, {'h', 'e', 'l', 'l', 'o'});
        require_format_error(load, path, "not a readable zip archive");
    }
    SUBCASE("truncated") {
        auto cut = raw;
        cut.resize(cut.size() / 2);
        test::write_bytes(bad, cut);
        require_format_error(load, path, "not a readable zip archive");
    }
    SUBCASE("a flipped data byte fails the CRC") {
        auto flipped = raw;
        flipped[npy_at + 128 + 5] ^= 0x40;
        test::write_bytes(bad, flipped);
        require_format_error(load, path, "CRC");
    }
    // Edits inside the member that keep the CRC right, to reach the npy parser.
    auto edit_member = [&](const std::function<void(std::string&)>& edit) {
        std::string npy(raw.begin() + npy_at, raw.begin() + npy_at + 128 + 24);
        edit(npy);
        // Rebuild a zip holding the edited bytes as a member, with libzip.
        int err = 0;
        zip_t* za = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
        REQUIRE(za != nullptr);
        zip_source_t* src = zip_source_buffer(za, npy.data(), npy.size(), 0);
        REQUIRE(zip_file_add(za, "w.npy", src, 0) == 0);
        REQUIRE(zip_close(za) == 0);
    };
    SUBCASE("bad npy magic") {
        edit_member([](std::string& s) { s[1] = 'X'; });
        require_format_error(load, path, "member 'w.npy' is not an npy array (bad magic bytes)");
    }
    SUBCASE("npy header length past the member") {
        edit_member([](std::string& s) { s[8] = '\xff'; s[9] = '\x7f'; });
        require_format_error(load, path, "npy header of 32767 bytes");
    }
    SUBCASE("shape that does not match the data") {
        edit_member([](std::string& s) { s.replace(s.find("(2, 3)"), 6, "(2, 4)"); });
        require_format_error(load, path, "holds 24 data bytes, its header describes 32");
    }
    SUBCASE("a dtype ckpt does not hold") {
        edit_member([](std::string& s) { s.replace(s.find("<f4"), 3, "<V4"); });
        require_format_error(load, path, "dtype '<V4' is not one ckpt holds");
    }
    SUBCASE("a header that is not a dict") {
        edit_member([](std::string& s) { s.replace(s.find("{'descr'"), 8, "['descr'"); });
        require_format_error(load, path, "expected '{'");
    }
    SUBCASE("a member that is not .npy") {
        int err = 0;
        zip_t* za = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
        REQUIRE(za != nullptr);
        static const char text[] = "hello";
        REQUIRE(zip_file_add(za, "readme.txt", zip_source_buffer(za, text, 5, 0), 0) == 0);
        REQUIRE(zip_close(za) == 0);
        require_format_error(load, path, "member 'readme.txt' is not a .npy array");
    }
}

TEST_CASE("save_safetensors refuses a name or string that is not UTF-8 as a ConfigError naming it, writing nothing") {
    test::TempDir dir;
    for (const auto& [name, value] : std::vector<std::pair<std::string, ckpt::Value>>{
             {"w\xff", ckpt::Tensor::from(std::vector<float>{1})}, {"s", std::string("a\xfe")}, {"n\xc0", std::int64_t{3}}}) {
        ckpt::ParamDict d;
        d.set(name, value);
        const std::string shown = ckpt::detail::printable(name);  // clang 14 captures no binding
        CAPTURE(shown);
        CHECK_THROWS_WITH_AS(ckpt::save_safetensors(d, dir / "w.safetensors"), doctest::Contains("is not valid UTF-8"),
                             ckpt::ConfigError);
    }
    CHECK(test::names_in(dir.path()).empty());
}

TEST_CASE("safetensors_contents, npz_contents and torch_contents list what the loads return, reading no tensor's bytes") {
    test::TempDir dir;
    auto state = test::pattern_state(test::PatternFor::safetensors);
    state.set("fortran", ckpt::Tensor::from(std::vector<float>{1, 4, 2, 5, 3, 6}, {2, 3}, ckpt::Order::column_major));
    auto npz_state = test::pattern_state(test::PatternFor::npz);
    npz_state.set("fortran", state.tensor("fortran"));
    ckpt::ParamDict mixed{{"lr", 0.5}, {"w", ckpt::Tensor::from(std::vector<float>{1, 2})}, {"note", "x"}};
    ckpt::save_safetensors(state, dir / "p.safetensors");
    ckpt::save_safetensors(mixed, dir / "m.safetensors");  // an order of entries recorded
    ckpt::save_npz(npz_state, dir / "p.npz");
    ckpt::save_npz(npz_state, dir / "d.npz", true);
    const std::string torch_file = (test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile" / "ok.pt").string();
    using Contents = std::function<std::vector<ckpt::detail::EntryMeta>(const std::string&)>;
    using Load = std::function<ckpt::ParamDict(const std::string&)>;
    const Contents st = [](const std::string& p) { return ckpt::safetensors_contents(p); };
    const Contents npz = [](const std::string& p) { return ckpt::npz_contents(p); };
    const Load load_st = [](const std::string& p) { return ckpt::load_safetensors(p); };
    const Load load_npz = [](const std::string& p) { return ckpt::load_npz(p); };
    const std::vector<std::tuple<std::string, Contents, Load>> files = {
        {(dir / "p.safetensors").string(), st, load_st},
        {(dir / "m.safetensors").string(), st, load_st},
        {(dir / "p.npz").string(), npz, load_npz},
        {(dir / "d.npz").string(), npz, load_npz},
        {torch_file, [](const std::string& p) { return ckpt::torch_contents(p); },
         [](const std::string& p) { return ckpt::load_torch(p); }}};
    for (const auto& [path, contents, load] : files) {
        const std::string& file = path;  // clang 14 captures no binding
        CAPTURE(file);
        const auto entries = contents(path);
        const auto dict = load(path);
        REQUIRE(entries.size() == dict.size());
        auto it = dict.begin();
        for (const auto& e : entries) {
            CAPTURE(e.name);
            CHECK(e.name == it->name);
            REQUIRE(e.kind == it->value.kind());
            if (const auto* t = it->value.get_if<ckpt::Tensor>()) {
                CHECK(e.dtype == t->dtype());
                CHECK(e.logical_shape() == t->logical_shape());
                CHECK(e.order == t->order());
                CHECK(e.nbytes == t->nbytes());
            } else {
                CHECK(e.scalar == it->value);
            }
            ++it;
        }
    }
    // No tensor's bytes: a listing of 16 MiB of deflated zeros takes no block of that size, and
    // does not see what only reading them finds.
    const ckpt::ParamDict big{{"zeros", ckpt::Tensor(ckpt::DType::float32, {std::int64_t{1} << 22})}};
    ckpt::save_npz(big, dir / "big.npz", true);
    ckpt::save_safetensors(big, dir / "big.safetensors");
    test::AllocationWatch watch;
    CHECK(ckpt::npz_contents(dir / "big.npz").at(0).nbytes == 16u << 20);
    CHECK(ckpt::safetensors_contents(dir / "big.safetensors").at(0).nbytes == 16u << 20);
    watch.stop();
    CHECK(watch.largest_new() < (1u << 20));
    CHECK(watch.largest_mapping() == 0);
    const auto hostile = test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile";
    CHECK(ckpt::safetensors_contents(hostile / "bool-byte-2.safetensors").size() == 1);
    CHECK(ckpt::npz_contents(hostile / "bool-byte-2.npz").size() == 1);
}

TEST_CASE("files from elsewhere are held to max_decoded_bytes before the memory is taken, and running out of memory names the file") {
    test::TempDir dir;
    const ckpt::ParamDict d{{"w", ckpt::Tensor::from(std::vector<float>(std::size_t{1} << 19, 1.0f))}};  // 2 MiB
    ckpt::save_safetensors(d, dir / "w.safetensors");
    ckpt::save_npz(d, dir / "w.npz");
    ckpt::save_npz(d, dir / "deflated.npz", true);  // 2 MiB from a few KiB
    ckpt::save_checkpoint(d, dir / "w.ckpt");
    const std::string torch_file = (test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile" / "ok.pt").string();
    using Read = std::function<void(const std::string&, std::optional<std::uint64_t>)>;
    const std::vector<std::pair<std::string, Read>> readers = {
        {(dir / "w.safetensors").string(), [](const std::string& p, auto max) { ckpt::load_safetensors(p, {max}); }},
        {(dir / "w.npz").string(), [](const std::string& p, auto max) { ckpt::load_npz(p, {max}); }},
        {(dir / "deflated.npz").string(), [](const std::string& p, auto max) { ckpt::load_npz(p, {max}); }},
        {torch_file, [](const std::string& p, auto max) { ckpt::load_torch(p, {max}); }},
        {(dir / "w.ckpt").string(), [](const std::string& p, auto max) {
             ckpt::LoadOptions o;
             o.max_decoded_bytes = max;
             ckpt::load_checkpoint(p, o);
         }}};
    for (const auto& [path, read] : readers) {
        const std::string& file = path;  // clang 14 captures no binding
        CAPTURE(file);
        CHECK_NOTHROW(read(path, std::nullopt));  // the default: the larger of 256 MiB and 64 times the file
        if (path.ends_with(".ckpt")) continue;    // a body without codecs decodes to itself
        test::AllocationWatch watch;
        try {
            read(path, 64);
            FAIL("read within a budget of 64 bytes");
        } catch (const ckpt::FormatError& e) {
            const std::string what = e.what();
            INFO(what);
            CHECK(what.find("'" + path + "' decodes to more than 64 bytes: ") != std::string::npos);
            CHECK(what.find("InteropLoadOptions::max_decoded_bytes") != std::string::npos);
            CHECK(e.path() == path);
        }
        watch.stop();
        CHECK(watch.largest_new() < 4096);  // refused before the tensors' memory was taken
        CHECK(watch.largest_mapping() == 0);
    }
    // Memory the machine does not grant: OutOfMemory naming the file, never std::bad_alloc.
    for (const auto& [path, read] : readers) {
        if (path == torch_file) continue;  // 16 bytes of tensors
        const std::string& file = path;  // clang 14 captures no binding
        CAPTURE(file);
        test::AllocationWatch refuse(std::size_t{1} << 20);
        try {
            read(path, std::nullopt);
            FAIL("read with no allocation of more than 1 MiB granted");
        } catch (const ckpt::OutOfMemory& e) {
            refuse.stop();
            INFO(e.what());
            CHECK(std::string(e.what()).find("cannot read '" + path + "': it asked for more memory than this process could get") !=
                  std::string::npos);
            CHECK(e.path() == path);
        }
    }
}

TEST_CASE("save_npz refuses names unsafe as zip members, and both writers bool bytes their readers refuse") {
    test::TempDir dir;
    const ckpt::Tensor one = ckpt::Tensor::from(std::vector<float>{1});
    for (const std::string& name : {std::string("../../x"), std::string("/etc/x"), std::string("a\0b", 3), std::string("a/../b"),
                                    std::string("./x"), std::string("\\x"), std::string("..\\x"), std::string("w\xff")}) {
        CAPTURE(ckpt::detail::printable(name));
        CHECK_THROWS_WITH_AS(ckpt::save_npz({{name, one}}, dir / "w.npz"),
                             doctest::Contains("' would be the zip member '"), ckpt::ConfigError);
    }
    CHECK(test::names_in(dir.path()).empty());
    // what NumPy writes too: folders, names beyond ASCII, control characters (printed escaped)
    const ckpt::ParamDict fine{{"model/layer.w", one}, {"gr\u00f6\u00dfe", one}, {"\x1b[2J", one}, {"..x", one}};
    for (const bool compressed : {false, true}) {
        ckpt::save_npz(fine, dir / "w.npz", compressed);
        CHECK(ckpt::load_npz(dir / "w.npz") == fine);
    }
    ckpt::Tensor flags(ckpt::DType::boolean, {3});
    std::memcpy(flags.data(), "\0\1\2", 3);
    CHECK_THROWS_WITH_AS(ckpt::save_npz({{"flags", flags}}, dir / "f.npz"),
                         doctest::Contains("bool tensor 'flags' holds the byte 2 at element 2, neither 0 nor 1"),
                         ckpt::ConfigError);
    CHECK_THROWS_WITH_AS(ckpt::save_safetensors({{"flags", flags}}, dir / "f.safetensors"),
                         doctest::Contains("bool tensor 'flags' holds the byte 2"), ckpt::ConfigError);
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"w.npz"});
}

TEST_CASE("one storage under two dtypes in a PyTorch file is read as torch.load reads it: by its first reference") {
    // torch.load makes a storage at its first persistent id and reuses it for every later id of
    // its key, whatever type and size they give: "l" is float32 over the first two elements.
    const auto file = test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile" / "storage-two-dtypes.pt";
    const auto d = ckpt::load_torch(file);
    CHECK(d.tensor("f") == ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4}));
    CHECK(d.tensor("l") == ckpt::Tensor::from(std::vector<float>{1, 2}));
    CHECK(d.tensor("l").data() == d.tensor("f").data());
    const auto entries = ckpt::torch_contents(file);
    REQUIRE(entries.size() == 2);
    CHECK(entries[1].dtype == ckpt::DType::float32);
    CHECK(entries[1].shape == ckpt::Shape{2});
}

TEST_CASE("interop writes are atomic: an error leaves the existing file and no temporary") {
    test::TempDir dir;
    ckpt::ParamDict first{{"w", ckpt::Tensor::from(std::vector<float>{1, 2})}};
    ckpt::save_safetensors(first, dir / "w.safetensors");
    ckpt::save_npz(first, dir / "w.npz");
    ckpt::ParamDict reserved = first;
    reserved.set("__metadata__", ckpt::Tensor::from(std::vector<float>{3}));
    CHECK_THROWS_WITH_AS(ckpt::save_safetensors(reserved, dir / "w.safetensors"),
                         doctest::Contains("the entry name '__metadata__' is reserved"), ckpt::ConfigError);
    ckpt::ParamDict bad_utf8{{"s", std::string("\xff\xfe")}};
    CHECK_THROWS_WITH_AS(ckpt::save_npz(bad_utf8, dir / "w.npz"), doctest::Contains("string 's' is not valid UTF-8"),
                         ckpt::ConfigError);
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"w.npz", "w.safetensors"});
    require_same_entries(ckpt::load_safetensors(dir / "w.safetensors"), first);
    require_same_entries(ckpt::load_npz(dir / "w.npz"), first);
    CHECK_THROWS_AS(ckpt::save_npz(first, dir / "missing" / "w.npz"), ckpt::IoError);
    CHECK_THROWS_WITH_AS(ckpt::load_npz(dir / "absent.npz"), doctest::Contains("absent.npz"), ckpt::IoError);
}

}  // TEST_SUITE
