// Trainer and ModelCheckpoint on real Fashion-MNIST (a few hundred images): the seed's
// crash-and-resume scenario, bit-exact resume from epoch ends, mid-epoch saves, breakpoint
// files and shuffled data, and the errors of a resume that cannot work.
#include <doctest/doctest.h>

#include <ckpt/codecs/aes_gcm.hpp>
#include <nn/nn.hpp>

#include <csignal>
#include <sstream>

#include "support.hpp"

namespace {

using test::TempDir;
using Checkpoints = nn::ModelCheckpoint<ckpt::EveryEpochs, ckpt::KeepLast>;

nn::MnistDataset lenet_data(std::size_t n = 256, std::size_t batch = 32, std::optional<std::uint64_t> shuffle = {}) {
    nn::MnistDataset ds(CKPT_FASHION_MNIST_DIR, nn::Usage::test);
    ds.take(n).map({nn::Rescale(1.0 / 255.0, 0), nn::Resize(32, 32), nn::HWC2CHW()}).batch(batch, true);
    if (shuffle) ds.shuffle(*shuffle);
    return ds;
}

/// A fresh "process": network, optimizer and trainer built from nothing.
struct Session {
    nn::LeNet5 net;
    nn::Momentum opt{net.parameters(), 0.01, 0.9};
    nn::Trainer<nn::LeNet5, nn::Momentum> trainer{net, opt};
    /// Parameters and optimizer state, as bytes.
    std::vector<float> state() {
        std::vector<float> out;
        for (auto& [name, v] : trainer.load_target()) {
            auto vals = v.get_if<ckpt::Tensor>()->values<float>();
            out.insert(out.end(), vals.begin(), vals.end());
        }
        return out;
    }
};

std::vector<float> uninterrupted(std::int64_t epochs, nn::MnistDataset data) {
    Session s;
    s.trainer.train(epochs, data);
    return s.state();
}

}  // namespace

TEST_CASE("the seed's scenario: fail after epoch 6, resume from the latest, the seed's tree, bit-exact") {
    TempDir dir;
    const auto expected = uninterrupted(10, lenet_data(64));
    {
        Session s;
        auto data = lenet_data(64);
        Checkpoints cb(dir.path(), "lenet", test::seed_options());
        nn::FailAtEpochEnd crash(6);
        CHECK_THROWS_AS(s.trainer.train(10, data, nn::callbacks(cb, crash)), nn::InjectedFault);
    }
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{"lenet-2_2.ckpt", "lenet-3_2.ckpt", "lenet-4_2.ckpt",
                                                                 "lenet-5_2.ckpt", "lenet-6_2.ckpt", "lenet-graph.meta"});
    const auto latest = ckpt::latest(dir.path(), "lenet");
    REQUIRE(latest);
    CHECK(latest->filename() == "lenet-6_2.ckpt");
    const auto dict = ckpt::load_checkpoint(*latest);
    CHECK(dict.get<std::int64_t>("epoch_num") == 6);
    CHECK(dict.get<std::int64_t>("step_num") == 12);
    CHECK(dict.get<double>("lr") == 0.01);
    CHECK(dict.contains("moments.fc3.bias"));
    Session s;
    auto data = lenet_data(64);
    const nn::ResumePoint rp = s.trainer.resume_from(*latest, data);
    CHECK(rp.initial_epoch == 6);
    CHECK(rp.initial_step == 0);
    Checkpoints cb(dir.path(), "lenet", test::seed_options());
    s.trainer.train(10, data, cb, rp.initial_epoch);
    CHECK(s.state() == expected);
    CHECK(test::names_in(dir.path()) ==
          std::vector<std::string>{"lenet-2_2.ckpt", "lenet-3_2.ckpt", "lenet-4_2.ckpt", "lenet-5_2.ckpt",
                                   "lenet-6_2.ckpt", "lenet-graph.meta", "lenet.finished", "lenet_1-10_2.ckpt",
                                   "lenet_1-7_2.ckpt", "lenet_1-8_2.ckpt", "lenet_1-9_2.ckpt", "lenet_1-graph.meta"});
}

TEST_CASE("a crash mid-epoch resumes through set_init_step from a step checkpoint, shuffled, bit-exact") {
    TempDir dir;
    const auto expected = uninterrupted(3, lenet_data(256, 32, 7));
    {
        Session s;
        auto data = lenet_data(256, 32, 7);
        nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepLast> cb(dir.path(), "lenet", {}, ckpt::EverySteps(3),
                                                                 ckpt::KeepLast(2));
        nn::FailAtStep crash(13);  // epoch 2, step 5; the last save was at global step 12
        CHECK_THROWS_AS(s.trainer.train(3, data, nn::callbacks(cb, crash)), nn::InjectedFault);
    }
    Session s;
    auto data = lenet_data(256, 32, 7);
    const nn::ResumePoint rp = s.trainer.resume_or_start(dir.path(), "lenet", data);
    REQUIRE(rp.file);
    CHECK(rp.file->filename() == "lenet-2_4.ckpt");
    CHECK(rp.initial_epoch == 1);
    CHECK(rp.initial_step == 4);
    CHECK(rp.global_step == 12);
    s.trainer.train(3, data, std::tuple<>{}, rp.initial_epoch);
    CHECK(s.state() == expected);
}

TEST_CASE("the exception-save breakpoint file is a resume point, bit-exact") {
    TempDir dir;
    const auto expected = uninterrupted(2, lenet_data());
    {
        Session s;
        auto data = lenet_data();
        Checkpoints cb(dir.path(), "lenet", test::seed_options(/*exception_save=*/true));
        nn::FailAtStep crash(11);  // epoch 2 step 3, no regular save since epoch 1
        CHECK_THROWS_AS(s.trainer.train(2, data, nn::callbacks(cb, crash)), nn::InjectedFault);
        REQUIRE(cb.last_saved());
        CHECK(cb.last_saved()->filename() == "lenet-2_3_breakpoint.ckpt");
    }
    Session s;
    auto data = lenet_data();
    const auto rp = s.trainer.resume_from(dir / "lenet-2_3_breakpoint.ckpt", data);
    CHECK(rp.initial_epoch == 1);
    CHECK(rp.initial_step == 3);
    s.trainer.train(2, data, std::tuple<>{}, rp.initial_epoch);
    CHECK(s.state() == expected);
}

TEST_CASE("resume_or_start: fresh without checkpoints, past a corrupt newest file, still bit-exact") {
    TempDir dir;
    auto data = lenet_data(64);
    {
        Session s;
        CHECK_FALSE(s.trainer.resume_or_start(dir / "absent", "lenet", data).file);
        CHECK_FALSE(s.trainer.resume_or_start(dir.path(), "lenet", data).file);
        Checkpoints cb(dir.path(), "lenet");
        nn::FailAtEpochEnd crash(3);
        CHECK_THROWS_AS(s.trainer.train(4, data, nn::callbacks(cb, crash)), nn::InjectedFault);
    }
    test::flip_bit(dir / "lenet-3_2.ckpt", 200);
    test::LogCapture log;
    Session s;
    const auto rp = s.trainer.resume_or_start(dir.path(), "lenet", data);
    REQUIRE(rp.file);
    CHECK(rp.file->filename() == "lenet-2_2.ckpt");
    REQUIRE(log.warnings.size() == 1);
    CHECK(log.warnings[0].find("lenet-3_2.ckpt") != std::string::npos);
    s.trainer.train(4, data, std::tuple<>{}, rp.initial_epoch);
    CHECK(s.state() == uninterrupted(4, lenet_data(64)));
}

TEST_CASE("encrypted training resumes through the documented flow, with the callback's key or a given one") {
    TempDir dir;
    auto data = lenet_data(64);
    const auto key = ckpt::Key::random();
    using Sealed = nn::ModelCheckpoint<ckpt::EveryEpochs, ckpt::KeepLast, ckpt::MindSporeNaming, ckpt::BinaryArchive,
                                       ckpt::AesGcm>;
    {
        Session s;
        Sealed cb(dir.path(), "lenet", {}, ckpt::EveryEpochs{}, ckpt::KeepLast{}, ckpt::MindSporeNaming{}, ckpt::AesGcm{key});
        CHECK_FALSE(s.trainer.resume_or_start(cb, data).file);
        nn::FailAtEpochEnd crash(2);
        CHECK_THROWS_AS(s.trainer.train(3, data, nn::callbacks(cb, crash)), nn::InjectedFault);
    }
    Session s;
    Sealed cb(dir.path(), "lenet", {}, ckpt::EveryEpochs{}, ckpt::KeepLast{}, ckpt::MindSporeNaming{}, ckpt::AesGcm{key});
    const auto rp = s.trainer.resume_or_start(cb, data);
    REQUIRE(rp.file);
    CHECK(rp.file->filename() == "lenet-2_2.ckpt");
    s.trainer.train(3, data, cb, rp.initial_epoch);
    CHECK(s.state() == uninterrupted(3, lenet_data(64)));
    Session other;
    ckpt::LoadOptions with_key;
    with_key.key = key;
    CHECK(other.trainer.resume_or_start(dir.path(), "lenet", data, with_key).file);
    CHECK_THROWS_AS(other.trainer.resume_or_start(dir.path(), "lenet", data), ckpt::KeyError);  // no key: said
}

TEST_CASE("a resume that cannot work says why and changes nothing") {
    TempDir dir;
    auto data = lenet_data(64);
    {
        Session s;
        Checkpoints cb(dir.path(), "lenet");
        s.trainer.train(1, data, cb);
    }
    Session s;
    const auto before = s.state();
    SUBCASE("a checkpoint of another model names the tensors") {
        nn::UceNet other;
        ckpt::save_checkpoint(other.state_dict(), dir / "other.ckpt");
        try {
            s.trainer.resume_from(dir / "other.ckpt", data);
            FAIL("no error");
        } catch (const ckpt::LoadMismatch& e) {
            const std::string what = e.what();
            CHECK(what.find("holds no position") != std::string::npos);
        }
        ckpt::ParamDict d = other.state_dict();
        d.set("trainer.epoch", std::int64_t{1});
        d.set("trainer.step", std::int64_t{2});
        d.set("trainer.global_step", std::int64_t{2});
        ckpt::save_checkpoint(d, dir / "other.ckpt");
        try {
            s.trainer.resume_from(dir / "other.ckpt", data);
            FAIL("no error");
        } catch (const ckpt::LoadMismatch& e) {
            const std::string what = e.what();
            INFO(what);
            CHECK(what.find("other.ckpt' does not fit") != std::string::npos);
            CHECK(what.find("conv1.weight") != std::string::npos);
            CHECK(what.find("layer1.param") != std::string::npos);
        }
    }
    SUBCASE("another batch size") {
        auto other = lenet_data(64, 16);
        CHECK_THROWS_WITH_AS(s.trainer.resume_from(dir / "lenet-1_2.ckpt", other),
                             doctest::Contains("batch size 32 when saved, 16 now"), ckpt::LoadMismatch);
    }
    SUBCASE("a resume epoch at or beyond the epochs requested: nothing to train, and it says so") {
        const auto rp = s.trainer.resume_from(dir / "lenet-1_2.ckpt", data);
        test::LogCapture log;
        CHECK_NOTHROW(s.trainer.train(1, data, std::tuple<>{}, rp.initial_epoch));
        CHECK(std::any_of(log.infos.begin(), log.infos.end(), [](const std::string& m) {
            return m.find("nothing left to train: epoch 1, step 2 is done, and this run trains 1 epoch(s)") != std::string::npos;
        }));
        CHECK_THROWS_AS(s.trainer.train(0, data), ckpt::ConfigError);
        return;  // this one loaded the checkpoint, as asked
    }
    SUBCASE("images of another size") {
        nn::MnistDataset raw(CKPT_FASHION_MNIST_DIR, nn::Usage::test);
        raw.take(64).map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()}).batch(32);
        CHECK_THROWS_WITH_AS(s.trainer.train(1, raw),
                             doctest::Contains("takes samples of shape (1, 32, 32), the data set gives (1, 28, 28)"),
                             nn::ShapeError);
    }
    CHECK(s.state() == before);
}

TEST_CASE("callbacks run in order at every hook, an exception reaches on_exception, then the caller") {
    struct Recorder {
        std::vector<std::string>* log;
        std::string name;
        void on_train_begin(nn::RunContext&) { log->push_back(name + ":train_begin"); }
        void on_epoch_end(nn::RunContext& c) { log->push_back(name + ":epoch_end " + std::to_string(c.epoch)); }
        void on_step_end(nn::RunContext& c) {
            if (c.step == c.steps_per_epoch) log->push_back(name + ":last_step " + std::to_string(c.global_step));
        }
        void on_train_end(nn::RunContext&) { log->push_back(name + ":train_end"); }
        void on_exception(nn::RunContext& c) { log->push_back(name + ":exception at " + std::to_string(c.global_step)); }
    };
    std::vector<std::string> log;
    Recorder a{&log, "a"}, b{&log, "b"};
    auto data = lenet_data(64);
    Session s;
    s.trainer.train(1, data, nn::callbacks(a, b));
    CHECK(log == std::vector<std::string>{"a:train_begin", "b:train_begin", "a:last_step 2", "b:last_step 2",
                                          "a:epoch_end 1", "b:epoch_end 1", "a:train_end", "b:train_end"});
    log.clear();
    nn::FailAtStep crash(3);
    CHECK_THROWS_AS(s.trainer.train(2, data, nn::callbacks(a, crash, b)), nn::InjectedFault);
    CHECK(log.back() == "b:exception at 3");
}

TEST_CASE("a callback's metrics are recorded by the checkpoint saved after it, at that hook only") {
    // evaluates at each epoch's end, listed before the checkpoint callback
    struct Evaluate {
        nn::Trainer<nn::LeNet5, nn::Momentum>* trainer;
        const nn::MnistDataset* test;
        std::vector<double> accuracies;
        void on_epoch_end(nn::RunContext& ctx) {
            accuracies.push_back(trainer->evaluate(*test));
            ctx.metrics.emplace_back("accuracy", accuracies.back());
        }
    };
    auto data = lenet_data(64);  // 2 steps an epoch
    auto test_data = lenet_data(64);
    test::LogCapture quiet;
    auto accuracy_in = [](const test::fs::path& file) -> std::optional<double> {
        const auto m = ckpt::detail::metrics_in(ckpt::read_contents(file).entries);
        if (const auto it = m.find("accuracy"); it != m.end()) return it->second;
        return std::nullopt;
    };

    // each epoch's checkpoint records that epoch's evaluation; KeepBest keeps the best
    TempDir dir;
    Session s;
    Evaluate eval{&s.trainer, &test_data, {}};
    nn::ModelCheckpoint<ckpt::EveryEpochs, ckpt::KeepAll, ckpt::StepNaming> per_epoch(dir.path(), "m");
    s.trainer.train(3, data, nn::callbacks(eval, per_epoch));
    REQUIRE(eval.accuracies.size() == 3);
    for (int epoch = 1; epoch <= 3; ++epoch)
        CHECK(accuracy_in(dir / ("m-" + std::to_string(2 * epoch) + ".ckpt")) == eval.accuracies[epoch - 1]);
    std::vector<ckpt::SkippedCheckpoint> skipped;
    const auto best = ckpt::best_checkpoint(dir.path(), "m", "accuracy", ckpt::Mode::max, ckpt::StepNaming{}, &skipped);
    CHECK(skipped.empty());
    REQUIRE(best);
    CHECK(best->metrics.at("accuracy") == *std::max_element(eval.accuracies.begin(), eval.accuracies.end()));
    // StepNaming names a file by its global step: a checkpoint of a later epoch (header: epoch
    // 3, step 2) agrees with its name (global step 6), and is the latest
    CHECK(ckpt::latest(dir.path(), "m", ckpt::StepNaming{})->filename().string() == "m-6.ckpt");

    // a checkpoint of a later step does not carry an earlier hook's measurement
    TempDir steps_dir;
    Session t;
    Evaluate eval_t{&t.trainer, &test_data, {}};
    nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> per_step(steps_dir.path(), "m", {},
                                                                                   ckpt::EverySteps(1));
    t.trainer.train(2, data, nn::callbacks(eval_t, per_step));
    CHECK_FALSE(accuracy_in(steps_dir / "m-1.ckpt"));
    CHECK_FALSE(accuracy_in(steps_dir / "m-3.ckpt"));  // the first step after epoch 1's evaluation
    // an epoch's last step is saved after the epoch's evaluation, with its measurement
    CHECK(accuracy_in(steps_dir / "m-2.ckpt") == eval_t.accuracies[0]);
    CHECK(accuracy_in(steps_dir / "m-4.ckpt") == eval_t.accuracies[1]);

    // an epoch-end hook before the checkpoint fails: the epoch's last step is saved all the same
    struct FailAtEpochEnd {
        void on_epoch_end(nn::RunContext&) { throw std::runtime_error("evaluation failed"); }
    } fail;
    TempDir failed_dir;
    Session u;
    nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> after_fail(failed_dir.path(), "m", {},
                                                                                     ckpt::EverySteps(2));
    CHECK_THROWS_WITH(u.trainer.train(2, data, nn::callbacks(fail, after_fail)), "evaluation failed");
    CHECK(test::names_in(failed_dir.path()) == std::vector<std::string>{"m-2.ckpt", "m-graph.meta"});
}

TEST_CASE("make_model_checkpoint follows a CheckpointConfig, the monitors print the seed's lines") {
    TempDir dir;
    auto data = lenet_data(128);  // 4 steps per epoch
    ckpt::CheckpointConfig config;
    config.save_checkpoint_steps = 3;
    config.keep_checkpoint_max = 2;
    config.append_info = {"step_num"};
    auto cb = nn::make_model_checkpoint(dir.path(), "lenet", config);
    std::ostringstream out;
    nn::LossMonitor loss_cb(4, out);
    nn::TimeMonitor time_cb(out);
    Session s;
    s.trainer.train(2, data, nn::callbacks(cb, loss_cb, time_cb));
    // steps 3 and 6 by the step rule, 8 at the end of training; the last two kept
    CHECK(test::names_in(dir.path()) ==
          std::vector<std::string>{"lenet-2_2.ckpt", "lenet-2_4.ckpt", "lenet-graph.meta", "lenet.finished"});
    CHECK(ckpt::load_checkpoint(dir / "lenet-2_4.ckpt").get<std::int64_t>("step_num") == 8);
    const std::string text = out.str();
    CHECK(text.find("epoch: 1 step: 4, loss is ") != std::string::npos);
    CHECK(text.find("epoch: 2 step: 4, loss is ") != std::string::npos);
    CHECK(text.find("epoch time: ") != std::string::npos);
    CHECK(text.find(" ms, per step time: ") != std::string::npos);
}

TEST_CASE("fault injection fires once, on the rank asked for") {
    auto data = lenet_data(64);
    Session rank0;
    nn::FailAtStep other_rank(2, /*rank=*/1);
    nn::FailAtEpochEnd any_rank(1);
    CHECK_THROWS_AS(rank0.trainer.train(2, data, nn::callbacks(other_rank, any_rank)), nn::InjectedFault);
    CHECK_FALSE(other_rank.fired());
    CHECK(any_rank.fired());
    nn::Trainer<nn::LeNet5, nn::Momentum> on_rank1(rank0.net, rank0.opt, {}, /*rank=*/1);
    try {
        on_rank1.train(2, data, other_rank);
        FAIL("no fault");
    } catch (const nn::InjectedFault& e) {
        CHECK(e.rank() == 1);
        CHECK(e.global_step() == 2);
    }
    on_rank1.train(1, data, nn::callbacks(other_rank, any_rank));  // both fired already
}

TEST_CASE("exception save: a failure before the update is saved, one inside the update is not (the state is torn)") {
    TempDir dir;
    auto data = lenet_data(64);
    {
        Session s;
        Checkpoints cb(dir.path(), "lenet", test::seed_options(/*exception_save=*/true));
        nn::FailBeforeUpdate crash(3);
        CHECK_THROWS_AS(s.trainer.train(2, data, nn::callbacks(cb, crash)), nn::InjectedFault);
        // two steps completed: the breakpoint holds them
        CHECK(test::names_in(dir.path()) == std::vector<std::string>{"lenet-1_2.ckpt", "lenet-2_0_breakpoint.ckpt",
                                                                     "lenet-graph.meta"});
    }
    TempDir torn_dir;
    nn::LeNet5 net;
    nn::Momentum inner(net.parameters(), 0.01, 0.9);
    nn::FailingOptimizer<nn::Momentum> opt(inner, 3);
    nn::Trainer<nn::LeNet5, nn::FailingOptimizer<nn::Momentum>> trainer(net, opt);
    Checkpoints cb(torn_dir.path(), "lenet", test::seed_options(/*exception_save=*/true));
    test::LogCapture log;
    CHECK_THROWS_AS(trainer.train(2, data, cb), nn::InjectedFault);
    CHECK(test::names_in(torn_dir.path()) == std::vector<std::string>{"lenet-1_2.ckpt", "lenet-graph.meta"});
    REQUIRE(log.warnings.size() == 1);
    CHECK(log.warnings[0].find("interrupted an optimizer update at global step 3") != std::string::npos);
}

TEST_CASE("a termination signal (SIGTERM, SIGUSR1) ends the step, saves it durably, stops with Preempted, resume is bit-exact") {
    const auto expected = uninterrupted(2, lenet_data());
    for (const int sig : {SIGTERM, SIGUSR1}) {
        CAPTURE(sig);
        TempDir dir;
        ckpt::TerminationSignals signals;
        {
            Session s;
            auto data = lenet_data();
            auto options = test::seed_options(/*exception_save=*/true);
            options.save_on_signal = true;
            Checkpoints cb(dir.path(), "lenet", options);
            struct SignalAt {  // the signal arrives from outside, mid-step: a real one, to this process
                std::int64_t step;
                int sig;
                void on_before_update(nn::RunContext& c) {
                    if (c.global_step + 1 == step) ::raise(sig);
                }
            } deliver{11, sig};
            CHECK_THROWS_WITH_AS(s.trainer.train(2, data, nn::callbacks(cb, deliver)),
                                 doctest::Contains("after global step 11; saved"), ckpt::Preempted);
            REQUIRE(cb.last_saved());
            CHECK(cb.last_saved()->filename() == "lenet-2_3.ckpt");  // a regular checkpoint of the step, no breakpoint
            CHECK_FALSE(test::fs::exists(dir / "lenet-2_3_breakpoint.ckpt"));
            CHECK(ckpt::TerminationSignals::signal() == sig);
        }
        ckpt::TerminationSignals::reset();
        Session s;
        auto data = lenet_data();
        const auto rp = s.trainer.resume_from(*ckpt::latest(dir.path(), "lenet"), data);
        CHECK(rp.global_step == 11);
        s.trainer.train(2, data, std::tuple<>{}, rp.initial_epoch);
        CHECK(s.state() == expected);
    }
}
