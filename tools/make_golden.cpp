// Writes the golden checkpoint files of tests/golden/ for tests/test_golden.cpp and
// docs/FORMAT.md, all but one holding the same entries (golden_state(), tests/golden_state.hpp):
// for format version 1 one file per archive kind, for format version 2 one file per codec
// chain (each in another archive kind), encrypted with the test key tests/golden/v2.key; and
// v1-column-major.ckpt, column-major tensors with their storage order records
// (golden_column_major_state()), which format version 1 holds without a new version; and for
// format version 3 (chunk checksums) one binary file, in chunks of the smallest size (4 KiB).
//
// Golden files are never regenerated for an existing format version. The files of format
// version 1 (tests/golden/v1-*.ckpt) and of version 2 (tests/golden/v2-*.ckpt) were written
// once, by this program, and are checked in: every later version of ckpt must still read them,
// byte for byte as they are. When a new format version is introduced, add its files to the
// list in main() below (v3-*.ckpt, written by the code of that version) and keep the old
// ones; so with a feature an existing version holds without a new number, as
// v1-column-major.ckpt was added. This program never replaces a file: one that exists is kept as it is and only the
// missing ones are written. (Encrypted files could not be written again anyway: their salt is
// fresh random bytes every time.)
//
// Build and run from the source tree (a CMake target outside `all`):
//
//   cmake --build build --target make_golden && build/make_golden tests/golden
//
// The values are a fixed function of nothing (no clock, no randomness), so the test
// recomputes them: both take golden_state() and golden_column_major_state() from
// tests/golden_state.hpp. The save time in
// each header, and the salt of an encrypted body, are the only bytes that depend on when the
// files were written.

#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/checkpoint.hpp>
#include <ckpt/codecs/zstd.hpp>

#include "../tests/golden_state.hpp"

#include <boost/filesystem/operations.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s OUTPUT_DIR   (e.g. tests/golden, which holds the test key v2.key)\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const ckpt::ParamDict state = test::golden_state();
    const ckpt::ParamDict column_major = test::golden_column_major_state();
    try {
        // A test key, published with the files: it protects nothing.
        const ckpt::Key key = ckpt::Key::from_file(dir + "/v2.key");
        struct File {
            const char* name;
            ckpt::ArchiveKind archive;
            std::int64_t epoch, step;
            ckpt::CodecChain codecs;
            const ckpt::ParamDict* entries;
            std::uint64_t chunk_bytes = 0;  // version 3 only
        };
        const File files[] = {
            {"v1-binary.ckpt", ckpt::ArchiveKind::binary, 3, 1200, {}, &state},
            {"v1-text.ckpt", ckpt::ArchiveKind::text, 4, 1600, {}, &state},
            {"v1-xml.ckpt", ckpt::ArchiveKind::xml, 5, 2000, {}, &state},
            {"v2-zstd.ckpt", ckpt::ArchiveKind::binary, 6, 2400, ckpt::Zstd{3}.codecs(), &state},
            {"v2-aes-256-gcm.ckpt", ckpt::ArchiveKind::text, 7, 2800, ckpt::AesGcm{key}.codecs(), &state},
            {"v2-zstd-aes-256-gcm.ckpt", ckpt::ArchiveKind::xml, 8, 3200,
             ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>{ckpt::Zstd{19}, ckpt::AesGcm{key}}.codecs(), &state},
            {"v1-column-major.ckpt", ckpt::ArchiveKind::binary, 9, 3600, {}, &column_major},
            {"v3-binary.ckpt", ckpt::ArchiveKind::binary, 10, 4000, {}, &state, ckpt::min_chunk_bytes},
        };
        for (const File& f : files) {
            const std::string path = dir + "/" + f.name;
            if (boost::filesystem::exists(path)) {
                std::printf("kept  %s\n", path.c_str());
                continue;
            }
            ckpt::save_checkpoint(
                *f.entries, path,
                {.archive = f.archive,
                 .epoch = f.epoch,
                 .step = f.step,
                 .overwrite = false,
                 .codecs = f.codecs,
                 .chunk_bytes = f.chunk_bytes});
            ckpt::LoadOptions with_key;
            with_key.key = key;
            if (!(ckpt::load_checkpoint(path, with_key) == *f.entries)) {
                std::fprintf(stderr, "%s does not read back as written\n", path.c_str());
                return 1;
            }
            std::printf("wrote %s\n", path.c_str());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "make_golden: %s\n", e.what());
        return 1;
    }
    return 0;
}
