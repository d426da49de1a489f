// map_state: what a std::map<std::string, double> of N entries costs in a checkpoint, bound as
// a value map (ckpt::view_of) and as a Boost.Serialization object (ckpt::object), against
// the baseline a program has without ckpt: the map through Boost's binary_oarchive into a
// file of its own, written and fsynced (and read back through binary_iarchive).
//
// Round by round, the three alternate (each round starts with another). Each save is a whole
// durable save (a checkpoint: temporary, fsync, rename, directory fsync; the baseline: write
// and fsync), each load reads the file into a map emptied before and checks every entry.
// Printed: the medians and
//
//   save ratio = t(ckpt save) / t(Boost archive save)        likewise for loads
//
// Last line: `map_state value_map_save=… value_map_load=… object_save=… object_load=…`.
//
//   map_state [--entries N] [--rounds R] [--dir DIR]          (N default 100000, R default 5)
//
// Exit status 1 when the run did not time what it planned: every save and load of every
// round, each load giving back the whole map, no time of zero.

#include <ckpt/ckpt.hpp>
#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/map.hpp>
#include <boost/serialization/string.hpp>

#include <fcntl.h>
#include <unistd.h>

#include "bench_support.hpp"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Map = std::map<std::string, double>;

void write_durably(const std::string& path, const std::string& bytes) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) bench::die("open " + path);
    for (std::size_t done = 0; done < bytes.size();) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n <= 0) bench::die("write " + path);
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) bench::die("fsync " + path);
    ::close(fd);
}

std::string read_whole(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) bench::die("open " + path);
    std::string bytes(static_cast<std::size_t>(boost::filesystem::file_size(path)), '\0');
    for (std::size_t done = 0; done < bytes.size();) {
        const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
        if (n <= 0) bench::die("read " + path);
        done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    return bytes;
}

struct Way {
    std::string name;
    std::function<void(const Map&, const std::string&)> save;
    std::function<void(Map&, const std::string&)> load;
    std::vector<double> save_ms, load_ms;
};

}  // namespace

int main(int argc, char** argv) {
    std::size_t n = 100000;
    int rounds = 5;
    std::string dir_arg;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--entries" && i + 1 < argc) n = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
        else if (a == "--dir" && i + 1 < argc) dir_arg = argv[++i];
        else {
            std::fprintf(stderr, "usage: map_state [--entries N] [--rounds R] [--dir DIR]\n");
            return 2;
        }
    }
    if (n < 1 || rounds < 1) {
        std::fprintf(stderr, "map_state: --entries and --rounds must be at least 1\n");
        return 2;
    }
    return bench::run_in_directory(dir_arg, {"boost.bin", "value_map.ckpt", "object.ckpt"}, [&](const std::string& dir) {
        bench::print_machine(dir);
        Map source;
        for (std::size_t i = 0; i < n; ++i) source.emplace("metric/" + std::to_string(i * 7919 % n), 0.5 * static_cast<double>(i));

        std::vector<Way> ways;
        ways.push_back({"Boost archive",
                        [](const Map& m, const std::string& path) {
                            std::ostringstream os;
                            {
                                boost::archive::binary_oarchive ar(os);
                                ar << m;
                            }
                            write_durably(path, std::move(os).str());
                        },
                        [](Map& m, const std::string& path) {
                            std::istringstream is(read_whole(path));
                            boost::archive::binary_iarchive ar(is);
                            ar >> m;
                        },
                        {},
                        {}});
        auto through_ckpt = [](auto bind) {
            return std::pair{[bind](const Map& m, const std::string& path) {
                                 ckpt::ParamDict d;
                                 d.set("m", bind(const_cast<Map&>(m)));
                                 ckpt::save_checkpoint(d, path);
                             },
                             [bind](Map& m, const std::string& path) {
                                 ckpt::ParamDict d;
                                 d.set("m", bind(m));
                                 ckpt::load_checkpoint_into(path, d, true);
                             }};
        };
        const auto [vm_save, vm_load] = through_ckpt([](Map& m) { return ckpt::view_of(m); });
        ways.push_back({"value map", vm_save, vm_load, {}, {}});
        const auto [obj_save, obj_load] = through_ckpt([](Map& m) { return ckpt::object(m); });
        ways.push_back({"object", obj_save, obj_load, {}, {}});
        const std::vector<std::string> files{dir + "/boost.bin", dir + "/value_map.ckpt", dir + "/object.ckpt"};

        bench::Checks checks;
        long long whole_loads = 0;
        for (int r = 0; r < rounds; ++r) {
            for (std::size_t k = 0; k < ways.size(); ++k) {
                const std::size_t w = (k + static_cast<std::size_t>(r)) % ways.size();
                Way& way = ways[w];
                way.save_ms.push_back(bench::timed([&] { way.save(source, files[w]); }));
                Map loaded;
                way.load_ms.push_back(bench::timed([&] { way.load(loaded, files[w]); }));
                whole_loads += loaded == source;
            }
        }
        const auto planned = static_cast<long long>(rounds) * static_cast<long long>(ways.size());
        checks.count("loads giving back the whole map", planned, whole_loads);
        std::printf("a std::map<std::string, double> of %zu entries, %d rounds; medians:\n", n, rounds);
        std::vector<double> save, load;
        for (std::size_t w = 0; w < ways.size(); ++w) {
            checks.count(ways[w].name + " saves timed", rounds, static_cast<long long>(ways[w].save_ms.size()));
            save.push_back(bench::median(ways[w].save_ms));
            load.push_back(bench::median(ways[w].load_ms));
            const auto bytes = static_cast<double>(boost::filesystem::file_size(files[w]));
            checks.rate(ways[w].name + " save", bytes, save.back() / 1e3);
            checks.rate(ways[w].name + " load", bytes, load.back() / 1e3);
            std::printf("  %-14s file %9.0f bytes  save %8.2f ms  load %8.2f ms  ratio save %.2f load %.2f\n",
                        ways[w].name.c_str(), bytes, save.back(), load.back(), save.back() / save[0], load.back() / load[0]);
        }
        std::printf("map_state value_map_save=%.2f value_map_load=%.2f object_save=%.2f object_load=%.2f\n",
                    save[1] / save[0], load[1] / load[0], save[2] / save[0], load[2] / load[0]);
        return checks.status();
    });
}
