// Crash safety: a real child process, saving in a loop, SIGKILLed at many moments. Whatever
// the moment, latest() must return a checkpoint that verifies and loads, never a torn one.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "support.hpp"

namespace {

constexpr std::size_t state_floats = 1 << 18;  // 1 MiB per save: long enough to be caught mid-write

/// The child: resume from the latest checkpoint, then save every step, for ever.
[[noreturn]] void saving_child(const boost::filesystem::path& dir) {
    ckpt::set_log_sink({});
    std::vector<float> w(state_floats, 0.0f);
    ckpt::ParamDict state;
    state.set("w", ckpt::Tensor::view(std::span<float>(w), {static_cast<std::int64_t>(w.size())}));
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(dir, "crash", ckpt::EverySteps{1},
                                                                                   ckpt::KeepLast{2});
    std::int64_t step = 0;
    if (auto r = mgr.restore(state)) step = r->file.name.step;
    for (;;) {
        ++step;
        std::fill(w.begin(), w.end(), static_cast<float>(step));
        mgr.on_step(ckpt::Progress::at_iteration(step), state);
    }
}

}  // namespace

TEST_CASE("a saving process SIGKILLed at random moments never leaves a torn latest checkpoint") {
    test::TempDir dir;
    test::LogCapture quiet;
    std::mt19937 rng(20261122);
    std::uniform_int_distribution<int> delay_us(0, 30000);
    constexpr int kills = 60;
    std::int64_t last_step = 0;
    int resumed_forward = 0;
    int killed_mid_save = 0;
    for (int i = 0; i < kills; ++i) {
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) saving_child(dir.path());
        std::this_thread::sleep_for(std::chrono::microseconds(5000 + delay_us(rng)));
        ::kill(child, SIGKILL);
        int status = 0;
        ::waitpid(child, &status, 0);
        REQUIRE(WIFSIGNALED(status));
        const auto names = test::names_in(dir.path());
        killed_mid_save += std::any_of(names.begin(), names.end(),
                                       [](const std::string& n) { return ckpt::detail::temporary_owner(n).has_value(); });

        auto found = ckpt::latest_checkpoint(dir.path(), "crash", ckpt::StepNaming{});
        if (!found) continue;  // killed before the first save finished
        const auto state = ckpt::load_checkpoint(found->path);
        const auto w = state.tensor("w").values<float>();
        REQUIRE(w.size() == state_floats);
        const float expected = static_cast<float>(found->name.step);
        CHECK(std::all_of(w.begin(), w.end(), [&](float v) { return v == expected; }));
        CHECK(found->name.step >= last_step);  // resume never goes backwards
        if (found->name.step > last_step) ++resumed_forward;
        last_step = found->name.step;
    }
    CHECK(resumed_forward > kills / 4);  // the children really did make progress between kills
    CHECK(killed_mid_save >= kills / 10);  // and were often caught in the middle of a save
    MESSAGE(kills << " kills, " << killed_mid_save << " in the middle of a save, " << resumed_forward
                  << " after progress");
    // The next manager to start clears what the killed writers left behind.
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(dir.path(), "crash",
                                                                                   ckpt::EverySteps{1}, ckpt::KeepLast{2});
    for (const auto& name : test::names_in(dir.path())) CHECK_MESSAGE(!ckpt::detail::temporary_owner(name), name);
}
