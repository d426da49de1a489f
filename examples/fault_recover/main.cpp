// The seed's fault-recovery tutorial: LeNet5 on (Fashion-)MNIST, a checkpoint every epoch
// (keep 5), a failure at the end of epoch 6, then find the latest checkpoint, load it and
// resume to epoch 10. The resumed run ends with the same parameters, bit for bit, as a run
// that never failed: compare the last line with that of --no-fault.
//
//   fault_recover [--data DIR] [--dir DIR] [--epochs N] [--fail-at-epoch K] [--no-fault]
//                 [--limit N] [--threads N] [--seed N] [--quiet]

#include <nn/nn.hpp>
#include "../common/cli.hpp"
#include "../common/params_hash.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
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
    std::size_t limit = 0;
    int threads = 1;
    std::uint64_t seed = 1;
    bool quiet = false;
};

[[noreturn]] void usage(const std::string& why) {
    std::cerr << "fault_recover: " << why << "\n"
              << "usage: fault_recover [--data DIR] [--dir DIR] [--epochs N] [--fail-at-epoch K] [--no-fault]\n"
              << "                     [--limit N] [--threads N] [--seed N] [--quiet]\n";
    std::exit(2);
}

Options parse(int argc, char** argv) {
    Options o;
    auto number = [&](int& i) { return examples::count_after(argc, argv, i, usage); };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--data" && i + 1 < argc) o.data = argv[++i];
        else if (a == "--dir" && i + 1 < argc) o.dir = argv[++i];
        else if (a == "--epochs") o.epochs = number(i);
        else if (a == "--fail-at-epoch") o.fail_at_epoch = number(i);
        else if (a == "--no-fault") o.fault = false;
        else if (a == "--limit") o.limit = static_cast<std::size_t>(number(i));
        else if (a == "--threads") o.threads = static_cast<int>(number(i));
        else if (a == "--seed") o.seed = static_cast<std::uint64_t>(number(i));
        else if (a == "--quiet") o.quiet = true;
        else usage("unknown option '" + a + "'");
    }
    if (o.epochs < 1) usage("--epochs must be at least 1");
    if (o.fault && (o.fail_at_epoch < 1 || o.fail_at_epoch >= o.epochs))
        usage("--fail-at-epoch must be between 1 and epochs - 1");
    if (o.threads < 1) usage("--threads must be at least 1");
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

// Prints the test accuracy after every epoch.
struct TestAccuracy {
    nn::Trainer<nn::LeNet5, nn::Momentum>* trainer;
    const nn::MnistDataset* test;
    double last = 0;
    void on_epoch_end(nn::RunContext& ctx) {
        last = trainer->evaluate(*test);
        std::printf("epoch: %lld test accuracy: %.4f\n", static_cast<long long>(ctx.epoch), last);
        std::fflush(stdout);
    }
};

using Checkpoints = nn::ModelCheckpoint<ckpt::EveryEpochs, ckpt::KeepLast>;

ckpt::ManagerOptions checkpoint_options() {
    ckpt::ManagerOptions o;
    o.append_info = {"epoch_num", "step_num", ckpt::ParamDict{{"lr", 0.01}, {"momentum", 0.9}}};
    return o;
}

// One training session: a fresh process' worth of objects, resumed from `from` if given.
// Returns the final parameter hash, or nothing when the injected fault ended it.
std::optional<std::string> session(const Options& o, const std::optional<fs::path>& from, bool inject) {
    auto train = create_dataset(o.data, nn::Usage::train, o.limit, true);
    auto test = create_dataset(o.data, nn::Usage::test, 0, false);
    nn::LeNet5 net(10, 1, o.seed);                     // the model
    nn::Momentum opt(net.parameters(), 0.01, 0.9);     // the optimizer
    nn::Trainer trainer(net, opt);                     // Model(net, loss_fn, optimizer)
    std::int64_t initial_epoch = 0;
    if (from) {
        const nn::ResumePoint rp = trainer.resume_from(*from, train);
        std::printf("loaded %s: epoch_num=%lld step_num=%lld lr=%g momentum=%g; resuming at epoch %lld\n",
                    from->filename().string().c_str(), static_cast<long long>(rp.rest.get<std::int64_t>("epoch_num")),
                    static_cast<long long>(rp.rest.get<std::int64_t>("step_num")), rp.rest.get<double>("lr"),
                    rp.rest.get<double>("momentum"), static_cast<long long>(rp.initial_epoch + 1));
        initial_epoch = rp.initial_epoch;
    }
    Checkpoints ckpt_cb("lenet", o.dir, checkpoint_options(), ckpt::EveryEpochs(1), ckpt::KeepLast(5));
    std::ostream discard(nullptr);  // --quiet: a stream without a buffer prints nothing
    std::ostream& log = o.quiet ? discard : std::cout;
    nn::LossMonitor loss_cb(train.steps_per_epoch(), log);
    nn::TimeMonitor time_cb(log);
    TestAccuracy accuracy{&trainer, &test};
    nn::FailAtEpochEnd crash(inject ? o.fail_at_epoch : -1);
    try {
        trainer.train(o.epochs, train, nn::callbacks(ckpt_cb, loss_cb, time_cb, accuracy, crash), initial_epoch);
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
        if (fs::exists(o.dir) && !fs::is_empty(o.dir))
            std::printf("note: '%s' already holds files; this run's files get a new prefix\n", o.dir.string().c_str());
        std::optional<std::string> hash = session(o, std::nullopt, o.fault);
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
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fault_recover: %s\n", e.what());
        return 1;
    }
}
