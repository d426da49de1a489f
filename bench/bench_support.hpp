#pragma once
// What the benchmarks share: the machine description printed before the figures, timing
// helpers, the checks of what they timed, and how they fail.

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
#include <cmath>
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

/// Element `i` of what fill_random_floats(p, n, seed) writes, for n > i.
inline float random_float_at(std::uint64_t seed, std::size_t i) {
    std::uint64_t z = seed * 0x9E3779B97F4A7C15ULL + 1 + (static_cast<std::uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
}

inline double median(std::vector<double> v) {
    if (v.empty()) return 0;  // Checks::count says what is missing
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// More bytes a second than any machine's memory gives one process: a copy, save or load
/// timed faster than this moved nothing in the time taken (or the clock read nothing).
constexpr double max_bytes_per_second = 1e12;

/// What a benchmark checks about what it timed, before its figures are believed: that it
/// timed every event it planned (saves, loads, copies, collectives, steps), and that the
/// figures it divides by are plausible. Every failed check prints a line to stderr naming
/// what was planned, what was timed, or which figure is implausible; status() is then 1.
class Checks {
public:
    /// `timed` events of `what` (a plural: "saves timed") where `planned` were.
    void count(const std::string& what, long long planned, long long timed) {
        if (timed != planned) fail(what + ": planned " + std::to_string(planned) + ", timed " + std::to_string(timed));
    }
    /// At least `least` events of `what`.
    void at_least(const std::string& what, long long least, long long timed) {
        if (timed < least)
            fail(what + ": planned at least " + std::to_string(least) + ", timed " + std::to_string(timed));
    }
    /// `seconds` to move `bytes`: more than nothing, and no faster than memory.
    void rate(const std::string& what, double bytes, double seconds) {
        char buf[256];
        if (!(bytes > 0)) {
            std::snprintf(buf, sizeof buf, "%s: implausible: %.0f bytes moved", what.c_str(), bytes);
            fail(buf);
        } else if (!(seconds > 0) || !std::isfinite(seconds) || bytes / seconds > max_bytes_per_second) {
            std::snprintf(buf, sizeof buf, "%s: implausible: %.3f MiB in %.6f ms, above %.0f GB/s", what.c_str(),
                          bytes / 1048576.0, seconds * 1e3, max_bytes_per_second / 1e9);
            fail(buf);
        }
    }
    /// A time or a ratio that must be a finite number above zero (a divisor, a stall).
    void positive(const std::string& what, double value) {
        if (!(value > 0) || !std::isfinite(value)) {
            char buf[256];
            std::snprintf(buf, sizeof buf, "%s: implausible: %g", what.c_str(), value);
            fail(buf);
        }
    }
    /// A condition the figures rest on, with what it means when it does not hold.
    void that(bool ok, const std::string& what) {
        if (!ok) fail(what);
    }
    bool failed() const noexcept { return failures_ > 0; }
    /// 1 when a check failed (after a line saying how many), otherwise `rc`.
    int status(int rc = 0) const {
        if (!failures_) return rc;
        std::fprintf(stderr,
                     "%s: %d check(s) of what was timed failed: the figures above do not measure what they say\n",
                     program_invocation_short_name, failures_);
        return 1;
    }

private:
    void fail(const std::string& line) {
        ++failures_;
        std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, line.c_str());
        std::fflush(stderr);
    }
    int failures_ = 0;
};

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

/// The options of a bench that sizes only its state and its rounds: [--mib N] [--rounds N]
/// [--dir DIR], each defaulting to `o`'s. Exits with status 2 and the usage on anything else.
struct SizeOptions {
    std::size_t mib;
    int rounds;
    std::string dir;
};

inline SizeOptions size_options(int argc, char** argv, SizeOptions o) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--mib" && i + 1 < argc) o.mib = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--rounds" && i + 1 < argc) o.rounds = std::atoi(argv[++i]);
        else if (a == "--dir" && i + 1 < argc) o.dir = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--mib N] [--rounds N] [--dir DIR]\n", argv[0]);
            std::exit(2);
        }
    }
    if (o.mib == 0 || o.rounds < 1) {
        std::fprintf(stderr, "%s: --mib and --rounds must be at least 1\n", argv[0]);
        std::exit(2);
    }
    return o;
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
