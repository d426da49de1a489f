// The last-words checkpoint over ThreadComm: any rank may fail, rank 0 included; the
// survivors save the newest consistent step from a healthy replica; resuming from it ends
// bit-identical to a run that never failed.
#include <doctest/doctest.h>

#include <fault/fault.hpp>

#include <signal.h>

#include "support.hpp"

namespace {

using test::TempDir;
namespace fs = boost::filesystem;
using DpOpt = fault::DataParallelOptimizer<nn::Momentum, fault::ThreadComm>;
using Opt = nn::FailingOptimizer<DpOpt>;

/// When the failing rank fails, relative to the update of its failing step.
enum class When { before_update, during_update, after_update };
using Params = std::vector<std::vector<float>>;

nn::MnistDataset shard_of(int ranks, int rank) {
    nn::MnistDataset ds(CKPT_FASHION_MNIST_DIR, nn::Usage::test);
    ds.take(256).map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()}).batch(32, true).shuffle(3);
    ds.shard(static_cast<std::size_t>(ranks), static_cast<std::size_t>(rank));
    return ds;
}

std::vector<float> flat(const std::vector<nn::Parameter*>& params) {
    std::vector<float> out;
    for (const nn::Parameter* p : params) out.insert(out.end(), p->value.begin(), p->value.end());
    return out;
}

struct Job {
    int ranks = 4;
    std::int64_t epochs = 3;  // 8 steps each
    int fail_rank = -1;
    std::int64_t fail_step = 0;
    fs::path last_words_dir;
    bool recover = false;
    When when = When::after_update;
};

struct Run {
    Job job;
    std::vector<fault::LastWordsOutcome> outcomes;
    std::vector<std::exception_ptr> errors;

    Params run() {
        const auto [ranks, epochs, fail_rank, fail_step, last_words_dir, recover, when] = job;
        fault::ThreadGroup group(ranks, std::chrono::seconds(20));
        Params params(static_cast<std::size_t>(ranks));
        outcomes.assign(static_cast<std::size_t>(ranks), {});
        errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            auto data = shard_of(ranks, comm.rank());
            nn::UceNet net(11);
            nn::Momentum inner(net.parameters(), 0.01, 0.9);
            DpOpt dp(inner, comm);
            const bool fails_here = comm.rank() == fail_rank;
            Opt opt(dp, fail_step, comm.rank(), fails_here && when == When::during_update);
            nn::Trainer<nn::UceNet, Opt> trainer(net, opt, {}, comm.rank());
            std::int64_t initial_epoch = 0;
            if (recover) {
                const auto file = fault::latest_last_words(last_words_dir);
                REQUIRE(file);
                const auto rp = trainer.resume_from(*file, data);
                dp.set_completed_steps(rp.global_step);
                opt.set_completed_steps(rp.global_step);
                initial_epoch = rp.initial_epoch;
            }
            fault::LastWordsCheckpoint last_words(comm, last_words_dir);
            nn::FailAtStep after(when == When::after_update ? fail_step : 0, fail_rank);
            nn::FailBeforeUpdate before(when == When::before_update ? fail_step : 0, fail_rank);
            try {
                trainer.train(epochs, data, nn::callbacks(after, before, last_words), initial_epoch);
            } catch (...) {
                outcomes[static_cast<std::size_t>(comm.rank())] = last_words.outcome();
                throw;
            }
            params[static_cast<std::size_t>(comm.rank())] = flat(net.parameters());
        });
        return params;
    }
};

}  // namespace

TEST_CASE("last words from a healthy replica, for a failure on rank 0 or another rank, --recover is bit-exact") {
    TempDir clean;
    Run fault_free{Job{.last_words_dir = clean.path()}, {}, {}};
    const Params expected = fault_free.run();
    for (const auto& e : fault_free.errors) REQUIRE_FALSE(e);

    struct Case {
        int failing;
        When when;
    };
    for (const Case c : {Case{0, When::after_update}, Case{2, When::after_update}, Case{0, When::before_update},
                         Case{3, When::during_update}}) {
        CAPTURE(c.failing);
        CAPTURE(static_cast<int>(c.when));
        TempDir dir;
        Run crashed{Job{.fail_rank = c.failing, .fail_step = 11, .last_words_dir = dir.path(), .when = c.when}, {}, {}};
        crashed.run();
        CHECK_THROWS_AS(std::rethrow_exception(crashed.errors[static_cast<std::size_t>(c.failing)]), nn::InjectedFault);
        CHECK_FALSE(crashed.outcomes[static_cast<std::size_t>(c.failing)].took_part);
        const int saver = c.failing == 0 ? 1 : 0;  // the lowest healthy rank
        for (int r = 0; r < 4; ++r) {
            if (r == c.failing) continue;
            const auto& o = crashed.outcomes[static_cast<std::size_t>(r)];
            CHECK(o.took_part);
            CHECK(o.reports.size() == 3);
            REQUIRE(o.step);
            // the failing rank contributed its gradients of step 11 in every case, so the
            // survivors completed step 11 and could not reduce step 12
            CHECK(*o.step == 11);
            CHECK(o.saver == saver);
            REQUIRE(o.step_directory);
            CHECK(o.step_directory->filename() == "tft_saved_checkpoints-step_11");
        }
        // the seed's layout; epoch 2, step 3 of 8
        const std::string rank_dir = "rank_" + std::to_string(saver);
        CHECK(test::names_in(dir.path()) == std::vector<std::string>{"tft_saved_checkpoints-step_11"});
        CHECK(test::names_in(dir / "tft_saved_checkpoints-step_11") == std::vector<std::string>{rank_dir});
        CHECK(test::names_in(dir / "tft_saved_checkpoints-step_11" / rank_dir) ==
              std::vector<std::string>{"ttp_rank_" + std::to_string(saver) + "-2_3.ckpt"});

        Run recovered{Job{.last_words_dir = dir.path(), .recover = true}, {}, {}};
        const Params got = recovered.run();
        for (const auto& e : recovered.errors) REQUIRE_FALSE(e);
        for (int r = 0; r < 4; ++r) CHECK(got[static_cast<std::size_t>(r)] == expected[0]);
    }
}

TEST_CASE("selectors: preference order and avoided ranks") {
    const std::vector<int> candidates{1, 2, 3};
    CHECK(fault::LowestHealthyRank{}.choose(candidates) == 1);
    CHECK(fault::PreferenceOrder{{3, 1}}.choose(candidates) == 3);
    CHECK(fault::PreferenceOrder{{0}}.choose(candidates) == 1);
    CHECK(fault::AvoidRanks{{1, 2}}.choose(candidates) == 3);
    CHECK(fault::AvoidRanks{{1, 2, 3}}.choose(candidates) == 1);
    TempDir dir;
    fault::ThreadGroup group(4, std::chrono::seconds(20));
    // a preference picks the saver
    std::vector<fault::LastWordsOutcome> outcomes(4);
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = shard_of(4, comm.rank());
        nn::UceNet net(11);
        nn::Momentum inner(net.parameters(), 0.01, 0.9);
        DpOpt opt(inner, comm);
        nn::Trainer<nn::UceNet, DpOpt> trainer(net, opt, {}, comm.rank());
        fault::LastWordsCheckpoint<fault::ThreadComm, fault::PreferenceOrder> last_words(comm, dir.path(),
                                                                                         fault::PreferenceOrder{{3}});
        nn::FailAtStep crash(5, 1);
        try {
            trainer.train(1, data, nn::callbacks(crash, last_words));
        } catch (...) {
            outcomes[static_cast<std::size_t>(comm.rank())] = last_words.outcome();
            throw;
        }
    });
    CHECK(outcomes[0].saver == 3);
    CHECK(fs::exists(dir / "tft_saved_checkpoints-step_5/rank_3/ttp_rank_3-1_5.ckpt"));
}

TEST_CASE("a single rank has no replica: last words refuse to start") {
    fault::ThreadGroup alone(1);
    fault::ThreadComm comm(alone, 0);
    TempDir dir;
    CHECK_THROWS_WITH_AS(fault::LastWordsCheckpoint(comm, dir.path()), doctest::Contains("needs a replica"),
                         ckpt::ConfigError);
}

TEST_CASE("a termination signal stops every rank at the same step with last words, resuming is bit-exact") {
    TempDir clean, dir;
    Run fault_free{Job{.last_words_dir = clean.path()}, {}, {}};
    const Params expected = fault_free.run();

    fault::TerminationSignals signals;
    struct RaiseAt {  // rank 2's process "receives" SIGTERM at the end of step 9
        void on_step_end(nn::RunContext& c) {
            if (c.rank == 2 && c.global_step == 9) ::raise(SIGTERM);
        }
    };
    fault::ThreadGroup group(4, std::chrono::seconds(20));
    std::vector<fault::LastWordsOutcome> outcomes(4);
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = shard_of(4, comm.rank());
        nn::UceNet net(11);
        nn::Momentum inner(net.parameters(), 0.01, 0.9);
        DpOpt dp(inner, comm);
        Opt opt(dp, 0, comm.rank(), false);
        nn::Trainer<nn::UceNet, Opt> trainer(net, opt, {}, comm.rank());
        fault::LastWordsCheckpoint last_words(comm, dir.path(), {}, /*watch_signals=*/true);
        RaiseAt raise_at;
        try {
            trainer.train(3, data, nn::callbacks(raise_at, last_words));
        } catch (...) {
            outcomes[static_cast<std::size_t>(comm.rank())] = last_words.outcome();
            throw;
        }
    });
    for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        REQUIRE(errors[static_cast<std::size_t>(r)]);
        try {
            std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
        } catch (const fault::Preempted& p) {
            CHECK(p.signal() == SIGTERM);
        }
        const auto& o = outcomes[static_cast<std::size_t>(r)];
        REQUIRE(o.step);
        CHECK(*o.step == 9);
        CHECK(o.reports.size() == 4);
        CHECK(o.saver == 0);
    }
    fault::TerminationSignals::reset();
    CHECK(fs::exists(dir / "tft_saved_checkpoints-step_9/rank_0/ttp_rank_0-2_1.ckpt"));
    Run recovered{Job{.last_words_dir = dir.path(), .recover = true}, {}, {}};
    const Params got = recovered.run();
    for (const auto& e : recovered.errors) REQUIRE_FALSE(e);
    CHECK(got[1] == expected[0]);
}

TEST_CASE("a second failure during the last words: the saver's write fails, another survivor saves") {
    TempDir dir;
    // On rank 0, the first saver, the state cannot be read when the last words are written:
    // its save fails half way, as a dying disk would make it.
    struct BreakSaver {
        void on_exception(nn::RunContext& c) {
            if (c.rank == 0) c.state = []() -> ckpt::ParamDict { throw ckpt::IoError("disk gone", "/dev/sda", 5); };
        }
    };
    fault::ThreadGroup group(4, std::chrono::seconds(20));
    std::vector<fault::LastWordsOutcome> outcomes(4);
    test::LogCapture log;
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = shard_of(4, comm.rank());
        nn::UceNet net(11);
        nn::Momentum inner(net.parameters(), 0.01, 0.9);
        DpOpt dp(inner, comm);
        Opt opt(dp, 0, comm.rank(), false);
        nn::Trainer<nn::UceNet, Opt> trainer(net, opt, {}, comm.rank());
        fault::LastWordsCheckpoint last_words(comm, dir.path());
        BreakSaver break_saver;
        nn::FailAtStep crash(6, 3);
        try {
            trainer.train(2, data, nn::callbacks(crash, break_saver, last_words));
        } catch (...) {
            outcomes[static_cast<std::size_t>(comm.rank())] = last_words.outcome();
            throw;
        }
    });
    // rank 3 failed; rank 0 was chosen and failed to save; ranks 1 and 2 agreed again
    for (int r : {1, 2}) {
        const auto& o = outcomes[static_cast<std::size_t>(r)];
        CHECK(o.saver == 1);
        CHECK(o.reports.size() == 2);
        REQUIRE(o.step_directory);
    }
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"tft_saved_checkpoints-step_6"});  // no temporary left
    CHECK(test::names_in(dir / "tft_saved_checkpoints-step_6") == std::vector<std::string>{"rank_1"});
    CHECK(fault::latest_last_words(dir.path()));
}
