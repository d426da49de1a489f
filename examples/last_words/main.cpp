// The seed's last-words tutorial: data-parallel training on N ranks (threads of this
// process, talking through fault::ThreadComm) with the seed's 5-layer network. When a rank
// fails mid-training, the survivors save the newest consistent step from a healthy replica
// into the seed's layout; --recover resumes from it at the next step. The recovered run
// ends with the same parameters, bit for bit, as a run that never failed (--no-fault).
//
//   last_words [--ranks N] [--shard-size S] [--fail-rank R] [--fail-step S] [--no-fault]
//              [--recover] [--epochs N] [--limit N] [--small] [--data DIR] [--dir DIR]
//
// --shard-size S shards the optimizer state S ways (the seed's optimizer_weight_shard_size):
// the last words then hold one file per replica group, and each rank resumes from its own.
//
// SIGTERM or SIGINT (as sent before a preemption) stops every rank at the same step with
// last words too.
//
// Exit status: 0 trained to the end; 3 a rank failed and the last words were saved;
// 143 (fault::preempted_exit_status) stopped by a signal, last words saved;
// 1 a rank failed and nothing could be saved, or another error.

#include <fault/fault.hpp>
#include "../common/cli.hpp"
#include "../common/params_hash.hpp"
#include "../common/seed_data.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>

namespace fs = boost::filesystem;

namespace {

struct Options {
    int ranks = 4;
    int shard_size = 1;
    int fail_rank = 1;
    std::int64_t fail_step = 12;
    bool fault = true;
    bool recover = false;
    std::int64_t epochs = 1;
    std::size_t limit = 2560;  // 20 global steps of 4 x 32: the full network is large for a CPU
    bool small = false;
    fs::path data = "/usr/share/datasets/fashion-mnist";
    fs::path dir = "./ttp_checkpoints";
};

[[noreturn]] void usage(const std::string& why) {
    std::cerr << "last_words: " << why << "\n"
              << "usage: last_words [--ranks N] [--shard-size S] [--fail-rank R] [--fail-step S] [--no-fault]\n"
              << "                  [--recover] [--epochs N] [--limit N] [--small] [--data DIR] [--dir DIR]\n";
    std::exit(2);
}

Options parse(int argc, char** argv) {
    Options o;
    auto number = [&](int& i) { return examples::count_after(argc, argv, i, usage); };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--ranks") o.ranks = static_cast<int>(number(i));
        else if (a == "--shard-size") o.shard_size = static_cast<int>(number(i));
        else if (a == "--fail-rank") o.fail_rank = static_cast<int>(number(i));
        else if (a == "--fail-step") o.fail_step = number(i);
        else if (a == "--no-fault") o.fault = false;
        else if (a == "--recover") o.recover = true;
        else if (a == "--epochs") o.epochs = number(i);
        else if (a == "--limit") o.limit = static_cast<std::size_t>(number(i));
        else if (a == "--small") o.small = true;
        else if (a == "--data" && i + 1 < argc) o.data = argv[++i];
        else if (a == "--dir" && i + 1 < argc) o.dir = argv[++i];
        else usage("unknown option '" + a + "'");
    }
    if (o.ranks < 2) usage("--ranks must be at least 2: the last words come from a replica");
    if (o.fault && o.fail_rank >= o.ranks) usage("--fail-rank must be below --ranks");
    if (o.epochs < 1) usage("--epochs must be at least 1");
    if (o.recover) o.fault = false;
    return o;
}


// The last-words directory as the seed shows it, entries in name order.
void print_tree(const fs::path& dir, const std::string& indent = "") {
    if (indent.empty()) std::cout << dir.filename().string() << "/\n";
    std::vector<fs::path> entries(fs::directory_iterator(dir), fs::directory_iterator{});
    std::sort(entries.begin(), entries.end());
    for (std::size_t i = 0; i < entries.size(); ++i) {
        const bool last = i + 1 == entries.size();
        std::cout << indent << (last ? "└── " : "├── ") << entries[i].filename().string() << "\n";
        if (fs::is_directory(entries[i])) print_tree(entries[i], indent + (last ? "    " : "│   "));
    }
}

template <class Net>
int run(const Options& o) {
    using DpOpt = fault::DataParallelOptimizer<nn::SGD, fault::ThreadComm>;
    using Opt = nn::FailingOptimizer<DpOpt>;
    const fault::ShardLayout layout{o.shard_size};
    layout.require_replicas(o.ranks, "a last-words checkpoint");
    fault::ThreadGroup group(o.ranks, std::chrono::seconds(60));
    fault::TerminationSignals signals;  // SIGTERM/SIGINT: last words at the next step end
    std::mutex out;
    std::vector<std::string> hashes(static_cast<std::size_t>(o.ranks));
    std::vector<fault::LastWordsOutcome> outcomes(static_cast<std::size_t>(o.ranks));
    std::vector<fs::path> from(static_cast<std::size_t>(o.ranks));  // each rank's file: its piece of the state
    if (o.recover) {
        for (int r = 0; r < o.ranks; ++r) {
            const auto file = fault::latest_last_words(o.dir, layout, r);
            if (!file) {
                std::fprintf(stderr, "last_words: no complete last-words checkpoint in '%s'\n", o.dir.string().c_str());
                return 1;
            }
            from[static_cast<std::size_t>(r)] = *file;
            std::printf("rank %d recovers from %s\n", r, fs::relative(*file, o.dir).string().c_str());
        }
    }
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = examples::seed_dp_dataset(o.data, o.limit, o.ranks, comm.rank());
        Net net;  // every rank starts from the same seed
        // SGD(0.01) in the seed's OptTFTWrapper, its state sharded as the layout says
        fault::ShardedOptimizer<nn::SGD, fault::ThreadComm> sgd(net.parameters(), comm, layout, 1e-2);
        DpOpt& dp = sgd.optimizer();
        Opt opt(dp, o.fail_step, comm.rank(), false);
        nn::Trainer<Net, Opt> trainer(net, opt, {}, comm.rank());
        std::int64_t initial_epoch = 0;
        if (o.recover) {
            const auto rp = trainer.resume_from(from[static_cast<std::size_t>(comm.rank())], data);
            dp.set_completed_steps(rp.global_step);
            opt.set_completed_steps(rp.global_step);
            initial_epoch = rp.initial_epoch;
            if (comm.rank() == 0)
                std::printf("resuming at global step %lld (epoch %lld, step %lld)\n",
                            static_cast<long long>(rp.global_step + 1), static_cast<long long>(rp.initial_epoch + 1),
                            static_cast<long long>(rp.initial_step + 1));
        }
        fault::LastWordsCheckpoint last_words(comm, o.dir, {.layout = layout, .watch_signals = true});
        nn::FailAtStep crash(o.fault ? o.fail_step : 0, o.fail_rank);
        struct Progress {
            std::mutex* out;
            void on_step_end(nn::RunContext& c) {
                if (c.rank == 0 && c.global_step % 10 == 0) {
                    std::lock_guard lock(*out);
                    std::printf("step %lld: loss %.4f\n", static_cast<long long>(c.global_step), double(c.loss));
                    std::fflush(stdout);
                }
            }
        } progress{&out};
        try {
            trainer.train(o.epochs, data, nn::callbacks(progress, crash, last_words), initial_epoch);
        } catch (...) {
            outcomes[static_cast<std::size_t>(comm.rank())] = last_words.outcome();
            throw;
        }
        hashes[static_cast<std::size_t>(comm.rank())] = examples::params_xxh64(net.parameters());
    });
    int failed = -1;
    for (int r = 0; r < o.ranks; ++r)
        if (errors[static_cast<std::size_t>(r)]) {
            try {
                std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
            } catch (const fault::Preempted& p) {
                if (r == 0) {
                    std::printf("%s\n", p.what());
                    print_tree(o.dir);
                    return fault::preempted_exit_status;
                }
            } catch (const fault::PeerFailure&) {
            } catch (const std::exception& e) {
                std::printf("rank %d failed: %s\n", r, e.what());
                failed = r;
            }
        }
    if (failed >= 0) {
        for (const auto& oc : outcomes)
            if (oc.took_part) {
                if (!oc.step_directory) {
                    std::printf("no last words: %s\n", oc.message.c_str());
                    return 1;
                }
                std::printf("last words: global step %lld saved by", static_cast<long long>(*oc.step));
                for (std::size_t j = 0; j < oc.savers.size(); ++j)
                    std::printf("%s rank %d", j ? "," : "", oc.savers[j]);
                if (oc.savers.size() > 1) std::printf(" (one per optimizer-state piece)");
                std::printf("; survivors:");
                for (const auto& r : oc.reports) std::printf(" %lld", static_cast<long long>(r.job_rank));
                std::printf("\n");
                print_tree(o.dir);
                return 3;
            }
        return 1;
    }
    for (int r = 0; r < o.ranks; ++r) {
        if (hashes[static_cast<std::size_t>(r)] != hashes[0]) {
            std::fprintf(stderr, "last_words: rank %d ended with other parameters than rank 0\n", r);
            return 1;
        }
    }
    std::printf("final_params_xxh64=%s\n", hashes[0].c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    nn::set_blas_threads(1);
    try {
        return o.small ? run<nn::UceNet>(o) : run<nn::DataParallelNet>(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "last_words: %s\n", e.what());
        return 1;
    }
}
