// The seed's last-words tutorial: data-parallel training on N ranks (threads of this
// process, talking through fault::ThreadComm) with the seed's 5-layer network. When a rank
// fails mid-training, the survivors save the newest consistent step from a healthy replica
// into the seed's layout. Run again with the same command, the job resumes from those last
// words at the next step (the failure, at a step already behind it, does not recur) and ends
// with the same parameters, bit for bit, as a run that never failed (--no-fault).
//
//   last_words [--ranks N] [--shard-size S] [--fail-rank R] [--fail-step S] [--no-fault]
//              [--recover] [--fresh] [--epochs N] [--limit N] [--small] [--data DIR]
//              [--dir DIR] [--help]
//
// --shard-size S shards the optimizer state S ways (the seed's optimizer_weight_shard_size):
// the last words then hold one file per replica group, and each rank resumes from its own.
//
// SIGTERM or SIGINT (as sent before a preemption) stops every rank at the same step with
// last words too.
//
// Ranks as processes: started by ckpt-run (or any launcher setting RANK, WORLD_SIZE and
// CKPT_STORE), each process is one rank talking through fault::GlooComm, and --fail-rank
// dies by a real SIGKILL at the end of --fail-step; the survivors write the last words.
//   ckpt-run --nproc 4 --store file:///tmp/job -- last_words --small --fail-rank 2
// Each rank prints its own final_params_xxh64 (rank R: final_params_xxh64=…).
//
// Exit status: 0 trained to the end; 3 a rank failed and the last words were saved;
// 143 (fault::preempted_exit_status) stopped by a signal, last words saved;
// 1 a rank failed and nothing could be saved, or another error.

#include <fault/fault.hpp>
#include <fault/gloo_comm.hpp>
#include "../common/cli.hpp"
#include "../common/fresh.hpp"
#include "../common/params_hash.hpp"
#include "../common/resume.hpp"
#include "../common/seed_data.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <csignal>
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
    bool recover = false;  // resuming is required: no last words is an error
    bool fresh = false;
    std::int64_t epochs = 1;
    std::size_t limit = 2560;  // 20 global steps of 4 x 32: the full network is large for a CPU
    bool small = false;
    fs::path data = "/usr/share/datasets/fashion-mnist";
    fs::path dir = "./ttp_checkpoints";
};

constexpr const char* usage_text =
    "last_words [--ranks N] [--shard-size S] [--fail-rank R] [--fail-step S] [--no-fault]\n"
    "                  [--recover] [--fresh] [--epochs N] [--limit N] [--small] [--data DIR]\n"
    "                  [--dir DIR] [--help]";
constexpr const char* options_text =
    "Trains the seed's network data parallel on N ranks (threads; or processes started by\n"
    "ckpt-run) and ends with final_params_xxh64=<hash of the parameters>. When a rank fails,\n"
    "the survivors save the last words in DIR\n"
    "(tft_saved_checkpoints-step_{g}/rank_{r}/ttp_rank_{r}-{epoch}_{step}.ckpt) and the job exits\n"
    "3. Run again with the same command, it resumes from the newest complete last words in DIR\n"
    "(it says which, and at which epoch and step) and ends with the same hash as a run without\n"
    "the failure.\n"
    "\n"
    "  --ranks N        ranks (threads; default 4; processes: WORLD_SIZE)\n"
    "  --shard-size S   optimizer state sharded S ways (default 1)\n"
    "  --fail-rank R    the rank that fails (default 1)\n"
    "  --fail-step S    at the end of global step S (default 12); a run resuming past S does\n"
    "                   not fail\n"
    "  --no-fault       no failure\n"
    "  --recover        resume, and fail when DIR holds no complete last words\n"
    "  --fresh          train from the start: an existing DIR is renamed DIR.old-N first\n"
    "                   (nothing is deleted)\n"
    "  --epochs N       epochs (default 1)\n"
    "  --limit N        the first N training images (default 2560)\n"
    "  --small          the 784-512-512-10 network instead of the seed's 5 layers\n"
    "  --data DIR       MNIST-format data (default /usr/share/datasets/fashion-mnist)\n"
    "  --dir DIR        last-words directory (default ./ttp_checkpoints)\n"
    "  --help           this text\n"
    "\n"
    "Exit status: 0 trained to the end; 3 a rank failed and the last words were saved; 143\n"
    "stopped by SIGTERM or SIGINT, last words saved; 1 an error; 2 a usage error.\n";

Options parse(int argc, char** argv) {
    Options o;
    bool ranks_given = false;
    examples::Cli cli(argc, argv, usage_text, options_text);
    while (const auto a = cli.next()) {
        if (*a == "--ranks") o.ranks = static_cast<int>(cli.count()), ranks_given = true;
        else if (*a == "--shard-size") o.shard_size = static_cast<int>(cli.count());
        else if (*a == "--fail-rank") o.fail_rank = static_cast<int>(cli.count());
        else if (*a == "--fail-step") o.fail_step = cli.count();
        else if (*a == "--no-fault") o.fault = false;
        else if (*a == "--recover") o.recover = true;
        else if (*a == "--fresh") o.fresh = true;
        else if (*a == "--epochs") o.epochs = cli.count();
        else if (*a == "--limit") o.limit = static_cast<std::size_t>(cli.count());
        else if (*a == "--small") o.small = true;
        else if (*a == "--data") o.data = cli.value();
        else if (*a == "--dir") o.dir = cli.value();
        else cli.unknown();
    }
    if (const auto env = fault::launch_env(); !env.store.empty()) {  // one rank per process
        if (ranks_given && o.ranks != env.world_size)
            cli.fail("--ranks " + std::to_string(o.ranks) + " differs from the launcher's WORLD_SIZE " +
                     std::to_string(env.world_size) + ": under ckpt-run, --nproc sets the ranks");
        o.ranks = env.world_size;
    }
    if (o.fault && o.fail_step < 1) cli.fail("--fail-step must be at least 1 (a step that ends)");
    if (o.ranks < 2) cli.fail("--ranks must be at least 2: the last words come from a replica");
    if (o.fault && o.fail_rank >= o.ranks) cli.fail("--fail-rank must be below --ranks");
    if (o.epochs < 1) cli.fail("--epochs must be at least 1");
    if (o.recover && o.fresh) cli.fail("--recover and --fresh exclude each other");
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

// What a rank's training ended with.
struct RankResult {
    std::string hash;                  // final_params_xxh64, when it trained to the end
    fault::LastWordsOutcome outcome;   // what the last words did, when a rank failed
};

// A rank whose process dies by a real SIGKILL at the end of a global step.
struct KillAtStep {
    std::int64_t step;
    int rank;
    void on_step_end(nn::RunContext& c) {
        if (step > 0 && c.global_step == step && c.rank == rank) ::raise(SIGKILL);
    }
};

// One rank's training, over any communicator: ThreadComm (ranks as threads) or GlooComm
// (ranks as processes). Throws what training threw, after filling `result.outcome`.
template <class Net, class Comm, class Failure>
void train_rank(Comm& comm, const Options& o, const fs::path& from, Failure failure, RankResult& result, std::mutex& out) {
    using DpOpt = fault::DataParallelOptimizer<nn::SGD, Comm>;
    using Opt = nn::FailingOptimizer<DpOpt>;
    const fault::ShardLayout layout{o.shard_size};
    auto data = examples::seed_dp_dataset(o.data, o.limit, o.ranks, comm.rank());
    if (o.fault && o.fail_step > o.epochs * data.steps_per_epoch())
        throw ckpt::ConfigError("--fail-step " + std::to_string(o.fail_step) + " is past the last step, " +
                                std::to_string(o.epochs * data.steps_per_epoch()) + " (" + std::to_string(o.epochs) +
                                " epochs of " + std::to_string(data.steps_per_epoch()) + " steps): nothing would fail");
    Net net;  // every rank starts from the same seed
    // SGD(0.01) in the seed's OptTFTWrapper, its state sharded as the layout says
    fault::ShardedOptimizer<nn::SGD, Comm> sgd(net.parameters(), comm, layout, 1e-2);
    DpOpt& dp = sgd.optimizer();
    Opt opt(dp, o.fail_step, comm.rank(), false);
    nn::Trainer<Net, Opt> trainer(net, opt, {}, comm.rank());
    std::int64_t initial_epoch = 0;
    if (!from.empty()) {
        const auto rp = trainer.resume_from(from, data);
        dp.set_completed_steps(rp.global_step);
        opt.set_completed_steps(rp.global_step);
        initial_epoch = rp.initial_epoch;
        if (comm.rank() == 0) {
            std::lock_guard lock(out);
            std::printf("%s\n", examples::resume_message(rp, data.steps_per_epoch(), o.epochs).c_str());
            std::fflush(stdout);
        }
        if (initial_epoch >= o.epochs) {  // the last words hold the last step: nothing to train
            result.hash = examples::params_xxh64(net.parameters());
            return;
        }
    }
    // the step directory also gets a global index: loadable on another number of ranks
    fault::LastWordsCheckpoint last_words(
        comm, o.dir, {.layout = layout, .watch_signals = true, .pieces = [&dp] { return dp.piece_map(); }});
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
        trainer.train(o.epochs, data, nn::callbacks(progress, failure, last_words), initial_epoch);
    } catch (...) {
        result.outcome = last_words.outcome();
        throw;
    }
    result.hash = examples::params_xxh64(net.parameters());
}

// This rank's file of the newest complete last words in --dir (printed), an empty path
// when there are none or with --fresh (which moves an old --dir aside, on rank 0), or
// nothing when --recover finds none (with a message).
std::optional<fs::path> recovery_file(const Options& o, int rank, bool first_start = true, bool announce = true) {
    if (o.fresh) {
        if (rank == 0 && first_start)
            if (const auto aside = examples::move_aside(o.dir))
                std::printf("--fresh: moved the old last words aside to %s\n", aside->string().c_str());
        return fs::path();
    }
    const auto file = fault::latest_last_words(o.dir, fault::ShardLayout{o.shard_size}, rank);
    if (!file) {
        if (o.recover) {
            std::fprintf(stderr, "last_words: no complete last-words checkpoint in '%s'\n", o.dir.string().c_str());
            return std::nullopt;
        }
        if (rank == 0) std::printf("no complete last words in '%s': training from the start\n", o.dir.string().c_str());
        return fs::path();
    }
    if (announce) std::printf("rank %d resumes from %s\n", rank, fs::relative(*file, o.dir).string().c_str());
    return file;
}

// Prints what the last words did; the exit status for it.
int report_last_words(const Options& o, const fault::LastWordsOutcome& oc) {
    if (!oc.step_directory) {
        std::printf("no last words: %s\n", oc.message.c_str());
        return 1;
    }
    std::printf("last words: global step %lld saved by", static_cast<long long>(*oc.step));
    for (std::size_t j = 0; j < oc.savers.size(); ++j) std::printf("%s rank %d", j ? "," : "", oc.savers[j]);
    if (oc.savers.size() > 1) std::printf(" (one per optimizer-state piece)");
    std::printf("; survivors:");
    for (const auto& r : oc.reports) std::printf(" %lld", static_cast<long long>(r.job_rank));
    std::printf("\n");
    print_tree(o.dir);
    return 3;
}

// Ranks as threads of this process.
template <class Net>
int run_threads(const Options& o) {
    const fault::ShardLayout layout{o.shard_size};
    layout.require_replicas(o.ranks, "a last-words checkpoint");
    fault::ThreadGroup group(o.ranks, std::chrono::seconds(60));
    fault::TerminationSignals signals;  // SIGTERM/SIGINT: last words at the next step end
    std::mutex out;
    std::vector<RankResult> results(static_cast<std::size_t>(o.ranks));
    std::vector<fs::path> from(static_cast<std::size_t>(o.ranks));  // each rank's file: its piece of the state
    for (int r = 0; r < o.ranks; ++r) {
        const auto file = recovery_file(o, r, true, false);
        if (!file) return 1;
        from[static_cast<std::size_t>(r)] = *file;
    }
    if (std::any_of(from.begin(), from.end(), [&](const fs::path& f) { return f != from[0]; }))
        for (int r = 0; r < o.ranks; ++r)  // sharded: each rank resumes from its piece
            std::printf("rank %d resumes from %s\n", r,
                        fs::relative(from[static_cast<std::size_t>(r)], o.dir).string().c_str());
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        train_rank<Net>(comm, o, from[r], nn::FailAtStep(o.fault ? o.fail_step : 0, o.fail_rank), results[r], out);
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
        for (const auto& res : results)
            if (res.outcome.took_part) return report_last_words(o, res.outcome);
        return 1;
    }
    for (int r = 0; r < o.ranks; ++r) {
        if (results[static_cast<std::size_t>(r)].hash != results[0].hash) {
            std::fprintf(stderr, "last_words: rank %d ended with other parameters than rank 0\n", r);
            return 1;
        }
    }
    std::printf("final_params_xxh64=%s\n", results[0].hash.c_str());
    return 0;
}

// This process is one rank (see the file comment): the same exit statuses.
template <class Net>
int run_process(const Options& o, const fault::LaunchEnv& env) {
    fault::ShardLayout{o.shard_size}.require_replicas(o.ranks, "a last-words checkpoint");
    fault::TerminationSignals signals;
    std::mutex out;
    const auto from = recovery_file(o, env.rank, env.restarts == 0);
    if (!from) return 1;
    auto store = fault::open_store(env.store);
    fault::GlooComm comm(*store, env.rank, env.world_size, {.timeout = std::chrono::seconds(60)});
    RankResult result;
    try {
        train_rank<Net>(comm, o, *from, KillAtStep{o.fault ? o.fail_step : 0, o.fail_rank}, result, out);
    } catch (const fault::Preempted& p) {
        std::printf("rank %d: %s\n", env.rank, p.what());
        return fault::preempted_exit_status;
    } catch (const fault::PeerFailure& e) {
        std::printf("rank %d: %s\n", env.rank, e.what());
        if (!result.outcome.took_part) return 1;
        // every survivor reports; the lowest one prints the tree
        if (result.outcome.reports.empty() || result.outcome.reports.front().job_rank != env.rank) {
            std::printf("rank %d: last words %s\n", env.rank, result.outcome.step_directory ? "saved" : "not saved");
            return result.outcome.step_directory ? 3 : 1;
        }
        return report_last_words(o, result.outcome);
    }
    std::printf("rank %d: final_params_xxh64=%s\n", env.rank, result.hash.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    nn::set_blas_threads(1);
    try {
        const Options o = parse(argc, argv);
        if (const auto env = fault::launch_env(); !env.store.empty())
            return o.small ? run_process<nn::UceNet>(o, env) : run_process<nn::DataParallelNet>(o, env);
        return o.small ? run_threads<nn::UceNet>(o) : run_threads<nn::DataParallelNet>(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "last_words: %s\n", e.what());
        return 1;
    }
}
