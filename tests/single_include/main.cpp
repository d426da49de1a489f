// Built with only single_include/ on the include path: the one-header form must stand alone.
#include <ckpt/ckpt.hpp>

#include <stdlib.h>

#include <cstdio>

int main() {
    char tmpl[] = "/tmp/ckpt-single-XXXXXX";
    if (!::mkdtemp(tmpl)) return 1;
    const boost::filesystem::path dir = tmpl;
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(std::vector<float>{1, 2, 3}, {3}));
    d.set("epoch_num", std::int64_t{3});
    ckpt::save_checkpoint(d, dir / "x.ckpt");
    const auto loaded = ckpt::load_checkpoint(dir / "x.ckpt");
    const bool ok = loaded.get<std::int64_t>("epoch_num") == 3 && loaded.tensor("w").values<float>()[2] == 3.0f &&
                    ckpt::latest(dir, "x", ckpt::SingleFileNaming{}).has_value();
    boost::filesystem::remove_all(dir);
    std::puts(ok ? "single include ok" : "single include FAILED");
    return ok ? 0 : 1;
}
