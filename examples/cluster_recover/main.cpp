// The seed's disaster recovery in a dynamic cluster: N worker processes (started by
// ckpt-run, or any launcher setting RANK, WORLD_SIZE and CKPT_STORE) train the seed's
// 784→512→512→10 network on Fashion-MNIST, data parallel over fault::GlooComm. Each saves
// its own checkpoints every --save-every steps into <dir>/rank_<r>/, keeping --keep (≥ 2).
//
// When a worker dies, the others stay up: they wait for it to come back (ckpt-run restarts
// it; its node id is claimed again only after the cooldown), then every worker rolls back
// to the newest step all ranks hold a valid checkpoint of, the data rolls back with it, and
// training goes on. No worker but the dead one restarts its process.
//
// With --memory-every K, every K steps each worker also keeps its state in its own memory
// and in its partner's (the next rank's): a restarted worker then gets its state from its
// partner, the others roll back to the same step from their own memory, and no file is read.
// When a worker and its partner are both lost, recovery falls back to the files. With
// --last-words as well, the survivors keep their state when a worker dies (last words in
// memory): the restarted worker gets it from one of them, nobody rolls back, no step is redone.
//
// The whole job killed and started again with the same command resumes the same way, from
// the newest step every rank holds.
//
// Every save also gets a global index (DIR/index-step_<g>.ckpt: which rank's file holds
// which piece of which tensor). With --elastic the job goes on when its number of ranks
// changes: a dead worker not back within --elastic-wait-ms is left out, the others form a
// smaller generation and each loads its pieces of the newest index for its new place; a
// worker that starts later (again, or anew) is taken in at the next checkpoint, and every
// rank goes on from that checkpoint's index. The optimizer is then momentum with its state
// sharded over all ranks, and the global batch (--global-batch) stays the same whatever the
// number of ranks, so every step sees the same samples.
//
// With --replica-parallel the workers share the writing: the state they hold alike is cut
// into N runs of equal bytes and each worker writes one (fault::ReplicaParallel), so a save
// puts the model on storage once instead of N times. With --shard-size S the optimizer is
// momentum with its state in S pieces, each kept by N / S workers: they cut it between them. A worker's file is then a part of its
// step, and every resume loads through the global index.
//
//   ckpt-run --nproc 4 --store file:///tmp/job --max-restarts 3 -- \
//       cluster_recover --dir ./ckpt [--epochs N] [--limit N] [--save-every N] [--keep N]
//                       [--memory-every K [--last-words]] [--elastic [--elastic-wait-ms MS]] [--global-batch N]
//                       [--replica-parallel] [--cooldown-ms MS] [--timeout-ms MS] [--data DIR] [--address IP] [--fresh] [--help]
//
// --address is this host's address toward the other hosts (default 127.0.0.1: one host).
//
// Every rank ends with "rank R: final_params_xxh64=<16 hex digits>", the same on every rank
// and (without --elastic) the same as a run in which no worker died. Exit status 0, or 1 on
// an error.

#include <fault/die_in_transfer.hpp>
#include <fault/fault.hpp>
#include <fault/gloo_comm.hpp>
#include "../common/cli.hpp"
#include "../common/fresh.hpp"
#include "../common/params_hash.hpp"
#include "../common/seed_data.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>

namespace fs = boost::filesystem;

namespace {

struct Options {
    fs::path dir = "./cluster_checkpoints";
    fs::path data = "/usr/share/datasets/fashion-mnist";
    std::int64_t epochs = 2;
    std::size_t limit = 5120;  // 40 global steps of 4 x 32 an epoch
    std::int64_t save_every = 5;
    std::int64_t keep = 3;
    std::int64_t memory_every = 0;  // 0: no memory level
    bool last_words = false;        // the memory level's last words
    bool elastic = false;
    bool replica_parallel = false;
    int shard_size = 1;  // optimizer-state pieces (elastic: one per rank)
    std::int64_t elastic_wait_ms = 60000;
    std::size_t global_batch = 0;  // 0: 32 x ranks (elastic: rounded up to suit every number of ranks)
    std::int64_t die_in_transfer = 0;  // 0: no fault injected
    int die_rank = 1;
    std::int64_t cooldown_ms = 30000;  // the seed's 30 s
    std::int64_t timeout_ms = 60000;
    std::string address = "127.0.0.1";  // this host's address toward the others
    bool fresh = false;
};

constexpr const char* usage_text =
    "cluster_recover [--dir DIR] [--epochs N] [--limit N] [--save-every N] [--keep N]\n"
    "                       [--memory-every K [--last-words]] [--elastic [--elastic-wait-ms MS]] [--global-batch N]\n"
    "                       [--replica-parallel] [--shard-size S] [--die-in-transfer N [--die-rank R]] [--cooldown-ms MS]\n"
    "                       [--timeout-ms MS] [--data DIR]\n"
    "                       [--address IP] [--fresh] [--help]";
constexpr const char* options_text =
    "One worker of a data-parallel job started by ckpt-run (or any launcher setting RANK,\n"
    "WORLD_SIZE and CKPT_STORE), e.g.\n"
    "  ckpt-run --nproc 4 --store file:///tmp/job --max-restarts 3 -- cluster_recover --dir ./ckpt\n"
    "Each worker saves its checkpoints in DIR/rank_<r>/. When a worker dies and is started again,\n"
    "every worker rolls back to the newest step all ranks hold and training goes on; the whole\n"
    "job started again with the same command resumes the same way (rank 0 says from which file,\n"
    "epoch and step). Every rank ends with \"rank R: final_params_xxh64=<hash>\".\n"
    "\n"
    "  --dir DIR          checkpoint directory (default ./cluster_checkpoints)\n"
    "  --epochs N         epochs (default 2)\n"
    "  --limit N          the first N training images (default 5120)\n"
    "  --save-every N     save every N global steps (default 5)\n"
    "  --keep N           checkpoints kept per rank and run, at least 2 (default 3)\n"
    "  --memory-every K   every K global steps also keep each worker's state in its memory and\n"
    "                     its partner's; a restarted worker recovers from there (default: off)\n"
    "  --last-words       with --memory-every: when a worker dies, the others keep their state\n"
    "                     and the restarted worker gets it from one of them: no step is redone\n"
    "  --elastic          go on with fewer workers when a dead one is not back in time, and take\n"
    "                     in a worker that starts later at the next checkpoint; each rank loads\n"
    "                     its pieces of the newest global index (DIR must be shared by all hosts)\n"
    "  --elastic-wait-ms MS  with --elastic: how long to wait for a dead worker (default 60000)\n"
    "  --global-batch N   samples of a global step, split among the ranks (default 32 x ranks;\n"
    "                     with --elastic, a multiple of every number of ranks from 1 to WORLD_SIZE)\n"
    "  --replica-parallel each worker writes 1/N of the state the workers hold alike, so a save\n"
    "                     writes the model once; resuming loads through the global index\n"
    "  --shard-size S     train with momentum, its state in S pieces, each kept by the WORLD_SIZE / S\n"
    "                     workers of its replica group (default 1: plain SGD, no state; --elastic:\n"
    "                     momentum, one piece a worker)\n"
    "  --die-in-transfer N  (tests) at its first start, rank R kills itself with SIGKILL in the\n"
    "                     middle of sending its N-th memory copy (default: off)\n"
    "  --die-rank R       the rank --die-in-transfer kills (default 1)\n"
    "  --cooldown-ms MS   before a dead worker's node id is claimed again (default 30000)\n"
    "  --timeout-ms MS    communication timeout (default 60000)\n"
    "  --data DIR         MNIST-format data (default /usr/share/datasets/fashion-mnist)\n"
    "  --address IP       this host's address toward the other hosts (default 127.0.0.1)\n"
    "  --fresh            train from the start: at its first start each worker renames its\n"
    "                     DIR/rank_<r> to DIR/rank_<r>.old-N (nothing is deleted)\n"
    "  --help             this text\n"
    "\n"
    "Exit status: 0 trained to the end, 1 an error, 2 a usage error.\n";

Options parse(int argc, char** argv) {
    Options o;
    examples::Cli cli(argc, argv, usage_text, options_text);
    while (const auto a = cli.next()) {
        if (*a == "--epochs") o.epochs = cli.count();
        else if (*a == "--limit") o.limit = static_cast<std::size_t>(cli.count());
        else if (*a == "--save-every") o.save_every = cli.count();
        else if (*a == "--keep") o.keep = cli.count();
        else if (*a == "--memory-every") o.memory_every = cli.count();
        else if (*a == "--last-words") o.last_words = true;
        else if (*a == "--elastic") o.elastic = true;
        else if (*a == "--elastic-wait-ms") o.elastic_wait_ms = cli.count();
        else if (*a == "--replica-parallel") o.replica_parallel = true;
        else if (*a == "--shard-size") o.shard_size = static_cast<int>(cli.count());
        else if (*a == "--global-batch") o.global_batch = static_cast<std::size_t>(cli.count());
        else if (*a == "--die-in-transfer") o.die_in_transfer = cli.count();
        else if (*a == "--die-rank") o.die_rank = static_cast<int>(cli.count());
        else if (*a == "--cooldown-ms") o.cooldown_ms = cli.count();
        else if (*a == "--timeout-ms") o.timeout_ms = cli.count();
        else if (*a == "--dir") o.dir = cli.value();
        else if (*a == "--data") o.data = cli.value();
        else if (*a == "--address") o.address = cli.value();
        else if (*a == "--fresh") o.fresh = true;
        else cli.unknown();
    }
    if (o.epochs < 1) cli.fail("--epochs must be at least 1");
    if (o.save_every < 1) cli.fail("--save-every must be at least 1");
    if (o.keep < 2) cli.fail("--keep must be at least 2: a rollback needs an older step when the newest is torn");
    if (o.memory_every < 0) cli.fail("--memory-every must be at least 1 (or 0: off)");
    if (o.last_words && !o.memory_every) cli.fail("--last-words needs --memory-every");
    if (o.die_in_transfer && !o.memory_every) cli.fail("--die-in-transfer needs --memory-every");
    if (o.timeout_ms < 1) cli.fail("--timeout-ms must be positive");
    if (fault::launch_env().store.empty()) cli.fail("no store: start it with ckpt-run, or set RANK, WORLD_SIZE and CKPT_STORE");
    if (o.elastic && o.memory_every) cli.fail("--elastic resumes from the global index: it does not combine with --memory-every");
    const auto world = static_cast<std::size_t>(fault::launch_env().world_size);
    if (o.shard_size < 1 || world % static_cast<std::size_t>(o.shard_size))
        cli.fail("--shard-size " + std::to_string(o.shard_size) + " does not divide the " + std::to_string(world) + " workers");
    if (o.elastic && o.shard_size != 1) cli.fail("--elastic keeps one optimizer-state piece a worker: leave out --shard-size");
    if (o.elastic) {
        // the batch must split evenly among however many ranks remain
        std::size_t every = 1;
        for (std::size_t m = 2; m <= world; ++m) every = std::lcm(every, m);
        if (!o.global_batch) o.global_batch = (32 * world + every - 1) / every * every;
        if (o.global_batch % every)
            cli.fail("--global-batch " + std::to_string(o.global_batch) + ": with --elastic it must be a multiple of " +
                     std::to_string(every) + ", so that every number of ranks from 1 to " + std::to_string(world) +
                     " divides it");
    } else if (o.global_batch && o.global_batch % world) {
        cli.fail("--global-batch " + std::to_string(o.global_batch) + " does not split among " + std::to_string(world) + " ranks");
    }
    return o;
}

using Net = nn::UceNet;  // 784 -> 512 -> 512 -> 10
// every --save-every steps, and the last step: a worker that joins an elastic job after its
// end, or the job run again, finds it trained to the end
using Checkpoints = nn::ModelCheckpoint<ckpt::AnyOf<ckpt::EverySteps, ckpt::OnTrainEnd>, ckpt::KeepLast>;
// with --replica-parallel, each rank's saves write its share of the state the ranks hold alike
using Shared = fault::ReplicaParallel<Checkpoints, fault::GlooComm>;
using Indexer = fault::GlobalIndexer<fault::GlooComm, Shared>;

// With --elastic: ends the generation at a checkpoint when workers wait to join.
struct ElasticJoins {
    std::optional<fault::TakeInJoiners<fault::GlooComm, Indexer>> take_in;
    void on_step_end(nn::RunContext& c) {
        if (take_in) take_in->on_step_end(c);
    }
    void on_epoch_end(nn::RunContext& c) {
        if (take_in) take_in->on_epoch_end(c);
    }
};

// The memory level's snapshots, for the callbacks of one generation (none when it is off).
// With --die-in-transfer, the copies go through a communicator that kills this process
// in the middle of one.
struct MemorySnapshots {
    using Dying = fault::DieInTransfer<fault::GlooComm>;
    std::optional<fault::MemoryCheckpoint<fault::GlooComm>> every_k;
    std::optional<Dying> dying;
    std::optional<fault::MemoryCheckpoint<Dying>> every_k_dying;
    void on_step_end(nn::RunContext& c) {
        if (every_k) every_k->on_step_end(c);
        if (every_k_dying) every_k_dying->on_step_end(c);
    }
    void on_train_end(nn::RunContext& c) {
        if (every_k) every_k->on_train_end(c);
        if (every_k_dying) every_k_dying->on_train_end(c);
    }
    void on_exception(nn::RunContext& c) {
        if (every_k) every_k->on_exception(c);
        if (every_k_dying) every_k_dying->on_exception(c);
    }
};

// Trains from the agreed step to the end in generation `comm` with optimizer Inner (its
// state in --shard-size pieces, one per rank with --elastic); throws PeerFailure when a worker dies
// meanwhile, JoinersWaiting when workers wait to join. Returns the final parameters' hash.
template <class Inner, class... InnerArgs>
std::string train(fault::GlooComm& comm, const Options& o, const fs::path& mine, fault::MemoryLevel& memory,
                  std::int64_t& done, InnerArgs... inner_args) {
    auto data = examples::seed_dp_dataset(o.data, o.limit, comm.size(), comm.rank(), o.global_batch);
    Net net;  // the same seed on every rank: a fresh start is the same everywhere
    const fault::ShardLayout layout{o.elastic ? comm.size() : o.shard_size};
    fault::ShardedOptimizer<Inner, fault::GlooComm> sharded(net.parameters(), comm, layout, inner_args...);
    auto& dp = sharded.optimizer();
    nn::Trainer<Net, fault::DataParallelOptimizer<Inner, fault::GlooComm>> trainer(net, dp, {}, comm.rank());
    std::int64_t initial_epoch = 0;
    // what restoring the state took on this rank once the ranks agreed where it comes from
    double restore_ms = 0;
    auto timed = [&restore_ms](auto&& restore) {
        const auto began = std::chrono::steady_clock::now();
        auto rp = restore();
        restore_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
        return rp;
    };
    auto say_resumed = [&](const nn::ResumePoint& rp, const std::string& from) {
        dp.set_completed_steps(rp.global_step);
        initial_epoch = rp.initial_epoch;
        if (comm.rank() == 0)
            std::printf("generation %d: every rank resumes at global step %lld (epoch %lld, step %lld) %s; rank 0's "
                        "state restored in %.1f ms\n",
                        comm.generation().number, static_cast<long long>(rp.global_step + 1),
                        static_cast<long long>(rp.initial_epoch + 1), static_cast<long long>(rp.initial_step + 1),
                        from.c_str(), restore_ms);
    };
    // the memory level first: nothing to read when every rank's state is in some rank's memory
    std::optional<fault::MemoryRecovery> recovered;
    if (o.memory_every) recovered = memory.recover(comm);
    std::optional<fault::ElasticResume> resharded;
    if (o.elastic || (o.replica_parallel && !recovered)) {
        // this rank's pieces of the newest global index, for its place in this generation
        const auto rp = timed([&] {
            resharded = fault::load_latest_resharded(comm, o.dir, trainer.load_target(), dp.piece_map());
            if (!resharded) return nn::ResumePoint{};
            dp.claim_resharded(resharded->state.state);
            return trainer.resume_from_state(resharded->state.state, resharded->index.string(), data);
        });
        if (resharded)
            say_resumed(rp, "from the global index of step " + std::to_string(resharded->global_step) + ", saved by " +
                                std::to_string(resharded->saved_by) + " rank(s); rank 0 read " +
                                std::to_string(resharded->state.bytes_read >> 10) + " KiB of " +
                                std::to_string(resharded->state.files_opened) + " file(s)");
        else if (comm.rank() == 0)
            std::printf("generation %d: no global index; training from the start\n", comm.generation().number);
    } else if (recovered) {
        const std::string where = "the memory level's state of global step " + std::to_string(recovered->step);
        restore_ms = 1e3 * recovered->seconds;
        say_resumed(timed([&] { return trainer.resume_from_state(recovered->state, where, data); }),
                    "from memory, the state of global step " + std::to_string(recovered->step) + " (" +
                        std::to_string(recovered->restored_from_partners) + " rank(s) from another rank's memory)");
        if (recovered->from_rank >= 0)
            std::printf("rank %d: state of global step %lld from %s in %.1f ms\n", comm.rank(),
                        static_cast<long long>(recovered->step), recovered->source.c_str(), restore_ms);
    } else if (const auto agreed = fault::agree_on_checkpoint(comm, mine, "net"); agreed.file) {
        say_resumed(timed([&] { return trainer.resume_from(*agreed.file, data); }),
                    "from its checkpoint of epoch " + std::to_string(agreed.epoch) + ", step " +
                        std::to_string(agreed.step) + "; rank 0 from " + agreed.file->string());
    } else {
        if (comm.rank() == 0)
            std::printf("generation %d: no step saved by every rank; training from the start\n", comm.generation().number);
        if (!agreed.why_none.empty() && (comm.rank() == 0 || agreed.why_none.find("another prefix") != std::string::npos))
            std::printf("rank %d: %s\n", comm.rank(), agreed.why_none.c_str());
    }
    std::fflush(stdout);
    Checkpoints checkpoints(mine, "net", {}, ckpt::AnyOf(ckpt::EverySteps{o.save_every}, ckpt::OnTrainEnd{}),
                            ckpt::KeepLast{o.keep});
    Shared shared(comm, checkpoints, [&dp] { return dp.piece_map(); }, o.replica_parallel);
    Indexer indexer(comm, shared, o.dir, [&shared] { return shared.piece_map(); });
    ElasticJoins joins;
    if (o.elastic) joins.take_in.emplace(comm, indexer);
    MemorySnapshots snapshots;
    const fault::MemoryCheckpointOptions memory_options{.last_words = o.last_words, .layout = layout};
    if (o.die_in_transfer && comm.job_rank() == o.die_rank && fault::launch_env().restarts == 0) {
        snapshots.dying.emplace(comm, fault::MemoryLevel::tag, o.die_in_transfer);
        snapshots.every_k_dying.emplace(*snapshots.dying, memory, o.memory_every, memory_options);
    } else if (o.memory_every) {
        snapshots.every_k.emplace(comm, memory, o.memory_every, memory_options);
    }
    struct Progress {
        std::int64_t* done;
        void on_step_end(nn::RunContext& c) {
            *done = c.global_step;
            if (c.rank == 0 && c.global_step % 10 == 0) {
                std::printf("step %lld: loss %.4f\n", static_cast<long long>(c.global_step), double(c.loss));
                std::fflush(stdout);
            }
        }
    } progress{&done};
    if (initial_epoch < o.epochs)
        trainer.train(o.epochs, data, nn::callbacks(progress, snapshots, shared, indexer, joins), initial_epoch);
    else if (comm.rank() == 0)
        std::printf("generation %d: the job is trained to the end already\n", comm.generation().number);
    return examples::params_xxh64(net.parameters());
}

int run(const Options& o) {
    const auto env = fault::launch_env();
    const fs::path mine = o.dir / ("rank_" + std::to_string(env.rank));
    if (o.fresh && env.restarts == 0)  // a worker restarted within the job keeps its checkpoints
        if (const auto aside = examples::move_aside(mine))
            std::printf("rank %d: --fresh: moved its old checkpoints aside to %s\n", env.rank, aside->string().c_str());
    auto store = fault::open_store(env.store, std::chrono::milliseconds(o.timeout_ms));
    std::printf("rank %d: pid %d, start %d\n", env.rank, static_cast<int>(::getpid()), env.restarts + 1);
    std::fflush(stdout);
    std::optional<fault::GlooComm> comm;
    fault::GlooOptions options{.timeout = std::chrono::milliseconds(o.timeout_ms),
                               .address = o.address,
                               .cooldown = std::chrono::milliseconds(o.cooldown_ms)};
    if (o.elastic) options.elastic = std::chrono::milliseconds(o.elastic_wait_ms);
    comm.emplace(*store, env.rank, env.world_size, options);
    std::int64_t done = 0;  // the last global step this worker completed
    fault::MemoryLevel memory;  // outlives the generations
    for (;;) {
        try {
            if (comm->rank() == 0)
                std::printf("generation %d: %d rank(s), workers %s\n", comm->generation().number, comm->size(),
                            fault::detail::join_ids(comm->generation().members, ", ").c_str());
            // plain SGD keeps no state to shard
            const bool momentum = o.elastic || o.shard_size > 1;
            const std::string hash = momentum ? train<nn::Momentum>(*comm, o, mine, memory, done, 1e-2, 0.9)
                                              : train<nn::SGD>(*comm, o, mine, memory, done, 1e-2);
            std::printf("rank %d: final_params_xxh64=%s\n", env.rank, hash.c_str());
            return 0;
        } catch (const fault::PeerFailure& e) {
            std::printf("rank %d: after global step %lld: %s; waiting for %s\n", env.rank, static_cast<long long>(done),
                        e.what(), o.elastic ? "the workers that come back in time" : "every worker to rejoin");
            std::fflush(stdout);
            fault::GlooComm next = comm->regroup();
            comm.reset();  // the spent generation's connections close before the next trains
            comm.emplace(std::move(next));
        } catch (const fault::JoinersWaiting& e) {
            std::printf("rank %d: %s; taking them in\n", env.rank, e.what());
            std::fflush(stdout);
            fault::GlooComm next = comm->grow();
            comm.reset();
            comm.emplace(std::move(next));
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    nn::set_blas_threads(1);
    try {
        return run(parse(argc, argv));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cluster_recover: %s\n", e.what());
        return 1;
    }
}
