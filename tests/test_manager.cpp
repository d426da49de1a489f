// CheckpointManager and latest(): the seed's directory tree, retention limits, fallbacks.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>

#include "support.hpp"

namespace {

using test::TempDir;

/// A tiny "network": one weight vector, loaded and saved through views.
struct TinyNet {
    std::vector<float> w = std::vector<float>(8, 0.0f);
    ckpt::ParamDict state_dict() {
        ckpt::ParamDict d;
        d.set("fc.weight", ckpt::Tensor::view(std::span<float>(w), {2, 4}));
        return d;
    }
};

ckpt::Progress epoch_end(std::int64_t epoch, std::int64_t steps_per_epoch = 1875) {
    ckpt::Progress p;
    p.epoch = epoch;
    p.step = steps_per_epoch;
    p.global_step = epoch * steps_per_epoch;
    return p;
}

using SeedManager = ckpt::CheckpointManager<ckpt::EveryEpochs, ckpt::KeepLast, ckpt::MindSporeNaming>;
using StepManager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;

/// Three runs of prefix "m" (three restarts), each restoring the previous one's newest
/// checkpoint and saving three more steps with KeepLast{2}; what is left in `dir`.
template <ckpt::NamingPolicy N>
std::vector<std::string> three_runs(const boost::filesystem::path& dir, ckpt::ManagerOptions options = {}) {
    TinyNet net;
    std::int64_t step = 0;
    for (int run = 0; run < 3; ++run) {
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, N> mgr(dir, "m", ckpt::EverySteps{1},
                                                                        ckpt::KeepLast{2}, N{}, options);
        if (auto restored = mgr.restore(net)) CHECK(restored->file.name.step == step);
        for (int i = 0; i < 3; ++i) mgr.on_step(ckpt::Progress::at_iteration(++step), net);
    }
    return test::names_in(dir);
}

/// The global steps of the last-words checkpoints in `dir`, in order.
std::vector<std::int64_t> last_words_steps(const boost::filesystem::path& dir) {
    std::vector<std::int64_t> out;
    for (const auto& f : ckpt::list_checkpoints(dir, "ttp", ckpt::LastWordsNaming{})) out.push_back(f.name.global_step);
    return out;
}

}  // namespace

TEST_SUITE("manager") {

TEST_CASE("the seed's fault-recovery tree: crash after epoch 6, resume at 7, finish at 10") {
    TempDir dir;
    TinyNet net;
    {
        SeedManager mgr(dir / "lenet", "lenet", ckpt::EveryEpochs{1}, ckpt::KeepLast{5}, {}, test::seed_options());
        CHECK(mgr.run_prefix() == "lenet");
        for (std::int64_t e = 1; e <= 6; ++e) {
            std::fill(net.w.begin(), net.w.end(), static_cast<float>(e));
            mgr.on_epoch_end(epoch_end(e), net);
        }
    }  // "Some errors happen."
    CHECK(test::names_in(dir / "lenet") ==
          std::vector<std::string>{"lenet-2_1875.ckpt", "lenet-3_1875.ckpt", "lenet-4_1875.ckpt", "lenet-5_1875.ckpt",
                                   "lenet-6_1875.ckpt", "lenet-graph.meta"});

    TinyNet resumed;
    SeedManager mgr(dir / "lenet", "lenet", ckpt::EveryEpochs{1}, ckpt::KeepLast{5}, {}, test::seed_options());
    CHECK(mgr.run_prefix() == "lenet_1");
    auto restored = mgr.restore(resumed);
    REQUIRE(restored);
    CHECK(restored->file.path.filename() == "lenet-6_1875.ckpt");
    CHECK(resumed.w == net.w);
    const auto epoch_num = restored->report.rest.get<std::int64_t>("epoch_num");
    CHECK(epoch_num == 6);
    CHECK(restored->report.rest.get<std::int64_t>("step_num") == 6 * 1875);
    CHECK(restored->report.rest.get<double>("momentum") == 0.9);
    for (std::int64_t e = epoch_num + 1; e <= 10; ++e) mgr.on_epoch_end(epoch_end(e), resumed);
    CHECK(test::names_in(dir / "lenet") ==
          std::vector<std::string>{"lenet-2_1875.ckpt", "lenet-3_1875.ckpt", "lenet-4_1875.ckpt", "lenet-5_1875.ckpt",
                                   "lenet-6_1875.ckpt", "lenet-graph.meta", "lenet_1-10_1875.ckpt",
                                   "lenet_1-7_1875.ckpt", "lenet_1-8_1875.ckpt", "lenet_1-9_1875.ckpt",
                                   "lenet_1-graph.meta"});
    CHECK(ckpt::latest(dir / "lenet", "lenet")->filename() == "lenet_1-10_1875.ckpt");
}

TEST_CASE("graph.meta describes the saved state in readable text") {
    TempDir dir;
    TinyNet net;
    SeedManager mgr(dir.path(), "lenet", ckpt::EveryEpochs{1}, ckpt::KeepLast{5}, {}, test::seed_options());
    mgr.on_epoch_end(epoch_end(1), net);
    const auto text = test::read_bytes(dir / "lenet-graph.meta");
    const std::string meta(text.begin(), text.end());
    CHECK(meta.find("fc.weight\tfloat32[2, 4]\n") != std::string::npos);
    CHECK(meta.find("epoch_num\tint64\n") != std::string::npos);
    CHECK(meta.find("lr\tdouble\n") != std::string::npos);
}

TEST_CASE("a step-end and an epoch-end save at the same step write one file") {
    TempDir dir;
    TinyNet net;
    ckpt::CheckpointManager mgr(dir.path(), "m", ckpt::AnyOf(ckpt::EverySteps{2}, ckpt::EveryEpochs{1}),
                                ckpt::KeepAll{});
    auto p = epoch_end(1, 4);
    CHECK(mgr.on_step(p, net));
    CHECK_FALSE(mgr.on_epoch_end(p, net));
    CHECK(mgr.run_checkpoints().size() == 1);
}

TEST_CASE("a save that failed is tried again at the next event of the same step") {
    test::TempDir dir;
    TinyNet net;
    ckpt::ManagerOptions no_meta;  // so that the checkpoint write itself is what fails
    no_meta.write_meta = false;
    ckpt::CheckpointManager mgr(dir / "ckpts", "m", ckpt::AnyOf(ckpt::EverySteps{2}, ckpt::EveryEpochs{1}),
                                ckpt::KeepAll{}, ckpt::MindSporeNaming{}, no_meta);
    boost::filesystem::remove_all(dir / "ckpts");
    auto p = epoch_end(1, 4);
    CHECK_THROWS_AS(mgr.on_step(p, net), ckpt::IoError);
    boost::filesystem::create_directories(dir / "ckpts");
    CHECK(mgr.on_epoch_end(p, net));  // not skipped as "already saved at this step"
}

TEST_CASE("retention touches only this run's files and never the one just written") {
    TempDir dir;
    TinyNet net;
    ckpt::save_checkpoint(net.state_dict(), dir / "other-1_1.ckpt");
    ckpt::save_checkpoint(net.state_dict(), dir / "m-1_1.ckpt");  // an earlier run of the same prefix
    ckpt::CheckpointManager mgr(dir.path(), "m", ckpt::EverySteps{1}, ckpt::KeepLast{1});
    CHECK(mgr.run_prefix() == "m_1");
    for (std::int64_t s = 1; s <= 4; ++s) {
        ckpt::Progress p;
        p.step = p.global_step = s;
        mgr.on_step(p, net);
    }
    mgr.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) ==
          std::vector<std::string>{"m-1_1.ckpt", "m_1-1_4.ckpt", "m_1-graph.meta", "other-1_1.ckpt"});
}

TEST_CASE("retention leaves a newer corrupt file alone and does not count it") {
    TempDir dir;
    TinyNet net;
    ckpt::CheckpointManager mgr(dir.path(), "m", ckpt::EverySteps{1}, ckpt::KeepLast{2});
    auto at = [](std::int64_t s) {
        ckpt::Progress p;
        p.step = p.global_step = s;
        return p;
    };
    mgr.on_step(at(1), net);
    mgr.on_step(at(2), net);
    test::write_bytes(dir / "m-1_9.ckpt", std::vector<char>(10, 'x'));  // newer by name, not a checkpoint
    test::LogCapture log;
    mgr.on_step(at(3), net);
    mgr.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) ==
          std::vector<std::string>{"m-1_2.ckpt", "m-1_3.ckpt", "m-1_9.ckpt", "m-graph.meta"});
    REQUIRE_FALSE(log.warnings.empty());
    CHECK(log.warnings[0].find("m-1_9.ckpt") != std::string::npos);
    CHECK(ckpt::latest(dir.path(), "m")->filename() == "m-1_3.ckpt");
}

TEST_CASE("retention scope by default: every run of the prefix, with either naming") {
    TempDir seed, steps;
    // KeepLast{2} holds across restarts, and the emptied runs' meta files went with their checkpoints
    CHECK(three_runs<ckpt::MindSporeNaming>(seed.path()) ==
          std::vector<std::string>{"m_2-1_8.ckpt", "m_2-1_9.ckpt", "m_2-graph.meta"});
    CHECK(three_runs<ckpt::StepNaming>(steps.path()) ==
          std::vector<std::string>{"m_2-8.ckpt", "m_2-9.ckpt", "m_2-graph.meta"});
    CHECK(StepManager(steps.path(), "m").retention_scope() == ckpt::RetentionScope::all_runs);
    CHECK(SeedManager(seed.path(), "m").retention_scope() == ckpt::RetentionScope::all_runs);
}

TEST_CASE("ManagerOptions::retention_scope overrides the naming policy's") {
    TempDir seed, steps;
    ckpt::ManagerOptions all, current;
    all.retention_scope = ckpt::RetentionScope::all_runs;
    current.retention_scope = ckpt::RetentionScope::current_run;
    CHECK(three_runs<ckpt::MindSporeNaming>(seed.path(), all) ==
          std::vector<std::string>{"m_2-1_8.ckpt", "m_2-1_9.ckpt", "m_2-graph.meta"});
    CHECK(three_runs<ckpt::StepNaming>(steps.path(), current) ==
          std::vector<std::string>{"m-2.ckpt", "m-3.ckpt", "m-graph.meta", "m_1-5.ckpt", "m_1-6.ckpt", "m_1-graph.meta",
                                   "m_2-8.ckpt", "m_2-9.ckpt", "m_2-graph.meta"});
    CHECK(StepManager(steps.path(), "m", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, current).retention_scope() ==
          ckpt::RetentionScope::current_run);
}

TEST_CASE("every run in scope: a run's graph.meta goes with its last checkpoint, and a failed save deletes nothing") {
    TempDir dir;
    TinyNet net;
    test::LogCapture log;
    auto step = [](std::int64_t s) { return ckpt::Progress::at_iteration(s); };
    {
        StepManager first(dir.path(), "m", ckpt::EverySteps{1}, ckpt::KeepLast{2});
        for (std::int64_t s = 1; s <= 3; ++s) first.on_step(step(s), net);
    }
    std::optional<StepManager> second_run;
    StepManager& second = second_run.emplace(dir.path(), "m", ckpt::EverySteps{1}, ckpt::KeepLast{2});
    REQUIRE(second.run_prefix() == "m_1");
    // a save that fails (a directory where its file goes) deletes nothing of the earlier run
    boost::filesystem::create_directory(dir / "m_1-4.ckpt");
    CHECK_THROWS_AS(second.on_step(step(4), net), ckpt::IoError);
    second.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) ==
          std::vector<std::string>{"m-2.ckpt", "m-3.ckpt", "m-graph.meta", "m_1-4.ckpt", "m_1-graph.meta"});
    boost::filesystem::remove(dir / "m_1-4.ckpt");
    second.on_step(step(4), net);
    second.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) ==
          std::vector<std::string>{"m-3.ckpt", "m-graph.meta", "m_1-4.ckpt", "m_1-graph.meta"});  // m keeps one
    second.on_step(step(5), net);
    second.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"m_1-4.ckpt", "m_1-5.ckpt", "m_1-graph.meta"});

    // a file of run m_1 whose header does not read is left alone, and so is m_1's meta
    second_run.reset();
    test::write_bytes(dir / "m_1-0.ckpt", std::vector<char>(10, 'x'));
    StepManager third(dir.path(), "m", ckpt::EverySteps{1}, ckpt::KeepLast{2});
    REQUIRE(third.run_prefix() == "m_2");
    for (std::int64_t s = 6; s <= 7; ++s) third.on_step(step(s), net);
    third.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"m_1-0.ckpt", "m_1-graph.meta", "m_2-6.ckpt",
                                                                 "m_2-7.ckpt", "m_2-graph.meta"});
    CHECK(std::any_of(log.warnings.begin(), log.warnings.end(), [&](const std::string& w) {
        return w.find("retention leaves alone '" + (dir / "m_1-0.ckpt").string() + "'") != std::string::npos;
    }));
}

TEST_CASE("runs of one prefix saving at once, unlocked, keep the newest checkpoint and their meta files") {
    // Without the series' lock (ManagerOptions::lock false, or a file system without flock),
    // two jobs may write one series at once; retention still loses neither's newest state.
    TempDir dir;
    TinyNet net;
    auto step = [](std::int64_t s) { return ckpt::Progress::at_iteration(s); };
    ckpt::ManagerOptions unlocked;
    unlocked.lock = false;
    StepManager a(dir.path(), "c", ckpt::EverySteps{1}, ckpt::KeepLast{1}, {}, unlocked);
    a.on_step(step(1), net);
    StepManager b(dir.path(), "c", ckpt::EverySteps{1}, ckpt::KeepLast{1}, {}, unlocked);
    REQUIRE(b.run_prefix() == "c_1");
    b.on_step(step(2), net);  // run c's only checkpoint goes, and its meta with it
    b.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"c_1-2.ckpt", "c_1-graph.meta"});
    // run c's next file sorts before run c_1's: c_1-2.ckpt stays the newest, and c's meta comes back
    a.on_step(step(3), net);
    a.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) ==
          std::vector<std::string>{"c-3.ckpt", "c-graph.meta", "c_1-2.ckpt", "c_1-graph.meta"});
    CHECK(a.latest()->path.filename() == "c_1-2.ckpt");
}

TEST_CASE("retention never deletes the newest valid checkpoint, even one that sorts after the file just written") {
    TempDir dir;
    TinyNet net;
    StepManager mgr(dir.path(), "m", ckpt::EverySteps{1}, ckpt::KeepLast{1});
    REQUIRE(mgr.run_prefix() == "m");
    // later checkpoints of this run, the newest with a damaged body; the run rolls back to step 60
    for (std::int64_t s : {90, 100})
        test::save_owned(net.state_dict(), dir / ("m-" + std::to_string(s) + ".ckpt"), "m", "m",
                         {ckpt::ArchiveKind::binary, 1, s});
    test::flip_bit(dir / "m-100.ckpt", ckpt::header_size + 8);
    mgr.on_step(ckpt::Progress::at_iteration(60), net);
    mgr.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"m-60.ckpt", "m-90.ckpt", "m-graph.meta"});
    CHECK(mgr.latest()->path.filename() == "m-90.ckpt");
    mgr.on_step(ckpt::Progress::at_iteration(61), net);
    mgr.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"m-61.ckpt", "m-90.ckpt", "m-graph.meta"});
    mgr.on_step(ckpt::Progress::at_iteration(91), net);  // newer than m-90 at last
    mgr.wait();  // what retention deleted is freed
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"m-91.ckpt", "m-graph.meta"});
}

TEST_CASE("the file restore() loaded stays until the manager has saved a newer one") {
    TempDir dir;
    TinyNet net;
    auto at = [](std::int64_t global) {
        ckpt::Progress p;
        p.step = p.global_step = global;
        return p;
    };
    // another writer of the directory (the last words of other ranks, which take no lock)
    ckpt::ManagerOptions unlocked;
    unlocked.lock = false;
    ckpt::CheckpointManager<ckpt::Never, ckpt::KeepAll, ckpt::LastWordsNaming> other(dir.path(), "ttp", {}, {}, {},
                                                                                    unlocked);
    other.save(at(100), net);
    ckpt::CheckpointManager<ckpt::Never, ckpt::KeepLast, ckpt::LastWordsNaming> mgr(dir.path(), "ttp", {},
                                                                                   ckpt::KeepLast{1}, {}, unlocked);
    const auto restored = mgr.restore(net);
    REQUIRE(restored);
    CHECK(restored->file.name.global_step == 100);
    other.save(at(200), net);  // a newer checkpoint, but not this manager's
    mgr.save(at(60), net);     // the job rolls back to a step every rank has
    CHECK(last_words_steps(dir.path()) == std::vector<std::int64_t>{60, 100, 200});
    mgr.save(at(150), net);  // newer than the file restored: that one may go now
    CHECK(last_words_steps(dir.path()) == std::vector<std::int64_t>{150, 200});
}

TEST_CASE("latest() falls back past corrupt and mislabelled files, saying why") {
    TempDir dir;
    TinyNet net;
    SeedManager mgr(dir.path(), "lenet", ckpt::EveryEpochs{1}, ckpt::KeepLast{5});
    for (std::int64_t e = 1; e <= 4; ++e) mgr.on_epoch_end(epoch_end(e), net);
    test::flip_bit(dir / "lenet-4_1875.ckpt", 200);
    boost::filesystem::copy_file(dir / "lenet-1_1875.ckpt", dir / "lenet-9_1875.ckpt");
    test::write_bytes(dir / "lenet-8_1875.ckpt", {});
    test::LogCapture log;
    std::vector<ckpt::SkippedCheckpoint> skipped;
    auto found = ckpt::latest(dir.path(), "lenet", ckpt::MindSporeNaming{}, &skipped);
    REQUIRE(found);
    CHECK(found->filename() == "lenet-3_1875.ckpt");
    REQUIRE(skipped.size() == 3);
    CHECK(skipped[0].reason.find("name says epoch 9 step 1875 but its header says epoch 1 step 1875") !=
          std::string::npos);
    CHECK(skipped[1].reason.find("not a ckpt checkpoint") != std::string::npos);
    CHECK(skipped[2].reason.find("body xxh3") != std::string::npos);
    CHECK(log.warnings.size() == 3);

    TinyNet resumed;
    auto restored = mgr.restore(resumed);
    REQUIRE(restored);
    CHECK(restored->file.path.filename() == "lenet-3_1875.ckpt");
    CHECK(boost::filesystem::exists(dir / "lenet-4_1875.ckpt"));  // evidence is kept
}

namespace {
/// Bytes this process has read through read(2) and friends so far (/proc/self/io's rchar).
std::uint64_t bytes_read_so_far() {
    std::ifstream io("/proc/self/io");
    for (std::string key; io >> key;) {
        std::uint64_t value = 0;
        io >> value;
        if (key == "rchar:") return value;
    }
    return 0;
}
}  // namespace

TEST_CASE("restore reads the file it loads once: verified while it loads, not before as well") {
    TempDir dir;
    std::vector<float> w(1 << 20, 0.5f);  // 4 MiB
    std::int64_t step = 0;
    ckpt::ParamDict state{{"w", ckpt::view_of(w)}, {"step", ckpt::view_of(step)}};
    StepManager mgr(dir.path(), "big", ckpt::EverySteps{1}, ckpt::KeepLast{3});
    for (step = 1; step <= 2; ++step) mgr.save(ckpt::Progress::at_iteration(step), state);
    std::fill(w.begin(), w.end(), 0.0f);
    const auto size = boost::filesystem::file_size(dir / "big-2.ckpt");
    const auto before = bytes_read_so_far();
    const auto restored = mgr.restore(state);
    const auto read = bytes_read_so_far() - before;
    REQUIRE(restored);
    CHECK(restored->file.path.filename() == "big-2.ckpt");
    CHECK(w[123] == 0.5f);
    INFO("read ", read, " bytes for a file of ", size);
    CHECK(read >= size);
    CHECK(read < size + size / 2);  // once, with the headers and contents lists of the others
}

TEST_CASE("a non-strict restore past a file damaged while it loaded names the tensors the older file leaves") {
    TempDir dir;
    std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
    ckpt::ParamDict older{{"a", ckpt::view_of(a)}};
    ckpt::ParamDict newer{{"a", ckpt::view_of(a)}, {"b", ckpt::view_of(b)}};
    {
        StepManager mgr(dir.path(), "m", ckpt::EverySteps{1}, ckpt::KeepLast{3});
        mgr.save(ckpt::Progress::at_iteration(1), older);
        mgr.save(ckpt::Progress::at_iteration(2), newer);
    }
    test::flip_bit(dir / "m-2.ckpt", boost::filesystem::file_size(dir / "m-2.ckpt") - 40);  // in b's payload
    std::fill(a.begin(), a.end(), 0.0f);
    std::fill(b.begin(), b.end(), 0.0f);
    test::LogCapture log;
    StepManager mgr(dir.path(), "m", ckpt::EverySteps{1}, ckpt::KeepLast{3});
    std::vector<ckpt::SkippedCheckpoint> skipped;
    const auto restored = mgr.restore(newer, /*strict=*/false, &skipped);
    REQUIRE(restored);
    CHECK(restored->file.path.filename() == "m-1.ckpt");
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].path.filename() == "m-2.ckpt");
    CHECK(a[0] == 1.0f);
    bool named = false;
    for (const auto& w : log.warnings)
        named = named || (w.find("'b', which") != std::string::npos && w.find("keep what the damaged file gave them") !=
                                                                          std::string::npos);
    CHECK(named);
}

TEST_CASE("no checkpoint: latest and restore say so") {
    TempDir dir;
    CHECK_FALSE(ckpt::latest(dir / "absent", "x"));
    TinyNet net;
    ckpt::CheckpointManager mgr(dir.path(), "x", ckpt::EverySteps{1}, ckpt::KeepAll{});
    CHECK_FALSE(mgr.restore(net));
    test::write_bytes(dir / "file", {});
    CHECK_THROWS_AS(ckpt::latest(dir / "file", "x"), ckpt::IoError);
    CHECK_THROWS_AS(ckpt::CheckpointManager(dir / "file", "x", ckpt::EverySteps{1}, ckpt::KeepAll{}), ckpt::IoError);
    CHECK_THROWS_AS(ckpt::CheckpointManager(dir.path(), "a/b", ckpt::EverySteps{1}, ckpt::KeepAll{}), ckpt::ConfigError);
}

TEST_CASE("restore is strict: a checkpoint of another model is an error, not a half-loaded net") {
    TempDir dir;
    ckpt::ParamDict other;
    other.set("fc.weight", ckpt::Tensor(ckpt::DType::float32, {3, 3}));
    ckpt::save_checkpoint(other, dir / "m-1_1.ckpt", {ckpt::ArchiveKind::binary, 1, 1});
    ckpt::CheckpointManager mgr(dir.path(), "m", ckpt::EverySteps{1}, ckpt::KeepAll{});
    TinyNet net;
    CHECK_THROWS_AS(mgr.restore(net), ckpt::LoadMismatch);
    CHECK(mgr.restore(net, false)->report.mismatches.size() == 1);
}

TEST_CASE("exception saves write breakpoint files with their own run numbering") {
    TempDir dir;
    TinyNet net;
    ckpt::ManagerOptions o;
    o.exception_save = true;
    auto p = epoch_end(3);
    p.step = 17;
    {
        SeedManager mgr(dir.path(), "lenet", ckpt::EveryEpochs{1}, ckpt::KeepLast{5}, {}, o);
        CHECK(mgr.on_exception(p, net)->filename() == "lenet-3_17_breakpoint.ckpt");
    }
    {
        SeedManager again(dir.path(), "lenet", ckpt::EveryEpochs{1}, ckpt::KeepLast{5}, {}, o);
        CHECK(again.on_exception(p, net)->filename() == "lenet_1-3_17_breakpoint.ckpt");
        CHECK(again.run_prefix() == "lenet");  // regular saves still start at the plain prefix
    }
    // no regular checkpoint: the newest exception save is the newest state
    CHECK(ckpt::latest(dir.path(), "lenet")->filename() == "lenet_1-3_17_breakpoint.ckpt");
    SeedManager off(dir.path(), "lenet", ckpt::EveryEpochs{1}, ckpt::KeepLast{5});
    CHECK_FALSE(off.on_exception(p, net));
}

TEST_CASE("stale temporaries are removed when a manager starts: its series' all, others' of dead writers") {
    TempDir dir;
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    ::waitpid(child, nullptr, 0);
    const std::string dead = ".m-1_1.ckpt.tmp-" + std::to_string(child) + "-0";
    // of the series, by a live process: with the series' lock held, nobody else writes it
    const std::string live = ".m-1_2.ckpt.tmp-" + std::to_string(::getpid()) + "-0";
    const std::string live_other = ".mq-1_2.ckpt.tmp-" + std::to_string(::getpid()) + "-0";
    const std::string dead_other = ".mq-1_3.ckpt.tmp-" + std::to_string(child) + "-0";
    const std::string foreign = ".q-1_1.ckpt.tmp-" + std::to_string(child) + "-0";
    for (const auto& n : {dead, live, live_other, dead_other, foreign}) test::write_bytes(dir / n, {'x'});
    ckpt::CheckpointManager mgr(dir.path(), "m", ckpt::EverySteps{1}, ckpt::KeepAll{});
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{live_other, foreign});
    CHECK(mgr.run_prefix() == "m");  // temporaries never count as checkpoints
}

TEST_CASE("make_manager maps CheckpointConfig onto the policies") {
    TempDir dir;
    TinyNet net;
    ckpt::CheckpointConfig cfg;
    cfg.save_checkpoint_steps = 3;
    cfg.keep_checkpoint_max = 2;
    cfg.append_info = {"step_num"};
    auto mgr = ckpt::make_manager(dir.path(), "cfg", cfg);
    ckpt::Progress p;
    for (std::int64_t s = 1; s <= 10; ++s) {
        p.step = p.global_step = s;
        mgr.on_step(p, net);
    }
    mgr.on_train_end(p, net);
    CHECK(test::names_in(dir.path()) ==
          std::vector<std::string>{"cfg-1_10.ckpt", "cfg-1_9.ckpt", "cfg-graph.meta", "cfg.finished"});
    CHECK(ckpt::load_checkpoint(dir / "cfg-1_10.ckpt").get<int>("step_num") == 10);
}

TEST_CASE_TEMPLATE("a manager with any archive policy restores what it saved", A, ckpt::BinaryArchive,
                   ckpt::TextArchive, ckpt::XmlArchive) {
    TempDir dir;
    TinyNet net;
    std::iota(net.w.begin(), net.w.end(), 1.0f);
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming, A> mgr(
        dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepLast{1});
    mgr.on_step(ckpt::Progress::at_iteration(5), net);
    CHECK(ckpt::read_header(dir / "run-5.ckpt").archive == A::kind);
    TinyNet back;
    REQUIRE(mgr.restore(back));
    CHECK(back.w == net.w);
}

TEST_CASE("a last-words manager writes the seed's per-step, per-rank layout") {
    TempDir dir;
    TinyNet net;
    ckpt::CheckpointManager<ckpt::Never, ckpt::KeepAll, ckpt::LastWordsNaming> mgr(dir / "ttp_checkpoints", "ttp");
    ckpt::Progress p;
    p.epoch = 2;
    p.step = 17;
    p.global_step = 1892;
    p.rank = 3;
    const auto file = mgr.save(p, net);
    CHECK(file == dir / "ttp_checkpoints/tft_saved_checkpoints-step_1892/rank_3/ttp_rank_3-2_17.ckpt");
    auto found = mgr.latest();
    REQUIRE(found);
    CHECK(found->name.rank == 3);
    CHECK(found->path == file);
}
}

TEST_SUITE("async save") {

using AsyncManager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;

ckpt::ManagerOptions async_options() {
    ckpt::ManagerOptions o;
    o.async_save = true;
    return o;
}

TEST_CASE("an async save writes what the state was when it was asked for") {
    test::TempDir dir;
    std::vector<float> w(8u << 20, 1.0f);  // 32 MiB: still being written when the loop goes on
    ckpt::ParamDict state;
    state.set("w", ckpt::Tensor::view(std::span<float>(w), {static_cast<std::int64_t>(w.size())}));
    AsyncManager mgr(dir.path(), "a", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, async_options());
    for (std::int64_t s = 1; s <= 3; ++s) {
        std::fill(w.begin(), w.end(), static_cast<float>(s));
        CHECK(mgr.on_step(ckpt::Progress::at_iteration(s), state));
        std::fill(w.begin(), w.end(), -1.0f);  // the training step that follows the save
    }
    mgr.on_train_end(ckpt::Progress::at_iteration(3), state);  // waits for the save in flight
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"a-2.ckpt", "a-3.ckpt", "a-graph.meta", "a.finished"});
    for (std::int64_t s : {2, 3}) {
        const auto loaded = ckpt::load_checkpoint(dir / ("a-" + std::to_string(s) + ".ckpt"));
        const auto v = loaded.tensor("w").values<float>();
        CHECK(std::all_of(v.begin(), v.end(), [&](float x) { return x == static_cast<float>(s); }));
    }
}

TEST_CASE("a background save's error reaches the caller at its next call") {
    test::TempDir dir;
    TinyNet net;
    AsyncManager mgr(dir / "ckpts", "a", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, async_options());
    mgr.on_step(ckpt::Progress::at_iteration(1), net);
    mgr.wait();
    CHECK(ckpt::latest(dir / "ckpts", "a", ckpt::StepNaming{}));
    boost::filesystem::remove_all(dir / "ckpts");  // the disk goes away under the running job
    const auto pending = mgr.on_step(ckpt::Progress::at_iteration(2), net);  // the file being written
    REQUIRE(pending);
    try {
        mgr.wait();
        FAIL("the background save must fail");
    } catch (const ckpt::IoError& e) {
        CHECK(std::string(e.what()).find("does not exist") != std::string::npos);
        CHECK(std::string(e.what()).find(pending->string()) != std::string::npos);  // names the file on_step returned
    }
    mgr.wait();  // reported once
}

/// A gate the writer thread stops at (in retention, after writing) until the test opens it:
/// a save that stays in flight for as long as a test needs, whatever the machine's speed.
struct WriterGate {
    std::mutex m;
    std::condition_variable cv;
    bool open = false;
    void let_through() {
        {
            std::lock_guard lock(m);
            open = true;
        }
        cv.notify_all();
    }
};

struct GatedRetention {
    WriterGate* gate;
    std::vector<std::size_t> to_delete(std::span<const ckpt::StoredCheckpoint>) const {
        std::unique_lock lock(gate->m);
        if (!gate->cv.wait_for(lock, std::chrono::seconds(30), [&] { return gate->open; }))
            throw std::runtime_error("the test never opened the writer's gate");
        return {};
    }
};

using GatedManager = ckpt::CheckpointManager<ckpt::EverySteps, GatedRetention, ckpt::StepNaming>;

TEST_CASE("async saves while one is in flight: wait writes every one, skip drops and counts them") {
    test::TempDir dir;
    test::LogCapture log;
    std::vector<float> w(1024, 0.0f);
    ckpt::ParamDict state;
    state.set("w", ckpt::Tensor::view(std::span<float>(w), {static_cast<std::int64_t>(w.size())}));
    WriterGate gate;
    auto options = [](ckpt::WhenBusy when_busy) {
        auto o = async_options();
        o.when_busy = when_busy;
        return o;
    };
    SUBCASE("wait") {
        GatedManager mgr(dir.path(), "w", ckpt::EverySteps{1}, GatedRetention{&gate}, {}, options(ckpt::WhenBusy::wait));
        // the writer holds step 1 until the gate opens, long after step 2 asks for the buffer
        std::thread opener([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            gate.let_through();
        });
        for (std::int64_t s = 1; s <= 4; ++s) {
            std::fill(w.begin(), w.end(), static_cast<float>(s));
            mgr.on_step(ckpt::Progress::at_iteration(s), state);
        }
        opener.join();
        mgr.on_train_end(ckpt::Progress::at_iteration(4), state);
        const auto stats = mgr.async_stats();
        CHECK(stats.saves == 4);
        CHECK(stats.skipped == 0);
        CHECK(stats.waited >= 1);
        CHECK(stats.max_blocked_seconds >= 0.1);  // step 2 waited for the gate
        CHECK(stats.blocked_seconds >= stats.max_blocked_seconds);
        CHECK(stats.written == 4);  // on_train_end waited for every one
        CHECK(stats.write_seconds >= stats.max_write_seconds);
        CHECK(stats.max_write_seconds >= 0.1);
        for (int s = 1; s <= 4; ++s) CHECK(boost::filesystem::exists(dir / ("w-" + std::to_string(s) + ".ckpt")));
    }
    SUBCASE("skip") {
        GatedManager mgr(dir.path(), "s", ckpt::EverySteps{1}, GatedRetention{&gate}, {}, options(ckpt::WhenBusy::skip));
        for (std::int64_t s = 1; s <= 4; ++s) {
            std::fill(w.begin(), w.end(), static_cast<float>(s));
            mgr.on_step(ckpt::Progress::at_iteration(s), state);  // 2-4 come while 1 is held
        }
        gate.let_through();
        mgr.on_train_end(ckpt::Progress::at_iteration(4), state);
        const auto stats = mgr.async_stats();
        CHECK(stats.skipped == 3);
        CHECK(stats.saves == 2);  // step 1, and step 4 made up for at the end of training
        CHECK(stats.written == 2);
        CHECK(std::count_if(log.infos.begin(), log.infos.end(), [](const std::string& m) {
                  return m.find("skipped the checkpoint of global step") != std::string::npos;
              }) == 3);
        CHECK(test::names_in(dir.path()) ==
              std::vector<std::string>{"s-1.ckpt", "s-4.ckpt", "s-graph.meta", "s.finished"});
        // the final state is never lost
        const auto loaded = ckpt::load_checkpoint(dir / "s-4.ckpt");
        const auto v = loaded.tensor("w").values<float>();
        CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 4.0f; }));
    }
}

TEST_CASE("async snapshots reuse their buffer while the state keeps its layout") {
    ckpt::ParamDict state = test::sample_state(1.0f);
    ckpt::ParamDict buffer;
    ckpt::detail::snapshot_into(buffer, state, ckpt::ObjectEncoding::boost_binary);
    CHECK(buffer == state);
    const std::byte* first = buffer.tensor("conv1.weight").data();
    CHECK(first != state.tensor("conv1.weight").data());  // a copy, not a view of the state
    ckpt::ParamDict changed = test::sample_state(2.0f);
    ckpt::detail::snapshot_into(buffer, changed, ckpt::ObjectEncoding::boost_binary);
    CHECK(buffer == changed);
    CHECK(buffer.tensor("conv1.weight").data() == first);  // same memory, new contents
    changed.set("extra", std::int64_t{3});
    ckpt::detail::snapshot_into(buffer, changed, ckpt::ObjectEncoding::boost_binary);  // another layout: rebuilt
    CHECK(buffer == changed);
}

TEST_CASE("several async buffers keep saves in order and bound what is in flight") {
    test::TempDir dir;
    std::vector<float> w(4u << 20, 0.0f);
    ckpt::ParamDict state;
    state.set("w", ckpt::Tensor::view(std::span<float>(w), {static_cast<std::int64_t>(w.size())}));
    auto o = async_options();
    o.async_buffers = 3;
    AsyncManager mgr(dir.path(), "b", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, o);
    for (std::int64_t s = 1; s <= 8; ++s) {
        std::fill(w.begin(), w.end(), static_cast<float>(s));
        mgr.on_step(ckpt::Progress::at_iteration(s), state);
    }
    mgr.wait();
    CHECK(mgr.async_stats().saves == 8);
    // written oldest first, so retention kept the two newest
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"b-7.ckpt", "b-8.ckpt", "b-graph.meta"});
    auto o0 = async_options();
    o0.async_buffers = 0;
    CHECK_THROWS_WITH_AS(AsyncManager(dir.path(), "z", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, o0),
                         doctest::Contains("async_buffers must be at least 1"), ckpt::ConfigError);
}

/// A retention that lets through as many saves as the test allows, one at a time: saves in
/// flight whose ends the test controls.
struct SaveTurnstile {
    std::mutex m;
    std::condition_variable cv;
    int allowed = 0;
    void allow_one() {
        {
            std::lock_guard lock(m);
            ++allowed;
        }
        cv.notify_all();
    }
};

struct TurnstileRetention {
    SaveTurnstile* turnstile;
    std::vector<std::size_t> to_delete(std::span<const ckpt::StoredCheckpoint>) const {
        std::unique_lock lock(turnstile->m);
        if (!turnstile->cv.wait_for(lock, std::chrono::seconds(30), [&] { return turnstile->allowed > 0; }))
            throw std::runtime_error("the test never let the save through");
        --turnstile->allowed;
        return {};
    }
};

TEST_CASE("durable() and wait_for() ask about one async save, not about those handed over after it") {
    test::TempDir dir;
    std::vector<float> w(1024, 1.0f);
    ckpt::ParamDict state;
    state.set("w", ckpt::view_of(w));
    SaveTurnstile turnstile;
    auto o = async_options();
    o.async_buffers = 2;
    ckpt::CheckpointManager<ckpt::EverySteps, TurnstileRetention, ckpt::StepNaming> mgr(
        dir.path(), "t", ckpt::EverySteps{1}, TurnstileRetention{&turnstile}, {}, o);
    const auto first = mgr.on_step(ckpt::Progress::at_iteration(1), state);
    const auto second = mgr.on_step(ckpt::Progress::at_iteration(2), state);
    REQUIRE(first);
    REQUIRE(second);
    CHECK_FALSE(mgr.durable(*first));  // both held in their retention
    CHECK_FALSE(mgr.durable(*second));
    turnstile.allow_one();
    mgr.wait_for(*first);  // returns while the second is still held
    CHECK(mgr.durable(*first));
    CHECK_NOTHROW(ckpt::verify_checkpoint(*first));
    CHECK_FALSE(mgr.durable(*second));
    turnstile.allow_one();
    mgr.wait_for(*second);
    CHECK(mgr.durable(*second));

    // with more saves in flight than the manager remembers numbers for, it forgets finished
    // ones, never the first still in flight
    SaveTurnstile many;
    o.async_buffers = 20;
    ckpt::CheckpointManager<ckpt::EverySteps, TurnstileRetention, ckpt::StepNaming> deep(
        dir / "deep", "d", ckpt::EverySteps{1}, TurnstileRetention{&many}, {}, o);
    std::vector<boost::filesystem::path> in_flight;
    for (int i = 1; i <= 19; ++i) in_flight.push_back(*deep.on_step(ckpt::Progress::at_iteration(i), state));
    CHECK_FALSE(deep.durable(in_flight.front()));
    for (std::size_t i = 0; i < in_flight.size(); ++i) many.allow_one();
    deep.wait_for(in_flight.front());
    CHECK(deep.durable(in_flight.front()));
    deep.wait();

    // a synchronous save is durable when on_step returns; a file the manager never saved is
    // not waited for
    StepManager sync(dir / "sync", "s", ckpt::EverySteps{1}, ckpt::KeepLast{2});
    const auto saved = sync.on_step(ckpt::Progress::at_iteration(1), state);
    REQUIRE(saved);
    CHECK(sync.durable(*saved));
    CHECK_NOTHROW(sync.wait_for(*saved));

    // a save that failed is done, and wait_for() says why, naming the file
    SaveTurnstile open;
    for (int i = 0; i < 4; ++i) open.allow_one();
    ckpt::CheckpointManager<ckpt::EverySteps, TurnstileRetention, ckpt::StepNaming> failing(
        dir / "failing", "f", ckpt::EverySteps{1}, TurnstileRetention{&open}, {}, o);
    boost::filesystem::create_directories(dir / "failing" / "f-1.ckpt" / "in_the_way");
    const auto lost = failing.on_step(ckpt::Progress::at_iteration(1), state);
    REQUIRE(lost);
    CHECK_THROWS_WITH_AS(failing.wait_for(*lost), doctest::Contains(lost->string().c_str()), ckpt::IoError);
    CHECK(failing.durable(*lost));
    CHECK_THROWS_AS(failing.wait(), ckpt::IoError);  // and the training thread hears of it too
}

TEST_CASE("CheckpointConfig's async_save reaches the manager") {
    test::TempDir dir;
    TinyNet net;
    ckpt::CheckpointConfig cfg;
    cfg.async_save = true;
    auto mgr = ckpt::make_manager(dir.path(), "cfg", cfg);
    CHECK(mgr.options().async_save);
    ckpt::Progress p;
    p.step = p.global_step = 1;
    mgr.on_step(p, net);
    mgr.on_train_end(p, net);
    CHECK(boost::filesystem::exists(dir / "cfg-1_1.ckpt"));
}
}
