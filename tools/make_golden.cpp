// Writes the golden checkpoint files of tests/golden/: one per archive kind, all holding the
// same entries (golden_state(), tests/golden_state.hpp), for tests/test_golden.cpp and docs/FORMAT.md.
//
// Golden files are never regenerated for an existing format version. The files of format
// version 1 (tests/golden/v1-*.ckpt) were written once, by this program, and are checked in:
// every later version of ckpt must still read them, byte for byte as they are. When a new
// format version is introduced, add its files next to the old ones (v2-*.ckpt, written by
// the code of that version: change the names in main() below) and keep the old ones. This program refuses to replace an
// existing file.
//
// Build and run from the source tree (no CMake target):
//
//   g++ -std=c++20 -O1 -Iinclude tools/make_golden.cpp -o /tmp/make_golden -lboost_serialization -lboost_filesystem -lxxhash
//   /tmp/make_golden tests/golden
//
// The values are a fixed function of nothing (no clock, no randomness), so the test
// recomputes them: both take golden_state() from tests/golden_state.hpp. The save time in
// each header is the only field that depends on when the files were written.

#include <ckpt/checkpoint.hpp>

#include "../tests/golden_state.hpp"

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s OUTPUT_DIR   (e.g. tests/golden)\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const ckpt::ParamDict state = test::golden_state();
    struct File {
        const char* name;
        ckpt::ArchiveKind archive;
        std::int64_t epoch, step;
    };
    const File files[] = {{"v1-binary.ckpt", ckpt::ArchiveKind::binary, 3, 1200},
                          {"v1-text.ckpt", ckpt::ArchiveKind::text, 4, 1600},
                          {"v1-xml.ckpt", ckpt::ArchiveKind::xml, 5, 2000}};
    try {
        for (const File& f : files) {
            const std::string path = dir + "/" + f.name;
            ckpt::save_checkpoint(state, path, {.archive = f.archive, .epoch = f.epoch, .step = f.step, .overwrite = false});
            if (!(ckpt::load_checkpoint(path) == state)) {
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
