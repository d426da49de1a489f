// ckpt::TorchState against libtorch's own serialization, on a model of about 256 MiB of
// parameters with Adam's state (768 MiB in all), warm page cache, alternating in one process
// (the order flips every round), in DIR and in /dev/shm (memory: the cost of each besides
// the disk):
//   save: save_checkpoint(state.state_dict()) (atomic, fsynced) / torch::save(module) +
//         torch::save(optimizer), as it is and followed by fsync; the limit is a plain
//         write+fsync of the same bytes; each into a new file after a sync()
//   load: load_checkpoint_into(file, state) (into the module's and optimizer's tensors) /
//         torch::load(module) + torch::load(optimizer); the limit is a plain read into them
// Then asynchronous saves while a smaller model trains: the slowdown of training, and the
// training thread's longest stall against a memcpy of the state.
//   torch_io [DIR] [--rounds N] [--width W] [--train-width V]
// (default: the current directory, 5 rounds, layers of 4096 and 1024). --width and
// --train-width make the models' layers W x W and V x V (a quick run: its figures mean
// nothing, its checks apply). Exit status 1 if the run did not time what it planned: every
// round's saves, each leaving its files, and loads; an async save every 10 steps of every
// run with saves, each written, and a memcpy at the same steps of every run without; none
// of it faster than memory.

#include <ckpt/types/torch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>

#include <functional>
#include <map>

#include "bench_support.hpp"

namespace {

using bench::timed;

torch::nn::Sequential make_model(std::int64_t width, int layers) {
    torch::nn::Sequential m;
    for (int i = 0; i < layers; ++i) m->push_back(torch::nn::Linear(width, width));
    return m;
}

// One optimizer step with made-up gradients: Adam creates its state.
void fake_step(torch::nn::Sequential& m, torch::optim::Optimizer& opt) {
    for (auto& p : m->parameters()) p.mutable_grad() = torch::full_like(p, 1e-3);
    opt.step();
}

void fsync_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0) bench::die("fsync " + path);
    ::close(fd);
}

std::vector<at::Tensor> state_tensors(torch::nn::Sequential& m, torch::optim::Optimizer& opt) {
    std::vector<at::Tensor> out;
    for (const auto& p : m->parameters()) out.push_back(p);
    for (auto& [key, s] : opt.state()) {
        auto& a = static_cast<torch::optim::AdamParamState&>(*s);
        out.push_back(a.exp_avg());
        out.push_back(a.exp_avg_sq());
    }
    return out;
}

// Every tensor's bytes in turn through `io` (::read or ::write), whole.
template <class Io>
void each_tensor(int fd, const std::vector<at::Tensor>& ts, Io io, const std::string& what) {
    for (const auto& t : ts) {
        auto* p = static_cast<char*>(t.data_ptr());
        std::size_t left = t.numel() * t.element_size();
        while (left) {
            const ssize_t n = io(fd, p, left);
            if (n <= 0) bench::die(what);
            p += n;
            left -= static_cast<std::size_t>(n);
        }
    }
}

void plain_write(const std::string& path, const std::vector<at::Tensor>& ts) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) bench::die("open " + path);
    each_tensor(fd, ts, ::write, "write " + path);
    if (::fsync(fd) != 0) bench::die("fsync " + path);
    ::close(fd);
}

void plain_read(const std::string& path, const std::vector<at::Tensor>& ts) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) bench::die("open " + path);
    each_tensor(fd, ts, ::read, "read " + path);
    ::close(fd);
}

struct Model {
    torch::nn::Sequential net;  // 4 x (4096 x 4096 + 4096) floats by default: 256 MiB
    torch::optim::Adam opt;
    explicit Model(std::int64_t width) : net(make_model(width, 4)), opt(net->parameters(), torch::optim::AdamOptions(1e-3)) {
        fake_step(net, opt);
    }
};

std::int64_t file_size(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<std::int64_t>(st.st_size) : -1;
}

void io(Model& m, const std::string& dir, int rounds, bench::Checks& check) {
    ckpt::TorchState state(m.net, m.opt);
    const auto tensors = state_tensors(m.net, m.opt);
    double bytes = 0;
    for (const auto& t : tensors) bytes += static_cast<double>(t.numel() * t.element_size());
    std::printf("\n%s (%s): %.0f MiB of parameters, %.0f MiB with Adam's state, %d rounds\n", dir.c_str(),
                bench::fs_type_name(dir).c_str(), bytes / 3 / (1 << 20), bytes / (1 << 20), rounds);

    const std::string ck = dir + "/torch_io.ckpt", tm = dir + "/torch_io_module.pt", to = dir + "/torch_io_optim.pt",
                      raw = dir + "/torch_io.raw";
    // Each save starts from the same clean state: its earlier file gone and nothing dirty
    // left to write back (otherwise one save's fsync pays for the writes before it).
    auto clean = [&](std::initializer_list<std::string> files) {
        for (const auto& f : files) bench::remove_file(f);
        ::sync();
    };
    auto torch_save = [&] {
        torch::save(m.net, tm);
        torch::save(m.opt, to);
    };
    std::map<std::string, std::vector<double>> ms;
    // what each timed save left, checked after it (untimed): its files, of the state's size
    // for ckpt and the plain write; loads fail loudly when they cannot fill every tensor
    std::map<std::string, int> left;
    const auto whole = [&](const std::string& f) { return file_size(f) >= static_cast<std::int64_t>(bytes); };
    const std::map<std::string, std::function<bool()>> wrote = {
        {"ckpt save", [&] { return whole(ck); }},
        {"torch::save", [&] { return file_size(tm) > 0 && file_size(to) > 0; }},
        {"torch::save+fsync", [&] { return file_size(tm) > 0 && file_size(to) > 0; }},
        {"write+fsync", [&] { return whole(raw); }},
    };
    std::vector<std::pair<std::string, std::function<void()>>> saves = {
        {"ckpt save", [&] { ckpt::save_checkpoint(state.state_dict(), ck); }},
        {"torch::save", torch_save},
        {"torch::save+fsync", [&] { torch_save(), fsync_file(tm), fsync_file(to); }},
        {"write+fsync", [&] { plain_write(raw, tensors); }},
    };
    std::vector<std::pair<std::string, std::function<void()>>> loads = {
        {"ckpt load", [&] { ckpt::load_checkpoint_into(ck, state, true); }},
        {"torch::load", [&] { torch::load(m.net, tm), torch::load(m.opt, to); }},
        {"read", [&] { plain_read(raw, tensors); }},
    };
    for (int r = 0; r < rounds; ++r) {  // the order flips every round
        if (r % 2) std::reverse(saves.begin(), saves.end()), std::reverse(loads.begin(), loads.end());
        for (auto& [name, f] : saves) {
            clean({ck, tm, to, raw});
            ms[name].push_back(timed(f));
            left[name] += wrote.at(name)();
        }
        // every file again, untimed, so that each load reads a file just written
        ckpt::save_checkpoint(state.state_dict(), ck);
        torch_save();
        plain_write(raw, tensors);
        for (auto& [name, f] : loads) ms[name].push_back(timed(f));
    }
    auto med = [&](const std::string& name) { return bench::median(ms[name]); };
    auto line = [&](const std::string& name) {
        const double t = med(name);
        std::printf("  %-18s %7.0f ms  %6.0f MiB/s\n", name.c_str(), t, bytes / (1 << 20) / (t / 1e3));
    };
    for (const auto& n : {"ckpt save", "torch::save", "torch::save+fsync", "write+fsync", "ckpt load", "torch::load", "read"})
        line(n);
    std::printf("  save: ckpt / torch::save %.2fx, / torch::save+fsync %.2fx, / write+fsync %.2fx\n",
                med("torch::save") / med("ckpt save"), med("torch::save+fsync") / med("ckpt save"),
                med("write+fsync") / med("ckpt save"));
    std::printf("  load: ckpt / torch::load %.2fx, / read %.2fx\n", med("torch::load") / med("ckpt load"),
                med("read") / med("ckpt load"));
    for (const auto& f : {ck, tm, to, raw}) bench::remove_file(f);
    for (const auto& [name, f] : saves) {
        check.count(dir + ": " + name + " saves that left their files", rounds, left[name]);
        check.rate(dir + ": " + name + " (median)", bytes, med(name) / 1e3);
    }
    for (const auto& [name, f] : loads) {
        check.count(dir + ": " + name + " loads timed", rounds, static_cast<long long>(ms[name].size()));
        check.rate(dir + ": " + name + " (median)", bytes, med(name) / 1e3);
    }
}

struct TrainRun {
    double seconds = 0;            // the training loop, without the baseline copies
    ckpt::AsyncSaveStats stats;    // with saves
    std::vector<double> copy_ms;   // without saves: a memcpy of the state where a save would be
};

// Training steps of a smaller model on fixed data. With `save`, an asynchronous save every
// `every` steps; without, a memcpy of the same state into a buffer at those steps instead,
// timed: what the training thread's part of a save is measured against, in the same state
// of the caches.
TrainRun train(const std::string& dir, int steps, int every, bool save, std::int64_t width) {
    torch::manual_seed(2);
    auto model = make_model(width, 4);
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-4));
    const auto x = torch::randn({256, width});
    ckpt::TorchState state(model, opt);
    ckpt::ManagerOptions mo;
    mo.async_save = true;
    ckpt::CheckpointManager<ckpt::EverySteps> mgr(dir, "torch_io_async", ckpt::EverySteps{every}, ckpt::KeepLast{2},
                                                  ckpt::MindSporeNaming{}, mo);
    TrainRun run;
    std::vector<char> copy;
    double copying = 0;
    const auto t0 = bench::Clock::now();
    for (int s = 1; s <= steps; ++s) {
        opt.zero_grad();
        model->forward(x).square().mean().backward();
        opt.step();
        if (save) {
            mgr.on_step(ckpt::Progress::at_iteration(s), state);
        } else if (s % every == 0) {
            const auto tensors = state_tensors(model, opt);
            std::size_t bytes = 0;
            for (const auto& t : tensors) bytes += t.numel() * t.element_size();
            if (copy.size() != bytes) copy.assign(bytes, 1);  // allocated and touched untimed
            const double ms = timed([&] {
                std::size_t at = 0;
                for (const auto& t : tensors) {
                    const std::size_t n = t.numel() * t.element_size();
                    std::memcpy(copy.data() + at, t.data_ptr(), n);
                    at += n;
                }
            });
            run.copy_ms.push_back(ms);
            copying += ms;
        }
    }
    mgr.wait();
    run.seconds = (bench::ms_since(t0) - copying) / 1e3;
    run.stats = mgr.async_stats();
    return run;
}

void async_training(const std::string& dir, int rounds, std::int64_t width, bench::Checks& check) {
    const int steps = 60, every = 10;
    std::vector<double> plain, saving, stall, first_stall, copy;
    ckpt::AsyncSaveStats last;
    int saves_whole = 0, copies_whole = 0;  // runs with every save handed over and written, every copy timed
    for (int r = 0; r < rounds; ++r) {  // the order flips every round
        std::vector<TrainRun> runs;
        if (r % 2 == 0) runs.push_back(train(dir, steps, every, false, width));
        const TrainRun with = train(dir, steps, every, true, width);
        if (r % 2 == 1) runs.push_back(train(dir, steps, every, false, width));
        saves_whole += with.stats.saves == steps / every && with.stats.written == with.stats.saves;
        copies_whole += runs.front().copy_ms.size() == static_cast<std::size_t>(steps / every);
        plain.push_back(runs.front().seconds);
        copy.push_back(bench::median(runs.front().copy_ms));
        saving.push_back(with.seconds);
        // the longest is the first, which also allocates the snapshot buffer: the others' mean
        const auto& st = with.stats;
        stall.push_back((st.blocked_seconds - st.max_blocked_seconds) * 1e3 /
                        static_cast<double>(std::max<std::int64_t>(st.saves - 1, 1)));
        first_stall.push_back(st.max_blocked_seconds * 1e3);
        last = st;
    }
    const double p = bench::median(plain), s = bench::median(saving), st = bench::median(stall),
                 fst = bench::median(first_stall), c = bench::median(copy);
    const double state_bytes = 3.0 * 4 * static_cast<double>(width * width + width) * sizeof(float);  // with Adam's
    std::printf("\nasync saves while training (%d steps, a save every %d, %.0f MiB of state, median of %d):\n", steps,
                every, state_bytes / (1 << 20), rounds);
    std::printf("  training %.2f s without saves, %.2f s with: slowdown %.1f%%\n", p, s, (s / p - 1) * 100);
    std::printf("  training-thread stall per save after the first %.1f ms; a memcpy of the state at the same steps\n"
                "  %.1f ms: %.2fx (the first save, which also allocates the snapshot buffer: %.1f ms, %.2fx)\n",
                st, c, st / c, fst, fst / c);
    std::printf("  (last round: %lld saves, %lld waited for a buffer, writer %.0f ms each at most)\n",
                static_cast<long long>(last.saves), static_cast<long long>(last.waited), last.max_write_seconds * 1e3);
    check.count("training runs with a save every 10 steps, each written", rounds, saves_whole);
    check.count("training runs without saves with a memcpy every 10 steps", rounds, copies_whole);
    check.rate("training-thread stall per save after the first (median), which copies the state", state_bytes, st / 1e3);
    check.rate("memcpy of the state (median)", state_bytes, c / 1e3);
    check.positive("training without saves (median)", p);
}

}  // namespace

int main(int argc, char** argv) {
    std::string dir = ".";
    int rounds = 5;
    std::int64_t width = 4096, train_width = 1024;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
        else if (a == "--width" && i + 1 < argc) width = std::max(16LL, std::atoll(argv[++i]));
        else if (a == "--train-width" && i + 1 < argc) train_width = std::max(16LL, std::atoll(argv[++i]));
        else dir = a;
    }
    torch::set_num_threads(1);
    bench::print_machine(dir);
    bench::Checks check;
    {
        Model m(width);
        io(m, dir, rounds, check);
        io(m, "/dev/shm", rounds, check);  // memory: what each costs besides the disk
    }
    async_training(dir, rounds, train_width, check);
    return check.status();
}
