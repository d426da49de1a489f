// A program built against the installed package through find_package(ckpt CONFIG).
#include <ckpt/ckpt.hpp>

#include <stdlib.h>

#include <cstdio>

int main() {
    char tmpl[] = "/tmp/ckpt-consume-XXXXXX";
    if (!::mkdtemp(tmpl)) return 1;
    const boost::filesystem::path dir = tmpl;
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(std::vector<float>{1, 2, 3}, {3}));
    d.set("epoch_num", std::int64_t{3});
    ckpt::save_checkpoint(d, dir / "x.ckpt");
    const auto loaded = ckpt::load_checkpoint(dir / "x.ckpt");
    // a manager of the usual policies: in compiled mode (consumer_compiled) the library's
    std::int64_t step = 0;
    ckpt::ParamDict state;
    state.set("step", ckpt::view_of(step));
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(dir, "m", ckpt::EverySteps{2},
                                                                                ckpt::KeepLast{2});
    for (step = 1; step <= 6; ++step) mgr.on_step(ckpt::Progress::at_iteration(step), state);
    step = 0;
    const auto restored = mgr.restore(state);
    const bool ok = loaded.get<std::int64_t>("epoch_num") == 3 && loaded.tensor("w").values<float>()[2] == 3.0f &&
                    ckpt::latest(dir, "x", ckpt::SingleFileNaming{}).has_value() && restored && step == 6 &&
                    mgr.managed_checkpoints().size() == 2;
    boost::filesystem::remove_all(dir);
    std::puts(ok ? "installed package ok" : "installed package FAILED");
    return ok ? 0 : 1;
}
