// Body codecs: zstd, AES-256-GCM and their chain, through every archive kind and every way of
// reading a file; what the header records; and each way a compressed or encrypted file can be
// wrong (no key, another key, damaged, altered with its checksum recomputed).
#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/codecs/zstd.hpp>

#include <doctest/doctest.h>

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <random>

#include "alloc_tracker.hpp"
#include "support.hpp"

namespace {

using ckpt::CodecId;

ckpt::Key test_key(unsigned char fill) {
    std::array<unsigned char, 32> raw{};
    for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<unsigned char>(fill + i * 7);
    return ckpt::Key::from_bytes(raw);
}

std::string key_hex(const ckpt::Key& k) { return ckpt::detail::hex_bytes(k.data(), ckpt::Key::size); }

struct Chain {
    const char* name;
    ckpt::CodecChain codecs;
};

std::vector<Chain> chains(const ckpt::Key& key) {
    return {{"none", {}},
            {"zstd", ckpt::Zstd{3}.codecs()},
            {"aes-256-gcm", ckpt::AesGcm{key}.codecs()},
            {"zstd+aes-256-gcm", ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>{ckpt::Zstd{1}, ckpt::AesGcm{key}}.codecs()}};
}

/// sample_state() plus a tensor large enough to span several zstd blocks and AES segments,
/// half compressible (a ramp), half not (random bits).
ckpt::ParamDict large_state() {
    ckpt::ParamDict d = test::sample_state();
    std::vector<float> ramp(3u << 20);
    for (std::size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<float>(i % 4096) * 0.25f;
    d.set("ramp", ckpt::Tensor::from(ramp, {static_cast<std::int64_t>(ramp.size())}));
    std::vector<std::int32_t> noise(1u << 20);
    std::mt19937 rng(14);
    for (auto& v : noise) v = static_cast<std::int32_t>(rng());
    d.set("noise", ckpt::Tensor::from(noise, {static_cast<std::int64_t>(noise.size())}));
    return d;
}

ckpt::LoadOptions with_key(const ckpt::Key& key) {
    ckpt::LoadOptions o;
    o.key = key;
    return o;
}

/// Replaces the stored body (keeping the header's fields) and reseals the checksums.
void rewrite_body(const test::fs::path& file, const std::function<void(std::vector<char>&)>& edit) {
    auto b = test::read_bytes(file);
    std::vector<char> body(b.begin() + ckpt::header_size, b.end());
    edit(body);
    b.resize(ckpt::header_size);
    b.insert(b.end(), body.begin(), body.end());
    test::reseal(b);
    test::write_bytes(file, b);
}

}  // namespace

TEST_SUITE("codec") {

TEST_CASE("every codec chain round-trips every archive kind through every reader") {
    test::TempDir dir;
    const auto key = test_key(1);
    const ckpt::ParamDict small = test::sample_state();
    for (const auto& chain : chains(key)) {
        for (auto archive : {ckpt::ArchiveKind::binary, ckpt::ArchiveKind::text, ckpt::ArchiveKind::xml}) {
            CAPTURE(chain.name);
            CAPTURE(ckpt::archive_kind_name(archive));
            const auto file = dir / "c.ckpt";
            ckpt::save_checkpoint(small, file, {.archive = archive, .epoch = 2, .step = 7, .codecs = chain.codecs});
            const auto h = ckpt::verify_checkpoint(file);  // no key needed: the checksum covers the stored bytes
            CHECK(h.codec_names() == std::string(chain.name));
            CHECK(h.version == (!chain.codecs.empty() ? 2u : archive == ckpt::ArchiveKind::binary ? 3u : 1u));
            CHECK(h.epoch == 2);
            CHECK(h.step == 7);
            CHECK(ckpt::load_checkpoint(file, with_key(key)) == small);
            const auto contents = ckpt::read_contents(file, with_key(key));
            REQUIRE(contents.entries.size() == small.size());
            CHECK(contents.entries.front().name == small.begin()->name);
            ckpt::ParamDict target = test::sample_state(5.0f);
            const auto report = ckpt::load_checkpoint_into(file, target, true, with_key(key));
            CHECK(report.complete());
            CHECK(target == small);
        }
    }
}

TEST_CASE("large bodies cross zstd block and AES segment boundaries intact, and zstd stores noise as it is") {
    test::TempDir dir;
    const auto key = test_key(2);
    const ckpt::ParamDict state = large_state();
    ckpt::save_checkpoint(state, dir / "plain.ckpt", {.chunk_bytes = 0});  // the body the codecs encode
    const auto plain = ckpt::read_header(dir / "plain.ckpt").body_length;
    for (const auto& chain : chains(key)) {
        CAPTURE(chain.name);
        const auto file = dir / (std::string(chain.name) + ".ckpt");
        ckpt::save_checkpoint(state, file, {.codecs = chain.codecs});
        CHECK(ckpt::load_checkpoint(file, with_key(key)) == state);
        ckpt::ParamDict into = large_state();
        for (auto& [name, value] : into)
            if (auto* t = value.get_if<ckpt::Tensor>()) std::memset(t->data(), 0, t->nbytes());
        CHECK(ckpt::load_checkpoint_into(file, into, true, with_key(key)).complete());
        CHECK(into == state);
        const auto stored = ckpt::read_header(file).body_length;
        const std::uint64_t blocks = plain / (1u << 20) + 1, segments = plain / (1u << 20) + 1;
        if (chain.codecs.empty()) continue;
        if (chain.codecs.front().id == CodecId::zstd) {
            // The ramp shrinks; the 4 MiB of noise are kept as they are, with 8 bytes per block.
            CHECK(stored < plain - 8 * (1u << 20));
            CHECK(stored > 4 * (1u << 20));
        } else {
            CHECK(stored == plain + 64 + 16 * segments);
        }
        CHECK(stored <= plain + 8 * blocks + 64 + 16 * segments);
    }
    // A body of noise alone: the noise is stored as it is, each block costing its 8-byte header
    // (the table of contents before it may shrink a little).
    ckpt::ParamDict noise;
    const ckpt::Tensor& bytes = state.tensor("noise");
    noise.set("noise", bytes);
    ckpt::save_checkpoint(noise, dir / "noise-plain.ckpt");
    ckpt::save_checkpoint(noise, dir / "noise.ckpt", {.codecs = ckpt::Zstd{3}.codecs()});
    const auto raw = ckpt::read_header(dir / "noise-plain.ckpt").body_length;
    const auto stored = ckpt::read_header(dir / "noise.ckpt").body_length;
    const std::uint64_t block_headers = 8 * ((bytes.nbytes() + (1u << 20) - 1) / (1u << 20));
    CHECK(stored >= bytes.nbytes() + block_headers);
    CHECK(stored <= raw + block_headers + 8);
    const auto file = test::read_bytes(dir / "noise.ckpt");
    const auto* noise_bytes = reinterpret_cast<const char*>(bytes.data());
    for (std::size_t at : {std::size_t{0}, bytes.nbytes() / 2, bytes.nbytes() - 4096})  // verbatim, not recoded
        CHECK(std::search(file.begin(), file.end(), noise_bytes + at, noise_bytes + at + 4096) != file.end());
}

TEST_CASE("a short writev resumes with the first byte the kernel did not take") {
    // Blocks reach the file as gathered writes (headers and payloads); a write the kernel cut
    // short must continue exactly where it stopped, across and within pieces.
    char a[8], b[100], c[50];
    auto fresh = [&] { return std::vector<iovec>{{a, sizeof a}, {b, sizeof b}, {nullptr, 0}, {c, sizeof c}}; };
    auto v = fresh();
    CHECK(ckpt::detail::drop_written(v, 0, 3) == 0);
    CHECK(v[0].iov_base == a + 3);
    CHECK(v[0].iov_len == 5);
    CHECK(ckpt::detail::drop_written(v, 0, 5 + 40) == 1);
    CHECK(v[1].iov_base == b + 40);
    CHECK(v[1].iov_len == 60);
    v = fresh();
    CHECK(ckpt::detail::drop_written(v, 0, 108) == 2);  // all of a and b: the empty piece is next
    CHECK(ckpt::detail::drop_written(v, 2, 10) == 3);   // the empty piece is passed over
    CHECK(v[3].iov_base == c + 10);
    CHECK(v[3].iov_len == 40);
    CHECK(ckpt::detail::drop_written(v, 3, 40) == 4);
}

TEST_CASE("an encrypted body that ends on a segment boundary ends with an empty segment every reader authenticates") {
    test::TempDir dir;
    const auto key = test_key(6);
    constexpr std::uint64_t segment = 1u << 20;
    // A last tensor of bytes, grown until the plaintext body is whole segments; sizes below
    // and above the two-thread threshold (8 MiB).
    for (std::size_t big : {std::size_t{1} << 20, std::size_t{3} << 20}) {
        CAPTURE(big);
        const ckpt::ParamDict state = big > (std::size_t{1} << 20) ? large_state() : test::sample_state();
        auto with_tail = [&](std::uint64_t n) {  // tensors shared with `state`
            ckpt::ParamDict d = state;
            d.set("tail", ckpt::Tensor(ckpt::DType::uint8, {static_cast<std::int64_t>(n)}));
            return d;
        };
        // the body a codec encodes: version 1's (a version 3 table would grow with the tail)
        ckpt::save_checkpoint(with_tail(1), dir / "plain.ckpt", {.chunk_bytes = 0});
        const auto first = ckpt::read_header(dir / "plain.ckpt").body_length;
        const std::uint64_t tail = 1 + (segment - first % segment) % segment + big;
        const ckpt::ParamDict whole = with_tail(tail);
        ckpt::save_checkpoint(whole, dir / "plain.ckpt", {.chunk_bytes = 0});
        const auto plain = ckpt::read_header(dir / "plain.ckpt").body_length;
        REQUIRE(plain % segment == 0);
        const auto file = dir / "e.ckpt";
        ckpt::save_checkpoint(whole, file, {.codecs = ckpt::AesGcm{key}.codecs()});
        CHECK(ckpt::read_header(file).body_length == 64 + plain + 16 * (plain / segment + 1));  // the empty one
        auto load_into = [&] {
            ckpt::ParamDict into;
            for (const auto& [name, value] : whole) {
                if (const auto* t = value.get_if<ckpt::Tensor>()) {
                    ckpt::Tensor copy = t->clone();
                    std::memset(copy.data(), 0x5a, copy.nbytes());
                    into.set(name, std::move(copy));
                } else {
                    into.set(name, value);
                }
            }
            const bool complete = ckpt::load_checkpoint_into(file, into, true, with_key(key)).complete();
            return complete && into == whole;
        };
        CHECK(ckpt::load_checkpoint(file, with_key(key)) == whole);
        CHECK(load_into());
        // Its tag altered, or the segment dropped: the end of the body no longer authenticates.
        for (bool drop : {false, true}) {
            CAPTURE(drop);
            ckpt::save_checkpoint(whole, file, {.codecs = ckpt::AesGcm{key}.codecs()});
            rewrite_body(file, [&](std::vector<char>& b) {
                if (drop)
                    b.resize(b.size() - 16);
                else
                    b.back() ^= 1;
            });
            CHECK_THROWS_AS(ckpt::load_checkpoint(file, with_key(key)), ckpt::AuthenticationError);
            CHECK_THROWS_AS(load_into(), ckpt::AuthenticationError);
        }
    }
}

TEST_CASE("an encoded save that fails while its blocks are being encoded leaves the old file and no temporary") {
    // The write fails with blocks still queued for the helper threads: they are dropped, not
    // run on memory that is gone (AddressSanitizer checks this in the sanitizer pass).
    test::TempDir dir;
    const auto key = test_key(6);
    const ckpt::ParamDict state = large_state();
    for (const auto& chain : chains(key)) {
        if (chain.codecs.empty()) continue;
        CAPTURE(chain.name);
        const auto file = dir / "x.ckpt";
        ckpt::save_checkpoint(test::sample_state(), file, {.codecs = chain.codecs});
        const auto before = test::read_bytes(file);
        rlimit old{};
        ::getrlimit(RLIMIT_FSIZE, &old);
        auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
        rlimit small = old;
        small.rlim_cur = 3u << 20;  // the 16 MiB body cannot fit
        ::setrlimit(RLIMIT_FSIZE, &small);
        CHECK_THROWS_WITH_AS(ckpt::save_checkpoint(state, file, {.codecs = chain.codecs}),
                             doctest::Contains("File too large"), ckpt::IoError);
        ::setrlimit(RLIMIT_FSIZE, &old);
        std::signal(SIGXFSZ, old_handler);
        CHECK(test::read_bytes(file) == before);
        CHECK(test::names_in(dir.path()) == std::vector<std::string>{"x.ckpt"});
    }
}

TEST_CASE("an encrypted checkpoint read without its key, or with another key, says so and names the file") {
    test::TempDir dir;
    const auto key = test_key(3), other = test_key(4);
    const auto file = dir / "secret.ckpt";
    ckpt::save_checkpoint(test::sample_state(), file, {.codecs = ckpt::AesGcm{key}.codecs()});
    for (auto* read : {+[](const test::fs::path& f, const ckpt::LoadOptions& o) { ckpt::load_checkpoint(f, o); },
                       +[](const test::fs::path& f, const ckpt::LoadOptions& o) { ckpt::read_contents(f, o); },
                       +[](const test::fs::path& f, const ckpt::LoadOptions& o) {
                           ckpt::ParamDict t = test::sample_state();
                           ckpt::load_checkpoint_into(f, t, false, o);
                       }}) {
        try {
            read(file, {});
            FAIL("read without a key");
        } catch (const ckpt::KeyError& e) {
            CHECK(std::string(e.what()).find(file.string()) != std::string::npos);
            CHECK(std::string(e.what()).find("needs its key") != std::string::npos);
        }
        try {
            read(file, with_key(other));
            FAIL("read with another key");
        } catch (const ckpt::KeyError& e) {
            const std::string what = e.what();
            CHECK(what.find(file.string()) != std::string::npos);
            CHECK(what.find("another key") != std::string::npos);
            CHECK(what.find(key_hex(key)) == std::string::npos);  // key ids, never key bytes
            CHECK(what.find(key_hex(other)) == std::string::npos);
        }
    }
    CHECK_NOTHROW(ckpt::verify_checkpoint(file));
}

TEST_CASE("damaged compressed and encrypted bodies are corruption, altered ones fail authentication") {
    test::TempDir dir;
    const auto key = test_key(5);
    const ckpt::ParamDict state = large_state();
    for (const auto& chain : chains(key)) {
        if (chain.codecs.empty()) continue;
        CAPTURE(chain.name);
        const auto file = dir / "d.ckpt";
        auto fresh = [&] { ckpt::save_checkpoint(state, file, {.epoch = 1, .step = 9, .codecs = chain.codecs}); };
        const bool encrypted = chain.codecs.back().id == CodecId::aes_256_gcm;

        // A flipped bit anywhere in the body: the checksum catches it, key or no key.
        for (std::size_t at : {std::size_t{3}, std::size_t{70}, std::size_t{5000}, std::size_t{2u << 20}}) {
            fresh();
            test::flip_bit(file, ckpt::header_size + at, 2);
            CHECK_THROWS_AS(ckpt::verify_checkpoint(file), ckpt::ChecksumError);
            CHECK_THROWS_AS(ckpt::load_checkpoint(file, with_key(key)), ckpt::ChecksumError);
            ckpt::ParamDict into = large_state();
            CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(file, into, true, with_key(key)), doctest::Contains("corrupt"),
                                 ckpt::ChecksumError);
        }
        if (encrypted) {
            // Altered, then resealed: the ciphertext, a tag, the prefix, or whole segments dropped.
            for (const auto& edit : std::vector<std::function<void(std::vector<char>&)>>{
                     [](std::vector<char>& b) { b[100] ^= 1; },
                     [](std::vector<char>& b) { b.back() ^= 0x40; },
                     [](std::vector<char>& b) { b[10] ^= 1; },  // the salt: another file key
                     [](std::vector<char>& b) { b.resize(64 + (1u << 20) + 16); }}) {
                fresh();
                rewrite_body(file, edit);
                CHECK_NOTHROW(ckpt::verify_checkpoint(file));
                CHECK_THROWS_AS(ckpt::load_checkpoint(file, with_key(key)), ckpt::AuthenticationError);
                ckpt::ParamDict into = large_state();
                CHECK_THROWS_AS(ckpt::load_checkpoint_into(file, into, true, with_key(key)), ckpt::AuthenticationError);
            }
            // Deep in a large body: the segment is named, counting from 1, whichever way the body
            // was read (into existing tensors, the fourth segment is decrypted in the background).
            fresh();
            rewrite_body(file, [](std::vector<char>& b) { b[64 + 3 * ((1u << 20) + 16) + 5] ^= 1; });
            CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(file, with_key(key)), doctest::Contains("segment 4 of"),
                                 ckpt::AuthenticationError);
            ckpt::ParamDict into = large_state();
            CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(file, into, true, with_key(key)),
                                 doctest::Contains("segment 4 of"), ckpt::AuthenticationError);
            // The header is authenticated too: another step, with the header check recomputed.
            fresh();
            auto b = test::read_bytes(file);
            ckpt::detail::put_le<std::int64_t>(reinterpret_cast<std::byte*>(b.data()) + 40, 10);
            test::reseal(b);
            test::write_bytes(file, b);
            CHECK(ckpt::verify_checkpoint(file).step == 10);
            CHECK_THROWS_AS(ckpt::load_checkpoint(file, with_key(key)), ckpt::AuthenticationError);
        } else {
            // Altered zstd framing, resealed: a clear FormatError, never a crash or a huge allocation.
            for (const auto& edit : std::vector<std::function<void(std::vector<char>&)>>{
                     [](std::vector<char>& b) { ckpt::detail::put_le<std::uint32_t>(reinterpret_cast<std::byte*>(b.data()), 0x7fffffff); },
                     [](std::vector<char>& b) { ckpt::detail::put_le<std::uint32_t>(reinterpret_cast<std::byte*>(b.data()) + 4, 0x7fffffff); },
                     [](std::vector<char>& b) { b.resize(b.size() - 3); },
                     [](std::vector<char>& b) { b[20] ^= 0x55; }}) {
                fresh();
                rewrite_body(file, edit);
                CHECK_THROWS_AS(ckpt::load_checkpoint(file), ckpt::FormatError);
            }
        }
    }
}

TEST_CASE("the header records the codecs: version 2, and version 1 files must list none") {
    test::TempDir dir;
    const auto file = dir / "z.ckpt";
    ckpt::save_checkpoint(test::sample_state(), file, {.codecs = ckpt::Zstd{3}.codecs()});
    auto b = test::read_bytes(file);
    CHECK(b[8] == 2);
    CHECK(b[12] == 0);   // binary
    CHECK(b[13] == 1);   // zstd
    CHECK(b[14] == 0);
    auto edited = [&](std::size_t at, char v) {
        auto c = b;
        c[at] = v;
        test::reseal(c);
        test::write_bytes(file, c);
    };
    edited(13, 9);
    CHECK_THROWS_WITH_AS(ckpt::read_header(file), doctest::Contains("names codec 9, which this version of ckpt does not know"),
                         ckpt::VersionError);
    edited(8, 1);  // version 1 with a codec listed
    CHECK_THROWS_WITH_AS(ckpt::read_header(file), doctest::Contains("malformed codec list"), ckpt::FormatError);
    edited(8, 3);  // version 3 holds no codecs
    CHECK_THROWS_WITH_AS(ckpt::read_header(file), doctest::Contains("malformed codec list"), ckpt::FormatError);
    edited(8, 4);
    CHECK_THROWS_AS(ckpt::read_header(file), ckpt::VersionError);
}

TEST_CASE("a chain that encrypts before compressing, or encrypts without a key, is refused before writing") {
    test::TempDir dir;
    const auto file = dir / "bad.ckpt";
    // ckpt::Chain<ckpt::AesGcm, ckpt::Zstd> does not compile (tests/compile_fail); a chain built
    // by hand is refused at run time
    ckpt::CodecChain encrypt_first = ckpt::AesGcm{test_key(6)}.codecs();
    encrypt_first.push_back(ckpt::Zstd{3}.codecs().front());
    CHECK_THROWS_WITH_AS(ckpt::save_checkpoint(test::sample_state(), file, {.codecs = encrypt_first}),
                         doctest::Contains("encryption must be the last"), ckpt::ConfigError);
    CHECK_THROWS_AS(ckpt::save_checkpoint(test::sample_state(), file, {.codecs = ckpt::AesGcm{}.codecs()}), ckpt::KeyError);
    CHECK_THROWS_AS(ckpt::Zstd{99}, ckpt::ConfigError);
    CHECK(test::names_in(dir.path()).empty());
    // a manager finds a missing key when it is made, not at its first save
    using Sealed = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming, ckpt::BinaryArchive,
                                           ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>>;
    CHECK_THROWS_WITH_AS(Sealed(dir / "m", "m", ckpt::EverySteps{1}, ckpt::KeepLast{}, {}, {}, {}),
                         doctest::Contains("no key"), ckpt::KeyError);
}

TEST_CASE("key files hold 32 bytes or 64 hex digits, and a bad one is named without its content") {
    test::TempDir dir;
    CHECK_THROWS_WITH_AS(ckpt::Key::from_file(dir / "nope.key"), doctest::Contains("cannot open key file"), ckpt::IoError);
    const auto key = test_key(7);
    const std::string hex = key_hex(key);
    test::write_bytes(dir / "hex.key", std::vector<char>(hex.begin(), hex.end()));
    std::string with_newline = hex + "\n";
    test::write_bytes(dir / "hexnl.key", std::vector<char>(with_newline.begin(), with_newline.end()));
    test::write_bytes(dir / "raw.key", std::vector<char>(key.data(), key.data() + 32));
    const auto file = dir / "k.ckpt";
    ckpt::save_checkpoint(test::sample_state(), file, {.codecs = ckpt::AesGcm{key}.codecs()});
    for (const char* name : {"hex.key", "hexnl.key", "raw.key"}) {
        CAPTURE(name);
        CHECK(ckpt::load_checkpoint(file, with_key(ckpt::Key::from_file(dir / name))) == test::sample_state());
    }
    const std::string short_key = hex.substr(0, 40);
    test::write_bytes(dir / "short.key", std::vector<char>(short_key.begin(), short_key.end()));
    try {
        ckpt::Key::from_file(dir / "short.key");
        FAIL("a 40-digit key file was accepted");
    } catch (const ckpt::ConfigError& e) {
        CHECK(std::string(e.what()).find((dir / "short.key").string()) != std::string::npos);
        CHECK(std::string(e.what()).find(short_key) == std::string::npos);
    }
}

TEST_CASE("a manager compresses and encrypts its async saves and restore() decrypts them") {
    test::TempDir dir;
    test::LogCapture log;
    const auto key = test_key(8);
    using Manager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming, ckpt::BinaryArchive,
                                            ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>>;
    std::vector<float> w(1 << 16);
    ckpt::ParamDict state;
    state.set("w", ckpt::Tensor::view(std::span<float>(w), {static_cast<std::int64_t>(w.size())}));
    ckpt::ManagerOptions opts;
    opts.async_save = true;
    {
        Manager mgr(dir.path(), "enc", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, opts,
                    ckpt::Chain{ckpt::Zstd{3}, ckpt::AesGcm{key}});
        for (int step = 1; step <= 4; ++step) {
            std::fill(w.begin(), w.end(), static_cast<float>(step));
            mgr.on_step(ckpt::Progress::at_iteration(step), state);
        }
        mgr.wait();
    }
    const auto newest = ckpt::latest_checkpoint(dir.path(), "enc", ckpt::StepNaming{});  // no key needed to find it
    REQUIRE(newest);
    CHECK(newest->name.step == 4);
    CHECK(newest->header.codec_names() == "zstd+aes-256-gcm");
    std::fill(w.begin(), w.end(), 0.0f);
    {
        Manager again(dir.path(), "enc", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, opts,
                      ckpt::Chain{ckpt::Zstd{3}, ckpt::AesGcm{key}});
        const auto restored = again.restore(state);
        REQUIRE(restored);
        CHECK(restored->file.name.step == 4);
        CHECK(w.front() == 4.0f);
        CHECK(w.back() == 4.0f);
    }
    // Another key does not fall back to older files: it is an error naming the file and the key
    // ids, and no key bytes.
    Manager wrong(dir.path(), "enc", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, opts,
                  ckpt::Chain{ckpt::Zstd{3}, ckpt::AesGcm{test_key(9)}});
    try {
        wrong.restore(state);
        FAIL("another key restored");
    } catch (const ckpt::UnreadableCheckpoints& e) {
        CHECK(std::string(e.what()).find("enc-4.ckpt") != std::string::npos);
        CHECK(std::string(e.what()).find("key") != std::string::npos);
        CHECK(std::string(e.what()).find(key_hex(key)) == std::string::npos);
        REQUIRE(e.files().size() == 1);
        CHECK(e.files()[0].unsupported);
    }
    for (const auto& line : log.warnings) CHECK(line.find(key_hex(key)) == std::string::npos);
    for (const auto& line : log.infos) CHECK(line.find(key_hex(key)) == std::string::npos);
}

// A body the process cannot get the memory to decode is this process's shortage, not the
// file's damage: restore() does not pass over it for an older file (which would lose steps).
TEST_CASE("a checkpoint restore() lacks the memory to decode is refused, not passed over for an older one") {
    if (!test::allocation_watch_works) return;  // ThreadSanitizer's build: no allocation is refused
    test::TempDir dir;
    test::LogCapture log;
    std::vector<float> w(1 << 20);  // 4 MiB
    ckpt::ParamDict state;
    state.set("w", ckpt::Tensor::view(std::span<float>(w), {static_cast<std::int64_t>(w.size())}));
    {  // step 1 plain (read in place, nothing to allocate), step 2 compressed (decoded whole)
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming, ckpt::BinaryArchive> plain(
            dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepLast{2});
        std::fill(w.begin(), w.end(), 1.0f);
        plain.on_step(ckpt::Progress::at_iteration(1), state);
    }
    using Compressed = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming, ckpt::BinaryArchive, ckpt::Zstd>;
    {
        Compressed mgr(dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, {}, ckpt::Zstd{1});
        std::fill(w.begin(), w.end(), 2.0f);
        mgr.on_step(ckpt::Progress::at_iteration(2), state);
    }
    std::fill(w.begin(), w.end(), 0.0f);
    const auto found = ckpt::latest_checkpoint(dir.path(), "run", ckpt::StepNaming{});  // verifies, decodes nothing
    REQUIRE(found);
    REQUIRE(found->name.step == 2);
    const std::string newest = found->path.string();
    Compressed again(dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, {}, ckpt::Zstd{1});
    {
        test::AllocationWatch refuse(std::size_t{1} << 20);  // no allocation over 1 MiB granted
        try {
            again.restore(state);
            FAIL("restored with no memory to decode the newest checkpoint");
        } catch (const ckpt::UnreadableCheckpoints& e) {
            refuse.stop();
            const std::string what = e.what();
            INFO(what);
            CHECK(what.find(newest) != std::string::npos);
            CHECK(what.find("more memory than this process could get") != std::string::npos);
            REQUIRE(e.files().size() == 1);
            CHECK(e.files()[0].unsupported);
        }
    }
    CHECK(w.front() == 0.0f);  // not the older file's 1
    // with the memory, the newest
    const auto restored = again.restore(state);
    REQUIRE(restored);
    CHECK(restored->file.name.step == 2);
    CHECK(w.back() == 2.0f);
    // and a direct read says what it is, naming the file
    test::AllocationWatch refuse(std::size_t{1} << 20);
    CHECK_THROWS_AS(ckpt::load_checkpoint(newest), ckpt::OutOfMemory);
}

TEST_CASE("CheckpointConfig's enc_key and zstd_level configure the same codecs") {
    test::TempDir dir;
    test::LogCapture quiet;
    ckpt::CheckpointConfig config;
    config.save_checkpoint_steps = 1;
    config.enc_key = test_key(10);
    config.zstd_level = 5;
    auto mgr = ckpt::make_manager(dir.path(), "cfg", config);
    ckpt::ParamDict state = test::sample_state();
    const auto file = mgr.save(ckpt::Progress::at_iteration(1), state);
    CHECK(ckpt::read_header(file).codec_names() == "zstd+aes-256-gcm");
    CHECK(ckpt::load_checkpoint(file, with_key(config.enc_key)) == state);
    config.enc_mode = "AES-CBC";
    CHECK_THROWS_WITH_AS(ckpt::make_manager(dir.path(), "cfg", config), doctest::Contains("AES-CBC"), ckpt::ConfigError);
}

TEST_CASE("LoadOptions::max_decoded_bytes refuses a compressed body that would decode to more, before decoding it") {
    test::TempDir dir;
    ckpt::ParamDict zeros;
    zeros.set("z", ckpt::Tensor::from(std::vector<float>(4u << 20, 0.0f), {4 << 20}));  // 16 MiB, a few KiB stored
    const auto file = dir / "zeros.ckpt";
    ckpt::save_checkpoint(zeros, file, {.codecs = ckpt::Zstd{3}.codecs()});
    CHECK(ckpt::read_header(file).body_length < (64u << 10));
    ckpt::LoadOptions capped;
    capped.max_decoded_bytes = 8u << 20;
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(file, capped), doctest::Contains("max_decoded_bytes"), ckpt::FormatError);
    capped.max_decoded_bytes = 17u << 20;
    CHECK(ckpt::load_checkpoint(file, capped) == zeros);
}

}  // TEST_SUITE
