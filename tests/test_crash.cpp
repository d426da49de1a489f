// Crash safety: a real child process, saving in a loop, SIGKILLed at many moments, with
// synchronous and with async saves, plain and compressed-then-encrypted. Whatever the moment,
// latest() must return a checkpoint that verifies and loads, never a torn one, and never one
// older than a save the child had seen complete.
#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/codecs/zstd.hpp>

#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "support.hpp"

namespace {

constexpr std::size_t state_floats = 1 << 18;  // 1 MiB per save: long enough to be caught mid-write
using Manager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;
using SealedCodec = ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>;
using SealedManager =
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming, ckpt::BinaryArchive, SealedCodec>;

ckpt::Key sealing_key() {
    std::array<unsigned char, 32> raw{};
    for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<unsigned char>(0xa5 ^ i);
    return ckpt::Key::from_bytes(raw);
}

template <class M>
M make_manager(const boost::filesystem::path& dir, const ckpt::ManagerOptions& opts) {
    if constexpr (std::is_same_v<M, SealedManager>)
        return M(dir, "crash", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, opts,
                 SealedCodec{ckpt::Zstd{1}, ckpt::AesGcm{sealing_key()}});
    else
        return M(dir, "crash", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, opts);
}

/// Step `step`'s value of element i: varied enough that zstd has work to do on every block.
float value_at(std::size_t i, std::int64_t step) { return static_cast<float>(step) + static_cast<float>(i % 977) * 0.001f; }

ckpt::ManagerOptions options(bool async) {
    ckpt::ManagerOptions o;
    o.async_save = async;
    return o;
}

/// The child: resume from the latest checkpoint, then save every step for ever, reporting
/// through `report_fd` each step whose save it knows durable: with sync saves the one just
/// made; with async saves (one buffer, WhenBusy::wait) the one before, since handing a save
/// over waits for the buffer the previous one was written from.
template <class M>
[[noreturn]] void saving_child(const boost::filesystem::path& dir, int report_fd, bool async) {
    ckpt::set_log_sink({});
    std::vector<float> w(state_floats, 0.0f);
    ckpt::ParamDict state;
    state.set("w", ckpt::Tensor::view(std::span<float>(w), {static_cast<std::int64_t>(w.size())}));
    M mgr = make_manager<M>(dir, options(async));
    std::int64_t step = 0;
    if (auto r = mgr.restore(state)) step = r->file.name.step;
    for (;;) {
        ++step;
        for (std::size_t i = 0; i < w.size(); ++i) w[i] = value_at(i, step);
        mgr.on_step(ckpt::Progress::at_iteration(step), state);
        std::fill(w.begin(), w.end(), -1.0f);  // the next step's training, racing an async save
        const std::int64_t durable = async ? step - 1 : step;
        if (durable > 0 && ::write(report_fd, &durable, sizeof durable) != sizeof durable) ::_exit(3);
    }
}

/// The last step the child reported within `timeout`, after at least `saves` reports.
std::int64_t await_saves(int fd, int saves, std::chrono::milliseconds timeout) {
    std::int64_t step = 0;
    for (int seen = 0; seen < saves;) {
        pollfd p{fd, POLLIN, 0};
        REQUIRE_MESSAGE(::poll(&p, 1, static_cast<int>(timeout.count())) == 1, "the saving child stopped reporting");
        REQUIRE(::read(fd, &step, sizeof step) == sizeof step);
        ++seen;
    }
    return step;
}

/// Kills a saving child `kills` times at random moments and checks what it leaves.
template <class M = Manager>
void kill_torture(bool async, int kills) {
    test::TempDir dir;
    test::LogCapture quiet;

    // How long one save takes here, to spread the kills over a save's whole duration.
    constexpr bool sealed = std::is_same_v<M, SealedManager>;
    ckpt::ParamDict probe;
    std::vector<float> probe_values(state_floats);
    for (std::size_t i = 0; i < probe_values.size(); ++i) probe_values[i] = value_at(i, 1);
    probe.set("w", ckpt::Tensor::from(probe_values, {static_cast<std::int64_t>(state_floats)}));
    ckpt::SaveOptions probe_options;
    if (sealed) probe_options.codecs = SealedCodec{ckpt::Zstd{1}, ckpt::AesGcm{sealing_key()}}.codecs();
    const auto t0 = std::chrono::steady_clock::now();
    ckpt::save_checkpoint(probe, dir / "probe.ckpt", probe_options);
    const auto save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
    boost::filesystem::remove(dir / "probe.ckpt");

    std::mt19937 rng(20261122);
    std::uniform_int_distribution<int> completed_saves(0, 2);
    std::uniform_int_distribution<long> delay_us(0, 2 * save_us.count() + 100);
    int killed_mid_save = 0;
    std::int64_t previous = 0;
    // Steps the reports promise the children made between kills: each child resumes where the
    // last one left off, so these add up. (An async child's first report is the step it resumed
    // from.)
    std::int64_t promised = 0;
    for (int i = 0; i < kills; ++i) {
        int pipe_fds[2];
        REQUIRE(::pipe(pipe_fds) == 0);
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            ::close(pipe_fds[0]);
            saving_child<M>(dir.path(), pipe_fds[1], async);
        }
        ::close(pipe_fds[1]);
        const int saves = completed_saves(rng);
        const std::int64_t reported = saves ? await_saves(pipe_fds[0], saves, std::chrono::seconds(30)) : 0;
        promised += std::max(0, async ? saves - 1 : saves);
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
        ::kill(child, SIGKILL);
        int status = 0;
        ::waitpid(child, &status, 0);
        ::close(pipe_fds[0]);
        REQUIRE(WIFSIGNALED(status));
        const auto names = test::names_in(dir.path());
        killed_mid_save += std::any_of(names.begin(), names.end(),
                                       [](const std::string& n) {  // a save's temporary, not a file retention was freeing
                                           return ckpt::detail::temporary_owner(n).has_value() && !ckpt::detail::is_deleted_temporary(n);
                                       });

        auto found = ckpt::latest_checkpoint(dir.path(), "crash", ckpt::StepNaming{});
        if (!found) {
            REQUIRE(reported == 0);
            continue;
        }
        CHECK(found->name.step >= reported);  // a save that returned is never lost
        CHECK(found->name.step >= previous);  // and resuming never goes backwards
        previous = found->name.step;
        if (sealed) CHECK(found->header.codec_names() == "zstd+aes-256-gcm");
        ckpt::LoadOptions with_key;
        with_key.key = sealing_key();
        const auto state = ckpt::load_checkpoint(found->path, with_key);
        const auto w = state.tensor("w").values<float>();
        REQUIRE(w.size() == state_floats);
        bool intact = true;
        for (std::size_t k = 0; k < w.size(); ++k) intact = intact && w[k] == value_at(k, found->name.step);
        CHECK(intact);
    }
    MESSAGE(kills << " kills, " << killed_mid_save << " of them during a save; newest step " << previous);
    CHECK(killed_mid_save > 0);
    CHECK(previous >= promised);  // every child went on from its predecessor's latest save
    // The next manager to start clears what the killed writers left behind.
    M mgr = make_manager<M>(dir.path(), options(async));
    for (const auto& name : test::names_in(dir.path())) CHECK_MESSAGE(!ckpt::detail::temporary_owner(name), name);
}

}  // namespace

TEST_CASE("a process saving synchronously, SIGKILLed 200 times at random moments, never leaves a torn latest checkpoint") {
    kill_torture(false, 200);
}

TEST_CASE("a process saving asynchronously, SIGKILLed 200 times at random moments, never leaves a torn latest checkpoint") {
    kill_torture(true, 200);
}

TEST_CASE("a process saving compressed and encrypted asynchronously, SIGKILLed 100 times, never leaves a torn latest checkpoint") {
    kill_torture<SealedManager>(true, 100);
}
