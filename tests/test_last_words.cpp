// The last-words checkpoint over ThreadComm: any rank may fail, rank 0 included; the
// survivors save the newest consistent step from a healthy replica; resuming from it ends
// bit-identical to a run that never failed.
#include <doctest/doctest.h>

#include <fault/fault.hpp>

#include <signal.h>

#include "dp_support.hpp"
#include "support.hpp"

namespace {

using test::TempDir;
using test::Params;
using test::shard_of;
using test::flat;
namespace fs = boost::filesystem;
using Opt = nn::FailingOptimizer<test::DpOpt>;

/// When the failing rank fails, relative to the update of its failing step.
enum class When { before_update, during_update, after_update };

struct Job {
    int ranks = 4;
    std::int64_t epochs = 2;  // 8 steps each
    std::vector<int> fail_ranks{};
    std::int64_t fail_step = 0;
    fs::path last_words_dir;
    bool recover = false;
    When when = When::after_update;
    int shard_size = 1;
    std::optional<ckpt::Path> durable{};
};

struct LastWordsRun {
    Job job;
    std::vector<fault::LastWordsOutcome> outcomes;
    std::vector<std::exception_ptr> errors;

    Params run() {
        // references, not a structured binding: the rank lambda below captures them
        const int ranks = job.ranks, shard_size = job.shard_size;
        const std::int64_t epochs = job.epochs, fail_step = job.fail_step;
        const auto& fail_ranks = job.fail_ranks;
        const auto& last_words_dir = job.last_words_dir;
        const bool recover = job.recover;
        const When when = job.when;
        fault::ThreadGroup group(ranks, std::chrono::seconds(20));
        Params params(static_cast<std::size_t>(ranks));
        outcomes.assign(static_cast<std::size_t>(ranks), {});
        errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            auto data = shard_of(ranks, comm.rank());
            nn::UceNet net(11);
            test::DpStack stack(net, comm, shard_size);
            const bool fails_here = std::find(fail_ranks.begin(), fail_ranks.end(), comm.rank()) != fail_ranks.end();
            Opt opt(stack.opt(), fail_step, comm.rank(), fails_here && when == When::during_update);
            nn::Trainer<nn::UceNet, Opt> trainer(net, opt, {}, comm.rank());
            const fault::ShardLayout layout{shard_size};
            std::int64_t initial_epoch = 0;
            if (recover) {
                const auto file = fault::latest_last_words(last_words_dir, layout, comm.rank());
                REQUIRE(file);
                const auto rp = trainer.resume_from(*file, data);
                stack.opt().set_completed_steps(rp.global_step);
                opt.set_completed_steps(rp.global_step);
                initial_epoch = rp.initial_epoch;
            }
            fault::LastWordsCheckpoint last_words(comm, last_words_dir,
                                                  {.layout = layout,
                                                   .pieces = [&stack] { return stack.opt().piece_map(); },
                                                   .durable = job.durable});
            const std::int64_t at = fails_here ? fail_step : 0;
            nn::FailAtStep after(when == When::after_update ? at : 0, comm.rank());
            nn::FailBeforeUpdate before(when == When::before_update ? at : 0, comm.rank());
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

TEST_CASE("last words from a healthy replica of every piece, for failures before, during and after the update") {
    TempDir clean;
    LastWordsRun fault_free{Job{.last_words_dir = clean.path()}, {}, {}};
    const Params expected = fault_free.run();
    for (const auto& e : fault_free.errors) REQUIRE_FALSE(e);

    struct Case {
        int failing;
        When when;
    };
    for (const int shard_size : {1, 2}) {
        for (const Case c : {Case{0, When::after_update}, Case{2, When::after_update}, Case{0, When::before_update},
                             Case{3, When::before_update}, Case{3, When::during_update}, Case{0, When::during_update}}) {
            CAPTURE(shard_size);
            CAPTURE(c.failing);
            CAPTURE(static_cast<int>(c.when));
            TempDir dir;
            LastWordsRun crashed{Job{.fail_ranks = {c.failing}, .fail_step = 11, .last_words_dir = dir.path(), .when = c.when,
                            .shard_size = shard_size},
                        {},
                        {}};
            crashed.run();
            CHECK_THROWS_AS(std::rethrow_exception(crashed.errors[static_cast<std::size_t>(c.failing)]), nn::InjectedFault);
            CHECK_FALSE(crashed.outcomes[static_cast<std::size_t>(c.failing)].took_part);
            // Every case but one saves step 11: the failing rank contributed its gradients
            // of step 11, so the survivors completed it and failed reducing step 12. With
            // the state sharded, a rank failing before its update of step 11 also withholds
            // its piece of it: the survivors undo their update and save step 10.
            const std::int64_t saved = shard_size > 1 && c.when == When::before_update ? 10 : 11;
            // the lowest healthy rank of each replica group ({0, 2} and {1, 3} when sharded)
            std::vector<int> savers;
            for (int j = 0; j < shard_size; ++j) savers.push_back(c.failing == j ? j + shard_size : j);
            for (int r = 0; r < 4; ++r) {
                if (r == c.failing) continue;
                const auto& o = crashed.outcomes[static_cast<std::size_t>(r)];
                CHECK(o.took_part);
                CHECK(o.reports.size() == 3);
                INFO(o.message);
                REQUIRE(o.step);
                CHECK(*o.step == saved);
                CHECK(o.savers == savers);
                REQUIRE(o.step_directory);
                CHECK(o.step_directory->filename() == "tft_saved_checkpoints-step_" + std::to_string(saved));
            }
            // the seed's layout: one rank_{r} per replica group; epoch 2, step 3 (or 2) of 8;
            // and the step's global index
            const std::string step_dir = "tft_saved_checkpoints-step_" + std::to_string(saved);
            CHECK(test::names_in(dir.path()) == std::vector<std::string>{step_dir});
            std::vector<std::string> step_entries{"index-step_" + std::to_string(saved) + ".ckpt"};
            for (int s : std::vector<int>{savers.begin(), savers.end()}) step_entries.push_back("rank_" + std::to_string(s));
            std::sort(step_entries.begin(), step_entries.end());
            CHECK(test::names_in(dir / step_dir) == step_entries);
            for (int s : savers)
                CHECK(test::names_in(dir / step_dir / ("rank_" + std::to_string(s))) ==
                      std::vector<std::string>{"ttp_rank_" + std::to_string(s) + "-2_" + std::to_string(saved - 8) + ".ckpt"});

            LastWordsRun recovered{Job{.last_words_dir = dir.path(), .recover = true, .shard_size = shard_size}, {}, {}};
            const Params got = recovered.run();
            for (const auto& e : recovered.errors) REQUIRE_FALSE(e);
            for (int r = 0; r < 4; ++r) CHECK(got[static_cast<std::size_t>(r)] == expected[0]);
        }
    }
}

TEST_CASE("a replica group with no consistent survivor: the message names it, nothing is written or overwritten") {
    TempDir dir;
    // an earlier failure's last words, which must stay as they are
    LastWordsRun earlier{Job{.fail_ranks = {1}, .fail_step = 5, .last_words_dir = dir.path(), .shard_size = 2}, {}, {}};
    earlier.run();
    const fs::path old_file = dir / "tft_saved_checkpoints-step_5/rank_3/ttp_rank_3-1_5.ckpt";
    REQUIRE(fs::exists(old_file));
    const auto old_bytes = test::read_bytes(old_file);

    test::LogCapture log;
    // ranks 0 and 2 keep piece 0 of the optimizer state; both fail
    LastWordsRun crashed{Job{.fail_ranks = {0, 2}, .fail_step = 11, .last_words_dir = dir.path(), .shard_size = 2}, {}, {}};
    crashed.run();
    for (int r : {1, 3}) {
        const auto& o = crashed.outcomes[static_cast<std::size_t>(r)];
        CHECK(o.took_part);
        CHECK_FALSE(o.step);
        CHECK_FALSE(o.step_directory);
        CHECK(o.message.find("replica group 0 (ranks 0, 2): rank 0 failed, rank 2 failed") != std::string::npos);
        CHECK(o.message.find("nothing written") != std::string::npos);
        CHECK_THROWS_AS(std::rethrow_exception(crashed.errors[static_cast<std::size_t>(r)]), fault::PeerFailure);
    }
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"tft_saved_checkpoints-step_5"});
    CHECK(test::read_bytes(old_file) == old_bytes);
}

TEST_CASE("resuming sharded last words: each rank reads its piece, a damaged piece makes the step incomplete") {
    TempDir dir;
    LastWordsRun crashed{Job{.fail_ranks = {1}, .fail_step = 6, .last_words_dir = dir.path(), .shard_size = 2}, {}, {}};
    crashed.run();
    const fs::path step = dir / "tft_saved_checkpoints-step_6";
    const fault::ShardLayout layout{2};
    CHECK(fault::latest_last_words(dir.path(), layout, 0) == step / "rank_0/ttp_rank_0-1_6.ckpt");
    CHECK(fault::latest_last_words(dir.path(), layout, 2) == step / "rank_0/ttp_rank_0-1_6.ckpt");
    CHECK(fault::latest_last_words(dir.path(), layout, 1) == step / "rank_3/ttp_rank_3-1_6.ckpt");
    {
        // the step's global index: one rank unsharded gets the momentum whole, piece 0 from
        // rank 0's file, piece 1 from rank 3's
        nn::UceNet whole(11);
        nn::Momentum momentum(whole.parameters(), 0.01, 0.9);
        ckpt::ParamDict like = whole.state_dict();
        for (auto& [name, value] : momentum.state_dict()) like.set(name, std::move(value));
        const auto got = ckpt::load_resharded(step / "index-step_6.ckpt", like);
        std::vector<float> joined;
        for (const char* file : {"rank_0/ttp_rank_0-1_6.ckpt", "rank_3/ttp_rank_3-1_6.ckpt"}) {
            const ckpt::ParamDict saved = ckpt::load_checkpoint(step / file);  // the values below are a view of it
            const auto piece = saved.get<ckpt::Tensor>("moments.layer1.param").values<float>();
            joined.insert(joined.end(), piece.begin(), piece.end());
        }
        const auto m = got.state.get<ckpt::Tensor>("moments.layer1.param").values<float>();
        CHECK(std::vector<float>(m.begin(), m.end()) == joined);
        CHECK(got.state.get<std::int64_t>("trainer.global_step") == 6);
    }

    // a rank keeping piece 1 refuses the file of piece 0, before changing anything
    fault::ThreadGroup group(4);
    fault::ThreadComm comm(group, 1);
    nn::UceNet net(11);
    test::DpStack stack(net, comm, 2);
    nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, 1);
    auto data = shard_of(4, 1);
    const auto before = flat(net.parameters());
    CHECK_THROWS_WITH_AS(trainer.resume_from(step / "rank_0/ttp_rank_0-1_6.ckpt", data),
                         doctest::Contains("holds optimizer-state piece 0 of 2; rank 1 keeps piece 1 of 2"),
                         ckpt::LoadMismatch);
    CHECK(flat(net.parameters()) == before);

    test::LogCapture log;
    test::flip_bit(step / "rank_3/ttp_rank_3-1_6.ckpt", 200);
    CHECK_FALSE(fault::latest_last_words(dir.path(), layout, 0));
    CHECK(fs::exists(step / "rank_3/ttp_rank_3-1_6.ckpt"));  // reported, not deleted
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
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = shard_of(4, comm.rank());
        nn::UceNet net(11);
        nn::Momentum inner(net.parameters(), 0.01, 0.9);
        test::DpOpt opt(inner, comm);
        nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, opt, {}, comm.rank());
        fault::LastWordsCheckpoint<fault::ThreadComm, fault::PreferenceOrder> last_words(
            comm, dir.path(), {.selector = fault::PreferenceOrder{{3}}});
        nn::FailAtStep crash(5, 1);
        try {
            trainer.train(1, data, nn::callbacks(crash, last_words));
        } catch (...) {
            outcomes[static_cast<std::size_t>(comm.rank())] = last_words.outcome();
            throw;
        }
    });
    CHECK(errors.any());  // the injected failure
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
    LastWordsRun fault_free{Job{.last_words_dir = clean.path()}, {}, {}};
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
        test::DpOpt dp(inner, comm);
        Opt opt(dp, 0, comm.rank(), false);
        nn::Trainer<nn::UceNet, Opt> trainer(net, opt, {}, comm.rank());
        fault::LastWordsCheckpoint last_words(comm, dir.path(), {.watch_signals = true});
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
    LastWordsRun recovered{Job{.last_words_dir = dir.path(), .recover = true}, {}, {}};
    const Params got = recovered.run();
    for (const auto& e : recovered.errors) REQUIRE_FALSE(e);
    CHECK(got[1] == expected[0]);
}

TEST_CASE("a second failure during the last words: a saver's write fails, the others agree again and save") {
    // On rank 0, a saver, the state cannot be read when the last words are written: its
    // save fails half way, as a dying disk would make it.
    struct BreakSaver {
        void on_exception(nn::RunContext& c) {
            if (c.rank == 0) c.state = []() -> ckpt::ParamDict { throw ckpt::IoError("disk gone", "/dev/sda", 5); };
        }
    };
    for (const int shard_size : {1, 2}) {
        CAPTURE(shard_size);
        TempDir dir;
        fault::ThreadGroup group(4, std::chrono::seconds(20));
        std::vector<fault::LastWordsOutcome> outcomes(4);
        test::LogCapture log;
        const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            auto data = shard_of(4, comm.rank());
            nn::UceNet net(11);
            test::DpStack stack(net, comm, shard_size);
            nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
            fault::LastWordsCheckpoint last_words(comm, dir.path(),
                                                  {.layout = {shard_size}, .pieces = [&stack] { return stack.opt().piece_map(); }});
            BreakSaver break_saver;
            nn::FailAtStep crash(6, 3);
            try {
                trainer.train(2, data, nn::callbacks(crash, break_saver, last_words));
            } catch (...) {
                outcomes[static_cast<std::size_t>(comm.rank())] = last_words.outcome();
                throw;
            }
        });
        CHECK(errors.any());  // the injected failure
        // rank 3 failed; rank 0 was chosen and failed to save; ranks 1 and 2 agreed again:
        // rank 1 saves everything, or, sharded, rank 2 piece 0 and rank 1 piece 1
        const auto savers = shard_size == 1 ? std::vector<int>{1} : std::vector<int>{2, 1};
        for (int r : {1, 2}) {
            const auto& o = outcomes[static_cast<std::size_t>(r)];
            CHECK(o.savers == savers);
            CHECK(o.reports.size() == 2);
            REQUIRE(o.step_directory);
        }
        // no temporary left, of either attempt
        CHECK(test::names_in(dir.path()) == std::vector<std::string>{"tft_saved_checkpoints-step_6"});
        CHECK(test::names_in(dir / "tft_saved_checkpoints-step_6") ==
              (shard_size == 1 ? std::vector<std::string>{"index-step_6.ckpt", "rank_1"}
                               : std::vector<std::string>{"index-step_6.ckpt", "rank_1", "rank_2"}));
        for (int r = 0; r < 4; ++r) CHECK(fault::latest_last_words(dir.path(), {shard_size}, r));
    }
}

TEST_CASE("last words with a durable level: the committed step directory is copied whole, and found there") {
    TempDir dir, shared;
    LastWordsRun crashed{Job{.fail_ranks = {2}, .fail_step = 5, .last_words_dir = dir.path(), .durable = shared.path()}, {}, {}};
    crashed.run();
    const std::string step = "tft_saved_checkpoints-step_5";
    REQUIRE(fs::is_directory(dir / step));
    REQUIRE(fs::is_directory(shared / step));
    std::vector<std::string> local_files, durable_files;
    for (fs::recursive_directory_iterator it(dir / step), end; it != end; ++it)
        if (fs::is_regular_file(it->path())) local_files.push_back(fs::relative(it->path(), dir / step).string());
    for (fs::recursive_directory_iterator it(shared / step), end; it != end; ++it)
        if (fs::is_regular_file(it->path())) durable_files.push_back(fs::relative(it->path(), shared / step).string());
    std::sort(local_files.begin(), local_files.end());
    std::sort(durable_files.begin(), durable_files.end());
    CHECK(local_files == durable_files);
    for (const auto& f : local_files) CHECK(test::read_bytes(dir / step / f) == test::read_bytes(shared / step / f));
    for (const auto& n : test::names_in(shared.path())) CHECK(n.find(".tmp-") == std::string::npos);

    const std::vector<ckpt::Path> levels{dir.path(), shared.path()};
    CHECK(fault::latest_last_words(levels, {}, 1) == dir / step / "rank_0/ttp_rank_0-1_5.ckpt");
    fs::remove_all(dir.path());
    test::LogCapture log;
    CHECK(fault::latest_last_words(levels, {}, 1) == shared / step / "rank_0/ttp_rank_0-1_5.ckpt");
    CHECK(std::any_of(log.infos.begin(), log.infos.end(),
                      [](const std::string& m) { return m.find("holds no complete copy") != std::string::npos; }));
}
