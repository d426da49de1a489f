// What a newcomer's ordinary variations must never do silently: take another job's files for
// this prefix's (or delete them), drop a value on restore, let append_info replace state,
// ignore an exception save, or find nothing because of the naming.
#include <doctest/doctest.h>

#include <optional>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

using test::TempDir;

struct Counter {
    std::vector<double> w = std::vector<double>(4, 0.0);
    std::int64_t iteration = 0;
    ckpt::ParamDict state_dict() {
        ckpt::ParamDict d;
        d.set("w", ckpt::Tensor::view(std::span<double>(w), {4}));
        d.set("iteration", ckpt::view_of(iteration));
        return d;
    }
    void step() {
        ++iteration;
        for (auto& x : w) x += 1.0;
    }
};

using StepManager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;

bool contains(const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

TEST_SUITE("no silent loss") {

TEST_CASE("a prefix that another prefix's runs could produce, or that is unsafe in a file name, is refused") {
    TempDir dir;
    for (const std::string bad : {"exp_1", "exp_12", "", "a\nb", "..", ".hidden", "-x", "a*b", "a?b", "a/b", "a\\b",
                                  "x_breakpoint"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(StepManager(dir.path(), bad, ckpt::EverySteps{1}), ckpt::ConfigError);
    }
    try {
        StepManager(dir.path(), "exp_1", ckpt::EverySteps{1});
    } catch (const ckpt::ConfigError& e) {
        CHECK(std::string(e.what()).find("runs of prefix 'exp'") != std::string::npos);
    }
    try {  // the arguments the other way round (MindSpore's order): the message says which comes first
        StepManager("lenet", (dir / "lenet").string(), ckpt::EverySteps{1});
        FAIL("a directory given as the prefix must be refused");
    } catch (const ckpt::ConfigError& e) {
        CHECK(std::string(e.what()).find("the directory comes first, then the prefix") != std::string::npos);
    }
    try {
        StepManager(dir.path(), "a\nb", ckpt::EverySteps{1});
    } catch (const ckpt::ConfigError& e) {
        CHECK(std::string(e.what()).find("a\\x0ab") != std::string::npos);  // one line, the newline shown
    }
    for (const std::string good : {"exp", "exp-1", "exp_a", "run_1b", "lenet", "a.b"}) {
        CAPTURE(good);
        CHECK_NOTHROW(StepManager(dir.path(), good, ckpt::EverySteps{1}));
    }
}

TEST_CASE("a file named like a run of this prefix but recording another owner is never restored or deleted") {
    TempDir dir;
    test::LogCapture log;
    Counter other;
    other.w.assign(4, 7.0);
    other.iteration = 50;
    {
        StepManager a(dir / "a", "other", ckpt::EverySteps{1});
        a.save(ckpt::Progress::at_iteration(50), other);
    }
    // The other job's file lands in this job's directory under a name of this prefix's run 1.
    boost::filesystem::copy_file(dir / "a" / "other-50.ckpt", dir / "exp_1-50.ckpt");
    Counter c;
    StepManager b(dir.path(), "exp", ckpt::EverySteps{1}, ckpt::KeepLast{2});
    std::vector<ckpt::SkippedCheckpoint> skipped;
    CHECK_FALSE(b.restore(c, true, &skipped));
    CHECK(c.iteration == 0);
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].reason.find("belongs to prefix 'other'") != std::string::npos);
    CHECK_FALSE(ckpt::latest(dir.path(), "exp", ckpt::StepNaming{}));
    CHECK(ckpt::list_checkpoints(dir.path(), "exp", ckpt::StepNaming{}).empty());
    for (int i = 0; i < 4; ++i) {
        c.step();
        b.on_step(ckpt::Progress::at_iteration(c.iteration), c);
    }
    const auto names = test::names_in(dir.path());
    CHECK(contains(names, "exp_1-50.ckpt"));  // another's: kept
    CHECK(b.managed_checkpoints().size() == 2);
    CHECK(ckpt::read_owner(dir / "exp_1-50.ckpt")->prefix == "other");
    const auto mine = ckpt::read_owner(b.latest()->path);
    REQUIRE(mine);
    CHECK(mine->prefix == "exp");
    CHECK(mine->run_prefix == b.run_prefix());
    // The record is the manager's: a load does not hand it to the program.
    CHECK_FALSE(ckpt::load_checkpoint(b.latest()->path).contains("__ckpt.prefix"));
}

TEST_CASE("retention leaves alone files that record no owner, whatever their names say") {
    TempDir dir;
    test::LogCapture log;
    ckpt::ParamDict legacy;
    legacy.set("w", ckpt::Tensor(ckpt::DType::float64, {4}));
    legacy.set("iteration", ckpt::Tensor(ckpt::DType::int64, {}));
    ckpt::save_checkpoint(legacy, dir / "exp_1-2.ckpt", {.epoch = 1, .step = 2});  // no owner record
    Counter c;
    StepManager b(dir.path(), "exp", ckpt::EverySteps{1}, ckpt::KeepLast{1});
    REQUIRE(b.restore(c));  // only its name to go by: taken, as versions without records wrote it
    for (int i = 0; i < 3; ++i) {
        c.step();
        b.on_step(ckpt::Progress::at_iteration(c.iteration), c);
    }
    const auto names = test::names_in(dir.path());
    CHECK(contains(names, "exp_1-2.ckpt"));
    CHECK(b.managed_checkpoints().size() == 2);  // the legacy file and the newest
}

TEST_CASE("a value set by copy cannot be restored: a strict restore names it, a view of a scalar is written back") {
    TempDir dir;
    struct ByCopy {
        std::int64_t iteration = 0;
        double lr = 0.5;
        ckpt::ParamDict state_dict() {
            ckpt::ParamDict d;
            d.set("iteration", iteration);
            d.set("lr", lr);
            return d;
        }
    } copy;
    copy.iteration = 41;
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(dir.path(), "v", ckpt::EverySteps{1});
    mgr.save(ckpt::Progress::at_iteration(41), copy);
    ByCopy fresh;
    try {
        mgr.restore(fresh);
        FAIL("a strict restore into values set by copy must fail");
    } catch (const ckpt::LoadMismatch& e) {
        const std::string what = e.what();
        CHECK(what.find("'iteration'") != std::string::npos);
        CHECK(what.find("'lr'") != std::string::npos);
        CHECK(what.find("view_of") != std::string::npos);
    }
    CHECK(fresh.iteration == 0);
    // Non-strict: reported as not loaded, with the values in the report's rest.
    auto r = mgr.restore(fresh, false);
    REQUIRE(r);
    CHECK(r->report.param_not_load.size() == 2);
    CHECK(r->report.rest.get<std::int64_t>("iteration") == 41);

    // The file's int64 and double values go into views of scalars of their types.
    struct ByView {
        std::int64_t iteration = 0;
        double lr = 0;
        bool done = false;
        ckpt::ParamDict state_dict() {
            ckpt::ParamDict d;
            d.set("iteration", ckpt::view_of(iteration));
            d.set("lr", ckpt::view_of(lr));
            return d;
        }
    } view;
    REQUIRE(mgr.restore(view));
    CHECK(view.iteration == 41);
    CHECK(view.lr == 0.5);
    // A view of another type is a mismatch, not a silent conversion.
    struct WrongType {
        std::int32_t iteration = 0;
        ckpt::ParamDict state_dict() {
            ckpt::ParamDict d;
            d.set("iteration", ckpt::view_of(iteration));
            return d;
        }
    } wrong;
    CHECK_THROWS_AS(mgr.restore(wrong), ckpt::LoadMismatch);
}

TEST_CASE("append_info that names a value of the state is an error naming it, and nothing is written") {
    TempDir dir;
    ckpt::ManagerOptions o;
    o.append_info = ckpt::AppendInfo{"epoch_num", ckpt::ParamDict{{"lr", 0.01}}};
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(dir.path(), "ai", ckpt::EverySteps{1},
                                                                                    ckpt::KeepLast{}, {}, o);
    ckpt::ParamDict state{{"lr", 0.5}};
    try {
        mgr.save(ckpt::Progress::at_iteration(1), state);
        FAIL("append_info replacing a state value must fail");
    } catch (const ckpt::ConfigError& e) {
        CHECK(std::string(e.what()).find("'lr'") != std::string::npos);
    }
    CHECK_FALSE(mgr.latest());
    ckpt::ParamDict reserved{{"__ckpt.prefix", "mine"}};
    CHECK_THROWS_AS(mgr.save(ckpt::Progress::at_iteration(1), reserved), ckpt::ConfigError);
}

TEST_CASE("an exception save written after every regular checkpoint is what restore and latest take") {
    TempDir dir;
    test::LogCapture log;
    ckpt::ManagerOptions o;
    o.exception_save = true;
    Counter c;
    {
        StepManager mgr(dir.path(), "bp", ckpt::EverySteps{3}, ckpt::KeepLast{2}, {}, o);
        for (int i = 0; i < 5; ++i) {
            c.step();
            mgr.on_step(ckpt::Progress::at_iteration(c.iteration), c);
        }
        mgr.on_exception(ckpt::Progress::at_iteration(c.iteration), c);  // the loop failed after step 5
    }
    CHECK(ckpt::latest(dir.path(), "bp", ckpt::StepNaming{})->filename() == "bp-5_breakpoint.ckpt");
    Counter resumed;
    std::optional<StepManager> again_run;
    StepManager& again = again_run.emplace(dir.path(), "bp", ckpt::EverySteps{3}, ckpt::KeepLast{2}, ckpt::StepNaming{}, o);
    auto r = again.restore(resumed);
    REQUIRE(r);
    CHECK(r->file.path.filename() == "bp-5_breakpoint.ckpt");
    CHECK(resumed.iteration == 5);
    CHECK(resumed.w == c.w);
    CHECK(std::any_of(log.infos.begin(), log.infos.end(),
                      [](const std::string& m) { return m.find("exception save") != std::string::npos; }));
    // Once a regular checkpoint is written after it, that one is newer.
    resumed.step();
    again.save(ckpt::Progress::at_iteration(resumed.iteration), resumed);
    CHECK(ckpt::latest(dir.path(), "bp", ckpt::StepNaming{})->filename() == "bp_1-6.ckpt");
    // An exception save older than the newest regular checkpoint is passed over.
    again_run.reset();
    StepManager third(dir.path(), "bp", ckpt::EverySteps{3}, ckpt::KeepLast{2}, {}, o);
    Counter last;
    CHECK(third.restore(last)->file.path.filename() == "bp_1-6.ckpt");
}

TEST_CASE("a lookup without a naming finds StepNaming files, a manager of another naming warns about them") {
    TempDir dir;
    test::LogCapture log;
    Counter c;
    {
        StepManager mgr(dir.path(), "heat", ckpt::EverySteps{1});
        c.step();
        mgr.on_step(ckpt::Progress::at_iteration(1), c);
    }
    CHECK(ckpt::latest(dir.path(), "heat")->filename() == "heat-1.ckpt");
    CHECK(ckpt::list_checkpoints(dir.path(), "heat").size() == 1);
    ckpt::CheckpointManager seed(dir.path(), "heat");  // MindSporeNaming
    Counter fresh;
    CHECK_FALSE(seed.restore(fresh));
    CHECK(std::any_of(log.warnings.begin(), log.warnings.end(),
                      [](const std::string& m) { return m.find("'heat-1.ckpt'") != std::string::npos; }));
}

TEST_CASE("on_train_end saves the final step whatever the save policy, but Never, and only once") {
    TempDir dir;
    Counter c;
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> every4(dir / "a", "s", ckpt::EverySteps{4});
    for (int i = 0; i < 6; ++i) {
        c.step();
        every4.on_step(ckpt::Progress::at_iteration(c.iteration), c);
    }
    auto p = ckpt::Progress::at_iteration(c.iteration);
    CHECK(every4.on_train_end(p, c)->filename() == "s-6.ckpt");
    CHECK(test::names_in(dir / "a") == std::vector<std::string>{"s-4.ckpt", "s-6.ckpt", "s-graph.meta", "s.finished"});
    CHECK_FALSE(every4.on_train_end(p, c));  // saved already
    ckpt::CheckpointManager<ckpt::Never, ckpt::KeepAll, ckpt::StepNaming> never(dir / "b", "s");
    CHECK_FALSE(never.on_train_end(p, c));
    CHECK(test::names_in(dir / "b").empty());
}

TEST_CASE("a save whose run description cannot be written names the checkpoint it was saving") {
    TempDir dir;
    boost::filesystem::create_directories(dir / "x-graph.meta");  // where the description goes: taken
    StepManager mgr(dir.path(), "x", ckpt::EverySteps{1});
    Counter c;
    try {
        mgr.save(ckpt::Progress::at_iteration(1), c);
        FAIL("the save must fail");
    } catch (const ckpt::IoError& e) {
        const std::string what = e.what();
        CHECK(what.find("cannot save checkpoint '" + (dir / "x-1.ckpt").string() + "'") != std::string::npos);
        CHECK(what.find("x-graph.meta") != std::string::npos);
    }
    CHECK_FALSE(boost::filesystem::exists(dir / "x-1.ckpt"));
}


TEST_CASE("StepNaming files of a loop with epochs are not refused: their names hold the global step") {
    test::TempDir dir;
    test::LogCapture quiet;
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(std::vector<float>{1, 2}, {2}));
    auto save = [&](const std::string& name, std::int64_t epoch, std::int64_t step) {
        ckpt::SaveOptions o;
        o.epoch = epoch;
        o.step = step;
        test::save_owned(d, dir / name, "s", "s", o);
    };
    save("s-6.ckpt", 3, 2);  // epoch 3 of 2-step epochs: global step 6
    save("s-5.ckpt", 1, 5);  // a loop without epochs
    save("s-7.ckpt", 1, 6);  // the first epoch: the name must be the step
    save("s-8.ckpt", 2, 9);  // no step of an epoch is past the global step
    std::vector<ckpt::SkippedCheckpoint> skipped;
    const auto latest = ckpt::latest_checkpoint(dir.path(), "s", ckpt::StepNaming{}, &skipped);
    REQUIRE(latest);
    CHECK(latest->path.filename().string() == "s-6.ckpt");
    REQUIRE(skipped.size() == 2);
    CHECK(skipped[0].path.filename().string() == "s-8.ckpt");
    CHECK(skipped[0].reason.find("global step 8 but its header says epoch 2 step 9") != std::string::npos);
    CHECK(skipped[1].path.filename().string() == "s-7.ckpt");
}

}  // TEST_SUITE
