// UCE in-place repair over ThreadComm with the AscendModel device: a UCE on any rank, rank
// 0 included, at several steps and in parameters or optimizer state, is repaired from a
// replica and training ends bit-identical to a run without it.
#include <doctest/doctest.h>

#include <fault/fault.hpp>

#include "dp_support.hpp"
#include "support.hpp"

namespace {

using test::Params;

struct Uce {
    std::vector<int> ranks;
    std::int64_t step = 0;
    std::string tensor;
    bool repairable = true;
};

struct Result {
    Params params;
    std::vector<std::vector<fault::RepairRecord>> records;
    std::vector<int> repairs;
    std::vector<std::exception_ptr> errors;
    std::vector<fault::LastWordsOutcome> last_words;
};

/// 4 ranks on AscendModel devices with UCE repair and, behind it, last words in `dir`.
Result train(const Uce& uce, int shard_size = 1, const boost::filesystem::path& dir = {}, std::int64_t epochs = 3) {
    const int ranks = 4;
    fault::ThreadGroup group(ranks, std::chrono::seconds(20));
    Result res{Params(ranks), std::vector<std::vector<fault::RepairRecord>>(ranks), std::vector<int>(ranks), {},
               std::vector<fault::LastWordsOutcome>(ranks)};
    test::TempDir scratch;
    res.errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = test::shard_of(ranks, comm.rank(), /*shuffle=*/false);
        nn::UceNet net(5);
        test::DpStack stack(net, comm, shard_size);
        nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
        fault::AscendModel device(comm.rank());
        fault::attach(device, trainer.load_target());
        const fault::ShardLayout layout{shard_size};
        fault::UceRepair repair(comm, device, {.layout = layout});
        fault::LastWordsCheckpoint last_words(comm, dir.empty() ? scratch.path() : dir, {.layout = layout});
        const auto i = static_cast<std::size_t>(comm.rank());
        const bool hit = std::find(uce.ranks.begin(), uce.ranks.end(), comm.rank()) != uce.ranks.end();
        fault::InjectUce inject(device, uce.tensor, hit ? uce.step : 0, comm.rank(), uce.repairable);
        try {
            trainer.train(epochs, data, nn::callbacks(repair, inject, last_words));
        } catch (...) {
            res.last_words[i] = last_words.outcome();
            throw;
        }
        res.params[i] = test::flat(net.parameters());
        res.records[i] = repair.records();
        res.repairs[i] = device.repairs();
    });
    return res;
}

void require_no_error(const Result& r) {
    for (const auto& e : r.errors)
        if (e) std::rethrow_exception(e);
}

}  // namespace

TEST_CASE("a UCE on any rank at any step is repaired in place from a replica, bit-exact, with and without sharding") {
    const Result clean = train({});
    require_no_error(clean);
    for (int r = 1; r < 4; ++r) CHECK(clean.params[static_cast<std::size_t>(r)] == clean.params[0]);
    struct Case {
        Uce uce;
        int shard_size;
        int source;
    };
    // sharded in 2, the replica groups are {0, 2} and {1, 3}: the source keeps the same piece
    for (const Case& c : {Case{{{0}, 3, "layer1.param"}, 1, 1}, Case{{{2}, 10, "moments.layer2.weight"}, 1, 0},
                          Case{{{3}, 23, "layer3.bias"}, 1, 0}, Case{{{0}, 5, "moments.layer1.param"}, 2, 2},
                          Case{{{3}, 17, "layer2.weight"}, 2, 1}}) {
        CAPTURE(c.uce.ranks[0]);
        CAPTURE(c.uce.step);
        CAPTURE(c.shard_size);
        const Result got = train(c.uce, c.shard_size);
        require_no_error(got);
        for (int r = 0; r < 4; ++r) {
            CHECK(got.params[static_cast<std::size_t>(r)] == clean.params[0]);
            const auto& recs = got.records[static_cast<std::size_t>(r)];
            REQUIRE(recs.size() == 1);
            CHECK(recs[0].repaired_rank == c.uce.ranks[0]);
            CHECK(recs[0].global_step == c.uce.step);
            CHECK(recs[0].source_rank == c.source);
            CHECK(recs[0].redone);
            CHECK(got.repairs[static_cast<std::size_t>(r)] == (r == c.uce.ranks[0] ? 1 : 0));
        }
    }
}

TEST_CASE("a device that cannot be repaired: the survivors fall back to the last words, and resuming is bit-exact") {
    const Result clean = train({});
    require_no_error(clean);
    test::TempDir dir;
    test::LogCapture log;
    const Result got = train({{1}, 9, "layer2.weight", /*repairable=*/false}, 1, dir.path());
    REQUIRE(got.errors[1]);
    CHECK_THROWS_WITH_AS(std::rethrow_exception(got.errors[1]), doctest::Contains("device of rank 1 cannot be repaired"),
                         fault::RepairFailed);
    for (int r : {0, 2, 3}) {
        const auto& o = got.last_words[static_cast<std::size_t>(r)];
        INFO(o.message);
        REQUIRE(o.step);
        CHECK(*o.step == 9);  // the UCE surfaced at the start of step 10: step 9 is whole on the replicas
        CHECK(o.saver == 0);
    }
    const auto file = fault::latest_last_words(dir.path());
    REQUIRE(file);
    CHECK(file->filename() == "ttp_rank_0-2_1.ckpt");

    // resume on a new job (new devices) from the last words: the same bits as the clean run
    fault::ThreadGroup group(4, std::chrono::seconds(20));
    Params params(4);
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = test::shard_of(4, comm.rank(), /*shuffle=*/false);
        nn::UceNet net(5);
        test::DpStack stack(net, comm, 1);
        nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
        const auto rp = trainer.resume_from(*file, data);
        stack.opt().set_completed_steps(rp.global_step);
        trainer.train(3, data, {}, rp.initial_epoch);
        params[static_cast<std::size_t>(comm.rank())] = test::flat(net.parameters());
    });
    for (const auto& e : errors) REQUIRE_FALSE(e);
    for (int r = 0; r < 4; ++r) CHECK(params[static_cast<std::size_t>(r)] == clean.params[0]);
}

TEST_CASE("UCEs on both ranks keeping a piece: no replica to repair from, the last words say which group, write nothing") {
    test::TempDir dir;
    test::LogCapture log;
    const Result got = train({{0, 2}, 7, "moments.layer3.weight"}, 2, dir.path());
    for (int r : {0, 2}) CHECK_THROWS_WITH_AS(std::rethrow_exception(got.errors[static_cast<std::size_t>(r)]),
                                              doctest::Contains("has no healthy replica of its state piece 0"),
                                              fault::RepairFailed);
    for (int r : {1, 3}) {
        const auto& o = got.last_words[static_cast<std::size_t>(r)];
        try {
            std::rethrow_exception(got.errors[static_cast<std::size_t>(r)]);
        } catch (const fault::PeerFailure& e) {
            const std::string what = e.what();
            INFO(what);
            CHECK(e.ranks() == std::vector<int>{0, 2});  // the ranks that could not be repaired
            CHECK(o.took_part);
        } catch (const std::exception& e) {
            FAIL("rank " << r << " failed with another error than PeerFailure: " << e.what());
        }
        CHECK_FALSE(o.step_directory);
        CHECK(o.message.find("replica group 0 (ranks 0, 2): rank 0 failed, rank 2 failed") != std::string::npos);
    }
    CHECK(test::names_in(dir.path()).empty());
}

TEST_CASE("the AscendModel: a UCE surfaces on the next touch, stop, clean, repair in order, capacity") {
    fault::AscendModel dev(3, 64);
    std::vector<float> a(8, 1.0f), b(8, 2.0f), c(16);
    dev.attach("a", a);
    dev.attach("b", b);
    CHECK_THROWS_WITH_AS(dev.attach("c", c), doctest::Contains("'c' needs 64 bytes, 0 of 64 are free"),
                         fault::DeviceOutOfMemory);
    CHECK(dev.holds("a"));
    CHECK_FALSE(dev.holds("c"));
    // an injection aimed at a tensor the device does not hold is refused when it is set up
    CHECK_THROWS_WITH_AS(fault::InjectUce(dev, "nosuch", 40, 0), doctest::Contains("holds no tensor 'nosuch'"),
                         ckpt::ConfigError);
    dev.inject_uce("b", 2, 3);
    CHECK(b[2] != 2.0f);  // the bits are really damaged
    CHECK(dev.health() == fault::Health::healthy);  // not yet noticed
    dev.touch("a");
    try {
        dev.touch("b");
        FAIL("no error");
    } catch (const fault::DeviceMemoryError& e) {
        CHECK(e.code() == fault::AscendModel::mem_error_code);
        CHECK(e.tensor() == "b");
        CHECK(std::string(e.what()).find("touching 'b', floats 2-4") != std::string::npos);
    }
    CHECK(dev.health() == fault::Health::uce);
    CHECK_THROWS_AS(dev.synchronize(), fault::DeviceMemoryError);
    CHECK_THROWS_AS(dev.clean(), ckpt::ConfigError);
    dev.stop();
    CHECK_THROWS_AS(dev.touch("a"), fault::DeviceMemoryError);  // a stopped device runs nothing
    CHECK_THROWS_AS(dev.repair(), ckpt::ConfigError);
    dev.clean();
    dev.repair();
    CHECK(dev.health() == fault::Health::healthy);
    dev.touch_all();
    std::vector<float> host(8, 7.0f);
    dev.copy_to_device("b", host);
    CHECK(b == host);
    std::vector<float> small(3);
    CHECK_THROWS_AS(dev.copy_to_host("b", small), ckpt::ConfigError);
    CHECK_THROWS_AS(dev.touch("nope"), ckpt::ConfigError);
}

TEST_CASE("UCE repair and last words refuse a job without a replica") {
    fault::ThreadGroup alone(1);
    fault::ThreadComm comm(alone, 0);
    fault::AscendModel dev;
    CHECK_THROWS_WITH_AS(fault::UceRepair(comm, dev), doctest::Contains("needs a replica"), ckpt::ConfigError);
}
