// A 2-D heat-equation solver that survives being killed: it checkpoints its grid every N
// iterations with a CheckpointManager and, when started again with the same command,
// resumes from the newest valid checkpoint. The final grid is bit-identical to an
// uninterrupted run's.
//
//   heat_diffusion [--dir DIR] [--size N] [--iters N] [--every N] [--keep N] [--kill-at I]
//                  [--fresh] [--help]
//
// --kill-at I sends SIGKILL to itself right after iteration I (before any save at I), the
// way an out-of-memory killer or a lost node would end it.

#include <ckpt/ckpt.hpp>
#include <ckpt/types/xtensor.hpp>  // view_of(an xtensor container)
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>
#include "../common/cli.hpp"
#include "../common/fresh.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct Options {
    std::string dir = "heat_checkpoints";
    std::size_t size = 192;
    std::int64_t iters = 3000;
    std::int64_t every = 250;
    std::int64_t keep = 3;
    std::int64_t kill_at = -1;
    bool fresh = false;
};

constexpr const char* usage_text =
    "heat_diffusion [--dir DIR] [--size N] [--iters N] [--every N] [--keep N] [--kill-at I]\n"
    "                      [--fresh] [--help]";
constexpr const char* options_text =
    "Solves the 2-D heat equation on an N x N grid, a checkpoint every --every iterations in DIR\n"
    "(heat-{iteration}.ckpt), and ends with final_grid_xxh3=<hash of the grid>. Started again\n"
    "after being killed, the same command resumes from the newest valid checkpoint in DIR (it\n"
    "says which, and at which iteration) and ends with the same hash as a run that never stopped.\n"
    "\n"
    "  --dir DIR      checkpoint directory (default heat_checkpoints)\n"
    "  --size N       grid size (default 192)\n"
    "  --iters N      iterations to run (default 3000)\n"
    "  --every N      save every N iterations (default 250)\n"
    "  --keep N       checkpoints kept (default 3)\n"
    "  --kill-at I    SIGKILL itself right after iteration I, before its save\n"
    "  --fresh        start from iteration 0; an existing DIR is renamed DIR.old-N first\n"
    "                 (nothing is deleted)\n"
    "  --help         this text\n"
    "\n"
    "Exit status: 0 done, 1 an error, 2 a usage error.\n";

Options parse(int argc, char** argv) {
    Options o;
    examples::Cli cli(argc, argv, usage_text, options_text);
    while (const auto a = cli.next()) {
        if (*a == "--dir") o.dir = cli.value();
        else if (*a == "--size") o.size = static_cast<std::size_t>(cli.count());
        else if (*a == "--iters") o.iters = cli.count();
        else if (*a == "--every") o.every = cli.count();
        else if (*a == "--keep") o.keep = cli.count();
        else if (*a == "--kill-at") o.kill_at = cli.count();
        else if (*a == "--fresh") o.fresh = true;
        else cli.unknown();
    }
    if (o.size < 3 || o.iters < 1 || o.every < 1 || o.keep < 1)
        cli.fail("--size must be at least 3, --iters, --every and --keep at least 1");
    return o;
}

/// The solver's whole state: the temperature grid and the iteration it has reached.
struct Solver {
    xt::xtensor<double, 2> grid;
    std::int64_t iteration = 0;

    explicit Solver(std::size_t n) : grid(xt::zeros<double>({n, n})) {
        xt::view(grid, 0, xt::all()) = 100.0;                   // a hot edge
        xt::view(grid, xt::all(), 0) = xt::linspace(100.0, 0.0, n);  // a graded one
    }

    void step() {
        using xt::range;
        const auto n = static_cast<long>(grid.shape(0));
        auto inner = [n] { return range(1L, n - 1); };
        laplacian_ =
            xt::view(grid, range(0L, n - 2), inner()) + xt::view(grid, range(2L, n), inner()) +
            xt::view(grid, inner(), range(0L, n - 2)) + xt::view(grid, inner(), range(2L, n)) -
            4.0 * xt::view(grid, inner(), inner());
        xt::view(grid, inner(), inner()) += 0.2 * laplacian_;
        ++iteration;
    }

    /// Views of the state for the checkpoint manager: saving copies nothing, loading writes
    /// straight into the grid.
    ckpt::ParamDict state_dict() {
        ckpt::ParamDict d;
        d.set("grid", ckpt::view_of(grid));
        d.set("iteration", ckpt::view_of(iteration));
        return d;
    }

private:
    xt::xtensor<double, 2> laplacian_;  // scratch, kept to avoid an allocation per step
};

std::string hex(std::uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

}  // namespace

int main(int argc, char** argv) {
    const Options opt = parse(argc, argv);
    Solver solver(opt.size);
    try {
        if (opt.fresh)
            if (const auto aside = examples::move_aside(opt.dir))
                std::printf("--fresh: moved the old checkpoints aside to %s\n", aside->string().c_str());
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> manager(
            opt.dir, "heat", ckpt::EverySteps{opt.every}, ckpt::KeepLast{opt.keep});
        if (auto restored = manager.restore(solver)) {
            std::printf("resuming from %s: saved at iteration %lld; going on at iteration %lld\n",
                        restored->file.path.string().c_str(), static_cast<long long>(solver.iteration),
                        static_cast<long long>(solver.iteration + 1));
        } else {
            std::printf("no valid checkpoint of 'heat' in %s: starting from iteration 0\n", opt.dir.c_str());
        }
        while (solver.iteration < opt.iters) {
            solver.step();
            if (solver.iteration == opt.kill_at) {
                std::printf("killing myself (SIGKILL) after iteration %lld\n", static_cast<long long>(opt.kill_at));
                std::fflush(stdout);
                ::kill(::getpid(), SIGKILL);
            }
            if (auto file = manager.on_step(ckpt::Progress::at_iteration(solver.iteration), solver))
                std::printf("iteration %6lld  saved %s\n", static_cast<long long>(solver.iteration),
                            file->filename().string().c_str());
        }
        std::printf("checkpoints kept:");
        for (const auto& f : manager.run_checkpoints()) std::printf(" %s", f.path.filename().string().c_str());
        std::printf("\n");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "heat_diffusion: %s\n", e.what());
        return 1;
    }
    std::printf("center temperature %.6f after %lld iterations\n", solver.grid(opt.size / 2, opt.size / 2),
                static_cast<long long>(solver.iteration));
    std::printf("final_grid_xxh3=%s\n",
                hex(ckpt::detail::xxh3(solver.grid.data(), solver.grid.size() * sizeof(double))).c_str());
    return 0;
}
