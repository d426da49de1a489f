// agree_on_checkpoint: the newest step every rank holds a valid checkpoint of.

#include <doctest/doctest.h>

#include <fault/fault.hpp>

#include "support.hpp"

#include <fstream>
#include <thread>
#include <string>
#include <vector>

namespace {

void save_step(const test::fs::path& dir, std::int64_t epoch, std::int64_t step, const std::string& run = "net") {
    test::fs::create_directories(dir);
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(std::vector<float>{float(epoch), float(step)}, {2}));
    ckpt::SaveOptions o;
    o.epoch = epoch;
    o.step = step;
    ckpt::save_checkpoint(d, dir / (run + "-" + std::to_string(epoch) + "_" + std::to_string(step) + ".ckpt"), o);
}

std::vector<fault::AgreedCheckpoint> agree(const std::vector<test::fs::path>& dirs) {
    fault::ThreadGroup group(static_cast<int>(dirs.size()), std::chrono::seconds(10));
    std::vector<fault::AgreedCheckpoint> out(dirs.size());
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        out[r] = fault::agree_on_checkpoint(comm, dirs[r], "net");
    });
    for (const auto& e : errors) REQUIRE_FALSE(e);
    return out;
}

}  // namespace

TEST_CASE("agree_on_checkpoint picks the newest step every rank holds, each rank its own file") {
    test::TempDir tmp;
    std::vector<test::fs::path> dirs;
    for (int r = 0; r < 3; ++r) dirs.push_back(tmp / ("rank_" + std::to_string(r)));
    // rank 0 saved up to step 15, rank 1 up to 20 (it ran ahead), rank 2 up to 15
    for (int r = 0; r < 3; ++r)
        for (int s : {5, 10, 15}) save_step(dirs[static_cast<std::size_t>(r)], 1, s);
    save_step(dirs[1], 1, 20);
    auto got = agree(dirs);
    for (int r = 0; r < 3; ++r) {
        CAPTURE(r);
        REQUIRE(got[static_cast<std::size_t>(r)].file);
        CHECK(got[static_cast<std::size_t>(r)].step == 15);
        CHECK(got[static_cast<std::size_t>(r)].file->parent_path() == dirs[static_cast<std::size_t>(r)]);
    }

    // rank 2's step 15 torn by the crash: everyone falls back to step 10, nobody picks the torn file
    const auto torn = dirs[2] / "net-1_15.ckpt";
    test::fs::resize_file(torn, test::fs::file_size(torn) / 2);
    {
        test::LogCapture quiet;
        got = agree(dirs);
    }
    for (const auto& g : got) {
        REQUIRE(g.file);
        CHECK(g.step == 10);
    }
    CHECK(test::fs::exists(torn));  // offered by nobody, deleted by nobody

    // a rank with nothing (the job restarted on more ranks): no common step, a fresh start
    // everywhere, and every rank can say what was found and why it cannot be used
    dirs.push_back(tmp / "rank_3");
    test::LogCapture quiet;  // rank 2's torn file, not offered
    for (const auto& g : agree(dirs)) {
        CHECK_FALSE(g.file);
        CHECK(g.why_none.find("rank 1 holds epoch 1 step 20 and 3 older") != std::string::npos);
        CHECK(g.why_none.find("rank(s) 3 hold none") != std::string::npos);
    }
    // nothing anywhere: nothing to say
    std::vector<test::fs::path> empty{tmp / "e0", tmp / "e1"};
    for (const auto& g : agree(empty)) CHECK(g.why_none.empty());
    // checkpoints of another prefix only (the job restarted with another prefix): said
    save_step(empty[0], 1, 80, "old");
    const auto other = agree(empty);
    CHECK_FALSE(other[0].file);
    CHECK(other[0].why_none.find("holds 1 checkpoint(s) of another prefix or naming, such as 'old-1_80.ckpt'") !=
          std::string::npos);
}

TEST_CASE("membership: a worker asking for a generation the job has left behind is told so") {
    test::TempDir tmp;
    fault::FileStore store((tmp / "store").string());
    const fault::MembershipOptions quick{std::chrono::milliseconds(500), std::chrono::milliseconds(0), std::chrono::seconds(5)};
    fault::Membership a(store, 0, 2, quick), b(store, 1, 2, quick);
    // both form generation 1; node 0 alone goes on to 2 and 3 (node 1 declared failed in each)
    std::thread t([&] { b.form(1, fault::Membership::everyone); });
    CHECK(a.form(1, fault::Membership::everyone).members == std::vector<int>{0, 1});
    t.join();
    b.declare_failed(1);
    CHECK(a.form(2, fault::Membership::survivors, {0, 1}).members == std::vector<int>{0});
    b.declare_failed(2);
    CHECK(a.form(3, fault::Membership::survivors, {0}).members == std::vector<int>{0});
    CHECK_THROWS_WITH_AS(b.form(2, fault::Membership::survivors, {0, 1}),
                         doctest::Contains("node 1 asks to join generation 2, but the job in"), fault::PeerFailure);
    CHECK_THROWS_WITH_AS(b.form(2, fault::Membership::survivors, {0, 1}), doctest::Contains("has gone on to generation 3"),
                         fault::PeerFailure);
}

TEST_CASE("membership, elastic: a dead node is waited for a while only, one that comes later joins the next generation") {
    test::TempDir tmp;
    fault::FileStore store((tmp / "store").string());
    using ms = std::chrono::milliseconds;
    const fault::MembershipOptions quick{ms(500), ms(0), ms(400)};  // lease, cooldown, timeout
    fault::Membership a(store, 0, 3, quick), b(store, 1, 3, quick);  // node 2 has not started
    auto both = [&](int number) {
        // timed from before either node starts: the wait may count from the first to arrive,
        // which can be b
        const auto began = std::chrono::steady_clock::now();
        std::thread t([&] { b.form_elastic(number, ms(300), ms(5000)); });
        const auto members = a.form_elastic(number, ms(300), ms(5000)).members;
        t.join();
        return std::pair{members, std::chrono::steady_clock::now() - began};
    };
    // the first generation: node 2, never registered, may be starting late: waited for as
    // long as form() waits (twice the timeout, and the cooldown)
    const auto first = both(1);
    CHECK(first.first == std::vector<int>{0, 1});
    CHECK(first.second >= ms(800));
    // later ones: 300 ms only
    const auto second = both(2);
    CHECK(second.first == std::vector<int>{0, 1});
    CHECK(second.second >= ms(300));
    CHECK(a.joined(3).empty());
    // node 2 starts while 0 and 1 train in generation 2: it joins generation 3 and waits for
    // them (they are alive), however long its wait for the dead
    fault::Membership c(store, 2, 3, quick);
    std::vector<int> formed;
    std::thread joiner([&] { formed = c.form_elastic(a.latest() + 1, ms(0), ms(5000)).members; });
    while (a.joined(3).empty()) std::this_thread::sleep_for(ms(5));
    CHECK(a.joined(3) == std::vector<int>{2});
    std::this_thread::sleep_for(ms(100));
    CHECK(formed.empty());
    // at their checkpoint, 0 and 1 form generation 3 with it
    std::thread t3([&] { b.form_elastic(3, ms(0), ms(5000)); });
    CHECK(a.form_elastic(3, ms(0), ms(5000)).members == std::vector<int>{0, 1, 2});
    t3.join();
    joiner.join();
    CHECK(formed == std::vector<int>{0, 1, 2});
}

TEST_CASE("agree_on_checkpoint over two levels: a step counts when either level holds it whole, the local copy first") {
    test::TempDir tmp;
    const auto local = [&](int r) { return tmp / ("local_" + std::to_string(r)); };
    const auto shared = [&](int r) { return tmp / ("shared_" + std::to_string(r)); };
    // both ranks saved steps 5 and 10 on both levels, and step 15 locally (not copied yet)
    for (int r = 0; r < 2; ++r) {
        for (int s : {5, 10}) {
            save_step(local(r), 1, s);
            save_step(shared(r), 1, s);
        }
        save_step(local(r), 1, 15);
    }
    // rank 1's node is replaced: its local level is gone, and with it step 15
    test::fs::remove_all(local(1));
    std::vector<fault::AgreedCheckpoint> got(2);
    test::LogCapture log;
    fault::ThreadGroup group(2, std::chrono::seconds(10));
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        const int r = comm.rank();
        got[static_cast<std::size_t>(r)] = fault::agree_on_checkpoint(comm, {ckpt::Path(local(r)), ckpt::Path(shared(r))}, "net");
    }).rethrow();
    REQUIRE(got[0].file);
    REQUIRE(got[1].file);
    CHECK(got[0].step == 10);
    CHECK(got[1].step == 10);
    CHECK(*got[0].file == local(0) / "net-1_10.ckpt");   // the local copy where there is one
    CHECK(*got[1].file == shared(1) / "net-1_10.ckpt");  // the durable one where there is not, said
    CHECK(std::any_of(log.infos.begin(), log.infos.end(), [&](const std::string& m) {
        return m.find("resuming from '" + (shared(1) / "net-1_10.ckpt").string()) != std::string::npos;
    }));
}
