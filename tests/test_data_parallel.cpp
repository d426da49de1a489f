// Data parallelism over ThreadComm: sharded batches, averaged gradients, identical
// replicas, phase reports, and a peer failure that leaves the survivors consistent.
#include <doctest/doctest.h>

#include <fault/fault.hpp>

#include <array>
#include <cmath>

#include "dp_support.hpp"
#include "support.hpp"

namespace {

nn::MnistDataset mlp_data(std::size_t n, std::size_t batch) {
    nn::MnistDataset ds(CKPT_FASHION_MNIST_DIR, nn::Usage::test);
    ds.take(n).map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()}).batch(batch, true);
    return ds;
}

using test::flat;
using test::DpOpt;

/// Trains UceNet data-parallel on `ranks` threads; returns each rank's final parameters.
std::vector<std::vector<float>> train_dp(int ranks, std::int64_t epochs, std::vector<std::exception_ptr>* errors = nullptr,
                                         std::vector<fault::PhaseReport>* reports = nullptr, int fail_rank = -1,
                                         std::int64_t fail_step = 0) {
    fault::ThreadGroup group(ranks, std::chrono::seconds(20));
    std::vector<std::vector<float>> params(static_cast<std::size_t>(ranks));
    if (reports) reports->assign(static_cast<std::size_t>(ranks), {});
    auto errs = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = mlp_data(256, 32);
        data.shard(static_cast<std::size_t>(ranks), static_cast<std::size_t>(comm.rank()));
        nn::UceNet net(/*seed=*/static_cast<std::uint64_t>(comm.rank()) + 7);  // different on purpose
        fault::broadcast_parameters(comm, net.parameters());
        nn::Momentum inner(net.parameters(), 0.01, 0.9);
        DpOpt opt(inner, comm);
        nn::Trainer<nn::UceNet, DpOpt> trainer(net, opt, {}, comm.rank());
        nn::FailAtStep crash(fail_step, fail_rank);
        try {
            trainer.train(epochs, data, crash);
        } catch (...) {
            if (reports) (*reports)[static_cast<std::size_t>(comm.rank())] = opt.report();
            params[static_cast<std::size_t>(comm.rank())] = flat(net.parameters());
            throw;
        }
        if (reports) (*reports)[static_cast<std::size_t>(comm.rank())] = opt.report();
        params[static_cast<std::size_t>(comm.rank())] = flat(net.parameters());
    });
    if (errors) *errors = errs;
    else
        for (const auto& e : errs)
            if (e) std::rethrow_exception(e);
    return params;
}

}  // namespace

TEST_CASE("shards of a batch are its consecutive slices, uneven sharding is refused") {
    auto whole = mlp_data(64, 16);
    nn::Batch all, part;
    whole.load_batch(1, 2, all);
    std::vector<std::int32_t> joined;
    for (std::size_t s = 0; s < 4; ++s) {
        auto shard = mlp_data(64, 16);
        shard.shard(4, s);
        CHECK(shard.steps_per_epoch() == whole.steps_per_epoch());
        shard.load_batch(1, 2, part);
        REQUIRE(part.labels.size() == 4);
        joined.insert(joined.end(), part.labels.begin(), part.labels.end());
        CHECK(part.images(0, 0, 3, 5) == all.images(4 * s, 0, 3, 5));
    }
    CHECK(joined == all.labels);
    auto odd = mlp_data(64, 16);
    CHECK_THROWS_WITH_AS(odd.shard(3, 0), doctest::Contains("needs a batch size they divide"), ckpt::ConfigError);
    nn::MnistDataset keep_remainder(CKPT_FASHION_MNIST_DIR, nn::Usage::test);
    keep_remainder.take(64).batch(16);
    CHECK_THROWS_AS(keep_remainder.shard(2, 1), ckpt::ConfigError);
    CHECK_THROWS_AS(whole.shard(2, 2), ckpt::ConfigError);
}

TEST_CASE("data-parallel replicas stay identical, repeat bit for bit, and match one process closely") {
    const auto a = train_dp(4, 2);
    for (int r = 1; r < 4; ++r) CHECK(a[static_cast<std::size_t>(r)] == a[0]);
    CHECK(train_dp(4, 2)[2] == a[0]);
    // one process, the same global batches: the same training up to the order of additions
    nn::UceNet net(7);
    nn::Momentum opt(net.parameters(), 0.01, 0.9);
    nn::Trainer<nn::UceNet, nn::Momentum> trainer(net, opt);
    auto data = mlp_data(256, 32);
    trainer.train(2, data);
    const auto single = flat(net.parameters());
    REQUIRE(single.size() == a[0].size());
    double worst = 0;
    for (std::size_t i = 0; i < single.size(); ++i) worst = std::max(worst, double(std::abs(single[i] - a[0][i])));
    CHECK(worst < 1e-4);
    CHECK(worst > 0);  // the additions are ordered differently: not the same bits
}

TEST_CASE("a rank failing in its step leaves the others consistent, reporting the last step they completed") {
    std::vector<std::exception_ptr> errors;
    std::vector<fault::PhaseReport> reports;
    const auto params = train_dp(4, 2, &errors, &reports, /*fail_rank=*/2, /*fail_step=*/5);
    REQUIRE(errors[2]);
    CHECK_THROWS_AS(std::rethrow_exception(errors[2]), nn::InjectedFault);
    // rank 2 failed after its update of step 5; the others completed step 5 and failed
    // while reducing the gradients of step 6, before touching their parameters
    CHECK(reports[2].completed_step == 5);
    for (int r : {0, 1, 3}) {
        INFO("rank " << r);
        REQUIRE(errors[static_cast<std::size_t>(r)]);
        try {
            std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
        } catch (const fault::PeerFailure& e) {
            CHECK(e.ranks() == std::vector<int>{2});
        }
        CHECK(reports[static_cast<std::size_t>(r)].completed_step == 5);
        CHECK(reports[static_cast<std::size_t>(r)].consistent());
        CHECK(params[static_cast<std::size_t>(r)] == params[2]);  // all hold step 5's parameters
    }
}

TEST_CASE("sharded optimizer state: the same bits as unsharded, each rank keeping only its piece") {
    for (const int shard_size : {1, 2, 4}) {
        CAPTURE(shard_size);
        fault::ThreadGroup group(4, std::chrono::seconds(20));
        std::vector<std::vector<float>> params(4);
        std::vector<std::size_t> state_sizes(4);
        const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            auto data = test::shard_of(4, comm.rank());
            nn::UceNet net(7);
            test::DpStack stack(net, comm, shard_size);
            nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
            trainer.train(2, data);
            params[static_cast<std::size_t>(comm.rank())] = test::flat(net.parameters());
            for (const auto& [name, value] : stack.opt().state_dict())
                state_sizes[static_cast<std::size_t>(comm.rank())] += value.get_if<ckpt::Tensor>()->numel();
        });
        for (const auto& e : errors) REQUIRE_FALSE(e);
        std::vector<std::vector<float>> unsharded(4);
        if (shard_size == 1) continue;
        fault::ThreadGroup plain(4, std::chrono::seconds(20));
        fault::run_ranks(plain, [&](fault::ThreadComm& comm) {
            auto data = test::shard_of(4, comm.rank());
            nn::UceNet net(7);
            test::DpStack stack(net, comm, 1);
            nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
            trainer.train(2, data);
            unsharded[static_cast<std::size_t>(comm.rank())] = test::flat(net.parameters());
        }).rethrow();
        for (int r = 0; r < 4; ++r) CHECK(params[static_cast<std::size_t>(r)] == unsharded[0]);
        const std::size_t total = unsharded[0].size();
        std::size_t kept = 0;
        for (auto n : state_sizes) {
            CHECK(n <= total / static_cast<std::size_t>(shard_size) + 6);  // 6 tensors: at most one more each
            kept += n;
        }
        CHECK(kept == total * 4 / static_cast<std::size_t>(shard_size));
    }
}

TEST_CASE("a peer failing while the updated pieces are exchanged: the update is undone, the state is whole") {
    fault::ThreadGroup group(4, std::chrono::seconds(20));
    std::vector<std::vector<float>> params(4);
    std::array<bool, 4> consistent{};  // not vector<bool>: its bits share words, and the ranks write at once
    std::vector<std::int64_t> completed(4);
    struct FailBeforeExchange {  // rank 1 leaves after the gradients of step 3 are reduced
        void on_before_update(nn::RunContext& c) {
            if (c.rank == 1 && c.global_step == 2) throw nn::InjectedFault("before the update", 1, 3);
        }
    };
    struct Observe {
        std::array<bool, 4>* consistent;
        void on_exception(nn::RunContext& c) { (*consistent)[static_cast<std::size_t>(c.rank)] = c.consistent; }
    };
    std::vector<std::vector<float>> at_step2(4);
    struct Snapshot {
        std::vector<std::vector<float>>* out;
        nn::UceNet* net;
        void on_step_end(nn::RunContext& c) {
            if (c.global_step == 2) (*out)[static_cast<std::size_t>(c.rank)] = test::flat(net->parameters());
        }
    };
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = test::shard_of(4, comm.rank());
        nn::UceNet net(7);
        test::DpStack stack(net, comm, 2);
        nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
        FailBeforeExchange fail;
        Observe observe{&consistent};
        Snapshot snap{&at_step2, &net};
        const auto r = static_cast<std::size_t>(comm.rank());
        try {
            trainer.train(1, data, nn::callbacks(snap, fail, observe));
        } catch (...) {
            params[r] = test::flat(net.parameters());
            completed[r] = stack.opt().report().completed_step;
            throw;
        }
    });
    CHECK(errors.any());  // the injected failure
    for (int r : {0, 2, 3}) {
        CAPTURE(r);
        const auto i = static_cast<std::size_t>(r);
        CHECK(consistent[i]);
        CHECK(completed[i] == 2);
        CHECK(params[i] == at_step2[i]);  // the parameters of step 2, untouched
    }
}

TEST_CASE("a shard size must divide the ranks, and fault tolerance needs a replica of every piece") {
    fault::ThreadGroup group(4);
    fault::ThreadComm comm(group, 0);
    nn::UceNet net(7);
    CHECK_THROWS_WITH_AS(fault::OptimizerShard(net.parameters(), fault::ShardLayout{3}, comm),
                         doctest::Contains("shard size 3 does not divide the 4 data-parallel ranks"), ckpt::ConfigError);
    fault::OptimizerShard whole(net.parameters(), fault::ShardLayout{4}, comm);  // training alone is fine
    nn::Momentum inner(whole.parameters(), 0.01, 0.9);
    fault::OptimizerShard halves(net.parameters(), fault::ShardLayout{2}, comm);
    CHECK_THROWS_WITH_AS(test::DpOpt(inner, comm, halves), doctest::Contains("built on OptimizerShard::parameters()"), ckpt::ConfigError);
    test::TempDir dir;
    CHECK_THROWS_WITH_AS(fault::LastWordsCheckpoint(comm, dir.path(), {.layout = {4}}),
                         doctest::Contains("keep a single copy of each piece"), ckpt::ConfigError);
    fault::AscendModel device;
    CHECK_THROWS_WITH_AS(fault::UceRepair(comm, device, {.layout = {4}}), doctest::Contains("UCE repair needs a replica"),
                         ckpt::ConfigError);
}
