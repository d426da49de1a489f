// parallel_writes: whether writing one checkpoint file on several threads is faster than on
// one, on this machine. It decides whether a rank's save should split its payloads between
// writer threads (docs/PERFORMANCE.md, "Parallel writers within a rank").
//
// --mib MiB (default 256) of pseudo-random bytes are written to a new file as a save writes
// its body: in 8 MiB pwrite()s, each followed by sync_file_range(SYNC_FILE_RANGE_WRITE) (the
// early writeback every ckpt save does), then fsync and close. With T threads, each writes a
// contiguous T-th of the file. 1, 2 and 4 threads alternate round by round, rotating, each
// after sync() so that none pays for another's dirty pages; medians of --rounds rounds.
//
//   parallel_writes [--mib N] [--rounds N] [--dir DIR]
//
// Exit status 1 when a write is short, a file is not of the planned size, or the run did not
// time what it planned.

#include "bench_support.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace bench;

constexpr std::size_t piece = 8u << 20;

/// Writes `data` to `path` on `threads` threads; whether every byte was written.
bool write_file(const std::string& path, const std::vector<char>& data, int threads) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) die("open " + path);
    const std::size_t part = (data.size() + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
    std::vector<char> ok(static_cast<std::size_t>(threads), 1);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            const std::size_t begin = static_cast<std::size_t>(t) * part, end = std::min(data.size(), begin + part);
            for (std::size_t at = begin; at < end; at += piece) {
                const std::size_t n = std::min(piece, end - at);
                if (::pwrite(fd, data.data() + at, n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) {
                    ok[static_cast<std::size_t>(t)] = 0;
                    return;
                }
                ::sync_file_range(fd, static_cast<off_t>(at), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
            }
        });
    for (auto& th : pool) th.join();
    if (::fsync(fd) != 0) die("fsync " + path);
    struct stat st {};
    const bool sized = ::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) == data.size();
    ::close(fd);
    return sized && std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; });
}

int run(const std::string& dir, std::size_t mib, int rounds) {
    print_machine(dir);
    std::vector<char> data(mib << 20);
    fill_random_floats(reinterpret_cast<float*>(data.data()), data.size() / sizeof(float), 7);
    const int counts[] = {1, 2, 4};
    std::map<int, std::vector<double>> times;
    Checks checks;
    bool whole = true;
    for (int round = 0; round < rounds; ++round)
        for (int k = 0; k < 3; ++k) {
            const int threads = counts[(k + round) % 3];
            const std::string path = dir + "/parallel_writes_" + std::to_string(threads) + ".bin";
            remove_file(path);
            ::sync();
            times[threads].push_back(timed([&] { whole = write_file(path, data, threads) && whole; }));
        }
    checks.that(whole, "a write was short, or a file is not of the planned size");
    std::printf("%zu MiB in 8 MiB pwrite()s with early writeback, fsync; medians of %d rounds:\n", mib, rounds);
    const double one = median(times[1]);
    for (const int t : counts) {
        checks.count(std::to_string(t) + "-thread writes timed", rounds, static_cast<long long>(times[t].size()));
        const double m = median(times[t]);
        checks.rate(std::to_string(t) + "-thread write", static_cast<double>(data.size()), m / 1e3);
        std::printf("  %d thread(s)  %8.1f ms  %7.0f MB/s   time / 1 thread %.3f\n", t, m, data.size() / m / 1e3, m / one);
    }
    std::printf("result: t2/t1=%.3f t4/t1=%.3f t1_ms=%.1f\n", median(times[2]) / one, median(times[4]) / one, one);
    return checks.status();
}

}  // namespace

int main(int argc, char** argv) {
    const SizeOptions o = size_options(argc, argv, {256, 7, ""});
    return run_in_directory(o.dir, {"parallel_writes_1.bin", "parallel_writes_2.bin", "parallel_writes_4.bin"},
                            [&](const std::string& d) { return run(d, o.mib, o.rounds); });
}
