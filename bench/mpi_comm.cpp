// mpi_comm: MpiComm against GlooComm in the same processes, on the same buffers: allreduce(sum)
// of float32 from 4 KiB to 64 MiB, and a collective checkpoint with its global index (each
// rank saves its state of a few MiB, then commit_global_index). The ranks are the processes
// of an mpirun job; their GlooComm meets through a file store in the benchmark's directory and
// talks over loopback TCP. Each case runs the two alternately (who goes first alternates
// too) after a warm-up round of each; printed: rank 0's medians (every rank waits for the
// slowest in each call) and the ratio of times GlooComm/MpiComm (above 1: MpiComm is faster).
//
//   bash scripts/mpirun.sh -np 4 build/bench/mpi_comm [--reps N] [--max-mib M] [--state-mib S] [--dir DIR]
// Last line: mpi_comm ranks=R allreduce GlooComm/MpiComm=X (the largest size) checkpoint GlooComm/MpiComm=Y
// Exit status 1 if the run did not time what it planned: every allreduce, of either, left
// the sum of every rank's values (its first and last elements checked), every checkpoint
// committed its global index, all no faster than memory.

#include <fault/global_index.hpp>
#include <fault/gloo_comm.hpp>
#include <fault/mpi_comm.hpp>

#include "bench_support.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace {

namespace fs = boost::filesystem;

struct Options {
    int reps = 9;
    std::size_t max_mib = 64;
    std::size_t state_mib = 4;
    std::string dir;  // empty: a new directory under /var/tmp, removed at the end
};

void usage(std::FILE* to) {
    std::fprintf(to, "usage: mpi_comm [--reps N] [--max-mib M] [--state-mib S] [--dir DIR]   (under mpirun: "
                     "bash scripts/mpirun.sh -np 4 build/bench/mpi_comm)\n");
}

/// Times `f` on every rank after a barrier of `comm`; rank 0's time speaks for all.
template <class Comm, class F>
double timed_after_barrier(Comm& comm, F&& f) {
    comm.barrier();
    return bench::timed(f);
}

/// Runs `mpi` and `gloo` alternately, `reps` times after a warm-up of each; the medians.
template <class A, class B>
std::pair<double, double> alternate(int reps, A&& mpi, B&& gloo) {
    std::vector<double> a, b;
    for (int i = 0; i <= reps; ++i) {
        double ta = 0, tb = 0;
        if (i % 2 == 0) ta = mpi(i), tb = gloo(i);
        else tb = gloo(i), ta = mpi(i);
        if (i > 0) a.push_back(ta), b.push_back(tb);
    }
    return {bench::median(a), bench::median(b)};
}

int run(const Options& o, fault::MpiComm& mpi, const std::string& dir) {
    const int rank = mpi.rank(), ranks = mpi.size();
    fault::FileStore store(dir + "/store");
    fault::GlooComm gloo(store, rank, ranks, {.timeout = std::chrono::seconds(60), .prefix = "bench/"});
    if (rank == 0) {
        bench::print_machine(dir);
        std::printf("%d ranks under mpirun (scripts/mpirun.sh), medians of %d; GlooComm over loopback TCP\n", ranks, o.reps);
        std::printf("allreduce(sum) of float32:\n");
        std::fflush(stdout);
    }
    double allreduce_ratio = 0;
    bench::Checks check;
    for (std::size_t bytes = 4096; bytes <= (o.max_mib << 20); bytes *= 4) {
        std::vector<float> buf(bytes / sizeof(float));
        auto refill = [&] { bench::fill_random_floats(buf.data(), buf.size(), static_cast<std::uint64_t>(rank) + 1); };
        // the first and last elements hold every rank's sum (in any order: a tolerance)
        auto summed = [&] {
            for (const std::size_t i : {std::size_t(0), buf.size() - 1}) {
                double want = 0;
                for (int r = 0; r < ranks; ++r) want += bench::random_float_at(static_cast<std::uint64_t>(r) + 1, i);
                if (std::abs(buf[i] - want) > 1e-5 * ranks) return false;
            }
            return true;
        };
        int mpi_summed = 0, gloo_summed = 0;
        const auto [t_mpi, t_gloo] = alternate(
            o.reps,
            [&](int) {
                refill();
                const double t = timed_after_barrier(mpi, [&] { mpi.allreduce(buf, fault::ReduceOp::sum); });
                mpi_summed += summed();
                return t;
            },
            [&](int) {
                refill();
                const double t = timed_after_barrier(gloo, [&] { gloo.allreduce(buf, fault::ReduceOp::sum); });
                gloo_summed += summed();
                return t;
            });
        const std::string size = "rank " + std::to_string(rank) + ", " + std::to_string(bytes >> 10) + " KiB: ";
        check.count(size + "MpiComm allreduces that left every rank's sum (warm-up included)", o.reps + 1, mpi_summed);
        check.count(size + "GlooComm allreduces that left every rank's sum (warm-up included)", o.reps + 1, gloo_summed);
        check.rate(size + "MpiComm allreduce (median)", static_cast<double>(bytes), t_mpi / 1e3);
        check.rate(size + "GlooComm allreduce (median)", static_cast<double>(bytes), t_gloo / 1e3);
        allreduce_ratio = t_gloo / t_mpi;
        const double mib = static_cast<double>(bytes) / (1 << 20);
        if (rank == 0)
            std::printf("  %9.3f MiB: MpiComm %9.3f ms (%8.1f MiB/s), GlooComm %9.3f ms (%8.1f MiB/s), GlooComm/MpiComm %.2f\n",
                        mib, t_mpi, mib / t_mpi * 1e3, t_gloo, mib / t_gloo * 1e3, allreduce_ratio);
        std::fflush(stdout);
    }

    // a collective checkpoint: each rank's file, then the global index of the step
    const fs::path ckpt_dir = fs::path(dir) / "checkpoints";
    const fs::path mine = ckpt_dir / ("rank_" + std::to_string(rank));
    fs::create_directories(mine);
    ckpt::ParamDict state;
    ckpt::Tensor w(ckpt::DType::float32, {static_cast<std::int64_t>((o.state_mib << 20) / sizeof(float))});
    bench::fill_random_floats(w.values<float>().data(), w.numel(), static_cast<std::uint64_t>(rank) + 7);
    state.set("w", std::move(w));
    std::vector<double> commit_mpi, commit_gloo;
    int indexed_mpi = 0, indexed_gloo = 0;  // commits after which the step's global index was there
    auto checkpoint = [&](auto& comm, std::int64_t step, std::vector<double>& commits, int& indexed) {
        fs::path index;
        const double t = timed_after_barrier(comm, [&] {
            const fs::path file = mine / ("step_" + std::to_string(step) + ".ckpt");
            state.set("trainer.global_step", step);
            ckpt::save_checkpoint(state, file);
            commits.push_back(bench::timed([&] { index = fault::commit_global_index(comm, ckpt_dir, step, file); }));
            // every rank is told the index's path; rank 0, which removes it, sees that it is there
            indexed += index == fault::global_index_path(ckpt_dir, step) && (comm.rank() != 0 || fs::exists(index));
            fs::remove(file);
            if (comm.rank() == 0) fs::remove(index);
        });
        return t;
    };
    const auto [t_mpi, t_gloo] = alternate(
        o.reps, [&](int i) { return checkpoint(mpi, 2 * i, commit_mpi, indexed_mpi); },
        [&](int i) { return checkpoint(gloo, 2 * i + 1, commit_gloo, indexed_gloo); });
    commit_mpi.erase(commit_mpi.begin());  // the warm-up rounds
    commit_gloo.erase(commit_gloo.begin());
    const double checkpoint_ratio = t_gloo / t_mpi;
    if (rank == 0) {
        std::printf("collective checkpoint, %zu MiB a rank (save, then commit_global_index):\n", o.state_mib);
        std::printf("  whole: MpiComm %8.2f ms, GlooComm %8.2f ms, GlooComm/MpiComm %.2f\n", t_mpi, t_gloo, checkpoint_ratio);
        const double c_mpi = bench::median(commit_mpi), c_gloo = bench::median(commit_gloo);
        std::printf("  commit_global_index: MpiComm %8.2f ms, GlooComm %8.2f ms, GlooComm/MpiComm %.2f\n", c_mpi, c_gloo,
                    c_gloo / c_mpi);
        std::printf("mpi_comm ranks=%d allreduce GlooComm/MpiComm=%.2f checkpoint GlooComm/MpiComm=%.2f\n", ranks,
                    allreduce_ratio, checkpoint_ratio);
    }
    const std::string me = "rank " + std::to_string(rank) + ": ";
    check.count(me + "MpiComm checkpoints that committed their global index (warm-up included)", o.reps + 1, indexed_mpi);
    check.count(me + "GlooComm checkpoints that committed their global index (warm-up included)", o.reps + 1, indexed_gloo);
    const double state_bytes = static_cast<double>(o.state_mib << 20);
    check.rate(me + "MpiComm checkpoint (median), which saves the rank's state", state_bytes, t_mpi / 1e3);
    check.rate(me + "GlooComm checkpoint (median), which saves the rank's state", state_bytes, t_gloo / 1e3);
    return check.status();
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help") {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        const std::string v = argv[++i];
        if (a == "--reps") o.reps = std::atoi(v.c_str());
        else if (a == "--max-mib") o.max_mib = std::stoul(v);
        else if (a == "--state-mib") o.state_mib = std::stoul(v);
        else if (a == "--dir") o.dir = v;
        else {
            std::fprintf(stderr, "mpi_comm: unknown option %s\n", a.c_str());
            usage(stderr);
            return 2;
        }
    }
    if (o.reps < 1 || o.state_mib < 1) {
        usage(stderr);
        return 2;
    }
    fault::MpiSession session(argc, argv);
    fault::MpiComm mpi(session, {.timeout = std::chrono::seconds(60)});
    // rank 0 makes the directory; the others learn its name
    std::vector<char> name(4096, '\0');
    if (mpi.rank() == 0) {
        std::string dir = o.dir;
        if (dir.empty()) {
            dir = "/var/tmp/mpi_comm-XXXXXX";
            if (!::mkdtemp(dir.data())) bench::die("mkdtemp " + dir);
        }
        dir.copy(name.data(), name.size() - 1);
    }
    MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    const std::string dir = name.data();
    int rc = 2;
    try {
        rc = run(o, mpi, dir);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "mpi_comm: rank %d: %s\n", mpi.rank(), e.what());
        std::fflush(stderr);
        std::exit(2);  // before MPI_Finalize: mpirun ends the job
    }
    mpi.barrier();  // every rank's GlooComm gone: nothing writes into the store any more
    if (mpi.rank() == 0) {
        boost::system::error_code ec;
        if (o.dir.empty()) fs::remove_all(dir, ec);
        else fs::remove_all(fs::path(dir) / "checkpoints", ec), fs::remove_all(fs::path(dir) / "store", ec);
    }
    return rc;
}
