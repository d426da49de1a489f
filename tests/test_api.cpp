// What a C++20 user expects of the API: std::filesystem::path wherever a path is taken, and
// managers that move (returned from factories, kept in std::optional and std::vector).
#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/interop.hpp>
#include <ckpt/codecs/zstd.hpp>

#include <doctest/doctest.h>

#include <array>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support.hpp"

namespace {

namespace stdfs = std::filesystem;

using StepManager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;

}  // namespace

TEST_SUITE("api") {

TEST_CASE("the paths ckpt returns go into std::filesystem::path and Boost path variables alike") {
    test::TempDir tmp;
    const ckpt::ParamDict state = test::sample_state();
    StepManager mgr(tmp.path(), "run", ckpt::EverySteps{1}, ckpt::KeepLast{2});
    const stdfs::path written = mgr.save(ckpt::Progress::at_iteration(1), state);
    const std::optional<stdfs::path> stepped = mgr.on_step(ckpt::Progress::at_iteration(2), state);
    const std::optional<boost::filesystem::path> as_boost = mgr.on_step(ckpt::Progress::at_iteration(3), state);
    const std::optional<stdfs::path> newest = ckpt::latest(tmp.path(), "run");
    const stdfs::path listed = ckpt::list_checkpoints(tmp.path(), "run").back().path;
    CHECK(written.filename() == "run-1.ckpt");
    CHECK(stepped->filename() == "run-2.ckpt");
    CHECK(as_boost->filename() == "run-3.ckpt");
    CHECK(*newest == listed);
    CHECK(newest->filename() == "run-3.ckpt");
}

TEST_CASE("views of standard containers and of scalars of every dtype save and load in place") {
    test::TempDir tmp;
    std::vector<double> v{1, 2, 3, 4, 5, 6};
    std::array<std::int32_t, 3> a{7, 8, 9};
    float f = 1.5f;
    std::int64_t i = 42;
    bool b = true;
    std::uint8_t u = 200;
    auto state = [&] {
        ckpt::ParamDict d;
        d.set("v", ckpt::view_of(v, {2, 3}));
        d.set("a", ckpt::view_of(a));
        d.set("f", ckpt::view_of(f));
        d.set("i", ckpt::view_of(i));
        d.set("b", ckpt::view_of(b));
        d.set("u", ckpt::view_of(u));
        return d;
    };
    ckpt::save_checkpoint(state(), tmp / "x.ckpt");
    const auto saved = ckpt::load_checkpoint(tmp / "x.ckpt");
    CHECK(saved.tensor("v").shape() == ckpt::Shape{2, 3});
    CHECK(saved.tensor("i").rank() == 0);
    v.assign(6, 0), a = {0, 0, 0}, f = 0, i = 0, b = false, u = 0;
    ckpt::ParamDict target = state();
    CHECK(ckpt::load_checkpoint_into(tmp / "x.ckpt", target, /*strict=*/true).complete());
    CHECK(v == std::vector<double>{1, 2, 3, 4, 5, 6});
    CHECK(a == std::array<std::int32_t, 3>{7, 8, 9});
    CHECK(f == 1.5f);
    CHECK(i == 42);
    CHECK(b);
    CHECK(u == 200);
    CHECK_THROWS_AS(ckpt::view_of(v, {4, 2}), ckpt::TypeMismatch);  // 6 elements are not 4 x 2
    const std::vector<bool> bits{true, false, true};
    const ckpt::Tensor packed = ckpt::Tensor::from(bits);
    CHECK(packed.describe() == "bool[3]");
    CHECK(packed.values<bool>()[2]);
}

namespace {
// A target that fits itself to the file: its vector takes the saved length before the load.
struct Growing {
    std::vector<float> values;
    std::vector<std::size_t> shaped_for;  // the length each state_dict_for() was asked for
    int loaded_calls = 0;
    ckpt::ParamDict state_dict() {
        ckpt::ParamDict d;
        d.set("values", ckpt::view_of(values));
        return d;
    }
    ckpt::ParamDict state_dict_for(const std::vector<ckpt::EntryInfo>& entries) {
        for (const auto& e : entries)
            if (e.name == "values") values.resize(static_cast<std::size_t>(e.shape.at(0)));
        shaped_for.push_back(values.size());
        return state_dict();
    }
    void loaded(const ckpt::LoadReport&) { ++loaded_calls; }
};
}  // namespace

TEST_CASE("a target shaped by the checkpoint is fitted to the file a load reads, then told it loaded") {
    test::TempDir tmp;
    for (const auto archive : {ckpt::ArchiveKind::binary, ckpt::ArchiveKind::text}) {
        CAPTURE(static_cast<int>(archive));
        ckpt::SaveOptions so;
        so.archive = archive;
        ckpt::save_checkpoint({{"values", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4, 5})}}, tmp / "x.ckpt", so);
        Growing g;
        CHECK(ckpt::load_checkpoint_into(tmp / "x.ckpt", g, /*strict=*/true).complete());
        CHECK(g.values == std::vector<float>{1, 2, 3, 4, 5});
        CHECK(g.loaded_calls == 1);
        Growing h;
        CHECK(ckpt::load_param_into_net(h, ckpt::load_checkpoint(tmp / "x.ckpt"), true).complete());
        CHECK(h.values == g.values);
        CHECK(h.loaded_calls == 1);
    }
    // a manager's restore fits it to the file it loads: not the newest (damaged), the one before
    std::vector<float> saved{1, 2, 3};
    {
        StepManager mgr(tmp / "run", "g", ckpt::EverySteps{1}, ckpt::KeepLast{5});
        for (std::int64_t s = 1; s <= 2; ++s) {
            saved.push_back(static_cast<float>(s));
            mgr.save(ckpt::Progress::at_iteration(s), [&] {
                return ckpt::ParamDict{{"values", ckpt::view_of(saved)}};
            });
        }
    }
    const auto files = ckpt::list_checkpoints(tmp / "run", "g", ckpt::StepNaming{});
    REQUIRE(files.size() == 2);
    test::flip_bit(files.back().path, boost::filesystem::file_size(files.back().path) - 3);
    test::LogCapture quiet;
    Growing g;
    StepManager mgr(tmp / "run", "g", ckpt::EverySteps{1}, ckpt::KeepLast{5});
    const auto restored = mgr.restore(g);
    REQUIRE(restored);
    CHECK(restored->file.path == files.front().path);
    CHECK(g.values == std::vector<float>{1, 2, 3, 1});
    // shaped for each file tried: the damaged one (which a load finds damaged as it reads it),
    // then the one loaded; told once, of the load that succeeded
    CHECK(g.shaped_for == std::vector<std::size_t>{5, 4});
    CHECK(g.loaded_calls == 1);
}

TEST_CASE("error messages are printable whatever bytes they quote: controls and invalid UTF-8 escaped, UTF-8 kept") {
    using ckpt::detail::printable;
    CHECK(printable("tensor 'conv1.weight'\n\tline") == "tensor 'conv1.weight'\n\tline");
    CHECK(printable("caf\xc3\xa9 \xe2\x80\xa6 \xf0\x9f\x98\x80") == "caf\xc3\xa9 \xe2\x80\xa6 \xf0\x9f\x98\x80");
    CHECK(printable("\x1b[31mred\x7f") == "\\x1b[31mred\\x7f");
    CHECK(printable("\xff\xc3") == "\\xff\\xc3");                  // invalid, and a sequence cut short
    CHECK(printable("\xc0\xaf\xed\xa0\x80") == "\\xc0\\xaf\\xed\\xa0\\x80");  // overlong, a surrogate
    CHECK(printable("\xc2\x9b") == "\\xc2\\x9b");                  // C1 CSI
    CHECK(printable(std::string_view("a\0b", 3)) == "a\\x00b");
    const ckpt::FormatError e("bad name '\x1b[2J'", "f.ckpt");
    CHECK(std::string(e.what()) == "bad name '\\x1b[2J'");
}

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

TEST_CASE("log levels compare by severity, so that a sink can keep what the default one prints") {
    static_assert(ckpt::LogLevel::info < ckpt::LogLevel::notice && ckpt::LogLevel::notice < ckpt::LogLevel::warning);
    test::LogCapture sink_after;  // puts the suite's sink back at the end
    std::vector<std::string> kept;
    ckpt::set_log_sink([&kept](ckpt::LogLevel level, std::string_view msg) {
        if (level >= ckpt::LogLevel::notice) kept.emplace_back(msg);
    });
    test::TempDir dir;
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(dir.path(), "run");
    std::vector<float> w(4, 1.0f);
    ckpt::ParamDict state;
    state.set("w", ckpt::view_of(w));
    CHECK_FALSE(mgr.restore(state));  // a notice: nothing to resume from
    ckpt::set_log_sink({});
    REQUIRE(kept.size() == 1);
    CHECK(kept[0].find("starting from the beginning") != std::string::npos);
}
