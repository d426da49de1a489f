// ckpt-run: starts the workers of a job on this host, restarts those that fail, forwards
// signals, and exits with the job's status (like the seed's msrun, or torchrun). --help
// prints the options.
//
//   ckpt-run --nproc N --store URL [--first-rank F] [--world-size W] [--max-restarts K]
//            [--elastic] [--grace SECONDS] -- PROGRAM ARGS...
//
// Worker i is started with RANK = F + i, WORLD_SIZE = W (default N: every worker on this
// host), CKPT_STORE = URL, the seed's aliases MS_NODE_ID and MS_WORKER_NUM, LOCAL_RANK = i,
// and CKPT_RESTARTS = how many times it was restarted. A worker that exits with a non-zero
// status or is killed is started again with the same settings, up to K times (default 0);
// past that, the others get SIGTERM (SIGKILL after the grace period, default 30 s) and
// ckpt-run exits with the failed worker's status (128 + signal for a signal); with --elastic
// (a job whose world size may change) that worker is left out and the others go on. SIGTERM,
// SIGINT and SIGUSR1 sent to ckpt-run are forwarded to every worker; then it waits for them
// (SIGKILL after the grace period) and exits with 128 + the signal. Exit 0 when every
// worker exited 0 (with --elastic: every worker not left out, and at least one); 2 for bad
// arguments.

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

volatile sig_atomic_t forwarded_signal = 0;
void on_signal(int sig) { forwarded_signal = sig; }

struct Worker {
    int local = 0;
    pid_t pid = -1;
    int restarts = 0;
    bool done = false;
    bool left_out = false;  // --elastic: failed with no restarts left
};

pid_t start(const Worker& w, int first_rank, int world, const std::string& store, char** argv) {
    std::vector<std::string> vars{"RANK=" + std::to_string(first_rank + w.local), "WORLD_SIZE=" + std::to_string(world),
                                  "MS_NODE_ID=" + std::to_string(first_rank + w.local), "MS_WORKER_NUM=" + std::to_string(world),
                                  "LOCAL_RANK=" + std::to_string(w.local), "CKPT_STORE=" + store,
                                  "CKPT_RESTARTS=" + std::to_string(w.restarts)};
    // The forwarded signals are blocked across the fork: one that reached the child before it
    // reset their handlers would run ours there and be lost (a worker stopped as it started
    // would then live on until SIGKILL). The child resets them, then unblocks: a signal sent
    // meanwhile is delivered then, with its default action.
    sigset_t forwarded, before;
    sigemptyset(&forwarded);
    for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaddset(&forwarded, sig);
    ::sigprocmask(SIG_BLOCK, &forwarded, &before);
    const pid_t pid = ::fork();
    if (pid != 0) ::sigprocmask(SIG_SETMASK, &before, nullptr);
    if (pid < 0) {
        std::perror("ckpt-run: fork");
        return -1;
    }
    if (pid == 0) {
        for (const auto& v : vars) ::putenv(const_cast<char*>(v.c_str()));
        ::signal(SIGTERM, SIG_DFL);
        ::signal(SIGINT, SIG_DFL);
        ::signal(SIGUSR1, SIG_DFL);
        ::sigprocmask(SIG_SETMASK, &before, nullptr);
        ::execvp(argv[0], argv);
        std::fprintf(stderr, "ckpt-run: cannot run %s: %s\n", argv[0], std::strerror(errno));
        ::_exit(127);
    }
    return pid;
}

int status_of(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

std::string describe(int st) {
    return WIFEXITED(st) ? "exited with status " + std::to_string(WEXITSTATUS(st))
                         : "was killed by signal " + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) + ")";
}

// Sends `sig` to the running workers and waits for them; SIGKILL after `grace`.
void stop_all(std::vector<Worker>& workers, int sig, std::chrono::seconds grace) {
    for (auto& w : workers)
        if (!w.done) ::kill(w.pid, sig);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    bool killed = false;
    for (;;) {
        bool running = false;
        for (auto& w : workers) {
            if (w.done) continue;
            int st = 0;
            if (::waitpid(w.pid, &st, WNOHANG) == w.pid) w.done = true;
            else running = true;
        }
        if (!running) return;
        if (!killed && std::chrono::steady_clock::now() >= deadline) {
            std::fprintf(stderr, "ckpt-run: workers still running %lld s after signal %d: SIGKILL\n",
                         static_cast<long long>(grace.count()), sig);
            for (auto& w : workers)
                if (!w.done) ::kill(w.pid, SIGKILL);
            killed = true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

/// CLI11's own usage line says only "ckpt-run [OPTIONS]": this one shows where the program goes.
struct Usage : CLI::Formatter {
    std::string make_usage(const CLI::App*, std::string) const override {
        return "Usage: ckpt-run --nproc N --store URL [options] -- PROGRAM ARGS...\n";
    }
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"ckpt-run: starts the workers of a job on this host, restarts those that fail, forwards SIGTERM, "
                 "SIGINT and SIGUSR1, and exits with the job's status (0 when every worker exited 0, 2 for bad "
                 "arguments).\nEach worker gets RANK, WORLD_SIZE, CKPT_STORE, MS_NODE_ID, MS_WORKER_NUM, LOCAL_RANK "
                 "and CKPT_RESTARTS.",
                 "ckpt-run"};
    int nproc = 0, first_rank = 0, world = -1, max_restarts = 0, grace = 30;
    bool elastic = false;
    std::string store;
    app.add_option("--nproc", nproc, "Workers to start on this host")->required()->check(CLI::Range(1, 1000000));
    app.add_option("--store", store, "Where the workers meet: file:///dir or redis://host:port")->required();
    app.add_option("--first-rank", first_rank, "Rank of this host's first worker")->check(CLI::Range(0, 1000000));
    app.add_option("--world-size", world, "Workers in the whole job (default: --nproc)")->check(CLI::Range(1, 1000000));
    app.add_option("--max-restarts", max_restarts, "Times a failed worker is started again")->check(CLI::Range(0, 1000000));
    app.add_flag("--elastic", elastic,
                 "The job's world size may change: a worker that fails with no restarts left is left out and the "
                 "others go on (the workers must be elastic too, e.g. cluster_recover --elastic)");
    app.add_option("--grace", grace, "Seconds between SIGTERM and SIGKILL when stopping workers")->check(CLI::Range(0, 1000000));
    app.formatter(std::make_shared<Usage>());
    app.prefix_command();  // PROGRAM and its arguments pass through untouched
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);
        std::fprintf(stderr, "ckpt-run: %s\nRun 'ckpt-run --help' for usage.\n", e.what());
        return 2;
    }
    std::vector<std::string> rest = app.remaining();
    if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
    if (rest.empty()) {
        std::fprintf(stderr, "ckpt-run: no program given after --\nRun 'ckpt-run --help' for usage.\n");
        return 2;
    }
    // A store the workers could never open is named now, not by every worker as it starts.
    if (store.rfind("file://", 0) == 0) {
        std::string dir = store.substr(7);
        while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
        if (dir.empty() || dir.front() != '/') {
            std::fprintf(stderr, "ckpt-run: --store %s: a file store needs an absolute path (file:///dir)\n", store.c_str());
            return 2;
        }
        const std::string parent = dir.substr(0, std::max<std::size_t>(dir.rfind('/'), 1));
        struct stat st {};
        if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
            std::fprintf(stderr, "ckpt-run: --store %s: the directory '%s' that would hold it does not exist\n",
                         store.c_str(), parent.c_str());
            return 2;
        }
    } else if (store.rfind("redis://", 0) != 0) {
        std::fprintf(stderr, "ckpt-run: --store %s: expected file:///dir or redis://host:port\n", store.c_str());
        return 2;
    }
    if (world < 0) world = nproc;
    if (first_rank + nproc > world) {
        std::fprintf(stderr, "ckpt-run: ranks %d..%d do not fit a world of %d\n", first_rank, first_rank + nproc - 1, world);
        return 2;
    }
    std::vector<char*> program;
    for (auto& a : rest) program.push_back(a.data());
    program.push_back(nullptr);

    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGTERM, SIGINT, SIGUSR1}) ::sigaction(sig, &sa, nullptr);

    std::vector<Worker> workers(static_cast<std::size_t>(nproc));
    for (int w = 0; w < nproc; ++w) {
        workers[static_cast<std::size_t>(w)].local = w;
        workers[static_cast<std::size_t>(w)].pid =
            start(workers[static_cast<std::size_t>(w)], first_rank, world, store, program.data());
        if (workers[static_cast<std::size_t>(w)].pid < 0) {
            stop_all(workers, SIGTERM, std::chrono::seconds(grace));
            return 1;
        }
    }
    for (;;) {
        if (forwarded_signal) {
            const int sig = forwarded_signal;
            std::fprintf(stderr, "ckpt-run: signal %d: forwarding it to the workers\n", sig);
            stop_all(workers, sig, std::chrono::seconds(grace));
            return 128 + sig;
        }
        int st = 0;
        const pid_t pid = ::waitpid(-1, &st, WNOHANG);
        if (pid <= 0) {
            bool running = false, finished = false;
            for (const auto& w : workers) {
                running |= !w.done;
                finished |= w.done && !w.left_out;
            }
            if (!running) {
                if (finished) return 0;
                std::fprintf(stderr, "ckpt-run: every worker was left out\n");
                return 1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
        }
        for (auto& w : workers) {
            if (w.pid != pid || w.done) continue;
            const int rank = first_rank + w.local;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
                w.done = true;
                break;
            }
            if (w.restarts < max_restarts) {
                ++w.restarts;
                std::fprintf(stderr, "ckpt-run: rank %d (pid %d) %s; starting it again (restart %d of %d)\n", rank,
                             static_cast<int>(pid), describe(st).c_str(), w.restarts, max_restarts);
                w.pid = start(w, first_rank, world, store, program.data());
                if (w.pid >= 0) break;
            }
            w.done = true;
            if (elastic) {
                std::fprintf(stderr, "ckpt-run: rank %d (pid %d) %s; no restarts left: the job goes on without it\n",
                             rank, static_cast<int>(pid), describe(st).c_str());
                w.left_out = true;
                break;
            }
            std::fprintf(stderr,
                         "ckpt-run: rank %d (pid %d) %s; no restarts left: stopping the job (SIGTERM to the others, "
                         "which have %d s to save their last words before SIGKILL)\n",
                         rank, static_cast<int>(pid), describe(st).c_str(), grace);
            stop_all(workers, SIGTERM, std::chrono::seconds(grace));
            return status_of(st);
        }
    }
}
