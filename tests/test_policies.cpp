// The policy families: concepts checked statically, one test body per behaviour.
#include <doctest/doctest.h>

#include "support.hpp"

namespace {

ckpt::Progress at(std::int64_t epoch, std::int64_t step, std::int64_t global, ckpt::Event e = ckpt::Event::step_end) {
    ckpt::Progress p;
    p.epoch = epoch;
    p.step = step;
    p.global_step = global;
    p.event = e;
    return p;
}

std::vector<ckpt::StoredCheckpoint> files_saved_at_minutes(std::initializer_list<double> minutes) {
    std::vector<ckpt::StoredCheckpoint> files;
    std::int64_t step = 0;
    for (double m : minutes) {
        ckpt::StoredCheckpoint f;
        f.name.step = ++step;
        f.header.save_time_ns = static_cast<std::int64_t>(m * 60e9);
        files.push_back(f);
    }
    return files;
}

/// Files of the given sizes on disk, oldest first.
std::vector<ckpt::StoredCheckpoint> files_of_sizes(std::initializer_list<std::uint64_t> sizes) {
    std::vector<ckpt::StoredCheckpoint> files;
    std::int64_t step = 0;
    for (std::uint64_t size : sizes) {
        ckpt::StoredCheckpoint f;
        f.name.step = ++step;
        f.header.body_length = size - ckpt::header_size;
        files.push_back(f);
    }
    return files;
}

/// A naming policy of a user's, without a retention_scope member.
struct PlainNaming : ckpt::detail::RunNaming<ckpt::detail::GlobalStepPosition> {};

/// Which events of a 3-epoch, 4-steps-per-epoch run a save policy saves at.
template <ckpt::SavePolicy P>
std::vector<std::string> saves_of(P policy) {
    std::vector<std::string> out;
    std::int64_t global = 0;
    auto ask = [&](const ckpt::Progress& p) {
        if (policy.should_save(p)) {
            policy.saved(p);
            out.push_back(std::to_string(p.epoch) + "_" + std::to_string(p.step) +
                          (p.event == ckpt::Event::epoch_end ? "e" : p.event == ckpt::Event::train_end ? "t" : ""));
        }
    };
    for (std::int64_t e = 1; e <= 3; ++e) {
        for (std::int64_t s = 1; s <= 4; ++s) ask(at(e, s, ++global));
        ask(at(e, 4, global, ckpt::Event::epoch_end));
    }
    ask(at(3, 4, global, ckpt::Event::train_end));
    return out;
}

}  // namespace

// Concepts: the members satisfy them, and things that are not policies do not.
static_assert(ckpt::SavePolicy<ckpt::Never> && ckpt::SavePolicy<ckpt::EverySteps> &&
              ckpt::SavePolicy<ckpt::EveryEpochs> && ckpt::SavePolicy<ckpt::EverySeconds> &&
              ckpt::SavePolicy<ckpt::OnTrainEnd> && ckpt::SavePolicy<ckpt::AnyOf<ckpt::EverySteps, ckpt::OnTrainEnd>> &&
              ckpt::SavePolicy<ckpt::ConfiguredSave>);
static_assert(!ckpt::SavePolicy<int> && !ckpt::SavePolicy<ckpt::KeepLast>);
static_assert(ckpt::RetentionPolicy<ckpt::KeepAll> && ckpt::RetentionPolicy<ckpt::KeepLast> &&
              ckpt::RetentionPolicy<ckpt::KeepOnePerMinutes> &&
              ckpt::RetentionPolicy<ckpt::KeepUnion<ckpt::KeepLast, ckpt::KeepOnePerMinutes>> &&
              ckpt::RetentionPolicy<ckpt::ConfiguredRetention> && ckpt::RetentionPolicy<ckpt::KeepWithinBytes> &&
              ckpt::RetentionPolicy<ckpt::KeepIntersection<ckpt::KeepLast, ckpt::KeepWithinBytes>> &&
              ckpt::RetentionPolicy<ckpt::KeepUnion<ckpt::KeepWithinBytes, ckpt::KeepOnePerMinutes>>);
static_assert(!ckpt::RetentionPolicy<ckpt::EverySteps>);
static_assert(ckpt::NamingPolicy<ckpt::MindSporeNaming> && ckpt::NamingPolicy<ckpt::StepNaming> &&
              ckpt::NamingPolicy<ckpt::LastWordsNaming> && ckpt::NamingPolicy<ckpt::SingleFileNaming>);
static_assert(!ckpt::NamingPolicy<ckpt::KeepAll>);
static_assert(ckpt::ArchivePolicy<ckpt::BinaryArchive> && ckpt::ArchivePolicy<ckpt::TextArchive> &&
              ckpt::ArchivePolicy<ckpt::XmlArchive> && !ckpt::ArchivePolicy<ckpt::Never>);

TEST_SUITE("save policies") {

TEST_CASE("each save policy saves at its events") {
    CHECK(saves_of(ckpt::Never{}).empty());
    CHECK(saves_of(ckpt::EverySteps{5}) == std::vector<std::string>{"2_1", "3_2"});
    CHECK(saves_of(ckpt::EverySteps{4}) == std::vector<std::string>{"1_4", "2_4", "3_4"});
    CHECK(saves_of(ckpt::EveryEpochs{1}) == std::vector<std::string>{"1_4e", "2_4e", "3_4e"});
    CHECK(saves_of(ckpt::EveryEpochs{2}) == std::vector<std::string>{"2_4e"});
    CHECK(saves_of(ckpt::OnTrainEnd{}) == std::vector<std::string>{"3_4t"});
    CHECK(saves_of(ckpt::AnyOf(ckpt::EveryEpochs{2}, ckpt::OnTrainEnd{})) == std::vector<std::string>{"2_4e", "3_4t"});
}

TEST_CASE("EverySeconds counts from the last save, whoever asked for it") {
    using namespace std::chrono;
    ckpt::AnyOf policy(ckpt::EverySeconds{10}, ckpt::EverySteps{3});
    const auto t0 = steady_clock::time_point{} + hours(1);
    auto step = [&](std::int64_t g, double seconds) {
        auto p = at(1, g, g);
        p.now = t0 + duration_cast<steady_clock::duration>(duration<double>(seconds));
        const bool save = policy.should_save(p);
        if (save) policy.saved(p);
        return save;
    };
    CHECK_FALSE(step(1, 0));
    CHECK_FALSE(step(2, 9.9));
    CHECK(step(3, 10.5));   // EverySteps{3}; resets the timer
    CHECK_FALSE(step(4, 15));
    CHECK(step(5, 20.5));   // 10 s after the save at step 3
}

TEST_CASE("invalid save policy values are refused") {
    CHECK_THROWS_AS(ckpt::EverySteps{0}, ckpt::ConfigError);
    CHECK_THROWS_AS(ckpt::EveryEpochs{-1}, ckpt::ConfigError);
    CHECK_THROWS_AS(ckpt::EverySeconds{0}, ckpt::ConfigError);
}
}

TEST_SUITE("retention policies") {

TEST_CASE("KeepLast keeps the newest n") {
    auto files = files_saved_at_minutes({0, 1, 2, 3, 4, 5, 6});
    CHECK(ckpt::KeepLast{5}.to_delete(files) == std::vector<std::size_t>{0, 1});
    CHECK(ckpt::KeepLast{1}.to_delete(files) == std::vector<std::size_t>{0, 1, 2, 3, 4, 5});
    CHECK(ckpt::KeepLast{10}.to_delete(files).empty());
    CHECK_THROWS_AS(ckpt::KeepLast{0}, ckpt::ConfigError);
}

TEST_CASE("KeepOnePerMinutes keeps one file per window and always the newest") {
    auto files = files_saved_at_minutes({0, 0.5, 1.2, 1.9, 2.3, 4.0, 4.1});
    // kept: 0 (first), 1.2 (>= 1 after 0), 2.3 (>= 1 after 1.2), 4.0, 4.1 (newest)
    CHECK(ckpt::KeepOnePerMinutes{1}.to_delete(files) == std::vector<std::size_t>{1, 3});
    CHECK(ckpt::KeepAll{}.to_delete(files).empty());
}

TEST_CASE("KeepUnion deletes only what every member deletes") {
    auto files = files_saved_at_minutes({0, 0.5, 1.2, 1.9, 2.3, 4.0, 4.1});
    ckpt::KeepUnion both(ckpt::KeepLast{2}, ckpt::KeepOnePerMinutes{1});
    CHECK(both.to_delete(files) == std::vector<std::size_t>{1, 3});
    CHECK(ckpt::KeepUnion(ckpt::KeepLast{2}, ckpt::KeepAll{}).to_delete(files).empty());
}

TEST_CASE("KeepWithinBytes keeps the newest files whose sizes fit in its budget") {
    auto files = files_of_sizes({100, 300, 200, 100, 100});
    CHECK(files[1].file_size() == 300);
    CHECK(ckpt::KeepWithinBytes{400}.to_delete(files) == std::vector<std::size_t>{0, 1});  // 100 + 100 + 200
    // the first file over budget goes with every older one, even one small enough to fit
    CHECK(ckpt::KeepWithinBytes{399}.to_delete(files) == std::vector<std::size_t>{0, 1, 2});
    CHECK(ckpt::KeepWithinBytes{800}.to_delete(files).empty());
    CHECK(ckpt::KeepWithinBytes{799}.to_delete(files) == std::vector<std::size_t>{0});
    // the newest file stays even when it alone is over budget
    CHECK(ckpt::KeepWithinBytes{50}.to_delete(files) == std::vector<std::size_t>{0, 1, 2, 3});
    CHECK(ckpt::KeepWithinBytes{50}.to_delete({}).empty());
    CHECK(ckpt::KeepWithinBytes{std::uint64_t{5} << 40}.bytes == std::uint64_t{5} << 40);  // any integer type
    CHECK_THROWS_WITH_AS(ckpt::KeepWithinBytes{0}, doctest::Contains("at least 1 byte"), ckpt::ConfigError);
    CHECK_THROWS_AS(ckpt::KeepWithinBytes{-4096}, ckpt::ConfigError);
}

TEST_CASE("KeepWithinBytes composes: KeepUnion keeps what either keeps, KeepIntersection what both keep") {
    auto files = files_of_sizes({100, 100, 100, 500, 100, 100});
    const ckpt::KeepLast last4{4};            // deletes 0, 1
    const ckpt::KeepWithinBytes within{300};  // 100 + 100 fit, the 500 does not: deletes 0 to 3
    REQUIRE(last4.to_delete(files) == std::vector<std::size_t>{0, 1});
    REQUIRE(within.to_delete(files) == std::vector<std::size_t>{0, 1, 2, 3});
    CHECK(ckpt::KeepUnion(last4, within).to_delete(files) == std::vector<std::size_t>{0, 1});
    CHECK(ckpt::KeepIntersection(last4, within).to_delete(files) == std::vector<std::size_t>{0, 1, 2, 3});
    // "the newest 5, but within 10 GiB", and the neutral members
    CHECK(ckpt::KeepIntersection(ckpt::KeepLast{5}, ckpt::KeepWithinBytes{10LL << 30}).to_delete(files) ==
          std::vector<std::size_t>{0});
    CHECK(ckpt::KeepIntersection(last4, ckpt::KeepAll{}).to_delete(files) == last4.to_delete(files));
    CHECK(ckpt::KeepIntersection(ckpt::KeepLast{1}, ckpt::KeepAll{}, within).to_delete(files) ==
          std::vector<std::size_t>{0, 1, 2, 3, 4});
    // the two combinators nest
    auto minutes = files_saved_at_minutes({0, 0.5, 1.2, 1.9, 2.3, 4.0});
    for (std::size_t i = 0; i < minutes.size(); ++i) minutes[i].header.body_length = files[i].header.body_length;
    ckpt::KeepIntersection nested(ckpt::KeepUnion(ckpt::KeepLast{2}, ckpt::KeepOnePerMinutes{1}), within);
    // the union keeps 0 and 2 (KeepOnePerMinutes), the budget does not
    CHECK(nested.to_delete(minutes) == std::vector<std::size_t>{0, 1, 2, 3});
}
}

TEST_SUITE("naming policies") {

TEST_CASE("MindSporeNaming formats and parses the seed's names") {
    ckpt::MindSporeNaming n;
    auto p = at(7, 1875, 13125);
    CHECK(n.checkpoint_name("lenet", p, ckpt::SaveKind::regular) == "lenet-7_1875.ckpt");
    CHECK(n.checkpoint_name("lenet_1", p, ckpt::SaveKind::regular) == "lenet_1-7_1875.ckpt");
    CHECK(n.checkpoint_name("lenet", p, ckpt::SaveKind::breakpoint) == "lenet-7_1875_breakpoint.ckpt");
    CHECK(n.meta_name("lenet_1") == "lenet_1-graph.meta");
    auto parts = n.parse("lenet", "lenet_3-2_1875.ckpt");
    REQUIRE(parts);
    CHECK(parts->run == 3);
    CHECK(parts->run_prefix == "lenet_3");
    CHECK(parts->epoch == 2);
    CHECK(parts->step == 1875);
    CHECK(n.parse("lenet", "lenet-6_1875_breakpoint.ckpt")->kind == ckpt::SaveKind::breakpoint);
    for (const char* other : {"lenet-graph.meta", "lenet2-1_1.ckpt", "lenet_x-1_1.ckpt", "lenet-1_1.ckpt.tmp",
                              "lenet-1.ckpt", "lenet--1_1.ckpt", "lenet-1_1x.ckpt", "resnet-1_1.ckpt", "lenet_0-1_1.ckpt",
                              ".lenet-1_1.ckpt.tmp-12-0"})
        CHECK_MESSAGE(!n.parse("lenet", other), other);
}

TEST_CASE("a reused prefix gets _N, one above the highest run present, per save kind") {
    ckpt::MindSporeNaming n;
    using V = std::vector<std::string>;
    CHECK(n.run_prefix("lenet", V{}, ckpt::SaveKind::regular) == "lenet");
    CHECK(n.run_prefix("lenet", V{"lenet-graph.meta"}, ckpt::SaveKind::regular) == "lenet");
    CHECK(n.run_prefix("lenet", V{"lenet-6_1875.ckpt"}, ckpt::SaveKind::regular) == "lenet_1");
    CHECK(n.run_prefix("lenet", V{"lenet-6_1875.ckpt", "lenet_4-1_1.ckpt", "lenet_2-1_1.ckpt"},
                       ckpt::SaveKind::regular) == "lenet_5");
    CHECK(n.run_prefix("lenet", V{"lenet-6_1875_breakpoint.ckpt"}, ckpt::SaveKind::regular) == "lenet");
    CHECK(n.run_prefix("lenet", V{"lenet-6_1875_breakpoint.ckpt"}, ckpt::SaveKind::breakpoint) == "lenet_1");
    CHECK(n.run_prefix("lenet", V{"lenetx-6_1875.ckpt", "le-1_1.ckpt"}, ckpt::SaveKind::regular) == "lenet");
}

TEST_CASE("StepNaming and SingleFileNaming round-trip their names") {
    ckpt::StepNaming s;
    auto p = at(1, 500, 500);
    CHECK(s.checkpoint_name("heat", p, ckpt::SaveKind::regular) == "heat-500.ckpt");
    CHECK(s.parse("heat", "heat_2-500.ckpt")->global_step == 500);
    CHECK(!s.parse("heat", "heat-5_1.ckpt"));
    ckpt::SingleFileNaming one;
    CHECK(one.checkpoint_name("state", p, ckpt::SaveKind::regular) == "state.ckpt");
    CHECK_FALSE(one.parse("state", "state.ckpt")->positioned);
    CHECK(!one.parse("state", "state-1.ckpt"));
}

TEST_CASE("each naming policy gives its default retention scope") {
    using ckpt::RetentionScope;
    // bounded across restarts with either naming (the seed's tree is current_run, by option)
    CHECK(ckpt::default_retention_scope<ckpt::MindSporeNaming>() == RetentionScope::all_runs);
    CHECK(ckpt::default_retention_scope<ckpt::StepNaming>() == RetentionScope::all_runs);
    // one run only: the scopes are the same there
    CHECK(ckpt::default_retention_scope<ckpt::LastWordsNaming>() == RetentionScope::current_run);
    CHECK(ckpt::default_retention_scope<ckpt::SingleFileNaming>() == RetentionScope::current_run);
    static_assert(ckpt::NamingPolicy<PlainNaming>);
    CHECK(ckpt::default_retention_scope<PlainNaming>() == RetentionScope::current_run);
}

TEST_CASE("LastWordsNaming uses the seed's last-words layout") {
    ckpt::LastWordsNaming n;
    auto p = at(2, 17, 1892);
    p.rank = 3;
    const auto name = n.checkpoint_name("", p, ckpt::SaveKind::regular);
    CHECK(name == "tft_saved_checkpoints-step_1892/rank_3/ttp_rank_3-2_17.ckpt");
    auto parts = n.parse("", name);
    REQUIRE(parts);
    CHECK(parts->rank == 3);
    CHECK(parts->global_step == 1892);
    CHECK(parts->epoch == 2);
    CHECK(parts->step == 17);
    CHECK(!n.parse("", "tft_saved_checkpoints-step_1892/rank_3/ttp_rank_2-2_17.ckpt"));
    CHECK(!n.parse("", "tft_saved_checkpoints-step_x/rank_3/ttp_rank_3-2_17.ckpt"));
    CHECK(n.depth() == 2);
}
}

TEST_SUITE("config") {

TEST_CASE("CheckpointConfig follows the seed's rules") {
    ckpt::CheckpointConfig c;
    c.save_checkpoint_steps = 4;
    c.save_checkpoint_seconds = 1;  // steps win
    CHECK(saves_of(ckpt::ConfiguredSave(c)) == std::vector<std::string>{"1_4", "2_4", "3_4", "3_4t"});  // the manager skips the repeat
    c.save_checkpoint_steps = 0;
    c.save_checkpoint_seconds = 0;
    CHECK(saves_of(ckpt::ConfiguredSave(c)) == std::vector<std::string>{"3_4t"});  // the last step, always

    auto files = files_saved_at_minutes({0, 0.5, 1.2, 1.9, 2.3, 4.0, 4.1});
    c.keep_checkpoint_max = 2;
    c.keep_checkpoint_per_n_minutes = 1;  // max wins
    CHECK(ckpt::ConfiguredRetention(c).to_delete(files) == std::vector<std::size_t>{0, 1, 2, 3, 4});
    c.keep_checkpoint_max = 0;
    CHECK(ckpt::ConfiguredRetention(c).to_delete(files) == std::vector<std::size_t>{1, 3});
    c.keep_checkpoint_per_n_minutes = 0;
    c.save_checkpoint_steps = 1;
    CHECK(ckpt::ConfiguredRetention(c).to_delete(files).empty());

    ckpt::CheckpointConfig zero;
    zero.save_checkpoint_steps = zero.keep_checkpoint_max = 0;
    CHECK_THROWS_WITH_AS(ckpt::ConfiguredSave{zero}, doctest::Contains("cannot all be 0"), ckpt::ConfigError);
    ckpt::CheckpointConfig negative;
    negative.keep_checkpoint_max = -1;
    CHECK_THROWS_WITH_AS(ckpt::ConfiguredRetention{negative}, doctest::Contains("keep_checkpoint_max"),
                         ckpt::ConfigError);
}
}
