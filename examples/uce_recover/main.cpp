// The seed's UCE fault-recovery tutorial: 4 data-parallel ranks (threads talking through
// fault::ThreadComm), each with its parameters and optimizer state on a simulated Ascend
// device (fault::AscendModel). At --fail-step an uncorrectable memory error is injected into
// a tensor of rank --fail-rank; the next step detects it, every rank stops, the device is
// stopped, cleaned and repaired, the state is copied from a healthy replica, the step is
// redone and training runs to the end in the same process, ending with the same parameters
// as a run without the error (--no-fault).
//
//   uce_recover [--ranks N] [--shard-size S] [--fail-rank R] [--fail-step S] [--tensor NAME]
//               [--unrepairable] [--no-fault] [--fresh] [--epochs N] [--limit N] [--data DIR]
//               [--dir DIR] [--help]
//
// As in the seed, UCE repair comes with the last words: when a rank cannot be repaired in
// place (--unrepairable: its device is lost; or no healthy replica keeps its piece of the
// optimizer state, with --shard-size), the others save the last words in --dir. Run again
// with the same command, the job resumes from them (the UCE, at a step already behind it,
// does not recur) and ends as a run without the error.
//
// Exit status: 0 trained to the end; 3 a rank could not be repaired and the last words were
// saved; 1 nothing could be saved, or another error; 2 a usage error.

#include <fault/fault.hpp>
#include "../common/cli.hpp"
#include "../common/fresh.hpp"
#include "../common/params_hash.hpp"
#include "../common/resume.hpp"
#include "../common/seed_data.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace fs = boost::filesystem;

namespace {

struct Options {
    int ranks = 4;
    int shard_size = 1;
    int fail_rank = 1;
    std::int64_t fail_step = 40;
    std::string tensor = "layer2.weight";
    bool fault = true;
    bool repairable = true;
    bool fresh = false;
    std::int64_t epochs = 1;
    std::size_t limit = 12800;
    fs::path data = "/usr/share/datasets/fashion-mnist";
    fs::path dir = "./ttp_checkpoints";
};

constexpr const char* usage_text =
    "uce_recover [--ranks N] [--shard-size S] [--fail-rank R] [--fail-step S] [--tensor NAME]\n"
    "                   [--unrepairable] [--no-fault] [--fresh] [--epochs N] [--limit N] [--data DIR]\n"
    "                   [--dir DIR] [--help]";
constexpr const char* options_text =
    "Trains the seed's 784-512-512-10 network data parallel on N ranks (threads), each on a\n"
    "simulated Ascend device, injects an uncorrectable memory error (UCE) into one rank's\n"
    "tensor, repairs it in place from a healthy replica and ends with\n"
    "final_params_xxh64=<hash of the parameters>, as a run without the error. A rank that\n"
    "cannot be repaired makes the others save the last words in DIR (exit 3); run again with\n"
    "the same command, the job resumes from the newest complete last words in DIR (it says\n"
    "which, and at which epoch and step).\n"
    "\n"
    "  --ranks N        ranks (default 4)\n"
    "  --shard-size S   optimizer state sharded S ways (default 1)\n"
    "  --fail-rank R    the rank whose device fails (default 1)\n"
    "  --fail-step S    after global step S (default 40); a run resuming past S sees no UCE\n"
    "  --tensor NAME    the tensor hit (default layer2.weight)\n"
    "  --unrepairable   the device is lost: the others save the last words\n"
    "  --no-fault       no UCE\n"
    "  --fresh          train from the start: an existing DIR is renamed DIR.old-N first\n"
    "                   (nothing is deleted)\n"
    "  --epochs N       epochs (default 1)\n"
    "  --limit N        the first N training images (default 12800)\n"
    "  --data DIR       MNIST-format data (default /usr/share/datasets/fashion-mnist)\n"
    "  --dir DIR        last-words directory (default ./ttp_checkpoints)\n"
    "  --help           this text\n"
    "\n"
    "Exit status: 0 trained to the end; 3 a rank could not be repaired and the last words were\n"
    "saved; 1 nothing could be saved, or another error; 2 a usage error.\n";

Options parse(int argc, char** argv) {
    Options o;
    examples::Cli cli(argc, argv, usage_text, options_text);
    while (const auto a = cli.next()) {
        if (*a == "--ranks") o.ranks = static_cast<int>(cli.count());
        else if (*a == "--shard-size") o.shard_size = static_cast<int>(cli.count());
        else if (*a == "--unrepairable") o.repairable = false;
        else if (*a == "--dir") o.dir = cli.value();
        else if (*a == "--fail-rank") o.fail_rank = static_cast<int>(cli.count());
        else if (*a == "--fail-step") o.fail_step = cli.count();
        else if (*a == "--tensor") o.tensor = cli.value();
        else if (*a == "--no-fault") o.fault = false;
        else if (*a == "--fresh") o.fresh = true;
        else if (*a == "--epochs") o.epochs = cli.count();
        else if (*a == "--limit") o.limit = static_cast<std::size_t>(cli.count());
        else if (*a == "--data") o.data = cli.value();
        else cli.unknown();
    }
    if (o.ranks < 2) cli.fail("--ranks must be at least 2: the repair copies from a replica");
    if (o.fault && o.fail_rank >= o.ranks) cli.fail("--fail-rank must be below --ranks");
    if (o.fault && o.fail_step < 1) cli.fail("--fail-step must be at least 1 (a step that ends)");
    if (o.epochs < 1) cli.fail("--epochs must be at least 1");
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    nn::set_blas_threads(1);
    using DpOpt = fault::DataParallelOptimizer<nn::Momentum, fault::ThreadComm>;
    const fault::ShardLayout layout{o.shard_size};
    try {
        layout.require_replicas(o.ranks, "UCE repair");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "uce_recover: %s\n", e.what());
        return 1;
    }
    // each rank's file of the newest complete last words (its piece of the state), if any
    std::vector<fs::path> from(static_cast<std::size_t>(o.ranks));
    try {
        if (o.fresh) {
            if (const auto aside = examples::move_aside(o.dir))
                std::printf("--fresh: moved the old last words aside to %s\n", aside->string().c_str());
        } else {
            for (int r = 0; r < o.ranks; ++r)
                if (const auto file = fault::latest_last_words(o.dir, layout, r)) from[static_cast<std::size_t>(r)] = *file;
            if (from[0].empty())
                std::printf("no complete last words in '%s': training from the start\n", o.dir.string().c_str());
            else if (std::any_of(from.begin(), from.end(), [&](const fs::path& f) { return f != from[0]; }))
                for (int r = 0; r < o.ranks; ++r)  // sharded: each rank resumes from its piece
                    std::printf("rank %d resumes from %s\n", r,
                                fs::relative(from[static_cast<std::size_t>(r)], o.dir).string().c_str());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "uce_recover: %s\n", e.what());
        return 1;
    }
    fault::ThreadGroup group(o.ranks, std::chrono::seconds(60));
    std::mutex out;
    std::vector<std::string> hashes(static_cast<std::size_t>(o.ranks));
    std::vector<fault::LastWordsOutcome> outcomes(static_cast<std::size_t>(o.ranks));
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = examples::seed_dp_dataset(o.data, o.limit, o.ranks, comm.rank());
        nn::UceNet net;  // the seed's 784-512-512-10 network, the same seed on every rank
        fault::ShardedOptimizer<nn::Momentum, fault::ThreadComm> momentum(net.parameters(), comm, layout, 0.01, 0.9);
        DpOpt& opt = momentum.optimizer();
        nn::Trainer<nn::UceNet, DpOpt> trainer(net, opt, {}, comm.rank());
        std::int64_t initial_epoch = 0;
        if (const auto& file = from[static_cast<std::size_t>(comm.rank())]; !file.empty()) {
            const auto rp = trainer.resume_from(file, data);
            opt.set_completed_steps(rp.global_step);
            initial_epoch = rp.initial_epoch;
            if (comm.rank() == 0) {
                std::lock_guard lock(out);
                std::printf("%s\n", examples::resume_message(rp, data.steps_per_epoch(), o.epochs).c_str());
                std::fflush(stdout);
            }
        }
        if (initial_epoch >= o.epochs) {  // the last words hold the last step: nothing to train
            hashes[static_cast<std::size_t>(comm.rank())] = examples::params_xxh64(net.parameters());
            return;
        }
        fault::AscendModel device(comm.rank());
        fault::attach(device, trainer.load_target());
        fault::UceRepair repair(comm, device, {.layout = layout});
        fault::LastWordsCheckpoint last_words(comm, o.dir, {.layout = layout});
        fault::InjectUce inject(device, o.tensor, o.fault ? o.fail_step : 0, o.fail_rank, o.repairable);
        struct Report {
            std::mutex* out;
            void on_step_end(nn::RunContext& c) {
                std::lock_guard lock(*out);
                if (c.rank == 0 && c.global_step % 20 == 0)
                    std::printf("step %lld: loss %.4f\n", static_cast<long long>(c.global_step), double(c.loss));
                std::fflush(stdout);
            }
        } report{&out};
        try {
            trainer.train(o.epochs, data, nn::callbacks(repair, inject, report, last_words), initial_epoch);
        } catch (...) {
            outcomes[static_cast<std::size_t>(comm.rank())] = last_words.outcome();
            throw;
        }
        {
            std::lock_guard lock(out);
            for (const auto& r : repair.records())
                if (comm.rank() == r.repaired_rank)
                    std::printf("rank %d: UCE in its device memory repaired at step %lld, state copied from rank %d, "
                                "step %lld %s\n",
                                comm.rank(), static_cast<long long>(r.global_step), r.source_rank,
                                static_cast<long long>(r.global_step + 1), r.redone ? "redone" : "taken from the replica");
        }
        hashes[static_cast<std::size_t>(comm.rank())] = examples::params_xxh64(net.parameters());
    });
    bool failed = false;
    for (int r = 0; r < o.ranks; ++r)
        if (errors[static_cast<std::size_t>(r)]) {
            failed = true;
            try {
                std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
            } catch (const fault::PeerFailure&) {
            } catch (const std::exception& e) {
                std::printf("rank %d failed: %s\n", r, e.what());
            }
        }
    if (failed) {
        for (const auto& oc : outcomes)
            if (oc.took_part) {
                if (!oc.step_directory) {
                    std::printf("no last words: %s\n", oc.message.c_str());
                    return 1;
                }
                std::printf("last words: global step %lld in %s\n", static_cast<long long>(*oc.step),
                            oc.step_directory->string().c_str());
                return 3;
            }
        return 1;
    }
    for (int r = 1; r < o.ranks; ++r)
        if (hashes[static_cast<std::size_t>(r)] != hashes[0]) {
            std::fprintf(stderr, "uce_recover: rank %d ended with other parameters than rank 0\n", r);
            return 1;
        }
    std::printf("final_params_xxh64=%s\n", hashes[0].c_str());
}
