// LeNet5 training throughput, single-threaded: nn::Trainer against libtorch's CPU build,
// alternately in one process, on Fashion-MNIST with the seed's recipe (batch 32,
// Momentum(0.01, 0.9), 32x32 inputs). Also the cost of a checkpoint per epoch: epochs with
// and without ModelCheckpoint, alternately.
//
//   OPENBLAS_NUM_THREADS=1 train_lenet [--images N] [--rounds R] [--data DIR]
// Last line: train_lenet images_per_s=N
//
// nn's figure includes its data pipeline (decode, Rescale, Resize, HWC2CHW per batch);
// libtorch trains on batches made beforehand, so the comparison is conservative for nn.
// Built with libtorch when configured with -DCKPT_BENCH_TORCH=ON (Debian's libtorch-dev).
// Exit status 1 if the run did not time what it planned: every epoch's batches, one save at
// the end of each epoch with a checkpoint, and saves no faster than memory.

#include <nn/nn.hpp>

#include "bench_support.hpp"

#ifdef CKPT_BENCH_TORCH
#include <torch/torch.h>
#endif

#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = boost::filesystem;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

nn::MnistDataset lenet_data(const fs::path& dir, std::size_t images) {
    nn::MnistDataset ds(dir, nn::Usage::train);
    ds.take(images).map({nn::Rescale(1.0 / 255.0, 0), nn::Resize(32, 32), nn::HWC2CHW()}).batch(32, true);
    return ds;
}

// A ModelCheckpoint whose epoch-end and train-end work is timed, and its epoch-end saves counted.
struct Timed {
    nn::ModelCheckpoint<ckpt::EveryEpochs, ckpt::KeepLast> cb;
    double seconds;
    int saves = 0;
    void on_epoch_end(nn::RunContext& ctx) {
        const auto before = cb.last_saved();
        const auto t = Clock::now();
        cb.on_epoch_end(ctx);
        seconds += seconds_since(t);
        saves += cb.last_saved() != before;
    }
    void on_train_end(nn::RunContext& ctx) {
        const auto t = Clock::now();
        cb.on_train_end(ctx);
        seconds += seconds_since(t);
    }
};

// The steps each epoch trained, as the epoch's end sees them.
struct StepsSeen {
    std::int64_t steps = 0;
    void on_epoch_end(nn::RunContext& ctx) { steps += ctx.step; }
};

struct NnRun {
    nn::LeNet5 net;
    nn::Momentum opt{net.parameters(), 0.01, 0.9};
    nn::Trainer<nn::LeNet5, nn::Momentum> trainer{net, opt};
    std::int64_t epochs = 0;
    StepsSeen seen;
    // One more epoch; returns its seconds.
    double epoch(nn::MnistDataset& data, Timed* cb = nullptr) {
        const auto t = Clock::now();
        if (cb) trainer.train(epochs + 1, data, nn::callbacks(seen, *cb), epochs);
        else trainer.train(epochs + 1, data, nn::callbacks(seen), epochs);
        ++epochs;
        return seconds_since(t);
    }
};

#ifdef CKPT_BENCH_TORCH
struct TorchLeNet : torch::nn::Module {
    torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 6, 5)}, conv2{torch::nn::Conv2dOptions(6, 16, 5)};
    torch::nn::Linear fc1{400, 120}, fc2{120, 84}, fc3{84, 10};
    TorchLeNet() {
        register_module("conv1", conv1);
        register_module("conv2", conv2);
        register_module("fc1", fc1);
        register_module("fc2", fc2);
        register_module("fc3", fc3);
    }
    torch::Tensor forward(torch::Tensor x) {
        x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2, 2);
        x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2, 2);
        x = x.flatten(1);
        x = torch::relu(fc1->forward(x));
        x = torch::relu(fc2->forward(x));
        return fc3->forward(x);
    }
};

struct TorchRun {
    std::vector<torch::Tensor> images, labels;
    std::shared_ptr<TorchLeNet> net = std::make_shared<TorchLeNet>();
    torch::optim::SGD opt{net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)};
    explicit TorchRun(const nn::MnistDataset& data) {
        nn::Batch b;
        for (std::int64_t s = 0; s < data.steps_per_epoch(); ++s) {
            data.load_batch(1, s, b);
            images.push_back(torch::from_blob(b.images.data(), {32, 1, 32, 32}, torch::kFloat32).clone());
            std::vector<std::int64_t> l(b.labels.begin(), b.labels.end());
            labels.push_back(torch::tensor(l, torch::kInt64));
        }
    }
    double epoch() {
        const auto t = Clock::now();
        for (std::size_t i = 0; i < images.size(); ++i) {
            opt.zero_grad();
            auto loss = torch::nn::functional::cross_entropy(net->forward(images[i]), labels[i]);
            loss.backward();
            opt.step();
        }
        return seconds_since(t);
    }
};
#endif

}  // namespace

int main(int argc, char** argv) {
    std::size_t images = 60000;
    int rounds = 3;
    fs::path dir = "/usr/share/datasets/fashion-mnist";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--images") images = std::strtoul(argv[i + 1], nullptr, 10);
        else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
        else if (a == "--data") dir = argv[i + 1];
    }
    nn::set_blas_threads(1);
    auto data = lenet_data(dir, images);
    const double n = static_cast<double>(data.steps_per_epoch() * 32);
    std::printf("LeNet5, batch 32, %g images per epoch, single-threaded, %d rounds\n", n, rounds);

    NnRun ours;
    double state_bytes = 0;  // what a save writes, about: parameters and Momentum state
    for (const auto& d : {ours.net.state_dict(), ours.opt.state_dict()})
        for (const auto& e : d)
            if (const auto* t = e.value.get_if<ckpt::Tensor>()) state_bytes += static_cast<double>(t->nbytes());
    bench::Checks check;
    ours.epoch(data);  // warm-up: first-touch of buffers
    double nn_best = 1e30;
#ifdef CKPT_BENCH_TORCH
    torch::set_num_threads(1);
    torch::manual_seed(1);
    TorchRun theirs(data);
    theirs.epoch();
    double torch_best = 1e30;
#endif
    for (int r = 0; r < rounds; ++r) {
        const double t_nn = ours.epoch(data);
        nn_best = std::min(nn_best, t_nn);
        std::printf("round %d: nn %.0f images/s", r + 1, n / t_nn);
#ifdef CKPT_BENCH_TORCH
        const double t_torch = theirs.epoch();
        torch_best = std::min(torch_best, t_torch);
        std::printf(", libtorch %.0f images/s, nn/libtorch %.3f", n / t_torch, t_torch / t_nn);
#endif
        std::printf("\n");
    }
#ifdef CKPT_BENCH_TORCH
    std::printf("best: nn %.0f images/s, libtorch %s %.0f images/s, nn/libtorch %.3f\n", n / nn_best,
                TORCH_VERSION, n / torch_best, torch_best / nn_best);
#else
    std::printf("(libtorch not built in: configure with -DCKPT_BENCH_TORCH=ON to compare)\n");
#endif

    // A checkpoint at every epoch end against none, alternately; the time spent in the
    // checkpoint callback is also timed on its own.
    char tmpl[] = "/tmp/ckpt-bench-lenet-XXXXXX";
    if (!::mkdtemp(tmpl)) return 1;
    for (const bool async : {false, true}) {
        double with = 0, without = 0, in_save = 0;
        {
            ckpt::ManagerOptions opts;
            opts.async_save = async;
            Timed cb{nn::ModelCheckpoint<ckpt::EveryEpochs, ckpt::KeepLast>(tmpl, "lenet", opts), 0.0};
            for (int r = 0; r < rounds; ++r) {
                without += ours.epoch(data);
                with += ours.epoch(data, &cb);
            }
            in_save = cb.seconds;
            const std::string mode = async ? "async_save: " : "sync: ";
            check.count(mode + "saves timed at the epochs' ends", rounds, cb.saves);
            check.rate(mode + "save on the training thread (mean)", state_bytes, in_save / rounds);
        }
        std::printf("checkpoint per epoch (%s): %.2f ms on the training thread per save = %.3f%% of an epoch; "
                    "epochs with saves vs without %+.2f%%\n",
                    async ? "async_save" : "sync", 1e3 * in_save / rounds, 100.0 * in_save / without,
                    100.0 * (with - without) / without);
    }
    fs::remove_all(tmpl);
    std::printf("train_lenet images_per_s=%.0f\n", n / nn_best);
    check.at_least("batches of 32 in an epoch", 1, data.steps_per_epoch());
    check.count("steps trained, every epoch whole", ours.epochs * data.steps_per_epoch(), ours.seen.steps);
    check.positive("fastest epoch's time", nn_best);
    return check.status();
}
