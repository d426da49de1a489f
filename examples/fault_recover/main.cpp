// The seed's fault-recovery tutorial: LeNet5 on (Fashion-)MNIST, a checkpoint every epoch
// (keep 5), a failure at the end of epoch 6, then find the latest checkpoint, load it and
// resume to epoch 10. The resumed run ends with the same parameters, bit for bit, as a run
// that never failed: compare the last line with that of --no-fault.
//
// Killed (SIGKILL, out of memory, preemption) and started again with the same command, it
// resumes from the newest valid checkpoint in --dir and ends as a run that was never killed.
// With --save-steps N it also saves every N steps, and resumes from the middle of an epoch.
//
//   fault_recover [--data DIR] [--dir DIR] [--epochs N] [--fail-at-epoch K] [--no-fault]
//                 [--save-steps N] [--fresh] [--limit N] [--test-limit N] [--shuffle SEED]
//                 [--threads N] [--seed N] [--quiet] [--help]

#include <nn/nn.hpp>
#include "../common/cli.hpp"
#include "../common/params_hash.hpp"
#include "../common/resume.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace fs = boost::filesystem;

namespace {

struct Options {
    fs::path data = "/usr/share/datasets/fashion-mnist";
    fs::path dir = "./lenet";
    std::int64_t epochs = 10;
    std::int64_t fail_at_epoch = 6;
    bool fault = true;
    std::int64_t save_steps = 0;
    bool fresh = false;
    std::size_t limit = 0;
    std::size_t test_limit = 0;
    std::optional<std::uint64_t> shuffle;
    int threads = 1;
    std::uint64_t seed = 1;
    bool quiet = false;
};

constexpr const char* usage_text =
    "fault_recover [--data DIR] [--dir DIR] [--epochs N] [--fail-at-epoch K] [--no-fault]\n"
    "                     [--save-steps N] [--fresh] [--limit N] [--test-limit N] [--shuffle SEED]\n"
    "                     [--threads N] [--seed N] [--quiet] [--help]";
constexpr const char* options_text =
    "Trains LeNet5 on Fashion-MNIST with a checkpoint per epoch in DIR (lenet-{epoch}_{step}.ckpt,\n"
    "the newest 5 of each run kept) and ends with final_params_xxh64=<hash of the parameters>.\n"
    "Started again after being killed, the same command resumes from the newest valid checkpoint\n"
    "in DIR (it says which, and at which epoch and step) and ends with the same hash as a run that\n"
    "never stopped. A run that resumes writes its files under the next run prefix (lenet_1-…).\n"
    "\n"
    "  --data DIR         MNIST-format data (default /usr/share/datasets/fashion-mnist)\n"
    "  --dir DIR          checkpoint directory (default ./lenet)\n"
    "  --epochs N         epochs to train (default 10)\n"
    "  --fail-at-epoch K  the scripted failure: an exception at the end of epoch K (default 6),\n"
    "                     after which the program finds the latest checkpoint, loads it and\n"
    "                     resumes; a run resuming from past epoch K does not fail again\n"
    "  --no-fault         no scripted failure\n"
    "  --save-steps N     also save every N global steps (printed: \"saved FILE\"), so a killed\n"
    "                     run loses at most N steps and resumes in the middle of an epoch\n"
    "  --fresh            train from the start, ignoring the checkpoints in DIR; they are kept\n"
    "                     (nothing is deleted) and this run writes under the next run prefix,\n"
    "                     which later runs resume from\n"
    "  --limit N          train on the first N training images (default: all)\n"
    "  --test-limit N     test on the first N test images (default: all)\n"
    "  --shuffle SEED     a new order of the training images each epoch, drawn from SEED and\n"
    "                     the epoch (default: the seed's fixed order)\n"
    "  --threads N        BLAS threads (default 1; the hash is reproducible for a given count)\n"
    "  --seed N           seed of the initial weights (default 1)\n"
    "  --quiet            no loss and time lines per epoch\n"
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
        else if (*a == "--fail-at-epoch") o.fail_at_epoch = cli.count();
        else if (*a == "--no-fault") o.fault = false;
        else if (*a == "--save-steps") o.save_steps = cli.count();
        else if (*a == "--fresh") o.fresh = true;
        else if (*a == "--limit") o.limit = static_cast<std::size_t>(cli.count());
        else if (*a == "--test-limit") o.test_limit = static_cast<std::size_t>(cli.count());
        else if (*a == "--shuffle") o.shuffle = static_cast<std::uint64_t>(cli.count());
        else if (*a == "--threads") o.threads = static_cast<int>(cli.count());
        else if (*a == "--seed") o.seed = static_cast<std::uint64_t>(cli.count());
        else if (*a == "--quiet") o.quiet = true;
        else cli.unknown();
    }
    if (o.epochs < 1) cli.fail("--epochs must be at least 1");
    if (o.fault && (o.fail_at_epoch < 1 || o.fail_at_epoch >= o.epochs))
        cli.fail("--fail-at-epoch must be between 1 and epochs - 1");
    if (o.threads < 1) cli.fail("--threads must be at least 1");
    return o;
}

// The seed's create_dataset: Rescale(1/255) + Resize(32, 32) + HWC2CHW, int32 labels,
// batches of 32 without the remainder, no shuffle.
nn::MnistDataset create_dataset(const fs::path& dir, nn::Usage usage, std::size_t limit, bool drop_remainder) {
    nn::MnistDataset ds(dir, usage);
    if (limit) ds.take(limit);
    ds.map({nn::Rescale(1.0 / 255.0, 0), nn::Resize(32, 32), nn::HWC2CHW()});
    ds.map_label(nn::TypeCast(ckpt::DType::int32));
    ds.batch(32, drop_remainder);
    return ds;
}

// The checkpoint directory as the seed shows it: each run's meta file, then its checkpoints
// by epoch and step, runs in order; other files last.
void print_tree(const fs::path& dir, const std::string& prefix) {
    const ckpt::MindSporeNaming naming;
    std::vector<std::string> lines, shown;
    std::string run;
    for (const auto& c : ckpt::list_checkpoints(dir, prefix, naming)) {
        if (c.name.run_prefix != run) {
            run = c.name.run_prefix;
            if (fs::exists(dir / naming.meta_name(run))) lines.push_back(naming.meta_name(run));
        }
        lines.push_back(c.path.filename().string());
    }
    std::vector<std::string> others;
    for (const auto& e : fs::directory_iterator(dir))
        if (std::find(lines.begin(), lines.end(), e.path().filename().string()) == lines.end())
            others.push_back(e.path().filename().string());
    std::sort(others.begin(), others.end());
    lines.insert(lines.end(), others.begin(), others.end());
    std::cout << "└── " << dir.filename().string() << "\n";
    for (std::size_t i = 0; i < lines.size(); ++i)
        std::cout << "     " << (i + 1 < lines.size() ? "├── " : "└── ") << lines[i] << "\n";
}

// Prints the test accuracy after every epoch, and hands it to the epoch's checkpoint (listed
// before the checkpoint callback): `ckpt ls DIR --best accuracy:max` finds the best epoch.
struct TestAccuracy {
    nn::Trainer<nn::LeNet5, nn::Momentum>* trainer;
    const nn::MnistDataset* test;
    double last = 0;
    void on_epoch_end(nn::RunContext& ctx) {
        last = trainer->evaluate(*test);
        ctx.metrics.emplace_back("accuracy", last);
        std::printf("epoch: %lld test accuracy: %.4f\n", static_cast<long long>(ctx.epoch), last);
        std::fflush(stdout);
    }
};

// A checkpoint at every epoch end, and every `steps` global steps when steps > 0.
struct EpochsAndSteps {
    std::int64_t steps = 0;
    bool should_save(const ckpt::Progress& p) const {
        return ckpt::EveryEpochs(1).should_save(p) || (steps > 0 && ckpt::EverySteps(steps).should_save(p));
    }
    void saved(const ckpt::Progress&) const {}
};

using Checkpoints = nn::ModelCheckpoint<EpochsAndSteps, ckpt::KeepLast>;

// Prints "saved FILE" for each checkpoint written (--save-steps); runs after Checkpoints.
struct SaveReport {
    const Checkpoints* checkpoints;
    bool enabled;
    std::optional<fs::path> shown;
    void report() {
        const auto& file = checkpoints->last_saved();
        if (!enabled || !file || file == shown) return;
        shown = file;
        std::printf("saved %s\n", file->filename().string().c_str());
        std::fflush(stdout);
    }
    void on_step_end(nn::RunContext&) { report(); }
    void on_epoch_end(nn::RunContext&) { report(); }
};

ckpt::ManagerOptions checkpoint_options() {
    ckpt::ManagerOptions o;
    o.append_info = {"epoch_num", "step_num", ckpt::ParamDict{{"lr", 0.01}, {"momentum", 0.9}}};
    // the seed's tree: each run keeps its own five files (lenet-2 … 6, then lenet_1-7 … 10)
    o.retention_scope = ckpt::RetentionScope::current_run;
    return o;
}

// One training session: a fresh process' worth of objects, resumed from `from` if given.
// Returns the final parameter hash, or nothing when the injected fault ended it; the fault
// is injected only when `inject` and the session starts before the end of its epoch.
std::optional<std::string> session(const Options& o, const std::optional<fs::path>& from, bool inject) {
    auto train = create_dataset(o.data, nn::Usage::train, o.limit, true);
    if (o.shuffle) train.shuffle(*o.shuffle);  // the order is saved with each checkpoint
    auto test = create_dataset(o.data, nn::Usage::test, o.test_limit, false);
    nn::LeNet5 net(10, 1, o.seed);                     // the model
    nn::Momentum opt(net.parameters(), 0.01, 0.9);     // the optimizer
    nn::Trainer trainer(net, opt);                     // Model(net, loss_fn, optimizer)
    TestAccuracy accuracy{&trainer, &test};
    std::int64_t initial_epoch = 0;
    if (from) {
        const nn::ResumePoint rp = trainer.resume_from(*from, train);
        std::printf("%s\n", examples::resume_message(rp, train.steps_per_epoch(), o.epochs).c_str());
        if (rp.rest.contains("epoch_num"))  // the seed's append_info, as saved
            std::printf("  append_info: epoch_num=%lld step_num=%lld lr=%g momentum=%g\n",
                        static_cast<long long>(rp.rest.get<std::int64_t>("epoch_num")),
                        static_cast<long long>(rp.rest.get<std::int64_t>("step_num")), rp.rest.get<double>("lr"),
                        rp.rest.get<double>("momentum"));
        std::fflush(stdout);
        initial_epoch = rp.initial_epoch;
        if (initial_epoch >= o.epochs) {  // killed after the last save: the result is in the file
            accuracy.last = trainer.evaluate(test);
            std::printf("final test accuracy: %.4f\n", accuracy.last);
            return examples::params_xxh64(net.parameters());
        }
    }
    Checkpoints ckpt_cb(o.dir, "lenet", checkpoint_options(), EpochsAndSteps{o.save_steps}, ckpt::KeepLast(5));
    SaveReport saves{&ckpt_cb, o.save_steps > 0, std::nullopt};
    std::ostream discard(nullptr);  // --quiet: a stream without a buffer prints nothing
    std::ostream& log = o.quiet ? discard : std::cout;
    nn::LossMonitor loss_cb(train.steps_per_epoch(), log);
    nn::TimeMonitor time_cb(log);
    nn::FailAtEpochEnd crash(inject && initial_epoch < o.fail_at_epoch ? o.fail_at_epoch : -1);
    try {
        trainer.train(o.epochs, train, nn::callbacks(accuracy, ckpt_cb, saves, loss_cb, time_cb, crash), initial_epoch);
    } catch (const nn::InjectedFault& e) {
        std::printf("Some errors happen. (%s)\n", e.what());
        return std::nullopt;
    }
    std::printf("final test accuracy: %.4f\n", accuracy.last);
    return examples::params_xxh64(net.parameters());
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    nn::set_blas_threads(o.threads);
    try {
        std::optional<fs::path> from;  // the run goes on from the newest valid checkpoint, if any
        const std::size_t present =
            fs::is_directory(o.dir) ? ckpt::list_checkpoints(o.dir, "lenet", ckpt::MindSporeNaming{}).size() : 0;
        if (!o.fresh && present) from = ckpt::latest(o.dir, "lenet");
        if (o.fresh && present)
            std::printf("--fresh: training from the start; the %zu checkpoints in '%s' stay, this run writes under a "
                        "new run prefix\n",
                        present, o.dir.string().c_str());
        else if (!from)
            std::printf("no valid checkpoint of 'lenet' in '%s': training from the start\n", o.dir.string().c_str());
        std::fflush(stdout);
        std::optional<std::string> hash = session(o, from, o.fault);
        if (!hash) {
            std::printf("\nafter the failure:\n");
            print_tree(o.dir, "lenet");
            const auto latest = ckpt::latest(o.dir, "lenet");  // the newest checkpoint that verifies
            if (!latest) {
                std::fprintf(stderr, "fault_recover: no valid checkpoint in '%s'\n", o.dir.string().c_str());
                return 1;
            }
            std::printf("latest checkpoint: %s\n\n", latest->filename().string().c_str());
            hash = session(o, latest, false);
        }
        std::printf("\nafter training:\n");
        print_tree(o.dir, "lenet");
        std::printf("final_params_xxh64=%s\n", hash->c_str());
    } catch (const ckpt::LoadMismatch& e) {
        std::fprintf(stderr, "fault_recover: %s\n(the checkpoints in '%s' are of other options; --fresh starts over)\n",
                     e.what(), o.dir.string().c_str());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fault_recover: %s\n", e.what());
        return 1;
    }
}
