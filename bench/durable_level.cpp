// What a durable level costs (ManagerOptions::durable): checkpoints written to a local
// directory and copied in the background to a second one.
//
//   1. The training thread's cost of a save. A loop saves a state of M MiB, then computes
//      (spins) for G ms before the next save, as a training loop does between checkpoints.
//      Rounds alternate a manager with a durable level and one without; each save's time on
//      the training thread is recorded. Figure: median save time with the durable level /
//      median save time without it (target <= 1.05). The compute gap must be longer than a
//      copy: otherwise saves queue faster than they are copied, and the copies compete with
//      every save for the disk.
//   2. The copier's throughput. The same checkpoint files are copied, alternately, by the
//      durable level's copier (read, hashed and checked, written, fsync, rename) and by a
//      plain copy (std::filesystem::copy_file, then fsync of the file and the directory).
//      Figure: plain copy time / copier time, i.e. the copier's throughput relative to a
//      plain copy's (target >= 0.9).
//
//   durable_level [--mib M] [--saves N] [--gap-ms G] [--rounds R] [--rate B] [--dir DIR] [--shared DIR2]
// Last line: durable_level save_with_copy/save_alone=X copy/plain_copy=Y
// The local level is a directory of DIR (default: a new directory under /var/tmp), the
// durable level one of DIR2 (default: DIR too). On one disk, the copies take the disk's
// bandwidth from the saves: a worst case for (1), which --rate (DurableLevel's pace, in
// bytes per second) eases. A cluster's durable level is another device.
// Exit status 1 if the run did not time what it planned: every save of every round, each
// leaving a file of the whole state (and with the durable level, every one copied there),
// every copy of every round, each copying the whole file, no faster than memory.

#include <ckpt/ckpt.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

namespace fs = boost::filesystem;
using Manager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;

struct Options {
    std::size_t mib = 64;
    int saves = 6;
    int gap_ms = 600;
    int rounds = 3;
    double rate = 0;
    std::string dir, shared;
};

void spin_for(std::chrono::milliseconds d) {
    const auto until = bench::Clock::now() + d;
    volatile std::uint64_t x = 0;
    while (bench::Clock::now() < until) x = x + 1;
}

/// The training thread's time of each of `o.saves` saves of `state`, with a compute gap after each.
/// `whole` counts the saves that left a file of the whole state.
std::vector<double> save_times(const fs::path& local, const std::optional<fs::path>& durable, const Options& o,
                               std::vector<float>& state, std::int64_t& step, int& whole) {
    ckpt::ManagerOptions options;
    options.write_meta = false;
    if (durable) options.durable = ckpt::DurableLevel{*durable, ckpt::KeepLast{2}, 1, o.rate};
    Manager mgr(local, "bench", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, options);
    ckpt::ParamDict d;
    d.set("state", ckpt::view_of(state));
    std::vector<double> times;
    for (int i = 0; i < o.saves; ++i) {
        ++step;
        state[0] = static_cast<float>(step);
        ckpt::Progress p;
        p.epoch = 1;
        p.step = p.global_step = step;
        ckpt::Path saved;
        times.push_back(bench::timed([&] { saved = mgr.save(p, d); }));
        whole += fs::exists(saved) && fs::file_size(saved) >= state.size() * sizeof(float);
        spin_for(std::chrono::milliseconds(o.gap_ms));
    }
    const auto stats = mgr.wait_flushed();
    if (durable && stats.flushed != o.saves) throw std::runtime_error("not every save was copied");
    return times;
}

void fsync_path(const std::string& path, int flags) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) bench::die("fsync " + path);
    ::close(fd);
}

int run(const std::string& dir, const Options& o) {
    bench::print_machine(dir);
    const fs::path local = fs::path(dir) / "local", shared = fs::path(o.shared.empty() ? dir : o.shared) / "durable_level-shared";
    std::printf("state: %zu MiB, %d saves a round, %d ms of computing after each, %d rounds\n", o.mib, o.saves, o.gap_ms,
                o.rounds);
    std::printf("durable level: %s (fs=%s), copies paced to %s\n", shared.string().c_str(),
                bench::fs_type_name(shared.parent_path().string()).c_str(),
                o.rate > 0 ? (std::to_string(o.rate / 1e6) + " MB/s").c_str() : "no limit");
    std::vector<float> state(o.mib << 18);
    bench::fill_random_floats(state.data(), state.size(), 7);
    std::int64_t step = 0;

    // 1. the training thread's cost
    std::vector<double> with, alone;
    Options warm = o;
    warm.saves = 2;
    warm.gap_ms = 0;
    int whole_with = 0, whole_alone = 0, ignored = 0;
    save_times(local, shared, warm, state, step, ignored);  // warm-up: page cache, allocator
    for (int r = 0; r < o.rounds; ++r) {
        for (int k = 0; k < 2; ++k) {
            const bool copy = (k == 0) == (r % 2 == 0);
            auto t = save_times(local, copy ? std::optional<fs::path>(shared) : std::nullopt, o, state, step,
                                copy ? whole_with : whole_alone);
            (copy ? with : alone).insert((copy ? with : alone).end(), t.begin(), t.end());
        }
    }
    const double save_ratio = bench::median(with) / bench::median(alone);
    std::printf("save, training thread: %.1f ms with the durable level, %.1f ms without (medians of %zu)\n",
                bench::median(with), bench::median(alone), with.size());

    // 2. the copier's throughput against a plain copy of the same files
    std::vector<fs::path> files;
    for (const auto& f : ckpt::list_checkpoints(local, "bench", ckpt::StepNaming{})) files.push_back(f.path);
    const fs::path to = fs::path(dir) / "copies";
    fs::create_directories(to);
    std::vector<double> copier, plain;
    std::uint64_t bytes = 0;
    int copier_whole = 0, plain_whole = 0;  // copies of the whole file
    ckpt::detail::Pacer unpaced(0);
    for (int r = 0; r < o.rounds; ++r)
        for (const auto& f : files) {
            const auto target = to / f.filename();
            for (int k = 0; k < 2; ++k) {
                fs::remove(target);
                if ((k == 0) == (r % 2 == 0)) {
                    std::uint64_t copied = 0;
                    copier.push_back(
                        bench::timed([&] { copied = ckpt::detail::copy_file_checked(f, target, true, unpaced); }));
                    copier_whole += copied == fs::file_size(f) && fs::file_size(target) == fs::file_size(f);
                } else {
                    plain.push_back(bench::timed([&] {
                        std::filesystem::copy_file(f.string(), target.string());
                        fsync_path(target.string(), O_RDONLY);
                        fsync_path(to.string(), O_RDONLY | O_DIRECTORY);
                    }));
                    plain_whole += fs::file_size(target) == fs::file_size(f);
                }
            }
            bytes = fs::file_size(f);
        }
    const double copy_ratio = bench::median(plain) / bench::median(copier);
    std::printf("copy of a %.1f MiB checkpoint: %.1f ms by the copier, %.1f ms by a plain copy (medians of %zu)\n",
                static_cast<double>(bytes) / (1 << 20), bench::median(copier), bench::median(plain), copier.size());
    std::printf("durable_level save_with_copy/save_alone=%.3f copy/plain_copy=%.3f\n", save_ratio, copy_ratio);
    for (const auto& d : {local, shared, to}) fs::remove_all(d);

    bench::Checks check;
    const long long saves = static_cast<long long>(o.rounds) * o.saves;
    const double state_bytes = static_cast<double>(state.size() * sizeof(float));
    check.count("saves with the durable level that left a file of the whole state", saves, whole_with);
    check.count("saves without it that left a file of the whole state", saves, whole_alone);
    check.rate("save with the durable level (median)", state_bytes, bench::median(with) / 1e3);
    check.rate("save without it (median)", state_bytes, bench::median(alone) / 1e3);
    check.at_least("checkpoint files to copy", 1, static_cast<long long>(files.size()));
    const long long copies = static_cast<long long>(o.rounds) * static_cast<long long>(files.size());
    check.count("copies by the copier of a whole file", copies, copier_whole);
    check.count("plain copies of a whole file", copies, plain_whole);
    check.rate("copy by the copier (median)", static_cast<double>(bytes), bench::median(copier) / 1e3);
    check.rate("plain copy (median)", static_cast<double>(bytes), bench::median(plain) / 1e3);
    return check.status();
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "durable_level: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--mib") o.mib = std::stoul(value());
        else if (a == "--saves") o.saves = std::stoi(value());
        else if (a == "--gap-ms") o.gap_ms = std::stoi(value());
        else if (a == "--rounds") o.rounds = std::stoi(value());
        else if (a == "--rate") o.rate = std::stod(value());
        else if (a == "--dir") o.dir = value();
        else if (a == "--shared") o.shared = value();
        else if (a == "--help") {
            std::printf("durable_level [--mib M] [--saves N] [--gap-ms G] [--rounds R] [--rate B] [--dir DIR] [--shared DIR2]\n");
            return 0;
        } else {
            std::fprintf(stderr, "durable_level: unknown option '%s' (try --help)\n", a.c_str());
            return 2;
        }
    }
    if (o.mib < 1 || o.saves < 1 || o.rounds < 1 || o.gap_ms < 0) {
        std::fprintf(stderr, "durable_level: --mib, --saves and --rounds must be at least 1\n");
        return 2;
    }
    ckpt::set_log_sink([](ckpt::LogLevel, std::string_view) {});
    return bench::run_in_directory(o.dir, {}, [&](const std::string& dir) { return run(dir, o); });
}
