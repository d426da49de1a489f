// A Monte Carlo job that survives being killed: random walkers, running statistics in a
// std::map, a histogram class with a Boost.Serialization serialize(), a random engine and a
// normal distribution (which caches its second value). Nothing in it is a float tensor but
// the walkers; all of it is checkpointed as it is, and a strict restore writes every piece
// back. Killed at any moment and started again with the same command, it ends with the hash
// of a run that never stopped.
//
//   monte_carlo [--dir DIR] [--walkers N] [--steps N] [--every N] [--keep N] [--seed S]
//               [--fresh] [--help]

#include <ckpt/ckpt.hpp>
#include <ckpt/object.hpp>  // ckpt::object (ckpt.hpp has it too, but not in compiled mode)
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#include "../common/cli.hpp"
#include "../common/fresh.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

/// A fixed-range histogram: the kind of class a program already has, saved through its
/// serialize() as it is. (Outside the unnamed namespace: its name is the checkpoint's type
/// for it, "Histogram".)
struct Histogram {
    double lo = -40, hi = 40;
    std::vector<std::int64_t> bins = std::vector<std::int64_t>(64, 0);
    std::string label = "walker positions";

    void add(double x) {
        const double at = (x - lo) / (hi - lo) * static_cast<double>(bins.size());
        const auto i = static_cast<std::ptrdiff_t>(std::clamp(at, 0.0, static_cast<double>(bins.size() - 1)));
        ++bins[static_cast<std::size_t>(i)];
    }
    template <class Archive>
    void serialize(Archive& ar, unsigned /*version*/) {
        ar & lo & hi & bins & label;
    }
};

namespace {

struct Options {
    std::string dir = "monte_carlo_checkpoints";
    std::int64_t walkers = 4096;
    std::int64_t steps = 3000;
    std::int64_t every = 100;
    std::int64_t keep = 3;
    std::int64_t seed = 2026;
    bool fresh = false;
};

constexpr const char* usage_text =
    "monte_carlo [--dir DIR] [--walkers N] [--steps N] [--every N] [--keep N] [--seed S]\n"
    "                   [--fresh] [--help]";
constexpr const char* options_text =
    "Moves N random walkers --steps times by normal steps, keeps running statistics and a\n"
    "histogram of their positions, a checkpoint every --every steps in DIR (walk-{step}.ckpt),\n"
    "and ends with final_state_xxh3=<hash of the whole state and the next random number>.\n"
    "Started again after being killed, the same command resumes from the newest valid\n"
    "checkpoint and ends with the same hash; started again after it finished, it says so.\n"
    "\n"
    "  --dir DIR      checkpoint directory (default monte_carlo_checkpoints)\n"
    "  --walkers N    number of walkers (default 4096)\n"
    "  --steps N      steps to run (default 3000)\n"
    "  --every N      save every N steps (default 100)\n"
    "  --keep N       checkpoints kept (default 3)\n"
    "  --seed S       seed of the random engine (default 2026)\n"
    "  --fresh        start from step 0; an existing DIR is renamed DIR.old-N first\n"
    "  --help         this text\n"
    "\n"
    "Exit status: 0 done, 1 an error, 2 a usage error.\n";

Options parse(int argc, char** argv) {
    Options o;
    examples::Cli cli(argc, argv, usage_text, options_text);
    while (const auto a = cli.next()) {
        if (*a == "--dir") o.dir = cli.value();
        else if (*a == "--walkers") o.walkers = cli.count();
        else if (*a == "--steps") o.steps = cli.count();
        else if (*a == "--every") o.every = cli.count();
        else if (*a == "--keep") o.keep = cli.count();
        else if (*a == "--seed") o.seed = cli.count();
        else if (*a == "--fresh") o.fresh = true;
        else cli.unknown();
    }
    if (o.walkers < 1 || o.steps < 1 || o.every < 1 || o.keep < 1)
        cli.fail("--walkers, --steps, --every and --keep must be at least 1");
    return o;
}

/// The job's whole state.
struct Walk {
    std::vector<double> positions;
    std::map<std::string, double> stats{{"mean", 0}, {"m2", 0}, {"samples", 0}, {"max_abs", 0}};
    std::map<std::string, std::int64_t> crossings;  // keys appear as walkers cross new lines
    Histogram histogram;
    std::mt19937_64 engine;
    std::normal_distribution<double> normal{0.0, 1.0};
    std::string phase = "walking";
    std::int64_t step = 0;

    Walk(std::int64_t walkers, std::int64_t seed)
        : positions(static_cast<std::size_t>(walkers), 0.0), engine(static_cast<std::uint64_t>(seed)) {}

    void advance() {
        for (double& x : positions) {
            const double before = x;
            x += normal(engine);
            // Welford's running mean and variance of every position seen
            const double n = stats["samples"] += 1;
            const double delta = x - stats["mean"];
            stats["mean"] += delta / n;
            stats["m2"] += delta * (x - stats["mean"]);
            stats["max_abs"] = std::max(stats["max_abs"], std::fabs(x));
            const auto line = static_cast<long>(std::floor(x / 10));
            if (line != static_cast<long>(std::floor(before / 10))) ++crossings["line " + std::to_string(line * 10)];
        }
        histogram.add(positions[0]);
        ++step;
    }

    /// Every piece bound by reference: a save reads them, a restore writes them back.
    ckpt::ParamDict state_dict() {
        ckpt::ParamDict d;
        d.set("positions", ckpt::view_of(positions));
        d.set("stats", ckpt::view_of(stats));
        d.set("crossings", ckpt::view_of(crossings));
        d.set("histogram", ckpt::object(histogram));
        d.set("engine", ckpt::view_of(engine));
        d.set("normal", ckpt::view_of(normal));
        d.set("phase", ckpt::view_of(phase));
        d.set("step", ckpt::view_of(step));
        return d;
    }

    /// A hash of the whole state and of the next number the engine and distribution give.
    std::uint64_t hash() {
        std::string all(reinterpret_cast<const char*>(positions.data()), positions.size() * sizeof(double));
        for (const auto& [k, v] : stats) all += k + std::string(reinterpret_cast<const char*>(&v), sizeof v);
        for (const auto& [k, v] : crossings) all += k + std::to_string(v);
        for (const auto b : histogram.bins) all += std::to_string(b) + ",";
        const double next = normal(engine);
        all += phase + std::string(reinterpret_cast<const char*>(&next), sizeof next) + std::to_string(step);
        return ckpt::detail::xxh3(all.data(), all.size());
    }
};

}  // namespace

int main(int argc, char** argv) {
    const Options opt = parse(argc, argv);
    Walk walk(opt.walkers, opt.seed);
    try {
        if (opt.fresh)
            if (const auto aside = examples::move_aside(opt.dir))
                std::printf("--fresh: moved the old checkpoints aside to %s\n", aside->string().c_str());
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> manager(
            opt.dir, "walk", ckpt::EverySteps{opt.every}, ckpt::KeepLast{opt.keep});
        if (auto restored = manager.restore(walk)) {
            std::printf("resuming from %s: step %lld of %lld%s\n", restored->file.path.string().c_str(),
                        static_cast<long long>(walk.step), static_cast<long long>(opt.steps),
                        restored->finished ? " (the run had finished)" : "");
        } else {
            std::printf("no valid checkpoint of 'walk' in %s: starting from step 0\n", opt.dir.c_str());
        }
        std::fflush(stdout);  // said before any kill can end the run
        while (walk.step < opt.steps) {
            walk.advance();
            if (walk.step == opt.steps) walk.phase = "done";
            manager.on_step(ckpt::Progress::at_iteration(walk.step), walk);
        }
        manager.on_train_end(ckpt::Progress::at_iteration(walk.step), walk);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "monte_carlo: %s\n", e.what());
        return 1;
    }
    const double variance = walk.stats["m2"] / std::max(1.0, walk.stats["samples"] - 1);
    std::printf("after %lld steps: mean %.6f, variance %.3f, %zu lines crossed, phase '%s'\n",
                static_cast<long long>(walk.step), walk.stats["mean"], variance, walk.crossings.size(), walk.phase.c_str());
    std::printf("final_state_xxh3=%016llx\n", static_cast<unsigned long long>(walk.hash()));
    return 0;
}
