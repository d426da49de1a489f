// Built against the installed package: safetensors and npz through ckpt::interop.
#include <ckpt/interop.hpp>

#include <cstdio>

int main() {
    const auto dir = boost::filesystem::temp_directory_path() / boost::filesystem::unique_path();
    boost::filesystem::create_directories(dir);
    ckpt::ParamDict d{{"w", ckpt::Tensor::from(std::vector<float>{1, 2, 3})}, {"epoch", 4}};
    ckpt::save_safetensors(d, dir / "w.safetensors");
    ckpt::save_npz(d, dir / "w.npz", true);
    const bool same = ckpt::load_safetensors(dir / "w.safetensors").at("w") == d.at("w") &&
                      ckpt::load_npz(dir / "w.npz").get<int>("epoch") == 4;
    boost::filesystem::remove_all(dir);
    std::puts(same ? "interop consumer: ok" : "interop consumer: values differ");
    return same ? 0 : 1;
}
