// One rank of a GlooComm job, started as a process by the gloo tests.
//
//   gloo_worker MODE STORE_URL PREFIX RANK SIZE [TIMEOUT_MS [COOLDOWN_MS]]
//   gloo_worker launched MODE        rank, world size and store from the environment
//                                    (ckpt-run); MODE collectives, loop, or crash-once:
//                                    exits 1 at once when CKPT_RESTARTS is 0 on rank 1
//
//   collectives  every call of the Communicator concept, results checked (sums bit for bit in
//                rank order, as ThreadComm adds); prints "ok"
//   loop         allreduce after allreduce until a call fails: prints "ready" once the first
//                went through, then "peer_failure ranks=R,… after_ms=T" and exits 3
//   mismatch     rank 0 sends 3 floats to rank 1, which expects 2: prints the ConfigError
//                of each side and exits 4
//   shrink       as loop, then goes on with the survivors (shrink): prints "shrunk
//                generation=G members=… sum=S" (S: an allreduce of the node ids) and exits 5
//   regroup      as loop, then waits for every node again (regroup; the dead one is started
//                anew): prints "regrouped generation=G sum=S" and exits 0
//   stuck        rank 0 waits for a message rank 1 never sends, the others sleep: prints
//                "ready", then (rank 0) "peer_failure ranks=R" and exits 3 once a rank dies
//   join         a node started anew: joins the job, allreduces once, prints "joined
//                generation=G sum=S" and exits 0
// Any other failure: the error on stderr, exit 1.

#include <fault/gloo_comm.hpp>
#include <fault/launch.hpp>

#include <span>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "%s\n", what.c_str());
    std::exit(1);
}

void expect(bool ok, const std::string& what) {
    if (!ok) fail("check failed: " + what);
}

void collectives(fault::GlooComm& comm) {
    const int r = comm.rank(), n = comm.size();
    std::vector<float> v(1000);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
    comm.allreduce(v, fault::ReduceOp::sum);
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (std::size_t i = 0; i < v.size(); ++i) expect(v[i] == ranks_sum * static_cast<float>(i % 7), "allreduce(sum)");
    // sums in rank order, as ThreadComm adds: ((x0 + x1) + x2) + ..., on values of many
    // magnitudes, whose sum another order rounds differently; an odd length, uneven slices
    auto contribution = [](int q, std::size_t i) {
        const float scale = (q % 2 != 0) ? 1e4f : 1e-3f;
        return scale * static_cast<float>((static_cast<std::size_t>(q) * 7919u + i * 104729u) % 1000003u) / 7.0f;
    };
    for (const auto op : {fault::ReduceOp::sum, fault::ReduceOp::mean}) {
        std::vector<float> x(1001);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = contribution(r, i);
        comm.allreduce(x, op);
        for (std::size_t i = 0; i < x.size(); ++i) {
            float want = contribution(0, i);
            for (int q = 1; q < n; ++q) want += contribution(q, i);
            if (op == fault::ReduceOp::mean) want /= static_cast<float>(n);
            expect(std::memcmp(&x[i], &want, sizeof want) == 0, "allreduce in rank order, element " + std::to_string(i));
        }
    }
    std::vector<float> m(10, static_cast<float>(r));
    comm.allreduce(m, fault::ReduceOp::mean);
    for (float x : m) expect(x == static_cast<float>(n - 1) / 2.0f, "allreduce(mean)");
    std::vector<float> b(5, static_cast<float>(10 + r));
    comm.broadcast(b, n - 1);
    for (float x : b) expect(x == static_cast<float>(10 + n - 1), "broadcast");
    std::vector<float> mine{static_cast<float>(r), static_cast<float>(100 * r)}, all(2 * static_cast<std::size_t>(n));
    comm.allgather(mine, all);
    for (int q = 0; q < n; ++q)
        expect(all[2 * q] == static_cast<float>(q) && all[2 * q + 1] == static_cast<float>(100 * q), "allgather");
    comm.barrier();
    // a ring: rank 0 sends first, the others receive first; a big message and a small one
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<float> big(1 << 20), got(1 << 20), small(3);
    auto pass_on = [&] {
        for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(r) + static_cast<float>(i);
        comm.send(big, next, 4);
        comm.send(std::vector<float>{static_cast<float>(r), 1, 2}, next, 9);
    };
    if (n > 1) {
        if (r == 0) pass_on();
        comm.recv(got, prev, 4);
        for (std::size_t i = 0; i < got.size(); i += 4099) expect(got[i] == static_cast<float>(prev) + static_cast<float>(i), "recv");
        comm.recv(small, prev, 9);
        expect(small == std::vector<float>{static_cast<float>(prev), 1, 2}, "recv small");
        if (r != 0) pass_on();
    }
    comm.barrier();
    std::printf("ok\n");
}

int loop(fault::GlooComm& comm) {
    std::vector<float> v(1 << 16, 1.0f);
    for (long i = 0;; ++i) {
        try {
            comm.allreduce(v, fault::ReduceOp::mean);
        } catch (const fault::PeerFailure& e) {
            std::string ranks;
            for (int q : e.ranks()) ranks += (ranks.empty() ? "" : ",") + std::to_string(q);
            std::printf("peer_failure ranks=%s\n%s\n", ranks.c_str(), e.what());
            std::fflush(stdout);
            return 3;
        }
        if (i == 0) {
            std::printf("ready\n");
            std::fflush(stdout);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
}

// An allreduce of the node ids: every member's view of who is there.
float id_sum(fault::GlooComm& comm) {
    float v = static_cast<float>(comm.job_rank());
    comm.allreduce(std::span<float>(&v, 1), fault::ReduceOp::sum);
    return v;
}

int after_failure(fault::GlooComm& comm, const std::string& mode) {
    if (const int rc = loop(comm); rc != 3) return rc;
    if (mode == "shrink") {
        fault::GlooComm survivors = comm.shrink();
        const float sum = id_sum(survivors);
        std::string members;
        for (int q : survivors.generation().members) members += (members.empty() ? "" : ",") + std::to_string(q);
        std::printf("shrunk generation=%d members=%s sum=%g\n", survivors.generation().number, members.c_str(), sum);
        return 5;
    }
    fault::GlooComm all = comm.regroup();
    std::printf("regrouped generation=%d sum=%g\n", all.generation().number, id_sum(all));
    return 0;
}

// Rank 0 waits for a message rank 1 never sends; the others only live. No connection of
// rank 0's breaks when another rank dies: only GlooComm's watch can end its wait.
int stuck(fault::GlooComm& comm) {
    std::printf("ready\n");
    std::fflush(stdout);
    if (comm.rank() != 0)
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    std::vector<float> never(1);
    try {
        comm.recv(never, 1, 3);
    } catch (const fault::PeerFailure& e) {
        std::string ranks;
        for (int q : e.ranks()) ranks += (ranks.empty() ? "" : ",") + std::to_string(q);
        std::printf("peer_failure ranks=%s\n%s\n", ranks.c_str(), e.what());
        return 3;
    }
    return 0;
}

int mismatch(fault::GlooComm& comm) {
    try {
        if (comm.rank() == 0) comm.send(std::vector<float>{1, 2, 3}, 1, 5);
        if (comm.rank() == 1) {
            std::vector<float> two(2);
            comm.recv(two, 0, 5);
        }
    } catch (const ckpt::ConfigError& e) {
        std::printf("config_error: %s\n", e.what());
        return 4;
    }
    return 0;
}

}  // namespace

int launched(const std::string& mode) {
    const auto env = fault::launch_env();
    if (mode == "crash-once" && env.rank == 1 && env.restarts == 0) {
        std::printf("rank 1 crashing on its first start\n");
        return 1;
    }
    auto store = fault::open_store(env.store);
    fault::GlooComm comm(*store, env.rank, env.world_size, {.timeout = std::chrono::seconds(20), .prefix = "job/"});
    std::printf("rank %d of %d, restarts %d\n", env.rank, env.world_size, env.restarts);
    if (mode == "loop") return loop(comm);
    collectives(comm);
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "launched") {
        try {
            return launched(argv[2]);
        } catch (const std::exception& e) {
            fail(std::string("error: ") + e.what());
        }
    }
    if (argc < 6) fail("usage: gloo_worker MODE STORE_URL PREFIX RANK SIZE [TIMEOUT_MS [COOLDOWN_MS]]");
    const std::string mode = argv[1];
    const int rank = std::atoi(argv[4]), size = std::atoi(argv[5]);
    const auto timeout = std::chrono::milliseconds(argc > 6 ? std::atol(argv[6]) : 20000);
    const auto cooldown = std::chrono::milliseconds(argc > 7 ? std::atol(argv[7]) : 1000);
    try {
        auto store = fault::open_store(argv[2], timeout);
        fault::GlooComm comm(*store, rank, size, {.timeout = timeout, .prefix = argv[3], .cooldown = cooldown});
        if (mode == "collectives") collectives(comm);
        else if (mode == "loop") return loop(comm);
        else if (mode == "shrink" || mode == "regroup") return after_failure(comm, mode);
        else if (mode == "join") std::printf("joined generation=%d sum=%g\n", comm.generation().number, id_sum(comm));
        else if (mode == "mismatch") return mismatch(comm);
        else if (mode == "stuck") return stuck(comm);
        else fail("unknown mode " + mode);
    } catch (const std::exception& e) {
        fail(std::string("error: ") + e.what());
    }
    return 0;
}
