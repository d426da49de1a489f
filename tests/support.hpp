#pragma once
// Helpers shared by the test suites: scratch directories, log capture, file surgery.

#include <ckpt/ckpt.hpp>

#include <stdlib.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace test {

namespace fs = boost::filesystem;

/// A fresh directory, removed with everything in it at scope exit.
class TempDir {
public:
    explicit TempDir(const fs::path& base = fs::temp_directory_path()) {
        std::string tmpl = (base / "ckpt-test-XXXXXX").string();
        if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        path_ = tmpl;
    }
    ~TempDir() {
        boost::system::error_code ec;
        fs::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const fs::path& path() const { return path_; }
    fs::path operator/(const std::string& name) const { return path_ / name; }

private:
    fs::path path_;
};

/// Collects what ckpt logs while in scope (and keeps the test output quiet).
class LogCapture {
public:
    LogCapture() {
        ckpt::set_log_sink([this](ckpt::LogLevel level, std::string_view msg) {
            (level == ckpt::LogLevel::warning ? warnings : infos).emplace_back(msg);
        });
    }
    ~LogCapture() {
        ckpt::set_log_sink([](ckpt::LogLevel level, std::string_view msg) {
            if (level == ckpt::LogLevel::warning)
                std::fprintf(stderr, "[ckpt] warning: %.*s\n", static_cast<int>(msg.size()), msg.data());
        });
    }
    std::vector<std::string> warnings, infos;
};

/// Saves `dict` as a manager of `prefix` would in run `run_prefix`: with its owner record, so
/// that the manager's retention counts the file as its own.
inline void save_owned(ckpt::ParamDict dict, const fs::path& file, const std::string& prefix,
                       const std::string& run_prefix, const ckpt::SaveOptions& opts = {}) {
    ckpt::detail::record_owner(dict, {prefix, run_prefix, {}});
    ckpt::save_checkpoint(dict, file, opts);
}

inline std::vector<char> read_bytes(const fs::path& p) {
    std::ifstream in(p.string(), std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const fs::path& p, const std::vector<char>& bytes) {
    std::ofstream out(p.string(), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline void flip_bit(const fs::path& p, std::size_t offset, int bit = 0) {
    auto b = read_bytes(p);
    b.at(offset) = static_cast<char>(b.at(offset) ^ (1 << bit));
    write_bytes(p, b);
}

/// Recomputes the body length, body checksum and header check of edited file bytes, so that
/// the edit reaches the parser instead of being caught as corruption.
inline void reseal(std::vector<char>& b) {
    auto* p = reinterpret_cast<std::byte*>(b.data());
    ckpt::detail::put_le<std::uint64_t>(p + 16, b.size() - ckpt::header_size);
    ckpt::detail::put_le<std::uint64_t>(p + 24, ckpt::detail::xxh3(p + ckpt::header_size, b.size() - ckpt::header_size));
    ckpt::detail::put_le<std::uint64_t>(p + 56, ckpt::detail::xxh3(p, 56));
}
inline void reseal(const fs::path& p) {
    auto b = read_bytes(p);
    reseal(b);
    write_bytes(p, b);
}

/// The names in `dir`, sorted; a series' lock file ("{prefix}.lock", there from a manager's
/// start on) left out: test_series.cpp tests it.
inline std::vector<std::string> names_in(const fs::path& dir) {
    std::vector<std::string> out;
    for (fs::directory_iterator it(dir), end; it != end; ++it)
        if (const auto name = it->path().filename().string(); !name.ends_with(".lock")) out.push_back(name);
    std::sort(out.begin(), out.end());
    return out;
}

/// A small state with one tensor of each dtype, every scalar kind, and a rank-0 and an empty tensor.
/// The seed's manager options: append_info of epoch_num, step_num, lr and momentum, and the
/// seed's tree, where each run keeps its own files.
inline ckpt::ManagerOptions seed_options(bool exception_save = false) {
    ckpt::ManagerOptions o;
    o.append_info = {"epoch_num", "step_num", ckpt::ParamDict{{"lr", 0.01}, {"momentum", 0.9}}};
    o.exception_save = exception_save;
    o.retention_scope = ckpt::RetentionScope::current_run;
    return o;
}

inline ckpt::ParamDict sample_state(float seed = 1.0f) {
    ckpt::ParamDict d;
    std::vector<float> w(6 * 5);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = seed * static_cast<float>(i) - 3.25f;
    d.set("conv1.weight", ckpt::Tensor::from(w, {6, 5}));
    d.set("f64", ckpt::Tensor::from(std::vector<double>{1e300, -2.5, 1.0 / 3.0}));
    std::vector<ckpt::float16> h{ckpt::float16(0.5f), ckpt::float16(-2.0f), ckpt::float16(65504.0f)};
    d.set("f16", ckpt::Tensor::from(h, {3, 1}));
    d.set("i32", ckpt::Tensor::from(std::vector<std::int32_t>{-7, 0, 2147483647, 5}, {2, 2}));
    d.set("i64", ckpt::Tensor::from(std::vector<std::int64_t>{INT64_MIN, INT64_MAX}));
    d.set("u8", ckpt::Tensor::from(std::vector<std::uint8_t>{0, 255, 17}, {1, 1, 3}));
    ckpt::Tensor mask(ckpt::DType::boolean, {4});
    mask.values<bool>()[1] = true;
    mask.values<bool>()[3] = true;
    d.set("mask", mask);
    d.set("scalar", ckpt::Tensor::from(std::vector<float>{42.0f}, ckpt::Shape{}));
    d.set("empty", ckpt::Tensor(ckpt::DType::float32, {0, 3}));
    d.set("epoch_num", std::int64_t{6});
    d.set("lr", 0.01);
    d.set("nesterov", false);
    d.set("note", std::string("tab\tnewline\n<xml> & \"quotes\" ünïcode"));
    d.set("empty_string", std::string());
    return d;
}

}  // namespace test
