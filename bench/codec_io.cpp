// codec_io: what the body codecs (zstd, AES-256-GCM, their chain) cost, against no codec.
//
// Four states, saved and loaded with ckpt in the same process and directory, each codec
// alternating round by round with the same call without a codec (NoCodec):
//
//   lenet   the seed's LeNet5 with Momentum, trained for one epoch of Fashion-MNIST (1875 steps,
//           batch 32, the seed's pipeline) in this process: the trainer's checkpoint state
//           (parameters, Momentum state, hyperparameters, data order, position); or the
//           checkpoint given with --lenet FILE (e.g. one examples/fault_recover wrote)
//   dp      the seed's data-parallel network (784-512-5120-5120-512-10) and its Momentum state,
//           243 MiB, trained for --dp-steps steps (default 20) so that weights and momenta hold
//           the values training gives them
//   random  the state of bench/ckpt_io: 64 float32 tensors of [1024, 1024], 256 MiB of
//           deterministic pseudo-random values uniform in [-1, 1). Their mantissas are random,
//           but sign and exponent are not (half the values share one exponent): zstd shrinks
//           them by about 8 %, so its probe compresses them all
//   bits    64 int32 tensors of [1024, 1024] whose every bit is pseudo-random: 256 MiB that
//           do not compress at all (what the probe is for)
//
// and four measurements:
//
//   zstd       Zstd{level} (default 3, the library's) on lenet, dp, random and bits: file size
//              against the NoCodec file, save (save_checkpoint: write, fsync, rename, directory
//              fsync), load_into (load_checkpoint_into preallocated, touched tensors: what
//              restore() does) and load_fresh (load_checkpoint, a new ParamDict). Floor on
//              random and bits: save NoCodec time / save Zstd time >= 0.95 (a state that does
//              not compress must cost at most 5 % more).
//   aes        AesGcm{random key} on random: save, load_into, load_fresh; loads warm (the file
//              just written, from the page cache, as bench/ckpt_io) and cold (before every
//              timed cold load, of either contender, the file is fdatasync'ed and its pages
//              dropped with posix_fadvise(POSIX_FADV_DONTNEED)). Floor: 0.8 for each ratio.
//   stall      async_save's training-thread stall with Chain<Zstd, AesGcm> on the dp state:
//              CheckpointManager::save() with ManagerOptions::async_save (the snapshot copy
//              and the handover; the codecs run on the writer thread), alternating with the
//              same save through a NoCodec manager and with a memcpy of every tensor into a
//              reused, touched buffer (the bench/async_ckpt baseline). Each is timed with the
//              writer idle (the previous save waited for outside the timing). Target: stall
//              <= 1.2 x memcpy.
//
// Pairs run in both orders, the order flipping round by round (the stall's three contenders
// rotate). Files are unlinked before every save round. Before every timed operation the memory
// it uses is primed the same way for both contenders, as in bench/ckpt_io and bench/interop_io
// (--no-prime to skip): before a save the source tensors are touched; before a load a block as
// large as both files is allocated with ckpt::detail::allocate_aligned, touched and freed
// (fresh memory for what the load allocates), the file is read once with read() (warm loads),
// and the target tensors are touched. Reported: medians, ms and MB/s (10^6 bytes of tensor
// payload per second, whatever the bytes stored), min and max; ratios baseline_time /
// codec_time (1.00: as fast as no codec, above 1 faster).
//
//   codec_io [--rounds N] [--dp-rounds N] [--stall-rounds N] [--small-rounds N] [--zstd-level L]
//            [--lenet FILE] [--lenet-images N] [--dp-steps N] [--net dp|small] [--tensors T]
//            [--data DIR] [--dir DIR] [--only PARTS] [--verbose] [--no-prime]
//
// A quick run (its figures mean nothing, its checks apply): --net small trains the
// 784-512-512-10 network of cluster_recover (5 MiB of state) for the dp and stall parts,
// --tensors T makes the random and bits states T tensors of 4 MiB instead of 64.
//
// Rounds: --rounds (default 7) for random, bits and aes; --dp-rounds (3) for zstd on dp;
// --stall-rounds (7); --small-rounds (21) for lenet.
//
// --only takes a comma-separated list of lenet, dp, random, bits, aes, stall. The line before
// the last gives zstd's MB/s (save and load_into) per state; the last line is
//   codec_io zstd_size lenet=A dp=B random=C bits=D zstd_save/none random=E bits=F aes save=G
//            load_into=H load_fresh=I cold_into=J cold_fresh=K stall/memcpy=L
// (sizes: zstd file / NoCodec file; 0 for a part not run). Exit status 1 if a load does not
// give back what was saved, or the run did not time what it planned (every round's saves,
// each writing a file of the size its first did; loads that filled or returned every tensor;
// the stall part's async saves, each written; times no faster than memory), 2 on an error; missing a floor does not fail the run (these
// numbers are too noisy on shared machines for a gate). Training runs BLAS on one thread: the bench re-runs itself with
// OPENBLAS_NUM_THREADS=1 unless it is set.

#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/codecs/zstd.hpp>
#include <nn/nn.hpp>

#include "bench_support.hpp"

#include <openssl/crypto.h>
#include <zstd.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = boost::filesystem;
using namespace bench;

// ---------------------------------------------------------------------------------------------
// States

int random_tensors = 64;  // --tensors
constexpr std::int64_t random_rows = 1024, random_cols = 1024;

/// Pseudo-random bytes, every bit of them (splitmix64 output as is): incompressible.
void fill_bits(std::byte* p, std::size_t n, std::uint64_t seed) {
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 7;
    for (std::size_t i = 0; i + 8 <= n; i += 8) {
        std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        std::memcpy(p + i, &z, 8);
    }
}

std::uint64_t payload_bytes(const ckpt::ParamDict& d) {
    std::uint64_t n = 0;
    for (const auto& e : d)
        if (const auto* t = e.value.get_if<ckpt::Tensor>()) n += t->nbytes();
    return n;
}

std::size_t tensor_count(const ckpt::ParamDict& d) {
    std::size_t n = 0;
    for (const auto& e : d) n += e.value.get_if<ckpt::Tensor>() != nullptr;
    return n;
}

/// Reads one byte of every 4 KiB page of every tensor.
void touch(const ckpt::ParamDict& d) {
    unsigned long sum = 0;
    for (const auto& e : d)
        if (const auto* t = e.value.get_if<ckpt::Tensor>())
            for (std::size_t k = 0; k < t->nbytes(); k += 4096) sum += static_cast<unsigned char>(t->data()[k]);
    volatile unsigned long sink = sum;
    (void)sink;
}

/// New tensors of the same names, dtypes and shapes (touched, scrambled): a load target.
ckpt::ParamDict make_target(const ckpt::ParamDict& state) {
    ckpt::ParamDict out;
    for (const auto& e : state)
        if (const auto* t = e.value.get_if<ckpt::Tensor>()) {
            ckpt::Tensor copy = ckpt::Tensor::uninitialized(t->dtype(), t->shape());
            if (copy.nbytes()) std::memset(copy.data(), 0xA5, copy.nbytes());
            out.set(e.name, std::move(copy));
        }
    return out;
}

void scramble(ckpt::ParamDict& d) {
    for (auto& e : d)
        if (auto* t = e.value.get_if<ckpt::Tensor>())
            if (t->nbytes()) std::memset(t->data(), 0xA5, t->nbytes());
}

/// Whether every tensor of `saved` is in `loaded` with the same dtype, shape and bytes.
bool same_tensors(const ckpt::ParamDict& saved, const ckpt::ParamDict& loaded, const std::string& what) {
    for (const auto& e : saved) {
        const auto* t = e.value.get_if<ckpt::Tensor>();
        if (!t) continue;
        const ckpt::Value* v = loaded.find(e.name);
        const auto* u = v ? v->get_if<ckpt::Tensor>() : nullptr;
        if (!u || u->dtype() != t->dtype() || u->shape() != t->shape() ||
            (t->nbytes() && std::memcmp(u->data(), t->data(), t->nbytes()) != 0)) {
            std::printf("VERIFY FAILED (%s): tensor '%s' differs from what was saved\n", what.c_str(), e.name.c_str());
            return false;
        }
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// Files and the page cache

void read_through(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("open " + path);
    static std::vector<char> buf(4u << 20);
    for (;;) {
        const ssize_t r = ::read(fd, buf.data(), buf.size());
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) die("read " + path);
        if (r == 0) break;
    }
    ::close(fd);
}

/// Makes the next read of `path` come from the device: fdatasync, then drop its cached pages.
void drop_cache(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("open " + path);
    if (::fdatasync(fd) != 0) die("fdatasync " + path);
    if (const int e = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); e != 0) {
        errno = e;
        die("posix_fadvise " + path);
    }
    ::close(fd);
}

/// Fraction of `path`'s pages in the page cache (mincore), or -1.
double resident_fraction(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    const auto size = static_cast<std::size_t>(::lseek(fd, 0, SEEK_END));
    void* map = size ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    ::close(fd);
    if (map == MAP_FAILED) return -1;
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)), pages = (size + page - 1) / page;
    std::vector<unsigned char> in(pages);
    double frac = -1;
    if (::mincore(map, size, in.data()) == 0) {
        std::size_t n = 0;
        for (unsigned char c : in) n += c & 1;
        frac = static_cast<double>(n) / static_cast<double>(pages);
    }
    ::munmap(map, size);
    return frac;
}

std::uint64_t file_bytes(const std::string& path) { return static_cast<std::uint64_t>(fs::file_size(path)); }

// ---------------------------------------------------------------------------------------------
// Options

struct Args {
    int rounds = 7;        // random and bits states (zstd and aes)
    int dp_rounds = 3;     // dp state: a zstd save of 243 MiB takes about two seconds
    int stall_rounds = 7;  // each round waits for a Chain<Zstd, AesGcm> save of 243 MiB
    int small_rounds = 21; // lenet: a save is mostly its fsync, a few ms
    int zstd_level = 3;
    std::string lenet_file;
    std::size_t lenet_images = 60000;
    std::int64_t dp_steps = 20;
    bool small_net = false;  // --net small
    std::string data = "/usr/share/datasets/fashion-mnist";
    std::string dir;
    std::set<std::string> parts = {"lenet", "dp", "random", "bits", "aes", "stall"};
    bool verbose = false;
    bool prime = true;
};

[[noreturn]] void usage(const char* argv0, int status) {
    std::fprintf(status ? stderr : stdout,
                 "usage: %s [--rounds N] [--dp-rounds N] [--stall-rounds N] [--small-rounds N] [--zstd-level L]\n"
                 "          [--lenet FILE] [--lenet-images N] [--dp-steps N] [--net dp|small] [--tensors T]\n"
                 "          [--data DIR] [--dir DIR]\n"
                 "          [--only lenet,dp,random,bits,aes,stall]\n"
                 "          [--verbose] [--no-prime]\n",
                 argv0);
    std::exit(status);
}

Args parse_args(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(argv[0], 2);
            return argv[++i];
        };
        if (arg == "--rounds") a.rounds = std::atoi(value().c_str());
        else if (arg == "--dp-rounds") a.dp_rounds = std::atoi(value().c_str());
        else if (arg == "--stall-rounds") a.stall_rounds = std::atoi(value().c_str());
        else if (arg == "--small-rounds") a.small_rounds = std::atoi(value().c_str());
        else if (arg == "--zstd-level") a.zstd_level = std::atoi(value().c_str());
        else if (arg == "--lenet") a.lenet_file = value();
        else if (arg == "--lenet-images") a.lenet_images = static_cast<std::size_t>(std::atoll(value().c_str()));
        else if (arg == "--dp-steps") a.dp_steps = std::atoll(value().c_str());
        else if (arg == "--net") a.small_net = value() == "small";
        else if (arg == "--tensors") random_tensors = std::atoi(value().c_str());
        else if (arg == "--data") a.data = value();
        else if (arg == "--dir") a.dir = value();
        else if (arg == "--only") {
            a.parts.clear();
            std::stringstream ss(value());
            for (std::string p; std::getline(ss, p, ',');) {
                if (p != "lenet" && p != "dp" && p != "random" && p != "bits" && p != "aes" && p != "stall")
                    usage(argv[0], 2);
                a.parts.insert(p);
            }
        } else if (arg == "--verbose") a.verbose = true;
        else if (arg == "--no-prime") a.prime = false;
        else usage(argv[0], arg == "--help" || arg == "-h" ? 0 : 2);
    }
    if (a.rounds < 1 || a.dp_rounds < 1 || a.stall_rounds < 1 || a.small_rounds < 1 || a.dp_steps < 1 || a.lenet_images < 32 ||
        random_tensors < 1 || random_tensors > 100) {
        std::fprintf(stderr, "codec_io: rounds and steps must be at least 1, --lenet-images at least 32, --tensors from 1 "
                             "to 100\n");
        std::exit(2);
    }
    return a;
}

// ---------------------------------------------------------------------------------------------
// Pairs: NoCodec against a codec, on one state

struct Contender {
    std::string name;
    std::string path;
    ckpt::SaveOptions save;
    ckpt::LoadOptions load;
};

struct Series {
    std::vector<double> base, codec;  // ms
};

struct PairResult {
    std::uint64_t payload = 0, base_size = 0, codec_size = 0;
    Series save, into, fresh, cold_into, cold_fresh;
    int rounds = 0;
    // timed operations that did their whole task, checked after each (untimed): saves whose
    // file has the size of the warm-up's, loads that filled or returned every tensor
    int saves_whole = 0, loads_full = 0;
    double cold_resident = -1;  // what was left in the page cache after a drop (checked once)
};

double mbps(std::uint64_t bytes, double ms) { return static_cast<double>(bytes) / 1e6 / (ms / 1e3); }

void print_row(const char* name, std::uint64_t bytes, const std::vector<double>& v) {
    const double m = median(v);
    std::printf("  %-26s %9.2f ms %8.0f MB/s   (min %.2f, max %.2f, n=%zu)\n", name, m, mbps(bytes, m),
                *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()), v.size());
}

/// Saves and loads `state` with `base` and `codec`, alternating; `cold` adds the cold loads.
PairResult run_pair(const std::string& label, const ckpt::ParamDict& state, const Contender& base,
                    const Contender& codec, int rounds, bool cold, const Args& args) {
    PairResult res;
    res.payload = payload_bytes(state);
    res.rounds = rounds;
    ckpt::ParamDict target = make_target(state);

    // Warm-up, untimed: both files, and the check that both loads give back what was saved.
    bool ok = true;
    for (const Contender* c : {&base, &codec}) {
        remove_file(c->path);
        ckpt::save_checkpoint(state, c->path, c->save);
        ckpt::verify_checkpoint(c->path);
        scramble(target);
        const auto report = ckpt::load_checkpoint_into(c->path, target, /*strict=*/true, c->load);
        ok = ok && report.param_not_load.empty() && same_tensors(state, target, c->name + " load_checkpoint_into");
        ok = ok && same_tensors(state, ckpt::load_checkpoint(c->path, c->load), c->name + " load_checkpoint");
    }
    if (!ok) throw std::runtime_error("verification failed");
    res.base_size = file_bytes(base.path);
    res.codec_size = file_bytes(codec.path);
    if (cold) {
        drop_cache(codec.path);
        res.cold_resident = resident_fraction(codec.path);
    }
    const std::size_t fresh_bytes = static_cast<std::size_t>(res.base_size + res.codec_size);

    auto prime_save = [&] {
        if (args.prime) touch(state);
    };
    auto prime_load = [&](const Contender& c, bool drop) {
        if (args.prime) {
            {  // fresh memory for what the load allocates: recently freed huge pages for everyone
                auto warm = ckpt::detail::allocate_aligned(fresh_bytes);
                std::memset(warm.get(), 0, fresh_bytes);
            }
            if (!drop) read_through(c.path);
            touch(target);
        }
        if (drop) drop_cache(c.path);
    };
    const std::size_t tensors = tensor_count(state);
    auto load_into = [&](const Contender& c, std::vector<double>& out, bool drop) {
        prime_load(c, drop);
        ckpt::LoadReport report;
        out.push_back(timed([&] { report = ckpt::load_checkpoint_into(c.path, target, false, c.load); }));
        res.loads_full += report.complete();
    };
    auto load_fresh = [&](const Contender& c, std::vector<double>& out, bool drop) {
        prime_load(c, drop);
        std::optional<ckpt::ParamDict> loaded;
        out.push_back(timed([&] { loaded = ckpt::load_checkpoint(c.path, c.load); }));
        res.loads_full += tensor_count(*loaded) == tensors;
        loaded.reset();  // not timed
    };

    for (int r = 0; r < rounds; ++r) {
        const bool codec_first = r % 2 == 0;
        auto pair = [&](const std::function<void(const Contender&, std::vector<double>&)>& op, Series& s) {
            if (codec_first) {
                op(codec, s.codec);
                op(base, s.base);
            } else {
                op(base, s.base);
                op(codec, s.codec);
            }
        };
        remove_file(base.path);
        remove_file(codec.path);
        pair(
            [&](const Contender& c, std::vector<double>& out) {
                prime_save();
                out.push_back(timed([&] { ckpt::save_checkpoint(state, c.path, c.save); }));
                res.saves_whole += file_bytes(c.path) == (&c == &base ? res.base_size : res.codec_size);
            },
            res.save);
        pair([&](const Contender& c, std::vector<double>& out) { load_into(c, out, false); }, res.into);
        pair([&](const Contender& c, std::vector<double>& out) { load_fresh(c, out, false); }, res.fresh);
        if (cold) {
            pair([&](const Contender& c, std::vector<double>& out) { load_into(c, out, true); }, res.cold_into);
            pair([&](const Contender& c, std::vector<double>& out) { load_fresh(c, out, true); }, res.cold_fresh);
        }
        if (args.verbose) {
            std::printf("  round %d (%s first): save %.1f/%.1f | into %.1f/%.1f | fresh %.1f/%.1f", r,
                        codec_first ? codec.name.c_str() : base.name.c_str(), res.save.base.back(),
                        res.save.codec.back(), res.into.base.back(), res.into.codec.back(), res.fresh.base.back(),
                        res.fresh.codec.back());
            if (cold)
                std::printf(" | cold into %.1f/%.1f | cold fresh %.1f/%.1f", res.cold_into.base.back(),
                            res.cold_into.codec.back(), res.cold_fresh.base.back(), res.cold_fresh.codec.back());
            std::printf(" (ms, %s/%s)\n", base.name.c_str(), codec.name.c_str());
        }
    }
    remove_file(base.path);
    remove_file(codec.path);

    std::printf("%s: files %llu bytes (%s), %llu bytes (%s): %s/%s size %.4f (compression ratio %.3f)\n",
                label.c_str(), static_cast<unsigned long long>(res.base_size), base.name.c_str(),
                static_cast<unsigned long long>(res.codec_size), codec.name.c_str(), codec.name.c_str(),
                base.name.c_str(), static_cast<double>(res.codec_size) / static_cast<double>(res.base_size),
                static_cast<double>(res.base_size) / static_cast<double>(res.codec_size));
    if (cold)
        std::printf("  after fdatasync + POSIX_FADV_DONTNEED, %.1f %% of the file's pages were still cached\n",
                    100 * res.cold_resident);
    std::printf("  medians (MB = 10^6 bytes of tensor payload, %.2f MB):\n", static_cast<double>(res.payload) / 1e6);
    auto rows = [&](const char* what, const Series& s) {
        if (s.base.empty()) return;
        print_row((std::string(what) + " " + base.name).c_str(), res.payload, s.base);
        print_row((std::string(what) + " " + codec.name).c_str(), res.payload, s.codec);
    };
    rows("save", res.save);
    rows("load_into", res.into);
    rows("load_fresh", res.fresh);
    rows("cold load_into", res.cold_into);
    rows("cold load_fresh", res.cold_fresh);
    return res;
}

double ratio(const Series& s) { return median(s.base) / median(s.codec); }

const char* verdict(double r, double floor) { return r >= floor ? "met" : "MISSED"; }

// ---------------------------------------------------------------------------------------------
// Training the states

nn::MnistDataset lenet_data(const std::string& dir, std::size_t images) {
    nn::MnistDataset ds(dir, nn::Usage::train);
    ds.take(images);
    ds.map({nn::Rescale(1.0 / 255.0, 0), nn::Resize(32, 32), nn::HWC2CHW()});
    ds.map_label(nn::TypeCast(ckpt::DType::int32));
    ds.batch(32, true);
    return ds;
}

/// The trainer's checkpoint state after one epoch of LeNet5 (deep copies: the net goes away).
ckpt::ParamDict trained_lenet(const Args& args) {
    if (!args.lenet_file.empty()) {
        std::printf("lenet: the checkpoint %s\n", args.lenet_file.c_str());
        return ckpt::load_checkpoint(args.lenet_file);
    }
    auto data = lenet_data(args.data, args.lenet_images);
    nn::LeNet5 net(10, 1, 1);
    nn::Momentum opt(net.parameters(), 0.01, 0.9);
    nn::Trainer<nn::LeNet5, nn::Momentum> trainer(net, opt);
    const auto t0 = Clock::now();
    trainer.train(1, data);
    const double s = ms_since(t0) / 1e3;
    ckpt::ParamDict state = ckpt::detail::snapshot(trainer.state_dict(data), ckpt::ObjectEncoding::boost_binary);
    state.set("trainer.epoch", std::int64_t{1});
    state.set("trainer.step", data.steps_per_epoch());
    state.set("trainer.global_step", data.steps_per_epoch());
    std::printf("lenet: LeNet5 + Momentum(0.01, 0.9) trained one epoch of %zu Fashion-MNIST images (%lld steps) in "
                "%.1f s\n",
                args.lenet_images, static_cast<long long>(data.steps_per_epoch()), s);
    return state;
}

template <class Net>
struct Trained {
    Net net;
    nn::Momentum opt{net.parameters(), 0.01, 0.9};
};

struct DpState {
    std::shared_ptr<void> owner;  // the network and optimizer the views are of
    ckpt::ParamDict views;        // parameters and Momentum state, views of the live tensors
};

template <class Net>
std::unique_ptr<DpState> trained(const Args& args, const char* name) {
    auto t = std::make_shared<Trained<Net>>();
    nn::MnistDataset data(args.data, nn::Usage::train);
    data.take(static_cast<std::size_t>(args.dp_steps) * 32).map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()}).batch(32, true);
    nn::Trainer<Net, nn::Momentum> trainer(t->net, t->opt);
    const auto t0 = Clock::now();
    trainer.train(1, data);
    const double sec = ms_since(t0) / 1e3;
    auto s = std::make_unique<DpState>();
    s->views = trainer.load_target();
    s->owner = std::move(t);
    std::printf("dp: %s + Momentum(0.01, 0.9) trained %lld steps of batch 32 in %.1f s: %zu tensors, %.1f MiB\n", name,
                static_cast<long long>(args.dp_steps), sec, tensor_count(s->views),
                static_cast<double>(payload_bytes(s->views)) / 1048576.0);
    return s;
}

std::unique_ptr<DpState> trained_dp(const Args& args) {
    return args.small_net ? trained<nn::UceNet>(args, "784-512-512-10")
                          : trained<nn::DataParallelNet>(args, "DataParallelNet");
}

/// 64 tensors of [1024, 1024] in buffers of their own: float32 filled as bench/ckpt_io does, or
/// (bits) int32 whose every bit is pseudo-random.
ckpt::ParamDict random_state(bool bits) {
    ckpt::ParamDict d;
    for (int i = 0; i < random_tensors; ++i) {
        ckpt::Tensor t = ckpt::Tensor::uninitialized(bits ? ckpt::DType::int32 : ckpt::DType::float32,
                                                     {random_rows, random_cols});
        if (bits) fill_bits(t.data(), t.nbytes(), static_cast<std::uint64_t>(i));
        else fill_random_floats(reinterpret_cast<float*>(t.data()), static_cast<std::size_t>(random_rows * random_cols),
                  static_cast<std::uint64_t>(i));
        char name[32];
        std::snprintf(name, sizeof name, "layer%02d.weight", i);
        d.set(name, std::move(t));
    }
    return d;
}

// ---------------------------------------------------------------------------------------------
// The async save's stall

struct StallResult {
    std::vector<double> memcpy_ms, none_ms, chain_ms;
    std::int64_t none_saves = 0, chain_saves = 0, none_written = 0, chain_written = 0;  // in the timed rounds
    double none_write_s = 0, chain_write_s = 0, chain_write_max_s = 0;
    double first_none_ms = 0, first_chain_ms = 0;
};

void memcpy_state(const ckpt::ParamDict& state, ckpt::ParamDict& into) {
    auto b = into.begin();
    for (auto s = state.begin(); s != state.end(); ++s, ++b)
        if (const auto* from = s->value.get_if<ckpt::Tensor>())
            if (from->nbytes()) std::memcpy(b->value.get_if<ckpt::Tensor>()->data(), from->data(), from->nbytes());
}

using ChainCodec = ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>;

StallResult run_stall(const ckpt::ParamDict& state, const std::string& dir, const ckpt::Key& key, const Args& args) {
    StallResult res;
    ckpt::ManagerOptions mo;
    mo.async_save = true;
    const fs::path none_dir = fs::path(dir) / "codec_io-stall-none", chain_dir = fs::path(dir) / "codec_io-stall-chain";
    fs::remove_all(none_dir);
    fs::remove_all(chain_dir);
    {
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> none(
            none_dir, "dp", ckpt::EverySteps{1}, ckpt::KeepLast{1}, {}, mo);
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming, ckpt::BinaryArchive, ChainCodec> chain(
            chain_dir, "dp", ckpt::EverySteps{1}, ckpt::KeepLast{1}, {}, mo,
            ChainCodec{ckpt::Zstd{args.zstd_level}, ckpt::AesGcm{key}});
        ckpt::ParamDict copy_target = ckpt::detail::snapshot(state, ckpt::ObjectEncoding::boost_binary);  // allocated like a snapshot buffer
        touch(copy_target);
        std::int64_t step = 0;
        // Warm-up: the first save of each allocates its snapshot buffer.
        res.first_none_ms = timed([&] { none.save(ckpt::Progress::at_iteration(++step), state); });
        none.wait();
        res.first_chain_ms = timed([&] { chain.save(ckpt::Progress::at_iteration(++step), state); });
        chain.wait();
        {  // the chain's file reads back
            const auto files = chain.run_checkpoints();
            if (files.empty()) throw std::runtime_error("the chained async save left no file");
            ckpt::LoadOptions lo;
            lo.key = key;
            if (!same_tensors(state, ckpt::load_checkpoint(files.back().path, lo), "async Chain<Zstd, AesGcm> save"))
                throw std::runtime_error("verification failed");
        }
        const auto none0 = none.async_stats(), chain0 = chain.async_stats();
        const std::array<std::function<void()>, 3> ops = {
            [&] { res.memcpy_ms.push_back(timed([&] { memcpy_state(state, copy_target); })); },
            [&] {
                res.none_ms.push_back(timed([&] { none.save(ckpt::Progress::at_iteration(++step), state); }));
                none.wait();
            },
            [&] {
                res.chain_ms.push_back(timed([&] { chain.save(ckpt::Progress::at_iteration(++step), state); }));
                chain.wait();
            },
        };
        for (int r = 0; r < args.stall_rounds; ++r) {
            for (std::size_t k = 0; k < ops.size(); ++k) {
                if (args.prime) touch(state);
                ops[(k + static_cast<std::size_t>(r)) % ops.size()]();
            }
            if (args.verbose)
                std::printf("  round %d: memcpy %.1f, save NoCodec %.1f, save Chain<Zstd,AesGcm> %.1f (ms)\n", r,
                            res.memcpy_ms.back(), res.none_ms.back(), res.chain_ms.back());
        }
        const auto none1 = none.async_stats(), chain1 = chain.async_stats();
        res.none_saves = none1.saves - none0.saves;
        res.chain_saves = chain1.saves - chain0.saves;
        res.none_written = none1.written - none0.written;
        res.chain_written = chain1.written - chain0.written;
        res.none_write_s = (none1.write_seconds - none0.write_seconds) / static_cast<double>(none1.written - none0.written);
        res.chain_write_s =
            (chain1.write_seconds - chain0.write_seconds) / static_cast<double>(chain1.written - chain0.written);
        res.chain_write_max_s = chain1.max_write_seconds;
    }
    fs::remove_all(none_dir);
    fs::remove_all(chain_dir);
    return res;
}

// ---------------------------------------------------------------------------------------------

int run(const Args& args, const std::string& dir) {
    print_machine(dir);
    std::printf("codecs: Zstd{%d} (zstd %s, 1 MiB blocks, one thread), AesGcm{random key} (%s, 1 MiB segments, "
                "two threads), Chain<Zstd, AesGcm>\n",
                args.zstd_level, ZSTD_versionString(), OpenSSL_version(OPENSSL_VERSION));
    std::printf("note: warm loads read files just written, from the page cache; cold loads drop the file's pages "
                "first; saves end with fsync, rename and a directory fsync\n");
    std::printf("note: %s\n", args.prime ? "memory primed the same way before every timed operation (see --no-prime)"
                                          : "no priming (--no-prime): times depend on what ran before");
    const auto path = [&](const char* name) { return (fs::path(dir) / name).string(); };
    const ckpt::Key key = ckpt::Key::random();
    ckpt::LoadOptions with_key;
    with_key.key = key;
    auto contender = [&](const std::string& name, const char* file, ckpt::CodecChain codecs, ckpt::LoadOptions lo) {
        ckpt::SaveOptions so;
        so.codecs = std::move(codecs);
        return Contender{name, path(file), so, lo};
    };
    const Contender none = contender("NoCodec", "codec_io-none.ckpt", {}, {});
    const Contender zstd = contender("Zstd", "codec_io-zstd.ckpt", ckpt::Zstd{args.zstd_level}.codecs(), {});
    const Contender aes = contender("AesGcm", "codec_io-aes.ckpt", ckpt::AesGcm{key}.codecs(), with_key);
    auto has = [&](const char* p) { return args.parts.count(p) != 0; };

    std::optional<PairResult> lenet, dp, random_z, bits, random_a;
    std::optional<StallResult> stall;
    std::unique_ptr<DpState> dp_state;
    if (has("dp") || has("stall")) dp_state = trained_dp(args);

    if (has("lenet")) {
        const ckpt::ParamDict state = trained_lenet(args);
        std::printf("\n== zstd on the LeNet5 checkpoint state: %zu tensors, %llu bytes of payload; %d rounds\n",
                    tensor_count(state), static_cast<unsigned long long>(payload_bytes(state)), args.small_rounds);
        lenet = run_pair("lenet", state, none, zstd, args.small_rounds, false, args);
    }
    if (has("dp")) {
        std::printf("\n== zstd on the data-parallel state; %d rounds\n", args.dp_rounds);
        dp = run_pair("dp", dp_state->views, none, zstd, args.dp_rounds, false, args);
    }
    std::optional<ckpt::ParamDict> rnd;
    if (has("random") || has("aes")) rnd = random_state(false);
    if (has("random")) {
        std::printf("\n== zstd on the random %d MiB state of bench/ckpt_io (float32 uniform in [-1, 1)); %d rounds\n",
                    4 * random_tensors, args.rounds);
        random_z = run_pair("random", *rnd, none, zstd, args.rounds, false, args);
    }
    if (has("bits")) {
        const ckpt::ParamDict bits_state = random_state(true);
        std::printf("\n== zstd on %d MiB of random bits (%d int32 tensors of [1024, 1024]); %d rounds\n",
                    4 * random_tensors, random_tensors, args.rounds);
        bits = run_pair("bits", bits_state, none, zstd, args.rounds, false, args);
    }
    if (has("aes")) {
        std::printf("\n== AES-256-GCM on the random %d MiB state; %d rounds, loads warm and cold\n", 4 * random_tensors,
                    args.rounds);
        random_a = run_pair("aes", *rnd, none, aes, args.rounds, true, args);
    }
    rnd.reset();
    if (has("stall")) {
        std::printf("\n== async save stall, Chain<Zstd{%d}, AesGcm> on the data-parallel state (%.1f MiB); %d rounds\n",
                    args.zstd_level, static_cast<double>(payload_bytes(dp_state->views)) / 1048576.0, args.stall_rounds);
        stall = run_stall(dp_state->views, dir, key, args);
        const std::uint64_t bytes = payload_bytes(dp_state->views);
        std::printf("  medians (training-thread time; the writer idle when each began):\n");
        print_row("memcpy of the state", bytes, stall->memcpy_ms);
        print_row("async save NoCodec", bytes, stall->none_ms);
        print_row("async save Chain", bytes, stall->chain_ms);
        std::printf("  first save (allocating the snapshot buffer, not counted): NoCodec %.0f ms, Chain %.0f ms\n",
                    stall->first_none_ms, stall->first_chain_ms);
        std::printf("  writer thread per save: NoCodec %.0f ms, Chain<Zstd, AesGcm> %.0f ms (longest %.0f ms)\n",
                    1e3 * stall->none_write_s, 1e3 * stall->chain_write_s, 1e3 * stall->chain_write_max_s);
    }

    std::printf("\nload: 1-minute load average %s at end\n", loadavg().c_str());
    std::printf("ratios (NoCodec time / codec time, >= 1 means the codec is at least as fast):\n");
    auto size_of = [](const std::optional<PairResult>& p) {
        return p ? static_cast<double>(p->codec_size) / static_cast<double>(p->base_size) : 0.0;
    };
    std::string zstd_mbps;
    auto zstd_line = [&](const char* name, const std::optional<PairResult>& p) {
        if (!p) return;
        std::printf("  zstd %-7s size %.4f  save %.3f  load_into %.3f  load_fresh %.3f\n", name, size_of(p), ratio(p->save),
                    ratio(p->into), ratio(p->fresh));
        char buf[160];
        std::snprintf(buf, sizeof buf, " %s_save=%.0f %s_load=%.0f", name, mbps(p->payload, median(p->save.codec)), name,
                      mbps(p->payload, median(p->into.codec)));
        zstd_mbps += buf;
    };
    zstd_line("lenet", lenet);
    zstd_line("dp", dp);
    zstd_line("random", random_z);
    zstd_line("bits", bits);
    if (random_z)
        std::printf("  zstd random save/none  %.3f  floor >= 0.95  %s\n", ratio(random_z->save),
                    verdict(ratio(random_z->save), 0.95));
    if (bits)
        std::printf("  zstd bits save/none    %.3f  floor >= 0.95  %s\n", ratio(bits->save), verdict(ratio(bits->save), 0.95));
    if (random_a) {
        const auto& a = *random_a;
        std::printf("  aes save               %.3f  floor >= 0.80  %s\n", ratio(a.save), verdict(ratio(a.save), 0.8));
        std::printf("  aes load_into warm     %.3f  floor >= 0.80  %s\n", ratio(a.into), verdict(ratio(a.into), 0.8));
        std::printf("  aes load_fresh warm    %.3f  floor >= 0.80  %s\n", ratio(a.fresh), verdict(ratio(a.fresh), 0.8));
        std::printf("  aes load_into cold     %.3f  floor >= 0.80  %s\n", ratio(a.cold_into),
                    verdict(ratio(a.cold_into), 0.8));
        std::printf("  aes load_fresh cold    %.3f  floor >= 0.80  %s\n", ratio(a.cold_fresh),
                    verdict(ratio(a.cold_fresh), 0.8));
    }
    double stall_ratio = 0;
    if (stall) {
        stall_ratio = median(stall->chain_ms) / median(stall->memcpy_ms);
        std::printf("  async stall Chain/memcpy %.3f  target <= 1.20  %s   (NoCodec/memcpy %.3f)\n", stall_ratio,
                    stall_ratio <= 1.2 ? "met" : "MISSED", median(stall->none_ms) / median(stall->memcpy_ms));
    }
    if (!zstd_mbps.empty()) std::printf("codec_io zstd MB/s:%s\n", zstd_mbps.c_str());
    std::printf("codec_io zstd_size lenet=%.3f dp=%.3f random=%.3f bits=%.3f zstd_save/none random=%.2f bits=%.2f "
                "aes save=%.2f load_into=%.2f load_fresh=%.2f cold_into=%.2f cold_fresh=%.2f stall/memcpy=%.2f\n",
                size_of(lenet), size_of(dp), size_of(random_z), size_of(bits), random_z ? ratio(random_z->save) : 0.0,
                bits ? ratio(bits->save) : 0.0,
                random_a ? ratio(random_a->save) : 0.0, random_a ? ratio(random_a->into) : 0.0,
                random_a ? ratio(random_a->fresh) : 0.0, random_a ? ratio(random_a->cold_into) : 0.0,
                random_a ? ratio(random_a->cold_fresh) : 0.0, stall_ratio);

    Checks check;
    auto pair_checks = [&](const char* name, const std::optional<PairResult>& p, bool cold) {
        if (!p) return;
        const std::string n = name;
        const long long rounds = p->rounds, loads = (cold ? 8 : 4) * rounds;  // two contenders, two or four loads
        check.count(n + ": saves timed that wrote a file of the warm-up's size", 2 * rounds, p->saves_whole);
        check.count(n + ": loads timed that filled or returned every tensor", loads, p->loads_full);
        const double bytes = static_cast<double>(p->payload);
        auto rate = [&](const char* what, const Series& s) {
            if (s.base.empty() && s.codec.empty()) return;
            check.rate(n + ": " + what + " without a codec (median)", bytes, median(s.base) / 1e3);
            check.rate(n + ": " + what + " with the codec (median)", bytes, median(s.codec) / 1e3);
        };
        rate("save", p->save);
        rate("load_into", p->into);
        rate("load_fresh", p->fresh);
        rate("cold load_into", p->cold_into);
        rate("cold load_fresh", p->cold_fresh);
    };
    pair_checks("zstd lenet", lenet, false);
    pair_checks("zstd dp", dp, false);
    pair_checks("zstd random", random_z, false);
    pair_checks("zstd bits", bits, false);
    pair_checks("aes", random_a, true);
    if (stall) {
        const long long rounds = args.stall_rounds;
        const double bytes = static_cast<double>(payload_bytes(dp_state->views));
        check.count("stall: memcpy baselines timed", rounds, static_cast<long long>(stall->memcpy_ms.size()));
        check.count("stall: async saves without a codec handed to the writer", rounds, stall->none_saves);
        check.count("stall: async saves with Chain<Zstd, AesGcm> handed to the writer", rounds, stall->chain_saves);
        check.count("stall: async saves without a codec written", rounds, stall->none_written);
        check.count("stall: async saves with Chain<Zstd, AesGcm> written", rounds, stall->chain_written);
        check.rate("stall: memcpy of the state (median)", bytes, median(stall->memcpy_ms) / 1e3);
        check.rate("stall: async save without a codec, which copies the state (median)", bytes,
                   median(stall->none_ms) / 1e3);
        check.rate("stall: async save with Chain<Zstd, AesGcm>, which copies the state (median)", bytes,
                   median(stall->chain_ms) / 1e3);
    }
    return check.status();
}

}  // namespace

int main(int argc, char** argv) {
    if (!std::getenv("OPENBLAS_NUM_THREADS")) {  // idle OpenBLAS threads would spin on the second core
        ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
        ::execv("/proc/self/exe", argv);
        std::perror("re-running with OPENBLAS_NUM_THREADS=1");
        return 2;
    }
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const Args args = parse_args(argc, argv);
    nn::set_blas_threads(1);
    return run_in_directory(args.dir, {"codec_io-none.ckpt", "codec_io-zstd.ckpt", "codec_io-aes.ckpt"},
                            [&](const std::string& dir) {
                                try {
                                    return run(args, dir);
                                } catch (const std::runtime_error& e) {
                                    if (std::string(e.what()) == "verification failed") return 1;
                                    throw;
                                }
                            });
}
