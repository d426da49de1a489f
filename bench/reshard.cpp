// reshard: a rank of a new layout loading its state from a step saved by 4 ranks, against a
// plain load of the same bytes.
//
// The saved state is a data-parallel job's: 4 parameters of [2048, 2048] float32 (64 MiB,
// every rank keeps all of them) and their momentum, sharded over the 4 ranks (each rank's
// file holds a quarter of every momentum tensor): 4 files of 80 MiB, indexed with chunks of
// 1 MiB (fault::commit_global_index over 4 ThreadComm ranks). Each new layout (2 ranks: the
// old pieces joined in pairs; 3 ranks: pieces that cut through the old ones) loads the state
// of its rank 1 with ckpt::load_resharded, and the baseline loads a file holding exactly
// those tensors (saved once beforehand) with ckpt::load_checkpoint. The two alternate round
// by round, from the page cache (every file was just written or read), in one process.
//
// Printed per layout: bytes read / bytes needed (target ≤ 1.1) and the median of
// resharded / plain load time over the rounds (target ≤ 1.3).
//
//   reshard [--rounds N] [--side S] [--dir DIR]
//
// --side S: tensors of [S, S] instead of [2048, 2048] (a quick run: its figures mean nothing,
// its checks apply). Exit status 1 if the run did not time what it planned: every round's
// two loads, each returning every tensor of the rank's state, the resharded one reading at
// least the bytes it needs, both no faster than memory.

#include <fault/fault.hpp>

#include "bench_support.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace {

namespace fs = boost::filesystem;

constexpr int saved_ranks = 4;
constexpr int tensors = 4;
std::int64_t side = 2048;  // --side

ckpt::ParamDict rank_state(int rank) {
    ckpt::ParamDict d;
    const std::uint64_t n = side * side;
    const auto [lo, hi] = fault::ShardLayout{saved_ranks}.piece(n, rank);
    for (int k = 0; k < tensors; ++k) {
        ckpt::Tensor w(ckpt::DType::float32, {side, side});
        bench::fill_random_floats(w.values<float>().data(), n, 1 + k);
        d.set("w" + std::to_string(k), std::move(w));
        ckpt::Tensor m(ckpt::DType::float32, {static_cast<std::int64_t>(hi - lo)});
        bench::fill_random_floats(m.values<float>().data(), hi - lo, 100 + k * saved_ranks + rank);
        d.set("moments.w" + std::to_string(k), std::move(m));
    }
    d.set("trainer.global_step", std::int64_t{100});
    return d;
}

ckpt::PieceMap places_of(int shards, int shard) {
    ckpt::PieceMap p;
    const auto first = fault::ShardLayout{shards}.piece(side * side, shard).first;
    for (int k = 0; k < tensors; ++k) p["moments.w" + std::to_string(k)] = {"moments.w" + std::to_string(k), {side, side}, first};
    return p;
}

ckpt::ParamDict like_of(int shards, int shard) {
    ckpt::ParamDict d;
    const auto [lo, hi] = fault::ShardLayout{shards}.piece(side * side, shard);
    for (int k = 0; k < tensors; ++k) {
        d.set("w" + std::to_string(k), ckpt::Tensor(ckpt::DType::float32, {side, side}));
        d.set("moments.w" + std::to_string(k), ckpt::Tensor(ckpt::DType::float32, {static_cast<std::int64_t>(hi - lo)}));
    }
    return d;
}

int run(const fs::path& dir, int rounds) {
    bench::print_machine(dir.string());
    fault::ThreadGroup group(saved_ranks, std::chrono::seconds(60));
    fs::path index;
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        const fs::path file = dir / ("rank_" + std::to_string(comm.rank())) / "step_100.ckpt";
        fs::create_directories(file.parent_path());
        ckpt::save_checkpoint(rank_state(comm.rank()), file);
        ckpt::PieceMap places = places_of(saved_ranks, comm.rank());
        const auto path = fault::commit_global_index(comm, dir, 100, file, places);
        if (comm.rank() == 0) index = path;
    });
    for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
    std::printf("saved: %d ranks, %d x [%lld, %lld] float32 parameters on every rank, their momentum in %d pieces\n",
                saved_ranks, tensors, static_cast<long long>(side), static_cast<long long>(side), saved_ranks);
    bench::Checks check;
    for (const int shards : {2, 3}) {
        const int shard = 1;
        const ckpt::ParamDict like = like_of(shards, shard);
        const ckpt::PieceMap places = places_of(shards, shard);
        const fs::path plain = dir / ("plain_" + std::to_string(shards) + ".ckpt");
        ckpt::save_checkpoint(ckpt::load_resharded(index, like, places).state, plain);
        (void)ckpt::load_checkpoint(plain);  // both in the page cache before the first round
        std::vector<double> ratios, resharded_s, plain_s;
        double resharded_ms = 0, plain_ms = 0, read_ratio = 0, needed = 0;
        int resharded_whole = 0, plain_whole = 0;  // loads that returned every tensor of `like`
        auto whole = [&](const ckpt::ParamDict& got) {
            for (const auto& e : like) {
                const ckpt::Value* v = got.find(e.name);
                const auto* t = v ? v->get_if<ckpt::Tensor>() : nullptr;
                if (!t || t->nbytes() != e.value.get_if<ckpt::Tensor>()->nbytes()) return false;
            }
            return true;
        };
        for (int r = 0; r < rounds; ++r) {
            ckpt::ReshardedState got;
            const double a = bench::timed([&] { got = ckpt::load_resharded(index, like, places); });
            read_ratio = double(got.bytes_read) / double(got.bytes_needed);
            needed = double(got.bytes_needed);
            resharded_whole += whole(got.state) && got.bytes_read >= got.bytes_needed;
            got = {};
            ckpt::ParamDict base;
            const double b = bench::timed([&] { base = ckpt::load_checkpoint(plain); });
            plain_whole += whole(base);
            base = {};
            resharded_s.push_back(a / 1e3);
            plain_s.push_back(b / 1e3);
            ratios.push_back(a / b);
            resharded_ms += a;
            plain_ms += b;
        }
        std::printf("%d ranks, rank %d (%s): bytes read / needed %.4f (target <= 1.1); load time resharded / plain: "
                    "median %.2f (target <= 1.3), means %.1f / %.1f ms over %d rounds\n",
                    shards, shard, shards == 2 ? "old pieces joined" : "pieces cut through the old ones", read_ratio,
                    bench::median(ratios), resharded_ms / rounds, plain_ms / rounds, rounds);
        const std::string layout = std::to_string(shards) + " ranks: ";
        check.count(layout + "resharded loads that returned the rank's whole state, reading at least what it needs",
                    rounds, resharded_whole);
        check.count(layout + "plain loads that returned the rank's whole state", rounds, plain_whole);
        check.rate(layout + "resharded load (median), of the bytes needed", needed, bench::median(resharded_s));
        check.rate(layout + "plain load (median), of the same bytes", needed, bench::median(plain_s));
    }
    return check.status();
}

}  // namespace

int main(int argc, char** argv) {
    int rounds = 9;
    std::string dir;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
        else if (a == "--side" && i + 1 < argc) side = std::atoll(argv[++i]);
        else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
        else {
            std::fprintf(stderr, "usage: reshard [--rounds N] [--side S] [--dir DIR]\n");
            return 2;
        }
    }
    if (rounds < 1) rounds = 1;
    if (side < 16) {
        std::fprintf(stderr, "reshard: --side must be at least 16\n");
        return 2;
    }
    return bench::run_in_directory(dir, {}, [&](const std::string& d) { return run(d, rounds); });
}
