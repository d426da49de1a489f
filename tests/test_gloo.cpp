// GlooComm and the stores, with real processes on loopback: a file store, a redis-server of
// the test's own, real SIGKILLs.

#include <doctest/doctest.h>

#include <fault/gloo_comm.hpp>

#include "process.hpp"
#include "support.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;

std::vector<std::unique_ptr<test::Process>> start_workers(const std::string& mode, const std::string& url,
                                                         const std::string& prefix, int size, const test::TempDir& dir,
                                                         int timeout_ms = 20000) {
    std::vector<std::unique_ptr<test::Process>> workers;
    for (int r = 0; r < size; ++r)
        workers.push_back(std::make_unique<test::Process>(
            std::vector<std::string>{CKPT_GLOO_WORKER, mode, url, prefix, std::to_string(r), std::to_string(size),
                                     std::to_string(timeout_ms)},
            (dir / ("worker-" + std::to_string(r) + ".log")).string()));
    return workers;
}

void check_collectives(const std::string& url, const test::TempDir& dir) {
    auto workers = start_workers("collectives", url, "job/", 4, dir);
    for (std::size_t r = 0; r < workers.size(); ++r) {
        INFO("rank " << r << ": " << workers[r]->output());
        CHECK(workers[r]->wait(60s) == 0);
        CHECK(workers[r]->output().find("ok") != std::string::npos);
    }
}

}  // namespace

TEST_CASE("file store: set replaces, create is atomic, add counts, erase, wait times out naming the key") {
    test::TempDir dir;
    fault::FileStore store((dir / "store").string());
    CHECK_FALSE(store.get("a/b").has_value());
    store.set("a/b", std::string("x\0y", 3));
    CHECK(store.get("a/b") == std::string("x\0y", 3));
    store.set("a/b", "second");
    CHECK(store.get("a/b") == "second");
    CHECK(store.create("c", "1"));
    CHECK_FALSE(store.create("c", "2"));
    CHECK(store.get("c") == "1");
    CHECK(store.add("n", 5) == 5);
    CHECK(store.add("n", -2) == 3);
    CHECK_FALSE(store.get("n.lock").has_value());  // a counter's lock is no other key's value
    CHECK_THROWS_WITH_AS(store.add("a/b", 1), doctest::Contains("'a/b': it holds 'second', not an integer"), fault::StoreError);
    store.erase("c");
    store.erase("never");
    CHECK_FALSE(store.get("c").has_value());
    CHECK_THROWS_WITH_AS(store.wait("late", 50ms), doctest::Contains("key 'late' not set within 50 ms"), fault::StoreError);
    fault::PrefixStore gen(store, "gen/2/");
    gen.set("k", "v");
    CHECK(store.get("gen/2/k") == "v");
    CHECK(gen.wait("k", 10ms) == "v");
    // keys cannot reach outside the directory
    store.set("../../escape", "no");
    CHECK_FALSE(boost::filesystem::exists(dir / "escape"));
    CHECK(store.get("../../escape") == "no");
}

TEST_CASE("open_store takes file:// and redis:// URLs and names what is wrong with others") {
    test::TempDir dir;
    CHECK(fault::open_store("file://" + (dir / "s").string())->url() == "file://" + (dir / "s").string());
    CHECK_THROWS_WITH_AS(fault::open_store("file://relative"), doctest::Contains("needs an absolute path"), ckpt::ConfigError);
    CHECK_THROWS_WITH_AS(fault::open_store("redis://host:port"), doctest::Contains("'port' is not a port"), ckpt::ConfigError);
    CHECK_THROWS_WITH_AS(fault::open_store("tcp://x"), doctest::Contains("expected file:///dir or redis://host:port"),
                         ckpt::ConfigError);
    // nobody listens there: StoreError within the timeout, naming the server
    const int port = test::free_port();
    const auto start = std::chrono::steady_clock::now();
    const std::string where = "redis://127.0.0.1:" + std::to_string(port);
    CHECK_THROWS_WITH_AS(fault::open_store(where, 300ms), doctest::Contains(where.c_str()), fault::StoreError);
    CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("redis store: the same operations, and a server restart is survived by retrying") {
    test::TempDir dir;
    test::RedisServer server(dir.path().string());
    fault::RedisStore store("127.0.0.1", server.port(), 10s);
    store.set("a", std::string("x\0y", 3));
    CHECK(store.get("a") == std::string("x\0y", 3));
    CHECK(store.create("c", "1"));
    CHECK_FALSE(store.create("c", "2"));
    CHECK(store.add("n", 5) == 5);
    CHECK(store.add("n", 2) == 7);
    CHECK_THROWS_WITH_AS(store.add("a", 1), doctest::Contains("add of key 'a'"), fault::StoreError);
    store.erase("c");
    CHECK_FALSE(store.get("c").has_value());

    // killed and started again (no persistence: the keys are gone, the connection comes back)
    server.kill();
    std::thread restart([&] {
        std::this_thread::sleep_for(300ms);
        server.start();
    });
    store.set("after", "restart");  // retried until the server is back
    restart.join();
    CHECK(store.get("after") == "restart");
    CHECK_FALSE(store.get("n").has_value());

    // with persistence, the keys survive the restart
    server.kill();
    server.start(/*persistent=*/true);
    store.set("kept", "yes");
    server.kill();
    server.start(/*persistent=*/true);
    CHECK(store.get("kept") == "yes");
}

TEST_CASE("GlooComm: four processes agree on every call of the concept, through a file store") {
    test::TempDir dir;
    check_collectives("file://" + (dir / "store").string(), dir);
}

TEST_CASE("GlooComm: four processes agree on every call of the concept, through a redis store") {
    test::TempDir dir;
    test::RedisServer server(dir.path().string());
    check_collectives(server.url(), dir);
}

// Gloo leaves a send queued on a broken connection to the call's timeout; GlooComm's watch
// aborts such waits once a member reports the failure or is found dead. The timeout here is
// long (30 s), and every survivor must name the dead within 2 s of the kill, whichever rank
// it was.
TEST_CASE("GlooComm: a SIGKILLed rank is named by every survivor's PeerFailure within 2 s, far inside the timeout") {
    test::TempDir dir;
    const auto url = "file://" + (dir / "store").string();
    for (int victim : {2, 0, 3}) {
        CAPTURE(victim);
        auto workers = start_workers("loop", url, "kill-" + std::to_string(victim) + "/", 4, dir, 30000);
        for (auto& w : workers) REQUIRE(w->wait_for_output("ready", 30s));
        const auto start = std::chrono::steady_clock::now();
        workers[static_cast<std::size_t>(victim)]->kill(SIGKILL);
        for (int r = 0; r < 4; ++r) {
            if (r == victim) continue;
            INFO("rank " << r << ": " << workers[static_cast<std::size_t>(r)]->output());
            CHECK(workers[static_cast<std::size_t>(r)]->wait(40s) == 3);
            CHECK(workers[static_cast<std::size_t>(r)]->output().find("peer_failure ranks=" + std::to_string(victim) + "\n") !=
                  std::string::npos);
        }
        const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        INFO("the last survivor ended " << took.count() << " ms after the kill");
        CHECK(took < 2s);
    }
}

// Here no connection of the waiting rank breaks: rank 0 waits on rank 1, alive and silent,
// when rank 2 dies. The watch finds the dead member and ends the wait.
TEST_CASE("GlooComm: a rank waiting on a live peer hears of another's death within 2 s, far inside the timeout") {
    test::TempDir dir;
    const auto url = "file://" + (dir / "store").string();
    auto workers = start_workers("stuck", url, "stuck/", 4, dir, 30000);
    for (auto& w : workers) REQUIRE(w->wait_for_output("ready", 30s));
    std::this_thread::sleep_for(200ms);  // rank 0 inside its wait, past the watch's first look
    const auto start = std::chrono::steady_clock::now();
    workers[2]->kill(SIGKILL);
    INFO("rank 0: " << workers[0]->output());
    CHECK(workers[0]->wait(40s) == 3);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    CHECK(workers[0]->output().find("peer_failure ranks=2\n") != std::string::npos);
    INFO("rank 0 ended " << took.count() << " ms after the kill");
    CHECK(took < 2s);
    for (int r : {1, 3}) workers[static_cast<std::size_t>(r)]->kill(SIGKILL);
}

TEST_CASE("GlooComm: options no wait can keep are refused at once, naming the field") {
    test::TempDir dir;
    auto store = fault::open_store("file://" + (dir / "store").string());
    const auto refused = [&](fault::GlooOptions o, const std::string& field) {
        CAPTURE(field);
        const auto start = std::chrono::steady_clock::now();
        CHECK_THROWS_WITH_AS(fault::GlooComm(*store, 0, 1, o), doctest::Contains(("GlooOptions::" + field).c_str()),
                             ckpt::ConfigError);
        CHECK(std::chrono::steady_clock::now() - start < 1s);
    };
    const auto with = [](auto set) {
        fault::GlooOptions o;
        set(o);
        return o;
    };
    refused(with([](auto& o) { o.timeout = 0ms; }), "timeout");
    refused(with([](auto& o) { o.timeout = -5ms; }), "timeout");
    refused(with([](auto& o) { o.lease = 0ms; }), "lease");
    refused(with([](auto& o) { o.cooldown = -1ms; }), "cooldown");
    refused(with([](auto& o) { o.elastic = -1ms; }), "elastic");
    refused(with([](auto& o) { o.address.clear(); }), "address");
}

TEST_CASE("GlooComm: a size mismatch fails on both sides, a taken rank and a wrong world size are refused") {
    test::TempDir dir;
    const auto url = "file://" + (dir / "store").string();
    {
        auto workers = start_workers("mismatch", url, "mismatch/", 2, dir);
        CHECK(workers[0]->wait(30s) == 4);
        CHECK(workers[1]->wait(30s) == 4);
        CHECK(workers[0]->output().find("sent 3 floats, rank 1 expected 2") != std::string::npos);
        CHECK(workers[1]->output().find("expected 2 floats from rank 0 (tag 5), it sent 3") != std::string::npos);
    }
    auto store = fault::open_store(url);
    {  // rank 1 is claimed twice in one generation
        test::Process a({CKPT_GLOO_WORKER, "collectives", url, "twice/", "1", "2", "1500"}, (dir / "a.log").string());
        store->wait("twice/node/1", 10s);
        // a long timeout: the duplicate is named within a lease (1.5 s), not after it
        const auto started = std::chrono::steady_clock::now();
        test::Process b({CKPT_GLOO_WORKER, "collectives", url, "twice/", "1", "2", "20000"}, (dir / "b.log").string());
        CHECK(b.wait(20s) == 1);
        CHECK(std::chrono::steady_clock::now() - started < 8s);
        CHECK(b.output().find("node id 1 in " + url + " (keys under 'twice/') is held by a live worker") != std::string::npos);
        CHECK(a.wait(20s) == 1);  // and the first gives up in time: rank 0 never came
    }
    {  // three ranks started as a world of 3, one as a world of 4
        test::Process a({CKPT_GLOO_WORKER, "collectives", url, "size/", "0", "3", "1500"}, (dir / "s0.log").string());
        store->wait("size/world_size", 10s);
        test::Process b({CKPT_GLOO_WORKER, "collectives", url, "size/", "1", "4", "1500"}, (dir / "s1.log").string());
        CHECK(b.wait(20s) == 1);
        CHECK(b.output().find("node 1 was started with a world of 4 nodes, the job in " + url + " (keys under 'size/') has 3") !=
              std::string::npos);
        CHECK(a.wait(20s) == 1);
    }
}

TEST_CASE("GlooComm: after a SIGKILL the survivors shrink into the next generation, whichever rank died") {
    test::TempDir dir;
    const auto url = "file://" + (dir / "store").string();
    for (int victim : {0, 3}) {
        CAPTURE(victim);
        auto workers = start_workers("shrink", url, "shrink-" + std::to_string(victim) + "/", 4, dir, 5000);
        for (auto& w : workers) REQUIRE(w->wait_for_output("ready", 30s));
        workers[static_cast<std::size_t>(victim)]->kill(SIGKILL);
        std::string members;
        for (int q = 0; q < 4; ++q)
            if (q != victim) {
                if (!members.empty()) members += ',';
                members += std::to_string(q);
            }
        const int sum = 0 + 1 + 2 + 3 - victim;
        for (int r = 0; r < 4; ++r) {
            if (r == victim) continue;
            INFO("rank " << r << ": " << workers[static_cast<std::size_t>(r)]->output());
            CHECK(workers[static_cast<std::size_t>(r)]->wait(30s) == 5);
            CHECK(workers[static_cast<std::size_t>(r)]->output().find("shrunk generation=2 members=" + members +
                                                                       " sum=" + std::to_string(sum) + "\n") != std::string::npos);
        }
    }
}

TEST_CASE("GlooComm: a killed worker started anew waits out the cooldown, then every node regroups") {
    test::TempDir dir;
    const auto url = "file://" + (dir / "store").string();
    const int cooldown_ms = 1500;
    std::vector<std::unique_ptr<test::Process>> workers;
    for (int r = 0; r < 4; ++r)
        workers.push_back(std::make_unique<test::Process>(
            std::vector<std::string>{CKPT_GLOO_WORKER, "regroup", url, "job/", std::to_string(r), "4", "5000",
                                     std::to_string(cooldown_ms)},
            (dir / ("worker-" + std::to_string(r) + ".log")).string()));
    for (auto& w : workers) REQUIRE(w->wait_for_output("ready", 30s));
    workers[1]->kill(SIGKILL);
    const auto killed = std::chrono::steady_clock::now();
    REQUIRE(workers[1]->wait(10s) == 128 + SIGKILL);
    test::Process again({CKPT_GLOO_WORKER, "join", url, "job/", "1", "4", "5000", std::to_string(cooldown_ms)},
                        (dir / "worker-1-again.log").string());
    INFO("the new worker 1: " << again.output());
    CHECK(again.wait(30s) == 0);
    const auto joined = std::chrono::steady_clock::now();
    CHECK(again.output().find("(the cooldown) before registering it again") != std::string::npos);
    CHECK(again.output().find("joined generation=2 sum=6\n") != std::string::npos);
    // it did not come back earlier: the cooldown runs from the last heartbeat, at most a
    // heartbeat period (lease / 5 = 300 ms) before the kill
    CHECK(joined - killed >= std::chrono::milliseconds(cooldown_ms - 300));
    for (int r : {0, 2, 3}) {
        INFO("rank " << r << ": " << workers[static_cast<std::size_t>(r)]->output());
        CHECK(workers[static_cast<std::size_t>(r)]->wait(30s) == 0);
        CHECK(workers[static_cast<std::size_t>(r)]->output().find("regrouped generation=2 sum=6\n") != std::string::npos);
    }
}
