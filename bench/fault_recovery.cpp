// Recovery costs on the seed's data-parallel network (784-512-5120-5120-512-10, about
// 128 MiB of parameters), 4 ranks as threads:
//   last words   failure detected -> last-words checkpoint durable, against a normal save
//                (save_checkpoint of the same state to the same disk), alternately;
//   UCE repair   every rank stopped -> state whole again on the repaired rank (clean,
//                repair, copy from the replica), against a copy of the same state between two
//                ranks (a send/recv of every tensor); the time for the other ranks to stop
//                (finish the computation they are in) is printed apart.
// With --shard-size S the optimizer state is sharded S ways: last words are written by one
// rank per replica group, and the repaired rank's state comes from a rank keeping its piece.
// Each round trains two steps, fails (or damages) a rank, and measures; the baselines are
// measured in the same job right before.
//
//   OPENBLAS_NUM_THREADS=1 fault_recovery [--rounds R] [--dir DIR] [--shard-size S] [--net dp|small]
// --net small: the 784-512-512-10 network of cluster_recover (5 MiB of state), for a quick
// run whose figures mean nothing but whose checks apply.
// Last line: fault_recovery last_words/save=X uce_repair/copy=Y
// Exit status 1 if the run did not time what it planned: every round's last words saved
// and durable, one repair of the damaged rank, every tensor copied in the baseline, and
// saves and copies no faster than memory.

#include <fault/fault.hpp>

#include "bench_support.hpp"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = boost::filesystem;
using DpOpt = fault::DataParallelOptimizer<nn::SGD, fault::ThreadComm>;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

nn::MnistDataset data_for(int ranks, int rank) {
    nn::MnistDataset ds("/usr/share/datasets/fashion-mnist", nn::Usage::test);
    ds.take(static_cast<std::size_t>(ranks) * 8 * 4).map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()});
    ds.batch(static_cast<std::size_t>(ranks) * 8, true).shard(static_cast<std::size_t>(ranks), static_cast<std::size_t>(rank));
    return ds;
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;  // the checks say what is missing
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

double tensor_bytes(const ckpt::ParamDict& d) {
    double n = 0;
    for (const auto& e : d)
        if (const auto* t = e.value.get_if<ckpt::Tensor>()) n += static_cast<double>(t->nbytes());
    return n;
}

double bytes_under(const fs::path& dir) {
    double n = 0;
    for (const auto& f : fs::recursive_directory_iterator(dir))
        if (fs::is_regular_file(f.path())) n += static_cast<double>(fs::file_size(f.path()));
    return n;
}

template <class Net>
int run(int rounds, int shard_size, const fs::path& base) {
    const int ranks = 4;
    const fault::ShardLayout layout{shard_size};
    using Sgd = fault::ShardedOptimizer<nn::SGD, fault::ThreadComm>;
    std::vector<double> lw, save, repair, copy, stop;
    bench::Checks check;
    // per round, untimed: what each timed operation did
    int lw_durable = 0, repairs = 0, copies_whole = 0;
    for (int round = 0; round < rounds; ++round) {
        std::string tmpl = (base / "ckpt-bench-fault-XXXXXX").string();
        if (!::mkdtemp(tmpl.data())) return 1;
        const fs::path dir = tmpl;
        // last words, with its baseline
        {
            fault::ThreadGroup group(ranks, std::chrono::seconds(120));
            std::vector<double> lw_seconds(ranks, 0.0);
            double save_seconds = 0, save_bytes = 0, lw_bytes = 0;
            bool durable = false;
            (void)fault::run_ranks(group, [&](fault::ThreadComm& comm) {
                auto data = data_for(ranks, comm.rank());
                Net net;
                Sgd sgd(net.parameters(), comm, layout, 1e-2);
                nn::Trainer<Net, DpOpt> trainer(net, sgd.optimizer(), {}, comm.rank());
                trainer.train(1, data, std::tuple<>{});  // warm: every buffer touched
                if (comm.rank() == 0) {                  // the baseline: a normal save of the same state
                    const auto state = trainer.state_dict(data);
                    const auto t = Clock::now();
                    ckpt::save_checkpoint(state, dir / "normal.ckpt");
                    save_seconds = since(t);
                    save_bytes = tensor_bytes(state);
                }
                comm.barrier();
                fault::LastWordsCheckpoint last_words(comm, dir / "ttp", {.layout = layout});
                nn::FailAtStep crash(5, /*rank=*/1);
                try {
                    trainer.train(2, data, nn::callbacks(crash, last_words), 1);
                } catch (...) {
                    const auto& outcome = last_words.outcome();
                    lw_seconds[static_cast<std::size_t>(comm.rank())] = outcome.seconds;
                    if (comm.rank() == 0 && outcome.step_directory) {
                        durable = outcome.saver == 0;
                        lw_bytes = bytes_under(*outcome.step_directory);
                    }
                    throw;
                }
            });  // rank 1 fails by design: the others save its last words
            lw.push_back(lw_seconds[0]);  // rank 0 saves (rank 1 failed)
            save.push_back(save_seconds);
            lw_durable += durable;
            check.rate("round " + std::to_string(round + 1) + ": normal save", save_bytes, save_seconds);
            check.rate("round " + std::to_string(round + 1) + ": last words (the step's files)", lw_bytes, lw.back());
        }
        // UCE repair, with its baseline
        {
            fault::ThreadGroup group(ranks, std::chrono::seconds(120));
            std::vector<double> repair_seconds(ranks, 0.0), stop_seconds(ranks, 0.0);
            double copy_seconds = 0, copy_bytes = 0;
            int repaired = 0;
            bool copy_whole = false;
            const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
                auto data = data_for(ranks, comm.rank());
                Net net;
                Sgd sgd(net.parameters(), comm, layout, 1e-2);
                nn::Trainer<Net, DpOpt> trainer(net, sgd.optimizer(), {}, comm.rank());
                fault::AscendModel device(comm.rank());
                fault::attach(device, trainer.load_target());
                trainer.train(1, data, std::tuple<>{});
                {  // the baseline: the state copied to rank 2 from the rank that repairs it
                    const auto holders = layout.replica_group(layout.shard_of(2), ranks);  // the lowest other is the source
                    const int source = holders.front() == 2 ? holders[1] : holders.front();
                    comm.barrier();
                    ckpt::ParamDict target = trainer.load_target();
                    const auto t = Clock::now();
                    int tag = 0;
                    double bytes = 0;
                    for (auto& [name, value] : target)
                        if (auto* tensor = value.template get_if<ckpt::Tensor>()) {
                            if (comm.rank() == source) comm.send(tensor->template values<float>(), 2, tag);
                            if (comm.rank() == 2) comm.recv(tensor->template values<float>(), source, tag);
                            bytes += static_cast<double>(tensor->nbytes());
                            ++tag;
                        }
                    comm.barrier();
                    if (comm.rank() == 2) {
                        copy_seconds = since(t);
                        copy_bytes = bytes;
                        copy_whole = bytes > 0 && bytes == tensor_bytes(target);
                    }
                }
                fault::UceRepair repair(comm, device, {.layout = layout});
                fault::InjectUce inject(device, "layer3.weight", 5, /*rank=*/2);
                trainer.train(2, data, nn::callbacks(repair, inject), 1);
                if (comm.rank() == 2)
                    for (const auto& rec : repair.records()) repaired += rec.repaired_rank == 2;
                if (!repair.records().empty()) {
                    const auto& rec = repair.records()[0];
                    repair_seconds[static_cast<std::size_t>(comm.rank())] = rec.seconds - rec.stop_seconds;
                    stop_seconds[static_cast<std::size_t>(comm.rank())] = rec.stop_seconds;
                }
            });
            for (const auto& e : errors)
                if (e) std::rethrow_exception(e);
            repair.push_back(repair_seconds[2]);
            stop.push_back(stop_seconds[2]);
            copy.push_back(copy_seconds);
            repairs += repaired == 1;
            copies_whole += copy_whole;
            check.rate("round " + std::to_string(round + 1) + ": state copy between ranks", copy_bytes, copy_seconds);
            check.positive("round " + std::to_string(round + 1) + ": UCE repair's time", repair_seconds[2]);
        }
        fs::remove_all(dir);
        std::printf("round %d: last words %.1f ms, normal save %.1f ms (%.2f); UCE repair %.1f ms, state copy %.1f ms "
                    "(%.2f), waiting for the ranks to stop %.1f ms\n",
                    round + 1, 1e3 * lw.back(), 1e3 * save.back(), lw.back() / save.back(), 1e3 * repair.back(),
                    1e3 * copy.back(), repair.back() / copy.back(), 1e3 * stop.back());
        std::fflush(stdout);
    }
    std::printf("fault_recovery last_words/save=%.2f uce_repair/copy=%.2f\n", median(lw) / median(save),
                median(repair) / median(copy));
    check.count("rounds whose last words rank 0 saved, durable", rounds, lw_durable);
    check.count("rounds with one repair of rank 2", rounds, repairs);
    check.count("rounds whose baseline copied every tensor", rounds, copies_whole);
    return check.status();
}

}  // namespace

int main(int argc, char** argv) {
    int rounds = 3;
    int shard_size = 1;
    bool small = false;
    fs::path base = "/var/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
        else if (a == "--dir") base = argv[i + 1];
        else if (a == "--shard-size") shard_size = std::atoi(argv[i + 1]);
        else if (a == "--net") small = std::string(argv[i + 1]) == "small";
    }
    if (rounds < 1) {
        std::fprintf(stderr, "fault_recovery: --rounds must be at least 1\n");
        return 2;
    }
    nn::set_blas_threads(1);
    return small ? run<nn::UceNet>(rounds, shard_size, base) : run<nn::DataParallelNet>(rounds, shard_size, base);
}
