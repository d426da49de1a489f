// A libtorch CNN trained on Fashion-MNIST with a CheckpointManager: asynchronous saves every
// N steps and at every epoch end, where the validation loss is recorded; retention keeps the
// newest 2 checkpoints and the 3 with the lowest validation loss. Killed at any moment and
// run again with the same command, it resumes from the newest valid checkpoint (it says
// which) and ends with the same parameters, bit for bit, as a run that never stopped.
//
//   torch_resume [--data DIR] [--dir DIR] [--epochs N] [--save-steps N] [--limit N]
//                [--test-limit N] [--shuffle SEED] [--batch-size N] [--lr X] [--seed N]
//                [--init FILE] [--fresh] [--quiet] [--help]

#include <ckpt/types/torch.hpp>
#include <nn/data.hpp>
#include "../common/cli.hpp"
#include "../common/params_hash.hpp"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <cstdio>
#include <deque>
#include <iostream>
#include <optional>
#include <string>

namespace fs = boost::filesystem;
namespace F = torch::nn::functional;

namespace {

struct Options {
    fs::path data = "/usr/share/datasets/fashion-mnist";
    fs::path dir = "./torch_ckpt";
    std::int64_t epochs = 5;
    std::int64_t save_steps = 0;
    std::int64_t limit = 0;
    std::int64_t test_limit = 0;
    std::uint64_t shuffle = 7;
    std::int64_t batch_size = 32;
    double lr = 1e-3;
    std::uint64_t seed = 1;
    std::optional<fs::path> init;
    bool fresh = false;
    bool quiet = false;
};

constexpr const char* usage_text =
    "torch_resume [--data DIR] [--dir DIR] [--epochs N] [--save-steps N] [--limit N]\n"
    "                    [--test-limit N] [--shuffle SEED] [--batch-size N] [--lr X] [--seed N]\n"
    "                    [--init FILE] [--fresh] [--quiet] [--help]";
constexpr const char* options_text =
    "Trains a small libtorch CNN on Fashion-MNIST (Adam, one thread) with checkpoints in DIR,\n"
    "written in the background: at every epoch end, with the validation loss and accuracy,\n"
    "and every N steps with --save-steps. Retention keeps the newest 2 and the 3 with the\n"
    "lowest validation loss, counted over every run in DIR, so that restarts do not fill the\n"
    "disk. It prints \"saved at epoch E, step S of N\" once a checkpoint is\n"
    "durable, and ends with final_params_xxh64=<hash of the parameters and buffers>.\n"
    "Started again after being killed, the same command resumes from the newest valid\n"
    "checkpoint in DIR and ends with the same hash as a run that never stopped.\n"
    "\n"
    "  --data DIR         MNIST-format data (default /usr/share/datasets/fashion-mnist)\n"
    "  --dir DIR          checkpoint directory (default ./torch_ckpt)\n"
    "  --epochs N         epochs to train (default 5)\n"
    "  --save-steps N     also save every N steps (default: at epoch ends only)\n"
    "  --limit N          train on the first N training images (default: all)\n"
    "  --test-limit N     validate on the first N test images (default: all)\n"
    "  --shuffle SEED     the order of the training images in epoch E is drawn from SEED and E\n"
    "                     (default 7); a resume under another is refused, as the step would\n"
    "                     take other images\n"
    "  --batch-size N     images a step takes (default 32); a resume under another is refused\n"
    "  --lr X             Adam's learning rate (default 0.001); a resumed run goes on with the\n"
    "                     checkpoint's, and says so when X differs from it\n"
    "  --seed N           seed of the initial weights and of dropout (default 1)\n"
    "  --init FILE        start from the weights in FILE (a checkpoint whose model.* entries\n"
    "                     are the network's, e.g. made by `ckpt import state_dict.pt FILE\n"
    "                     --rename =model.`); ignored when DIR has a checkpoint to resume from\n"
    "  --fresh            train from the start, ignoring the checkpoints in DIR; they are kept\n"
    "                     (nothing is deleted) and this run writes under the next run prefix,\n"
    "                     which later runs resume from\n"
    "  --quiet            no loss lines\n"
    "  --help             this text\n"
    "\n"
    "Exit status: 0 trained (or found nothing left to train), 1 an error, 2 a usage error.\n";

Options parse(int argc, char** argv) {
    Options o;
    examples::Cli cli(argc, argv, usage_text, options_text);
    while (const auto a = cli.next()) {
        if (*a == "--data") o.data = cli.value();
        else if (*a == "--dir") o.dir = cli.value();
        else if (*a == "--epochs") o.epochs = cli.count();
        else if (*a == "--save-steps") o.save_steps = cli.count();
        else if (*a == "--limit") o.limit = cli.count();
        else if (*a == "--test-limit") o.test_limit = cli.count();
        else if (*a == "--shuffle") o.shuffle = static_cast<std::uint64_t>(cli.count());
        else if (*a == "--batch-size") o.batch_size = cli.count();
        else if (*a == "--lr") {
            const std::string v = cli.value();
            char* end = nullptr;
            o.lr = std::strtod(v.c_str(), &end);
            if (v.empty() || *end || !(o.lr > 0)) cli.fail("--lr needs a number above 0, got '" + v + "'");
        }
        else if (*a == "--seed") o.seed = static_cast<std::uint64_t>(cli.count());
        else if (*a == "--init") o.init = cli.value();
        else if (*a == "--fresh") o.fresh = true;
        else if (*a == "--quiet") o.quiet = true;
        else cli.unknown();
    }
    if (o.epochs < 1) cli.fail("--epochs must be at least 1");
    if (o.batch_size < 1) cli.fail("--batch-size must be at least 1");
    return o;
}

// The network, with the same names as tests/python/torch_net.py's: conv1, conv2, fc1, fc2.
struct NetImpl : torch::nn::Module {
    NetImpl()
        : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5)))),
          conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 5)))),
          fc1(register_module("fc1", torch::nn::Linear(16 * 4 * 4, 64))),
          fc2(register_module("fc2", torch::nn::Linear(64, 10))) {}
    torch::Tensor forward(torch::Tensor x) {
        x = F::max_pool2d(torch::relu(conv1->forward(x)), F::MaxPool2dFuncOptions(2));
        x = F::max_pool2d(torch::relu(conv2->forward(x)), F::MaxPool2dFuncOptions(2));
        x = F::dropout(torch::relu(fc1->forward(x.flatten(1))), F::DropoutFuncOptions().p(0.25).training(is_training()));
        return fc2->forward(x);
    }
    torch::nn::Conv2d conv1, conv2;
    torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

struct Data {
    torch::Tensor images;  // [n, 1, 28, 28] float in [0, 1]
    torch::Tensor labels;  // [n] int64
};

Data load(const fs::path& dir, const std::string& stem, std::int64_t limit) {
    const auto images_file = nn::detail::find_idx(dir, stem, "images-idx3-ubyte");
    const auto labels_file = nn::detail::find_idx(dir, stem, "labels-idx1-ubyte");
    if (!images_file || !labels_file)
        throw std::runtime_error("no " + stem + "-images/labels IDX files in '" + dir.string() + "'");
    auto img = nn::detail::read_idx(*images_file, 3);
    auto lab = nn::detail::read_idx(*labels_file, 1);
    auto n = static_cast<std::int64_t>(img.dims[0]);
    if (limit > 0 && limit < n) n = limit;
    Data d;
    d.images = torch::from_blob(img.data.data(), {n, 1, 28, 28}, torch::kUInt8).to(torch::kFloat32).div_(255.0);
    d.labels = torch::from_blob(lab.data.data(), {n}, torch::kUInt8).to(torch::kInt64);
    return d;
}

// The order of the training images in `epoch` (counted from 1): a permutation drawn from
// its own generator, so that a resumed run finds it again without saving it.
torch::Tensor order_of(std::uint64_t shuffle, std::int64_t epoch, std::int64_t n) {
    auto gen = at::detail::createCPUGenerator(shuffle * 1000003u + static_cast<std::uint64_t>(epoch));
    return torch::randperm(n, gen, torch::kInt64);
}

struct Validation {
    double loss = 0;
    std::int64_t correct = 0;
    std::int64_t total = 0;
    double accuracy() const { return total ? static_cast<double>(correct) / static_cast<double>(total) : 0; }
};

Validation validate(Net& net, const Data& test) {
    torch::NoGradGuard no_grad;
    net->eval();
    Validation v;
    const auto out = net->forward(test.images);
    v.loss = F::cross_entropy(out, test.labels).item<double>();
    v.correct = out.argmax(1).eq(test.labels).sum().item<std::int64_t>();
    v.total = test.labels.size(0);
    net->train();
    return v;
}

// The parameters' and buffers' bytes, hashed (examples/common/params_hash.hpp).
std::string params_xxh64(Net& net) {
    std::vector<std::pair<const void*, std::size_t>> ranges;
    for (const auto& t : net->parameters()) ranges.emplace_back(t.data_ptr(), t.numel() * t.element_size());
    for (const auto& t : net->buffers()) ranges.emplace_back(t.data_ptr(), t.numel() * t.element_size());
    return examples::xxh64_hex(ranges);
}

// Saves every `steps` global steps (when > 0) and at every epoch end.
struct StepsAndEpochs {
    std::int64_t steps = 0;
    bool should_save(const ckpt::Progress& p) const {
        return p.event == ckpt::Event::epoch_end || (steps > 0 && ckpt::EverySteps(steps).should_save(p));
    }
    void saved(const ckpt::Progress&) const {}
};

using Retention = ckpt::KeepUnion<ckpt::KeepLast, ckpt::KeepBest>;
using Manager = ckpt::CheckpointManager<StepsAndEpochs, Retention>;

int run(const Options& o) {
    torch::set_num_threads(1);  // one thread: the same arithmetic in every run
    const Data train = load(o.data, "train", o.limit);
    const Data test = load(o.data, "t10k", o.test_limit);
    const std::int64_t n = train.images.size(0);
    const std::int64_t steps_per_epoch = n / o.batch_size;
    if (steps_per_epoch == 0) throw std::runtime_error("fewer training images than one batch");

    torch::manual_seed(o.seed);
    Net net;
    torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(o.lr));
    // where the run is in its data; the order's seed and the batch size decide which images a
    // step takes, so a resume under others is refused
    ckpt::DataPosition position{.seed = o.shuffle, .batch_size = o.batch_size};
    ckpt::TorchState state(net, optimizer);
    state.data_position(position);

    ckpt::ManagerOptions mo;
    mo.async_save = true;
    Manager mgr(o.dir, "torch", StepsAndEpochs{o.save_steps},
                Retention{ckpt::KeepLast{2}, ckpt::KeepBest{3, "val_loss", ckpt::Mode::min}},
                ckpt::MindSporeNaming{}, mo);
    const auto restored = o.fresh ? std::nullopt : mgr.restore(state);
    std::int64_t global_step = position.epoch > 0 ? (position.epoch - 1) * steps_per_epoch + position.step : 0;
    if (restored) {
        std::printf("resuming from %s: saved at epoch %lld, step %lld of %lld (global step %lld)\n",
                    restored->file.path.string().c_str(), static_cast<long long>(position.epoch),
                    static_cast<long long>(position.step), static_cast<long long>(steps_per_epoch),
                    static_cast<long long>(global_step));
    } else if (o.init) {
        ckpt::TorchState weights(net, {.generator = false});
        const auto report = ckpt::load_checkpoint_into(*o.init, weights, /*strict=*/false);
        if (!report.param_not_load.empty())
            throw ckpt::LoadMismatch("'" + o.init->string() + "' lacks the network's '" + report.param_not_load.front() +
                                     "' (" + std::to_string(report.param_not_load.size()) + " missing)");
        const auto v = validate(net, test);
        std::printf("initialized from %s: test accuracy %.4f (%lld/%lld)\n", o.init->string().c_str(), v.accuracy(),
                    static_cast<long long>(v.correct), static_cast<long long>(v.total));
    } else if (o.fresh) {
        std::printf("--fresh: training from the start; the checkpoints in '%s' stay, this run writes under the run "
                    "prefix '%s'\n", o.dir.string().c_str(), mgr.run_prefix().c_str());
    } else {
        std::printf("no valid checkpoint of 'torch' in '%s': training from the start\n", o.dir.string().c_str());
    }
    std::fflush(stdout);

    // "saved …" once a file is durable: the background writer finishes them in order
    std::deque<std::string> pending;
    auto report_durable = [&, written = std::int64_t{0}]() mutable {
        for (const auto now = mgr.async_stats().written; written < now && !pending.empty(); ++written) {
            std::printf("saved at epoch %s\n", pending.front().c_str());
            pending.pop_front();
        }
        std::fflush(stdout);
    };
    auto note = [&](const std::optional<ckpt::Path>& file, std::int64_t epoch, std::int64_t step) {
        if (file)
            pending.push_back(std::to_string(epoch) + ", step " + std::to_string(step) + " of " +
                              std::to_string(steps_per_epoch) + ": " + file->filename().string());
    };

    Validation last;
    for (std::int64_t epoch = global_step / steps_per_epoch + 1; epoch <= o.epochs; ++epoch) {
        const auto order = order_of(o.shuffle, epoch, n);
        double loss_sum = 0;
        for (std::int64_t step = global_step % steps_per_epoch + 1; step <= steps_per_epoch; ++step) {
            const auto idx = order.slice(0, (step - 1) * o.batch_size, step * o.batch_size);
            optimizer.zero_grad();
            const auto loss = F::cross_entropy(net->forward(train.images.index_select(0, idx)),
                                               train.labels.index_select(0, idx));
            loss.backward();
            optimizer.step();
            ++global_step;
            position.epoch = epoch;
            position.step = step;
            loss_sum += loss.item<double>();
            ckpt::Progress p;
            p.epoch = epoch;
            p.step = step;
            p.global_step = global_step;
            if (step < steps_per_epoch) {
                note(mgr.on_step(p, state), epoch, step);
            } else {  // the epoch's checkpoint records how well it does
                last = validate(net, test);
                p.metrics = {{"val_loss", last.loss}, {"val_accuracy", last.accuracy()}};
                note(mgr.on_epoch_end(p, state), epoch, step);
                if (!o.quiet)
                    std::printf("epoch %lld: train loss %.4f, val loss %.4f, val accuracy %.4f\n",
                                static_cast<long long>(epoch), loss_sum / static_cast<double>(steps_per_epoch),
                                last.loss, last.accuracy());
            }
            report_durable();
        }
    }
    mgr.wait();
    report_durable();
    if (last.total == 0) last = validate(net, test);  // nothing left to train
    std::printf("final test accuracy: %.4f (%lld/%lld)\n", last.accuracy(), static_cast<long long>(last.correct),
                static_cast<long long>(last.total));
    if (const auto best = ckpt::best(o.dir, "torch", "val_loss", ckpt::Mode::min))
        std::printf("best checkpoint by val_loss: %s\n", best->filename().string().c_str());
    const auto stats = mgr.async_stats();
    std::printf("async saves: %lld written, training thread blocked %.1f ms at most\n", static_cast<long long>(stats.written),
                stats.max_blocked_seconds * 1e3);
    std::printf("final_params_xxh64=%s\n", params_xxh64(net).c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    try {
        return run(o);
    } catch (const ckpt::LoadMismatch& e) {
        std::fprintf(stderr, "torch_resume: %s\n(the checkpoints in '%s' do not fit this run: resume with the settings "
                     "they were made with, or train from the start with --fresh)\n", e.what(), o.dir.string().c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "torch_resume: %s\n", e.what());
    }
    return 1;
}
