// Writes the shared corpus of hostile files (tests/hostile/) and its manifest, cases.json: for
// every file, the reader that takes it, the verdict a full load must give (the class of the
// error, or "ok") and a fragment its message must hold. The C++ suite (tests/test_hostile.cpp)
// and the Python suite read the manifest; both languages must give every case its verdict.
//
//   cmake --build build --target make_hostile && build/tests/make_hostile tests/hostile
//
// Every file is built here byte by byte (zip archives, pickles, checkpoint headers) with fixed
// times, so that a file changes only when its case does; only the encrypted case differs from
// run to run (its salt is random). Keep the whole corpus small: each file stands for one way a
// file from elsewhere can lie, not for a large one.
#include "../../fuzz/reader_input.hpp"

#include <zlib.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

namespace fs = boost::filesystem;

struct Case {
    std::string file, format, expect, contains, why;
};

std::vector<Case> cases;
fs::path out_dir;

/// Writes `bytes` as `file` and records its case. `keep`: a file already there stays (one whose
/// bytes differ from run to run, though its case does not).
void add(const std::string& file, const std::string& format, const std::string& bytes, const std::string& expect,
         const std::string& contains, const std::string& why, bool keep = false) {
    if (!keep || !fs::exists(out_dir / file))
        std::ofstream((out_dir / file).string(), std::ios::binary | std::ios::trunc) << bytes;
    cases.push_back({file, format, expect, contains, why});
}

std::string read_file(const fs::path& p) {
    std::ifstream in(p.string(), std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void put64(std::string& out, std::uint64_t v) {
    fuzz::put32(out, static_cast<std::uint32_t>(v));
    fuzz::put32(out, static_cast<std::uint32_t>(v >> 32));
}

// ---------------------------------------------------------------------------------------------
// checkpoints

/// A fixed save time (2026-01-01T00:00:00Z), so that the files do not change between runs.
constexpr std::int64_t fixed_time_ns = 1'767'225'600'000'000'000;

/// The body `dict` saves to, through `opts` (archive, codecs).
std::string body_of(const ckpt::ParamDict& dict, const ckpt::SaveOptions& opts = {}) {
    const fs::path tmp = out_dir / ".body.tmp";
    ckpt::save_checkpoint(dict, tmp, opts);
    std::string file = read_file(tmp);
    fs::remove(tmp);
    return file.substr(ckpt::header_size);
}

/// A whole checkpoint file: a header with the fixed time, the body's length and checksum.
std::string checkpoint(const std::string& body, ckpt::ArchiveKind archive = ckpt::ArchiveKind::binary,
                       std::initializer_list<ckpt::CodecId> codecs = {}) {
    ckpt::FileHeader h = fuzz::codec_header(codecs);
    if (codecs.size() == 0) h.version = ckpt::format_version_plain;
    h.archive = archive;
    h.epoch = 1;
    h.step = 2;
    h.save_time_ns = fixed_time_ns;
    return fuzz::with_header(h, body);
}

/// Binary body fields, as docs/FORMAT.md section 4 lays them out.
struct BinaryBody {
    std::string s;
    BinaryBody& u32(std::uint32_t v) { return fuzz::put32(s, v), *this; }
    BinaryBody& u64(std::uint64_t v) { return put64(s, v), *this; }
    BinaryBody& str(const std::string& v) { return u64(v.size()), s += v, *this; }
};

// ---------------------------------------------------------------------------------------------
// zip archives (npz, PyTorch files)

struct Member {
    std::string name, data;
    bool deflate = false;
    std::optional<std::uint64_t> claimed_size;  ///< an uncompressed size other than the data's
    bool zip64 = false;                         ///< sizes in a zip64 extra field
    std::string comment;
};

std::string deflated(const std::string& data) {
    z_stream z{};
    if (deflateInit2(&z, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY) != Z_OK) throw std::runtime_error("deflateInit2");
    std::string out(deflateBound(&z, data.size()), '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    z.avail_in = static_cast<uInt>(data.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    if (deflate(&z, Z_FINISH) != Z_STREAM_END) throw std::runtime_error("deflate");
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

/// A zip archive of `members`, each with its true CRC-32, dated 1980-01-01.
std::string zip_archive(const std::vector<Member>& members) {
    std::string z;
    std::vector<std::uint64_t> local_at;
    std::vector<std::string> stored;
    for (const auto& m : members) stored.push_back(m.deflate ? deflated(m.data) : m.data);
    // version needed, flags, method, time, date, crc, sizes, name length, extra length
    auto common = [&](std::size_t k) {
        const Member& m = members[k];
        const std::uint64_t size = m.claimed_size.value_or(m.data.size()), comp = stored[k].size();
        // the UTF-8 flag only for names beyond ASCII, as Python's zipfile (and so NumPy) sets it
        const bool ascii = std::all_of(m.name.begin(), m.name.end(), [](char c) { return (c & 0x80) == 0; });
        fuzz::put16(z, m.zip64 ? 45 : 20), fuzz::put16(z, ascii ? 0 : 0x800), fuzz::put16(z, m.deflate ? 8 : 0);
        fuzz::put16(z, 0), fuzz::put16(z, 0x21);
        fuzz::put32(z, fuzz::crc32(m.data));
        fuzz::put32(z, m.zip64 ? 0xffffffffu : static_cast<std::uint32_t>(comp));
        fuzz::put32(z, m.zip64 ? 0xffffffffu : static_cast<std::uint32_t>(size));
        fuzz::put16(z, static_cast<std::uint32_t>(m.name.size()));
        fuzz::put16(z, m.zip64 ? 20 : 0);
    };
    auto zip64_extra = [&](std::size_t k) {
        if (!members[k].zip64) return;
        fuzz::put16(z, 1), fuzz::put16(z, 16);
        put64(z, members[k].claimed_size.value_or(members[k].data.size()));
        put64(z, stored[k].size());
    };
    for (std::size_t k = 0; k < members.size(); ++k) {
        local_at.push_back(z.size());
        fuzz::put32(z, 0x04034b50u);
        common(k);
        z += members[k].name;
        zip64_extra(k);
        z += stored[k];
    }
    const auto cd_offset = static_cast<std::uint32_t>(z.size());
    for (std::size_t k = 0; k < members.size(); ++k) {
        fuzz::put32(z, 0x02014b50u);
        fuzz::put16(z, members[k].zip64 ? 45 : 20);  // version made by
        common(k);
        fuzz::put16(z, static_cast<std::uint32_t>(members[k].comment.size()));
        fuzz::put16(z, 0), fuzz::put16(z, 0), fuzz::put32(z, 0);  // disk, attributes
        fuzz::put32(z, static_cast<std::uint32_t>(local_at[k]));
        z += members[k].name;
        zip64_extra(k);
        z += members[k].comment;
    }
    const auto cd_size = static_cast<std::uint32_t>(z.size()) - cd_offset;
    const auto count = static_cast<std::uint32_t>(members.size());
    fuzz::put32(z, 0x06054b50u);
    fuzz::put16(z, 0), fuzz::put16(z, 0), fuzz::put16(z, count), fuzz::put16(z, count);
    fuzz::put32(z, cd_size), fuzz::put32(z, cd_offset), fuzz::put16(z, 0);
    return z;
}

// ---------------------------------------------------------------------------------------------
// npz

template <class T>
std::string raw(const std::vector<T>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string npy(std::string_view descr, const ckpt::Shape& shape, const std::string& data) {
    return ckpt::detail::npy_header(descr, shape) + data;
}

// ---------------------------------------------------------------------------------------------
// PyTorch files: pickles of protocol 2 as torch.save writes them

struct Pickle {
    std::string s = "\x80\x02";
    Pickle& op(char c) { return s += c, *this; }
    Pickle& str(std::string_view v) {
        s += 'X';
        fuzz::put32(s, static_cast<std::uint32_t>(v.size()));
        return s += v, *this;
    }
    Pickle& integer(std::int64_t v) {
        if (v >= 0 && v < 256) return s += 'K', s += static_cast<char>(v), *this;
        if (v >= INT32_MIN && v <= INT32_MAX) return s += 'J', fuzz::put32(s, static_cast<std::uint32_t>(v)), *this;
        s += "\x8a\x08";
        return put64(s, static_cast<std::uint64_t>(v)), *this;
    }
    Pickle& global(std::string_view module, std::string_view name) {
        s += 'c';
        s += module;
        s += '\n';
        s += name;
        return s += '\n', *this;
    }
    Pickle& tuple(const std::vector<std::int64_t>& items) {
        op('(');
        for (auto v : items) integer(v);
        return op('t');
    }
    /// torch._utils._rebuild_tensor_v2 of storage `key` (of `type`, e.g. "FloatStorage").
    Pickle& tensor(std::string_view type, std::string_view key, std::int64_t numel, std::int64_t offset,
                   const std::vector<std::int64_t>& size, const std::vector<std::int64_t>& stride) {
        global("torch._utils", "_rebuild_tensor_v2").op('(');
        op('(').str("storage").global("torch", type).str(key).str("cpu").integer(numel).op('t').op('Q');
        integer(offset).tuple(size).tuple(stride).op('\x89');
        global("collections", "OrderedDict").op(')').op('R');
        return op('t').op('R');
    }
    std::string done() { return s + "."; }
};

/// A torch.save file: the pickle and the storages "0", "1", ... as records of "archive/".
std::string torch_file(const std::string& pickle, const std::vector<std::string>& storages, bool deflate_pickle = false,
                       bool deflate_storages = false) {
    std::vector<Member> members{{"archive/data.pkl", pickle, deflate_pickle}};
    for (std::size_t k = 0; k < storages.size(); ++k)
        members.push_back({"archive/data/" + std::to_string(k), storages[k], deflate_storages});
    members.push_back({"archive/version", "3\n"});
    return zip_archive(members);
}

// ---------------------------------------------------------------------------------------------

void checkpoint_cases() {
    ckpt::ParamDict small;
    small.set("w", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
    small.set("step", std::int64_t{7});
    small.set("note", std::string("hello"));
    const std::string good = checkpoint(body_of(small));
    add("ok.ckpt", "ckpt", good, "ok", "", "a small binary checkpoint: the corpus's control");
    ckpt::SaveOptions xml;
    xml.archive = ckpt::ArchiveKind::xml;
    add("ok-xml.ckpt", "ckpt", checkpoint(body_of(small, xml), ckpt::ArchiveKind::xml), "ok", "",
        "the same checkpoint in an xml body");
    // an xml body may hold only the five entities: a character reference would be an ESC
    ckpt::ParamDict marked;
    marked.set("a&b<c>\"d'", ckpt::Tensor::from(std::vector<float>{1, 2}, {2}));
    marked.set("w", std::string("x"));
    std::string xml_body = body_of(marked, xml);
    add("xml-five-entities.ckpt", "ckpt", checkpoint(xml_body, ckpt::ArchiveKind::xml), "ok", "",
        "an xml body whose name holds the five entities it may");
    xml_body.replace(xml_body.find("<name>w</name>"), 14, "<name>&#27;]0;w&#7;</name>");
    add("xml-character-reference.ckpt", "ckpt", checkpoint(xml_body, ckpt::ArchiveKind::xml), "FormatError",
        "starts no entity", "an xml name holding &#27; (ESC), which Boost would decode");
    ckpt::SaveOptions zstd;
    zstd.codecs = ckpt::Zstd{3}.codecs();
    add("ok-zstd.ckpt", "ckpt", checkpoint(body_of(small, zstd), ckpt::ArchiveKind::binary, {ckpt::CodecId::zstd}), "ok",
        "", "the same checkpoint through zstd");

    // names and values that would drive a terminal: valid (FORMAT.md section 3), printed escaped
    ckpt::ParamDict loud;
    loud.set("\x1b]0;owned\x07", ckpt::Tensor::from(std::vector<float>{1}, {1}));
    loud.set("cr\rback", std::int64_t{1});
    loud.set("note", std::string("\x1b[2J\xc2\x9b" "31mred"));
    add("names-with-escapes.ckpt", "ckpt", checkpoint(body_of(loud)), "ok", "",
        "entry names and a string holding ESC, BEL, CR and a C1 control");
    ckpt::ParamDict bytes;
    bytes.set("w\xff", ckpt::Tensor::from(std::vector<float>{1}, {1}));
    bytes.set("s", std::string("\xfe\xff"));
    add("names-not-utf8.ckpt", "ckpt", checkpoint(body_of(bytes)), "ok", "",
        "an entry name and a string value that are not UTF-8");
    ckpt::Tensor flags(ckpt::DType::boolean, {3});
    std::memcpy(flags.data(), "\0\1\2", 3);
    ckpt::ParamDict flagged;
    flagged.set("flags", flags);
    flagged.set("../../x", std::int64_t{1});
    flagged.set("/etc/x", std::int64_t{2});
    flagged.set(std::string("a\0b", 3), std::int64_t{3});
    add("bool-tensor-byte-2.ckpt", "ckpt", checkpoint(body_of(flagged)), "ok", "",
        "a bool tensor holding the byte 2, and names unsafe as zip members: read, but exported nowhere");
    add("not-a-checkpoint.ckpt", "ckpt", "this is text, not a checkpoint\n", "FormatError", "not a ckpt checkpoint",
        "no magic bytes");
    add("bare-array.npy", "ckpt", npy("<f4", {2}, raw<float>({1, 2})), "FormatError", "not a ckpt checkpoint",
        "a bare NumPy .npy array, given where a checkpoint is read");
    add("truncated-header.ckpt", "ckpt", good.substr(0, 40), "FormatError", "truncated",
        "the magic, then less than the 64-byte header");
    std::string flipped = good;
    flipped[ckpt::header_size + 20] ^= 0x10;
    add("body-bit-flipped.ckpt", "ckpt", flipped, "ChecksumError", "corrupt", "one bit of the body flipped");
    std::string cut = good.substr(0, good.size() - 5);
    add("body-truncated.ckpt", "ckpt", cut, "FormatError", "truncated", "the body cut short of its header's length");
    {
        ckpt::FileHeader h;
        h.version = 99;
        h.save_time_ns = fixed_time_ns;
        add("version-99.ckpt", "ckpt", fuzz::with_header(h, good.substr(ckpt::header_size)), "VersionError",
            "format version 99", "a format version from the future, its header check right");
    }
    {
        ckpt::SaveOptions aes;
        aes.codecs = ckpt::AesGcm{ckpt::Key::from_bytes(std::string(32, 'k'))}.codecs();
        const fs::path tmp = out_dir / ".aes.tmp";
        ckpt::save_checkpoint(small, tmp, aes);
        add("encrypted-no-key.ckpt", "ckpt", read_file(tmp), "KeyError", "encrypted",
            "an aes-256-gcm body, read without its key", true);
        fs::remove(tmp);
    }
    // entry count near the body's size: the table must grow with what is read, not the count
    add("entry-count-huge.ckpt", "ckpt",
        checkpoint(BinaryBody().u64(1ull << 60).str("w").u32(1).u64(5).s), "FormatError", "entry count",
        "a table of contents claiming 2^60 entries");
    add("entry-count-near-body.ckpt", "ckpt",
        checkpoint(BinaryBody().u64(40).str("a").u32(1).u64(5).str(std::string(20, 'x')).s), "FormatError",
        "is malformed", "an entry count just under the body's size, the entries not there");
    add("name-length-huge.ckpt", "ckpt", checkpoint(BinaryBody().u64(1).u64(1ull << 62).s), "FormatError",
        "4611686018427387904", "a name claiming 2^62 bytes");
    add("duplicate-entry.ckpt", "ckpt", checkpoint(BinaryBody().u64(2).str("a").u32(1).u64(1).str("a").u32(1).u64(2).s),
        "FormatError", "appears twice", "one name twice in the table of contents");
    add("bool-value-2.ckpt", "ckpt", checkpoint(BinaryBody().u64(1).str("flag").u32(3).u32(2).s), "FormatError",
        "bool", "a bool scalar holding 2");
    add("rank-65.ckpt", "ckpt", checkpoint(BinaryBody().u64(1).str("t").u32(0).u32(0).u32(65).s), "FormatError",
        "rank 65", "a tensor of rank 65");
    // zstd blocks of zeros: 512 MiB from 25 KB, past the default budget (the larger of 256 MiB
    // and 64 times the stored body)
    {
        constexpr std::uint64_t mib = 1u << 20, blocks = 512;
        BinaryBody toc;
        toc.u64(1).str("z").u32(0).u32(5).u32(1);
        const std::uint64_t pad_at = toc.s.size() + 16 + 4;  // dim, nbytes, then the pad length
        const auto pad = static_cast<std::uint32_t>((64 - pad_at % 64) % 64);
        const std::uint64_t n = blocks * mib - (pad_at + pad);
        toc.u64(n).u64(n).u32(pad);
        toc.s.append(pad, '\0');
        std::string stored;
        std::string zeros(mib, '\0'), frame(ZSTD_compressBound(mib), '\0');
        for (std::uint64_t b = 0; b < blocks; ++b) {
            std::string block = zeros;
            if (b == 0) block.replace(0, toc.s.size(), toc.s);
            if (b < 2) frame.resize(ZSTD_compress(frame.data(), ZSTD_compressBound(mib), block.data(), mib, 3));
            fuzz::put32(stored, static_cast<std::uint32_t>(mib));
            fuzz::put32(stored, static_cast<std::uint32_t>(frame.size()));
            stored += frame;
            if (b < 1) frame.resize(ZSTD_compressBound(mib));
        }
        add("zstd-decodes-512m.ckpt", "ckpt", checkpoint(stored, ckpt::ArchiveKind::binary, {ckpt::CodecId::zstd}),
            "FormatError", "decodes to more than", "a zstd body of 25 KB that decodes to 512 MiB of zeros");
    }
    // the kinds of 0.2: bytes, lists of strings and objects of each encoding
    {
        ckpt::ParamDict kinds;
        kinds.set("blob", ckpt::Bytes{std::string("\0\x1b[2J\xff", 6)});
        kinds.set("tags", ckpt::Strings{"a", "", "\x1b]0;t\x07"});
        std::map<std::string, double> stats{{"mean", 0.5}, {"n", 3}};
        std::mt19937 engine(7);
        std::string label = "x";
        kinds.set("stats", ckpt::view_of(stats));
        kinds.set("rng", ckpt::view_of(engine));
        kinds.set("label", ckpt::object(label));
        add("ok-kinds.ckpt", "ckpt", checkpoint(body_of(kinds)), "ok", "",
            "bytes, a list of strings, and objects: a value map, an engine's state, a Boost archive");
        add("ok-kinds-xml.ckpt", "ckpt", checkpoint(body_of(kinds, xml), ckpt::ArchiveKind::xml), "ok", "",
            "the same in an xml body");
    }
    add("value-kind-8.ckpt", "ckpt", checkpoint(BinaryBody().u64(1).str("x").u32(8).u64(0).s), "VersionError", "kind 8",
        "a value kind from the future (0.2 knows 0 to 7)");
    add("object-encoding-4.ckpt", "ckpt", checkpoint(BinaryBody().u64(1).str("o").u32(7).str("T").u32(4).u64(0).s),
        "VersionError", "encoding 4", "an object encoding from the future (0.2 knows 0 to 3)");
    add("bytes-size-huge.ckpt", "ckpt", checkpoint(BinaryBody().u64(1).str("b").u32(5).u64(1ull << 61).s), "FormatError",
        "is malformed", "a bytes value claiming 2^61 bytes");
    add("strings-count-huge.ckpt", "ckpt", checkpoint(BinaryBody().u64(1).str("l").u32(6).u64(1ull << 60).s),
        "FormatError", "is malformed", "a list claiming 2^60 strings");
    add("text-signature-length.ckpt", "ckpt", checkpoint("-2 serialization::archive 18 1 0\n", ckpt::ArchiveKind::text),
        "FormatError", "'22 serialization::archive '", "a text body whose signature's length is -2");
}

void safetensors_cases() {
    auto file = [](const std::string& header, const std::string& buffer) {
        std::string out;
        put64(out, header.size());
        return out + header + buffer;
    };
    const std::string floats = raw<float>({1, 2, 3, 4});
    add("ok.safetensors", "safetensors",
        file(R"({"__metadata__":{"note":"hi"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", floats), "ok",
        "", "a small safetensors file: the corpus's control");
    add("names-with-escapes.safetensors", "safetensors",
        file(R"({"__metadata__":{"\u001b[2J":"\u001b]0;owned\u0007"},"\u001b]0;owned\u0007":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
             floats),
        "ok", "", "a tensor name and a metadata key and value holding ESC and BEL");
    add("tensor-twice.safetensors", "safetensors",
        file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
             floats),
        "FormatError", "appears twice", "one tensor name twice in the header");
    std::string past_end = file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", floats);
    past_end[0] = '\x7f';
    add("header-past-end.safetensors", "safetensors", past_end, "FormatError", "runs past the end",
        "a header length beyond the file");
    add("not-json.safetensors", "safetensors", file("{\"w\xff\":1}", floats), "FormatError", "not valid JSON",
        "a header that is not UTF-8 JSON");
    add("offsets-overlap.safetensors", "safetensors",
        file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})",
             floats),
        "FormatError", "overlaps", "two tensors over the same bytes");
    add("shape-overflow.safetensors", "safetensors",
        file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}})", floats),
        "FormatError", "impossible shape", "a shape whose product overflows");
    // ckpt.order naming an entry twice: the second copy was a moved-from value (a crash for a
    // tensor, an empty string for a value)
    add("order-names-tensor-twice.safetensors", "safetensors",
        file(R"({"__metadata__":{"ckpt.order":"[\"w\",\"w\"]"},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
             floats),
        "FormatError", "names 'w' twice", "ckpt.order naming a tensor twice");
    add("order-names-value-twice.safetensors", "safetensors",
        file(R"({"__metadata__":{"s":"text","ckpt.order":"[\"s\",\"w\",\"s\"]"},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
             floats),
        "FormatError", "names 's' twice", "ckpt.order naming a string value twice");
    add("order-not-strings.safetensors", "safetensors",
        file(R"({"__metadata__":{"ckpt.order":"[[\"w\"]]"},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", floats),
        "FormatError", "is not a JSON array of strings", "ckpt.order holding an array");
    // JSON nested 70,000 deep: a stack overflow for a recursive reader
    add("metadata-nested-70000.safetensors", "safetensors",
        file("{\"__metadata__\":{\"x\":" + std::string(70000, '[') + std::string(70000, ']') + "}}", ""), "FormatError",
        "__metadata__ 'x' is not a string", "a metadata value of arrays nested 70,000 deep");
    add("tensor-field-nested-100.safetensors", "safetensors",
        file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":)" + std::string(100, '[') + std::string(100, ']') +
                 "}}",
             floats),
        "FormatError", "nests deeper than 64 levels", "a field of a tensor nested 100 deep");
    add("tensor-field-extra.safetensors", "safetensors",
        file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":{"y":[1,{"z":null}]}}})", floats), "ok", "",
        "a field the format does not name, passed over");
    add("bool-byte-2.safetensors", "safetensors",
        file(R"({"b":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]}})", std::string("\0\1\2\1", 4)), "FormatError",
        "neither 0 nor 1", "a BOOL element holding 2");
}

void npz_cases() {
    const std::string w = npy("<f4", {2}, raw<float>({1, 2}));
    add("ok.npz", "npz", zip_archive({{"w.npy", w}, {"d.npy", w, true}}), "ok", "",
        "a small npz, one member stored and one deflated: the corpus's control");
    add("names-with-escapes.npz", "npz", zip_archive({{"\x1b]0;owned\x07.npy", w}, {"cr\rback.npy", w, true}}), "ok", "",
        "member names holding ESC, BEL and CR");
    add("not-a-zip.npz", "npz", "PK but not a zip at all", "FormatError", "not a readable zip archive", "no zip directory");
    add("member-not-npy.npz", "npz", zip_archive({{"readme.txt", "hello"}}), "FormatError", "is not a .npy array",
        "a member that is no npy array");
    add("bool-byte-2.npz", "npz", zip_archive({{"b.npy", npy("|b1", {3}, std::string("\1\2\0", 3))}}), "FormatError",
        "neither 0 nor 1", "a bool element holding 2");
    Member claim{"w.npy", w, true};
    claim.claimed_size = std::uint64_t{1} << 31;
    add("deflate-claims-ratio.npz", "npz", zip_archive({claim}), "FormatError", "claims",
        "a deflated member of a few bytes claiming 2 GiB, beyond what deflate can expand them to");
    Member zip64{"w.npy", w, false};
    zip64.zip64 = true;
    zip64.claimed_size = std::uint64_t{1} << 62;
    add("zip64-claim.npz", "npz", zip_archive({zip64}), "FormatError", "claims",
        "a stored member whose zip64 extra field claims 2^62 bytes");
    add("npy-header-length-huge.npz", "npz",
        zip_archive({{"w.npy", std::string("\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12) + "{}"}}), "FormatError", "npy header of",
        "an npy 2.0 header length of 2 GiB in a 14-byte member");
}

void torch_cases() {
    const std::string four = raw<float>({1, 2, 3, 4});
    Pickle ok;
    ok.op('}').op('(').str("w").tensor("FloatStorage", "0", 4, 0, {2, 2}, {2, 1}).str("epoch").integer(3).op('u');
    add("ok.pt", "pt", torch_file(ok.done(), {four}), "ok", "",
        "a state_dict as torch.save writes it: the corpus's control");
    Pickle loud;
    loud.op('}').op('(').str("\x1b]0;owned\x07").tensor("FloatStorage", "0", 4, 0, {4}, {1});
    loud.str("cr\rback").str("\x1b[2J\xc2\x9b").op('u');
    add("names-with-escapes.pt", "pt", torch_file(loud.done(), {four}), "ok", "",
        "a state_dict key and a string value holding ESC, BEL, CR and a C1 control");
    Pickle system;
    system.global("posix", "system").op('(').str("echo owned").op('t').op('R');
    add("global-os-system.pt", "pt", torch_file(system.done(), {}), "FormatError", "'posix.system'",
        "a pickle that would call os.system");
    Pickle user_class;
    user_class.op('}').op('(').str("m").global("__main__", "Model").op(')').op('R').op('u');
    add("global-user-class.pt", "pt", torch_file(user_class.done(), {}), "FormatError", "'__main__.Model'",
        "a pickle that would construct a user's class");
    // one storage under two dtypes: torch.load makes the storage at its first reference and
    // reuses it, so the second tensor is float32 too
    Pickle two_dtypes;
    two_dtypes.op('}').op('(').str("f").tensor("FloatStorage", "0", 4, 0, {4}, {1});
    two_dtypes.str("l").tensor("LongStorage", "0", 2, 0, {2}, {1}).op('u');
    add("storage-two-dtypes.pt", "pt", torch_file(two_dtypes.done(), {four}), "ok", "",
        "one storage referred to as float32 and as int64, read as torch.load reads it");
    Pickle bad_key;
    bad_key.op('}').op('(').str("w").tensor("FloatStorage", "../../etc/passwd", 4, 0, {4}, {1}).op('u');
    add("storage-key-path.pt", "pt", torch_file(bad_key.done(), {four}), "FormatError", "storage key",
        "a storage key that is a path");
    Pickle past;
    past.op('}').op('(').str("w").tensor("FloatStorage", "0", 4, 3, {4}, {1}).op('u');
    add("view-past-storage.pt", "pt", torch_file(past.done(), {four}), "FormatError", "reaches past the end",
        "a view that reaches past its storage");
    std::string cut = ok.done();
    cut.resize(cut.size() / 2);
    add("pickle-cut.pt", "pt", torch_file(cut, {four}), "FormatError", "record 'archive/data.pkl'",
        "a pickle cut in the middle");
    Pickle deep;
    deep.op('}').op('(').str("l");
    for (int i = 0; i < 100; ++i) deep.op(']').op('(');
    for (int i = 0; i < 100; ++i) deep.op('e');
    deep.op('u');
    add("lists-100-deep.pt", "pt", torch_file(deep.done(), {}), "FormatError", "nest more than 64 deep",
        "lists nested 100 deep");
    // what a pickle builds: 8 million ints from 16 KB (a deflated pickle of 16 MB)
    Pickle ints;
    ints.op('}').op('(').str("l").op(']').op('(');
    for (int i = 0; i < 8'000'000; ++i) ints.s += "K\x01";
    ints.op('e').op('u');
    add("list-8m-ints-deflated.pt", "pt", torch_file(ints.done(), {}, true), "FormatError", "decodes to more than",
        "a deflated pickle of a list of 8 million ints (16 KB)");
    // views of one storage under many names: each is a tensor of its own once read
    const std::int64_t numel = (32 << 20) / 4;
    Pickle views;
    views.op('}').op('(');
    for (int k = 0; k < 16; ++k) views.str("v" + std::to_string(k)).tensor("FloatStorage", "0", numel, 0, {numel}, {1});
    views.op('u');
    add("views-16x-32m-storage.pt", "pt", torch_file(views.done(), {std::string(32u << 20, '\0')}, false, true), "FormatError",
        "decodes to more than", "16 views of a deflated 32 MiB storage: 512 MiB of tensors from 32 KB");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: make_hostile DIR (tests/hostile)\n";
        return 2;
    }
    out_dir = argv[1];
    fs::create_directories(out_dir);
    checkpoint_cases();
    safetensors_cases();
    npz_cases();
    torch_cases();
    nlohmann::ordered_json manifest = nlohmann::ordered_json::array();
    for (const auto& c : cases)
        manifest.push_back(
            {{"file", c.file}, {"format", c.format}, {"expect", c.expect}, {"contains", c.contains}, {"why", c.why}});
    std::ofstream(out_dir.string() + "/cases.json", std::ios::trunc) << manifest.dump(2) << "\n";
    std::cout << "wrote " << cases.size() << " cases to " << out_dir.string() << "\n";
}
