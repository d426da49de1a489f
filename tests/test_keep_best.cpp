// KeepBest and best(): checkpoints kept and found by a metric the save records.
#include <doctest/doctest.h>

#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/codecs/zstd.hpp>

#include <cmath>
#include <limits>

#include "support.hpp"

namespace {

namespace fs = boost::filesystem;
using test::TempDir;

/// Files oldest first, each with the given value of "loss" (NaN: none recorded).
std::vector<ckpt::StoredCheckpoint> files_with_loss(std::initializer_list<double> losses) {
    std::vector<ckpt::StoredCheckpoint> files;
    std::int64_t step = 0;
    for (double v : losses) {
        ckpt::StoredCheckpoint f;
        f.name.step = ++step;
        if (!std::isnan(v)) f.metrics["loss"] = v;
        files.push_back(f);
    }
    return files;
}

std::vector<std::size_t> kept_by(const ckpt::KeepBest& policy, const std::vector<ckpt::StoredCheckpoint>& files) {
    const auto doomed = policy.to_delete(files);
    std::vector<std::size_t> kept;
    for (std::size_t i = 0; i < files.size(); ++i)
        if (std::find(doomed.begin(), doomed.end(), i) == doomed.end()) kept.push_back(i);
    return kept;
}

constexpr double no_value = std::numeric_limits<double>::quiet_NaN();
constexpr double infinite = std::numeric_limits<double>::infinity();

ckpt::Progress at_step(std::int64_t step, double loss) {
    auto p = ckpt::Progress::at_iteration(step);
    p.metrics = {{"val_loss", loss}, {"accuracy", 1.0 - loss}};
    return p;
}

/// The steps of the checkpoints of "run" left in `dir` (StepNaming), in order.
std::vector<std::int64_t> steps_in(const fs::path& dir) {
    std::vector<std::int64_t> steps;
    for (const auto& f : ckpt::list_checkpoints(dir, "run", ckpt::StepNaming{})) steps.push_back(f.name.step);
    return steps;
}

constexpr double losses[] = {0.5, 0.3, 0.4, 0.2, 0.6, 0.7, 0.45, 0.25};

/// A directory, the log, and a state holding a view of `step`.
struct Scratch {
    TempDir dir;
    test::LogCapture log;
    std::int64_t step = 0;
    ckpt::ParamDict state = [this] {
        ckpt::ParamDict d;
        d.set("step", ckpt::view_of(step));
        return d;
    }();
};

}  // namespace

TEST_SUITE("keep best") {

TEST_CASE("KeepBest keeps the k best by its mode, never a file without a finite value, the newer of equals") {
    static_assert(ckpt::RetentionPolicy<ckpt::KeepBest>);
    static_assert(ckpt::detail::uses_metrics<ckpt::KeepBest>());
    static_assert(!ckpt::detail::uses_metrics<ckpt::KeepLast>());
    static_assert(ckpt::detail::uses_metrics<ckpt::KeepUnion<ckpt::KeepLast, ckpt::KeepBest>>());
    static_assert(ckpt::detail::uses_metrics<ckpt::KeepIntersection<ckpt::KeepBest, ckpt::KeepLast>>());

    const auto files = files_with_loss({0.5, 0.3, no_value, 0.2, infinite, 0.3, -infinite});
    CHECK(kept_by(ckpt::KeepBest(2, "loss"), files) == std::vector<std::size_t>{3, 5});  // 0.2, then the newer 0.3
    CHECK(kept_by(ckpt::KeepBest(3, "loss", ckpt::Mode::max), files) == std::vector<std::size_t>{0, 1, 5});
    // more places than ranked files: every file with a finite value, and no other
    CHECK(kept_by(ckpt::KeepBest(10, "loss"), files) == std::vector<std::size_t>{0, 1, 3, 5});
    // another metric's name: nothing ranks, nothing is kept by this policy
    CHECK(kept_by(ckpt::KeepBest(2, "accuracy"), files).empty());

    CHECK_THROWS_WITH_AS(ckpt::KeepBest(0, "loss"), doctest::Contains("k >= 1"), ckpt::ConfigError);
    CHECK_THROWS_WITH_AS(ckpt::KeepBest(2, ""), doctest::Contains("name of a metric"), ckpt::ConfigError);
}

TEST_CASE("a manager with KeepBest keeps the best checkpoints and the newest, and best() finds the best") {
    Scratch scratch;
    const TempDir& dir = scratch.dir;
    std::int64_t& step = scratch.step;
    ckpt::ParamDict& state = scratch.state;
    ckpt::ManagerOptions options;
    options.append_info = ckpt::AppendInfo{"step_num"};
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepBest, ckpt::StepNaming> mgr(
        dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepBest{2, "val_loss"}, {}, options);
    for (step = 1; step <= 6; ++step) mgr.on_step(at_step(step, losses[step - 1]), state);
    // the best two (0.2 at step 4, 0.3 at 2) and the newest, which the manager never deletes
    CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{2, 4, 6});

    const auto best = ckpt::best_checkpoint(dir.path(), "run", "val_loss");
    REQUIRE(best);
    CHECK(best->name.step == 4);
    CHECK(best->metrics.at("val_loss") == 0.2);
    CHECK(best->metrics.at("step_num") == 4.0);  // the file's int64 and double values come along
    CHECK(ckpt::best(dir.path(), "run", "accuracy", ckpt::Mode::max)->filename().string() == "run-4.ckpt");
    CHECK_FALSE(ckpt::best(dir.path(), "run", "no_such_metric"));

    // the recorded metrics are the manager's entries: loads leave them out, restore is strict
    step = 0;
    CHECK_NOTHROW(mgr.restore(state));
    CHECK(step == 6);
    const auto loaded = ckpt::load_checkpoint(dir / "run-6.ckpt");
    CHECK(loaded.size() == 2);
    CHECK(loaded.contains("step"));
    CHECK(loaded.contains("step_num"));
}

TEST_CASE("KeepUnion of KeepLast and KeepBest keeps the newest n and the best k, across a restart") {
    Scratch scratch;
    const TempDir& dir = scratch.dir;
    std::int64_t& step = scratch.step;
    ckpt::ParamDict& state = scratch.state;
    using Policy = ckpt::KeepUnion<ckpt::KeepLast, ckpt::KeepBest>;
    auto manager = [&] {
        return ckpt::CheckpointManager<ckpt::EverySteps, Policy, ckpt::StepNaming>(
            dir.path(), "run", ckpt::EverySteps{1}, Policy(ckpt::KeepLast{2}, ckpt::KeepBest{2, "val_loss"}));
    };
    {
        auto mgr = manager();
        for (step = 1; step <= 5; ++step) mgr.on_step(at_step(step, losses[step - 1]), state);
        CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{2, 4, 5});  // best 0.2, 0.3; newest 4, 5
    }
    // a job started again: StepNaming's scope is every run, so the bound holds across runs
    auto mgr = manager();
    REQUIRE(mgr.restore(state));
    for (++step; step <= 8; ++step) mgr.on_step(at_step(step, losses[step - 1]), state);
    // best 0.2 (4) and 0.25 (8); newest 7 and 8
    const auto left = ckpt::list_checkpoints(dir.path(), "run", ckpt::StepNaming{});
    std::vector<std::string> names;
    for (const auto& f : left) names.push_back(f.path.filename().string());
    CHECK(names == std::vector<std::string>{"run-4.ckpt", "run_1-7.ckpt", "run_1-8.ckpt"});
}

TEST_CASE("the metric may be a value the file holds, and what the save records wins") {
    TempDir dir;
    test::LogCapture log;
    std::int64_t step = 0;
    double val_loss = 0;
    // a state that saves the loss as a value (a view of a scalar is a 0-d tensor in the file,
    // whose payload a listing does not read: it does not rank)
    auto state = [&] {
        ckpt::ParamDict d;
        d.set("step", ckpt::view_of(step));
        d.set("val_loss", val_loss);
        return d;
    };
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepBest, ckpt::StepNaming> mgr(
        dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepBest{1, "val_loss"});
    for (step = 1; step <= 4; ++step) {
        val_loss = losses[step - 1];
        mgr.on_step(ckpt::Progress::at_iteration(step), state);  // no recorded metrics
    }
    CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{4});  // 0.2 at step 4 is best and newest
    // a recorded metric of the same name ranks instead of the state's value
    step = 5;
    val_loss = 0.1;
    auto p = ckpt::Progress::at_iteration(step);
    p.metrics = {{"val_loss", 0.9}};
    mgr.on_step(p, state);
    CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{4, 5});  // 5 only as the newest
    CHECK(ckpt::best_checkpoint(dir.path(), "run", "val_loss")->name.step == 4);
}

TEST_CASE("a metric that is not finite is not recorded, with a notice, in every archive") {
    Scratch scratch;
    const TempDir& dir = scratch.dir;
    std::int64_t& step = scratch.step;
    ckpt::ParamDict& state = scratch.state;
    // text archives cannot hold a NaN: recording one would fail the save
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepBest, ckpt::StepNaming, ckpt::TextArchive> mgr(
        dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepBest{1, "val_loss"});
    step = 1;
    mgr.on_step(at_step(1, 0.4), state);
    step = 2;
    REQUIRE_NOTHROW(mgr.on_step(at_step(2, no_value), state));
    CHECK(std::any_of(scratch.log.infos.begin(), scratch.log.infos.end(), [](const std::string& m) {
        return m.find("metric 'val_loss'") != std::string::npos && m.find("not finite") != std::string::npos;
    }));
    const auto contents = ckpt::read_contents(dir / "run-2.ckpt");
    const auto metrics = ckpt::detail::metrics_in(contents.entries);
    CHECK_FALSE(metrics.contains("val_loss"));
    CHECK(metrics.contains("accuracy") == false);  // 1 - NaN is NaN too
    // the NaN checkpoint is never best: the best stays the one at step 1
    CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{1, 2});
    CHECK(ckpt::best_checkpoint(dir.path(), "run", "val_loss")->name.step == 1);

    auto unnamed = ckpt::Progress::at_iteration(3);
    unnamed.metrics = {{"", 1.0}};
    CHECK_THROWS_WITH_AS(mgr.on_step(unnamed, state), doctest::Contains("a metric needs a name"), ckpt::ConfigError);
    CHECK_FALSE(fs::exists(dir / "run-3.ckpt"));
}

TEST_CASE("KeepBest says once when no checkpoint records its metric, instead of pruning in silence") {
    Scratch scratch;
    const TempDir& dir = scratch.dir;
    std::int64_t& step = scratch.step;
    ckpt::ParamDict& state = scratch.state;
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepBest, ckpt::StepNaming> mgr(
        dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepBest{2, "val_los"});  // misspelled
    for (step = 1; step <= 3; ++step) mgr.on_step(at_step(step, losses[step - 1]), state);
    CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{3});  // only the newest, as the manager keeps it
    // said once, not at every save
    CHECK(std::count_if(scratch.log.infos.begin(), scratch.log.infos.end(), [](const std::string& m) {
              return m.find("KeepBest ranks by 'val_los', but none of the") != std::string::npos;
          }) == 1);
}

TEST_CASE("best() passes over a damaged best file, naming it, and takes the next") {
    Scratch scratch;
    const TempDir& dir = scratch.dir;
    std::int64_t& step = scratch.step;
    ckpt::ParamDict& state = scratch.state;
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> mgr(dir.path(), "run",
                                                                                  ckpt::EverySteps{1});
    for (step = 1; step <= 5; ++step) mgr.on_step(at_step(step, losses[step - 1]), state);
    test::flip_bit(dir / "run-4.ckpt", test::read_bytes(dir / "run-4.ckpt").size() - 1);  // the best: 0.2
    std::vector<ckpt::SkippedCheckpoint> skipped;
    const auto best = ckpt::best_checkpoint(dir.path(), "run", "val_loss", ckpt::Mode::min, ckpt::StepNaming{},
                                            &skipped);
    REQUIRE(best);
    CHECK(best->name.step == 2);  // 0.3
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].path.filename().string() == "run-4.ckpt");
    CHECK(skipped[0].reason.find("corrupt") != std::string::npos);
}

TEST_CASE("KeepBest reads the metrics of compressed and encrypted checkpoints with the manager's key") {
    Scratch scratch;
    const TempDir& dir = scratch.dir;
    std::int64_t& step = scratch.step;
    ckpt::ParamDict& state = scratch.state;
    const ckpt::Key key = ckpt::Key::from_bytes(std::string(32, '\x07'));
    using Codec = ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>;
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepBest, ckpt::StepNaming, ckpt::BinaryArchive, Codec> mgr(
        dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepBest{2, "val_loss"}, {}, {}, Codec{ckpt::Zstd{1}, ckpt::AesGcm{key}});
    for (step = 1; step <= 6; ++step) mgr.on_step(at_step(step, losses[step - 1]), state);
    CHECK(steps_in(dir.path()) == std::vector<std::int64_t>{2, 4, 6});
    ckpt::LoadOptions with_key;
    with_key.key = key;
    const auto best = ckpt::best_checkpoint(dir.path(), "run", "val_loss", ckpt::Mode::min, ckpt::StepNaming{},
                                            nullptr, with_key);
    REQUIRE(best);
    CHECK(best->name.step == 4);
    // without the key nothing can be ranked, and each file says why
    std::vector<ckpt::SkippedCheckpoint> skipped;
    CHECK_FALSE(ckpt::best_checkpoint(dir.path(), "run", "val_loss", ckpt::Mode::min, ckpt::StepNaming{}, &skipped));
    CHECK(skipped.size() == 3);
}
}
