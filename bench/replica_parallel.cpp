// What replica-parallel saves (fault::replica_share, fault::ReplicaParallel) buy a
// data-parallel job: R ranks (threads on a ThreadComm) hold the same state of M MiB. A step's
// save is done when every rank's file is on the durable level and the step's global index
// is committed and copied there. Three ways, alternated in every round:
//   one     1 rank saves the whole state: the baseline
//   copies  R ranks each save the whole state, as a data-parallel job does without sharing
//   shared  R ranks each save their share (replica_share): the state once, in R runs
// Per-client bandwidth: each rank's manager copies its files to the durable level through its
// own pacer (DurableLevel::max_bytes_per_second = --rate), as each host's link limits what
// that host sends to shared storage: R ranks together get R times one rank's bandwidth,
// whether they send R copies or one. This is fair to both sides: the baseline's single rank
// and each of the R ranks get the same rate, and the local write before the copy is unpaced
// for all.
//
// Then loads of the shared save's step (its index names the R files), alternated the same way:
//   one       1 rank loads the whole state (ckpt::load_resharded): the baseline
//   each      R ranks each load it, each reading every byte, as a resume did
//   read_once R ranks load it with fault::load_resharded_read_once: each reads its run, and
//             the runs go over the communicator
// With --throttle-reads B (root, cgroup v1 blkio), each rank's thread reads through a blkio
// cgroup of its own limited to B bytes a second on the directory's device, and the page cache
// is dropped before every load: per-client read bandwidth, as the pacer is for the copies.
// Without it the loads read from the page cache, and only their bytes mean much.
//
//   replica_parallel [--mib M] [--ranks R] [--rate B] [--rounds N] [--throttle-reads B] [--dir DIR]
// Last lines: replica_parallel durable_bytes/state_bytes copies=X shared=Y shared/one=Z copies/one=W
//             replica_parallel read_bytes/state_bytes each=X read_once=Y read_once/one=Z each/one=W
// (targets: shared 1.0 where copies is R, and read_once 1.0 where each is R; shared/one and,
// with --throttle-reads, read_once/one <= 0.35 at R = 4).
// Exit status 1 if the run did not time what it planned: every save and load of every round,
// each save leaving on the durable level the bytes it should (R or 1 states, and an index),
// each load returning the state bit for bit.

#include <fault/fault.hpp>

#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {

namespace fs = boost::filesystem;
using Manager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;

struct Options {
    std::size_t mib = 64;
    int ranks = 4;
    double rate = 100e6;
    int rounds = 3;
    double throttle_reads = 0;
    std::string dir;
};

/// `rounds` rounds of `run(round, way)` for each of the three `ways`, each round starting one
/// further along, so that no way always runs first.
template <class Way, class Run>
void alternate(const Way (&ways)[3], int rounds, Run&& run) {
    for (int r = 0; r < rounds; ++r)
        for (int k = 0; k < 3; ++k) run(r, ways[(k + r) % 3]);
}

enum class Way { one, copies, shared };
const char* name_of(Way w) { return w == Way::one ? "one" : w == Way::copies ? "copies" : "shared"; }

struct Outcome {
    double ms = 0;               // from the save to the index on the durable level, on every rank
    std::uint64_t durable = 0;   // bytes of the step's rank files on the durable level
    bool indexed = false;        // the index reached the durable level
};

/// One save of `state` by the ranks of `way`, into fresh directories under `dir`.
Outcome save_once(Way way, const ckpt::ParamDict& state, const fs::path& dir, const Options& o, bool keep = false) {
    const int ranks = way == Way::one ? 1 : o.ranks;
    const fs::path local = dir / "local", durable = dir / "durable";
    fs::remove_all(dir);
    Outcome out;
    std::vector<std::uint64_t> bytes(static_cast<std::size_t>(ranks));
    fault::ThreadGroup group(ranks, std::chrono::seconds(120));
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        const std::string rank = "rank_" + std::to_string(comm.rank());
        ckpt::ManagerOptions options;
        options.write_meta = false;
        options.durable = ckpt::DurableLevel{durable / rank, ckpt::KeepLast{2}, 1, o.rate};
        Manager mgr(local / rank, "bench", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, options);
        ckpt::Progress p;
        p.epoch = 1;
        p.step = p.global_step = 1;
        comm.barrier();
        const auto t0 = bench::Clock::now();
        const fault::ReplicaShare share =
            fault::replica_share(state, way == Way::shared ? comm.size() : 1, way == Way::shared ? comm.rank() : 0);
        const ckpt::Path file = mgr.save(p, share.state);
        fault::index_saved_checkpoint(comm, mgr, local, 1, file, share.places);
        mgr.wait_flushed();
        comm.barrier();
        if (comm.rank() == 0) out.ms = bench::ms_since(t0);
        const fs::path copy = *mgr.durable_directory() / file.filename();
        bytes[static_cast<std::size_t>(comm.rank())] = fs::exists(copy) ? fs::file_size(copy) : 0;
    }).rethrow();
    for (const auto b : bytes) out.durable += b;
    out.indexed = fs::exists(fault::global_index_path(durable, 1));
    if (!keep) fs::remove_all(dir);
    return out;
}

enum class Load { one, each, read_once };
const char* name_of(Load w) { return w == Load::one ? "one" : w == Load::each ? "each" : "read_once"; }

/// Per-client read bandwidth (--throttle-reads): a blkio cgroup (v1) per rank, limited on the
/// device of the directory read; a thread joins it by writing its id into its tasks.
class ReadThrottle {
public:
    ReadThrottle(double bytes_per_second, const std::string& dir, int ranks) {
        if (!(bytes_per_second > 0)) return;
        struct stat st {};
        if (::stat(dir.c_str(), &st) != 0) bench::die("stat " + dir);
        const std::string device = std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
        for (int r = 0; r < ranks; ++r) {
            const fs::path group = root_ / ("ckpt-bench-" + std::to_string(::getpid()) + "-" + std::to_string(r));
            fs::create_directories(group);
            write(group / "blkio.throttle.read_bps_device", device + " " + std::to_string(std::llround(bytes_per_second)));
            groups_.push_back(group);
        }
    }
    ~ReadThrottle() {
        boost::system::error_code ec;
        for (const auto& g : groups_) fs::remove(g, ec);
    }
    bool on() const { return !groups_.empty(); }
    /// Every read of the calling thread from now on through rank `r`'s limit (or none: -1).
    void join(int r) const {
        if (!on()) return;
        const std::string tid = std::to_string(::syscall(SYS_gettid));
        write((r < 0 ? root_ : groups_.at(static_cast<std::size_t>(r))) / "tasks", tid);
    }
    /// The page cache dropped, so that the next load reads from the device.
    void cold() const {
        if (!on()) return;
        ::sync();
        write("/proc/sys/vm/drop_caches", "1");
    }

private:
    static void write(const fs::path& file, const std::string& text) {
        std::ofstream out(file.string());
        out << text << std::flush;
        if (!out) bench::die("write " + file.string());
    }
    fs::path root_ = "/sys/fs/cgroup/blkio";
    std::vector<fs::path> groups_;
};

struct Loaded {
    double ms = 0;            // from the start to every rank holding the state
    std::uint64_t read = 0;   // bytes read from storage, all ranks
    bool exact = true;        // every rank's state equals the saved one
};

/// One load of the step indexed at `index_file` (holding `state`) by the ranks of `way`.
Loaded load_once(Load way, const ckpt::ParamDict& state, const fs::path& index_file, const Options& o,
                 const ReadThrottle& throttle) {
    const int ranks = way == Load::one ? 1 : o.ranks;
    ckpt::ParamDict like;
    for (const auto& [name, value] : state) {
        const ckpt::Tensor& t = *value.get_if<ckpt::Tensor>();
        like.set(name, ckpt::Tensor(t.dtype(), t.logical_shape()));
    }
    const ckpt::GlobalIndex index = ckpt::read_global_index(index_file);
    throttle.cold();
    Loaded out;
    std::vector<std::uint64_t> read(static_cast<std::size_t>(ranks));
    std::vector<int> exact(static_cast<std::size_t>(ranks));
    fault::ThreadGroup group(ranks, std::chrono::seconds(300));
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        throttle.join(comm.rank());
        comm.barrier();
        const auto t0 = bench::Clock::now();
        const ckpt::ReshardedState got =
            way == Load::read_once ? fault::load_resharded_read_once(comm, index, index_file, like)
                                   : ckpt::load_resharded(index, index_file, like);
        comm.barrier();
        if (comm.rank() == 0) out.ms = bench::ms_since(t0);
        throttle.join(-1);
        read[static_cast<std::size_t>(comm.rank())] = got.bytes_read;
        bool same = true;
        for (const auto& [name, value] : state) same = same && got.state.at(name) == value;
        exact[static_cast<std::size_t>(comm.rank())] = same;
    }).rethrow();
    for (std::size_t r = 0; r < read.size(); ++r) {
        out.read += read[r];
        out.exact = out.exact && exact[r];
    }
    return out;
}

int run(const std::string& dir, Options o) {
    o.dir = dir;
    bench::print_machine(o.dir);
    std::printf("state: %zu MiB in 8 tensors; %d ranks; each rank's copies to the durable level paced to %.0f MB/s; "
                "%d rounds\n",
                o.mib, o.ranks, o.rate / 1e6, o.rounds);
    // 8 tensors of whole rows of 1000 floats, and a bias: cuts fall inside tensors and rows
    const std::size_t floats = (o.mib << 20) / sizeof(float);
    std::vector<std::vector<float>> tensors;
    ckpt::ParamDict state;
    for (int t = 0; t < 8; ++t) {
        const std::size_t rows = floats / 8 / 1000;
        tensors.emplace_back(rows * 1000);
        bench::fill_random_floats(tensors.back().data(), tensors.back().size(), static_cast<std::uint64_t>(t));
        state.set("layer" + std::to_string(t) + ".weight",
                  ckpt::Tensor::view(std::span<float>(tensors.back()), {static_cast<std::int64_t>(rows), 1000}));
    }
    tensors.emplace_back(1000, 0.5f);
    state.set("bias", ckpt::Tensor::view(std::span<float>(tensors.back()), {1000}));
    std::uint64_t state_bytes = 0;
    for (const auto& t : tensors) state_bytes += t.size() * sizeof(float);

    bench::Checks checks;
    const fs::path work = fs::path(o.dir) / "work";
    save_once(Way::shared, state, work, o);  // warm-up: page cache, allocator
    std::map<Way, std::vector<double>> times;
    std::map<Way, std::vector<double>> ratio;  // durable bytes / state bytes
    const Way order[] = {Way::one, Way::copies, Way::shared};
    alternate(order, o.rounds, [&](int r, Way way) {
        const Outcome got = save_once(way, state, work, o);
        checks.that(got.indexed, std::string(name_of(way)) + ": the step's index did not reach the durable level");
        checks.rate(std::string(name_of(way)) + " save", double(got.durable), got.ms / 1e3);
        times[way].push_back(got.ms);
        ratio[way].push_back(double(got.durable) / double(state_bytes));
        std::printf("round %d %-6s %8.1f ms, %.3f states on the durable level\n", r + 1, name_of(way), got.ms,
                    ratio[way].back());
    });
    for (const Way w : order) checks.count(std::string(name_of(w)) + " saves timed", o.rounds, long(times[w].size()));
    // each way's bytes: the state once (one, shared) or R times (copies), with files' headers
    const double copies = bench::median(ratio[Way::copies]), shared = bench::median(ratio[Way::shared]);
    checks.that(bench::median(ratio[Way::one]) >= 1.0 && bench::median(ratio[Way::one]) < 1.01,
                "one: the durable level does not hold the state once");
    checks.that(copies >= o.ranks && copies < o.ranks * 1.01, "copies: the durable level does not hold R states");
    checks.that(shared >= 1.0 && shared < 1.01, "shared: the durable level does not hold the state once");
    const double one_ms = bench::median(times[Way::one]);
    checks.positive("one-rank save time", one_ms);
    std::printf("medians: one %.1f ms, copies %.1f ms, shared %.1f ms\n", one_ms, bench::median(times[Way::copies]),
                bench::median(times[Way::shared]));
    std::printf("replica_parallel durable_bytes/state_bytes copies=%.3f shared=%.3f shared/one=%.3f copies/one=%.3f\n",
                copies, shared, bench::median(times[Way::shared]) / one_ms, bench::median(times[Way::copies]) / one_ms);

    // loads of a shared save's step
    const fs::path saved = work / "kept";
    save_once(Way::shared, state, saved, o, /*keep=*/true);
    const fs::path index_file = fault::global_index_path(saved / "local", 1);
    const ReadThrottle throttle(o.throttle_reads, o.dir, o.ranks);
    std::printf("loads: %s\n", throttle.on() ? ("each rank's reads limited to " + std::to_string(o.throttle_reads / 1e6) +
                                                " MB/s, page cache dropped before each").c_str()
                                             : "from the page cache");
    std::map<Load, std::vector<double>> load_ms, read_ratio;
    const Load loads[] = {Load::one, Load::each, Load::read_once};
    alternate(loads, o.rounds, [&](int r, Load way) {
        const Loaded got = load_once(way, state, index_file, o, throttle);
        checks.that(got.exact, std::string(name_of(way)) + ": a rank's loaded state differs from the saved one");
        checks.rate(std::string(name_of(way)) + " load", double(state_bytes), got.ms / 1e3);
        load_ms[way].push_back(got.ms);
        read_ratio[way].push_back(double(got.read) / double(state_bytes));
        std::printf("round %d %-9s %8.1f ms, %.3f states read\n", r + 1, name_of(way), got.ms, read_ratio[way].back());
    });
    for (const Load w : loads) checks.count(std::string(name_of(w)) + " loads timed", o.rounds, long(load_ms[w].size()));
    const double each = bench::median(read_ratio[Load::each]), once = bench::median(read_ratio[Load::read_once]);
    checks.that(each >= o.ranks && each < o.ranks * 1.01, "each: the ranks did not read R states");
    checks.that(once >= 1.0 && once < 1.01, "read_once: the ranks did not read the state once");
    const double one_load = bench::median(load_ms[Load::one]);
    checks.positive("one-rank load time", one_load);
    std::printf("medians: one %.1f ms, each %.1f ms, read_once %.1f ms\n", one_load, bench::median(load_ms[Load::each]),
                bench::median(load_ms[Load::read_once]));
    std::printf("replica_parallel read_bytes/state_bytes each=%.3f read_once=%.3f read_once/one=%.3f each/one=%.3f\n", each,
                once, bench::median(load_ms[Load::read_once]) / one_load, bench::median(load_ms[Load::each]) / one_load);
    return checks.status();
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "replica_parallel: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--mib") o.mib = std::stoul(value());
        else if (a == "--ranks") o.ranks = std::stoi(value());
        else if (a == "--rate") o.rate = std::stod(value());
        else if (a == "--rounds") o.rounds = std::stoi(value());
        else if (a == "--throttle-reads") o.throttle_reads = std::stod(value());
        else if (a == "--dir") o.dir = value();
        else {
            std::fprintf(stderr,
                         "usage: replica_parallel [--mib M] [--ranks R] [--rate BYTES_PER_S] [--rounds N] "
                         "[--throttle-reads BYTES_PER_S] [--dir DIR]\n");
            return 2;
        }
    }
    if (o.mib < 1 || o.ranks < 2 || o.rounds < 1 || !(o.rate > 0)) {
        std::fprintf(stderr, "replica_parallel: --mib and --rounds must be at least 1, --ranks 2, --rate above 0\n");
        return 2;
    }
    ckpt::set_log_sink([](ckpt::LogLevel, std::string_view) {});
    return bench::run_in_directory(o.dir, {}, [&](const std::string& dir) { return run(dir, o); });
}
