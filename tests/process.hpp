#pragma once
// Real processes for the tests: started with posix_spawn, their output in a file, waited
// for with a timeout, killed with real signals; and a redis-server of the test's own on a
// free loopback port.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace test {

/// A child process; killed (SIGKILL) and reaped at scope exit if still running.
class Process {
public:
    Process(const std::vector<std::string>& argv, const std::string& output) : output_(output) {
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_adddup2(&actions, 1, 2);
        const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
        posix_spawn_file_actions_destroy(&actions);
        if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
    }
    Process(const Process&) = delete;
    Process& operator=(const Process&) = delete;
    ~Process() {
        if (!status_) {
            ::kill(pid_, SIGKILL);
            int st = 0;
            ::waitpid(pid_, &st, 0);
        }
    }
    pid_t pid() const { return pid_; }
    void kill(int sig) { ::kill(pid_, sig); }

    /// The exit status (128 + signal when killed), or nothing if it is still running after
    /// `timeout`.
    std::optional<int> wait(std::chrono::milliseconds timeout) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (!status_) {
            int st = 0;
            const pid_t r = ::waitpid(pid_, &st, WNOHANG);
            if (r == pid_) status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            else if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
            else std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return status_;
    }
    /// What it printed so far (stdout and stderr).
    std::string output() const {
        std::ifstream in(output_);
        return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    }
    /// Waits until its output contains `text`; false after `timeout`.
    bool wait_for_output(const std::string& text, std::chrono::milliseconds timeout) const {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (output().find(text) == std::string::npos) {
            if (std::chrono::steady_clock::now() >= deadline) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return true;
    }

private:
    pid_t pid_ = -1;
    std::string output_;
    std::optional<int> status_;
};

/// A loopback TCP port nobody holds at the moment of asking, below the kernel's range of
/// ephemeral ports (or above it): a port in that range, which binding port 0 would give, can
/// be taken at any moment as the local port of an outgoing connection (a concurrent test's),
/// and a server started on it afterwards then fails to bind.
inline int free_port() {
    int low = 32768, high = 60999;
    if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> low >> high;
    static std::mt19937 pick(std::random_device{}());
    for (int tries = 0; tries < 1000; ++tries) {
        const int port = low > 11024 ? std::uniform_int_distribution<int>(10000, low - 1)(pick)
                                     : std::uniform_int_distribution<int>(high + 1, 65535)(pick);
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = htons(static_cast<std::uint16_t>(port));
        const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
        ::close(fd);
        if (free) return port;
    }
    throw std::runtime_error("no free loopback port");
}

/// A redis-server (Debian's, installed by scripts/deps.sh) on 127.0.0.1, without
/// persistence unless asked, working in `dir`; stopped at scope exit.
class RedisServer {
public:
    RedisServer(const std::string& dir, bool persistent = false, int port = free_port()) : dir_(dir), port_(port) {
        start(persistent);
    }
    int port() const { return port_; }
    std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
    void kill() {
        if (process_) process_->kill(SIGKILL), process_->wait(std::chrono::seconds(10));
        process_.reset();
    }
    void start(bool persistent = false) {
        std::vector<std::string> argv{"/usr/bin/redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                      "--dir", dir_, "--save", "", "--appendonly", persistent ? "yes" : "no"};
        if (persistent) argv.insert(argv.end(), {"--appendfsync", "always"});
        process_.emplace(argv, dir_ + "/redis-" + std::to_string(++starts_) + ".log");
        if (!process_->wait_for_output("Ready to accept connections", std::chrono::seconds(10)))
            throw std::runtime_error("redis-server on port " + std::to_string(port_) + " did not start: " + process_->output());
    }

private:
    std::string dir_;
    int port_;
    int starts_ = 0;
    std::optional<Process> process_;
};

}  // namespace test
