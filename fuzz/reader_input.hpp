#pragma once
// One fuzz input through the readers, shared by the libFuzzer target
// (fuzz/checkpoint_reader.cpp) and the regression test that replays every input it ever
// crashed on (tests/test_fuzz_regressions.cpp).
//
// The first byte, modulo 13, picks what the rest is:
//   0      a whole checkpoint file, as it is: the header check and the checksum stand in front
//   1 2 3  a checkpoint body (binary, text, xml archive) under a valid header with its true
//          checksum, so that the archive parser itself is exercised
//   4      a whole safetensors file, as it is
//   5      a safetensors header's JSON text, then optionally a NUL and the buffer: the 8-byte
//          length is put in front here, so that mutating the text does not break the length
//          and the checks of dtype, shape and data_offsets are reached
//   6      a whole npz file, as it is
//   7      one .npy member: it is wrapped here in a zip ("w.npy", stored, with its true
//          CRC-32 and the comment "ckpt:scalar"), so that the npy header parser and the
//          values past libzip's CRC check are reached
//   8      a zstd stored body (docs/FORMAT.md 9.2) of a binary archive, under a valid
//          version-2 header listing zstd, with its true checksum: zstd_decode, then the parser
//   9      an aes-256-gcm stored body (prefix and segments) of a binary archive, under a valid
//          header listing aes-256-gcm, with its true checksum; read with fuzz_key()
//   10     a zstd stored body of a binary archive that the harness encrypts here with
//          fuzz_key(), under a header listing zstd then aes-256-gcm: authentication passes
//          whatever the bytes, so that mutations reach zstd decoding behind decryption
//   11     a whole PyTorch file (torch.save's zip), as it is
//   12     the records of a PyTorch file, joined by torch_separator: the pickle, then the
//          storages "0", "1", ...; the harness zips them (as "archive/data.pkl",
//          "archive/data/0", ...) with their true CRC-32s, so that mutations of the pickle
//          reach the unpickler instead of failing the CRC check
// Checkpoints are loaded, with fuzz_key() and max_decoded_bytes at 64 MiB (scripts/fuzz.sh's
// allocation limit, below the default budget), into a fresh dictionary and into a target with a
// tensor "w", their table of contents read (read_contents), and each entry read through
// ckpt::open; a mode 1 body is read a second time under a format version 3 header; safetensors, npz and PyTorch
// files are loaded (load_safetensors, load_npz, load_torch) and listed as `ckpt show` lists them
// (safetensors_contents, npz_contents, torch_contents), with the same budget.
// The only acceptable failure is a ckpt::Error (format, checksum, version, key,
// authentication, mismatch, I/O).
//
// Why modulo 11: the byte was taken modulo 4 until the safetensors and npz modes came, then
// modulo 8 until the codec modes came. Values 0 to 7 mean what they meant, and the inputs kept
// in tests/fuzz_regressions/ all start with 2, 3 or 6, so they replay as before. Values 8 to
// 255 used to fold onto modes 0 to 7; only throwaway libFuzzer corpora (build-fuzz/corpus) hold
// such inputs, and they merely become inputs of other modes. Modulo 13 since the PyTorch
// modes came: values 0 to 10 mean what they meant. 13 does not divide 256: modes 0 to 8 get
// 20 byte values, the others 19.

#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/ckpt.hpp>
#include <ckpt/interop.hpp>
#include <ckpt/object.hpp>  // view_of an engine (ckpt.hpp has it, but not in compiled mode)
#include <ckpt/codecs/zstd.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace fuzz {

inline constexpr int mode_count = 13;
enum Mode : int {
    checkpoint_file = 0,
    safetensors_file = 4,
    safetensors_json = 5,
    npz_file = 6,
    npy_member = 7,
    zstd_body = 8,
    aes_body = 9,
    zstd_in_aes = 10,
    torch_file = 11,
    torch_pickle = 12
};

/// Between the records of a torch_pickle input.
inline constexpr std::string_view torch_separator = "\xffRECORD\xff";

inline int mode_of(const std::uint8_t* data, std::size_t size) { return size == 0 ? -1 : data[0] % mode_count; }

/// The key of every encrypted fuzz input (and of the seeds of modes 9 and 10).
inline const ckpt::Key& fuzz_key() {
    static const ckpt::Key key = [] {
        std::array<unsigned char, ckpt::Key::size> raw{};
        for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<unsigned char>(0xf0 ^ (i * 29));
        return ckpt::Key::from_bytes(raw);
    }();
    return key;
}

/// The header of a binary body stored through `codecs`: format version 2, epoch, step and save
/// time 0, so that the associated data aes-256-gcm authenticates is the same for every input.
inline ckpt::FileHeader codec_header(std::initializer_list<ckpt::CodecId> codecs) {
    ckpt::FileHeader h;
    h.version = ckpt::format_version_codecs;
    std::size_t i = 0;
    for (const auto c : codecs) h.codecs[i++] = c;
    return h;
}

/// `plain` through the library's encoders, as save_checkpoint stores a body under `h`.
inline std::string encode(const ckpt::CodecChain& chain, const ckpt::FileHeader& h, std::string_view plain) {
    struct StringSink final : ckpt::ByteSink {
        std::string out;
        void put(const std::byte* data, std::size_t n) override { out.append(reinterpret_cast<const char*>(data), n); }
        void finish() override {}
    } sink;
    ckpt::detail::EncoderChain encoders(chain, sink, ckpt::EncodeContext{"fuzz input", ckpt::header_associated_data(h)});
    encoders.head().put(reinterpret_cast<const std::byte*>(plain.data()), plain.size());
    encoders.head().finish();
    return std::move(sink.out);
}

/// A whole file: `h` with the length and true checksum of `stored`, then `stored`.
inline std::string with_header(ckpt::FileHeader h, std::string_view stored) {
    h.body_length = stored.size();
    h.body_hash = ckpt::detail::xxh3(stored.data(), stored.size());
    const auto header = ckpt::encode_header(h);
    return std::string(reinterpret_cast<const char*>(header.data()), header.size()) + std::string(stored);
}

/// CRC-32 (the zip polynomial), bit by bit: inputs are at most 64 KiB.
inline std::uint32_t crc32(std::string_view s) {
    std::uint32_t c = 0xffffffffu;
    for (const char ch : s) {
        c ^= static_cast<unsigned char>(ch);
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

inline void put16(std::string& out, std::uint32_t v) {
    out += static_cast<char>(v & 0xff);
    out += static_cast<char>((v >> 8) & 0xff);
}
inline void put32(std::string& out, std::uint32_t v) {
    put16(out, v & 0xffff);
    put16(out, v >> 16);
}

/// One member of a zip that zip_stored() writes.
struct ZipMember {
    std::string name, data, comment;
};

/// A zip archive of stored members, each with its true CRC-32.
inline std::string zip_stored(const std::vector<ZipMember>& members) {
    std::string z;
    std::vector<std::uint32_t> local_at;
    auto common = [&](const ZipMember& m) {  // version needed, flags, method, time, date, crc, sizes, name length
        const auto n = static_cast<std::uint32_t>(m.data.size());
        put16(z, 20), put16(z, 0), put16(z, 0), put16(z, 0), put16(z, 0x21);  // 1980-01-01
        put32(z, crc32(m.data)), put32(z, n), put32(z, n), put16(z, static_cast<std::uint32_t>(m.name.size()));
    };
    for (const auto& m : members) {
        local_at.push_back(static_cast<std::uint32_t>(z.size()));
        put32(z, 0x04034b50u);  // local file header
        common(m);
        put16(z, 0);  // extra length
        z += m.name;
        z += m.data;
    }
    const auto cd_offset = static_cast<std::uint32_t>(z.size());
    for (std::size_t k = 0; k < members.size(); ++k) {
        const auto& m = members[k];
        put32(z, 0x02014b50u);  // central directory entry
        put16(z, 20);           // version made by
        common(m);
        put16(z, 0), put16(z, static_cast<std::uint32_t>(m.comment.size()));  // extra, comment length
        put16(z, 0), put16(z, 0), put32(z, 0), put32(z, local_at[k]);        // disk, attributes, local header
        z += m.name;
        z += m.comment;
    }
    const auto cd_size = static_cast<std::uint32_t>(z.size()) - cd_offset;
    const auto count = static_cast<std::uint32_t>(members.size());
    put32(z, 0x06054b50u);  // end of central directory
    put16(z, 0), put16(z, 0), put16(z, count), put16(z, count), put32(z, cd_size), put32(z, cd_offset), put16(z, 0);
    return z;
}

/// A zip archive of one stored member `name` holding `data`, with a member comment.
inline std::string zip_one(std::string_view name, std::string_view data, std::string_view comment) {
    return zip_stored({{std::string(name), std::string(data), std::string(comment)}});
}

/// A torch_pickle input's records (after the mode byte): the pickle, then the storages.
inline std::string join_torch_records(const std::vector<std::string>& records) {
    std::string out;
    for (std::size_t k = 0; k < records.size(); ++k) out += (k ? std::string(torch_separator) : std::string()) + records[k];
    return out;
}

/// The records of a PyTorch file: its data.pkl, then its storages "data/0", "data/1", ... for
/// as long as they follow one another (the keys torch.save gives them); empty if it is none.
inline std::vector<std::string> torch_records(const std::string& path) {
    int err = 0;
    ckpt::detail::ZipArchive zip{zip_open(path.c_str(), ZIP_RDONLY, &err)};
    if (!zip.za) return {};
    auto read = [&](zip_int64_t index) {
        zip_stat_t st;
        zip_stat_init(&st);
        std::string out;
        if (zip_stat_index(zip.za, static_cast<zip_uint64_t>(index), 0, &st) != 0) return out;
        ckpt::detail::ZipFile f{zip_fopen_index(zip.za, static_cast<zip_uint64_t>(index), 0)};
        out.resize(static_cast<std::size_t>(st.size));
        if (!f.zf || zip_fread(f.zf, out.data(), out.size()) != static_cast<zip_int64_t>(out.size())) out.clear();
        return out;
    };
    std::vector<std::string> records;
    for (zip_int64_t k = 0; k < zip_get_num_entries(zip.za, 0); ++k) {
        const std::string name = zip_get_name(zip.za, static_cast<zip_uint64_t>(k), 0);
        const auto slash = name.find('/');
        if (slash == std::string::npos || name.substr(slash + 1) != "data.pkl") continue;
        const std::string prefix = name.substr(0, slash + 1);
        records.push_back(read(k));
        for (int key = 0;; ++key) {
            const zip_int64_t at = zip_name_locate(zip.za, (prefix + "data/" + std::to_string(key)).c_str(), 0);
            if (at < 0) break;
            records.push_back(read(at));
        }
        break;
    }
    return records;
}

/// The file bytes an input stands for.
inline std::string file_bytes(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return {};
    const int mode = mode_of(data, size);
    const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
    switch (mode) {
        case 1:
        case 2:
        case 3: {
            ckpt::FileHeader h;
            h.archive = static_cast<ckpt::ArchiveKind>(mode - 1);
            return with_header(h, rest);
        }
        case zstd_body: return with_header(codec_header({ckpt::CodecId::zstd}), rest);
        case aes_body: return with_header(codec_header({ckpt::CodecId::aes_256_gcm}), rest);
        case zstd_in_aes: {
            const auto h = codec_header({ckpt::CodecId::zstd, ckpt::CodecId::aes_256_gcm});
            return with_header(h, encode(ckpt::AesGcm{fuzz_key()}.codecs(), h, rest));
        }
        case safetensors_json: {
            const auto nul = rest.find('\0');
            const std::string_view text = rest.substr(0, nul);
            std::string out;
            put32(out, static_cast<std::uint32_t>(text.size()));
            put32(out, 0);
            out += text;
            if (nul != std::string_view::npos) out += rest.substr(nul + 1);
            return out;
        }
        case npy_member: return zip_one("w.npy", rest, "ckpt:scalar");
        case torch_pickle: {
            std::vector<ZipMember> members;
            std::size_t at = 0;
            for (;;) {
                const auto end = rest.find(torch_separator, at);
                const std::string record(rest.substr(at, end == std::string_view::npos ? end : end - at));
                members.push_back({members.empty() ? "archive/data.pkl" : "archive/data/" + std::to_string(members.size() - 1),
                                   record, ""});
                if (end == std::string_view::npos) break;
                at = end + torch_separator.size();
            }
            members.push_back({"archive/version", "3\n", ""});
            return zip_stored(members);
        }
        default: return std::string(rest);  // a whole file of any kind
    }
}

/// Where touch() leaves its sum, so that the reads are not optimised away.
inline volatile std::size_t touched_sum = 0;

/// Reads every byte of every tensor, as a caller would.
inline void touch(const ckpt::ParamDict& d) {
    std::size_t touched = 0;
    for (const auto& [name, value] : d) {
        if (const auto* t = value.get_if<ckpt::Tensor>())
            for (std::size_t i = 0; i < t->nbytes(); ++i) touched += static_cast<unsigned char>(t->data()[i]);
        if (const auto* o = value.get_if<ckpt::Object>(); o && o->encoding == ckpt::ObjectEncoding::value_map) {
            try {  // as `ckpt show` decodes a map
                touched += ckpt::detail::decode_value_map(o->data, name).size();
            } catch (const ckpt::FormatError&) {
            }
        }
    }
    touched_sum = touched;
}

/// Writes the input's file to `path` and reads it back with the reader(s) its mode names.
inline void read_checkpoint(const std::string& path, const ckpt::LoadOptions& opts);

inline void read_input(const std::uint8_t* data, std::size_t size, const std::string& path) {
    const std::string bytes = file_bytes(data, size);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return;
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    const int mode = mode_of(data, size);
    const ckpt::InteropLoadOptions interop{std::uint64_t{64} << 20};  // scripts/fuzz.sh's allocation limit
    // a load, then a listing: each may only fail with a ckpt::Error
    auto both = [&](auto load, auto contents) {
        try {
            touch(load(path, interop));
        } catch (const ckpt::Error&) {
        }
        try {
            contents(path, interop);
        } catch (const ckpt::Error&) {
        }
    };
    if (mode == safetensors_file || mode == safetensors_json) {
        both([](const std::string& p, const auto& o) { return ckpt::load_safetensors(p, o); },
             [](const std::string& p, const auto& o) { return ckpt::safetensors_contents(p, o); });
        return;
    }
    if (mode == npz_file || mode == npy_member) {
        both([](const std::string& p, const auto& o) { return ckpt::load_npz(p, o); },
             [](const std::string& p, const auto& o) { return ckpt::npz_contents(p, o); });
        return;
    }
    if (mode == torch_file || mode == torch_pickle) {
        both([](const std::string& p, const auto& o) { return ckpt::load_torch(p, o); },
             [](const std::string& p, const auto& o) { return ckpt::torch_contents(p, o); });
        return;
    }
    ckpt::LoadOptions opts;
    opts.key = fuzz_key();
    opts.max_decoded_bytes = interop.max_decoded_bytes;
    read_checkpoint(path, opts);
    if (mode == 1) {  // the same binary body as a version 3 file: its table of contents, parsed unverified by open()
        ckpt::FileHeader h;
        h.version = ckpt::format_version_chunked;
        const std::string v3 = with_header(h, std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
        if (std::FILE* out = std::fopen(path.c_str(), "wb")) {
            std::fwrite(v3.data(), 1, v3.size(), out);
            std::fclose(out);
            read_checkpoint(path, opts);
        }
    }
}

/// Every reader of a checkpoint file on `path`; each may only fail with a ckpt::Error.
inline void read_checkpoint(const std::string& path, const ckpt::LoadOptions& opts) {
    try {
        touch(ckpt::load_checkpoint(path, opts));
    } catch (const ckpt::Error&) {
    }
    try {
        // one entry at a time, verified alone in a version 3 file (its table of contents parsed
        // before it is checked)
        const auto reader = ckpt::open(path, opts);
        for (const auto& e : reader.entries()) {
            ckpt::ParamDict one;
            one.set(e.name, reader.read(e.name));
            touch(one);
            if (e.kind == ckpt::ValueKind::tensor && !e.shape.empty() && e.order == ckpt::Order::row_major)
                reader.read_rows(e.name, 0, std::min<std::int64_t>(1, e.shape[0]));
        }
    } catch (const ckpt::Error&) {
    }
    try {
        ckpt::read_contents(path, opts);
    } catch (const ckpt::Error&) {
    }
    try {
        // bound variables of the names the seeds use (tests/hostile/ok-kinds.ckpt): their
        // readers are ckpt's, bounded (an object of a program's own type is Boost's, and is
        // not bound here: Boost trusts its archive's lengths, docs/ROBUSTNESS.md)
        std::map<std::string, double> stats;
        std::mt19937 rng;
        std::vector<std::string> tags;
        std::string blob;
        ckpt::ParamDict target;
        target.set("w", ckpt::Tensor::from(std::vector<float>(6, 0.0f), {2, 3}));
        target.set("stats", ckpt::view_of(stats));
        target.set("rng", ckpt::view_of(rng));
        target.set("tags", ckpt::view_of(tags));
        target.set("blob", ckpt::bytes_of(blob));
        ckpt::load_checkpoint_into(path, target, false, opts);
    } catch (const ckpt::Error&) {
    }
}

}  // namespace fuzz
