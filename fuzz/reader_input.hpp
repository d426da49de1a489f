#pragma once
// One fuzz input through the checkpoint reader, shared by the libFuzzer target
// (fuzz/checkpoint_reader.cpp) and the regression test that replays every input it ever
// crashed on (tests/test_fuzz_regressions.cpp).
//
// The first byte picks what the rest is:
//   0      a whole file, as it is: the header check and the checksum stand in front
//   1 2 3  a body (binary, text, xml archive) under a valid header with its true checksum,
//          so that the archive parser itself is exercised
// The file is loaded into a fresh dictionary and into a target with a tensor "w"; the only
// acceptable failure is a ckpt::Error (format, checksum, version, mismatch).

#include <ckpt/ckpt.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace fuzz {

/// The file bytes an input stands for.
inline std::string file_bytes(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return {};
    const int mode = data[0] % 4;
    ++data;
    --size;
    std::string out;
    if (mode != 0) {
        ckpt::FileHeader h;
        h.archive = static_cast<ckpt::ArchiveKind>(mode - 1);
        h.body_length = size;
        h.body_hash = ckpt::detail::xxh3(data, size);
        const auto header = ckpt::encode_header(h);
        out.assign(reinterpret_cast<const char*>(header.data()), header.size());
    }
    out.append(reinterpret_cast<const char*>(data), size);
    return out;
}

/// Writes the input's file to `path` and reads it back in both ways.
inline void read_input(const std::uint8_t* data, std::size_t size, const std::string& path) {
    const std::string bytes = file_bytes(data, size);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return;
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    try {
        ckpt::ParamDict d = ckpt::load_checkpoint(path);
        std::size_t touched = 0;  // every tensor's bytes are read
        for (auto& [name, value] : d)
            if (auto* t = value.get_if<ckpt::Tensor>())
                for (std::size_t i = 0; i < t->nbytes(); ++i) touched += static_cast<unsigned char>(t->data()[i]);
        (void)touched;
    } catch (const ckpt::Error&) {
    }
    try {
        ckpt::ParamDict target;
        target.set("w", ckpt::Tensor::from(std::vector<float>(6, 0.0f), {2, 3}));
        ckpt::load_checkpoint_into(path, target);
    } catch (const ckpt::Error&) {
    }
}

}  // namespace fuzz
