#pragma once
// What the I/O benchmarks share: the machine description printed before the figures, timing
// helpers, and how they fail.

#include <errno.h>
#include <stdlib.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;

[[noreturn]] inline void die(const std::string& what) {
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what.c_str(), std::strerror(errno));
    std::exit(2);
}

inline void remove_file(const std::string& path) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) die("unlink " + path);
}

inline double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

template <class F>
double timed(F&& f) {
    const auto t0 = Clock::now();
    f();
    return ms_since(t0);
}

/// Deterministic pseudo-random floats, uniform in [-1, 1): splitmix64 per element. Their
/// mantissas are random, sign and exponent are not (zstd takes about 8 % off).
inline void fill_random_floats(float* p, std::size_t n, std::uint64_t seed) {
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (std::size_t i = 0; i < n; ++i) {
        std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        p[i] = static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
    }
}

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// Runs `run(dir)` in `dir_arg`, or, when it is empty, in a new directory under /var/tmp that
/// is removed afterwards (in a given directory only `files` are removed). Returns run's exit
/// status, 2 after an exception.
template <class Run>
int run_in_directory(const std::string& dir_arg, const std::vector<std::string>& files, Run&& run) {
    std::string dir = dir_arg;
    if (dir.empty()) {
        dir = std::string("/var/tmp/") + program_invocation_short_name + "-XXXXXX";
        if (!::mkdtemp(dir.data())) die("mkdtemp " + dir);
    }
    int rc = 2;
    try {
        rc = run(dir);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, e.what());
    }
    boost::system::error_code ec;
    if (dir_arg.empty()) boost::filesystem::remove_all(dir, ec);
    for (const auto& f : files) boost::filesystem::remove(boost::filesystem::path(dir) / f, ec);
    return rc;
}

// Machine description

inline std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            return colon == std::string::npos ? line : line.substr(line.find_first_not_of(" \t", colon + 1));
        }
    return "unknown";
}

inline std::string fs_type_name(const std::string& dir) {
    struct statfs s {};
    if (::statfs(dir.c_str(), &s) != 0) return "unknown";
    static const std::map<unsigned long, const char*> names = {
        {0xEF53, "ext2/3/4"},   {0x58465342, "xfs"},      {0x9123683E, "btrfs"}, {0x01021994, "tmpfs"},
        {0x794c7630, "overlayfs"}, {0x6969, "nfs"},       {0x2fc12fc1, "zfs"},   {0xF2F52010, "f2fs"},
        {0x65735546, "fuse"},   {0x858458f6, "ramfs"},    {0x5346544e, "ntfs"},  {0x4d44, "vfat"},
    };
    const auto type = static_cast<unsigned long>(s.f_type) & 0xffffffffUL;
    auto it = names.find(type);
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%lx", type);
    return it == names.end() ? std::string("unknown (") + hex + ")" : std::string(it->second) + " (" + hex + ")";
}

/// The 1-minute load average: other work on the machine skews every number here.
inline std::string loadavg() {
    std::ifstream in("/proc/loadavg");
    std::string one;
    in >> one;
    return one.empty() ? "unknown" : one;
}

inline void print_machine(const std::string& dir) {
    struct utsname u {};
    ::uname(&u);
    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
    std::printf("machine: cpu=\"%s\" nproc=%ld kernel=%s %s %s\n", cpu_model().c_str(), ::sysconf(_SC_NPROCESSORS_ONLN),
                u.sysname, u.release, u.machine);
    std::printf("dir: %s fs=%s\n", dir.c_str(), fs_type_name(dir).c_str());
    std::printf("date: %s\n", date);
    std::printf("load: 1-minute load average %s at start (other work on the machine skews the numbers)\n",
                loadavg().c_str());
}

}  // namespace bench
