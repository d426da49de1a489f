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
// communicator is spent, as a Gloo context is: shrink() (the survivors) or regroup() (every
// node, the restarted included) makes the next generation's.
//
// The collectives run on Gloo's unbound buffers, GlooComm's own, and every wait on them can
// be cut short: a watch thread, once a wait has lasted a poll interval, asks the store
// whether a member of the generation reported a failure (and, less often, whether every
// member still lives), and aborts the waits when one did. Gloo's TCP transport fails a send
// already queued on a broken connection only at the call's timeout, and closing connections
// wakes no wait; aborting does, so every survivor learns of a death within a second or so.
//
// Sums are in rank order, ((x0 + x1) + x2) + ..., each rank reducing a slice of the buffer:
// the same bits as ThreadComm's, whatever the timing.

#include <signal.h>
#include <unistd.h>

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "communicator.hpp"
#include "membership.hpp"
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

/// Cuts GlooComm's waits short when a member of its generation has failed. A wait registers
/// its buffer for its duration; every `poll` the watch thread looks for a wait older than
/// that and, finding one, asks `failed()` (the store); when it says yes, every registered
/// wait is aborted, and so is every later one. Nothing runs on the training thread but the
/// registration (a mutex, a vector).
class GlooWatch {
public:
    GlooWatch(std::function<bool()> failed, std::chrono::milliseconds poll) : failed_(std::move(failed)), poll_(poll) {
        thread_ = std::thread([this] { watch(); });
    }
    GlooWatch(const GlooWatch&) = delete;
    GlooWatch& operator=(const GlooWatch&) = delete;
    ~GlooWatch() {
        {
            std::lock_guard lock(m_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }

    /// A wait on `buffer` (a send or a receive) for as long as it lives.
    class Waiting {
    public:
        Waiting(GlooWatch& watch, gloo::transport::UnboundBuffer& buffer, bool send) : watch_(watch), buffer_(&buffer) {
            std::lock_guard lock(watch_.m_);
            watch_.waits_.push_back({&buffer, send, std::chrono::steady_clock::now()});
            if (watch_.aborted_) abort(watch_.waits_.back());
        }
        Waiting(const Waiting&) = delete;
        Waiting& operator=(const Waiting&) = delete;
        ~Waiting() {
            std::lock_guard lock(watch_.m_);
            auto& w = watch_.waits_;
            for (auto it = w.begin(); it != w.end(); ++it)
                if (it->buffer == buffer_) {
                    w.erase(it);
                    break;
                }
        }

    private:
        GlooWatch& watch_;
        gloo::transport::UnboundBuffer* buffer_;
    };

    /// Whether the waits were aborted: a member failed.
    bool aborted() const {
        std::lock_guard lock(m_);
        return aborted_;
    }
    /// Aborts every wait now and from now on (this rank saw the failure itself).
    void abort_all() {
        std::lock_guard lock(m_);
        abort_locked();
    }

private:
    struct Wait {
        gloo::transport::UnboundBuffer* buffer;
        bool send;
        std::chrono::steady_clock::time_point since;
    };
    static void abort(const Wait& w) {
        if (w.send)
            w.buffer->abortWaitSend();
        else
            w.buffer->abortWaitRecv();
    }
    void abort_locked() {
        aborted_ = true;
        for (const auto& w : waits_) abort(w);
    }

    void watch() {
        std::unique_lock lock(m_);
        while (!stop_) {
            cv_.wait_for(lock, poll_, [&] { return stop_; });
            if (stop_ || aborted_) continue;
            const auto old = std::chrono::steady_clock::now() - poll_;
            if (std::none_of(waits_.begin(), waits_.end(), [&](const Wait& w) { return w.since <= old; })) continue;
            lock.unlock();
            bool failed = false;
            try {
                failed = failed_();
            } catch (const std::exception&) {
                // the store unreachable: the call's own timeout stays the bound
            }
            lock.lock();
            if (failed) abort_locked();
        }
    }

    std::function<bool()> failed_;
    std::chrono::milliseconds poll_;
    mutable std::mutex m_;
    std::condition_variable cv_;
    std::vector<Wait> waits_;
    bool aborted_ = false;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace detail

/// How a GlooComm waits, where it listens, how it tells the dead from the living, and whether the
/// job is elastic (goes on with fewer or more ranks).
struct GlooOptions {
    /// Every call, the rendezvous included. Forming a generation (the constructor, regroup())
    /// waits up to twice this, plus the cooldown for a node started anew: a survivor may still
    /// be in a call that ends only at its timeout before it comes.
    std::chrono::milliseconds timeout = std::chrono::seconds(30);
    std::string address = "127.0.0.1";  ///< the address this rank listens on (its interface toward the others)
    std::string prefix;                 ///< the job's keys in the store: several jobs can share one
    /// A rank on another host counts as dead when its heartbeat in the store has not moved
    /// for this long (on this host, its process is asked directly).
    std::chrono::milliseconds lease = std::chrono::milliseconds(1500);
    /// A node id whose process died may be claimed again only this long after its last
    /// heartbeat (the seed's 30 s).
    std::chrono::milliseconds cooldown = std::chrono::seconds(30);
    /// Set: the job is elastic. After a failure the survivors wait this long for the dead to
    /// come back, then go on without them (a smaller generation); a worker that starts while
    /// others train joins the next generation, which they form at a checkpoint (grow()).
    std::optional<std::chrono::milliseconds> elastic = std::nullopt;
    /// In an elastic job, how long a starting worker waits for the others to take it in.
    std::chrono::milliseconds join_timeout = std::chrono::minutes(10);
};

/// The Communicator for ranks that are processes, on one host or several, over Gloo's TCP
/// transport: the ranks meet through a Store, every call has the timeout, and a dead peer makes
/// the calls that need it fail with PeerFailure. After a failure it is spent: shrink() (the
/// survivors), regroup() (every node, the restarted included) or grow() (an elastic job taking
/// in joiners) makes the next generation's.
class GlooComm {
public:
    /// Joins the job as node `rank` of `size` (see Membership: a live holder of the same
    /// node id is refused, a dead one's cooldown waited out) and connects to the others in
    /// a new generation of every node; returns once every rank is connected to every other.
    /// StoreError, ConfigError or PeerFailure if that cannot happen within the timeout.
    GlooComm(Store& store, int rank, int size, GlooOptions options = {})
        : job_(std::make_shared<Job>(store, rank, size, std::move(options))) {
        ::signal(SIGPIPE, SIG_IGN);  // a dead peer's socket: an error for this call, not the process's end
        if (!job_->options.elastic) {
            connect(job_->members.form(job_->members.latest() + 1, Membership::everyone));
            return;
        }
        // elastic: the next generation the others form; one formed without this worker while it
        // joined (the survivors stopped waiting for it just then) sends it on to the one after
        const auto deadline = std::chrono::steady_clock::now() + job_->options.join_timeout;
        for (;;) {
            try {
                const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
                connect(job_->members.form_elastic(job_->members.latest() + 1, *job_->options.elastic,
                                                   std::max(left, std::chrono::milliseconds(1))));
                return;
            } catch (const PeerFailure& e) {
                const auto& left_out = e.ranks();
                if (std::find(left_out.begin(), left_out.end(), rank) == left_out.end() ||
                    std::chrono::steady_clock::now() >= deadline)
                    throw;
            }
        }
    }

    int rank() const noexcept { return rank_; }
    int size() const noexcept { return static_cast<int>(gen_.members.size()); }
    /// This rank's node id in the job (its rank in the first generation).
    int job_rank() const noexcept { return job_->members.node_id(); }
    /// The generation this communicator trains in: its number and its members' node ids.
    const Generation& generation() const noexcept { return gen_; }
    /// The node ids found dead when a call failed (empty before).
    const std::vector<int>& failed_ranks() const noexcept { return failure_->failed; }

    /// After a failure: a communicator over the survivors, in the next generation. Every
    /// survivor gets the same members: the nodes still alive that joined.
    GlooComm shrink() {
        return GlooComm(job_, job_->members.form(gen_.number + 1, Membership::survivors, gen_.members));
    }
    /// After a failure: a communicator over every node of the job again, once the dead
    /// have been restarted (by ckpt-run, or by hand) and have joined.
    /// In an elastic job, the dead are waited for only GlooOptions::elastic, then left out.
    GlooComm regroup() {
        const int next = std::max(job_->members.latest(), gen_.number) + 1;
        if (job_->options.elastic)
            return GlooComm(job_, job_->members.form_elastic(next, *job_->options.elastic, 2 * job_->options.timeout));
        return GlooComm(job_, job_->members.form(next, Membership::everyone));
    }
    /// In an elastic job: the workers (node ids) waiting to join the next generation.
    std::vector<int> waiting_to_join() { return job_->members.joined(gen_.number + 1); }
    /// In an elastic job, at a step every rank chose: a communicator over this generation and
    /// the workers waiting to join (the dead are not waited for).
    GlooComm grow() {
        return GlooComm(job_, job_->members.form_elastic(gen_.number + 1, std::chrono::milliseconds(0), 2 * job_->options.timeout));
    }
    /// This rank's own failure: the others' calls fail at once, and their next
    /// generation is formed without it.
    void declare_failed() {
        job_->members.declare_failed(gen_.number);
        job_->scoped.set(failure_key(), std::to_string(job_rank()));
        if (watch_) watch_->abort_all();
        std::lock_guard lock(failure_->mutex);
        if (ctx_ && !failure_->spent) ctx_->closeConnections();
        failure_->spent = true;
        failure_->reason = "this rank declared itself failed";
    }

    /// Sums in rank order, each rank reducing a slice: the same bits as ThreadComm's.
    void allreduce(std::span<float> data, ReduceOp op) {
        guarded("allreduce", [&] {
            if (size() > 1 && !data.empty()) {
                reduce(data, op);
            } else if (op == ReduceOp::mean) {
                for (float& v : data) v /= static_cast<float>(size());
            }
        });
    }
    void broadcast(std::span<float> data, int root) {
        check_peer(root, "broadcast");
        guarded("broadcast", [&] {
            if (size() == 1 || data.empty()) return;
            const auto deadline = Clock::now() + timeout();
            std::vector<Message> messages;
            if (rank_ == root) {
                for (int q = 0; q < size(); ++q)
                    if (q != root) post(messages, data.data(), data.size_bytes(), q, true, collective_slot(broadcast_slot));
            } else {
                post(messages, data.data(), data.size_bytes(), root, false, collective_slot(broadcast_slot));
            }
            complete(messages, "broadcast", deadline);
        });
    }
    void allgather(std::span<const float> in, std::span<float> out) {
        if (out.size() != in.size() * static_cast<std::size_t>(size()))
            throw ckpt::ConfigError("allgather: the output holds " + std::to_string(out.size()) + " floats, " +
                                    std::to_string(size()) + " ranks of " + std::to_string(in.size()) + " need " +
                                    std::to_string(in.size() * static_cast<std::size_t>(size())));
        guarded("allgather", [&] {
            std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(in.size()) * rank_);
            if (size() == 1 || in.empty()) return;
            const auto deadline = Clock::now() + timeout();
            std::vector<Message> messages;
            for (int q = 0; q < size(); ++q) {
                if (q == rank_) continue;
                post(messages, out.data() + in.size() * static_cast<std::size_t>(q), in.size_bytes(), q, false,
                     collective_slot(allgather_slot));
                post(messages, const_cast<float*>(in.data()), in.size_bytes(), q, true, collective_slot(allgather_slot));
            }
            complete(messages, "allgather", deadline);
        });
    }
    /// Returns once every rank has come: each tells every other it is here.
    void barrier() {
        guarded("barrier", [&] {
            if (size() == 1) return;
            const auto deadline = Clock::now() + timeout();
            char here = 1;
            std::vector<char> heard(static_cast<std::size_t>(size()));
            std::vector<Message> messages;
            for (int q = 0; q < size(); ++q) {
                if (q == rank_) continue;
                post(messages, &heard[static_cast<std::size_t>(q)], 1, q, false, collective_slot(barrier_slot));
                post(messages, &here, 1, q, true, collective_slot(barrier_slot));
            }
            complete(messages, "barrier", deadline);
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
            wait_send(*head, dst, "send", Clock::now() + timeout());
            std::uint64_t verdict = 0;  // the receiver's: 1 to go on, else twice the size it expected
            auto answer = ctx_->createUnboundBuffer(&verdict, sizeof verdict);
            answer->recv(dst, slot(tag));
            wait_recv(*answer, dst, "send", Clock::now() + timeout());
            if (verdict != 1)
                throw ckpt::ConfigError("send on rank " + std::to_string(rank_) + " to rank " + std::to_string(dst) + " (tag " +
                                        std::to_string(tag) + "): sent " + std::to_string(data.size()) + " floats, rank " +
                                        std::to_string(dst) + " expected " + std::to_string(verdict >> 1));
            if (data.empty()) return;
            auto body = ctx_->createUnboundBuffer(const_cast<float*>(data.data()), data.size_bytes());
            body->send(dst, slot(tag));
            wait_send(*body, dst, "send", Clock::now() + timeout());
        });
    }
    void recv(std::span<float> data, int src, int tag) {
        check_peer(src, "recv");
        guarded("recv", [&] {
            std::uint64_t count = 0;
            auto head = ctx_->createUnboundBuffer(&count, sizeof count);
            head->recv(src, slot(tag));
            wait_recv(*head, src, "recv", Clock::now() + timeout());
            std::uint64_t verdict = count == data.size() ? 1 : (std::uint64_t(data.size()) << 1);
            auto answer = ctx_->createUnboundBuffer(&verdict, sizeof verdict);
            answer->send(src, slot(tag));
            wait_send(*answer, src, "recv", Clock::now() + timeout());
            if (count != data.size())
                throw ckpt::ConfigError("recv on rank " + std::to_string(rank_) + ": expected " + std::to_string(data.size()) +
                                        " floats from rank " + std::to_string(src) + " (tag " + std::to_string(tag) +
                                        "), it sent " + std::to_string(count));
            if (data.empty()) return;
            auto body = ctx_->createUnboundBuffer(data.data(), data.size_bytes());
            body->recv(src, slot(tag));
            wait_recv(*body, src, "recv", Clock::now() + timeout());
        });
    }

private:
    // What the communicators of one process in one job share, generation after generation.
    struct Job {
        Job(Store& store, int rank, int size, GlooOptions o)
            : options(checked(std::move(o))), scoped(store, options.prefix),
              members(scoped, rank, size, {options.lease, options.cooldown, options.timeout}) {}
        GlooOptions options;  // first: checked before anything uses it
        PrefixStore scoped;
        Membership members;

        /// Refuses options no wait can keep, naming the field.
        static GlooOptions checked(GlooOptions o) {
            auto positive = [](const char* field, std::chrono::milliseconds v) {
                if (v.count() <= 0)
                    throw ckpt::ConfigError(std::string("GlooOptions::") + field + " must be positive, got " +
                                            std::to_string(v.count()) + " ms");
            };
            positive("timeout", o.timeout);
            positive("lease", o.lease);
            positive("join_timeout", o.join_timeout);
            if (o.cooldown.count() < 0)
                throw ckpt::ConfigError("GlooOptions::cooldown must not be negative, got " +
                                        std::to_string(o.cooldown.count()) + " ms");
            if (o.elastic && o.elastic->count() < 0)
                throw ckpt::ConfigError("GlooOptions::elastic must not be negative, got " +
                                        std::to_string(o.elastic->count()) + " ms");
            if (o.address.empty()) throw ckpt::ConfigError("GlooOptions::address is empty: give this rank's address");
            return o;
        }
    };

    GlooComm(std::shared_ptr<Job> job, Generation gen) : job_(std::move(job)) { connect(std::move(gen)); }

    void connect(Generation gen) {
        gen_ = std::move(gen);
        rank_ = gen_.index_of(job_->members.node_id());
        PrefixStore store(job_->scoped, gen_.prefix());
        try {
            gloo::transport::tcp::attr attr;
            attr.hostname = job_->options.address;
            auto device = gloo::transport::tcp::CreateDevice(attr);
            auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size());
            ctx->setTimeout(timeout());
            detail::GlooStoreAdapter adapter(store, timeout());
            ctx->connectFullMesh(adapter, device);
            ctx_ = std::move(ctx);
            watch_ = std::make_unique<detail::GlooWatch>(failure_reported(), watch_poll);
        } catch (const gloo::Exception& e) {
            connect_failed(store, e.what());
        } catch (const gloo::EnforceNotMet& e) {
            connect_failed(store, e.what());
        }
    }
    [[noreturn]] void connect_failed(const PrefixStore& store, const char* what) {
        throw PeerFailure("GlooComm: node " + std::to_string(job_rank()) + " could not connect to generation " +
                              std::to_string(gen_.number) + " through " + store.url() + ": " + what,
                          {});
    }
    std::chrono::milliseconds timeout() const { return job_->options.timeout; }

    // How often a long wait looks in the store for a failure, and how often for a member's
    // death (a process gone, a heartbeat stopped) that nobody has reported: a rank whose
    // every peer is blocked on the dead one hears of it so.
    static constexpr std::chrono::milliseconds watch_poll{100};
    static constexpr std::chrono::milliseconds liveness_poll{500};
    std::string failure_key() const { return gen_.prefix() + "failure"; }
    // What the watch asks: reported failed by any member, or found dead.
    std::function<bool()> failure_reported() {
        return [job = job_, gen = gen_, key = failure_key(), me = job_rank(), last = Clock::time_point()]() mutable {
            if (job->scoped.get(key)) return true;
            if (Clock::now() - last < liveness_poll) return false;
            last = Clock::now();
            for (int q : gen.members)
                if (q != me && !job->members.alive_in(gen.number, q)) return true;
            return false;
        };
    }

    using Clock = std::chrono::steady_clock;
    // Point-to-point slots, one per tag; the collectives' are apart (a transfer on another
    // thread uses its tags beside training's collectives).
    static std::uint64_t slot(int tag) { return gloo::Slot::build(0x70, static_cast<std::uint32_t>(tag)); }
    enum CollectiveSlot : std::uint32_t { reduce_slot = 1, reduced_slot, broadcast_slot, allgather_slot, barrier_slot };
    static std::uint64_t collective_slot(CollectiveSlot which) { return gloo::Slot::build(0x71, which); }

    // Each wait is the watch's to abort (a member failed) and ends at the timeout otherwise
    // (Gloo throws then). Aborted, it throws as the timeout would, saying why.
    void wait_send(gloo::transport::UnboundBuffer& b, int peer, const char* call, Clock::time_point deadline) {
        detail::GlooWatch::Waiting waiting(*watch_, b, true);
        if (!b.waitSend(left(deadline))) stopped(call, "send to", peer);
    }
    void wait_recv(gloo::transport::UnboundBuffer& b, int peer, const char* call, Clock::time_point deadline) {
        detail::GlooWatch::Waiting waiting(*watch_, b, false);
        if (!b.waitRecv(left(deadline))) stopped(call, "receive from", peer);
    }
    static std::chrono::milliseconds left(Clock::time_point deadline) {
        return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                        std::chrono::milliseconds(1));
    }
    [[noreturn]] void stopped(const char* call, const char* what, int peer) {
        throw gloo::IoException(std::string(call) + ": " + what + " rank " + std::to_string(peer) +
                                " stopped: a member of generation " + std::to_string(gen_.number) + " failed");
    }

    // The messages of one collective, posted at once and then waited for.
    struct Message {
        std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
        int peer;
        bool send;
    };
    void post(std::vector<Message>& messages, void* data, std::size_t bytes, int peer, bool send, std::uint64_t slot) {
        if (bytes == 0) return;  // both sides skip an empty part alike
        auto b = ctx_->createUnboundBuffer(data, bytes);
        if (send)
            b->send(peer, slot);
        else
            b->recv(peer, slot);
        messages.push_back({std::move(b), peer, send});
    }
    void complete(std::vector<Message>& messages, const char* call, Clock::time_point deadline) {
        for (auto& m : messages) {
            if (m.send)
                wait_send(*m.buffer, m.peer, call, deadline);
            else
                wait_recv(*m.buffer, m.peer, call, deadline);
        }
        messages.clear();
    }

    // Rank r reduces slice r (ThreadComm's slices): every rank sends it its part, r adds the
    // parts in rank order, then sends the slice to every rank.
    void reduce(std::span<float> data, ReduceOp op) {
        const auto deadline = Clock::now() + timeout();
        const std::size_t n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank_), count = data.size();
        auto lo = [&](std::size_t q) { return count * q / n; };
        const std::size_t mine = lo(me + 1) - lo(me);
        scratch_.resize(n * mine);  // rank q's part of slice `me` at q * mine
        auto slice_of = [&](std::size_t q) { return std::span<float>(data.data() + lo(q), lo(q + 1) - lo(q)); };
        auto part_from = [&](std::size_t q) { return std::span<float>(scratch_.data() + q * mine, mine); };
        // every other rank q: receive into in(q), send out(q)
        auto exchange = [&](CollectiveSlot slot, auto in, auto out) {
            std::vector<Message> messages;
            for (std::size_t q = 0; q < n; ++q) {
                if (q == me) continue;
                post(messages, in(q).data(), in(q).size_bytes(), static_cast<int>(q), false, collective_slot(slot));
                post(messages, out(q).data(), out(q).size_bytes(), static_cast<int>(q), true, collective_slot(slot));
            }
            complete(messages, "allreduce", deadline);
        };
        exchange(reduce_slot, part_from, slice_of);
        const std::span<float> slice = slice_of(me);
        if (me != 0) {  // rank 0's part first: this rank's own goes to its place among the others
            std::copy(slice.begin(), slice.end(), part_from(me).begin());
            std::copy(part_from(0).begin(), part_from(0).end(), slice.begin());
        }
        for (std::size_t q = 1; q < n; ++q) {
            const float* part = part_from(q).data();
            for (std::size_t i = 0; i < mine; ++i) slice[i] += part[i];
        }
        if (op == ReduceOp::mean)
            for (float& v : slice) v /= static_cast<float>(n);
        exchange(reduced_slot, slice_of, [&](std::size_t) { return slice; });
    }
    void check_peer(int peer, const char* what) const {
        if (peer < 0 || peer >= size())
            throw ckpt::ConfigError(std::string(what) + ": rank " + std::to_string(peer) + " is not in a group of " +
                                    std::to_string(size()));
    }

    // Runs a call; a Gloo error becomes PeerFailure naming the nodes found dead, and spends
    // the communicator (a Gloo context is unusable after an I/O error).
    template <class F>
    void guarded(const char* call, F&& f) {
        // the message is built only on a failure: this runs in every training step
        auto where = [&] { return std::string(call) + " on rank " + std::to_string(job_rank()); };
        auto spent = [&] {
            return PeerFailure(where() + ": the communicator failed earlier (" + failure_->reason + ")", failure_->failed);
        };
        if (failure_->spent) {
            std::lock_guard lock(failure_->mutex);
            throw spent();
        }
        try {
            f();
        } catch (const gloo::Exception& e) {
            fail(where, spent, e.what());
        } catch (const gloo::EnforceNotMet& e) {
            // a call on another thread closed the connections under this one (its descriptors
            // are gone from Gloo's event loop): the communicator is spent alike
            fail(where, spent, e.what());
        }
    }
    template <class Where, class Spent>
    [[noreturn]] void fail(Where& where, Spent& spent, const char* what) {
        {
            // calls on two threads (a memory-level transfer beside training) may fail at once:
            // the first one finds the dead, the other reports what it found
            std::lock_guard lock(failure_->mutex);
            if (failure_->spent) throw spent();
            failure_->spent = true;
            failure_->reason = what;
            // first say this rank survived: it may exit before the others look for the dead;
            // then that the generation failed, which ends every member's waits (their watch)
            try {
                job_->scoped.set(gen_.prefix() + "survivor/" + std::to_string(job_rank()), "1");
                job_->scoped.set(failure_key(), std::to_string(job_rank()));
            } catch (const StoreError&) {
            }
            watch_->abort_all();  // this process's other thread, if one waits
            // then close this rank's connections: a survivor blocked on a live peer (a ring
            // step away from the dead) gets an error from it now, not at its timeout
            try {
                ctx_->closeConnections();
            } catch (const std::exception&) {
            }
            failure_->failed = dead_nodes();
            const auto& failed = failure_->failed;
            throw PeerFailure(where() + " failed (" +
                                  (failed.empty() ? std::string("no rank found dead")
                                                  : "dead: rank " + detail::join_ids(failed, ", ")) +
                                  "): " + what,
                              failed);
        }
    }

    // The members of this generation that are gone: declared failed, or not alive (see
    // Membership::alive_in: one whose node id a restarted worker already holds is gone). A
    // killed process closes its sockets before it is seen dead, so the survivors ask again
    // until the lease ends; members that said they survived are not counted, even if they
    // have exited since.
    std::vector<int> dead_nodes() {
        auto& m = job_->members;
        const auto deadline = std::chrono::steady_clock::now() + job_->options.lease;
        std::vector<int> dead;
        auto scan = [&] {
            for (int q : gen_.members) {
                if (q == job_rank() || std::find(dead.begin(), dead.end(), q) != dead.end()) continue;
                if (job_->scoped.get(gen_.prefix() + "survivor/" + std::to_string(q))) continue;
                if (m.declared_failed(gen_.number, q) || !m.alive_in(gen_.number, q)) dead.push_back(q);
            }
        };
        for (scan(); dead.empty() && std::chrono::steady_clock::now() < deadline; scan())
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (!dead.empty()) {  // others killed at the same moment may be a few ms behind
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            scan();
        }
        std::sort(dead.begin(), dead.end());
        return dead;
    }

    std::shared_ptr<Job> job_;
    Generation gen_;
    int rank_ = 0;
    std::shared_ptr<gloo::rendezvous::Context> ctx_;
    std::unique_ptr<detail::GlooWatch> watch_;  // after ctx_: stopped before the connections go
    std::vector<float> scratch_;                // the parts of this rank's slice (allreduce)
    // Set once, on the first failure; calls may run on two threads (see guarded).
    struct Failure {
        std::mutex mutex;
        std::atomic<bool> spent{false};
        std::string reason;
        std::vector<int> failed;
    };
    std::unique_ptr<Failure> failure_ = std::make_unique<Failure>();
};

static_assert(ShrinkableCommunicator<GlooComm>);

}  // namespace fault
