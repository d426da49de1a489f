// State that is not a float tensor, bound by reference (ckpt/bound.hpp): strings, bytes,
// lists of strings, maps, random engines and distributions, and Boost.Serialization objects,
// saved in every archive kind and written back whole by strict loads.
#include <boost/random/lagged_fibonacci.hpp>
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/serialization/map.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

#include <doctest/doctest.h>

#include <ckpt/interop.hpp>
#include <ckpt/object.hpp>
#include <fault/memory_level.hpp>

#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "support.hpp"

namespace {

struct Tally {
    std::int64_t hits = 0;
    std::vector<double> samples;
    std::map<std::string, int> by_label;
    std::string note;  // not serialized: a load leaves it as it was
    template <class Archive>
    void serialize(Archive& ar, unsigned) {
        ar & hits & samples & by_label;
    }
    friend bool operator==(const Tally& a, const Tally& b) {
        return a.hits == b.hits && a.samples == b.samples && a.by_label == b.by_label;
    }
};

/// Every kind of bound state, and a tensor beside it.
struct State {
    std::string name = "run \xce\xb1";
    std::string blob = std::string("\0\1\xff", 3);
    std::vector<std::byte> raw{std::byte{7}, std::byte{0}};
    std::vector<std::string> tags{"a", "", "\xff"};
    std::map<std::string, double> stats{{"mean", 0.25}, {"max", 3.5}};
    std::unordered_map<std::string, std::vector<std::int64_t>> hist{{"x", {1, 2, 3}}, {"y", {}}};
    std::map<std::string, std::string> labels{{"k", "v"}};
    std::map<std::string, float> empty_map;
    std::mt19937_64 engine{42};
    std::normal_distribution<double> normal{0.0, 2.0};
    Tally tally{3, {0.5, 1.5}, {{"a", 1}}, "kept"};
    std::vector<float> weights{1, 2, 3};

    ckpt::ParamDict dict() {
        ckpt::ParamDict d;
        d.set("name", ckpt::view_of(name));
        d.set("blob", ckpt::bytes_of(blob));
        d.set("raw", ckpt::bytes_of(raw));
        d.set("tags", ckpt::view_of(tags));
        d.set("stats", ckpt::view_of(stats));
        d.set("hist", ckpt::view_of(hist));
        d.set("labels", ckpt::view_of(labels));
        d.set("empty_map", ckpt::view_of(empty_map));
        d.set("engine", ckpt::view_of(engine));
        d.set("normal", ckpt::view_of(normal));
        d.set("tally", ckpt::object(tally));
        d.set("weights", ckpt::view_of(weights));
        return d;
    }
    void scramble() {
        name = "other";
        blob.clear();
        raw.assign(5, std::byte{1});
        tags = {"z"};
        stats["added"] = 1;
        stats.erase("mean");
        hist.clear();
        labels["k"] = "changed";
        empty_map["new"] = 1;
        engine.seed(1);
        normal.reset();
        tally = Tally{};
        tally.note = "kept";
        weights = {9, 9, 9};
    }
};

const ckpt::ArchiveKind all_archives[] = {ckpt::ArchiveKind::binary, ckpt::ArchiveKind::text, ckpt::ArchiveKind::xml};

}  // namespace

TEST_SUITE("bound") {

TEST_CASE("a strict load writes every bound kind back, whole, in every archive kind") {
    test::TempDir dir;
    for (const auto archive : all_archives) {
        CAPTURE(ckpt::archive_kind_name(archive));
        State s;
        s.engine();  // engines and distributions part-way through their streams
        s.normal(s.engine);
        auto d = s.dict();
        ckpt::SaveOptions opts;
        opts.archive = archive;
        ckpt::save_checkpoint(d, dir / "s.ckpt", opts);
        const State saved = s;
        std::mt19937_64 engine_copy = s.engine;
        std::normal_distribution<double> normal_copy = s.normal;
        const auto next = engine_copy();
        const auto next_normal = normal_copy(engine_copy);

        s.scramble();
        const auto report = ckpt::load_checkpoint_into(dir / "s.ckpt", d, true);
        CHECK(report.complete());
        CHECK(s.name == saved.name);
        CHECK(s.blob == saved.blob);
        CHECK(s.raw == saved.raw);
        CHECK(s.tags == saved.tags);
        CHECK(s.stats == saved.stats);  // the key added since the save is gone, the removed one back
        CHECK(s.hist == saved.hist);
        CHECK(s.labels == saved.labels);
        CHECK(s.empty_map.empty());
        CHECK(s.tally == saved.tally);
        CHECK(s.tally.note == "kept");
        CHECK(s.weights == saved.weights);
        // the same next numbers: the engine's state and the distribution's cached value
        CHECK(s.engine() == next);
        CHECK(s.normal(s.engine) == next_normal);
    }
}

TEST_CASE("a save reads bound variables when it is made, and load_checkpoint returns plain values") {
    test::TempDir dir;
    State s;
    auto d = s.dict();
    ckpt::save_checkpoint(d, dir / "s.ckpt");
    const auto loaded = ckpt::load_checkpoint(dir / "s.ckpt");
    CHECK(loaded.get<std::string>("name") == s.name);
    CHECK(loaded.at("blob").get_if<ckpt::Bytes>()->data == s.blob);
    CHECK(*loaded.at("tags").get_if<ckpt::Strings>() == s.tags);
    const auto* stats = loaded.at("stats").get_if<ckpt::Object>();
    REQUIRE(stats);
    CHECK(stats->type == "map<string, float64>");
    CHECK(stats->encoding == ckpt::ObjectEncoding::value_map);
    CHECK(loaded.at("engine").get_if<ckpt::Object>()->type == "std::mt19937_64");
    CHECK(loaded.at("tally").get_if<ckpt::Object>()->encoding == ckpt::ObjectEncoding::boost_binary);
    CHECK(loaded.at("hist").type_name() == "map<string, vector<int64>>");
    CHECK(d.at("stats").type_name() == "map<string, float64> (bound)");

    // the plain values load into bindings as a file's do
    State other;
    other.scramble();
    auto target = other.dict();
    CHECK(ckpt::load_param_into_net(target, loaded, true).complete());
    CHECK(other.stats == s.stats);
    CHECK(other.tally == s.tally);
}

TEST_CASE("an async save holds the bound values of the moment it was made") {
    test::TempDir dir;
    std::string phase = "before";
    std::map<std::string, std::int64_t> counts{{"a", 1}};
    ckpt::ManagerOptions o;
    o.async_save = true;
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(dir.path(), "a", ckpt::EverySteps{1},
                                                                                    ckpt::KeepLast{2}, {}, o);
    ckpt::ParamDict d;
    d.set("phase", ckpt::view_of(phase));
    d.set("counts", ckpt::view_of(counts));
    CHECK(mgr.on_step(ckpt::Progress::at_iteration(1), d));
    phase = "after";  // the training thread goes on while the file is written
    counts["b"] = 2;
    mgr.wait();
    phase.clear();
    counts.clear();
    CHECK(mgr.restore(d).has_value());
    CHECK(phase == "before");
    CHECK(counts == std::map<std::string, std::int64_t>{{"a", 1}});
}

TEST_CASE("a value that cannot be its variable's is a LoadMismatch naming the entry, and nothing changes") {
    test::TempDir dir;
    std::mt19937 small_engine(5);
    std::map<std::string, double> stats{{"m", 1.5}};
    std::string text = "saved";
    Tally tally{1, {2.0}, {}, ""};
    std::vector<float> w{1, 2};
    ckpt::ParamDict saved;
    saved.set("engine", ckpt::view_of(small_engine));
    saved.set("stats", ckpt::view_of(stats));
    saved.set("text", ckpt::view_of(text));
    saved.set("tally", ckpt::Object{ckpt::detail::cxx_type_name<Tally>(), ckpt::ObjectEncoding::boost_binary, "not an archive"});
    saved.set("w", ckpt::view_of(w));
    ckpt::save_checkpoint(saved, dir / "s.ckpt");

    std::mt19937_64 engine(9);
    std::map<std::string, std::int64_t> counts{{"n", 4}};
    std::map<std::string, double> stats_now{{"m", 0}};
    Tally tally_now{7, {}, {}, ""};
    std::vector<float> w_now{5, 5};
    const auto engine_before = engine;
    auto expect_unchanged = [&] {
        CHECK(engine == engine_before);
        CHECK(counts == std::map<std::string, std::int64_t>{{"n", 4}});
        CHECK(stats_now.at("m") == 0);
        CHECK(tally_now.hits == 7);
        CHECK(w_now == std::vector<float>{5, 5});
    };
    auto base = [&] {
        ckpt::ParamDict d;
        d.set("w", ckpt::view_of(w_now));
        d.set("engine", ckpt::view_of(small_engine));
        d.set("stats", ckpt::view_of(stats_now));
        d.set("text", ckpt::view_of(text));
        d.set("tally", ckpt::object(tally_now));
        return d;
    };
    SUBCASE("an engine of another type") {
        auto d = base();
        d.set("engine", ckpt::view_of(engine));
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "s.ckpt", d, true),
                             doctest::Contains(("loading '" + (dir / "s.ckpt").string() + "': entry 'engine'").c_str()),
                             ckpt::LoadMismatch);
        // the same from a text checkpoint (parsed, then loaded as a dictionary): the file named too
        ckpt::SaveOptions text_archive;
        text_archive.archive = ckpt::ArchiveKind::text;
        ckpt::save_checkpoint(ckpt::load_checkpoint(dir / "s.ckpt"), dir / "s.txt.ckpt", text_archive);
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "s.txt.ckpt", d, true),
                             doctest::Contains(("loading '" + (dir / "s.txt.ckpt").string() + "': entry 'engine'").c_str()),
                             ckpt::LoadMismatch);
    }
    SUBCASE("a map of other values") {
        auto d = base();
        d.set("stats", ckpt::view_of(counts));
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "s.ckpt", d, true),
                             doctest::Contains("key 'm' holds float64, the variable is a map<string, int64>"),
                             ckpt::LoadMismatch);
    }
    SUBCASE("a string where a map is bound") {
        auto d = base();
        d.set("text", ckpt::view_of(stats_now));
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "s.ckpt", d, true), doctest::Contains("'text'"),
                             ckpt::LoadMismatch);
    }
    SUBCASE("an object whose data is not an archive") {
        auto d = base();
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "s.ckpt", d, true),
                             doctest::Contains("entry 'tally': its data is not a boost binary archive"), ckpt::LoadMismatch);
    }
    SUBCASE("an object whose archive does not load: cut short") {
        Tally long_tally{5, std::vector<double>(100, 1.5), {{"k", 1}}, ""};
        ckpt::ParamDict whole;
        whole.set("tally", ckpt::object(long_tally));
        auto cut = *ckpt::detail::materialized(whole.at("tally"), ckpt::ObjectEncoding::boost_binary).get_if<ckpt::Object>();
        cut.data.resize(cut.data.size() / 2);  // in the middle of the samples
        ckpt::ParamDict file;
        file.set("tally", cut);
        file.set("w", ckpt::view_of(w));
        ckpt::save_checkpoint(file, dir / "cut.ckpt");
        ckpt::ParamDict d;
        d.set("tally", ckpt::object(tally_now));
        d.set("w", ckpt::view_of(w_now));
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "cut.ckpt", d, true),
                             doctest::Contains("entry 'tally': its boost binary archive of"), ckpt::LoadMismatch);
    }
    SUBCASE("a bound variable the file lacks") {
        auto d = base();
        std::string missing;
        d.set("missing", ckpt::view_of(missing));
        CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "s.ckpt", d, true),
                             doctest::Contains("missing from the checkpoint: 'missing'"), ckpt::LoadMismatch);
    }
    SUBCASE("not strict: reported, the value in the report's rest, the variable unchanged") {
        auto d = base();
        d.set("stats", ckpt::view_of(counts));
        d.erase("tally");
        const auto report = ckpt::load_checkpoint_into(dir / "s.ckpt", d, false);
        REQUIRE(report.mismatches.size() == 1);
        CHECK(report.mismatches[0].find("'stats'") != std::string::npos);
        CHECK(report.rest.contains("stats"));
        CHECK(counts == std::map<std::string, std::int64_t>{{"n", 4}});
        CHECK(w_now == std::vector<float>{1, 2});  // what matched was loaded
        return;
    }
    expect_unchanged();
}

TEST_CASE("every standard engine and Boost.Random's draw the same next numbers after a load") {
    test::TempDir dir;
    auto check = [&](auto engine) {
        using E = decltype(engine);
        CAPTURE(ckpt::detail::cxx_type_name<E>());
        engine.discard(1000);
        E copy = engine;
        ckpt::ParamDict d;
        d.set("e", ckpt::view_of(engine));
        ckpt::save_checkpoint(d, dir / "e.ckpt");
        engine.seed(3);
        ckpt::load_checkpoint_into(dir / "e.ckpt", d, true);
        for (int i = 0; i < 5; ++i) CHECK(engine() == copy());
    };
    check(std::minstd_rand0{});
    check(std::minstd_rand{});
    check(std::mt19937{});
    check(std::mt19937_64{});
    check(std::ranlux24_base{});
    check(std::ranlux48_base{});
    check(std::ranlux24{});
    check(std::ranlux48{});
    check(std::knuth_b{});
    check(boost::random::mt19937{});
    check(boost::random::lagged_fibonacci607{});

    boost::random::mt19937 gen(1);
    boost::random::normal_distribution<double> normal(0, 1);
    normal(gen);  // holds its second value now
    auto normal_copy = normal;
    auto gen_copy = gen;
    ckpt::ParamDict d;
    d.set("gen", ckpt::view_of(gen));
    d.set("normal", ckpt::view_of(normal));
    ckpt::save_checkpoint(d, dir / "b.ckpt");
    gen.seed(2);
    normal.reset();
    ckpt::load_checkpoint_into(dir / "b.ckpt", d, true);
    CHECK(normal(gen) == normal_copy(gen_copy));
}

TEST_CASE("a malformed value map is refused where it is decoded") {
    using ckpt::detail::MapTag;
    const std::string good = ckpt::detail::encode_value_map(
        {{"a", MapTag::number, ckpt::DType::float64, std::string(8, '\0')}, {"b", MapTag::string, ckpt::DType::uint8, "x"}});
    CHECK(ckpt::detail::decode_value_map(good, "m").size() == 2);
    const std::string backwards = ckpt::detail::encode_value_map(
        {{"b", MapTag::string, ckpt::DType::uint8, "x"}, {"a", MapTag::string, ckpt::DType::uint8, "y"}});
    CHECK_THROWS_WITH_AS(ckpt::detail::decode_value_map(backwards, "m"), doctest::Contains("increasing order"),
                         ckpt::FormatError);
    std::string huge = good;
    huge[7] = '\x10';  // the count's top byte
    CHECK_THROWS_WITH_AS(ckpt::detail::decode_value_map(huge, "m"), doctest::Contains("items, more than"), ckpt::FormatError);
    CHECK_THROWS_WITH_AS(ckpt::detail::decode_value_map(good + "z", "m"), doctest::Contains("follow the last item"),
                         ckpt::FormatError);
    CHECK_THROWS_WITH_AS(ckpt::detail::decode_value_map(good.substr(0, good.size() - 1), "m"),
                         doctest::Contains("runs past its end"), ckpt::FormatError);
    std::string tag = good;
    tag[8 + 8 + 1] = '\x09';  // the first item's tag
    CHECK_THROWS_WITH_AS(ckpt::detail::decode_value_map(tag, "m"), doctest::Contains("tag 9"), ckpt::FormatError);

    // through a load: a LoadMismatch naming the entry
    test::TempDir dir;
    ckpt::ParamDict d;
    d.set("m", ckpt::Object{"map<string, float64>", ckpt::ObjectEncoding::value_map, backwards});
    ckpt::save_checkpoint(d, dir / "m.ckpt");
    std::map<std::string, std::string> target;
    ckpt::ParamDict t;
    t.set("m", ckpt::view_of(target));
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(dir / "m.ckpt", t, true), doctest::Contains("entry 'm'"),
                         ckpt::LoadMismatch);
}

TEST_CASE("the memory level carries bound values and the kinds of 0.2") {
    State s;
    fault::PackedState packed;
    packed.pack(s.dict(), 3);
    const auto unpacked = packed.unpack("state");
    CHECK(unpacked.at("blob").get_if<ckpt::Bytes>()->data == s.blob);
    CHECK(*unpacked.at("tags").get_if<ckpt::Strings>() == s.tags);
    CHECK(unpacked.at("tally").get_if<ckpt::Object>()->type == ckpt::detail::cxx_type_name<Tally>());
    State other;
    other.scramble();
    auto target = other.dict();
    CHECK(ckpt::load_param_into_net(target, unpacked, true).complete());
    CHECK(other.hist == s.hist);
    CHECK(other.tally == s.tally);
    CHECK(other.name == s.name);
}

TEST_CASE("safetensors and npz refuse what they cannot hold, by entry, and take bound strings") {
    test::TempDir dir;
    std::map<std::string, double> stats{{"a", 1}};
    std::string note = "n";
    ckpt::ParamDict d;
    d.set("note", ckpt::view_of(note));
    CHECK_NOTHROW(ckpt::save_safetensors(d, dir / "ok.safetensors"));
    CHECK(ckpt::load_safetensors(dir / "ok.safetensors").get<std::string>("note") == "n");
    d.set("stats", ckpt::view_of(stats));
    CHECK_THROWS_WITH_AS(ckpt::save_safetensors(d, dir / "s.safetensors"),
                         doctest::Contains("entry 'stats' is map<string, float64>, which safetensors cannot hold"),
                         ckpt::ConfigError);
    CHECK_THROWS_WITH_AS(ckpt::save_npz(d, dir / "s.npz"), doctest::Contains("which npz cannot hold"), ckpt::ConfigError);
    CHECK_FALSE(boost::filesystem::exists(dir / "s.npz"));
}

}  // TEST_SUITE
