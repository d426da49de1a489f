// One rank of a data-parallel job written the way the data-parallel guide shows last words on GlooComm,
// with nothing else: no TerminationSignals of its own. Started by ckpt-run (its settings from
// launch_env); rank 1 kills itself with SIGKILL after step KILL_STEP, and the survivors must
// write the last words although ckpt-run, with no restarts left, sends them SIGTERM.
//
//   last_words_worker DIR KILL_STEP
#include <fault/fault.hpp>
#include <fault/gloo_comm.hpp>

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

/// Rank 1's process ends by SIGKILL once `step` is done: no exception, no last words of its own.
struct KillAfter {
    std::int64_t step;
    void on_step_end(nn::RunContext& ctx) {
        if (ctx.rank == 1 && ctx.global_step == step) ::raise(SIGKILL);
    }
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: last_words_worker DIR KILL_STEP\n");
        return 2;
    }
    const std::string dir = argv[1];
    const auto env = fault::launch_env();
    auto store = fault::open_store(env.store_url());
    fault::GlooOptions options;
    options.timeout = std::chrono::seconds(20);
    fault::GlooComm comm(*store, env.rank, env.world_size, options);
    nn::MnistDataset data(CKPT_FASHION_MNIST_DIR, nn::Usage::test);
    data.take(256).map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()}).batch(32, true).shard(env.world_size, env.rank);
    nn::UceNet net;
    nn::SGD sgd(net.parameters(), 1e-2);
    fault::DataParallelOptimizer opt(sgd, comm);
    nn::Trainer trainer(net, opt, {}, comm.rank());
    fault::LastWordsCheckpoint last_words(comm, dir);
    KillAfter kill{std::atoll(argv[2])};
    trainer.train(2, data, nn::callbacks(kill, last_words));
    return 0;
}
