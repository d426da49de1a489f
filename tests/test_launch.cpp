// ckpt-run and the launch environment, with real processes.

#include <doctest/doctest.h>

#include <fault/fault.hpp>
#include <fault/launch.hpp>

#include "process.hpp"
#include "support.hpp"

#include <stdlib.h>

#include <chrono>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;

// Sets environment variables for the scope, restoring what was there.
class EnvScope {
public:
    void set(const char* name, const char* value) {
        const char* old = std::getenv(name);
        saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
        if (value) ::setenv(name, value, 1);
        else ::unsetenv(name);
    }
    ~EnvScope() {
        for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
            if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
            else ::unsetenv(it->first.c_str());
        }
    }

private:
    std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

int count(const std::string& text, const std::string& what) {
    int n = 0;
    for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
}

}  // namespace

TEST_CASE("launch_env reads RANK and WORLD_SIZE or the seed's MS_NODE_ID and MS_WORKER_NUM, and names what is wrong") {
    EnvScope env;
    for (const char* v : {"RANK", "WORLD_SIZE", "MS_NODE_ID", "MS_WORKER_NUM", "CKPT_STORE", "MS_RECOVERY_PATH", "CKPT_RESTARTS"})
        env.set(v, nullptr);
    auto alone = fault::launch_env();
    CHECK(alone.rank == 0);
    CHECK(alone.world_size == 1);
    CHECK(alone.store.empty());
    CHECK_FALSE(alone.launched);
    CHECK_THROWS_WITH_AS(alone.store_url(), doctest::Contains("CKPT_STORE is not set, nor RANK and WORLD_SIZE"),
                         ckpt::ConfigError);

    env.set("MS_NODE_ID", "2");
    env.set("MS_WORKER_NUM", "4");
    env.set("MS_RECOVERY_PATH", "/tmp/recovery");
    env.set("CKPT_STORE", "redis://h:1");
    auto ms = fault::launch_env();
    CHECK(ms.rank == 2);
    CHECK(ms.world_size == 4);
    CHECK(ms.recovery_path == "/tmp/recovery");
    CHECK(ms.store == "redis://h:1");
    CHECK(ms.launched);
    CHECK(ms.store_url() == "redis://h:1");

    env.set("RANK", "3");
    CHECK_THROWS_WITH_AS(fault::launch_env(), doctest::Contains("RANK=3 and MS_NODE_ID=2 disagree"), ckpt::ConfigError);
    env.set("RANK", "2");
    CHECK(fault::launch_env().rank == 2);
    env.set("RANK", "x2");
    CHECK_THROWS_WITH_AS(fault::launch_env(), doctest::Contains("RANK='x2' is not an integer"), ckpt::ConfigError);
    env.set("RANK", "9");
    env.set("MS_NODE_ID", nullptr);
    CHECK_THROWS_WITH_AS(fault::launch_env(), doctest::Contains("RANK=9 is not in a world of 4"), ckpt::ConfigError);
    env.set("WORLD_SIZE", nullptr);
    env.set("MS_WORKER_NUM", nullptr);
    CHECK_THROWS_WITH_AS(fault::launch_env(), doctest::Contains("RANK is set but not WORLD_SIZE"), ckpt::ConfigError);
}

TEST_CASE("ckpt-run starts every worker with its rank and the store, and exits 0 when all do") {
    test::TempDir dir;
    const auto url = "file://" + (dir / "store").string();
    test::Process run({CKPT_RUN, "--nproc", "3", "--store", url, "--", CKPT_GLOO_WORKER, "launched", "collectives"},
                      (dir / "run.log").string());
    INFO(run.output());
    CHECK(run.wait(60s) == 0);
    for (int r = 0; r < 3; ++r) CHECK(run.output().find("rank " + std::to_string(r) + " of 3, restarts 0") != std::string::npos);
    CHECK(count(run.output(), "ok\n") == 3);
}

TEST_CASE("ckpt-run restarts a failed worker with the same settings, up to --max-restarts") {
    test::TempDir dir;
    {
        const auto url = "file://" + (dir / "store1").string();
        test::Process run({CKPT_RUN, "--nproc", "3", "--store", url, "--max-restarts", "1", "--", CKPT_GLOO_WORKER, "launched",
                           "crash-once"},
                          (dir / "run1.log").string());
        INFO(run.output());
        CHECK(run.wait(60s) == 0);
        CHECK(run.output().find("ckpt-run: rank 1 (pid ") != std::string::npos);
        CHECK(run.output().find("exited with status 1; starting it again (restart 1 of 1)") != std::string::npos);
        CHECK(run.output().find("rank 1 of 3, restarts 1") != std::string::npos);
        CHECK(count(run.output(), "ok\n") == 3);
    }
    {  // no restarts allowed: the job stops, with the worker's status
        const auto url = "file://" + (dir / "store2").string();
        test::Process run({CKPT_RUN, "--nproc", "3", "--store", url, "--grace", "5", "--", CKPT_GLOO_WORKER, "launched",
                           "crash-once"},
                          (dir / "run2.log").string());
        INFO(run.output());
        CHECK(run.wait(60s) == 1);
        CHECK(run.output().find("rank 1 (pid ") != std::string::npos);
        CHECK(run.output().find("exited with status 1; no restarts left: stopping the job") != std::string::npos);
    }
}

TEST_CASE("last words under ckpt-run: a worker SIGKILLed with no restarts left, the survivor still saves them") {
    // The data-parallel guide's program on GlooComm, no TerminationSignals of its own: ckpt-run's SIGTERM
    // to the survivor must not end it before its last words are durable.
    test::TempDir dir;
    const auto url = "file://" + (dir / "store").string();
    const auto words = dir / "ttp_checkpoints";
    test::Process run({CKPT_RUN, "--nproc", "2", "--store", url, "--", CKPT_LAST_WORDS_WORKER, words.string(), "5"},
                      (dir / "run.log").string());
    INFO(run.output());
    CHECK(run.wait(120s) == 128 + SIGKILL);  // the killed worker's status
    CHECK(run.output().find("no restarts left: stopping the job (SIGTERM to the others, which have 30 s to save their "
                            "last words") != std::string::npos);
    const auto file = fault::latest_last_words(words);
    REQUIRE(file);
    CHECK(file->filename() == "ttp_rank_0-1_5.ckpt");
    CHECK(ckpt::verify_checkpoint(*file).step == 5);
}

TEST_CASE("ckpt-run forwards SIGTERM to the workers and exits with 128 + 15, bad arguments exit 2") {
    test::TempDir dir;
    const auto url = "file://" + (dir / "store").string();
    test::Process run({CKPT_RUN, "--nproc", "2", "--store", url, "--grace", "10", "--", CKPT_GLOO_WORKER, "launched", "loop"},
                      (dir / "run.log").string());
    REQUIRE(run.wait_for_output("ready", 30s));
    run.kill(SIGTERM);
    INFO(run.output());
    CHECK(run.wait(30s) == 128 + SIGTERM);
    CHECK(run.output().find("ckpt-run: signal 15: forwarding it to the workers") != std::string::npos);

    test::Process bad({CKPT_RUN, "--nproc", "0", "--store", url, "--", "/bin/true"}, (dir / "bad.log").string());
    CHECK(bad.wait(10s) == 2);
    CHECK(bad.output().find("--nproc: Value 0 not in range 1") != std::string::npos);
    test::Process help({CKPT_RUN, "--help"}, (dir / "help.log").string());
    CHECK(help.wait(10s) == 0);
    CHECK(help.output().find("--max-restarts") != std::string::npos);
    // one usage line, and it shows where the program goes
    CHECK(help.output().find("Usage: ckpt-run --nproc N --store URL [options] -- PROGRAM ARGS...\n") != std::string::npos);
    CHECK(help.output().find("Usage:") == help.output().rfind("Usage:"));
    test::Process nostore({CKPT_RUN, "--nproc", "2", "--", "/bin/true"}, (dir / "nostore.log").string());
    CHECK(nostore.wait(10s) == 2);
    CHECK(nostore.output().find("--store is required") != std::string::npos);
    // a store no worker could open is named before any worker starts
    const auto missing = "file://" + (dir / "no" / "such" / "store").string();
    test::Process unreachable({CKPT_RUN, "--nproc", "2", "--store", missing, "--", "/bin/true"},
                              (dir / "unreachable.log").string());
    CHECK(unreachable.wait(10s) == 2);
    CHECK(unreachable.output().find("the directory '" + (dir / "no" / "such").string() + "' that would hold it does not exist") !=
          std::string::npos);
    test::Process scheme({CKPT_RUN, "--nproc", "2", "--store", "tcp://x", "--", "/bin/true"}, (dir / "scheme.log").string());
    CHECK(scheme.wait(10s) == 2);
    CHECK(scheme.output().find("expected file:///dir or redis://host:port") != std::string::npos);
}
