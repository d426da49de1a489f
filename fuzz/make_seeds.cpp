// Writes the fuzzer's seed corpus as inputs of each mode of reader_input.hpp: real
// checkpoints of small dictionaries in every archive kind (a whole file; a body under a
// header), binary bodies through the codecs (compressed; encrypted with the fuzz key;
// compressed for the harness to encrypt), safetensors files (whole; header text and buffer),
// npz files (stored and deflated) and single .npy members of every dtype, byte order and
// layout the reader takes; given a folder of PyTorch files (scripts/fuzz.sh has
// tests/python/write_torch_files.py write them with python3-torch), each whole and as its
// records for the harness to zip; and given the hostile corpus (tests/hostile), each of its
// files whole, as an input of its reader's mode.
//   make_seeds DIR [TORCH_FILES_DIR [HOSTILE_DIR]]
#include "reader_input.hpp"

#include <nlohmann/json.hpp>

#include <complex>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace {

std::string read_file(const boost::filesystem::path& p) {
    std::ifstream in(p.string(), std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_seed(const boost::filesystem::path& dir, const std::string& name, char mode, const std::string& bytes) {
    std::ofstream(dir.string() + "/" + name, std::ios::binary) << mode << bytes;
}

/// An npy member: a header dict as NumPy writes it (padded so that the data is 64-byte
/// aligned), then the data.
std::string npy(const std::string& dict, const std::string& data, bool v2 = false) {
    std::string d = dict;
    const std::size_t prelude = v2 ? 12 : 10;
    d.append((64 - (prelude + d.size() + 1) % 64) % 64, ' ');
    d += '\n';
    std::string out = "\x93NUMPY";
    out += static_cast<char>(v2 ? 2 : 1);
    out += '\0';
    for (std::size_t k = 0; k < (v2 ? 4u : 2u); ++k) out += static_cast<char>((d.size() >> (8 * k)) & 0xff);
    return out + d + data;
}

template <class T>
std::string raw(std::vector<T> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || argc > 4) return 2;
    const boost::filesystem::path dir = argv[1];
    boost::filesystem::create_directories(dir);
    std::vector<ckpt::ParamDict> dicts(5);
    dicts[0].set("w", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
    dicts[1].set("w", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
    dicts[1].set("epoch_num", std::int64_t{7});
    dicts[1].set("lr", 0.01);
    dicts[1].set("note", std::string("seed"));
    dicts[2].set("b", ckpt::Tensor::from(std::vector<std::int32_t>{1, -2}, {2}));
    dicts[2].set("d", ckpt::Tensor::from(std::vector<double>{0.5}, {1}));
    // column-major tensors with their storage order records; "w" loads into the harness's
    // row-major target element by element
    dicts[3].set("w", ckpt::Tensor::from(std::vector<float>{1, 4, 2, 5, 3, 6}, {2, 3}, ckpt::Order::column_major));
    dicts[3].set("c", ckpt::Tensor::from(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2},
                                         ckpt::Order::column_major));
    // every dtype beyond those, one tensor each
    dicts[4].set("i1", ckpt::Tensor::from(std::vector<std::int8_t>{-128, 127}, {2}));
    dicts[4].set("i2", ckpt::Tensor::from(std::vector<std::int16_t>{-3, 300}, {2}));
    dicts[4].set("u2", ckpt::Tensor::from(std::vector<std::uint16_t>{65535}, {1}));
    dicts[4].set("u4", ckpt::Tensor::from(std::vector<std::uint32_t>{7, 8}, {1, 2}));
    dicts[4].set("u8", ckpt::Tensor::from(std::vector<std::uint64_t>{1u << 31}, {}));
    dicts[4].set("bf", ckpt::Tensor::from(std::vector<ckpt::bfloat16>{ckpt::bfloat16(1.5f), ckpt::bfloat16(-2.0f)}, {2}));
    dicts[4].set("e4m3", ckpt::Tensor::from(std::vector<ckpt::float8_e4m3fn>{ckpt::float8_e4m3fn(0.5f)}, {1}));
    dicts[4].set("e5m2", ckpt::Tensor::from(std::vector<ckpt::float8_e5m2>{ckpt::float8_e5m2(-3.0f)}, {1}));
    dicts[4].set("c8", ckpt::Tensor::from(std::vector<std::complex<float>>{{1, -1}}, {1}));
    dicts[4].set("c16", ckpt::Tensor::from(std::vector<std::complex<double>>{{0.5, 2}, {3, 4}}, {2, 1}));
    int n = 0;
    for (const auto kind : {ckpt::ArchiveKind::binary, ckpt::ArchiveKind::text, ckpt::ArchiveKind::xml})
        for (const auto& d : dicts) {
            const auto tmp = dir / "tmp.ckpt";
            ckpt::SaveOptions o;
            o.archive = kind;
            o.epoch = 1;
            o.step = 2;
            // binary bodies as versions 1 and 3 (mode 1 reads a body under both headers)
            for (const std::uint64_t chunk_bytes : {std::uint64_t{0}, ckpt::min_chunk_bytes}) {
                if (chunk_bytes && kind != ckpt::ArchiveKind::binary) continue;
                o.chunk_bytes = chunk_bytes;
                ckpt::save_checkpoint(d, tmp, o);
                std::ifstream in(tmp.string(), std::ios::binary);
                const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
                boost::filesystem::remove(tmp);
                // mode 0: the whole file; mode 1 + kind: its body alone
                std::ofstream(dir.string() + "/file-" + std::to_string(n), std::ios::binary) << '\0' << file;
                std::ofstream(dir.string() + "/body-" + std::to_string(n), std::ios::binary)
                    << static_cast<char>(1 + static_cast<int>(kind)) << file.substr(ckpt::header_size);
                ++n;
            }
        }

    // Binary bodies through the codecs: mode 8 compressed, mode 9 encrypted with the fuzz key
    // under the header the harness builds, mode 10 compressed for the harness to encrypt.
    // Beyond the small dictionaries: 48 KiB of noise (a zstd block stored as is) and 2.5 MiB
    // of a ramp that compresses well (several zstd blocks in a small input).
    std::vector<ckpt::ParamDict> coded(dicts.begin(), dicts.end());
    std::vector<std::uint8_t> noise(48u << 10);
    std::mt19937 rng(8);
    for (auto& v : noise) v = static_cast<std::uint8_t>(rng());
    coded.emplace_back().set("w", ckpt::Tensor::from(noise, {static_cast<std::int64_t>(noise.size())}));
    std::vector<float> ramp(640u << 10);
    for (std::size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<float>(i % 64);
    coded.emplace_back().set("w", ckpt::Tensor::from(ramp, {static_cast<std::int64_t>(ramp.size())}));
    n = 0;
    for (const auto& d : coded) {
        const auto tmp = dir / "tmp.ckpt";
        ckpt::save_checkpoint(d, tmp, {.chunk_bytes = 0});  // codecs hold version 1 bodies
        const std::string body = read_file(tmp).substr(ckpt::header_size);
        boost::filesystem::remove(tmp);
        const std::string zstd = fuzz::encode(ckpt::Zstd{3}.codecs(), fuzz::codec_header({ckpt::CodecId::zstd}), body);
        write_seed(dir, "zstd-" + std::to_string(n), fuzz::zstd_body, zstd);
        if (body.size() < (60u << 10))  // the fuzzer's inputs stop at 64 KiB
            write_seed(dir, "aes-" + std::to_string(n), fuzz::aes_body,
                       fuzz::encode(ckpt::AesGcm{fuzz::fuzz_key()}.codecs(),
                                    fuzz::codec_header({ckpt::CodecId::aes_256_gcm}), body));
        write_seed(dir, "zstd-in-aes-" + std::to_string(n), fuzz::zstd_in_aes, zstd);
        ++n;
    }

    // safetensors (mode 4: the whole file; mode 5: the header text, a NUL, the buffer) and
    // npz (mode 6: the whole file, stored and deflated).
    ckpt::ParamDict mixed;
    mixed.set("h", ckpt::Tensor::from(std::vector<ckpt::float16>{ckpt::float16(1.5f), ckpt::float16(-2.0f)}, {2}));
    mixed.set("u", ckpt::Tensor::from(std::vector<std::uint8_t>{1, 2, 3}, {3}));
    ckpt::Tensor flag(ckpt::DType::boolean, {2});
    flag.values<bool>()[0] = true;
    mixed.set("flag", flag);
    mixed.set("i", ckpt::Tensor::from(std::vector<std::int64_t>{-1}, {}));
    mixed.set("empty", ckpt::Tensor(ckpt::DType::float32, {0, 3}));
    mixed.set("nesterov", true);
    mixed.set("name", std::string("gr\u00f6\u00dfe"));
    dicts.push_back(mixed);
    // what each format holds: safetensors no complex dtype, npz no bfloat16 nor float8
    auto holding = [](const ckpt::ParamDict& d, bool (*holds)(ckpt::DType)) {
        ckpt::ParamDict out;
        for (const auto& [name, value] : d)
            if (const auto* t = value.get_if<ckpt::Tensor>(); !t || holds(t->dtype())) out.set(name, value);
        return out;
    };
    auto in_safetensors = [](ckpt::DType t) { return t != ckpt::DType::complex64 && t != ckpt::DType::complex128; };
    auto in_npz = [](ckpt::DType t) {
        return t != ckpt::DType::bfloat16 && t != ckpt::DType::float8_e4m3fn && t != ckpt::DType::float8_e5m2;
    };
    n = 0;
    for (const auto& all : dicts) {
        const auto tmp = dir / "tmp";
        const ckpt::ParamDict d = holding(all, in_safetensors);
        ckpt::save_safetensors(d, tmp);
        const std::string st = read_file(tmp);
        std::uint64_t len = 0;
        std::memcpy(&len, st.data(), 8);
        write_seed(dir, "safetensors-" + std::to_string(n), 4, st);
        write_seed(dir, "safetensors-json-" + std::to_string(n), 5, st.substr(8, len) + '\0' + st.substr(8 + len));
        for (const bool compressed : {false, true}) {
            ckpt::save_npz(holding(all, in_npz), tmp, compressed);
            write_seed(dir, std::string(compressed ? "npz-deflated-" : "npz-stored-") + std::to_string(n), 6,
                       read_file(tmp));
        }
        boost::filesystem::remove(tmp);
        ++n;
    }

    // mode 7: single npy members, wrapped in a zip by the harness.
    const std::vector<std::pair<std::string, std::string>> members = {
        {"f4", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", raw<float>({1, 2, 3, 4, 5, 6}))},
        {"f4-fortran", npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", raw<float>({1, 4, 2, 5, 3, 6}))},
        {"f8-scalar", npy("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", raw<double>({0.5}))},
        {"f2", npy("{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }", raw<std::uint16_t>({0x3c00}))},
        {"i4-big", npy("{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }", std::string("\0\0\0\1\xff\xff\xff\xfe", 8))},
        {"i8-scalar", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (), }", raw<std::int64_t>({7}))},
        {"u1-3d", npy("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2, 2), }", "abcdefgh")},
        {"b1", npy("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", std::string("\1\0\1", 3))},
        {"U", npy("{'descr': '<U3', 'fortran_order': False, 'shape': (), }", raw<std::uint32_t>({'a', 0xe9, 0}))},
        {"S", npy("{'descr': '|S4', 'fortran_order': False, 'shape': (), }", std::string("ab\0\0", 4))},
        {"v2", npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 1), }", raw<std::int32_t>({-5, 5}), true)},
        {"empty", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }", "")},
        {"i1", npy("{'descr': '|i1', 'fortran_order': False, 'shape': (2,), }", std::string("\x80\x7f", 2))},
        {"u8-big", npy("{'descr': '>u8', 'fortran_order': False, 'shape': (1,), }", std::string("\0\0\0\0\0\0\1\2", 8))},
        {"c8-big", npy("{'descr': '>c8', 'fortran_order': False, 'shape': (1,), }", std::string("\x3f\x80\0\0\xbf\x80\0\0", 8))},
        {"c16", npy("{'descr': '<c16', 'fortran_order': True, 'shape': (1, 1), }", raw<double>({0.5, -2}))},
    };
    for (const auto& [name, bytes] : members) write_seed(dir, "npy-" + name, 7, bytes);

    // the hostile corpus, each file whole for its reader (cases.json names the reader)
    if (argc == 4) {
        std::ifstream in(std::string(argv[3]) + "/cases.json");
        for (const auto& c : nlohmann::json::parse(in)) {
            const std::string file = c.at("file"), format = c.at("format");
            const std::string bytes = read_file(boost::filesystem::path(argv[3]) / file);
            if (bytes.size() > (60u << 10)) continue;  // the fuzzer's inputs stop at 64 KiB
            const char mode = format == "safetensors" ? fuzz::safetensors_file
                              : format == "npz"       ? fuzz::npz_file
                              : format == "pt"        ? fuzz::torch_file
                                                      : fuzz::checkpoint_file;
            write_seed(dir, "hostile-" + file, mode, bytes);
        }
    }

    // modes 11 and 12: PyTorch files, whole, and as their records (the pickle, the storages)
    if (argc >= 3)
        for (const auto& entry : boost::filesystem::directory_iterator(argv[2])) {
            const auto& p = entry.path();
            if (p.extension() != ".pt") continue;
            const std::string file = read_file(p);
            if (file.size() > (60u << 10)) continue;  // the fuzzer's inputs stop at 64 KiB
            write_seed(dir, "torch-" + p.stem().string(), fuzz::torch_file, file);
            const auto records = fuzz::torch_records(p.string());
            if (!records.empty())
                write_seed(dir, "torch-records-" + p.stem().string(), fuzz::torch_pickle, fuzz::join_torch_records(records));
        }
}
