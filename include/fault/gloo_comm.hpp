#pragma once
// GlooComm: the Communicator for ranks that are processes, on one host or several, over
// Gloo (Debian libgloo-dev) and its TCP transport. Link ckpt::gloo (libgloo, hiredis).
//
//   auto store = fault::open_store("file:///tmp/job-store");      // or "redis://host:6379"
//   fault::GlooComm comm(*store, rank, world_size, {.timeout = std::chrono::seconds(30)});
//   comm.allreduce(grads, fault::ReduceOp::mean);
//
// The ranks meet through the store: each publishes its address and connects to every other
// (a full mesh). Every call has the timeout. When a peer dies, the calls that need it fail
// with PeerFailure naming it: the process ignores SIGPIPE so that a write to a dead peer is
// an error, not the end of the survivor, and the dead are told from the living by their
// process (same host) or their heartbeat in the store (another host). After a failure the
// communicator is spent, as a Gloo context is: a new generation (another `prefix`) makes a
// new one.
//
// Sums are Gloo's ring allreduce: the same bits for the same world size, run after run, but
// not the same bits as ThreadComm's rank-order sums.

#include <signal.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iterator>
#include <sstream>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "communicator.hpp"
#include "redis_store.hpp"
#include "store.hpp"

namespace fault {

/// A store from its URL: `file:///absolute/dir` (FileStore) or `redis://host:port`
/// (RedisStore, port 6379 if omitted). ConfigError for anything else.
inline std::unique_ptr<Store> open_store(std::string_view url, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    constexpr std::string_view file = "file://", redis = "redis://";
    if (url.starts_with(file)) {
        const std::string dir(url.substr(file.size()));
        if (dir.empty() || dir.front() != '/')
            throw ckpt::ConfigError("store URL '" + std::string(url) + "': a file store needs an absolute path, file:///dir");
        return std::make_unique<FileStore>(dir);
    }
    if (url.starts_with(redis)) {
        std::string rest(url.substr(redis.size()));
        while (!rest.empty() && rest.back() == '/') rest.pop_back();
        int port = 6379;
        if (const auto colon = rest.rfind(':'); colon != std::string::npos) {
            const std::string p = rest.substr(colon + 1);
            if (p.empty() || p.find_first_not_of("0123456789") != std::string::npos || p.size() > 5)
                throw ckpt::ConfigError("store URL '" + std::string(url) + "': '" + p + "' is not a port");
            port = std::stoi(p);
            rest.resize(colon);
        }
        if (rest.empty()) throw ckpt::ConfigError("store URL '" + std::string(url) + "': no host");
        return std::make_unique<RedisStore>(rest, port, timeout);
    }
    throw ckpt::ConfigError("store URL '" + std::string(url) + "': expected file:///dir or redis://host:port");
}

namespace detail {

/// Our Store seen as Gloo's rendezvous store, for Context::connectFullMesh.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
public:
    GlooStoreAdapter(fault::Store& store, std::chrono::milliseconds timeout) : store_(store), timeout_(timeout) {}
    void set(const std::string& key, const std::vector<char>& data) override {
        store_.set(key, std::string_view(data.data(), data.size()));
    }
    std::vector<char> get(const std::string& key) override {
        const std::string v = store_.wait(key, timeout_);
        return {v.begin(), v.end()};
    }
    void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (const auto& k : keys)
            store_.wait(k, std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()),
                                    std::chrono::milliseconds(1)));
    }

private:
    fault::Store& store_;
    std::chrono::milliseconds timeout_;
};

inline std::string host_name() {
    char buf[256] = {};
    ::gethostname(buf, sizeof buf - 1);
    return buf;
}

// A process as "pid starttime" (starttime from /proc, so that a pid used again by another
// process is not mistaken for the first), and whether it is still running.
inline std::string process_id(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
    if (close == std::string::npos) return {};
    std::istringstream fields(stat.substr(close + 2));
    std::string state, field;
    fields >> state;
    for (int i = 4; i <= 22 && fields >> field; ++i) {}  // field 22: starttime
    if (state == "Z" || state == "X") return {};          // dead, not yet reaped
    return std::to_string(pid) + " " + field;
}
inline bool process_running(const std::string& id) {
    const auto space = id.find(' ');
    if (space == std::string::npos) return false;
    return process_id(static_cast<pid_t>(std::stol(id.substr(0, space)))) == id;
}

}  // namespace detail

struct GlooOptions {
    std::chrono::milliseconds timeout = std::chrono::seconds(30);  ///< every call, the rendezvous included
    std::string address = "127.0.0.1";  ///< the address this rank listens on (its interface toward the others)
    std::string prefix;                 ///< the store keys of this communicator: one per generation
    /// A rank on another host counts as dead when its heartbeat in the store has not moved
    /// for this long (on this host, its process is asked directly).
    std::chrono::milliseconds heartbeat_lease = std::chrono::milliseconds(1500);
};

class GlooComm {
public:
    /// Joins ranks 0..size-1 through `store`: returns once every rank is connected to every
    /// other; StoreError or PeerFailure if they are not within the timeout.
    GlooComm(Store& store, int rank, int size, GlooOptions options = {})
        : store_(store, options.prefix), rank_(rank), size_(size), options_(std::move(options)) {
        if (size < 1) throw ckpt::ConfigError("GlooComm: a world of " + std::to_string(size) + " ranks");
        if (rank < 0 || rank >= size)
            throw ckpt::ConfigError("GlooComm: rank " + std::to_string(rank) + " is not in a world of " + std::to_string(size));
        if (options_.timeout.count() <= 0) throw ckpt::ConfigError("GlooComm: the timeout must be positive");
        ::signal(SIGPIPE, SIG_IGN);  // a dead peer's socket: an error for this call, not the process's end

        // who this rank is, for telling the dead from the living later; a second process
        // claiming the same rank in this generation is refused
        const std::string me = detail::host_name() + " " + detail::process_id(::getpid());
        if (!store_.create("member/" + std::to_string(rank_), me)) {
            const auto other = store_.get("member/" + std::to_string(rank_)).value_or("?");
            throw ckpt::ConfigError("GlooComm: rank " + std::to_string(rank_) + " of " + store_.url() +
                                    " is already taken by process " + other + " (two workers with one rank?)");
        }
        heartbeat_ = std::thread([this] { beat(); });
        try {
            if (const auto size_key = store_.create("world_size", std::to_string(size_)); !size_key) {
                const auto theirs = store_.wait("world_size", options_.timeout);
                if (theirs != std::to_string(size_))
                    throw ckpt::ConfigError("GlooComm: rank " + std::to_string(rank_) + " was started with a world of " +
                                            std::to_string(size_) + " ranks, others with " + theirs + " (" + store_.url() + ")");
            }
            gloo::transport::tcp::attr attr;
            attr.hostname = options_.address;
            auto device = gloo::transport::tcp::CreateDevice(attr);
            auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
            ctx->setTimeout(options_.timeout);
            detail::GlooStoreAdapter adapter(store_, options_.timeout);
            ctx->connectFullMesh(adapter, device);
            ctx_ = std::move(ctx);
        } catch (const gloo::Exception& e) {
            stop_heartbeat();
            throw PeerFailure("GlooComm: rank " + std::to_string(rank_) + " could not connect to the others through " +
                                  store_.url() + ": " + e.what(),
                              {});
        } catch (...) {
            stop_heartbeat();
            throw;
        }
    }
    GlooComm(const GlooComm&) = delete;
    GlooComm& operator=(const GlooComm&) = delete;
    ~GlooComm() { stop_heartbeat(); }

    int rank() const noexcept { return rank_; }
    int size() const noexcept { return size_; }
    int job_rank() const noexcept { return rank_; }
    /// The ranks that failed, once a call has failed (empty before).
    const std::vector<int>& failed_ranks() const noexcept { return failed_; }

    void allreduce(std::span<float> data, ReduceOp op) {
        guarded("allreduce", [&] {
            if (size_ > 1 && !data.empty()) {
                gloo::AllreduceOptions o(ctx_);
                o.setOutput(data.data(), data.size());
                o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
                o.setTimeout(options_.timeout);
                gloo::allreduce(o);
            }
            if (op == ReduceOp::mean)
                for (float& v : data) v /= static_cast<float>(size_);
        });
    }
    void broadcast(std::span<float> data, int root) {
        check_peer(root, "broadcast");
        guarded("broadcast", [&] {
            if (size_ == 1 || data.empty()) return;
            gloo::BroadcastOptions o(ctx_);
            o.setOutput(data.data(), data.size());
            o.setRoot(root);
            o.setTimeout(options_.timeout);
            gloo::broadcast(o);
        });
    }
    void allgather(std::span<const float> in, std::span<float> out) {
        if (out.size() != in.size() * static_cast<std::size_t>(size_))
            throw ckpt::ConfigError("allgather: the output holds " + std::to_string(out.size()) + " floats, " +
                                    std::to_string(size_) + " ranks of " + std::to_string(in.size()) + " need " +
                                    std::to_string(in.size() * static_cast<std::size_t>(size_)));
        guarded("allgather", [&] {
            if (size_ == 1) {
                std::copy(in.begin(), in.end(), out.begin());
                return;
            }
            if (in.empty()) return;
            gloo::AllgatherOptions o(ctx_);
            o.setInput(const_cast<float*>(in.data()), in.size());
            o.setOutput(out.data(), out.size());
            o.setTimeout(options_.timeout);
            gloo::allgather(o);
        });
    }
    void barrier() {
        guarded("barrier", [&] {
            if (size_ == 1) return;
            gloo::BarrierOptions o(ctx_);
            o.setTimeout(options_.timeout);
            gloo::barrier(o);
        });
    }
    /// Returns once `dst` has the data. The size travels first, so that a receiver
    /// expecting another size fails with a ConfigError naming both, as does the sender.
    void send(std::span<const float> data, int dst, int tag) {
        check_peer(dst, "send");
        guarded("send", [&] {
            std::uint64_t count = data.size();
            auto head = ctx_->createUnboundBuffer(&count, sizeof count);
            head->send(dst, slot(tag));
            wait_send(*head, dst, tag);
            std::uint64_t verdict = 0;  // the receiver's: 1 to go on, 0 for a size it did not expect
            auto answer = ctx_->createUnboundBuffer(&verdict, sizeof verdict);
            answer->recv(dst, slot(tag));
            wait_recv(*answer, dst, tag);
            if (verdict != 1)
                throw ckpt::ConfigError("send on rank " + std::to_string(rank_) + " to rank " + std::to_string(dst) + " (tag " +
                                        std::to_string(tag) + "): sent " + std::to_string(data.size()) + " floats, rank " +
                                        std::to_string(dst) + " expected " + std::to_string(verdict >> 1));
            if (data.empty()) return;
            auto body = ctx_->createUnboundBuffer(const_cast<float*>(data.data()), data.size_bytes());
            body->send(dst, slot(tag));
            wait_send(*body, dst, tag);
        });
    }
    void recv(std::span<float> data, int src, int tag) {
        check_peer(src, "recv");
        guarded("recv", [&] {
            std::uint64_t count = 0;
            auto head = ctx_->createUnboundBuffer(&count, sizeof count);
            head->recv(src, slot(tag));
            wait_recv(*head, src, tag);
            std::uint64_t verdict = count == data.size() ? 1 : (std::uint64_t(data.size()) << 1);
            auto answer = ctx_->createUnboundBuffer(&verdict, sizeof verdict);
            answer->send(src, slot(tag));
            wait_send(*answer, src, tag);
            if (count != data.size())
                throw ckpt::ConfigError("recv on rank " + std::to_string(rank_) + ": expected " + std::to_string(data.size()) +
                                        " floats from rank " + std::to_string(src) + " (tag " + std::to_string(tag) +
                                        "), it sent " + std::to_string(count));
            if (data.empty()) return;
            auto body = ctx_->createUnboundBuffer(data.data(), data.size_bytes());
            body->recv(src, slot(tag));
            wait_recv(*body, src, tag);
        });
    }

private:
    // Point-to-point slots, apart from those of Gloo's collectives (prefixes 0x01-0x08).
    static std::uint64_t slot(int tag) { return gloo::Slot::build(0x70, static_cast<std::uint32_t>(tag)); }
    void wait_send(gloo::transport::UnboundBuffer& b, int peer, int tag) {
        if (!b.waitSend(options_.timeout)) timed_out("send to", peer, tag);
    }
    void wait_recv(gloo::transport::UnboundBuffer& b, int peer, int tag) {
        if (!b.waitRecv(options_.timeout)) timed_out("recv from", peer, tag);
    }
    [[noreturn]] void timed_out(const char* what, int peer, int tag) {
        throw gloo::IoException(std::string(what) + " rank " + std::to_string(peer) + " (tag " + std::to_string(tag) +
                                ") did not complete within " + std::to_string(options_.timeout.count()) + " ms");
    }
    void check_peer(int peer, const char* what) const {
        if (peer < 0 || peer >= size_)
            throw ckpt::ConfigError(std::string(what) + ": rank " + std::to_string(peer) + " is not in a world of " +
                                    std::to_string(size_));
    }

    // Runs a call; a Gloo error becomes PeerFailure naming the ranks found dead, and spends
    // the communicator (a Gloo context is unusable after an I/O error).
    template <class F>
    void guarded(const char* call, F&& f) {
        const std::string where = std::string(call) + " on rank " + std::to_string(rank_);
        if (spent_) throw PeerFailure(where + ": the communicator failed earlier (" + spent_reason_ + ")", failed_);
        try {
            f();
        } catch (const gloo::Exception& e) {
            // first say this rank is a survivor: it may exit before the others look for the dead
            try {
                store_.set("survivor/" + std::to_string(rank_), "1");
            } catch (const StoreError&) {
            }
            failed_ = dead_ranks();
            spent_ = true;
            spent_reason_ = e.what();
            std::string who = failed_.empty() ? "no rank found dead" : "dead: rank";
            for (std::size_t i = 0; i < failed_.size(); ++i) who += (i ? ", " : " ") + std::to_string(failed_[i]);
            throw PeerFailure(where + " failed (" + who + "): " + e.what(), failed_);
        }
    }

    // The ranks whose process is gone: asked directly on this host, by a heartbeat that
    // stopped moving elsewhere. A killed process closes its sockets before it is seen dead,
    // so its survivors may ask a little early: they ask again until the lease ends. Ranks
    // that said they survived are not counted, even if they have exited since.
    std::vector<int> dead_ranks() {
        const std::string here = detail::host_name();
        std::map<int, std::string> local, remote;  // rank -> process id / last heartbeat
        for (int q = 0; q < size_; ++q) {
            if (q == rank_) continue;
            const std::string id = store_.get("member/" + std::to_string(q)).value_or("");
            const auto space = id.find(' ');
            if (space != std::string::npos && id.substr(0, space) == here) local[q] = id.substr(space + 1);
            else remote[q] = store_.get("heartbeat/" + std::to_string(q)).value_or("");
        }
        const auto deadline = std::chrono::steady_clock::now() + options_.heartbeat_lease;
        std::vector<int> dead;
        auto survived = [&](int q) { return store_.get("survivor/" + std::to_string(q)).has_value(); };
        auto scan_local = [&] {
            for (const auto& [q, id] : local)
                if (std::find(dead.begin(), dead.end(), q) == dead.end() && !detail::process_running(id) && !survived(q))
                    dead.push_back(q);
        };
        for (scan_local(); dead.empty() && std::chrono::steady_clock::now() < deadline; scan_local())
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (!dead.empty()) {  // others killed at the same moment may be a few ms behind
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            scan_local();
        }
        if (!remote.empty()) {
            std::this_thread::sleep_until(deadline);
            for (const auto& [q, beat] : remote)
                if (store_.get("heartbeat/" + std::to_string(q)).value_or("") == beat && !survived(q)) dead.push_back(q);
        }
        std::sort(dead.begin(), dead.end());
        return dead;
    }

    void beat() {
        std::unique_lock lock(beat_m_);
        std::uint64_t n = 0;
        const auto period = std::max(options_.heartbeat_lease / 5, std::chrono::milliseconds(10));
        while (!stop_) {
            lock.unlock();
            try {
                store_.set("heartbeat/" + std::to_string(rank_), std::to_string(++n));
            } catch (const StoreError&) {  // the store is away: the next beat tries again
            }
            lock.lock();
            beat_cv_.wait_for(lock, period, [&] { return stop_; });
        }
    }
    void stop_heartbeat() {
        {
            std::lock_guard lock(beat_m_);
            stop_ = true;
        }
        beat_cv_.notify_all();
        if (heartbeat_.joinable()) heartbeat_.join();
    }

    PrefixStore store_;
    int rank_, size_;
    GlooOptions options_;
    std::shared_ptr<gloo::rendezvous::Context> ctx_;
    bool spent_ = false;
    std::string spent_reason_;
    std::vector<int> failed_;
    std::mutex beat_m_;
    std::condition_variable beat_cv_;
    bool stop_ = false;
    std::thread heartbeat_;
};

static_assert(Communicator<GlooComm>);

}  // namespace fault
