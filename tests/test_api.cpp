// What a C++20 user expects of the API: std::filesystem::path wherever a path is taken, and
// managers that move (returned from factories, kept in std::optional and std::vector).
#include <ckpt/aes_gcm.hpp>
#include <ckpt/interop.hpp>
#include <ckpt/zstd.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <optional>
#include <vector>

#include "support.hpp"

namespace {

namespace stdfs = std::filesystem;

using StepManager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;

}  // namespace

TEST_SUITE("api") {

TEST_CASE("every function that takes a path takes a std::filesystem::path, a Boost path and a string") {
    test::TempDir tmp;
    const stdfs::path dir = stdfs::path(tmp.path().string()) / "std";
    const ckpt::ParamDict state = test::sample_state();
    ckpt::save_checkpoint(state, dir.parent_path() / "a.ckpt");
    ckpt::save_checkpoint(state, (tmp.path() / "b.ckpt").string());
    ckpt::save_checkpoint(state, tmp.path() / "c.ckpt");
    ckpt::save_checkpoint(state, (tmp.path() / "d.ckpt").c_str());
    for (const char* name : {"a.ckpt", "b.ckpt", "c.ckpt", "d.ckpt"}) {
        const stdfs::path file = stdfs::path(tmp.path().string()) / name;
        CHECK(ckpt::load_checkpoint(file) == state);
        CHECK(ckpt::verify_checkpoint(file).body_length == ckpt::read_header(file).body_length);
        CHECK(ckpt::read_contents(file).entries.size() == state.size());
        ckpt::ParamDict target = test::sample_state(2.0f);
        CHECK(ckpt::load_checkpoint_into(file, target).complete());
    }
    ckpt::save_safetensors(state, stdfs::path(tmp.path().string()) / "s.safetensors");
    CHECK(ckpt::load_safetensors(stdfs::path(tmp.path().string()) / "s.safetensors").size() == state.size());
    ckpt::save_npz(state, stdfs::path(tmp.path().string()) / "s.npz");
    CHECK(ckpt::load_npz(stdfs::path(tmp.path().string()) / "s.npz").size() == state.size());

    StepManager mgr(dir, "run", ckpt::EverySteps{1}, ckpt::KeepLast{2});
    mgr.save(ckpt::Progress::at_iteration(3), state);
    const auto found = ckpt::latest(dir, "run", ckpt::StepNaming{});
    REQUIRE(found);
    CHECK(found->filename().string() == "run-3.ckpt");
    CHECK(ckpt::list_checkpoints(dir, "run", ckpt::StepNaming{}).size() == 1);
    CHECK(ckpt::latest_checkpoint(dir, "run", ckpt::StepNaming{})->name.step == 3);

    const auto key = ckpt::Key::random();
    test::write_bytes(tmp / "k.key", std::vector<char>(key.data(), key.data() + ckpt::Key::size));
    CHECK_NOTHROW(ckpt::Key::from_file(stdfs::path(tmp.path().string()) / "k.key"));
    CHECK(ckpt::PathArg(dir).std_path() == dir);
}

TEST_CASE("a manager moves: returned from a factory, kept in an optional and a vector, with a save in flight") {
    test::TempDir tmp;
    test::LogCapture quiet;
    auto make = [&](const std::string& prefix) {
        ckpt::ManagerOptions o;
        o.async_save = true;
        return StepManager(tmp.path(), prefix, ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, o);
    };
    std::vector<float> w(1 << 16, 1.0f);
    ckpt::ParamDict state;
    state.set("w", ckpt::Tensor::view(std::span<float>(w), {static_cast<std::int64_t>(w.size())}));
    std::vector<StepManager> managers;
    for (const char* prefix : {"a", "b", "c"}) {
        managers.push_back(make(prefix));
        managers.back().on_step(ckpt::Progress::at_iteration(1), state);  // in flight while the vector grows
    }
    std::optional<StepManager> held;
    held.emplace(std::move(managers.front()));
    held->on_step(ckpt::Progress::at_iteration(2), state);
    StepManager assigned = make("d");
    assigned = std::move(*held);  // "d" has nothing in flight; "a" keeps its saves
    assigned.wait();
    for (auto& m : managers)
        if (&m != &managers.front()) m.wait();
    CHECK(assigned.prefix() == "a");
    CHECK(ckpt::latest(tmp.path(), "a", ckpt::StepNaming{})->filename().string() == "a-2.ckpt");
    CHECK(ckpt::latest(tmp.path(), "b", ckpt::StepNaming{})->filename().string() == "b-1.ckpt");
    CHECK(ckpt::latest(tmp.path(), "c", ckpt::StepNaming{})->filename().string() == "c-1.ckpt");
    static_assert(std::is_nothrow_move_constructible_v<StepManager>);
    static_assert(!std::is_copy_constructible_v<StepManager>);
}

}  // TEST_SUITE
