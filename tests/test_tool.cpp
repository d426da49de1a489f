// The ckpt command-line tool (tools/ckpt.cpp): every subcommand, its output and its exit codes.
#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/codecs/zstd.hpp>
#include <ckpt/interop.hpp>
#include <ckpt/reshard.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "interop_pattern.hpp"
#include "python_scripts.hpp"
#include "support.hpp"

namespace {

using json = nlohmann::json;

struct ToolRun {
    int status = -1;
    std::string out, err;
};

/// Runs the tool with `args`, stdout and stderr kept apart; fails the test after 60 s. `env`
/// ("NAME=value") replaces those variables of the test's environment.
ToolRun ckpt_tool(const std::vector<std::string>& args, const test::fs::path& scratch,
                  const std::vector<std::string>& env = {}) {
    const std::string out = (scratch / ".tool.out").string(), err = (scratch / ".tool.err").string();
    std::vector<std::string> argv{CKPT_TOOL};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> raw;
    for (auto& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    std::vector<std::string> environment(env);
    for (char** e = environ; *e; ++e) {
        const std::string entry = *e;
        const auto name = entry.substr(0, entry.find('=') + 1);
        if (std::none_of(env.begin(), env.end(), [&](const std::string& o) { return o.starts_with(name); }))
            environment.push_back(entry);
    }
    std::vector<char*> raw_env;
    for (auto& e : environment) raw_env.push_back(e.data());
    raw_env.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, raw[0], &actions, nullptr, raw.data(), raw_env.data());
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(rc == 0);
    ToolRun r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    int st = 0;
    while (::waitpid(pid, &st, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &st, 0);
            FAIL("ckpt tool did not finish within 60 s");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    auto slurp = [](const std::string& p) {
        auto b = test::read_bytes(p);
        return std::string(b.begin(), b.end());
    };
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// Whether `s` holds a byte a terminal would act on: a C0 control but the line feed, DEL, or a
/// C1 control (U+0080 to U+009F in UTF-8).
bool raw_controls(const std::string& s) {
    for (std::size_t i = 0; i < s.size(); ++i) {
        const auto b = static_cast<unsigned char>(s[i]);
        if ((b < 0x20 && b != '\n') || b == 0x7f) return true;
        if (b == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
            static_cast<unsigned char>(s[i + 1]) <= 0x9f)
            return true;
    }
    return false;
}

void save_at(const ckpt::ParamDict& d, const test::fs::path& p, std::int64_t epoch, std::int64_t step) {
    test::fs::create_directories(p.parent_path());
    ckpt::save_checkpoint(d, p, {.epoch = epoch, .step = step});
}

ckpt::ParamDict small_state(float scale) {
    ckpt::ParamDict d;
    d.set("layer.weight", ckpt::Tensor::from(std::vector<float>{1 * scale, 2 * scale, 3 * scale, 4 * scale}, {2, 2}));
    d.set("layer.bias", ckpt::Tensor::from(std::vector<double>{0.5, -0.5}));
    d.set("epoch_num", std::int64_t{3});
    d.set("note", std::string("hello"));
    return d;
}

}  // namespace

TEST_SUITE("tool") {

TEST_CASE("ckpt --help and every subcommand's --help exit 0 with usage on stdout, usage errors exit 2") {
    test::TempDir dir;
    auto top = ckpt_tool({"--help"}, dir.path());
    CHECK(top.status == 0);
    for (const char* sub : {"ls", "show", "verify", "diff", "export", "import", "plot"}) {
        CAPTURE(sub);
        CHECK(contains(top.out, sub));
        auto r = ckpt_tool({sub, "--help"}, dir.path());
        CHECK(r.status == 0);
        CHECK(contains(r.out, std::string("Usage:")));
        CHECK(r.err.empty());
    }
    for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
             {}, {"frobnicate"}, {"show"}, {"diff", "a.ckpt"}, {"ls", "d", "--bogus"}, {"diff", "a", "b", "--atol", "-1"},
             {"import", "in.npz", "out.ckpt", "--archive", "zip"}}) {
        CAPTURE(bad.size());
        auto r = ckpt_tool(bad, dir.path());
        CHECK(r.status == 2);
        CHECK(contains(r.err, "--help"));
    }
    auto wrong_ext = ckpt_tool({"export", "x.ckpt", (dir / "out.txt").string()}, dir.path());
    CHECK(wrong_ext.status == 2);
    CHECK(contains(wrong_ext.err, "must end in .safetensors or .npz"));
}

TEST_CASE("ckpt ls lists every layout in order, with validity and what latest picks") {
    test::TempDir dir;
    const auto root = dir.path();
    const auto s = small_state(1);
    for (int e = 1; e <= 3; ++e) save_at(s, root / ("lenet-" + std::to_string(e) + "_10.ckpt"), e, 10);
    save_at(s, root / "lenet_1-4_10.ckpt", 4, 10);
    save_at(s, root / "lenet_1-5_10.ckpt", 5, 10);
    save_at(s, root / "lenet_1-5_3_breakpoint.ckpt", 5, 3);
    save_at(s, root / "heat-250.ckpt", 1, 250);
    save_at(s, root / "heat-500.ckpt", 1, 500);
    for (int r = 0; r < 2; ++r) {
        save_at(s, root / "ttp" / "tft_saved_checkpoints-step_7" / ("rank_" + std::to_string(r)) /
                       ("ttp_rank_" + std::to_string(r) + "-1_7.ckpt"), 1, 7);
        save_at(s, root / ("rank_" + std::to_string(r)) / "mlp-1_5.ckpt", 1, 5);
    }
    test::flip_bit(root / "lenet_1-5_10.ckpt", 200);  // the newest regular file is damaged
    test::write_bytes(root / ".lenet-9_10.ckpt.tmp-1-0", {'x'});  // a temporary is no checkpoint

    auto r = ckpt_tool({"ls", root.string(), "--json"}, dir.path());
    REQUIRE(r.status == 0);
    const auto j = json::parse(r.out);
    std::map<std::string, json> groups;
    for (const auto& g : j["checkpoints"]) groups[g["group"].get<std::string>()] = g;
    INFO(r.out);
    const auto lenet = groups.at((root.string()) + " prefix 'lenet'")["checkpoints"];
    std::vector<std::string> order;
    for (const auto& c : lenet) order.push_back(test::fs::path(c["path"].get<std::string>()).filename().string());
    CHECK(order == std::vector<std::string>{"lenet-1_10.ckpt", "lenet-2_10.ckpt", "lenet-3_10.ckpt", "lenet_1-4_10.ckpt",
                                            "lenet_1-5_3_breakpoint.ckpt", "lenet_1-5_10.ckpt"});
    CHECK(lenet[4]["kind"] == "breakpoint");
    CHECK(lenet[5]["valid"] == false);
    CHECK(contains(lenet[5]["problem"].get<std::string>(), "corrupt"));
    CHECK(lenet[3]["latest"] == true);  // what ckpt::latest() returns: the damaged file and the breakpoint are passed over
    test::LogCapture quiet;  // latest() warns about the damaged file
    CHECK(ckpt::latest(root, "lenet")->filename() == "lenet_1-4_10.ckpt");
    const auto heat = groups.at(root.string() + " prefix 'heat'");
    CHECK(heat["naming"] == "StepNaming");
    CHECK(heat["checkpoints"][1]["latest"] == true);
    const auto ttp = groups.at((root / "ttp").string())["checkpoints"];
    REQUIRE(ttp.size() == 2);
    CHECK(ttp[0]["kind"] == "last_words");
    CHECK(ttp[1]["rank"] == 1);
    CHECK((ttp[0]["latest"] == true && ttp[1]["latest"] == true));
    CHECK(groups.count((root / "rank_1").string() + " prefix 'mlp'") == 1);
    for (const auto& [name, g] : groups)
        for (const auto& c : g["checkpoints"]) CHECK_FALSE(contains(c["path"].get<std::string>(), ".tmp-"));

    auto text = ckpt_tool({"ls", root.string(), "--prefix", "lenet"}, dir.path());
    CHECK(text.status == 0);
    CHECK(contains(text.out, "lenet_1-4_10.ckpt"));
    CHECK(contains(text.out, "<- latest"));
    CHECK(contains(text.out, "INVALID"));
    CHECK_FALSE(contains(text.out, "heat-"));
    auto missing = ckpt_tool({"ls", (root / "nowhere").string()}, dir.path());
    CHECK(missing.status == 1);
    CHECK(contains(missing.err, "nowhere"));
}

TEST_CASE("ckpt ls shows each checkpoint's recorded metrics, and --best marks the best that verifies") {
    test::TempDir dir;
    const auto root = dir.path();
    test::LogCapture quiet;
    std::int64_t step = 0;
    ckpt::ParamDict state;
    state.set("step", ckpt::view_of(step));
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> mgr(root, "fit", ckpt::EverySteps{1});
    const double losses[] = {0.5, 0.2, 0.3, 0.1};
    for (step = 1; step <= 4; ++step) {
        auto p = ckpt::Progress::at_iteration(step);
        p.metrics = {{"val_loss", losses[step - 1]}, {"accuracy", 1 - losses[step - 1]}};
        mgr.on_step(p, state);
    }
    test::flip_bit(root / "fit-4.ckpt", test::read_bytes(root / "fit-4.ckpt").size() - 1);  // the best is damaged

    auto text = ckpt_tool({"ls", root.string(), "--best", "val_loss"}, dir.path());
    INFO(text.out, text.err);
    REQUIRE(text.status == 0);
    auto line_of = [&](const std::string& file) {
        const auto at = text.out.find(file);
        REQUIRE(at != std::string::npos);
        return text.out.substr(at, text.out.find('\n', at) - at);
    };
    CHECK(contains(line_of("fit-1.ckpt"), "accuracy=0.5 val_loss=0.5"));
    CHECK(contains(line_of("fit-2.ckpt"), "<- best val_loss"));  // 0.1 at step 4 does not verify
    CHECK_FALSE(contains(line_of("fit-4.ckpt"), "<- best"));
    CHECK(contains(line_of("fit-3.ckpt"), "<- latest"));
    CHECK(ckpt::best(root, "fit", "val_loss")->filename() == "fit-2.ckpt");  // the same choice

    auto as_json = ckpt_tool({"ls", root.string(), "--best", "accuracy:max", "--json"}, dir.path());
    REQUIRE(as_json.status == 0);
    const auto fit = json::parse(as_json.out)["checkpoints"][0]["checkpoints"];
    REQUIRE(fit.size() == 4);
    CHECK(fit[1]["best"] == true);
    CHECK(fit[0]["best"] == false);
    CHECK(fit[2]["metrics"]["val_loss"] == 0.3);

    // a metric no file records (misspelled): nothing marked, and a word saying what is recorded
    auto missing = ckpt_tool({"ls", root.string(), "--best", "val-loss"}, dir.path());
    CHECK(missing.status == 0);
    CHECK_FALSE(contains(missing.out, "<- best"));
    CHECK(contains(missing.err, "no checkpoint here that verifies records the metric 'val-loss'; recorded: 'accuracy', 'val_loss'"));

    CHECK(ckpt_tool({"ls", root.string(), "--best", "accuracy:most"}, dir.path()).status == 2);
    CHECK(ckpt_tool({"ls", root.string(), "--best", "val_loss", "--headers-only"}, dir.path()).status == 2);

    // compressed bodies need no key: their metrics are shown too
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming, ckpt::BinaryArchive, ckpt::Zstd> packed(
        root / "zstd", "fit", ckpt::EverySteps{1}, {}, {}, {}, ckpt::Zstd{3});
    auto p = ckpt::Progress::at_iteration(1);
    p.metrics = {{"val_loss", 0.25}};
    packed.on_step(p, state);
    auto zstd = ckpt_tool({"ls", (root / "zstd").string(), "--best", "val_loss"}, dir.path());
    INFO(zstd.out, zstd.err);
    CHECK(zstd.status == 0);
    CHECK(contains(zstd.out, "val_loss=0.25"));
    CHECK(contains(zstd.out, "<- best val_loss"));
}

TEST_CASE("ckpt plot draws recorded metrics over the global step as a PNG, marks the restart and prints the points") {
    test::TempDir dir;
    const auto root = dir / "ckpts";
    test::LogCapture quiet;
    std::int64_t step = 0;
    ckpt::ParamDict state;
    state.set("step", ckpt::view_of(step));
    // Run "exp" saves steps 1 to 3; restarted, run "exp_1" saves steps 4 and 5.
    for (const auto& [first, last] : {std::pair{1, 3}, std::pair{4, 5}}) {
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> mgr(root, "exp", ckpt::EverySteps{1});
        for (step = first; step <= last; ++step) {
            auto p = ckpt::Progress::at_iteration(step);
            p.metrics = {{"val_loss", 1.0 / static_cast<double>(step)}};
            if (step != 2) p.metrics.emplace_back("accuracy", 0.125 * static_cast<double>(step));
            mgr.on_step(p, state);
        }
    }
    REQUIRE(test::fs::exists(root / "exp_1-4.ckpt"));
    test::flip_bit(root / "exp-3.ckpt", test::fs::file_size(root / "exp-3.ckpt") - 1);  // not drawn
    const auto png = dir / "metrics.png";

    auto r = ckpt_tool({"plot", root.string(), "--metric", "val_loss", "--metric", "accuracy", "-o", png.string()},
                       dir.path());
    INFO(r.out, r.err);
    REQUIRE(r.status == 0);
    const auto bytes = test::read_bytes(png);
    const std::vector<std::uint8_t> signature{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    REQUIRE(bytes.size() > 4000);  // a 1000 x 600 picture with lines and text
    CHECK(bytes.size() < 1'000'000);
    CHECK(std::equal(signature.begin(), signature.end(), reinterpret_cast<const std::uint8_t*>(bytes.data())));
    auto row = [&](const std::string& file) {
        const auto at = r.out.find("  " + file);
        REQUIRE(at != std::string::npos);
        const auto begin = r.out.rfind('\n', at) + 1;
        std::istringstream line(r.out.substr(begin, r.out.find('\n', at) - begin));
        std::vector<std::string> fields;
        for (std::string field; line >> field;) fields.push_back(field);
        return fields;
    };
    CHECK(row("exp-1.ckpt") == std::vector<std::string>{"1", "exp", "1", "0.125", "exp-1.ckpt"});
    CHECK(row("exp-2.ckpt") == std::vector<std::string>{"2", "exp", "0.5", "-", "exp-2.ckpt"});
    CHECK(row("exp_1-4.ckpt") == std::vector<std::string>{"4", "exp_1", "0.25", "0.5", "exp_1-4.ckpt"});
    CHECK(row("exp_1-5.ckpt") == std::vector<std::string>{"5", "exp_1", "0.2", "0.625", "exp_1-5.ckpt"});
    CHECK(contains(r.out, "restart at step 4: run 'exp_1'\n"));
    CHECK(contains(r.out, "2 series, 4 points, 1 restart\n"));
    CHECK_FALSE(contains(r.out, "exp-3.ckpt"));
    CHECK(contains(r.err, "skipped '" + (root / "exp-3.ckpt").string() + "'"));
    CHECK(contains(r.err, "corrupt"));

    // An existing picture is kept without --force, replaced with it; no temporary is left.
    auto again = ckpt_tool({"plot", root.string(), "--metric", "val_loss", "-o", png.string()}, dir.path());
    CHECK(again.status == 1);
    CHECK(contains(again.err, "pass --force"));
    CHECK(test::read_bytes(png) == bytes);
    CHECK(ckpt_tool({"plot", root.string(), "--metric", "val_loss", "-o", png.string(), "--force"}, dir.path()).status == 0);
    CHECK(test::read_bytes(png) != bytes);  // one series now
    for (const auto& e : test::fs::directory_iterator(dir.path()))
        CHECK_FALSE(contains(e.path().filename().string(), ".tmp-"));

    // A metric no checkpoint records, no gnuplot, a gnuplot that hangs: exit 1, naming DIR
    // and the metric, and no picture.
    const auto other = dir / "other.png";
    auto none = ckpt_tool({"plot", root.string(), "--metric", "bleu", "-o", other.string()}, dir.path());
    CHECK(none.status == 1);
    CHECK(contains(none.err, "'" + root.string() + "'"));
    CHECK(contains(none.err, "metric 'bleu'"));
    CHECK(contains(none.err, "they record accuracy, val_loss"));
    test::fs::create_directories(dir / "bin");
    auto missing = ckpt_tool({"plot", root.string(), "--metric", "val_loss", "-o", other.string()}, dir.path(),
                             {"PATH=" + (dir / "bin").string()});
    CHECK(missing.status == 1);
    CHECK(contains(missing.err, "gnuplot not found: apt-get install gnuplot-nox"));
    CHECK(contains(missing.err, "'val_loss' of '" + root.string() + "'"));
    const std::string hang = "#!/bin/sh\nexec sleep 30\n";
    test::write_bytes(dir / "bin" / "gnuplot", std::vector<char>(hang.begin(), hang.end()));
    test::fs::permissions(dir / "bin" / "gnuplot", test::fs::perms::owner_all);
    const auto started = std::chrono::steady_clock::now();
    auto hung = ckpt_tool({"plot", root.string(), "--metric", "val_loss", "-o", other.string(), "--timeout", "1"},
                          dir.path(), {"PATH=" + (dir / "bin").string() + ":/usr/bin:/bin"});
    CHECK(hung.status == 1);
    CHECK(contains(hung.err, "gnuplot did not finish within 1 s"));
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(20));
    CHECK_FALSE(test::fs::exists(other));

    // usage errors
    CHECK(ckpt_tool({"plot", root.string(), "-o", other.string()}, dir.path()).status == 2);
    CHECK(ckpt_tool({"plot", root.string(), "--metric", "val_loss"}, dir.path()).status == 2);
    auto jpg = ckpt_tool({"plot", root.string(), "--metric", "val_loss", "-o", (dir / "m.jpg").string()}, dir.path());
    CHECK(jpg.status == 2);
    CHECK(contains(jpg.err, "must end in .png"));
}

TEST_CASE("ckpt show prints the header and entries without reading payloads, --stats adds statistics") {
    test::TempDir dir;
    ckpt::ParamDict d = small_state(1);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    d.set("odd", ckpt::Tensor::from(std::vector<float>{1, nan, 3, inf, -inf, 5}, {2, 3}));
    const auto file = dir / "s.ckpt";
    ckpt::save_checkpoint(d, file, {.epoch = 4, .step = 17});

    auto r = ckpt_tool({"show", file.string()}, dir.path());
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, "epoch 4, step 17"));
    CHECK(contains(r.out, "layer.weight"));
    CHECK(contains(r.out, "[2, 2]"));
    CHECK(contains(r.out, "\"hello\""));

    auto j = json::parse(ckpt_tool({"show", file.string(), "--stats", "--json"}, dir.path()).out);
    CHECK(j["header"]["epoch"] == 4);
    CHECK(j["header"]["archive"] == "binary");
    CHECK(j["checksum_verified"] == true);
    const auto& odd = j["entries"][4];
    CHECK(odd["name"] == "odd");
    CHECK(odd["stats"]["nan"] == 1);
    CHECK(odd["stats"]["inf"] == 2);
    CHECK(odd["stats"]["min"] == 1.0);
    CHECK(odd["stats"]["max"] == 5.0);
    CHECK(odd["stats"]["mean"] == 3.0);
    CHECK(odd["stats"]["std"].get<double>() == doctest::Approx(std::sqrt(8.0 / 3.0)));
    CHECK(j["entries"][2]["value"] == 3);

    // A damaged payload: show without --stats does not read it; --stats verifies and fails.
    test::flip_bit(file, test::fs::file_size(file) - 2);
    CHECK(ckpt_tool({"show", file.string()}, dir.path()).status == 0);
    auto stats = ckpt_tool({"show", file.string(), "--stats"}, dir.path());
    CHECK(stats.status == 1);
    CHECK(contains(stats.err, file.string()));
    CHECK(contains(stats.err, "corrupt"));
    auto not_ckpt = ckpt_tool({"show", (dir / ".tool.out").string()}, dir.path());
    CHECK(not_ckpt.status == 1);
    CHECK(contains(not_ckpt.err, "not a ckpt checkpoint"));
}

TEST_CASE("ckpt show of safetensors, npz and PyTorch files reads what listing needs, --stats the tensors") {
    test::TempDir dir;
    const auto hostile = test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile";
    // bytes only reading the tensors finds wrong: a BOOL of 2, a storage that fails its CRC
    auto pt = test::read_bytes(hostile / "ok.pt");
    const std::string one("\x00\x00\x80\x3f", 4);  // 1.0f, the storage's first element
    const auto at = std::search(pt.begin(), pt.end(), one.begin(), one.end());
    REQUIRE(at != pt.end());
    at[3] = '\x40';
    test::write_bytes(dir / "crc.pt", pt);
    const std::vector<std::pair<std::string, std::string>> files = {
        {(hostile / "bool-byte-2.safetensors").string(), "(header read; --stats reads the tensors)"},
        {(hostile / "bool-byte-2.npz").string(), "(zip directory and npy headers read; --stats reads the tensors)"},
        {(dir / "crc.pt").string(), "(zip directory and pickle read; --stats reads the tensors)"}};
    for (const auto& [file, said] : files) {
        const std::string& shown = file;  // clang 14 captures no binding
        CAPTURE(shown);
        auto r = ckpt_tool({"show", file}, dir.path());
        CHECK(r.status == 0);
        CHECK(contains(r.out, said));
        r = ckpt_tool({"show", "--stats", file}, dir.path());
        CHECK(r.status == 1);
        CHECK(contains(r.err, file));
    }
    const auto pt_list = ckpt_tool({"show", (dir / "crc.pt").string()}, dir.path());
    CHECK(contains(pt_list.out, "float32"));
    CHECK(contains(pt_list.out, "[2, 2]"));
    CHECK(contains(pt_list.out, "epoch"));
}

namespace {

/// Runs `ckpt show FILE` (with --stats: every tensor read) on every case of the hostile corpus
/// (tests/hostile/cases.json); `check` gets each case and its run.
void show_every_hostile_file(bool stats, const std::function<void(const json&, const ToolRun&)>& check) {
    test::TempDir dir;
    const auto hostile = test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile";
    std::ifstream in((hostile / "cases.json").string());
    const auto cases = json::parse(in);
    REQUIRE(cases.size() >= 10);
    for (const auto& c : cases) {
        const std::string file = (hostile / c.at("file").get<std::string>()).string();
        CAPTURE(file);
        std::vector<std::string> args{"show", file};
        if (stats) args.push_back("--stats");
        const auto r = ckpt_tool(args, dir.path());
        CHECK((r.status == 0 || r.status == 1));  // never a crash
        CHECK_FALSE(raw_controls(r.out));
        CHECK_FALSE(raw_controls(r.err));
        check(c, r);
    }
}

}  // namespace

TEST_CASE("ckpt show lists or refuses every hostile file, and nothing it prints holds a raw control character") {
    show_every_hostile_file(false, [](const json& c, const ToolRun& r) {
        if (c.at("expect") == "ok") CHECK(r.status == 0);
    });
}

TEST_CASE("ckpt show --stats gives every hostile file its verdict, printed escaped") {
    show_every_hostile_file(true, [](const json& c, const ToolRun& r) {
        CHECK(r.status == (c.at("expect") == "ok" ? 0 : 1));
        if (r.status == 1) CHECK(contains(r.err, c.at("contains").get<std::string>()));
    });
}

TEST_CASE("names, paths, prefixes and metrics reach the terminal escaped from every command, and --json stays exact") {
    test::TempDir dir;
    const std::string loud = "\x1b]0;owned\x07", metric = "\x1b[2Jloss";
    const auto runs = dir / ("runs" + loud);
    test::fs::create_directories(runs);
    ckpt::ParamDict d = small_state(1);
    d.set("\x1b[31mw\r", ckpt::Tensor::from(std::vector<float>{1, 2}));
    d.set("note", std::string("\x1b[2J\xc2\x9b" "1m"));
    ckpt::detail::record_metrics(d, {{metric, 0.5}});
    const auto file = runs / ("p" + loud + "-1_5.ckpt");
    save_at(d, file, 1, 5);
    d.tensor("\x1b[31mw\r").values<float>()[0] = 9;
    const auto other = runs / ("p" + loud + "-1_6.ckpt");
    save_at(d, other, 1, 6);
    test::write_bytes(runs / (".p" + loud + "-1_7.ckpt.tmp-999999-0"), {'x'});  // a temporary of a writer gone
    auto quiet = [](const ToolRun& r) {
        CHECK_FALSE(raw_controls(r.out));
        CHECK_FALSE(raw_controls(r.err));
    };
    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {"ls", dir.path().string()},
             {"ls", runs.string(), "--best", metric},
             {"ls", runs.string(), "--prefix", "p" + loud},
             {"verify", runs.string()},
             {"show", file.string()},
             {"show", file.string(), "--stats"},
             {"diff", file.string(), other.string()},
             {"export", file.string(), (dir / ("out" + loud + ".safetensors")).string()},
             {"import", (dir / ("out" + loud + ".safetensors")).string(), (dir / ("back" + loud + ".ckpt")).string()},
             {"show", (dir / "absent\x1b[2J.ckpt").string()}}) {
        CAPTURE(args.front());
        const auto r = ckpt_tool(args, dir.path());
        quiet(r);
        CHECK(contains(r.out + r.err, "\\x1b"));
    }
    const auto ls = ckpt_tool({"ls", runs.string(), "--best", metric}, dir.path());
    CHECK(contains(ls.out, "\\x1b[2Jloss=0.5"));
    CHECK(contains(ls.out, "<- best \\x1b[2Jloss"));
    CHECK(contains(ls.out, "p\\x1b]0;owned\\x07-1_5.ckpt"));
    // --json: the same names, exact
    const auto j = json::parse(ckpt_tool({"ls", runs.string(), "--json"}, dir.path()).out);
    CHECK(j["checkpoints"][0]["checkpoints"][0]["path"] == file.string());
    CHECK(j["checkpoints"][0]["checkpoints"][0]["metrics"][metric] == 0.5);
    const auto shown = ckpt_tool({"show", file.string(), "--json"}, dir.path());
    quiet(shown);
    const auto entries = json::parse(shown.out)["entries"];
    bool found = false;
    for (const auto& e : entries) found |= e["name"] == "\x1b[31mw\r";
    CHECK(found);
    CHECK(contains(shown.out, "\"\\u001b[2J\\u009b1m\""));  // the C1 control escaped too
}

TEST_CASE("ckpt show and --json of names and strings that are not UTF-8: escaped text, and JSON that keeps every byte") {
    test::TempDir dir;
    const auto file = (test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile" / "names-not-utf8.ckpt").string();
    auto r = ckpt_tool({"show", file}, dir.path());
    CHECK(r.status == 0);
    CHECK(contains(r.out, "w\\xff"));
    CHECK(contains(r.out, "\"\\udcfe\\udcff\""));
    r = ckpt_tool({"show", file, "--json"}, dir.path());
    CHECK(r.status == 0);
    CHECK(contains(r.out, "\"name\": \"w\\udcff\""));  // a byte that is not UTF-8, as Python's surrogateescape reads it
    CHECK(contains(r.out, "\"value\": \"\\udcfe\\udcff\""));
    CHECK(r.err.empty());
}

TEST_CASE("ckpt export writes nothing its own import would refuse: unsafe zip member names, bool bytes but 0 and 1") {
    test::TempDir dir;
    const auto file = (test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile" / "bool-tensor-byte-2.ckpt").string();
    CHECK(ckpt_tool({"show", "--stats", file}, dir.path()).status == 0);
    auto r = ckpt_tool({"export", file, (dir / "out.npz").string(), "--select", "/"}, dir.path());
    CHECK(r.status == 1);
    CHECK(contains(r.err, "would be the zip member '../../x.npy'"));
    CHECK(contains(r.err, "--rename"));
    r = ckpt_tool({"export", file, (dir / "out.npz").string(), "--select", "^flags$"}, dir.path());
    CHECK(r.status == 1);
    CHECK(contains(r.err, "bool tensor 'flags' holds the byte 2"));
    r = ckpt_tool({"export", file, (dir / "out.safetensors").string()}, dir.path());
    CHECK(r.status == 1);
    CHECK(contains(r.err, "bool tensor 'flags' holds the byte 2"));
    CHECK(test::names_in(dir.path()) == std::vector<std::string>{".tool.err", ".tool.out"});
    // renamed, the values export and import back
    r = ckpt_tool({"export", file, (dir / "out.npz").string(), "--select", "x$", "--rename", "../../=up.", "--rename", "/etc/=etc."},
                  dir.path());
    CHECK(r.status == 0);
    CHECK(ckpt::load_npz(dir / "out.npz") == ckpt::ParamDict{{"up.x", std::int64_t{1}}, {"etc.x", std::int64_t{2}}});
}

TEST_CASE("a bare .npy file gets a message of its own from show and import") {
    test::TempDir dir;
    const auto npy = (test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile" / "bare-array.npy").string();
    auto r = ckpt_tool({"show", npy}, dir.path());
    CHECK(r.status == 1);
    CHECK(contains(r.err, "is not a ckpt checkpoint: it is a NumPy .npy file, a single array"));
    r = ckpt_tool({"import", npy, (dir / "x.ckpt").string()}, dir.path());
    CHECK(r.status == 2);
    CHECK(contains(r.err, "is a NumPy .npy file, a single array: ckpt imports npz archives"));
    CHECK_FALSE(test::fs::exists(dir / "x.ckpt"));
}

TEST_CASE("every subcommand that reads takes --max-decoded-bytes, and a file past it is refused naming the figure") {
    test::TempDir dir;
    const auto hostile = test::fs::path(CKPT_SOURCE_DIR) / "tests" / "hostile";
    for (const char* name : {"ok-zstd.ckpt", "ok.npz", "ok.pt", "ok.safetensors"}) {
        const std::string file = (hostile / name).string();
        CAPTURE(file);
        CHECK(ckpt_tool({"show", "--stats", file}, dir.path()).status == 0);  // within the default
        auto r = ckpt_tool({"show", "--stats", file, "--max-decoded-bytes", "8"}, dir.path());
        CHECK(r.status == 1);
        CHECK(contains(r.err, "'" + file + "' decodes to more than 8 bytes"));
        r = ckpt_tool({"diff", file, file, "--max-decoded-bytes", "8"}, dir.path());
        CHECK(r.status == 1);
        CHECK(contains(r.err, "decodes to more than 8 bytes"));
    }
    const std::string zstd = (hostile / "ok-zstd.ckpt").string();
    auto r = ckpt_tool({"import", (hostile / "ok.npz").string(), (dir / "out.ckpt").string(), "--max-decoded-bytes", "8"},
                       dir.path());
    CHECK(r.status == 1);
    CHECK(contains(r.err, "decodes to more than 8 bytes"));
    CHECK_FALSE(test::fs::exists(dir / "out.ckpt"));
    r = ckpt_tool({"export", zstd, (dir / "out.npz").string(), "--max-decoded-bytes", "8"}, dir.path());
    CHECK(r.status == 1);
    CHECK(contains(r.err, "decodes to more than 8 bytes"));
    CHECK_FALSE(test::fs::exists(dir / "out.npz"));
    // verify reads the stored bytes, and decodes nothing without a key
    CHECK(ckpt_tool({"verify", zstd, "--max-decoded-bytes", "8"}, dir.path()).status == 0);
    for (const char* sub : {"ls", "plot"}) {
        CAPTURE(sub);
        CHECK(contains(ckpt_tool({sub, "--help"}, dir.path()).out, "--max-decoded-bytes"));
    }
}

// latest() stops at a newest file this program cannot read (a newer format version here)
// rather than go on from an older one: ls marks no file then, as latest() returns none.
TEST_CASE("ckpt ls marks no latest file when the newest is one this program cannot read, as latest() returns none") {
    test::TempDir dir;
    {
        test::LogCapture quiet;
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> mgr(dir.path(), "exp");
        mgr.save(ckpt::Progress::at_iteration(1), small_state(1));
        mgr.save(ckpt::Progress::at_iteration(2), small_state(2));
    }
    auto bytes = test::read_bytes(dir / "exp-2.ckpt");  // as a newer writer would make it
    ckpt::detail::put_le<std::uint32_t>(reinterpret_cast<std::byte*>(bytes.data()) + 8, 4);
    test::reseal(bytes);
    test::write_bytes(dir / "exp-2.ckpt", bytes);
    CHECK_THROWS_AS(ckpt::latest(dir.path(), "exp"), ckpt::UnreadableCheckpoints);
    const auto j = json::parse(ckpt_tool({"ls", dir.path().string(), "--json"}, dir.path()).out);
    int seen = 0;
    for (const auto& group : j["checkpoints"])
        for (const auto& c : group["checkpoints"]) {
            const std::string path = c["path"];
            CAPTURE(path);
            ++seen;
            CHECK(c["latest"] == false);
            if (contains(path, "exp-2.ckpt")) CHECK(contains(c["problem"].get<std::string>(), "format version 4"));
        }
    CHECK(seen == 2);
}

TEST_CASE("ckpt ls goes by a file's owner record, not its name, and show reads safetensors and refuses --stats without a key") {
    test::TempDir dir;
    {
        test::LogCapture quiet;
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> other(dir / "a", "other");
        other.save(ckpt::Progress::at_iteration(50), small_state(1));
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> mine(dir / "b", "exp");
        mine.save(ckpt::Progress::at_iteration(3), small_state(2));
    }
    // another job's file, renamed by hand into this prefix's run 1
    test::fs::copy_file(dir / "a" / "other-50.ckpt", dir / "b" / "exp_1-50.ckpt");
    auto j = json::parse(ckpt_tool({"ls", (dir / "b").string(), "--json"}, dir.path()).out);
    for (const auto& group : j["checkpoints"])
        for (const auto& c : group["checkpoints"]) {
            const std::string path = c["path"];
            CAPTURE(path);
            if (contains(path, "exp_1-50")) {
                CHECK(c["valid"] == false);
                CHECK(contains(c["problem"].get<std::string>(), "records prefix 'other'"));
                CHECK(c["latest"] == false);
            } else {
                CHECK(c["latest"] == true);  // exp-3.ckpt, though run 1 sorts after it by name
            }
        }
    auto shown = ckpt_tool({"show", (dir / "b" / "exp-3.ckpt").string()}, dir.path());
    CHECK(contains(shown.out, "written for prefix 'exp', run 'exp'"));
    // a record with a prefix and no run names no other run: ls and latest() both take it
    {
        ckpt::ParamDict d = small_state(3);
        d.set(std::string(ckpt::detail::owner_prefix_entry), std::string("exp"));
        ckpt::save_checkpoint(d, dir / "b" / "exp_2-60.ckpt");
    }
    CHECK(ckpt::latest_checkpoint(dir / "b", "exp")->path.filename() == "exp_2-60.ckpt");
    j = json::parse(ckpt_tool({"ls", (dir / "b").string(), "--json"}, dir.path()).out);
    bool listed = false;
    for (const auto& group : j["checkpoints"])
        for (const auto& c : group["checkpoints"])
            if (contains(c["path"].get<std::string>(), "exp_2-60")) {
                listed = true;
                CHECK(c["valid"] == true);
                CHECK(c["latest"] == true);
            }
    CHECK(listed);
    CHECK_FALSE(contains(shown.out, "__ckpt."));

    // show reads what diff and import read
    ckpt::save_safetensors(small_state(1), dir / "w.safetensors");
    auto st = ckpt_tool({"show", (dir / "w.safetensors").string(), "--stats"}, dir.path());
    CHECK(st.status == 0);
    CHECK(contains(st.out, "safetensors file"));
    CHECK(contains(st.out, "layer.weight"));

    // an encrypted file without its key: --stats cannot be given, and says so
    const auto key = ckpt::Key::random();
    ckpt::save_checkpoint(small_state(1), dir / "sealed.ckpt",
                          {.codecs = ckpt::CodecChain{ckpt::Codec{ckpt::CodecId::aes_256_gcm, 0, key}}});
    auto locked = ckpt_tool({"show", (dir / "sealed.ckpt").string(), "--stats"}, dir.path());
    CHECK(locked.status == 1);
    CHECK(contains(locked.err, "--key-file"));
    CHECK(ckpt_tool({"show", (dir / "sealed.ckpt").string()}, dir.path()).status == 0);
    auto no_key = ckpt_tool({"show", (dir / "sealed.ckpt").string(), "--key-file", (dir / "nope.key").string()}, dir.path());
    CHECK(no_key.status == 2);
    CHECK(contains(no_key.err, "nope.key"));
}

TEST_CASE("ckpt verify exits 0 only when every file verifies, naming each failure") {
    test::TempDir dir;
    for (int i = 1; i <= 3; ++i) save_at(small_state(static_cast<float>(i)), dir / "run" / ("m-" + std::to_string(i) + "_1.ckpt"), i, 1);
    auto ok = ckpt_tool({"verify", (dir / "run").string()}, dir.path());
    CHECK(ok.status == 0);
    CHECK(contains(ok.out, "3 verified, 0 failed"));
    test::flip_bit(dir / "run" / "m-2_1.ckpt", 150);
    auto bad = ckpt_tool({"verify", (dir / "run").string(), (dir / "run" / "m-1_1.ckpt").string()}, dir.path());
    CHECK(bad.status == 1);
    CHECK(contains(bad.out, "FAILED " + (dir / "run" / "m-2_1.ckpt").string()));
    CHECK(contains(bad.out, "3 verified, 1 failed"));
    auto absent = ckpt_tool({"verify", (dir / "absent.ckpt").string()}, dir.path());
    CHECK(absent.status == 1);
    CHECK(contains(absent.out, "absent.ckpt"));
    test::fs::create_directories(dir / "empty");
    CHECK(ckpt_tool({"verify", (dir / "empty").string()}, dir.path()).status == 1);
}

TEST_CASE("ckpt diff reports missing, extra, mismatched and differing entries, within tolerance") {
    test::TempDir dir;
    const auto a = dir / "a.ckpt", b = dir / "b.ckpt", c = dir / "c.ckpt", e = dir / "e.ckpt";
    ckpt::save_checkpoint(small_state(1), a);
    ckpt::save_checkpoint(small_state(1), e);
    ckpt::save_checkpoint(small_state(1.001f), b);
    auto other = small_state(1);
    other.erase("note");
    other.set("extra", 1.5);
    other.set("layer.bias", ckpt::Tensor::from(std::vector<float>{0.5f, -0.5f}));
    ckpt::save_checkpoint(other, c);

    auto same = ckpt_tool({"diff", a.string(), e.string()}, dir.path());
    CHECK(same.status == 0);
    CHECK(contains(same.out, "4 bit-equal, 0 within tolerance, 0 different"));
    auto differ = ckpt_tool({"diff", a.string(), b.string()}, dir.path());
    CHECK(differ.status == 1);
    CHECK(contains(differ.out, "'layer.weight': max |A-B| 0.004"));
    auto within = ckpt_tool({"diff", a.string(), b.string(), "--rtol", "0.002"}, dir.path());
    CHECK(within.status == 0);
    CHECK(contains(within.out, "within tolerance, not bit-equal"));
    CHECK(ckpt_tool({"diff", a.string(), b.string(), "--atol", "0.01"}, dir.path()).status == 0);
    auto shape = ckpt_tool({"diff", a.string(), c.string()}, dir.path());
    CHECK(shape.status == 1);
    CHECK(contains(shape.out, "'layer.bias': A has float64[2], B has float32[2]"));
    CHECK(contains(shape.out, "only in A: 'note'"));
    CHECK(contains(shape.out, "only in B: 'extra'"));
    auto unreadable = ckpt_tool({"diff", a.string(), (dir / "missing.ckpt").string()}, dir.path());
    CHECK(unreadable.status == 1);
    CHECK(contains(unreadable.err, "missing.ckpt"));

    // double values compare bit for bit, as tensors do: a NaN equals itself, -0.0 is not 0.0
    ckpt::ParamDict nan, zero, negative_zero;
    nan.set("x", std::numeric_limits<double>::quiet_NaN());
    zero.set("x", 0.0);
    negative_zero.set("x", -0.0);
    ckpt::save_checkpoint(nan, dir / "nan.ckpt");
    ckpt::save_checkpoint(zero, dir / "zero.ckpt");
    ckpt::save_checkpoint(negative_zero, dir / "negative_zero.ckpt");
    auto nan_self = ckpt_tool({"diff", (dir / "nan.ckpt").string(), (dir / "nan.ckpt").string()}, dir.path());
    CHECK(nan_self.status == 0);
    CHECK(contains(nan_self.out, "1 bit-equal, 0 within tolerance, 0 different"));
    auto zeros = ckpt_tool({"diff", (dir / "zero.ckpt").string(), (dir / "negative_zero.ckpt").string()}, dir.path());
    CHECK(zeros.status == 0);
    CHECK(contains(zeros.out, "0 bit-equal, 1 within tolerance, 0 different"));
}

TEST_CASE("ckpt show --stats and diff take every dtype: a complex tensor's parts as numbers, bfloat16 by value") {
    test::TempDir dir;
    ckpt::ParamDict a;
    a.set("c", ckpt::Tensor::from(std::vector<std::complex<float>>{{1, -2}, {3, 4}}));
    a.set("bf", ckpt::Tensor::from(std::vector<ckpt::bfloat16>{ckpt::bfloat16(0.5f), ckpt::bfloat16(-8.0f)}));
    a.set("u64", ckpt::Tensor::from(std::vector<std::uint64_t>{~0ull}));
    ckpt::save_checkpoint(a, dir / "a.ckpt");
    auto shown = ckpt_tool({"show", (dir / "a.ckpt").string(), "--stats", "--json"}, dir.path());
    REQUIRE(shown.status == 0);
    const auto j = json::parse(shown.out);
    std::map<std::string, json> by_name;
    for (const auto& e : j["entries"]) by_name[e["name"]] = e;
    CHECK(by_name["c"]["dtype"] == "complex64");
    CHECK(by_name["c"]["stats"]["min"] == -2.0);  // the parts 1, -2, 3, 4
    CHECK(by_name["c"]["stats"]["max"] == 4.0);
    CHECK(by_name["bf"]["dtype"] == "bfloat16");
    CHECK(by_name["bf"]["stats"]["min"] == -8.0);
    CHECK(by_name["u64"]["stats"]["max"] == 18446744073709551615.0);
    // one imaginary part changed: different, by how much
    a.set("c", ckpt::Tensor::from(std::vector<std::complex<float>>{{1, -2}, {3, 4.5f}}));
    ckpt::save_checkpoint(a, dir / "b.ckpt");
    auto differ = ckpt_tool({"diff", (dir / "a.ckpt").string(), (dir / "b.ckpt").string()}, dir.path());
    CHECK(differ.status == 1);
    CHECK(contains(differ.out, "'c': max |A-B| 0.5"));
    CHECK(contains(differ.out, "2 bit-equal, 0 within tolerance, 1 different"));
}

TEST_CASE("a bfloat16 and float8 safetensors file imports and exports back byte for byte") {
    test::TempDir dir;
    ckpt::ParamDict d;
    d.set("embed", test::pattern_tensor(ckpt::DType::bfloat16, {3, 4}));
    d.set("q", test::pattern_tensor(ckpt::DType::float8_e4m3fn, {5}));
    d.set("g", test::pattern_tensor(ckpt::DType::float8_e5m2, {2, 2}));
    d.set("i", test::pattern_tensor(ckpt::DType::int8, {7}));
    ckpt::save_safetensors(d, dir / "in.safetensors");
    const auto in = (dir / "in.safetensors").string(), mid = (dir / "mid.ckpt").string(),
               out = (dir / "out.safetensors").string();
    REQUIRE(ckpt_tool({"import", in, mid}, dir.path()).status == 0);
    CHECK(ckpt::load_checkpoint(mid).tensor("embed").dtype() == ckpt::DType::bfloat16);
    REQUIRE(ckpt_tool({"export", mid, out}, dir.path()).status == 0);
    CHECK(test::read_bytes(dir / "out.safetensors") == test::read_bytes(dir / "in.safetensors"));
    // npz has no such dtypes: refused by name, nothing written
    auto npz = ckpt_tool({"export", mid, (dir / "out.npz").string()}, dir.path());
    CHECK(npz.status == 1);
    CHECK(contains(npz.err, "tensor 'embed' is bfloat16, which NumPy, and so npz, has no dtype for"));
    CHECK_FALSE(test::fs::exists(dir / "out.npz"));
}

TEST_CASE("ckpt export and import move entries through safetensors and npz, with --select and --rename") {
    test::TempDir dir;
    const auto src = dir / "src.ckpt";
    const auto state = test::sample_state();
    ckpt::save_checkpoint(state, src);
    for (const char* ext : {".safetensors", ".npz"}) {
        CAPTURE(ext);
        const auto out = dir / (std::string("all") + ext), back = dir / (std::string("back") + ext + ".ckpt");
        REQUIRE(ckpt_tool({"export", src.string(), out.string()}, dir.path()).status == 0);
        auto imp = ckpt_tool({"import", out.string(), back.string(), "--epoch", "7", "--step", "123", "--archive", "text"},
                             dir.path());
        REQUIRE(imp.status == 0);
        const auto h = ckpt::read_header(back);
        CHECK(h.epoch == 7);
        CHECK(h.step == 123);
        CHECK(h.archive == ckpt::ArchiveKind::text);
        CHECK(ckpt_tool({"diff", src.string(), back.string()}, dir.path()).status == 0);
        // The existing output is kept without --force.
        const auto before = test::read_bytes(out);
        auto again = ckpt_tool({"export", src.string(), out.string(), "--select", "f16"}, dir.path());
        CHECK(again.status == 1);
        CHECK(contains(again.err, "pass --force"));
        CHECK(test::read_bytes(out) == before);
    }
    const auto renamed = dir / "renamed.npz";
    REQUIRE(ckpt_tool({"export", src.string(), renamed.string(), "--select", "^(conv1|f64)", "--rename", "conv1.=backbone.conv1.",
                       "--compress"},
                      dir.path())
                .status == 0);
    const auto got = ckpt::load_npz(renamed);
    CHECK(got.size() == 2);
    CHECK(got.at("backbone.conv1.weight") == state.at("conv1.weight"));
    CHECK(got.at("f64") == state.at("f64"));
    auto collide = ckpt_tool({"export", src.string(), (dir / "c.safetensors").string(), "--rename", "i32=i64"}, dir.path());
    CHECK(collide.status == 1);
    CHECK(contains(collide.err, "maps both 'i32' and 'i64' to 'i64'"));
    CHECK_FALSE(test::fs::exists(dir / "c.safetensors"));
    test::write_bytes(dir / "junk.safetensors", {'\x04', 0, 0, 0, 0, 0, 0, 0, 'n', 'o', 'p', 'e'});
    auto junk = ckpt_tool({"import", (dir / "junk.safetensors").string(), (dir / "j.ckpt").string()}, dir.path());
    CHECK(junk.status == 1);
    CHECK(contains(junk.err, "junk.safetensors"));
    CHECK_FALSE(test::fs::exists(dir / "j.ckpt"));
}

TEST_CASE("show gives bytes, lists of strings and objects: a map's items, a text archive's text, escaped, and diff compares them") {
    test::TempDir dir;
    std::map<std::string, double> stats{{"mean", 0.5}, {"\x1b[2J", 2}};
    std::minstd_rand engine(3);
    std::string label = "lbl";
    ckpt::ParamDict d;
    d.set("blob", ckpt::Bytes{std::string("\x00\x1b\xff", 3)});
    d.set("tags", ckpt::Strings{"a", "\x07" "b"});
    d.set("stats", ckpt::view_of(stats));
    d.set("engine", ckpt::view_of(engine));
    d.set("label", ckpt::object(label));
    ckpt::save_checkpoint(d, dir / "a.ckpt", {.archive = ckpt::ArchiveKind::text});
    const auto shown = ckpt_tool({"show", (dir / "a.ckpt").string()}, dir.path());
    REQUIRE(shown.status == 0);
    CHECK(contains(shown.out, "blob    bytes"));
    CHECK(contains(shown.out, "3 bytes: 001bff"));
    CHECK(contains(shown.out, R"(["a", "\u0007b"] (2 strings))"));
    CHECK(contains(shown.out, "map<string, float64>, value map, 58 bytes: "));
    CHECK(contains(shown.out, R"({"\u001b[2J": 2.0, "mean": 0.5})"));
    CHECK(contains(shown.out, "std::minstd_rand, stream text, 1 bytes: \"3\""));
    CHECK(contains(shown.out, "boost text"));
    CHECK(contains(shown.out, "serialization::archive"));
    CHECK_FALSE(contains(shown.out, "\x1b"));  // nothing raw reaches the terminal
    const auto j = json::parse(ckpt_tool({"show", (dir / "a.ckpt").string(), "--json"}, dir.path()).out);
    CHECK(j["entries"][0]["value"]["hex"] == "001bff");
    CHECK(j["entries"][1]["value"] == json::array({"a", "\x07" "b"}));
    CHECK(j["entries"][2]["value"]["items"]["mean"] == 0.5);
    CHECK(j["entries"][3]["value"]["text"] == "3");

    engine();
    ckpt::save_checkpoint(d, dir / "b.ckpt", {.archive = ckpt::ArchiveKind::text});
    const auto diff = ckpt_tool({"diff", (dir / "a.ckpt").string(), (dir / "b.ckpt").string()}, dir.path());
    CHECK(diff.status == 1);
    CHECK(contains(diff.out, "'engine': A = std::minstd_rand"));
    CHECK(contains(diff.out, "4 bit-equal"));
}

TEST_CASE("column-major tensors: show gives their shape and order, diff compares orders, npz round-trips byte for byte") {
    test::TempDir dir;
    const auto src = dir / "cm.ckpt";
    std::vector<double> columns{1, 4, 2, 5, 3, 6};  // [[1, 2, 3], [4, 5, 6]], column by column
    ckpt::ParamDict d{{"m", ckpt::Tensor::from(columns, {2, 3}, ckpt::Order::column_major)},
                      {"step", std::int64_t{5}}};
    ckpt::save_checkpoint(d, src, {.epoch = 2, .step = 5});

    auto shown = ckpt_tool({"show", src.string()}, dir.path());
    REQUIRE(shown.status == 0);
    CHECK(contains(shown.out, "ORDER"));
    CHECK(contains(shown.out, "m     tensor   float64  [2, 3]           column-major"));
    CHECK_FALSE(contains(shown.out, "__ckpt.order"));
    const auto j = json::parse(ckpt_tool({"show", src.string(), "--json"}, dir.path()).out);
    CHECK(j["entries"].size() == 2);
    CHECK(j["entries"][0]["shape"] == json::array({2, 3}));
    CHECK(j["entries"][0]["order"] == "column_major");

    // npz: Fortran-ordered, and back to the same file
    const auto npz = dir / "cm.npz", back = dir / "back.ckpt";
    REQUIRE(ckpt_tool({"export", src.string(), npz.string()}, dir.path()).status == 0);
    REQUIRE(ckpt_tool({"import", npz.string(), back.string(), "--epoch", "2", "--step", "5"}, dir.path()).status == 0);
    const auto a = test::read_bytes(src), b = test::read_bytes(back);
    CHECK(std::vector<char>(a.begin() + 64, a.end()) == std::vector<char>(b.begin() + 64, b.end()));
    CHECK(ckpt_tool({"diff", src.string(), npz.string()}, dir.path()).status == 0);
    // safetensors: the same matrix in row-major order, which diff tells apart
    const auto st = dir / "cm.safetensors";
    REQUIRE(ckpt_tool({"export", src.string(), st.string()}, dir.path()).status == 0);
    CHECK(ckpt::load_safetensors(st).tensor("m") == d.tensor("m").in_order(ckpt::Order::row_major));
    auto differ = ckpt_tool({"diff", src.string(), st.string()}, dir.path());
    CHECK(differ.status == 1);
    CHECK(contains(differ.out, "'m': A has float64[2, 3] column-major, B has float64[2, 3]"));
}

TEST_CASE("ckpt import takes PyTorch .pt and .pth files, show and diff read them, the result verifies") {
    test::TempDir dir;
    test::run_python("write_torch_files.py", dir.path());  // torch.save'd files, and what they hold as npz
    const auto pt = dir / "training.pt", out = dir / "training.ckpt";
    auto imp = ckpt_tool({"import", pt.string(), out.string(), "--epoch", "3", "--step", "120"}, dir.path());
    INFO(imp.err);
    REQUIRE(imp.status == 0);
    const auto want = ckpt::load_torch(pt);
    CHECK(contains(imp.out, "imported " + std::to_string(want.size()) + " entries into " + out.string()));
    CHECK(ckpt::load_checkpoint(out) == want);
    CHECK(ckpt::read_header(out).epoch == 3);
    CHECK(ckpt_tool({"verify", out.string()}, dir.path()).status == 0);
    auto shown = ckpt_tool({"show", out.string()}, dir.path());
    CHECK(shown.status == 0);
    CHECK(contains(shown.out, "optimizer.state.0.exp_avg_sq"));
    CHECK(contains(shown.out, "model.bn.num_batches_tracked"));
    // the .pt file itself, and a .pth
    auto shown_pt = ckpt_tool({"show", pt.string(), "--stats"}, dir.path());
    CHECK(shown_pt.status == 0);
    CHECK(contains(shown_pt.out, "PyTorch file"));
    CHECK(contains(shown_pt.out, "optimizer.param_groups.0.betas.1"));
    CHECK(ckpt_tool({"diff", pt.string(), out.string()}, dir.path()).status == 0);
    test::fs::copy_file(dir / "cnn.pt", dir / "cnn.pth");
    CHECK(ckpt_tool({"diff", (dir / "cnn.pth").string(), (dir / "cnn.expected.npz").string()}, dir.path()).status == 0);
    CHECK(ckpt_tool({"diff", (dir / "cnn.pth").string(), out.string()}, dir.path()).status == 1);
    REQUIRE(ckpt_tool({"import", (dir / "cnn.pth").string(), (dir / "cnn.ckpt").string(), "--select", "^bn\\."}, dir.path())
                .status == 0);
    CHECK(ckpt::load_checkpoint(dir / "cnn.ckpt").size() == 5);
    // refused files name the file and the reason; nothing is written
    auto refused = ckpt_tool({"import", (dir / "os_system.pt").string(), (dir / "x.ckpt").string()}, dir.path());
    CHECK(refused.status == 1);
    CHECK(contains(refused.err, "os_system.pt"));
    CHECK(contains(refused.err, "'posix.system'"));
    CHECK_FALSE(test::fs::exists(dir / "x.ckpt"));
    // PyTorch files are read, not written
    auto no_export = ckpt_tool({"export", out.string(), (dir / "back.pt").string()}, dir.path());
    CHECK(no_export.status == 2);
    CHECK(contains(no_export.err, "must end in .safetensors or .npz"));
    auto wrong_in = ckpt_tool({"import", out.string(), (dir / "again.ckpt").string()}, dir.path());
    CHECK(wrong_in.status == 2);
    CHECK(contains(wrong_in.err, "must end in .safetensors, .npz, .pt or .pth"));
}

TEST_CASE("ckpt ls shows what a series left besides checkpoints: temporaries (--clean), broken indexes, its end, its holder") {
    test::TempDir dir;
    const auto run = dir / "run";
    // step-named files saved in epoch 2: their position is their header's, not epoch 1
    {
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> mgr(run, "st", ckpt::EverySteps{1},
                                                                                       ckpt::KeepAll{});
        ckpt::ParamDict state = small_state(1.0f);
        ckpt::Progress p;
        p.epoch = 2;
        p.step = 50;
        p.global_step = 300;
        mgr.on_step(p, state);
        mgr.on_train_end(p, state, "epochs=2");
    }
    // a temporary a killed writer left, one a live writer is writing, and an index whose files are gone
    const pid_t gone = ::fork();
    if (gone == 0) ::_exit(0);
    ::waitpid(gone, nullptr, 0);
    const std::string dead = ".st-400.ckpt.tmp-" + std::to_string(gone) + "-0";
    const std::string live = ".st-401.ckpt.tmp-" + std::to_string(::getpid()) + "-0";
    for (const auto& n : {dead, live}) test::write_bytes(run / n, std::vector<char>(100, 'x'));
    ckpt::GlobalIndex index;
    index.global_step = 300;
    index.world_size = 1;
    ckpt::TensorPiece piece;
    piece.global = piece.entry = "w";
    piece.count = 1;
    piece.file = "rank_0/gone.ckpt";
    piece.chunk_hashes = {0};
    index.pieces.push_back(piece);
    ckpt::save_checkpoint(ckpt::index_to_dict(index), run / "index-step_300.ckpt");

    auto ls = ckpt_tool({"ls", run.string(), "--json"}, dir.path());
    CHECK(ls.status == 0);
    const auto j = json::parse(ls.out);
    REQUIRE(j["temporaries"].size() == 2);
    for (const auto& t : j["temporaries"]) {
        const bool is_dead = t["path"].get<std::string>().ends_with(dead);
        CHECK(t["writer"] == (is_dead ? "gone" : "running"));
        CHECK(t["size"] == 100);
    }
    bool saw_index = false, saw_series = false;
    for (const auto& g : j["checkpoints"])
        for (const auto& c : g["checkpoints"]) {
            if (c.value("kind", "") == "global_index") {
                saw_index = true;
                CHECK(c["valid"] == false);
                CHECK(contains(c["problem"].get<std::string>(), "'" + (run / "rank_0/gone.ckpt").string() + "' (rank 0) is gone"));
            } else if (c["path"].get<std::string>().ends_with("st-300.ckpt")) {
                saw_series = true;
                CHECK(c["epoch"] == 2);
                CHECK(c["step"] == 50);
                CHECK(c["global_step"] == 300);
                CHECK(g["finished"]["arguments"] == "epochs=2");
                CHECK(g["held_by"].is_null());
            }
        }
    CHECK(saw_index);
    CHECK(saw_series);
    auto verify = ckpt_tool({"verify", run.string()}, dir.path());
    CHECK(verify.status == 1);
    CHECK(contains(verify.out, "global index of step 300"));
    CHECK(contains(verify.out, "2 temporaries of saves that did not finish"));
    // --prefix keeps to its own series' temporaries: not those of a prefix that only starts the same
    const std::string other = ".stx-1.ckpt.tmp-" + std::to_string(gone) + "-0";
    const std::string later_run = ".st_2-5.ckpt.tmp-" + std::to_string(gone) + "-0";
    for (const auto& n : {other, later_run}) test::write_bytes(run / n, std::vector<char>(10, 'x'));
    auto own = ckpt_tool({"ls", run.string(), "--prefix", "st", "--clean"}, dir.path());
    CHECK(own.status == 0);
    CHECK(test::fs::exists(run / other));
    CHECK_FALSE(test::fs::exists(run / later_run));
    test::fs::remove(run / other);
    test::write_bytes(run / dead, std::vector<char>(100, 'x'));
    // --clean removes the dead writer's temporary only
    auto clean = ckpt_tool({"ls", run.string(), "--clean"}, dir.path());
    CHECK(clean.status == 0);
    CHECK(contains(clean.out, "removed " + (run / dead).string()));
    CHECK_FALSE(test::fs::exists(run / dead));
    CHECK(test::fs::exists(run / live));
    // held now: ls names the holder (a manager starting removes what is left of its series)
    {
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> holder(run, "st", ckpt::EverySteps{1},
                                                                                          ckpt::KeepAll{});
        auto held = ckpt_tool({"ls", run.string()}, dir.path());
        CHECK(contains(held.out, "being written by pid " + std::to_string(::getpid())));
        CHECK(contains(held.out, "finished at 'st-300.ckpt': epoch 2, step 50 (global step 300) with 'epochs=2'"));
    }
    // import into a name of a series a job is writing is refused, naming the holder
    {
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll, ckpt::StepNaming> holder(run, "st", ckpt::EverySteps{1},
                                                                                          ckpt::KeepAll{});
        ckpt::save_npz(small_state(2.0f), dir / "w.npz");
        auto into = ckpt_tool({"import", (dir / "w.npz").string(), (run / "st-500.ckpt").string()}, dir.path());
        CHECK(into.status == 1);
        CHECK(contains(into.err, "prefix 'st' in '" + run.string() + "' is held by pid " + std::to_string(::getpid())));
        CHECK_FALSE(test::fs::exists(run / "st-500.ckpt"));
    }
}

}  // TEST_SUITE
