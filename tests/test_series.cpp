// A series and its life: one writer at a time (the lock), a finished series run again, and
// checkpoints that exist but cannot be used.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>

#include "support.hpp"

// (a namespace of its own: the unit sources compile together, in batches)
namespace series_tests {

namespace fs = boost::filesystem;
using test::TempDir;
using Manager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;

struct Counter {
    std::int64_t iteration = 0;
    std::vector<double> field = std::vector<double>(16, 0.0);
    void step() {
        ++iteration;
        for (double& x : field) x += 0.5 * static_cast<double>(iteration);
    }
    ckpt::ParamDict state_dict() {
        ckpt::ParamDict d;
        d.set("iteration", ckpt::view_of(iteration));
        d.set("field", ckpt::view_of(field));
        return d;
    }
};

/// One run of a job: resume, iterate to `iters`, end. Returns where it started.
std::int64_t run_job(const fs::path& dir, std::int64_t iters, Counter& c) {
    Manager mgr(dir, "job", ckpt::EverySteps{100}, ckpt::KeepLast{2});
    mgr.restore(c);
    const std::int64_t start = c.iteration;
    while (c.iteration < iters) {
        c.step();
        mgr.on_step(ckpt::Progress::at_iteration(c.iteration), c);
    }
    mgr.on_train_end(ckpt::Progress::at_iteration(c.iteration), c, "iters=" + std::to_string(iters));
    return start;
}

/// Every file of `dir` (but the lock, whose text says who holds it) with its size and change time.
std::map<std::string, std::pair<std::uintmax_t, std::int64_t>> snapshot(const fs::path& dir) {
    std::map<std::string, std::pair<std::uintmax_t, std::int64_t>> out;
    for (const auto& name : test::names_in(dir)) {
        if (name == "job.lock") continue;
        struct stat st {};
        REQUIRE(::stat((dir / name).c_str(), &st) == 0);
        out[name] = {static_cast<std::uintmax_t>(st.st_size), st.st_ctim.tv_sec * 1'000'000'000 + st.st_ctim.tv_nsec};
    }
    return out;
}

bool logged(const test::LogCapture& log, const std::string& text) {
    for (const auto* list : {&log.infos, &log.warnings})
        for (const auto& m : *list)
            if (m.find(text) != std::string::npos) return true;
    return false;
}

/// A child process holding a manager of `prefix` in `dir` until it is killed; returns its pid
/// once it holds the series.
pid_t hold_in_child(const fs::path& dir, const std::string& prefix) {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(ready[0]);
        try {
            Manager mgr(dir, prefix, ckpt::EverySteps{1}, ckpt::KeepLast{2});
            const char ok = 1;
            if (::write(ready[1], &ok, 1) != 1) ::_exit(3);
            for (;;) ::pause();
        } catch (...) {
            ::_exit(2);
        }
    }
    ::close(ready[1]);
    char ok = 0;
    const bool held = ::read(ready[0], &ok, 1) == 1;
    ::close(ready[0]);
    REQUIRE(held);
    return pid;
}

TEST_CASE("a second process on the same directory and prefix is refused, naming the holder, and a killed holder's series is taken over") {
    TempDir dir;
    test::LogCapture log;
    const pid_t holder = hold_in_child(dir.path(), "same");
    std::string refused;
    try {
        Manager second(dir.path(), "same", ckpt::EverySteps{1}, ckpt::KeepLast{2});
    } catch (const ckpt::SeriesLocked& e) {
        refused = e.what();
    }
    CHECK(refused.find("prefix 'same' in '" + dir.path().string() + "' is held by pid " + std::to_string(holder) +
                       " on host ") != std::string::npos);
    CHECK(refused.find(" since ") != std::string::npos);
    // another prefix in the same directory is another series
    CHECK_NOTHROW(Manager(dir.path(), "other", ckpt::EverySteps{1}, ckpt::KeepLast{2}));

    ::kill(holder, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(holder, &status, 0) == holder);
    Manager after(dir.path(), "same", ckpt::EverySteps{1}, ckpt::KeepLast{2});
    CHECK(logged(log, "taking over prefix 'same' in '" + dir.path().string() + "' from pid " + std::to_string(holder)));
    // the lock file stays; its text names the new holder
    const auto text = test::read_bytes(dir / "same.lock");
    CHECK(std::string(text.begin(), text.end()).find("pid " + std::to_string(::getpid()) + "\n") != std::string::npos);
}

TEST_CASE("two managers of one series in one process: the second is refused until the first is gone") {
    TempDir dir;
    std::optional<Manager> first;
    first.emplace(dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepLast{2});
    std::string refused;
    std::thread other([&] {
        try {
            Manager second(dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepLast{2});
        } catch (const ckpt::SeriesLocked& e) {
            refused = e.what();
        }
    });
    other.join();
    CHECK(refused.find("this process") != std::string::npos);
    first.reset();  // released at destruction: the file says nobody holds it
    CHECK(test::read_bytes(dir / "run.lock").empty());
    test::LogCapture log;
    CHECK_NOTHROW(Manager(dir.path(), "run", ckpt::EverySteps{1}, ckpt::KeepLast{2}));
    CHECK_FALSE(logged(log, "taking over"));
}

TEST_CASE("a finished job run again three times saves and deletes nothing, run longer it goes on from its end") {
    TempDir dir;
    Counter first;
    CHECK(run_job(dir.path(), 450, first) == 0);
    CHECK(fs::exists(dir / "job.finished"));
    CHECK(test::names_in(dir.path()) ==
          std::vector<std::string>{"job-400.ckpt", "job-450.ckpt", "job-graph.meta", "job.finished"});
    CHECK(fs::exists(dir / "job.lock"));
    const auto before = snapshot(dir.path());
    for (int rerun = 0; rerun < 3; ++rerun) {
        test::LogCapture log;
        Counter again;
        CHECK(run_job(dir.path(), 450, again) == 450);
        CHECK(again.field == first.field);
        CHECK(logged(log, "finished at epoch 1, step 450 (global step 450) with 'iters=450'"));
        CHECK(logged(log, "nothing saved, nothing deleted"));
        CHECK(snapshot(dir.path()) == before);
    }
    // extended: from the final checkpoint, to the state of a run that went to 520 at once
    Counter extended;
    test::LogCapture log;
    CHECK(run_job(dir.path(), 520, extended) == 450);
    TempDir straight_dir;
    Counter straight;
    run_job(straight_dir.path(), 520, straight);
    CHECK(extended.field == straight.field);
    const auto record = ckpt::read_finished(dir.path(), "job");
    REQUIRE(record);
    CHECK(record->global_step == 520);
    CHECK(record->arguments == "iters=520");
    CHECK(record->file == "job_1-520.ckpt");
    // retention spans the runs: the newest two of all of them
    CHECK(test::names_in(dir.path()) ==
          std::vector<std::string>{"job.finished", "job_1-500.ckpt", "job_1-520.ckpt", "job_1-graph.meta"});
}

TEST_CASE("a finished job run again on a read-only directory ends as it did, writing nothing") {
    TempDir dir;
    Counter first;
    run_job(dir.path(), 300, first);
    const auto before = snapshot(dir.path());
    if (::mount(dir.path().c_str(), dir.path().c_str(), nullptr, MS_BIND, nullptr) != 0) {
        MESSAGE("skipped: a read-only bind mount needs privileges this process lacks (" << std::strerror(errno) << ")");
        return;
    }
    struct Unmount {
        const fs::path& at;
        ~Unmount() { ::umount2(at.c_str(), MNT_DETACH); }
    } unmount{dir.path()};
    REQUIRE(::mount(nullptr, dir.path().c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0);
    Counter again;
    CHECK(run_job(dir.path(), 300, again) == 300);
    CHECK(again.field == first.field);
    CHECK(snapshot(dir.path()) == before);
    // a run that would have to save fails, naming the file
    Counter longer;
    CHECK_THROWS_WITH_AS(run_job(dir.path(), 400, longer), doctest::Contains("job_1-400.ckpt"), ckpt::IoError);
}

TEST_CASE("a finished record whose checkpoint is gone or replaced is stale: the run goes on as any") {
    TempDir dir;
    Counter first;
    run_job(dir.path(), 200, first);
    REQUIRE(ckpt::read_finished(dir.path(), "job"));
    fs::remove(dir / "job-200.ckpt");  // the final file lost: resumed from 100, it saves 200 again
    CHECK_FALSE(ckpt::read_finished(dir.path(), "job"));
    Counter again;
    CHECK(run_job(dir.path(), 200, again) == 100);
    CHECK(again.field == first.field);
    const auto record = ckpt::read_finished(dir.path(), "job");
    REQUIRE(record);
    CHECK(record->file == "job_1-200.ckpt");
}

TEST_CASE("the newest checkpoint in a format this version cannot read: no start over, no older file, unless asked") {
    TempDir dir;
    Counter c;
    run_job(dir.path(), 200, c);
    // job-200.ckpt as a newer writer would make it: format version 4, its header sealed
    auto bytes = test::read_bytes(dir / "job-200.ckpt");
    ckpt::detail::put_le<std::uint32_t>(reinterpret_cast<std::byte*>(bytes.data()) + 8, 4);
    test::reseal(bytes);
    test::write_bytes(dir / "job-200.ckpt", bytes);

    Counter resumed;
    try {
        Manager mgr(dir.path(), "job", ckpt::EverySteps{100}, ckpt::KeepLast{2});
        mgr.restore(resumed);
        FAIL("restore() went on");
    } catch (const ckpt::UnreadableCheckpoints& e) {
        CHECK(std::string(e.what()).find("job-200.ckpt") != std::string::npos);
        CHECK(std::string(e.what()).find("format version 4") != std::string::npos);
        REQUIRE(e.files().size() == 1);
        CHECK(e.files()[0].unsupported);
    }
    CHECK(resumed.iteration == 0);
    CHECK_THROWS_AS(ckpt::latest(dir.path(), "job"), ckpt::UnreadableCheckpoints);
    // asked to, it falls back to the newest it reads, and says which it passed over
    std::vector<ckpt::SkippedCheckpoint> skipped;
    auto latest = ckpt::latest(dir.path(), "job", ckpt::StepNaming{}, &skipped, ckpt::OnUnreadable::fall_back);
    REQUIRE(latest);
    CHECK(latest->filename() == "job-100.ckpt");
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].unsupported);
    // and so does a manager told to
    ckpt::ManagerOptions fall_back;
    fall_back.on_unreadable = ckpt::OnUnreadable::fall_back;
    Manager lenient(dir.path(), "job", ckpt::EverySteps{100}, ckpt::KeepLast{2}, {}, fall_back);
    Counter older;
    const auto r = lenient.restore(older);
    REQUIRE(r);
    CHECK(r->file.path.filename() == "job-100.ckpt");
    CHECK(older.iteration == 100);
}

// A file this process may not open may be whole: the lookup stops at it, as Python's does,
// rather than going on from an older one as if it were damaged. Run as an unprivileged user
// in a child (root opens any file).
TEST_CASE("a newest checkpoint this process may not open stops the lookup, rather than being passed over as damaged") {
    TempDir dir;
    Counter c;
    run_job(dir.path(), 200, c);
    REQUIRE(::chmod(dir.path().c_str(), 0755) == 0);
    for (const auto& e : fs::directory_iterator(dir.path())) REQUIRE(::chmod(e.path().c_str(), 0644) == 0);
    REQUIRE(::chmod((dir / "job-200.ckpt").c_str(), 0) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(77);  // not allowed here: say so
        try {
            ckpt::latest(dir.path(), "job");
            ::_exit(1);  // went on from job-100.ckpt
        } catch (const ckpt::UnreadableCheckpoints& e) {
            const std::string what = e.what();
            const bool named = what.find("job-200.ckpt") != std::string::npos &&
                               what.find("Permission denied") != std::string::npos;
            ::_exit(named && e.files().size() == 1 && e.files()[0].unsupported ? 0 : 2);
        } catch (...) {
            ::_exit(3);
        }
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    REQUIRE_MESSAGE(WEXITSTATUS(status) != 77, "this machine does not let a process become nobody");
    CHECK(WEXITSTATUS(status) == 0);  // 1: passed over as damaged; 2: refused without naming it; 3: another error
    REQUIRE(::chmod((dir / "job-200.ckpt").c_str(), 0644) == 0);
}

TEST_CASE("checkpoints that exist when none can be used: no start over unless asked") {
    TempDir dir;
    Counter c;
    run_job(dir.path(), 200, c);
    for (const char* name : {"job-100.ckpt", "job-200.ckpt"}) test::flip_bit(dir / name, 100);
    {
        Manager mgr(dir.path(), "job", ckpt::EverySteps{100}, ckpt::KeepLast{2});
        Counter resumed;
        try {
            mgr.restore(resumed);
            FAIL("restore() went on");
        } catch (const ckpt::UnreadableCheckpoints& e) {
            CHECK(std::string(e.what()).find("2 checkpoint(s) of prefix 'job'") != std::string::npos);
            CHECK(e.files().size() == 2);
        }
    }
    ckpt::ManagerOptions fall_back;
    fall_back.on_unreadable = ckpt::OnUnreadable::fall_back;
    Manager mgr(dir.path(), "job", ckpt::EverySteps{100}, ckpt::KeepLast{2}, {}, fall_back);
    Counter fresh;
    CHECK_FALSE(mgr.restore(fresh));
    // both damaged files are still there
    CHECK(fs::exists(dir / "job-100.ckpt"));
    CHECK(fs::exists(dir / "job-200.ckpt"));
}

TEST_CASE("a job killed and started again 12 times keeps what its retention says, with the default naming") {
    TempDir dir;
    using Default = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast>;
    Counter c;
    for (int run = 0; run < 12; ++run) {
        Default mgr(dir.path(), "net", ckpt::EverySteps{2}, ckpt::KeepLast{2});
        mgr.restore(c);
        for (int s = 0; s < 3; ++s) {  // three steps, then "killed": no train end
            c.step();
            ckpt::Progress p;
            p.epoch = 1;
            p.step = p.global_step = c.iteration;
            mgr.on_step(p, c);
        }
    }
    std::size_t checkpoints = 0, metas = 0;
    for (const auto& name : test::names_in(dir.path())) {
        checkpoints += name.ends_with(".ckpt");
        metas += name.ends_with("-graph.meta");
    }
    CHECK(checkpoints == 2);
    CHECK(metas <= 2);
}

}  // namespace series_tests
