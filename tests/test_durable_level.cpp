// Two-level checkpoints (ManagerOptions::durable): written to a fast local directory, copied
// in the background to a durable one, each level with its own retention; restored from the
// newest that verifies on either, the local copy first.
#include <doctest/doctest.h>

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/codecs/zstd.hpp>

#include "support.hpp"

namespace {

using test::TempDir;
namespace fs = boost::filesystem;
using Manager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;
using KeepingAll = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming>;

struct Levels {
    TempDir root;
    fs::path local = root / "local", shared = root / "shared";
};

ckpt::ManagerOptions two_levels(const fs::path& shared, ckpt::AnyRetention retention = ckpt::KeepAll{},
                                std::int64_t every = 1, double rate = 0) {
    ckpt::ManagerOptions o;
    o.durable = ckpt::DurableLevel{shared, std::move(retention), every, rate};
    return o;
}

ckpt::Progress at(std::int64_t step) {
    ckpt::Progress p;
    p.epoch = 1;
    p.step = step;
    p.global_step = step;
    return p;
}

/// A state whose every value says which step saved it.
struct Sim {
    std::vector<double> field = std::vector<double>(64, 0.0);
    std::int64_t step = 0;
    void advance_to(std::int64_t s) {
        step = s;
        for (std::size_t i = 0; i < field.size(); ++i) field[i] = static_cast<double>(s) * 1000 + static_cast<double>(i);
    }
    ckpt::ParamDict state_dict() {
        ckpt::ParamDict d;
        d.set("field", ckpt::view_of(field));
        d.set("step", ckpt::view_of(step));
        return d;
    }
};

std::vector<std::string> checkpoints_in(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& f : ckpt::list_checkpoints(dir, "sim", ckpt::StepNaming{})) out.push_back(f.path.filename().string());
    return out;
}

bool mentions(const std::vector<std::string>& lines, const std::string& part) {
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(part) != std::string::npos; });
}

}  // namespace

TEST_CASE("durable level: every save is copied and verifies there, and each level keeps what its retention says") {
    Levels L;
    Sim sim;
    {
        Manager mgr(L.local, "sim", ckpt::EverySteps{10}, ckpt::KeepLast{2}, {}, two_levels(L.shared, ckpt::KeepLast{4}));
        for (std::int64_t s = 1; s <= 60; ++s) {
            sim.advance_to(s);
            mgr.on_step(at(s), sim);
        }
        const auto stats = mgr.wait_flushed();
        CHECK(stats.flushed == 6);
        CHECK(stats.failed == 0);
        CHECK(stats.pending == 0);
        CHECK(stats.bytes > 0);
        // the local level's retention runs at the next save: until then it keeps the files being copied
        sim.advance_to(70);
        mgr.on_step(at(70), sim);
        mgr.wait_flushed();
    }
    CHECK(checkpoints_in(L.local) == std::vector<std::string>{"sim-60.ckpt", "sim-70.ckpt"});
    CHECK(checkpoints_in(L.shared) == std::vector<std::string>{"sim-40.ckpt", "sim-50.ckpt", "sim-60.ckpt", "sim-70.ckpt"});
    for (const auto& name : checkpoints_in(L.shared)) {
        CHECK_NOTHROW(ckpt::verify_checkpoint(L.shared / name));
        if (fs::exists(L.local / name)) CHECK(test::read_bytes(L.local / name) == test::read_bytes(L.shared / name));
    }
    CHECK(fs::exists(L.shared / "sim-graph.meta") == fs::exists(L.local / "sim-graph.meta"));
}

TEST_CASE("durable level: restore takes the local copy, else the durable one, and says so") {
    Levels L;
    Sim sim;
    {
        Manager mgr(L.local, "sim", ckpt::EverySteps{10}, ckpt::KeepLast{3}, {}, two_levels(L.shared));
        for (std::int64_t s = 1; s <= 30; ++s) {
            sim.advance_to(s);
            mgr.on_step(at(s), sim);
        }
        mgr.wait_flushed();
    }
    SUBCASE("both levels whole: the local copy") {
        test::LogCapture log;
        Manager mgr(L.local, "sim", ckpt::EverySteps{10}, ckpt::KeepLast{3}, {}, two_levels(L.shared));
        Sim back;
        const auto r = mgr.restore(back);
        REQUIRE(r);
        CHECK(r->file.path == L.local / "sim-30.ckpt");
        CHECK(back.step == 30);
        CHECK_FALSE(mentions(log.infos, "durable level"));
    }
    SUBCASE("the local level lost: the durable copy, said") {
        fs::remove_all(L.local);
        test::LogCapture log;
        Manager mgr(L.local, "sim", ckpt::EverySteps{10}, ckpt::KeepLast{3}, {}, two_levels(L.shared));
        Sim back;
        const auto r = mgr.restore(back);
        REQUIRE(r);
        CHECK(r->file.path == L.shared / "sim-30.ckpt");
        CHECK(back.step == 30);
        CHECK(back.field == sim.field);
        CHECK(mentions(log.infos, "on the durable level: the local level '" + L.local.string() + "' has no copy of it"));
        CHECK(mgr.latest()->path == L.shared / "sim-30.ckpt");
    }
    SUBCASE("the newest local copy damaged: the durable copy of the same step, not an older local one") {
        test::flip_bit(L.local / "sim-30.ckpt", 200);
        test::LogCapture log;
        Manager mgr(L.local, "sim", ckpt::EverySteps{10}, ckpt::KeepLast{3}, {}, two_levels(L.shared));
        Sim back;
        const auto r = mgr.restore(back);
        REQUIRE(r);
        CHECK(r->file.path == L.shared / "sim-30.ckpt");
        CHECK(back.step == 30);
        CHECK(mentions(log.warnings, "sim-30.ckpt"));
        CHECK(mentions(log.infos, "has a copy that does not verify"));
    }
    SUBCASE("a newer checkpoint only on the local level wins over the durable level's") {
        fs::remove(L.shared / "sim-30.ckpt");
        Manager mgr(L.local, "sim", ckpt::EverySteps{10}, ckpt::KeepLast{3}, {}, two_levels(L.shared));
        Sim back;
        const auto r = mgr.restore(back);
        REQUIRE(r);
        CHECK(r->file.path == L.local / "sim-30.ckpt");
    }
    SUBCASE("the newest durable copy damaged and the local level gone: the next older durable one") {
        fs::remove_all(L.local);
        test::flip_bit(L.shared / "sim-30.ckpt", 300);
        test::LogCapture log;
        Manager mgr(L.local, "sim", ckpt::EverySteps{10}, ckpt::KeepLast{3}, {}, two_levels(L.shared));
        Sim back;
        std::vector<ckpt::SkippedCheckpoint> skipped;
        const auto r = mgr.restore(back, true, &skipped);
        REQUIRE(r);
        CHECK(r->file.path == L.shared / "sim-20.ckpt");
        CHECK(back.step == 20);
        REQUIRE(skipped.size() == 1);
        CHECK(skipped[0].path == L.shared / "sim-30.ckpt");
    }
}

TEST_CASE("durable level: a damaged local file is never copied, and the newest one's failure is an error") {
    Levels L;
    Sim sim;
    test::LogCapture log;
    sim.field.assign(64 << 10, 1.0);  // 512 KiB, copied at 1 MiB/s: half a second
    KeepingAll mgr(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepAll{}, {}, two_levels(L.shared, ckpt::KeepAll{}, 1, 1 << 20));
    sim.advance_to(1);
    mgr.save(at(1), sim);
    sim.field.resize(64);
    sim.advance_to(2);
    const auto file = mgr.save(at(2), sim);
    test::flip_bit(file, ckpt::header_size + 100);  // while its copy waits behind the first
    CHECK(mgr.flush_stats().pending == 2);
    CHECK_THROWS_WITH_AS(mgr.wait_flushed(), doctest::Contains("is not on the durable level"), ckpt::IoError);
    const auto stats = mgr.flush_stats();
    CHECK(stats.flushed == 1);
    CHECK(stats.failed == 1);
    CHECK(mentions(log.warnings, "does not match its checksum"));
    CHECK(checkpoints_in(L.shared) == std::vector<std::string>{"sim-1.ckpt"});
    for (const auto& n : test::names_in(L.shared)) CHECK(n.find(".tmp-") == std::string::npos);  // no temporary left
}

TEST_CASE("durable level: copies wait for no one, and the local level keeps every file until its copy is done") {
    Levels L;
    Sim sim;
    sim.field.assign(32 << 10, 1.0);  // 256 KiB a checkpoint
    // paced to 1 MiB/s: each copy takes a quarter of a second, the saves come at once
    Manager mgr(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepLast{1}, {},
                two_levels(L.shared, ckpt::KeepAll{}, 1, 1 << 20));
    for (std::int64_t s = 1; s <= 4; ++s) {
        sim.advance_to(s);
        mgr.save(at(s), sim);
    }
    const auto before = mgr.flush_stats();
    CHECK(before.pending >= 2);  // the saves returned while their copies were still queued
    CHECK(checkpoints_in(L.local).size() >= static_cast<std::size_t>(before.pending));
    const auto after = mgr.wait_flushed();
    CHECK(after.flushed == 4);
    CHECK(checkpoints_in(L.shared) == std::vector<std::string>{"sim-1.ckpt", "sim-2.ckpt", "sim-3.ckpt", "sim-4.ckpt"});
    CHECK(after.seconds >= 0.9);  // four paced copies of 256 KiB at 1 MiB/s
}

TEST_CASE("durable level: every N-th checkpoint is copied, and the end of training's always") {
    Levels L;
    Sim sim;
    KeepingAll mgr(L.local, "sim", ckpt::EverySteps{10}, ckpt::KeepAll{}, {}, two_levels(L.shared, ckpt::KeepAll{}, 3));
    for (std::int64_t s = 1; s <= 75; ++s) {
        sim.advance_to(s);
        mgr.on_step(at(s), sim);
    }
    mgr.on_train_end(at(75), sim);
    CHECK(checkpoints_in(L.shared) == std::vector<std::string>{"sim-30.ckpt", "sim-60.ckpt", "sim-75.ckpt"});

    SUBCASE("a last save that was not due for a copy is copied at the end") {
        Levels M;
        KeepingAll m2(M.local, "sim", ckpt::EverySteps{10}, ckpt::KeepAll{}, {}, two_levels(M.shared, ckpt::KeepAll{}, 3));
        for (std::int64_t s = 1; s <= 40; ++s) {
            sim.advance_to(s);
            m2.on_step(at(s), sim);
        }
        m2.on_train_end(at(40), sim);  // step 40 is saved already, but was not the 3rd
        CHECK(checkpoints_in(M.shared) == std::vector<std::string>{"sim-30.ckpt", "sim-40.ckpt"});
    }
}

TEST_CASE("durable level: codecs are copied as stored and restored with the key from either level") {
    Levels L;
    const ckpt::Key key = ckpt::Key::random();
    using Sealed = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming, ckpt::BinaryArchive,
                                           ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>>;
    Sim sim;
    {
        Sealed mgr(L.local, "sim", ckpt::EverySteps{5}, ckpt::KeepLast{2}, {}, two_levels(L.shared), ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>{ckpt::Zstd{1}, ckpt::AesGcm{key}});
        for (std::int64_t s = 1; s <= 10; ++s) {
            sim.advance_to(s);
            mgr.on_step(at(s), sim);
        }
        mgr.wait_flushed();
    }
    CHECK(ckpt::read_header(L.shared / "sim-10.ckpt").encrypted());
    CHECK(test::read_bytes(L.shared / "sim-10.ckpt") == test::read_bytes(L.local / "sim-10.ckpt"));
    fs::remove_all(L.local);
    Sealed mgr(L.local, "sim", ckpt::EverySteps{5}, ckpt::KeepLast{2}, {}, two_levels(L.shared), ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>{ckpt::Zstd{1}, ckpt::AesGcm{key}});
    Sim back;
    REQUIRE(mgr.restore(back));
    CHECK(back.step == 10);
    CHECK(back.field == sim.field);
}

TEST_CASE("durable level: runs are numbered after both levels, so a new run never reuses a durable name") {
    Levels L;
    using Seed = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::MindSporeNaming>;
    Sim sim;
    for (int run = 0; run < 2; ++run) {
        Seed mgr(L.local, "sim", ckpt::EverySteps{5}, ckpt::KeepLast{5}, {}, two_levels(L.shared));
        sim.advance_to(5);
        mgr.on_step(at(5), sim);
        mgr.wait_flushed();
        if (run == 0) fs::remove_all(L.local);  // the node is replaced between the runs
        if (run == 1) CHECK(mgr.run_prefix() == "sim_1");
    }
    CHECK(fs::exists(L.shared / "sim-1_5.ckpt"));
    CHECK(fs::exists(L.shared / "sim_1-1_5.ckpt"));
}

TEST_CASE("durable level: an exception save is copied before on_exception returns") {
    Levels L;
    Sim sim;
    ckpt::ManagerOptions o = two_levels(L.shared);
    o.exception_save = true;
    {
        Manager mgr(L.local, "sim", ckpt::EverySteps{100}, ckpt::KeepLast{2}, {}, o);
        sim.advance_to(7);
        const auto file = mgr.on_exception(at(7), sim);
        REQUIRE(file);
        CHECK(fs::exists(L.shared / file->filename()));
    }
    fs::remove_all(L.local);
    Manager again(L.local, "sim", ckpt::EverySteps{100}, ckpt::KeepLast{2}, {}, o);
    Sim back;
    REQUIRE(again.restore(back));
    CHECK(back.step == 7);
}

TEST_CASE("durable level: a process killed mid-copy leaves nothing latest() takes, and its temporary is removed") {
    Levels L;
    Sim sim;
    sim.field.assign(1 << 20, 2.0);  // 8 MiB, copied at 4 MiB/s: two seconds
    {
        KeepingAll mgr(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepAll{}, {}, two_levels(L.shared));
        sim.advance_to(1);
        mgr.save(at(1), sim);
        mgr.wait_flushed();
    }
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        KeepingAll mgr(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepAll{}, {},
                    two_levels(L.shared, ckpt::KeepAll{}, 1, 4 << 20));
        sim.advance_to(2);
        mgr.save(at(2), sim);
        (void)!::write(ready[1], "x", 1);
        ::pause();
        ::_exit(0);
    }
    char c;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    // wait until the copy is under way: its temporary exists on the durable level
    bool copying = false;
    for (int i = 0; i < 500 && !copying; ++i) {
        for (const auto& n : test::names_in(L.shared)) copying = copying || n.find(".tmp-") != std::string::npos;
        if (!copying) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    ::close(ready[0]);
    ::close(ready[1]);
    REQUIRE(copying);
    CHECK(ckpt::latest_checkpoint(L.shared, "sim", ckpt::StepNaming{})->path == L.shared / "sim-1.ckpt");
    fs::remove_all(L.local);  // and the local level is lost
    KeepingAll mgr(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepAll{}, {}, two_levels(L.shared));
    for (const auto& n : test::names_in(L.shared)) CHECK(n.find(".tmp-") == std::string::npos);
    Sim back;
    back.field.resize(sim.field.size());
    REQUIRE(mgr.restore(back));
    CHECK(back.step == 1);
}

TEST_CASE("durable level: settings that cannot work are refused, naming what is wrong") {
    Levels L;
    CHECK_THROWS_WITH_AS(Manager(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, two_levels(L.local)),
                         doctest::Contains("is the checkpoint directory"), ckpt::ConfigError);
    CHECK_THROWS_WITH_AS(Manager(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, two_levels(L.shared, ckpt::KeepAll{}, 0)),
                         doctest::Contains("DurableLevel::every must be at least 1"), ckpt::ConfigError);
    CHECK_THROWS_WITH_AS(Manager(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, two_levels(L.shared, ckpt::KeepAll{}, 1, -1)),
                         doctest::Contains("max_bytes_per_second"), ckpt::ConfigError);
    test::write_bytes(L.root / "file", {'x'});
    CHECK_THROWS_WITH_AS(Manager(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, two_levels(L.root / "file")),
                         doctest::Contains("cannot create checkpoint directory"), ckpt::IoError);
}

TEST_CASE("durable level: a copy to another kind of file system goes through a buffer, checked the same way") {
    if (!fs::is_directory("/dev/shm")) return;  // no tmpfs here: nothing to cross
    Levels L;
    TempDir other("/dev/shm");
    Sim sim;
    sim.field.assign(1 << 19, 3.0);  // 4 MiB: more than one block
    KeepingAll mgr(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepAll{}, {}, two_levels(other.path()));
    sim.advance_to(1);
    const auto file = mgr.save(at(1), sim);
    CHECK(mgr.wait_flushed().flushed == 1);
    CHECK(test::read_bytes(other / "sim-1.ckpt") == test::read_bytes(file));
    // and a damaged file is refused on that path too
    sim.advance_to(2);
    ckpt::detail::Pacer unpaced(0);
    const auto second = mgr.save(at(2), sim);
    mgr.wait_flushed();
    test::flip_bit(second, ckpt::header_size + 4096);
    CHECK_THROWS_AS(ckpt::detail::copy_file_checked(second, other / "again.ckpt", true, unpaced), ckpt::ChecksumError);
    CHECK_FALSE(fs::exists(other / "again.ckpt"));
}

TEST_CASE("durable level: a copy that waits for other files goes once they are there, or is given up") {
    Levels L;
    Sim sim;
    ckpt::ManagerOptions o = two_levels(L.shared);
    o.durable->index_timeout = std::chrono::milliseconds(300);
    test::LogCapture log;
    KeepingAll mgr(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepAll{}, {}, o);
    sim.advance_to(1);
    const auto file = mgr.save(at(1), sim);
    mgr.wait_flushed();
    // waits for a file that another copier brings (here: this test, a moment later)
    mgr.queue_durable_copy(file, L.shared / "follows.ckpt", {L.shared / "arrives.txt"});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK_FALSE(fs::exists(L.shared / "follows.ckpt"));
    test::write_bytes(L.shared / "arrives.txt", {'x'});
    mgr.queue_durable_copy(file, L.shared / "never.ckpt", {L.shared / "never.txt"});
    const auto stats = mgr.wait_flushed();
    CHECK(fs::exists(L.shared / "follows.ckpt"));
    CHECK_FALSE(fs::exists(L.shared / "never.ckpt"));
    CHECK(stats.given_up == 1);
    CHECK(mentions(log.warnings, "did not all arrive there in time"));
}

namespace {

/// Runs `body` in a child process with a tmpfs of `size` mounted at `at`, in a mount namespace
/// of its own; returns the child's exit status and what it wrote to `report`, or nothing when
/// mounting is not allowed here.
template <class Body>
std::optional<std::pair<int, std::string>> with_small_tmpfs(const fs::path& at, const char* size, Body body) {
    fs::create_directories(at);
    int out[2];
    REQUIRE(::pipe(out) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(out[0]);
        std::string report;
        int status = 77;
        const std::string options = std::string("size=") + size;
        if (::unshare(CLONE_NEWNS) == 0 && ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
            ::mount("ckpt-test", at.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) == 0) {
            try {
                status = body(report) ? 0 : 1;
            } catch (const std::exception& e) {
                report += std::string("threw: ") + e.what() + "\n";
                status = 1;
            }
        } else {
            report = std::string("cannot mount a tmpfs here: ") + std::strerror(errno);
        }
        if (::write(out[1], report.data(), report.size()) < 0) status = 2;
        ::_exit(status);
    }
    ::close(out[1]);
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
    ::close(out[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
        MESSAGE("skipped: " << text);
        return std::nullopt;
    }
    return std::pair{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), text};
}

}  // namespace

TEST_CASE("durable level: a full one makes room by its retention first, a copy that cannot fit is said once and counted") {
    Levels L;
    // each checkpoint ~400 KiB; the durable level holds 1 MiB: two fit, a third does not
    auto result = with_small_tmpfs(L.shared, "1m", [&](std::string& report) {
        bool ok = true;
        auto expect = [&](bool cond, const std::string& what) {
            if (!cond) report += what + "\n";
            ok = ok && cond;
        };
        test::LogCapture log;
        Sim sim;
        sim.field.assign(51200, 0.0);
        {
            // KeepLast{2} on the durable level: each copy makes room by deleting the oldest first
            Manager mgr(L.local, "sim", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, two_levels(L.shared, ckpt::KeepLast{2}));
            for (std::int64_t s = 1; s <= 6; ++s) {
                sim.advance_to(s);
                mgr.on_step(at(s), sim);
                mgr.wait_flushed();
            }
            const auto stats = mgr.flush_stats();
            expect(stats.flushed == 6 && stats.failed == 0,
                   "room was not made: " + std::to_string(stats.flushed) + " copied, " + std::to_string(stats.failed) +
                       " failed (" + stats.last_error + ")");
            expect(checkpoints_in(L.shared) == std::vector<std::string>{"sim-5.ckpt", "sim-6.ckpt"},
                   "the durable level does not hold the newest two");
        }
        // KeepAll cannot make room: the copies that do not fit fail, said once, counted
        Sim big;
        big.field.assign(51200, 0.0);
        std::optional<ckpt::IoError> at_end;
        {
            KeepingAll mgr(L.local, "full", ckpt::EverySteps{1}, ckpt::KeepAll{}, {}, two_levels(L.shared));
            for (std::int64_t s = 1; s <= 4; ++s) {
                big.advance_to(s);
                mgr.on_step(at(s), big);
            }
            try {
                mgr.wait_flushed();
            } catch (const ckpt::IoError& e) {
                at_end = e;  // the newest checkpoint is not on the durable level: the program learns it
            }
            const auto stats = mgr.flush_stats();
            expect(stats.failed >= 2 && stats.no_space == stats.failed,
                   "copies that did not fit: " + std::to_string(stats.failed) + " failed, " +
                       std::to_string(stats.no_space) + " for lack of space");
        }
        expect(at_end.has_value(), "wait_flushed() did not report the newest checkpoint's failed copy");
        const auto said = std::count_if(log.warnings.begin(), log.warnings.end(), [](const std::string& w) {
            return w.find("the durable level is full") != std::string::npos;
        });
        expect(said == 1, "the full durable level was said " + std::to_string(said) + " times");
        return ok;
    });
    if (!result) return;
    INFO(result->second);
    CHECK(result->first == 0);
}
