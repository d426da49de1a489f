// One checkpoint file: round trips under every archive, loads into existing tensors, and
// every kind of bad input, each with a clear error and nothing overwritten.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <locale>
#include <numeric>

#include <sys/resource.h>

#include <random>
#include <csignal>
#include <unistd.h>

#include <ckpt/codecs/zstd.hpp>

#include "support.hpp"

namespace {

using test::TempDir;
using test::reseal;

ckpt::ParamDict one_tensor() {
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(std::vector<float>(1000, 0.5f), {10, 100}));
    return d;
}

template <class A>
ckpt::SaveOptions with_archive() {
    ckpt::SaveOptions o;
    o.archive = A::kind;
    return o;
}

}  // namespace

/// A locale with a decimal comma and digit grouping, as some national locales have.
struct GroupingPunct : std::numpunct<char> {
    char do_decimal_point() const override { return ','; }
    char do_thousands_sep() const override { return '.'; }
    std::string do_grouping() const override { return "\3"; }
};

TEST_SUITE("checkpoint") {

TEST_CASE_TEMPLATE("every value kind round-trips", A, ckpt::BinaryArchive, ckpt::TextArchive, ckpt::XmlArchive) {
    TempDir dir;
    const auto state = test::sample_state();
    ckpt::save_checkpoint(state, dir / "s.ckpt", with_archive<A>());
    const auto loaded = ckpt::load_checkpoint(dir / "s.ckpt");
    CHECK(loaded == state);
    CHECK(ckpt::read_header(dir / "s.ckpt").archive == A::kind);
    std::vector<std::string> order;
    for (const auto& e : loaded) order.push_back(e.name);
    CHECK(order.front() == "conv1.weight");
    CHECK(order.back() == "empty_string");
}

TEST_CASE_TEMPLATE("a load into existing tensors writes into their memory", A, ckpt::BinaryArchive,
                   ckpt::TextArchive, ckpt::XmlArchive) {
    TempDir dir;
    const auto state = test::sample_state(2.0f);
    ckpt::save_checkpoint(state, dir / "s.ckpt", with_archive<A>());
    std::vector<float> weights(30, 0.0f);
    ckpt::ParamDict target;
    target.set("conv1.weight", ckpt::Tensor::view(std::span<float>(weights), {6, 5}));
    target.set("not_in_file", ckpt::Tensor(ckpt::DType::float32, {2}));
    const auto report = ckpt::load_checkpoint_into(dir / "s.ckpt", target);
    CHECK(weights[3] == 2.0f * 3 - 3.25f);
    CHECK(report.param_not_load == std::vector<std::string>{"not_in_file"});
    CHECK(report.ckpt_not_load.size() == 8);  // the other tensors of the sample
    CHECK(report.rest.get<std::int64_t>("epoch_num") == 6);
    CHECK(report.rest.tensor("i64") == state.tensor("i64"));
}

TEST_CASE("large bodies are read by two threads and still verified to the last byte") {
    TempDir dir;
    ckpt::ParamDict big;
    for (int i = 0; i < 3; ++i) {
        std::vector<float> v(1'500'000 + 3 * i);  // odd sizes: chunks never line up with payloads
        for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(k % 9973) * (i + 1);
        big.set("t" + std::to_string(i), ckpt::Tensor::from(v));
    }
    big.set("tail", 7);
    ckpt::save_checkpoint(big, dir / "big.ckpt");
    const auto size = boost::filesystem::file_size(dir / "big.ckpt");
    REQUIRE(size > ckpt::detail::parallel_read_threshold);

    CHECK(ckpt::load_checkpoint(dir / "big.ckpt") == big);
    ckpt::ParamDict target;
    for (int i = 0; i < 3; ++i) {
        const auto& t = big.tensor("t" + std::to_string(i));
        target.set("t" + std::to_string(i), ckpt::Tensor(t.dtype(), t.shape()));
    }
    CHECK(ckpt::load_checkpoint_into(dir / "big.ckpt", target, false).rest.get<int>("tail") == 7);
    for (int i = 0; i < 3; ++i) CHECK(target.tensor("t" + std::to_string(i)) == big.tensor("t" + std::to_string(i)));
    CHECK(ckpt::verify_checkpoint(dir / "big.ckpt").body_length + ckpt::header_size == size);

    const auto whole = test::read_bytes(dir / "big.ckpt");
    for (std::size_t off : {std::size_t{ckpt::header_size + 100}, std::size_t{size / 2}, std::size_t{size - 1}}) {
        CAPTURE(off);
        test::write_bytes(dir / "bad.ckpt", whole);
        test::flip_bit(dir / "bad.ckpt", off, 6);
        CHECK_THROWS_AS(ckpt::load_checkpoint(dir / "bad.ckpt"), ckpt::ChecksumError);
        CHECK_THROWS_AS(ckpt::load_checkpoint_into(dir / "bad.ckpt", target), ckpt::ChecksumError);
        CHECK_THROWS_AS(ckpt::verify_checkpoint(dir / "bad.ckpt"), ckpt::ChecksumError);
    }
    // A file cut short after its header was checked (truncated while being read) fails in
    // whichever thread meets the end, and the error reaches the caller.
    test::write_bytes(dir / "short.ckpt", whole);
    ckpt::detail::OpenedCheckpoint opened = ckpt::detail::open_checkpoint((dir / "short.ckpt").string(), {});
    REQUIRE(::truncate((dir / "short.ckpt").c_str(), static_cast<off_t>(size / 2)) == 0);
    CHECK_THROWS_WITH_AS(ckpt::detail::read_verified_body(opened, (dir / "short.ckpt").string()),
                         doctest::Contains("ended before its body did"), ckpt::FormatError);
}

TEST_CASE("payloads of a fresh binary load are aligned for any dtype") {
    TempDir dir;
    ckpt::save_checkpoint(test::sample_state(), dir / "s.ckpt");
    for (const auto& e : ckpt::load_checkpoint(dir / "s.ckpt"))
        if (const auto* t = e.value.get_if<ckpt::Tensor>())
            CHECK(reinterpret_cast<std::uintptr_t>(t->data()) % 64 == 0);
}

TEST_CASE("the header records archive, epoch, step and save time") {
    TempDir dir;
    ckpt::SaveOptions o;
    o.epoch = 7;
    o.step = 1875;
    const auto before = ckpt::detail::unix_time_ns();
    ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt", o);
    const auto h = ckpt::verify_checkpoint(dir / "x.ckpt");
    CHECK(h.epoch == 7);
    CHECK(h.step == 1875);
    CHECK(h.save_time_ns >= before);
    CHECK(h.body_length + ckpt::header_size == boost::filesystem::file_size(dir / "x.ckpt"));
}

TEST_CASE("load_param_into_net reports both sides and strict names every problem") {
    ckpt::ParamDict file;
    file.set("a", ckpt::Tensor::from(std::vector<float>{1, 2}));
    file.set("b", ckpt::Tensor::from(std::vector<float>{3, 4, 5}));
    file.set("c", ckpt::Tensor::from(std::vector<double>{6}));
    file.set("extra", ckpt::Tensor::from(std::vector<float>{7}));
    file.set("epoch_num", 3);
    std::vector<float> a(2), b(2), d(1);
    std::vector<float> c(1);
    ckpt::ParamDict net;
    net.set("a", ckpt::Tensor::view(std::span<float>(a), {2}));
    net.set("b", ckpt::Tensor::view(std::span<float>(b), {2}));
    net.set("c", ckpt::Tensor::view(std::span<float>(c), {1}));
    net.set("d", ckpt::Tensor::view(std::span<float>(d), {1}));

    SUBCASE("strict throws before copying anything") {
        try {
            ckpt::load_param_into_net(net, file, true);
            FAIL("strict load did not throw");
        } catch (const ckpt::LoadMismatch& e) {
            const std::string msg = e.what();
            CHECK(msg.find("missing from the checkpoint: 'd'") != std::string::npos);
            CHECK(msg.find("not in the target: 'extra'") != std::string::npos);
            CHECK(msg.find("'b': checkpoint has float32[3], target has float32[2]") != std::string::npos);
            CHECK(msg.find("'c': checkpoint has float64[1], target has float32[1]") != std::string::npos);
        }
        CHECK(a[0] == 0.0f);
    }
    SUBCASE("non-strict loads what fits and lists the rest") {
        auto r = ckpt::load_param_into_net(net, file);
        CHECK(a == std::vector<float>{1, 2});
        CHECK(r.param_not_load == std::vector<std::string>{"b", "c", "d"});
        CHECK(r.ckpt_not_load == std::vector<std::string>{"b", "c", "extra"});
        CHECK(r.mismatches.size() == 2);
        CHECK(r.rest.get<int>("epoch_num") == 3);
    }
}

TEST_CASE("a strict load from a file checks the table of contents before writing") {
    TempDir dir;
    ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt");
    std::vector<float> small(10, -1.0f);
    ckpt::ParamDict target;
    target.set("w", ckpt::Tensor::view(std::span<float>(small), {10}));
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "x.ckpt", target, true),
                         doctest::Contains("'w': checkpoint has float32[10, 100], target has float32[10]"),
                         ckpt::LoadMismatch);
    CHECK(small[0] == -1.0f);
}

TEST_CASE("objects with state_dict() load and save through views") {
    struct Net {
        std::vector<float> w = std::vector<float>(4, 0.0f);
        ckpt::ParamDict state_dict() {
            ckpt::ParamDict d;
            d.set("w", ckpt::Tensor::view(std::span<float>(w), {4}));
            return d;
        }
    };
    static_assert(ckpt::HasStateDict<Net>);
    TempDir dir;
    Net a;
    a.w = {1, 2, 3, 4};
    ckpt::save_checkpoint(a.state_dict(), dir / "n.ckpt");
    Net b;
    auto r = ckpt::load_checkpoint_into(dir / "n.ckpt", b, true);
    CHECK(r.complete());
    CHECK(b.w == a.w);
    Net c;
    ckpt::load_param_into_net(c, ckpt::load_checkpoint(dir / "n.ckpt"), true);
    CHECK(c.w == a.w);
}

namespace {
/// Replaces the temporaries' random suffixes while it lives: `names` in turn, the last one for
/// ever after.
struct ScriptedSuffixes {
    static inline std::vector<std::string> names;
    static inline std::size_t next = 0;
    std::string (*saved)() = ckpt::detail::temporary_suffix_source();
    explicit ScriptedSuffixes(std::vector<std::string> n) {
        names = std::move(n);
        next = 0;
        ckpt::detail::temporary_suffix_source() = [] { return names[std::min(next++, names.size() - 1)]; };
    }
    ~ScriptedSuffixes() { ckpt::detail::temporary_suffix_source() = saved; }
};
}  // namespace

TEST_CASE("a save cannot be blocked by temporaries another user created first, nor follow their symlinks") {
    TempDir dir;
    const auto final_path = dir / "x.ckpt";
    const std::string pid = std::to_string(::getpid());
    // The names of the previous scheme, created first: no longer what a save tries.
    for (int n = 0; n < 3; ++n) test::write_bytes(dir / (".x.ckpt.tmp-" + pid + "-" + std::to_string(n)), {'x'});
    ckpt::save_checkpoint(one_tensor(), final_path);
    CHECK(ckpt::load_checkpoint(final_path) == one_tensor());
    // A taken name is given up for another: here a symlink to a file of the victim's, which
    // must be neither followed nor removed.
    test::write_bytes(dir / "victim", {'v'});
    const auto taken = dir / (".x.ckpt.tmp-" + pid + "-taken");
    test::fs::create_symlink(dir / "victim", taken);
    {
        ScriptedSuffixes names({"taken", "taken", "free"});
        ckpt::save_checkpoint(test::sample_state(), final_path);
        CHECK(ScriptedSuffixes::next == 3);
    }
    CHECK(ckpt::load_checkpoint(final_path) == test::sample_state());
    CHECK(test::read_bytes(dir / "victim") == std::vector<char>{'v'});
    CHECK(test::fs::is_symlink(taken));
    // Every name taken: a bounded number of tries, then an IoError naming the file; the old
    // file and everything else stay as they were.
    {
        ScriptedSuffixes names({"taken"});
        CHECK_THROWS_WITH_AS(ckpt::save_checkpoint(one_tensor(), final_path),
                             doctest::Contains(("16 temporary names in '" + dir.path().string() + "' were all taken").c_str()),
                             ckpt::IoError);
        CHECK(ScriptedSuffixes::next == 16);
    }
    CHECK(ckpt::load_checkpoint(final_path) == test::sample_state());
    CHECK(test::read_bytes(dir / "victim") == std::vector<char>{'v'});
    // A symlink at the final name is replaced by the file, not written through.
    test::fs::remove(final_path);
    test::fs::create_symlink(dir / "victim", final_path);
    ckpt::save_checkpoint(one_tensor(), final_path);
    CHECK_FALSE(test::fs::is_symlink(final_path));
    CHECK(ckpt::load_checkpoint(final_path) == one_tensor());
    CHECK(test::read_bytes(dir / "victim") == std::vector<char>{'v'});
    // The random part of a temporary's name: 16 hex digits, new every time.
    const auto a = ckpt::detail::temporary_name("x.ckpt"), b = ckpt::detail::temporary_name("x.ckpt");
    CHECK(a != b);
    CHECK(a.size() == (".x.ckpt.tmp-" + pid + "-").size() + 16);
    CHECK(ckpt::detail::temporary_owner(a) == ::getpid());
}

TEST_CASE("saving replaces a file atomically, or not at all when asked") {
    TempDir dir;
    ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt");
    ckpt::save_checkpoint(test::sample_state(), dir / "x.ckpt");
    CHECK(ckpt::load_checkpoint(dir / "x.ckpt") == test::sample_state());
    ckpt::SaveOptions o;
    o.overwrite = false;
    CHECK_THROWS_AS(ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt", o), ckpt::IoError);
    CHECK(ckpt::load_checkpoint(dir / "x.ckpt") == test::sample_state());
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"x.ckpt"});
}
}

TEST_SUITE("bad input") {

TEST_CASE("a missing directory is named") {
    TempDir dir;
    CHECK_THROWS_WITH_AS(ckpt::save_checkpoint(one_tensor(), dir / "nope/x.ckpt"),
                         doctest::Contains(("directory '" + (dir / "nope").string() + "' does not exist").c_str()),
                         ckpt::IoError);
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(dir / "nope.ckpt"),
                         doctest::Contains(("cannot open checkpoint '" + (dir / "nope.ckpt").string()).c_str()),
                         ckpt::IoError);
}

TEST_CASE("an unwritable directory is named") {
    // root ignores permission bits, but not sysfs
    const boost::filesystem::path dir = ::geteuid() == 0 ? "/sys" : "/";
    if (!boost::filesystem::is_directory(dir)) return;
    CHECK_THROWS_WITH_AS(ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt"),
                         doctest::Contains(("cannot create a file in '" + dir.string() + "'").c_str()), ckpt::IoError);
}

TEST_CASE("a file that is not a checkpoint") {
    TempDir dir;
    test::write_bytes(dir / "x.ckpt", std::vector<char>(200, 'a'));
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(dir / "x.ckpt"), doctest::Contains("is not a ckpt checkpoint"),
                         ckpt::FormatError);
    test::write_bytes(dir / "empty.ckpt", {});
    CHECK_THROWS_AS(ckpt::load_checkpoint(dir / "empty.ckpt"), ckpt::FormatError);
}

TEST_CASE("truncation at every region boundary") {
    TempDir dir;
    ckpt::save_checkpoint(test::sample_state(), dir / "x.ckpt");
    const auto whole = test::read_bytes(dir / "x.ckpt");
    for (std::size_t len : {std::size_t{4}, std::size_t{8}, std::size_t{63}, std::size_t{64}, std::size_t{72},
                            std::size_t{100}, whole.size() / 2, whole.size() - 1}) {
        CAPTURE(len);
        test::write_bytes(dir / "t.ckpt", std::vector<char>(whole.begin(), whole.begin() + static_cast<long>(len)));
        CHECK_THROWS_AS(ckpt::load_checkpoint(dir / "t.ckpt"), ckpt::FormatError);
        ckpt::ParamDict target = test::sample_state(0.0f);
        CHECK_THROWS_AS(ckpt::load_checkpoint_into(dir / "t.ckpt", target), ckpt::FormatError);
        CHECK_THROWS_AS(ckpt::verify_checkpoint(dir / "t.ckpt"), ckpt::FormatError);
    }
    auto longer = whole;
    longer.push_back('x');
    test::write_bytes(dir / "t.ckpt", longer);
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(dir / "t.ckpt"), doctest::Contains("trailing bytes"), ckpt::FormatError);
}

TEST_CASE("bit flips in the header and the body") {
    TempDir dir;
    ckpt::save_checkpoint(test::sample_state(), dir / "x.ckpt");
    const auto whole = test::read_bytes(dir / "x.ckpt");
    SUBCASE("magic") {
        test::flip_bit(dir / "x.ckpt", 2);
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(dir / "x.ckpt"), doctest::Contains("bad magic"), ckpt::FormatError);
    }
    SUBCASE("header fields") {
        for (std::size_t off : {12, 17, 25, 33, 41, 50, 60}) {
            test::write_bytes(dir / "x.ckpt", whole);
            test::flip_bit(dir / "x.ckpt", off, 3);
            CHECK_THROWS_AS(ckpt::load_checkpoint(dir / "x.ckpt"), ckpt::ChecksumError);
        }
    }
    SUBCASE("body") {
        for (std::size_t off : {std::size_t{64}, std::size_t{70}, whole.size() / 2, whole.size() - 1}) {
            test::write_bytes(dir / "x.ckpt", whole);
            test::flip_bit(dir / "x.ckpt", off, 5);
            CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(dir / "x.ckpt"), doctest::Contains("body xxh3"),
                                 ckpt::ChecksumError);
            ckpt::ParamDict target = test::sample_state(0.0f);
            CHECK_THROWS_AS(ckpt::load_checkpoint_into(dir / "x.ckpt", target), ckpt::ChecksumError);
        }
    }
    CHECK(test::read_bytes(dir / "x.ckpt").size() == whole.size());  // loads never modify the file
}

TEST_CASE("an unknown format version") {
    TempDir dir;
    ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt");
    auto b = test::read_bytes(dir / "x.ckpt");
    b[8] = 4;
    test::write_bytes(dir / "x.ckpt", b);
    reseal(dir / "x.ckpt");
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(dir / "x.ckpt"),
                         doctest::Contains("has format version 4; this reader knows versions 1 to 3"), ckpt::VersionError);
}

TEST_CASE("the wrong archive kind") {
    TempDir dir;
    ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt");
    ckpt::LoadOptions want_xml;
    want_xml.archive = ckpt::ArchiveKind::xml;
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(dir / "x.ckpt", want_xml),
                         doctest::Contains("is a binary archive, expected xml"), ckpt::FormatError);
    auto b = test::read_bytes(dir / "x.ckpt");  // a header that lies about the kind
    for (char kind : {1, 2, 7}) {
        b[12] = kind;
        test::write_bytes(dir / "x.ckpt", b);
        reseal(dir / "x.ckpt");
        CHECK_THROWS_AS(ckpt::load_checkpoint(dir / "x.ckpt"), ckpt::FormatError);
    }
}

TEST_CASE("malformed bodies with valid checksums are rejected, not trusted") {
    TempDir dir;
    ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt", {.chunk_bytes = 0});
    auto whole = test::read_bytes(dir / "x.ckpt");
    // binary body (version 1): entries u64 @64, name length u64 @72, "w" @80, kind u32 @81,
    // dtype u32 @85, rank u32 @89, dims i64 @93 and @101, nbytes u64 @109
    auto patched = [&](std::size_t off, std::uint64_t value, std::size_t width) {
        auto b = whole;
        for (std::size_t i = 0; i < width; ++i) b[off + i] = static_cast<char>((value >> (8 * i)) & 0xff);
        test::write_bytes(dir / "x.ckpt", b);
        reseal(dir / "x.ckpt");
    };
    struct Case {
        std::size_t off;
        std::uint64_t value;
        std::size_t width;
        const char* message;
    };
    auto refused = [&](const Case& c) {  // by every reader, with the message
        CAPTURE(c.off);
        patched(c.off, c.value, c.width);
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(dir / "x.ckpt"), doctest::Contains(c.message), ckpt::FormatError);
        ckpt::ParamDict target = one_tensor();
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "x.ckpt", target), doctest::Contains(c.message),
                             ckpt::FormatError);
        CHECK_THROWS_WITH_AS(ckpt::open(dir / "x.ckpt"), doctest::Contains(c.message), ckpt::FormatError);
    };
    for (const Case& c : {Case{64, 1ull << 60, 8, "entry count"}, Case{72, 1ull << 62, 8, "a string of"},
                          Case{81, 9, 4, "value kind 9, which this version of ckpt does not know"}, Case{81, 256, 4, "unknown value kind 256"}, Case{85, 99, 4, "dtype code 99, which this version of ckpt does not know"},
                          Case{89, 1000, 4, "has rank 1000"}, Case{93, 1ull << 40, 8, "impossible shape"},
                          Case{101, ~0ull, 8, "impossible shape"}, Case{109, 1ull << 50, 8, "should hold 4000 bytes"},
                          Case{101, 50, 8, "should hold 2000 bytes"}})
        refused(c);
    // version 3 (FORMAT.md section 13): chunk_bytes u64 @64, then the fields above 8 bytes on,
    // w's one chunk hash @125, toc_check @133
    ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt", {.chunk_bytes = ckpt::min_chunk_bytes});
    whole = test::read_bytes(dir / "x.ckpt");
    for (const Case& c : {Case{64, 1000, 8, "the chunk size 1000 is not a power of two"},
                          Case{64, 1ull << 31, 8, "the chunk size 2147483648 is not a power of two"},
                          Case{72, 1ull << 60, 8, "entry count"}, Case{117, 1ull << 50, 8, "should hold 4000 bytes"}})
        refused(c);
}

TEST_CASE("invalid base64 in a text or xml body is a format error") {
    TempDir dir;
    for (auto kind : {ckpt::ArchiveKind::text, ckpt::ArchiveKind::xml}) {
        ckpt::SaveOptions o;
        o.archive = kind;
        ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt", o);
        auto b = test::read_bytes(dir / "x.ckpt");
        const std::string text(b.begin(), b.end());
        const auto payload = text.find("AAAA");  // 0.5f is 0000003f: its base64 starts with AAAA
        REQUIRE(payload != std::string::npos);
        b[payload + 1] = '*';
        test::write_bytes(dir / "x.ckpt", b);
        reseal(dir / "x.ckpt");
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(dir / "x.ckpt"), doctest::Contains("could not be parsed"),
                             ckpt::FormatError);
    }
}

TEST_CASE("a failed save leaves the old file and no temporary") {
    TempDir dir;
    ckpt::save_checkpoint(one_tensor(), dir / "x.ckpt");
    const auto before = test::read_bytes(dir / "x.ckpt");
    ckpt::ParamDict big;
    big.set("big", ckpt::Tensor(ckpt::DType::float32, {1 << 20}));
    rlimit old{};
    ::getrlimit(RLIMIT_FSIZE, &old);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit small = old;
    small.rlim_cur = 1 << 20;  // 1 MiB: the 4 MiB tensor cannot fit
    ::setrlimit(RLIMIT_FSIZE, &small);
    CHECK_THROWS_WITH_AS(ckpt::save_checkpoint(big, dir / "x.ckpt"), doctest::Contains("File too large"),
                         ckpt::IoError);
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    CHECK(test::read_bytes(dir / "x.ckpt") == before);
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"x.ckpt"});
}
}

TEST_SUITE("bad input") {

TEST_CASE("what no reader could load back is refused before anything is written") {
    TempDir dir;
    ckpt::ParamDict deep{{"t", ckpt::Tensor(ckpt::DType::uint8, ckpt::Shape(65, 1))}};
    CHECK_THROWS_WITH_AS(ckpt::save_checkpoint(deep, dir / "d.ckpt"), doctest::Contains("tensor 't' has rank 65 (at most 64)"),
                         ckpt::ConfigError);
    ckpt::ParamDict loss{{"best_loss", std::numeric_limits<double>::infinity()}};
    for (auto kind : {ckpt::ArchiveKind::text, ckpt::ArchiveKind::xml})
        CHECK_THROWS_WITH_AS(ckpt::save_checkpoint(loss, dir / "l.ckpt", {.archive = kind}),
                             doctest::Contains("value 'best_loss' is inf"), ckpt::ConfigError);
    CHECK(test::names_in(dir.path()).empty());
    ckpt::save_checkpoint(loss, dir / "l.ckpt");  // the binary archive holds it
    CHECK(std::isinf(ckpt::load_checkpoint(dir / "l.ckpt").get<double>("best_loss")));
}

TEST_CASE("text and xml bodies do not depend on the program's global locale") {
    TempDir dir;
    const std::locale saved = std::locale::global(std::locale(std::locale::classic(), new GroupingPunct));
    const auto state = test::sample_state();
    for (auto kind : {ckpt::ArchiveKind::text, ckpt::ArchiveKind::xml}) {
        const auto file = dir / ("g" + std::string(ckpt::archive_kind_name(kind)) + ".ckpt");
        ckpt::save_checkpoint(state, file, {.archive = kind});
        std::locale::global(saved);
        CHECK(ckpt::load_checkpoint(file) == state);  // written as under the classic locale
        std::locale::global(std::locale(std::locale::classic(), new GroupingPunct));
        CHECK(ckpt::load_checkpoint(file) == state);
    }
    std::locale::global(saved);
}

TEST_CASE("random corruption is always a ckpt::Error, never a crash or a wrong load") {
    // Flips, truncations and resealed edits (which get past the checksum to the parser) at
    // random offsets, for every archive kind, through all three readers.
    TempDir dir;
    std::mt19937 rng(7);
    int rejected = 0, loaded = 0;
    for (auto kind : {ckpt::ArchiveKind::binary, ckpt::ArchiveKind::text, ckpt::ArchiveKind::xml}) {
        ckpt::SaveOptions o;
        o.archive = kind;
        ckpt::save_checkpoint(test::sample_state(), dir / "x.ckpt", o);
        const auto whole = test::read_bytes(dir / "x.ckpt");
        for (int i = 0; i < 150; ++i) {
            auto b = whole;
            const auto off = std::uniform_int_distribution<std::size_t>(0, b.size() - 1)(rng);
            const int mode = i % 3;
            if (mode == 0) b[off] = static_cast<char>(b[off] ^ (1 << (i % 8)));
            if (mode == 1) b.resize(off);
            if (mode == 2) b[std::max<std::size_t>(off, ckpt::header_size)] = static_cast<char>(rng());
            test::write_bytes(dir / "c.ckpt", b);
            if (mode == 2 && b.size() > ckpt::header_size) reseal(dir / "c.ckpt");
            try {
                const auto d = ckpt::load_checkpoint(dir / "c.ckpt");
                ckpt::ParamDict target = test::sample_state(0.0f);
                ckpt::load_checkpoint_into(dir / "c.ckpt", target);
                CHECK(mode == 2);  // only an edit that was resealed can still load
                ++loaded;
            } catch (const ckpt::Error&) {
                ++rejected;
            }
        }
    }
    MESSAGE(rejected << " corrupt files rejected, " << loaded << " resealed edits still parsed");
    CHECK(rejected >= 300);
}
}

TEST_SUITE("storage order") {

namespace {

namespace fs = test::fs;

/// The matrix m(i, j) = 100 i + j of `rows` x `cols`, laid out in `order`.
ckpt::Tensor numbered(std::int64_t rows, std::int64_t cols, ckpt::Order order) {
    std::vector<double> v(static_cast<std::size_t>(rows * cols));
    for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j)
            v[static_cast<std::size_t>(order == ckpt::Order::row_major ? i * cols + j : j * rows + i)] = 100.0 * i + j;
    return ckpt::Tensor::from(v, {rows, cols}, order);
}

std::string body_text(const fs::path& file) {
    const auto b = test::read_bytes(file);
    return {b.begin() + 64, b.end()};
}

}  // namespace

TEST_CASE_TEMPLATE("a column-major tensor is stored as its transpose with a record, and loads in its order", A,
                   ckpt::BinaryArchive, ckpt::TextArchive, ckpt::XmlArchive) {
    TempDir dir;
    ckpt::ParamDict d;
    d.set("m", numbered(2, 3, ckpt::Order::column_major));
    d.set("r", numbered(2, 3, ckpt::Order::row_major));
    d.set("v", ckpt::Tensor(ckpt::DType::float32, {4}, ckpt::Order::column_major));  // rank 1: no order
    d.set("step", std::int64_t{3});
    auto options = with_archive<A>();
    options.chunk_bytes = 0;  // the version 1 body the bytes below spell out
    ckpt::save_checkpoint(d, dir / "o.ckpt", options);
    const auto contents = ckpt::read_contents(dir / "o.ckpt");
    std::vector<std::string> names;
    for (const auto& e : contents.entries) names.push_back(e.name);
    CHECK(names == std::vector<std::string>{"m", "r", "v", "step"});  // the record is folded into "m"
    CHECK(contents.entries[0].order == ckpt::Order::column_major);
    CHECK(contents.entries[0].shape == ckpt::Shape{3, 2});
    CHECK(contents.entries[0].logical_shape() == ckpt::Shape{2, 3});
    CHECK(contents.entries[1].order == ckpt::Order::row_major);
    CHECK(contents.entries[2].order == ckpt::Order::row_major);
    const auto loaded = ckpt::load_checkpoint(dir / "o.ckpt");
    CHECK(loaded == d);
    CHECK(loaded.tensor("m").describe() == "float64[2, 3] column-major");
    // in the body: the transpose's dims, and the record right after the tensor
    const std::string body = body_text(dir / "o.ckpt");
    if constexpr (std::is_same_v<A, ckpt::BinaryArchive>) {
        const std::string m_entry = std::string("\x01\0\0\0\0\0\0\0" "m" "\0\0\0\0" "\x01\0\0\0" "\x02\0\0\0"
                                                "\x03\0\0\0\0\0\0\0" "\x02\0\0\0\0\0\0\0" "\x30\0\0\0\0\0\0\0"
                                                "\x0e\0\0\0\0\0\0\0" "__ckpt.order.m" "\x04\0\0\0"
                                                "\x0c\0\0\0\0\0\0\0" "column_major",
                                                8 + 1 + 4 + 4 + 4 + 16 + 8 + 8 + 14 + 4 + 8 + 12);
        CHECK(body.substr(0, 8) == std::string("\x05\0\0\0\0\0\0\0", 8));  // 4 entries and a record
        CHECK(body.substr(8, m_entry.size()) == m_entry);
        CHECK(body.find("__ckpt.order.r") == std::string::npos);
        CHECK(body.find("__ckpt.order.v") == std::string::npos);
    } else if constexpr (std::is_same_v<A, ckpt::XmlArchive>) {
        CHECK(body.find("<name>m</name>\n<kind>0</kind>\n<dtype>1</dtype>\n<rank>2</rank>\n<dim>3</dim>\n<dim>2</dim>\n"
                        "<nbytes>48</nbytes>\n<name>__ckpt.order.m</name>\n<kind>4</kind>\n"
                        "<value>column_major</value>\n") != std::string::npos);
    }
}

TEST_CASE("loading into a target of the other order moves the elements: a square matrix is never transposed") {
    TempDir dir;
    for (const auto file_order : {ckpt::Order::row_major, ckpt::Order::column_major}) {
        const auto target_order = file_order == ckpt::Order::row_major ? ckpt::Order::column_major : ckpt::Order::row_major;
        CAPTURE(ckpt::order_name(file_order));
        ckpt::ParamDict saved;
        saved.set("square", numbered(3, 3, file_order));
        saved.set("wide", numbered(37, 70, file_order));  // tiles of 32 and their remainders
        std::vector<float> cube(2 * 3 * 4);
        std::iota(cube.begin(), cube.end(), 0.0f);
        saved.set("cube", ckpt::Tensor::from(cube, {2, 3, 4}, file_order));
        const auto want_cube = saved.tensor("cube").in_order(target_order);
        struct Way {
            const char* name;
            ckpt::SaveOptions save;
        };
        for (const Way& way : {Way{"binary", {}}, Way{"text", {.archive = ckpt::ArchiveKind::text}},
                               Way{"zstd", {.codecs = ckpt::Zstd{3}.codecs()}}}) {
            CAPTURE(way.name);
            ckpt::save_checkpoint(saved, dir / "f.ckpt", way.save);
            ckpt::ParamDict target;
            target.set("square", ckpt::Tensor(ckpt::DType::float64, {3, 3}, target_order));
            target.set("wide", ckpt::Tensor(ckpt::DType::float64, {37, 70}, target_order));
            target.set("cube", ckpt::Tensor(ckpt::DType::float32, {2, 3, 4}, target_order));
            const void* memory = target.tensor("square").data();
            const auto report = ckpt::load_checkpoint_into(dir / "f.ckpt", target, /*strict=*/true);
            CHECK(report.mismatches.empty());
            CHECK(target.tensor("square").data() == memory);
            CHECK(target.tensor("square") == numbered(3, 3, target_order));
            CHECK(target.tensor("wide") == numbered(37, 70, target_order));
            CHECK(target.tensor("cube") == want_cube);
        }
        // from a ParamDict too
        ckpt::ParamDict target;
        target.set("square", ckpt::Tensor(ckpt::DType::float64, {3, 3}, target_order));
        ckpt::load_param_into_net(target, saved);
        CHECK(target.tensor("square") == numbered(3, 3, target_order));
    }
}

TEST_CASE("a shape mismatch between orders names the tensor, the file and both layouts") {
    TempDir dir;
    ckpt::save_checkpoint({{"m", numbered(2, 3, ckpt::Order::row_major)}}, dir / "f.ckpt");
    ckpt::ParamDict target;
    // the same bytes as a row-major [2, 3], but the transpose of the matrix saved
    target.set("m", ckpt::Tensor(ckpt::DType::float64, {3, 2}, ckpt::Order::column_major));
    const std::string message = "strict load from '" + (dir / "f.ckpt").string() +
                                "' failed: dtype/shape mismatch 'm': checkpoint has float64[2, 3] row-major, target "
                                "has float64[3, 2] column-major";
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "f.ckpt", target, true), message.c_str(), ckpt::LoadMismatch);
    const auto report = ckpt::load_checkpoint_into(dir / "f.ckpt", target, false);
    CHECK(report.mismatches ==
          std::vector<std::string>{"'m': checkpoint has float64[2, 3] row-major, target has float64[3, 2] column-major"});
    CHECK(target.tensor("m") == ckpt::Tensor(ckpt::DType::float64, {3, 2}, ckpt::Order::column_major));  // untouched
}

TEST_CASE("a storage order record that does not fit is a FormatError naming the file and the tensor") {
    TempDir dir;
    const fs::path file = dir / "r.ckpt";
    // written under a name of the same length, then renamed in the bytes: a writer refuses the real one
    auto written = [&](ckpt::ParamDict d) {
        ckpt::save_checkpoint(d, file);
        auto b = test::read_bytes(file);
        const std::string bytes(b.begin(), b.end());
        const auto at = bytes.find("__ckpt_order.");
        REQUIRE(at != std::string::npos);
        b[at + 6] = '.';
        test::write_bytes(file, b);
        reseal(file);
    };
    struct Case {
        const char* what;
        ckpt::ParamDict dict;
        const char* message;
    };
    const Case cases[] = {
        {"another value", {{"m", numbered(2, 2, ckpt::Order::row_major)}, {"__ckpt_order.m", "row_major"}},
         "the storage order record '__ckpt.order.m' of tensor 'm' holds 'row_major', not 'column_major'"},
        {"not a string", {{"m", numbered(2, 2, ckpt::Order::row_major)}, {"__ckpt_order.m", std::int64_t{1}}},
         "the storage order record '__ckpt.order.m' of tensor 'm' holds no string, not 'column_major'"},
        {"no such tensor", {{"m", numbered(2, 2, ckpt::Order::row_major)}, {"__ckpt_order.q", "column_major"}},
         "the storage order record '__ckpt.order.q' names no tensor entry ('q')"},
        {"a value", {{"q", "text"}, {"__ckpt_order.q", "column_major"}},
         "the storage order record '__ckpt.order.q' names no tensor entry ('q')"},
        {"rank 1", {{"v", ckpt::Tensor(ckpt::DType::float32, {3})}, {"__ckpt_order.v", "column_major"}},
         "the storage order record '__ckpt.order.v' marks tensor 'v' of rank 1 column-major"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.what);
        written(c.dict);
        const std::string message = "checkpoint '" + file.string() + "' is malformed: ";
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(file), doctest::Contains((message + c.message).c_str()), ckpt::FormatError);
        CHECK_THROWS_WITH_AS(ckpt::read_contents(file), doctest::Contains(c.message), ckpt::FormatError);
        ckpt::ParamDict target{{"m", ckpt::Tensor(ckpt::DType::float64, {2, 2})}};
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(file, target), doctest::Contains(c.message), ckpt::FormatError);
    }
    // a record twice is a duplicate name, as any other
    {
        ckpt::save_checkpoint({{"m", numbered(2, 2, ckpt::Order::row_major)}, {"__ckpt_order.m", "column_major"},
                               {"__ckpt_order_m", "column_major"}},
                              file);
        auto b = test::read_bytes(file);
        std::string bytes(b.begin(), b.end());
        for (auto at = bytes.find("__ckpt_order"); at != std::string::npos; at = bytes.find("__ckpt_order", at + 1)) {
            b[at + 6] = '.';
            b[at + 12] = '.';
        }
        test::write_bytes(file, b);
        reseal(file);
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(file), doctest::Contains("entry '__ckpt.order.m' appears twice"),
                             ckpt::FormatError);
    }
    // the record in its place is what a column-major tensor reads as
    written({{"m", numbered(2, 2, ckpt::Order::row_major)}, {"__ckpt_order.m", "column_major"}});
    const std::vector<double> bytes{0, 1, 100, 101};  // m(i, j) = 100 i + j, row by row
    CHECK(ckpt::load_checkpoint(file).tensor("m") == ckpt::Tensor::from(bytes, {2, 2}, ckpt::Order::column_major));
}

TEST_CASE("a state may not hold the writer's storage order records") {
    TempDir dir;
    ckpt::ParamDict d{{"m", numbered(2, 2, ckpt::Order::row_major)}, {"__ckpt.order.m", "column_major"}};
    CHECK_THROWS_WITH_AS(ckpt::save_checkpoint(d, dir / "x.ckpt"),
                         doctest::Contains("the entry name '__ckpt.order.m' starts with '__ckpt.order.'"),
                         ckpt::ConfigError);
    CHECK(test::names_in(dir.path()).empty());
}

TEST_CASE("snapshots keep each tensor's order") {
    ckpt::ParamDict d{{"m", numbered(2, 3, ckpt::Order::column_major)}};
    CHECK(ckpt::detail::snapshot(d, ckpt::ObjectEncoding::boost_binary) == d);
    ckpt::ParamDict buffer{{"m", numbered(3, 2, ckpt::Order::row_major)}};  // the same stored shape, another order
    ckpt::detail::snapshot_into(buffer, d, ckpt::ObjectEncoding::boost_binary);
    CHECK(buffer == d);
}

}  // TEST_SUITE

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <ckpt/reshard.hpp>

#include <cpuid.h>

namespace {

/// Whether the upper halves of this thread's vector registers are in use (XINUSE bits 2 and 6,
/// YMM and ZMM upper state): code in legacy SSE encodings runs slower then. Nothing when the
/// CPU cannot say (no AVX or no XGETBV with ECX = 1).
std::optional<bool> upper_vector_state_in_use() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__builtin_cpu_supports("avx") || !__get_cpuid_count(0xd, 1, &a, &b, &c, &d) || !(a & 4)) return std::nullopt;
    unsigned lo = 0, hi = 0;
    asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
    return (lo & 0x44) != 0;
}

}  // namespace

TEST_CASE("hashing leaves the thread's vector registers clean: SSE code after a save, load or verify runs at full speed") {
    if (!upper_vector_state_in_use()) {
        MESSAGE("skipped: this CPU does not report the state of its vector registers");
        return;
    }
    std::vector<float> big(1 << 20, 0.25f);  // 4 MiB: the hash takes its widest kernel
    (void)ckpt::detail::xxh3(big.data(), big.size() * sizeof(float));
    CHECK_FALSE(*upper_vector_state_in_use());
    ckpt::detail::Xxh3 streaming;
    streaming.update(big.data(), big.size() * sizeof(float));
    CHECK_FALSE(*upper_vector_state_in_use());
    (void)streaming.digest();
    CHECK_FALSE(*upper_vector_state_in_use());

    TempDir dir;
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(big, {1 << 20}));
    ckpt::save_checkpoint(d, dir / "big.ckpt");
    CHECK_FALSE(*upper_vector_state_in_use());
    ckpt::verify_checkpoint(dir / "big.ckpt");
    CHECK_FALSE(*upper_vector_state_in_use());
    (void)ckpt::load_checkpoint(dir / "big.ckpt");
    CHECK_FALSE(*upper_vector_state_in_use());
    (void)ckpt::describe_checkpoint(dir / "big.ckpt", "big.ckpt", 0);
    CHECK_FALSE(*upper_vector_state_in_use());
}
#endif
