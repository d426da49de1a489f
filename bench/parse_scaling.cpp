// parse_scaling: what listing and loading a file costs as its number of entries grows, for the
// formats whose table of contents grows with them: a safetensors header, an npz's zip
// directory and npy headers, a checkpoint's table of contents. A parser that is linear in its
// input takes ten times as long for ten times the entries; one that is quadratic, a hundred
// times (a safetensors header of 200,000 tensors once took 266 s to show, 40,000 took 6.8 s).
//
// Files of N and 10 N one-element float32 tensors are written once; then, round by round
// and alternating which goes first, each is listed (safetensors_contents, npz_contents,
// read_contents) and loaded (load_safetensors, load_npz, load_checkpoint). Printed per format
// and operation: the medians and
//
//   scaling = t(10 N) / (10 t(N))       1 for linear time, 10 for quadratic
//
// Last line: `parse_scaling safetensors=S npz=Z ckpt=C`, the listings' scaling (the loads'
// are printed above it).
//
//   parse_scaling [--entries N] [--rounds R] [--dir DIR]      (N default 20000, R default 3)
//
// Exit status 1 when the run did not time what it planned: every listing returning all
// entries, every load returning all tensors, no time of zero.

#include <ckpt/checkpoint.hpp>
#include <ckpt/interop.hpp>

#include "bench_support.hpp"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

struct Format {
    std::string name;
    std::string extension;
    std::function<void(const ckpt::ParamDict&, const std::string&)> write;
    std::function<std::size_t(const std::string&)> list;  // entries listed
    std::function<std::size_t(const std::string&)> load;  // tensors loaded
};

ckpt::ParamDict entries(std::size_t n) {
    ckpt::ParamDict d;
    for (std::size_t i = 0; i < n; ++i)
        d.set("layer" + std::to_string(i) + ".weight", ckpt::Tensor::from(std::vector<float>{static_cast<float>(i)}));
    return d;
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t n = 20000;
    int rounds = 3;
    std::string dir_arg;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--entries" && i + 1 < argc) {
            n = std::strtoull(argv[++i], nullptr, 10);
        } else if (a == "--rounds" && i + 1 < argc) {
            rounds = std::atoi(argv[++i]);
        } else if (a == "--dir" && i + 1 < argc) {
            dir_arg = argv[++i];
        } else {
            std::fprintf(stderr, "usage: parse_scaling [--entries N] [--rounds R] [--dir DIR]\n");
            return 2;
        }
    }
    if (n < 1 || rounds < 1) {
        std::fprintf(stderr, "parse_scaling: --entries and --rounds must be at least 1\n");
        return 2;
    }
    // the budget is the default's rule; these files decode to what they hold, a few bytes each
    const std::vector<Format> formats = {
        {"safetensors", ".safetensors",
         [](const ckpt::ParamDict& d, const std::string& p) { ckpt::save_safetensors(d, p); },
         [](const std::string& p) { return ckpt::safetensors_contents(p).size(); },
         [](const std::string& p) { return ckpt::load_safetensors(p).size(); }},
        {"npz", ".npz", [](const ckpt::ParamDict& d, const std::string& p) { ckpt::save_npz(d, p); },
         [](const std::string& p) { return ckpt::npz_contents(p).size(); },
         [](const std::string& p) { return ckpt::load_npz(p).size(); }},
        {"ckpt", ".ckpt", [](const ckpt::ParamDict& d, const std::string& p) { ckpt::save_checkpoint(d, p); },
         [](const std::string& p) { return ckpt::read_contents(p).entries.size(); },
         [](const std::string& p) { return ckpt::load_checkpoint(p).size(); }},
    };
    std::vector<std::string> files;
    for (const auto& f : formats)
        for (const char* size : {"small", "large"}) files.push_back(std::string("scaling-") + size + f.extension);

    return bench::run_in_directory(dir_arg, files, [&](const std::string& dir) {
        bench::print_machine(dir);
        const std::size_t sizes[2] = {n, 10 * n};
        std::printf("entries: %zu and %zu one-element float32 tensors; %d rounds\n", sizes[0], sizes[1], rounds);
        {
            const ckpt::ParamDict small = entries(sizes[0]), large = entries(sizes[1]);
            for (const auto& f : formats) {
                f.write(small, dir + "/scaling-small" + f.extension);
                f.write(large, dir + "/scaling-large" + f.extension);
            }
        }
        bench::Checks checks;
        std::string last = "parse_scaling";
        for (const auto& f : formats) {
            // [operation][size]: list, load
            std::vector<double> times[2][2];
            long long complete[2][2] = {};
            for (int r = 0; r < rounds; ++r)
                for (int k = 0; k < 2; ++k) {
                    const int s = (r + k) % 2;  // which size goes first alternates
                    const std::string path = dir + (s ? "/scaling-large" : "/scaling-small") + f.extension;
                    std::size_t listed = 0, loaded = 0;
                    times[0][s].push_back(bench::timed([&] { listed = f.list(path); }));
                    times[1][s].push_back(bench::timed([&] { loaded = f.load(path); }));
                    complete[0][s] += listed == sizes[s];
                    complete[1][s] += loaded == sizes[s];
                }
            double listing_scaling = 0;
            for (int op = 0; op < 2; ++op) {
                const char* what = op ? "load" : "list";
                for (int s = 0; s < 2; ++s) {
                    checks.count(f.name + " " + what + "s of " + std::to_string(sizes[s]) + " entries returning them all",
                                 rounds, complete[op][s]);
                    checks.positive(f.name + " " + what + " time (median) of " + std::to_string(sizes[s]) + " entries",
                                    bench::median(times[op][s]));
                }
                const double small = bench::median(times[op][0]), large = bench::median(times[op][1]);
                const double scaling = small > 0 ? large / (10 * small) : 0;
                std::printf("%-12s %s: %zu entries %9.2f ms, %zu entries %9.2f ms, scaling=%.2f\n", f.name.c_str(), what,
                            sizes[0], small, sizes[1], large, scaling);
                if (op == 0) listing_scaling = scaling;
            }
            char part[64];
            std::snprintf(part, sizeof part, " %s=%.2f", f.name.c_str(), listing_scaling);
            last += part;
        }
        std::printf("%s\n", last.c_str());
        return checks.status();
    });
}
