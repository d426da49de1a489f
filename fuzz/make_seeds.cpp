// Writes the fuzzer's seed corpus: real checkpoints of small dictionaries, in every archive
// kind, as inputs of each mode of reader_input.hpp (a whole file; a body under a header).
//   make_seeds DIR
#include <ckpt/ckpt.hpp>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    const boost::filesystem::path dir = argv[1];
    boost::filesystem::create_directories(dir);
    std::vector<ckpt::ParamDict> dicts(3);
    dicts[0].set("w", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
    dicts[1].set("w", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
    dicts[1].set("epoch_num", std::int64_t{7});
    dicts[1].set("lr", 0.01);
    dicts[1].set("note", std::string("seed"));
    dicts[2].set("b", ckpt::Tensor::from(std::vector<std::int32_t>{1, -2}, {2}));
    dicts[2].set("d", ckpt::Tensor::from(std::vector<double>{0.5}, {1}));
    int n = 0;
    for (const auto kind : {ckpt::ArchiveKind::binary, ckpt::ArchiveKind::text, ckpt::ArchiveKind::xml})
        for (const auto& d : dicts) {
            const auto tmp = dir / "tmp.ckpt";
            ckpt::SaveOptions o;
            o.archive = kind;
            o.epoch = 1;
            o.step = 2;
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
