// libFuzzer target: the checkpoint, safetensors, npz and PyTorch readers on arbitrary files
// (the first byte of an input picks the reader; see reader_input.hpp).
//   bash scripts/fuzz.sh [seconds]
#include "reader_input.hpp"

#include <unistd.h>

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const std::string path = "/tmp/ckpt-fuzz-" + std::to_string(::getpid()) + ".ckpt";
    fuzz::read_input(data, size, path);
    return 0;
}
