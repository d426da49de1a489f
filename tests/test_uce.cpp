// UCE in-place repair over ThreadComm with the AscendModel device: a UCE on any rank, rank
// 0 included, at several steps and in parameters or optimizer state, is repaired from a
// replica and training ends bit-identical to a run without it.
#include <doctest/doctest.h>

#include <fault/fault.hpp>

namespace {

using DpOpt = fault::DataParallelOptimizer<nn::Momentum, fault::ThreadComm>;
using Params = std::vector<std::vector<float>>;

nn::MnistDataset shard_of(int ranks, int rank) {
    nn::MnistDataset ds(CKPT_FASHION_MNIST_DIR, nn::Usage::test);
    ds.take(256).map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()}).batch(32, true);
    ds.shard(static_cast<std::size_t>(ranks), static_cast<std::size_t>(rank));
    return ds;
}

struct Uce {
    int rank = -1;
    std::int64_t step = 0;
    std::string tensor;
};

struct Result {
    Params params;
    std::vector<std::vector<fault::RepairRecord>> records;
    std::vector<int> repairs;
};

Result train(const Uce& uce, std::int64_t epochs = 3) {
    const int ranks = 4;
    fault::ThreadGroup group(ranks, std::chrono::seconds(20));
    Result res{Params(ranks), std::vector<std::vector<fault::RepairRecord>>(ranks), std::vector<int>(ranks)};
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = shard_of(ranks, comm.rank());
        nn::UceNet net(5);
        nn::Momentum inner(net.parameters(), 0.01, 0.9);
        DpOpt opt(inner, comm);
        nn::Trainer<nn::UceNet, DpOpt> trainer(net, opt, {}, comm.rank());
        fault::AscendModel device(comm.rank());
        fault::attach(device, trainer.load_target());
        fault::UceRepair repair(comm, device);
        fault::InjectUce inject(device, uce.tensor, uce.step, uce.rank);
        trainer.train(epochs, data, nn::callbacks(repair, inject));
        const auto i = static_cast<std::size_t>(comm.rank());
        for (const nn::Parameter* p : net.parameters()) res.params[i].insert(res.params[i].end(), p->value.begin(), p->value.end());
        res.records[i] = repair.records();
        res.repairs[i] = device.repairs();
    });
    for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
    return res;
}

}  // namespace

TEST_CASE("a UCE on any rank at any step is repaired in place from a replica, bit-exact") {
    const Result clean = train({});
    for (int r = 1; r < 4; ++r) CHECK(clean.params[static_cast<std::size_t>(r)] == clean.params[0]);
    for (const Uce& uce : {Uce{0, 3, "layer1.param"}, Uce{2, 10, "moments.layer2.weight"}, Uce{3, 23, "layer3.bias"}}) {
        CAPTURE(uce.rank);
        CAPTURE(uce.step);
        const Result got = train(uce);
        for (int r = 0; r < 4; ++r) {
            CHECK(got.params[static_cast<std::size_t>(r)] == clean.params[0]);
            const auto& recs = got.records[static_cast<std::size_t>(r)];
            REQUIRE(recs.size() == 1);
            CHECK(recs[0].repaired_rank == uce.rank);
            CHECK(recs[0].global_step == uce.step);
            CHECK(recs[0].source_rank == (uce.rank == 0 ? 1 : 0));
            CHECK(recs[0].redone);
            CHECK(got.repairs[static_cast<std::size_t>(r)] == (r == uce.rank ? 1 : 0));
        }
    }
}

TEST_CASE("the AscendModel: a UCE surfaces on the next touch, stop, clean, repair in order, capacity") {
    fault::AscendModel dev(3, 64);
    std::vector<float> a(8, 1.0f), b(8, 2.0f), c(16);
    dev.attach("a", a);
    dev.attach("b", b);
    CHECK_THROWS_WITH_AS(dev.attach("c", c), doctest::Contains("'c' needs 64 bytes, 0 of 64 are free"),
                         fault::DeviceOutOfMemory);
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
