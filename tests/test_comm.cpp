// ThreadComm: the collectives' results, determinism, and failures surfacing as
// PeerFailure naming the rank, within the timeout and never as a hang.
#include <doctest/doctest.h>

#include <fault/fault.hpp>

#include <atomic>
#include <random>
#include <thread>

#include "support.hpp"

namespace {

std::vector<float> data_of(int rank, std::size_t n) {
    std::mt19937 g(static_cast<unsigned>(rank) + 1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = u(g);
    return v;
}

}  // namespace

TEST_CASE("allreduce adds in rank order: the same bits whatever the arrival order") {
    const int n = 4;
    const std::size_t len = 1000;
    std::vector<float> expected = data_of(0, len);
    for (int r = 1; r < n; ++r) {
        const auto v = data_of(r, len);
        for (std::size_t i = 0; i < len; ++i) expected[i] += v[i];
    }
    for (int trial = 0; trial < 3; ++trial) {
        fault::ThreadGroup group(n, std::chrono::seconds(10));
        std::vector<std::vector<float>> sums(n), means(n);
        fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            // arrive in a different order each trial
            std::this_thread::sleep_for(std::chrono::milliseconds(((comm.rank() + trial) % n) * 3));
            auto v = data_of(comm.rank(), len);
            comm.allreduce(v, fault::ReduceOp::sum);
            sums[static_cast<std::size_t>(comm.rank())] = v;
            auto m = data_of(comm.rank(), len);
            comm.allreduce(m, fault::ReduceOp::mean);
            means[static_cast<std::size_t>(comm.rank())] = m;
        }).rethrow();
        for (int r = 0; r < n; ++r) {
            CHECK(sums[static_cast<std::size_t>(r)] == expected);
            CHECK(means[static_cast<std::size_t>(r)][7] == expected[7] / 4.0f);
        }
    }
}

TEST_CASE("broadcast, allgather, barrier, send and recv") {
    fault::ThreadGroup group(3, std::chrono::seconds(10));
    std::atomic<int> past_barrier{0};
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        const int r = comm.rank();
        std::vector<float> b(4, static_cast<float>(r));
        comm.broadcast(b, 2);
        CHECK(b == std::vector<float>(4, 2.0f));
        std::vector<float> mine{static_cast<float>(r), static_cast<float>(10 * r)}, all(6);
        comm.allgather(mine, all);
        CHECK(all == std::vector<float>{0, 0, 1, 10, 2, 20});
        ++past_barrier;
        comm.barrier();
        CHECK(past_barrier == 3);
        // a ring: each rank sends to the next, two tags in order; rank 0 sends first, the
        // others receive first (a send returns once it is received)
        const int next = (r + 1) % 3, prev = (r + 2) % 3;
        std::vector<float> got(2);
        auto pass_on = [&] {
            comm.send(std::vector<float>{float(r), 1}, next, 1);
            comm.send(std::vector<float>{float(r), 2}, next, 2);
        };
        if (r == 0) pass_on();
        comm.recv(got, prev, 1);
        CHECK(got == std::vector<float>{float(prev), 1});
        comm.recv(got, prev, 2);
        CHECK(got == std::vector<float>{float(prev), 2});
        if (r != 0) pass_on();
    }).rethrow();
}

TEST_CASE("a send returns once its receiver has the data, copied straight from the sender's buffer") {
    fault::ThreadGroup group(2, std::chrono::seconds(10));
    std::atomic<bool> receiving{false};
    std::vector<float> big(1 << 20);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        if (comm.rank() == 0) {
            comm.send(big, 1, 7);
            CHECK(receiving.load());  // had send buffered the data, it would be back before the receiver began
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            receiving = true;
            std::vector<float> got(big.size());
            comm.recv(got, 0, 7);
            CHECK(got == big);
        }
    }).rethrow();
}

TEST_CASE("run_ranks says why ranks failed: rethrow() gives the failing rank's own error, not the others' PeerFailure") {
    test::LogCapture log;
    fault::ThreadGroup group(3, std::chrono::seconds(10));
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        if (comm.rank() == 1) throw std::runtime_error("the data set gives (28, 28, 1)");
        std::vector<float> v(4);
        comm.allreduce(v, fault::ReduceOp::sum);  // the others learn of rank 1 here
    });
    CHECK(errors.any());
    CHECK(fault::detail::holds<fault::PeerFailure>(errors[0]));
    CHECK_THROWS_WITH_AS(errors.rethrow(), "the data set gives (28, 28, 1)", std::runtime_error);
    CHECK(std::any_of(log.infos.begin(), log.infos.end(), [](const std::string& m) {
        return m.find("rank 1 failed: the data set gives (28, 28, 1)") != std::string::npos;
    }));
    fault::ThreadGroup fine(2, std::chrono::seconds(10));
    const auto none = fault::run_ranks(fine, [](fault::ThreadComm& comm) { comm.barrier(); });
    CHECK_FALSE(none.any());
    CHECK_NOTHROW(none.rethrow());
}

TEST_CASE("a rank that fails is named by the others' PeerFailure, without waiting for the timeout") {
    fault::ThreadGroup group(4, std::chrono::seconds(20));
    const auto start = std::chrono::steady_clock::now();
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        std::vector<float> v(16, 1.0f);
        comm.allreduce(v, fault::ReduceOp::sum);  // all take part
        if (comm.rank() == 0) throw std::runtime_error("rank 0 dies");
        comm.allreduce(v, fault::ReduceOp::sum);
    });
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    REQUIRE(errors[0]);
    for (int r = 1; r < 4; ++r) {
        REQUIRE(errors[static_cast<std::size_t>(r)]);
        try {
            std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
        } catch (const fault::PeerFailure& e) {
            CHECK(e.ranks() == std::vector<int>{0});
            CHECK(std::string(e.what()).find("allreduce(sum) #1 on rank " + std::to_string(r) + ": rank 0 failed") !=
                  std::string::npos);
        }
    }
    CHECK(group.failed_ranks() == std::vector<int>{0});  // the others left, they did not fail
}

TEST_CASE("a rank failing after the survivors regrouped fails in their group too, without a timeout") {
    fault::ThreadGroup group(4, std::chrono::seconds(20));
    group.fail(0);
    fault::ThreadComm one(group, 1), three(group, 3);
    fault::ThreadComm survivors = one.shrink();  // ranks 1, 2, 3: made while rank 3 was active
    REQUIRE(survivors.size() == 3);
    three.declare_failed();                        // a second failure, in the original group
    const auto start = std::chrono::steady_clock::now();
    try {
        survivors.barrier();
        FAIL("the barrier completed without rank 3");
    } catch (const fault::PeerFailure& e) {
        CHECK(e.ranks() == std::vector<int>{3});
    }
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("a rank that does not arrive in time is named, arriving late, it learns who left") {
    fault::ThreadGroup group(3, std::chrono::milliseconds(150));
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(600));
        comm.barrier();
    });
    for (int r = 0; r < 2; ++r) {
        try {
            std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
        } catch (const fault::PeerFailure& e) {
            CHECK(e.ranks() == std::vector<int>{2});
            CHECK(std::string(e.what()).find("rank 2 did not arrive within 150 ms") != std::string::npos);
        }
    }
    try {
        std::rethrow_exception(errors[2]);
    } catch (const fault::PeerFailure& e) {
        CHECK(e.ranks() == std::vector<int>{0, 1});
        CHECK(std::string(e.what()).find("barrier #0 on rank 2: ranks 0, 1 left") != std::string::npos);
    }
}

TEST_CASE("misuse is a ConfigError naming both sides, recv times out or names a failed sender") {
    fault::ThreadGroup group(2, std::chrono::milliseconds(200));
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        std::vector<float> v(3);
        if (comm.rank() == 0) comm.allreduce(v, fault::ReduceOp::sum);
        else comm.broadcast(v, 0);
    });
    int config_errors = 0;
    for (const auto& e : errors) {
        try {
            if (e) std::rethrow_exception(e);
        } catch (const ckpt::ConfigError& err) {
            ++config_errors;
            CHECK(std::string(err.what()).find("collective #0") != std::string::npos);
        } catch (const fault::PeerFailure&) {
        }
    }
    CHECK(config_errors == 1);

    fault::ThreadGroup pair(2, std::chrono::milliseconds(100));
    fault::ThreadComm a(pair, 0);
    std::vector<float> buf(2);
    CHECK_THROWS_WITH_AS(a.recv(buf, 1, 0), doctest::Contains("nothing from rank 1 (tag 0) within 100 ms"),
                         fault::PeerFailure);
    fault::ThreadComm b(pair, 1);
    CHECK_THROWS_WITH_AS(b.send(std::vector<float>{1, 2, 3}, 0, 5),
                         doctest::Contains("send on rank 1 to rank 0 (tag 5): not received within 100 ms"), fault::PeerFailure);
    {  // a size mismatch fails on both sides
        std::thread sender([&] {
            CHECK_THROWS_WITH_AS(b.send(std::vector<float>{1, 2, 3}, 0, 5), doctest::Contains("sent 3 floats, rank 0 expected 2"),
                                 ckpt::ConfigError);
        });
        CHECK_THROWS_WITH_AS(a.recv(buf, 1, 5), doctest::Contains("expected 2 floats from rank 1 (tag 5), it sent 3"),
                             ckpt::ConfigError);
        sender.join();
    }
    pair.fail(1);
    CHECK_THROWS_WITH_AS(a.recv(buf, 1, 0), doctest::Contains("rank 1 failed"), fault::PeerFailure);
    CHECK_THROWS_WITH_AS(a.send(buf, 1, 0), doctest::Contains("rank 1 failed"), fault::PeerFailure);
    CHECK_THROWS_AS(fault::ThreadComm(pair, 2), ckpt::ConfigError);
    CHECK_THROWS_AS(fault::ThreadGroup(0), ckpt::ConfigError);
}
