// The golden files of tests/golden/: checkpoints written once by format version 1 and by
// format version 2 (tools/make_golden.cpp) and never regenerated. Every later version of ckpt
// must read them with the same result, and their bytes must be what docs/FORMAT.md says,
// checked here from the raw file bytes by small readers written from that document alone (not
// through ckpt or Boost; the codec stages of version 2 undone with libzstd and OpenSSL
// directly), so that a change of the wire format fails even if ckpt's writer and reader change
// together.

#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/codecs/zstd.hpp>

#include <doctest/doctest.h>

#include <boost/archive/basic_archive.hpp>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "golden_state.hpp"
#include "support.hpp"

namespace {

using test::golden_state;

struct Golden {
    const char* file;
    ckpt::ArchiveKind archive;
    std::uint32_t kind_code;  // header byte 12
    std::uint32_t version;    // header bytes 8..11
    std::array<std::uint8_t, 3> codecs;  // header bytes 13..15: 1 zstd, 2 aes-256-gcm, in the order applied
    std::int64_t epoch, step;
};

constexpr Golden goldens[] = {{"v1-binary.ckpt", ckpt::ArchiveKind::binary, 0, 1, {0, 0, 0}, 3, 1200},
                              {"v1-text.ckpt", ckpt::ArchiveKind::text, 1, 1, {0, 0, 0}, 4, 1600},
                              {"v1-xml.ckpt", ckpt::ArchiveKind::xml, 2, 1, {0, 0, 0}, 5, 2000},
                              {"v2-zstd.ckpt", ckpt::ArchiveKind::binary, 0, 2, {1, 0, 0}, 6, 2400},
                              {"v2-aes-256-gcm.ckpt", ckpt::ArchiveKind::text, 1, 2, {2, 0, 0}, 7, 2800},
                              {"v2-zstd-aes-256-gcm.ckpt", ckpt::ArchiveKind::xml, 2, 2, {1, 2, 0}, 8, 3200},
                              {"v3-binary.ckpt", ckpt::ArchiveKind::binary, 0, 3, {0, 0, 0}, 10, 4000}};
/// The chunk size v3-binary.ckpt was written with (FORMAT.md section 13).
constexpr std::uint64_t golden_chunk_bytes = 4096;

std::string golden_path(const std::string& file) { return std::string(CKPT_SOURCE_DIR) + "/tests/golden/" + file; }

std::string file_bytes(const std::string& path) {
    const auto b = test::read_bytes(path);
    return {b.begin(), b.end()};
}

std::uint64_t le(const std::string& b, std::size_t at, std::size_t width) {
    REQUIRE(at + width <= b.size());
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < width; ++i) v |= std::uint64_t{static_cast<unsigned char>(b[at + i])} << (8 * i);
    return v;
}

/// Entry by entry: names, order, kinds, dtypes, shapes, payload bytes, and scalars exactly
/// (doubles by their bits).
void check_entries(const ckpt::ParamDict& got, const ckpt::ParamDict& want) {
    std::vector<std::string> got_names, want_names;
    for (const auto& e : got) got_names.push_back(e.name);
    for (const auto& e : want) want_names.push_back(e.name);
    REQUIRE(got_names == want_names);
    auto g = got.begin();
    for (const auto& w : want) {
        CAPTURE(w.name);
        const ckpt::Value& a = g->value;
        const ckpt::Value& b = w.value;
        REQUIRE(a.kind() == b.kind());
        if (const ckpt::Tensor* t = b.get_if<ckpt::Tensor>()) {
            const ckpt::Tensor& u = *a.get_if<ckpt::Tensor>();
            CHECK(u.dtype() == t->dtype());
            CHECK(u.shape() == t->shape());
            CHECK(u.order() == t->order());
            REQUIRE(u.nbytes() == t->nbytes());
            CHECK(std::memcmp(u.data(), t->data(), t->nbytes()) == 0);
        } else if (const double* x = b.get_if<double>()) {
            CHECK(std::bit_cast<std::uint64_t>(*a.get_if<double>()) == std::bit_cast<std::uint64_t>(*x));
        } else {
            CHECK(a == b);
        }
        ++g;
    }
}

// ---- Readers written from docs/FORMAT.md alone --------------------------------------

constexpr std::size_t dtype_sizes[] = {4, 8, 2, 4, 8, 1, 1};  // FORMAT.md's dtype table

ckpt::Tensor make_tensor(std::uint32_t dtype, const ckpt::Shape& shape, std::uint64_t nbytes) {
    REQUIRE(dtype < 7);
    std::uint64_t numel = 1;
    for (auto d : shape) {
        REQUIRE(d >= 0);
        numel *= static_cast<std::uint64_t>(d);
    }
    REQUIRE(numel * dtype_sizes[dtype] == nbytes);
    return ckpt::Tensor(static_cast<ckpt::DType>(dtype), shape);
}

/// The table of contents and the payloads, whatever the archive: `Body` reads each field.
template <class Body>
ckpt::ParamDict read_entries(Body& in) {
    struct Meta {
        std::string name;
        std::uint32_t kind;
    };
    ckpt::ParamDict out;
    std::vector<Meta> toc;
    in.begin_toc();
    const std::uint64_t count = in.u64("entries");
    for (std::uint64_t i = 0; i < count; ++i) {
        Meta m{in.string("name"), static_cast<std::uint32_t>(in.u64("kind", 4))};
        CAPTURE(m.name);
        switch (m.kind) {
            case 0: {
                const auto dtype = static_cast<std::uint32_t>(in.u64("dtype", 4));
                const auto rank = in.u64("rank", 4);
                REQUIRE(rank <= 64);
                ckpt::Shape shape;
                for (std::uint64_t r = 0; r < rank; ++r) shape.push_back(in.i64("dim"));
                const auto nbytes = in.u64("nbytes");
                out.set(m.name, make_tensor(dtype, shape, nbytes));
                in.chunk_hashes(nbytes);
                break;
            }
            case 1: out.set(m.name, in.i64("value")); break;
            case 2: out.set(m.name, in.f64("value")); break;
            case 3: {
                const auto v = in.u64("value", 4);
                REQUIRE(v <= 1);
                out.set(m.name, v == 1);
                break;
            }
            case 4: out.set(m.name, in.string("value")); break;
            default: FAIL("unknown kind " << m.kind);
        }
        toc.push_back(m);
    }
    in.end_toc();
    for (const Meta& m : toc) {
        if (m.kind != 0) continue;
        ckpt::Tensor& t = out.tensor(m.name);
        in.payload(t.data(), t.nbytes());
    }
    in.end();
    return out;
}

/// The version 3 fields (section 13) in text and xml bodies, which never have them: none.
struct NoChunks {
    void begin_toc() {}
    void chunk_hashes(std::uint64_t) {}
    void end_toc() {}
};

/// Binary: little-endian fixed-width fields, strings as u64 length + bytes, payloads behind
/// a u32 pad and that many zero bytes, starting 64-byte aligned in the body. In version 3
/// (`chunked`), the chunk size, each tensor's chunk hashes and the toc_check as well, every
/// one of them checked here with libxxhash.
struct BinaryBody {
    std::string b;
    bool chunked = false;
    std::size_t at = 0;
    std::uint64_t chunk_bytes = 0;
    std::vector<std::vector<std::uint64_t>> hashes;  // by tensor, in order
    std::size_t payloads = 0;

    void begin_toc() {
        if (!chunked) return;
        chunk_bytes = u64("chunk_bytes");
        REQUIRE(chunk_bytes >= 4096);
        REQUIRE(std::has_single_bit(chunk_bytes));
    }
    void chunk_hashes(std::uint64_t nbytes) {
        if (!chunked) return;
        auto& list = hashes.emplace_back();
        for (std::uint64_t k = 0; k < (nbytes + chunk_bytes - 1) / chunk_bytes; ++k) list.push_back(u64("hash"));
    }
    void end_toc() {
        if (!chunked) return;
        const std::size_t covered = at;
        CHECK(u64("toc_check") == XXH3_64bits(b.data(), covered));
    }
    std::uint64_t u64(const char*, std::size_t width = 8) {
        const auto v = le(b, at, width);
        at += width;
        return v;
    }
    std::int64_t i64(const char* tag) { return static_cast<std::int64_t>(u64(tag)); }
    double f64(const char* tag) { return std::bit_cast<double>(u64(tag)); }
    std::string string(const char* tag) {
        const auto n = u64(tag);
        REQUIRE(n <= b.size() - at);
        std::string s = b.substr(at, n);
        at += n;
        return s;
    }
    void payload(std::byte* dst, std::size_t n) {
        const auto pad = u64("pad", 4);
        CHECK(pad < 64);
        REQUIRE(at + pad + n <= b.size());
        CHECK(b.substr(at, pad) == std::string(pad, '\0'));
        at += pad;
        CHECK(at % 64 == 0);
        std::memcpy(dst, b.data() + at, n);
        if (chunked) {
            REQUIRE(payloads < hashes.size());
            const auto& list = hashes[payloads++];
            REQUIRE(list.size() == (n + chunk_bytes - 1) / chunk_bytes);
            for (std::size_t k = 0; k < list.size(); ++k)
                CHECK(XXH3_64bits(b.data() + at + k * chunk_bytes, std::min<std::size_t>(chunk_bytes, n - k * chunk_bytes)) ==
                      list[k]);
        }
        at += n;
    }
    void end() { CHECK(at == b.size()); }
};

std::string base64_decode(const std::string& text) {
    static const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    std::uint32_t acc = 0;
    int bits = 0;
    for (char c : text) {
        if (c == '=') break;
        const auto v = alphabet.find(c);
        REQUIRE(v != std::string::npos);
        acc = (acc << 6) | static_cast<std::uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(static_cast<char>((acc >> bits) & 0xffu));
        }
    }
    return out;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/// Text: decimal numbers separated by white space; strings as a length and then a base64
/// block; a block of n bytes is 4 * ceil(n / 3) base64 characters (line breaks allowed).
struct TextBody : NoChunks {
    std::string b;
    std::size_t at = 0;
    std::string token() {
        while (at < b.size() && is_space(b[at])) ++at;
        const std::size_t from = at;
        while (at < b.size() && !is_space(b[at])) ++at;
        REQUIRE(at > from);
        return b.substr(from, at - from);
    }
    std::uint64_t u64(const char*, std::size_t = 8) {
        const std::string t = token();
        REQUIRE(t.find_first_not_of("0123456789") == std::string::npos);
        return std::strtoull(t.c_str(), nullptr, 10);
    }
    std::int64_t i64(const char*) {
        const std::string t = token();
        REQUIRE(t.find_first_not_of("-0123456789") == std::string::npos);
        return std::strtoll(t.c_str(), nullptr, 10);
    }
    double f64(const char*) {
        const std::string t = token();
        char* end = nullptr;
        const double v = std::strtod(t.c_str(), &end);
        REQUIRE(end == t.c_str() + t.size());
        return v;
    }
    std::string block(std::uint64_t n) {
        std::string text;
        const std::uint64_t chars = (n + 2) / 3 * 4;
        while (text.size() < chars) {
            REQUIRE(at < b.size());
            if (!is_space(b[at])) text.push_back(b[at]);
            ++at;
        }
        std::string bytes = base64_decode(text);
        REQUIRE(bytes.size() == n);
        return bytes;
    }
    std::string string(const char* tag) { return block(u64(tag)); }
    void payload(std::byte* dst, std::size_t n) {
        const std::string bytes = block(n);
        std::memcpy(dst, bytes.data(), n);
    }
    void end() {
        while (at < b.size() && is_space(b[at])) ++at;
        CHECK(at == b.size());
    }
};

/// XML: one element per field, named as in FORMAT.md, its text escaped with the five
/// predefined entities; payloads base64 in <data> elements.
struct XmlBody : NoChunks {
    std::string b;
    std::size_t at = 0;
    std::string element(const std::string& tag) {
        while (at < b.size() && is_space(b[at])) ++at;
        const std::string open = "<" + tag + ">", close = "</" + tag + ">";
        REQUIRE(b.compare(at, open.size(), open) == 0);
        const auto stop = b.find(close, at + open.size());
        REQUIRE(stop != std::string::npos);
        const std::string raw = b.substr(at + open.size(), stop - at - open.size());
        at = stop + close.size();
        std::string text;
        for (std::size_t i = 0; i < raw.size(); ++i) {
            if (raw[i] != '&') {
                text.push_back(raw[i]);
                continue;
            }
            const auto semi = raw.find(';', i);
            REQUIRE(semi != std::string::npos);
            const std::string entity = raw.substr(i, semi - i + 1);
            if (entity == "&lt;") text.push_back('<');
            else if (entity == "&gt;") text.push_back('>');
            else if (entity == "&amp;") text.push_back('&');
            else if (entity == "&quot;") text.push_back('"');
            else if (entity == "&apos;") text.push_back('\'');
            else FAIL("unknown entity " << entity);
            i = semi;
        }
        return text;
    }
    std::uint64_t u64(const char* tag, std::size_t = 8) {
        const std::string t = element(tag);
        REQUIRE(!t.empty());
        REQUIRE(t.find_first_not_of("0123456789") == std::string::npos);
        return std::strtoull(t.c_str(), nullptr, 10);
    }
    std::int64_t i64(const char* tag) {
        const std::string t = element(tag);
        REQUIRE(t.find_first_not_of("-0123456789") == std::string::npos);
        return std::strtoll(t.c_str(), nullptr, 10);
    }
    double f64(const char* tag) {
        const std::string t = element(tag);
        char* end = nullptr;
        const double v = std::strtod(t.c_str(), &end);
        REQUIRE(end == t.c_str() + t.size());
        return v;
    }
    std::string string(const char* tag) { return element(tag); }
    void payload(std::byte* dst, std::size_t n) {
        std::string text;
        for (char c : element("data"))
            if (!is_space(c)) text.push_back(c);
        CHECK(text.size() == (n + 2) / 3 * 4);
        const std::string bytes = base64_decode(text);
        REQUIRE(bytes.size() == n);
        std::memcpy(dst, bytes.data(), n);
    }
    void end() {
        while (at < b.size() && is_space(b[at])) ++at;
        CHECK(b.compare(at, std::string::npos, "</boost_serialization>\n\n") == 0);
    }
};

std::string body_of(const std::string& file) { return file.substr(64); }

// ---- The codec stages of format version 2, undone from docs/FORMAT.md alone -----------

/// A stored body that breaks a rule of FORMAT.md, and which.
struct Undecodable : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void need(bool ok, const std::string& rule) {
    if (!ok) throw Undecodable(rule);
}

/// The test key of tests/golden/v2.key: 64 hexadecimal digits and a line feed.
std::string golden_key_bytes() {
    const std::string text = file_bytes(golden_path("v2.key"));
    REQUIRE(text.size() == 65);
    REQUIRE(text.back() == '\n');
    std::string key;
    for (std::size_t i = 0; i < 64; i += 2)
        key.push_back(static_cast<char>(std::stoul(text.substr(i, 2), nullptr, 16)));
    return key;
}

ckpt::LoadOptions with_golden_key() {
    ckpt::LoadOptions o;
    o.key = ckpt::Key::from_file(golden_path("v2.key"));
    return o;
}

/// HKDF-SHA256 (RFC 5869) through OpenSSL's EVP_KDF, not the EVP_PKEY path ckpt uses.
std::string hkdf_sha256(const std::string& key, const std::string& salt, const std::string& info, std::size_t n) {
    std::unique_ptr<EVP_KDF, void (*)(EVP_KDF*)> kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr), &EVP_KDF_free);
    REQUIRE(kdf);
    std::unique_ptr<EVP_KDF_CTX, void (*)(EVP_KDF_CTX*)> ctx(EVP_KDF_CTX_new(kdf.get()), &EVP_KDF_CTX_free);
    REQUIRE(ctx);
    std::string k = key, s = salt, i = info;
    const OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, const_cast<char*>("SHA256"), 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, k.data(), k.size()),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, s.data(), s.size()),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, i.data(), i.size()), OSSL_PARAM_construct_end()};
    std::string out(n, '\0');
    REQUIRE(EVP_KDF_derive(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), n, params) == 1);
    return out;
}

/// The key id: HKDF-SHA256 with no salt, which RFC 5869 defines as 32 zero bytes.
std::string key_id(const std::string& key) { return hkdf_sha256(key, std::string(32, '\0'), "ckpt key id", 8); }

struct ZstdBlocks {
    int raw = 0, compressed = 0;
};

/// zstd stored form: blocks of u32 input length (1 .. 1 MiB), u32 stored length (at most the
/// input length), stored bytes: the input itself when the lengths are equal, else one zstd
/// frame that declares the input length as its content size and decompresses to exactly it.
std::string undo_zstd(const std::string& stored, ZstdBlocks* blocks = nullptr) {
    std::string out;
    for (std::size_t at = 0; at < stored.size();) {
        need(stored.size() - at >= 8, "a whole block header");
        const auto plain = le(stored, at, 4), kept = le(stored, at + 4, 4);
        need(plain >= 1 && plain <= (1u << 20), "input length 1 .. 1 MiB");
        need(kept <= plain, "stored length at most the input length");
        need(stored.size() - at - 8 >= kept, "the stored bytes present");
        const char* src = stored.data() + at + 8;
        if (kept == plain) {
            out.append(src, plain);
            if (blocks) ++blocks->raw;
        } else {
            need(ZSTD_findFrameCompressedSize(src, kept) == kept, "exactly one zstd frame");
            need(ZSTD_getFrameContentSize(src, kept) == plain, "a frame header that declares the input length");
            std::string frame(plain, '\0');
            const std::size_t got = ZSTD_decompress(frame.data(), frame.size(), src, kept);
            need(!ZSTD_isError(got) && got == plain, "a frame that decompresses to the input length");
            out += frame;
            if (blocks) ++blocks->compressed;
        }
        at += 8 + kept;
    }
    return out;
}

/// One AES-256-GCM segment: 12-byte nonce, the associated data, then the tag checked.
bool open_segment(const std::string& file_key, std::uint64_t index, bool last, const std::string& aad, const char* in,
                  std::size_t n, const char* tag, char* out) {
    unsigned char nonce[12] = {};
    for (int b = 0; b < 8; ++b) nonce[b] = static_cast<unsigned char>(index >> (8 * b));
    nonce[8] = last ? 1 : 0;
    std::unique_ptr<EVP_CIPHER_CTX, void (*)(EVP_CIPHER_CTX*)> c(EVP_CIPHER_CTX_new(), &EVP_CIPHER_CTX_free);
    int len = 0;
    REQUIRE(EVP_DecryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1);
    REQUIRE(EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_SET_IVLEN, 12, nullptr) == 1);
    const auto* k = reinterpret_cast<const unsigned char*>(file_key.data());
    REQUIRE(EVP_DecryptInit_ex(c.get(), nullptr, nullptr, k, nonce) == 1);
    REQUIRE(EVP_DecryptUpdate(c.get(), nullptr, &len, reinterpret_cast<const unsigned char*>(aad.data()),
                              static_cast<int>(aad.size())) == 1);
    if (n > 0)
        REQUIRE(EVP_DecryptUpdate(c.get(), reinterpret_cast<unsigned char*>(out), &len,
                                  reinterpret_cast<const unsigned char*>(in), static_cast<int>(n)) == 1);
    REQUIRE(EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_SET_TAG, 16, const_cast<char*>(tag)) == 1);
    unsigned char end[16];
    return EVP_DecryptFinal_ex(c.get(), end, &len) == 1;
}

/// aes-256-gcm stored form: a 64-byte prefix (key id, salt, segment size, 36 zero bytes),
/// then segments of ciphertext and a 16-byte tag, the last one shorter or equal.
std::string undo_aes(const std::string& stored, const std::string& header, const std::string& key,
                     std::uint64_t* segments = nullptr) {
    need(stored.size() >= 64 + 16, "a prefix and one tag");
    const std::string prefix = stored.substr(0, 64);
    need(prefix.substr(0, 8) == key_id(key), "the key's id");
    const std::string salt = prefix.substr(8, 16);
    const auto size = le(prefix, 24, 4);
    need(size >= 1 && size <= (1u << 30), "segment size 1 .. 2^30");
    need(prefix.substr(28) == std::string(36, '\0'), "zero reserved bytes");
    const std::string file_key = hkdf_sha256(key, salt, "ckpt aes-256-gcm body", 32);
    std::string aad = header.substr(0, 56);
    std::fill(aad.begin() + 16, aad.begin() + 32, '\0');  // body length and checksum
    aad += prefix;
    std::string out;
    std::uint64_t index = 0;
    for (std::size_t at = 64;; ++index) {
        const std::size_t left = stored.size() - at;
        const bool last = left <= size + 16;
        need(left >= 16, "a whole tag");
        const std::size_t n = last ? left - 16 : size;
        std::string plain(n, '\0');
        need(open_segment(file_key, index, last, aad, stored.data() + at, n, stored.data() + at + n, plain.data()),
             "segment " + std::to_string(index) + " authenticates");
        out += plain;
        at += n + 16;
        if (last) break;
    }
    if (segments) *segments = index + 1;
    return out;
}

/// A whole file's body with its codec stages (header bytes 13..15) undone, last applied first.
std::string undo_codecs(const std::string& file, const std::string& key, ZstdBlocks* blocks = nullptr,
                        std::uint64_t* segments = nullptr) {
    std::string body = body_of(file);
    for (int stage = 2; stage >= 0; --stage) {
        switch (static_cast<unsigned char>(file[13 + static_cast<std::size_t>(stage)])) {
            case 0: break;
            case 1: body = undo_zstd(body, blocks); break;
            case 2: body = undo_aes(body, file, key, segments); break;
            default: throw Undecodable("codec id");
        }
    }
    return body;
}

/// The version-1 golden file of the same archive kind: the body without codecs.
std::string plain_golden_body(ckpt::ArchiveKind archive) {
    for (const Golden& g : goldens)
        if (g.version == 1 && g.archive == archive) return body_of(file_bytes(golden_path(g.file)));
    FAIL("no version-1 golden file of that archive kind");
    return {};
}

/// The bytes of a string literal, embedded zeros included (without the final one).
template <std::size_t N>
std::string bytes(const char (&s)[N]) {
    return std::string(s, N - 1);
}

/// The body as a reader written from FORMAT.md sees it.
ckpt::ParamDict read_independently(const Golden& g, const std::string& body) {
    switch (g.archive) {
        case ckpt::ArchiveKind::binary: {
            BinaryBody in;
            in.b = body;
            in.chunked = g.version == 3;
            return read_entries(in);
        }
        case ckpt::ArchiveKind::text: {
            TextBody in{{}, body};
            CHECK(in.token() == "22");
            CHECK(in.token() == "serialization::archive");
            CHECK(in.u64("library version") >= 1);
            return read_entries(in);
        }
        case ckpt::ArchiveKind::xml: {
            const std::string prologue =
                "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\" ?>\n"
                "<!DOCTYPE boost_serialization>\n"
                "<boost_serialization signature=\"serialization::archive\" version=\"";
            REQUIRE(body.compare(0, prologue.size(), prologue) == 0);
            const auto open_end = body.find("\">\n", prologue.size());
            REQUIRE(open_end != std::string::npos);
            XmlBody in{{}, body, open_end + 3};
            return read_entries(in);
        }
    }
    FAIL("unknown archive");
    return {};
}

/// The golden file of column-major tensors (FORMAT.md section 3.1): format version 1, binary.
constexpr Golden column_major_golden{"v1-column-major.ckpt", ckpt::ArchiveKind::binary, 0, 1, {0, 0, 0}, 9, 3600};

/// What a reader that does not know storage order records sees of `state`: each column-major
/// tensor as the row-major tensor of its bytes (the transpose), followed by its record.
ckpt::ParamDict as_stored(const ckpt::ParamDict& state) {
    ckpt::ParamDict out;
    for (const auto& [name, value] : state) {
        const ckpt::Tensor* t = value.get_if<ckpt::Tensor>();
        if (!t || t->order() == ckpt::Order::row_major) {
            out.set(name, value);
            continue;
        }
        out.set(name, ckpt::Tensor::view(t->dtype(), t->shape(), const_cast<std::byte*>(t->data())));
        out.set("__ckpt.order." + name, "column_major");
    }
    return out;
}

}  // namespace

TEST_SUITE("golden") {

TEST_CASE("every golden file verifies and its header records the archive kind, codecs, epoch and step") {
    for (const Golden& g : goldens) {
        CAPTURE(g.file);
        const std::string path = golden_path(g.file);
        const ckpt::FileHeader v = ckpt::verify_checkpoint(path);  // no key: the checksum covers the stored bytes
        CHECK(v.archive == g.archive);
        CHECK(ckpt::verify_checkpoint(path, {.archive = g.archive}).body_length == v.body_length);
        const ckpt::FileHeader h = ckpt::read_header(path);
        CHECK(h.version == g.version);
        CHECK(h.archive == g.archive);
        for (std::size_t i = 0; i < 3; ++i) CHECK(static_cast<unsigned>(h.codecs[i]) == g.codecs[i]);
        CHECK(h.epoch == g.epoch);
        CHECK(h.step == g.step);
        CHECK(h.body_length == test::fs::file_size(path) - 64);
        CHECK(h.save_time_ns > 1'700'000'000'000'000'000);  // written after November 2023
    }
}

TEST_CASE("every golden file loads with exactly the entries it was written with") {
    const ckpt::ParamDict want = golden_state();
    for (const Golden& g : goldens) {
        CAPTURE(g.file);
        const ckpt::ParamDict got = ckpt::load_checkpoint(golden_path(g.file), with_golden_key());
        check_entries(got, want);
        CHECK(got == want);
        CHECK(got.get<std::int64_t>("int64") == -9007199254740993);
        CHECK(got.get<std::string>("string.utf8") == "Gr\u00fc\u00dfe \u65e5\u672c \u2713 <a & b> \"q\" 'x'\ttab");
        CHECK(got.get<std::string>("string.empty").empty());
        CHECK(got.tensor("f32.empty").numel() == 0);
        CHECK(got.tensor("f32.rank0").rank() == 0);
    }
}

TEST_CASE("the encrypted golden files need their key, and tell another key from damage") {
    std::string other(32, '\x5a');
    ckpt::LoadOptions other_key;
    other_key.key = ckpt::Key::from_bytes(other);
    const std::string other_id = key_id(other);
    // FORMAT.md's key id of the test key, and the other key's
    const std::string ids = "key id 35c37aad6d66b291; the key given has id " +
                            ckpt::detail::hex_bytes(reinterpret_cast<const unsigned char*>(other_id.data()), 8);
    for (const Golden& g : goldens) {
        if (g.codecs[0] != 2 && g.codecs[1] != 2) continue;
        CAPTURE(g.file);
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(golden_path(g.file)), doctest::Contains("needs its key"),
                             ckpt::KeyError);
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint(golden_path(g.file), other_key), doctest::Contains(ids.c_str()),
                             ckpt::KeyError);
    }
}

TEST_CASE("the binary golden files load into existing tensors") {
    for (const char* file : {"v1-binary.ckpt", "v2-zstd.ckpt"}) {
        CAPTURE(file);
        const ckpt::ParamDict want = golden_state();
        ckpt::ParamDict target;
        for (const auto& e : want)
            if (const ckpt::Tensor* t = e.value.get_if<ckpt::Tensor>())
                target.set(e.name, ckpt::Tensor(t->dtype(), t->shape()));
        const void* f32_memory = target.tensor("f32.rank2").data();
        const ckpt::LoadReport report = ckpt::load_checkpoint_into(golden_path(file), target, /*strict=*/true,
                                                                   {.archive = ckpt::ArchiveKind::binary});
        CHECK(report.complete());
        CHECK(report.mismatches.empty());
        CHECK(target.tensor("f32.rank2").data() == f32_memory);  // filled in place
        for (const auto& e : want) {
            CAPTURE(e.name);
            if (const ckpt::Tensor* t = e.value.get_if<ckpt::Tensor>()) {
                CHECK(target.tensor(e.name) == *t);
                CHECK_FALSE(report.rest.contains(e.name));
            } else {
                REQUIRE(report.rest.contains(e.name));
            }
        }
        std::vector<std::string> rest;
        for (const auto& e : report.rest) rest.push_back(e.name);
        CHECK(rest == std::vector<std::string>{"int64", "double", "bool.true", "string", "string.empty", "string.utf8",
                                               "bool.false"});
        CHECK(report.rest.get<std::string>("string.utf8") == want.get<std::string>("string.utf8"));
        CHECK(std::bit_cast<std::uint64_t>(report.rest.get<double>("double")) == std::bit_cast<std::uint64_t>(0.1));
    }
}

TEST_CASE("the golden headers hold the bytes FORMAT.md gives") {
    for (const Golden& g : goldens) {
        CAPTURE(g.file);
        const std::string b = file_bytes(golden_path(g.file));
        REQUIRE(b.size() > 64);
        CHECK(b.substr(0, 8) == bytes("\x89" "CKPT\r\n\x1a"));
        CHECK(le(b, 8, 4) == g.version);  // little-endian
        CHECK(le(b, 12, 1) == g.kind_code);
        for (std::size_t i = 0; i < 3; ++i) CHECK(le(b, 13 + i, 1) == g.codecs[i]);
        CHECK(le(b, 16, 8) == b.size() - 64);
        CHECK(le(b, 24, 8) == XXH3_64bits(b.data() + 64, b.size() - 64));
        CHECK(le(b, 24, 8) == XXH3_64bits_withSeed(b.data() + 64, b.size() - 64, 0));
        CHECK(le(b, 32, 8) == static_cast<std::uint64_t>(g.epoch));
        CHECK(le(b, 40, 8) == static_cast<std::uint64_t>(g.step));
        CHECK(le(b, 56, 8) == XXH3_64bits(b.data(), 56));
    }
    // Byte by byte, as in the worked example of FORMAT.md.
    const std::string bin = file_bytes(golden_path("v1-binary.ckpt"));
    CHECK(bin.substr(8, 40) == bytes("\x01\0\0\0" "\0\0\0\0"           // version 1, archive binary
                                     "\x00\x05\0\0\0\0\0\0"             // body length 1280
                                     "\xe8\x9e\x69\x5a\x72\x86\xa2\x87"  // body xxh3 0x87a286725a699ee8
                                     "\x03\0\0\0\0\0\0\0"               // epoch 3
                                     "\xb0\x04\0\0\0\0\0\0"));          // step 1200
    // And the version-2 example: the compressed file's header and its first block header.
    const std::string zst = file_bytes(golden_path("v2-zstd.ckpt"));
    CHECK(zst.substr(8, 40) == bytes("\x02\0\0\0" "\0\x01\0\0"          // version 2, archive binary, codecs zstd
                                     "\x19\x02\0\0\0\0\0\0"             // body length 537
                                     "\x6a\x40\x96\x77\x06\xdc\xf2\x42"  // body xxh3 0x42f2dc067796406a
                                     "\x06\0\0\0\0\0\0\0"               // epoch 6
                                     "\x60\x09\0\0\0\0\0\0"));          // step 2400
    CHECK(zst.substr(64, 12) == bytes("\0\x05\0\0" "\x11\x02\0\0"   // input 1280 bytes, stored 529
                                      "\x28\xb5\x2f\xfd"));          // a zstd frame's magic number
    CHECK(zst.size() == 64 + 8 + 529);
    // The encrypted files' prefixes: the test key's id, the salt, segment size 1 MiB, zeros.
    for (const char* file : {"v2-aes-256-gcm.ckpt", "v2-zstd-aes-256-gcm.ckpt"}) {
        CAPTURE(file);
        const std::string enc = file_bytes(golden_path(file));
        CHECK(enc.substr(64, 8) == bytes("\x35\xc3\x7a\xad\x6d\x66\xb2\x91"));
        CHECK(enc.substr(64 + 24, 40) == bytes("\0\0\x10\0") + std::string(36, '\0'));
    }
}

TEST_CASE("the binary golden body starts with the bytes FORMAT.md gives") {
    const std::string body = body_of(file_bytes(golden_path("v1-binary.ckpt")));
    const std::string start = bytes("\x10\0\0\0\0\0\0\0"                    // entries: 16 (u64)
                            "\x09\0\0\0\0\0\0\0" "f32.rank2"         // name: length (u64), bytes
                            "\0\0\0\0"                               // kind 0: tensor (u32)
                            "\0\0\0\0"                               // dtype 0: float32 (u32)
                            "\x02\0\0\0"                             // rank 2 (u32)
                            "\x02\0\0\0\0\0\0\0" "\x03\0\0\0\0\0\0\0"  // dims 2, 3 (i64 each)
                            "\x18\0\0\0\0\0\0\0"                     // nbytes 24 (u64)
                            "\x05\0\0\0\0\0\0\0" "int64"             // name
                            "\x01\0\0\0"                             // kind 1: int64
                            "\xff\xff\xff\xff\xff\xff\xdf\xff"       // -9007199254740993 (i64)
                            "\x09\0\0\0\0\0\0\0" "f64.rank1");
    CHECK(body.substr(0, start.size()) == start);
    // The double scalar 0.1 right after its kind, as IEEE 754 binary64, little-endian.
    const std::string double_entry = bytes("\x06\0\0\0\0\0\0\0" "double" "\x02\0\0\0");
    const auto d = body.find(double_entry);
    REQUIRE(d != std::string::npos);
    CHECK(body.substr(d + double_entry.size(), 8) == bytes("\x9a\x99\x99\x99\x99\x99\xb9\x3f"));
    // The first payload (f32.rank2): a pad of 5 and five zero bytes, then the floats at body
    // offset 704 = 11 * 64, as little-endian IEEE 754 binary32.
    CHECK(body.substr(695, 9) == bytes("\x05\0\0\0" "\0\0\0\0\0"));
    CHECK(body.substr(704, 24) == bytes("\0\0\xc0\xbf" "\0\0\x80\xbe" "\0\0\0\0" "\0\0\0\x3f"
                                        "\0\0\x49\x40" "\x6f\x12\x83\x3a"));
    // The last tensor is empty: its pad ends the body at a multiple of 64.
    CHECK(body.size() == 1280);
    CHECK(body.substr(1220, 4) == bytes("\x38\0\0\0"));
    CHECK(body.substr(1224) == std::string(56, '\0'));
}

TEST_CASE("the text and xml golden bodies start and end with the bytes FORMAT.md gives") {
    const std::string text = body_of(file_bytes(golden_path("v1-text.ckpt")));
    CHECK(text.rfind("22 serialization::archive 18 16 9\n\nZjMyLnJhbmsy\n0 0 2 2 3 24 5\n\naW50NjQ=\n"
                     "1 -9007199254740993 9\n\nZjY0LnJhbmsx\n0 1 1 5 40 6\n\nZG91Ymxl\n2 1.00000000000000006e-01 9\n",
                     0) == 0);
    CHECK(text.find("\n4 0\n\n8\n\n") != std::string::npos);  // the empty string: length 0, no block
    CHECK(text.ends_with("\n\nAAAqQg==\n\n"));  // f32.rank0's payload, then the empty one's
    // u8.rank3's 96 bytes: 128 base64 characters, a line break after the first 76
    const std::string u8_base64 =
        "\n\nAAECf4DI/v8zWH2ix+wRNluApcrvFDleg6jN8hc8YYar0PUaP2SJrtP4HUJnjLHW+yBFao+02f4j\n"
        "SG2St9wBJktwlbrfBClOc5i94gcsUXabwOUKL1R5nsPoDTJXfKHG\n";
    CHECK(text.find(u8_base64) != std::string::npos);
    const std::string xml = body_of(file_bytes(golden_path("v1-xml.ckpt")));
    CHECK(xml.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\" ?>\n"
                    "<!DOCTYPE boost_serialization>\n"
                    "<boost_serialization signature=\"serialization::archive\" version=\"18\">\n"
                    "<entries>16</entries>\n<name>f32.rank2</name>\n<kind>0</kind>\n<dtype>0</dtype>\n<rank>2</rank>\n"
                    "<dim>2</dim>\n<dim>3</dim>\n<nbytes>24</nbytes>\n<name>int64</name>\n<kind>1</kind>\n"
                    "<value>-9007199254740993</value>\n",
                    0) == 0);
    CHECK(xml.find("<value>Gr\u00fc\u00dfe \u65e5\u672c \u2713 &lt;a &amp; b&gt; &quot;q&quot; &apos;x&apos;\ttab</value>") !=
          std::string::npos);
    CHECK(xml.find("<data>\nAADAvwAAgL4AAAAAAAAAPwAASUBvEoM6\n</data>\n") != std::string::npos);
    CHECK(xml.find("<data>" + u8_base64.substr(1) + "</data>\n") != std::string::npos);
    CHECK(xml.ends_with("</data>\n<data>\n</data>\n</boost_serialization>\n\n"));
}

TEST_CASE("a reader written from FORMAT.md alone reads every golden file") {
    const ckpt::ParamDict want = golden_state();
    const std::string key = golden_key_bytes();
    for (const Golden& g : goldens) {
        CAPTURE(g.file);
        const std::string file = file_bytes(golden_path(g.file));
        std::string body;
        REQUIRE_NOTHROW(body = undo_codecs(file, key));
        check_entries(read_independently(g, body), want);
    }
}

TEST_CASE("the codec stages of every version-2 golden body, undone as FORMAT.md says, give the body without codecs") {
    const std::string key = golden_key_bytes();
    int seen = 0;
    for (const Golden& g : goldens) {
        if (g.version != 2) continue;
        CAPTURE(g.file);
        const std::string file = file_bytes(golden_path(g.file));
        ZstdBlocks blocks;
        std::uint64_t segments = 0;
        std::string body;
        REQUIRE_NOTHROW(body = undo_codecs(file, key, &blocks, &segments));
        CHECK(body == plain_golden_body(g.archive));
        const bool zstd = g.codecs[0] == 1, aes = g.codecs[0] == 2 || g.codecs[1] == 2;
        CHECK(blocks.compressed == (zstd ? 1 : 0));  // small bodies: one block, and it shrinks
        CHECK(segments == (aes ? 1u : 0u));
        if (aes) {
            // What the tag covers: the header (epoch here) and every stored byte; and the key.
            std::string altered = file;
            altered[32] ^= 1;
            CHECK_THROWS_WITH_AS(undo_codecs(altered, key), "segment 0 authenticates", Undecodable);
            altered = file;
            altered[64 + 64 + 5] ^= 0x10;  // ciphertext
            CHECK_THROWS_WITH_AS(undo_codecs(altered, key), "segment 0 authenticates", Undecodable);
            altered = file;
            altered[64 + 8] ^= 1;  // salt: another file key
            CHECK_THROWS_WITH_AS(undo_codecs(altered, key), "segment 0 authenticates", Undecodable);
            std::string other = key;
            other[0] ^= 1;
            CHECK_THROWS_WITH_AS(undo_codecs(file, other), "the key's id", Undecodable);
        }
        ++seen;
    }
    CHECK(seen == 3);
}

TEST_CASE("today's writer produces the golden bodies byte for byte at this format version") {
    // A change to what save_checkpoint writes must come with a new format version (and new
    // golden files for it), never as a reinterpretation of version 1. Text and xml files
    // without codecs are still written as version 1, and binary ones with chunk_bytes 0;
    // binary ones are version 3 by default.
    REQUIRE_MESSAGE(ckpt::format_version_plain == 1,
                    "format version " << ckpt::format_version_plain << " needs golden files of its own in tests/golden/");
    test::TempDir tmp;
    const std::string library_version =
        std::to_string(static_cast<unsigned>(boost::archive::BOOST_ARCHIVE_VERSION()));
    for (const Golden& g : goldens) {
        if (g.version == 2) continue;  // codecs: the salt is random, and zstd's output may change with libzstd
        CAPTURE(g.file);
        const auto path = tmp / g.file;
        ckpt::SaveOptions o{.archive = g.archive, .epoch = g.epoch, .step = g.step};
        if (g.version == 1 && g.archive == ckpt::ArchiveKind::binary) o.chunk_bytes = 0;
        if (g.version == 3) o.chunk_bytes = golden_chunk_bytes;
        ckpt::save_checkpoint(golden_state(), path, o);
        const std::string now = file_bytes(path.string());
        std::string want = file_bytes(golden_path(g.file));
        CHECK(now.substr(0, 16) == want.substr(0, 16));   // magic, version, archive kind
        CHECK(now.substr(32, 16) == want.substr(32, 16));  // epoch, step
        want = body_of(want);
        // Text and xml bodies name the Boost archive version that wrote them (18: Boost 1.74).
        if (g.archive == ckpt::ArchiveKind::text) want.replace(want.find(" 18 "), 4, " " + library_version + " ");
        if (g.archive == ckpt::ArchiveKind::xml)
            want.replace(want.find("version=\"18\""), 12, "version=\"" + library_version + "\"");
        CHECK(body_of(now) == want);
    }
}

TEST_CASE("today's writer stores codec stages as FORMAT.md says") {
    // Golden files of format version 2 hold one small block and one segment; here a body of
    // several zstd blocks (stored as is and compressed) and several AES segments, written now,
    // undone by the reader of this file.
    REQUIRE_MESSAGE(ckpt::format_version_codecs == 2,
                    "format version " << ckpt::format_version_codecs << " needs golden files of its own in tests/golden/");
    ckpt::ParamDict state = golden_state();
    std::vector<std::uint8_t> noise(4352u << 10);  // does not compress; over 4 MiB: several segments
    std::mt19937 rng(7);
    for (auto& v : noise) v = static_cast<std::uint8_t>(rng());
    state.set("noise", ckpt::Tensor::from(noise, {static_cast<std::int64_t>(noise.size())}));
    state.set("zeros", ckpt::Tensor(ckpt::DType::float32, {1 << 18}));  // 1 MiB that does
    const std::string key = golden_key_bytes();
    const ckpt::Key ckpt_key = ckpt::Key::from_bytes(key);
    test::TempDir tmp;
    ckpt::save_checkpoint(state, tmp / "plain.ckpt", {.chunk_bytes = 0});  // the body the codecs encode
    const std::string plain = body_of(file_bytes((tmp / "plain.ckpt").string()));
    struct Case {
        const char* name;
        ckpt::CodecChain codecs;
        std::string header_codecs;
    };
    const ckpt::CodecChain both = ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>{ckpt::Zstd{3}, ckpt::AesGcm{ckpt_key}}.codecs();
    const Case cases[] = {{"zstd", ckpt::Zstd{3}.codecs(), bytes("\x01\0\0")},
                          {"aes-256-gcm", ckpt::AesGcm{ckpt_key}.codecs(), bytes("\x02\0\0")},
                          {"zstd+aes-256-gcm", both, bytes("\x01\x02\0")}};
    for (const Case& c : cases) {
        CAPTURE(c.name);
        const auto path = tmp / "coded.ckpt";
        ckpt::save_checkpoint(state, path, {.epoch = 9, .step = 90, .codecs = c.codecs});
        const std::string file = file_bytes(path.string());
        CHECK(file.substr(8, 8) == bytes("\x02\0\0\0" "\0") + c.header_codecs);
        CHECK(le(file, 24, 8) == XXH3_64bits(file.data() + 64, file.size() - 64));  // the stored bytes
        ZstdBlocks blocks;
        std::uint64_t segments = 0;
        std::string body;
        REQUIRE_NOTHROW(body = undo_codecs(file, key, &blocks, &segments));
        CHECK(body == plain);
        if (c.codecs.front().id == ckpt::CodecId::zstd) {
            CHECK(blocks.raw >= 1);
            CHECK(blocks.compressed >= 1);
            // Blocks of at most 1 MiB; the writer may end one early where a payload begins.
            const auto at_least = static_cast<int>((plain.size() + (1u << 20) - 1) >> 20);
            CHECK(blocks.raw + blocks.compressed >= at_least);
            CHECK(blocks.raw + blocks.compressed <= at_least + static_cast<int>(state.size()));
        }
        if (c.codecs.back().id == ckpt::CodecId::aes_256_gcm) {
            CHECK(segments >= 2);
            // The last segment says it is the last: a file cut at a segment boundary fails.
            std::string cut = file;
            const std::uint64_t segment_size = le(file, 64 + 24, 4);
            cut.resize(64 + 64 + segment_size + 16);
            CHECK_THROWS_WITH_AS(undo_codecs(cut, key), "segment 0 authenticates", Undecodable);
        }
    }
}

TEST_CASE("the column-major golden file loads in its orders, and its bytes are what FORMAT.md gives") {
    const Golden& g = column_major_golden;
    const std::string path = golden_path(g.file);
    const ckpt::FileHeader h = ckpt::verify_checkpoint(path);
    CHECK(h.version == 1);
    CHECK(h.archive == ckpt::ArchiveKind::binary);
    CHECK(h.epoch == 9);
    CHECK(h.step == 3600);
    const ckpt::ParamDict want = test::golden_column_major_state();
    const ckpt::ParamDict got = ckpt::load_checkpoint(path);
    check_entries(got, want);
    CHECK(got == want);
    CHECK(got.tensor("f64.column_major").describe() == "float64[2, 3] column-major");
    CHECK(got.tensor("f64.column_major").in_order(ckpt::Order::row_major) == got.tensor("f64.row_major"));
    // the table of contents: the logical shapes and orders, the records folded in
    std::vector<std::string> names;
    for (const auto& e : ckpt::read_contents(path).entries) {
        names.push_back(e.name);
        if (e.kind == ckpt::ValueKind::tensor) {
            CAPTURE(e.name);
            CHECK(e.order == want.tensor(e.name).order());
            CHECK(e.logical_shape() == want.tensor(e.name).logical_shape());
        }
    }
    CHECK(names == std::vector<std::string>{"f64.column_major", "f64.row_major", "step", "f32.rank3", "i32.square",
                                            "f32.empty"});
    // into row-major tensors: every element moved to its place, the square one not transposed
    ckpt::ParamDict target;
    for (const auto& e : want)
        if (const ckpt::Tensor* t = e.value.get_if<ckpt::Tensor>())
            target.set(e.name, ckpt::Tensor(t->dtype(), t->logical_shape()));
    CHECK(ckpt::load_checkpoint_into(path, target, true).complete());
    for (const auto& e : want)
        if (const ckpt::Tensor* t = e.value.get_if<ckpt::Tensor>())
            CHECK_MESSAGE(target.tensor(e.name) == t->in_order(ckpt::Order::row_major), e.name);
    const auto square = target.tensor("i32.square").values<std::int32_t>();
    CHECK(std::vector<std::int32_t>(square.begin(), square.end()) ==
          std::vector<std::int32_t>{-4, -3, -2, -1, 0, 1, 2, 3, 4});  // s(i, j) = 3 i + j - 4, row by row

    // bytes: the first entry with its dims reversed, then its record
    const std::string body = body_of(file_bytes(path));
    CHECK(body.substr(0, 8) == bytes("\x0a\0\0\0\0\0\0\0"));  // 6 entries and 4 records
    const std::string first = bytes("\x10\0\0\0\0\0\0\0" "f64.column_major"   // name
                                    "\0\0\0\0" "\x01\0\0\0" "\x02\0\0\0"        // tensor, float64, rank 2
                                    "\x03\0\0\0\0\0\0\0" "\x02\0\0\0\0\0\0\0"  // dims 3, 2: the transpose's
                                    "\x30\0\0\0\0\0\0\0"                        // nbytes 48
                                    "\x1d\0\0\0\0\0\0\0" "__ckpt.order.f64.column_major"
                                    "\x04\0\0\0"                                    // kind 4: string
                                    "\x0c\0\0\0\0\0\0\0" "column_major");
    CHECK(body.substr(8, first.size()) == first);
    // a reader written from FORMAT.md alone, which knows nothing of the records, reads the
    // transposes under the reversed shapes, and the records as strings
    check_entries(read_independently(g, body), as_stored(want));
    // today's writer writes the same body
    test::TempDir tmp;
    ckpt::save_checkpoint(want, tmp / "now.ckpt", {.epoch = g.epoch, .step = g.step, .chunk_bytes = 0});
    CHECK(body_of(file_bytes((tmp / "now.ckpt").string())) == body);
}

}  // TEST_SUITE
