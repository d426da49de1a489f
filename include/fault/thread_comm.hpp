#pragma once
// ThreadComm: the Communicator for ranks that are threads of one process, the embedded
// default (tests, single-machine data parallelism, the examples).
//
//   fault::ThreadGroup group(4, std::chrono::seconds(10));
//   fault::run_ranks(group, [&](fault::ThreadComm& comm) {
//       comm.allreduce(grads, fault::ReduceOp::mean);
//   }).rethrow();   // the first rank's error, if any rank failed
//
// Every call copies its buffer in and its result out, as a transport between processes
// would. Calls are matched by order: the k-th collective of every rank is one collective,
// and ranks calling different collectives at the same position is an error. A rank marked
// failed (ThreadGroup::fail, or run_ranks when its function throws) makes every call that
// needs it throw PeerFailure on the other ranks; so does a rank that has not arrived when
// the timeout expires.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../ckpt/log.hpp"
#include "communicator.hpp"

namespace fault {

class ThreadComm;

/// The shared state of N in-process ranks.
class ThreadGroup {
public:
    explicit ThreadGroup(int size, std::chrono::milliseconds timeout = std::chrono::seconds(30))
        : ThreadGroup(identity(size), timeout) {}
    /// A group whose rank i is rank `ranks[i]` of the original job (see ThreadComm::shrink).
    ThreadGroup(std::vector<int> ranks, std::chrono::milliseconds timeout)
        : size_(static_cast<int>(ranks.size())), timeout_(timeout), job_ranks_(std::move(ranks)),
          state_(job_ranks_.size(), State::active) {
        if (size_ < 1) throw ckpt::ConfigError("a ThreadGroup needs at least 1 rank, got " + std::to_string(size_));
        if (timeout.count() <= 0) throw ckpt::ConfigError("a ThreadGroup needs a positive timeout");
    }
    ThreadGroup(const ThreadGroup&) = delete;
    ThreadGroup& operator=(const ThreadGroup&) = delete;

    int size() const noexcept { return size_; }
    std::chrono::milliseconds timeout() const noexcept { return timeout_; }
    /// The job rank of this group's rank i (they differ in a group made by shrink()).
    int job_rank(int i) const { return job_ranks_.at(static_cast<std::size_t>(i)); }

    /// Marks `rank` failed: calls on other ranks that need it throw PeerFailure naming it.
    void fail(int rank) { set_state(rank, State::failed); }
    /// Marks `rank` as gone after a failure elsewhere (it gave up with PeerFailure): calls
    /// that need it still fail, but name the ranks that failed first.
    void leave(int rank) { set_state(rank, State::left); }
    /// Asks every rank to stop for a repair of `rank`: their calls throw Interrupted until
    /// all active ranks have called rejoin().
    void interrupt(int rank) {
        {
            std::lock_guard lock(m_);
            if (!interrupted_by_) interrupted_by_ = rank;
        }
        cv_.notify_all();
    }
    bool failed(int rank) const {
        std::lock_guard lock(m_);
        return state_.at(static_cast<std::size_t>(rank)) == State::failed;
    }
    std::vector<int> failed_ranks() const {
        std::lock_guard lock(m_);
        std::vector<int> out;
        for (int r = 0; r < size_; ++r)
            if (state_[static_cast<std::size_t>(r)] == State::failed) out.push_back(r);
        return out;
    }

private:
    friend class ThreadComm;
    static std::vector<int> identity(int n) {
        std::vector<int> v(static_cast<std::size_t>(std::max(n, 0)));
        for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
        return v;
    }
    // The group of the ranks still active, the same object for every caller; nullptr when
    // `rank` itself is not active.
    std::shared_ptr<ThreadGroup> survivors(int rank) {
        std::lock_guard lock(m_);
        if (state_.at(static_cast<std::size_t>(rank)) != State::active) return nullptr;
        if (!survivors_) {
            std::vector<int> members;
            for (int q = 0; q < size_; ++q)
                if (state_[static_cast<std::size_t>(q)] == State::active) members.push_back(job_ranks_[static_cast<std::size_t>(q)]);
            survivors_ = std::make_shared<ThreadGroup>(std::move(members), timeout_);
        }
        return survivors_;
    }
    // After interrupt(): returns once every active rank has called it (or throws
    // PeerFailure at the timeout); the calls in progress are abandoned and numbering
    // starts again from 0.
    void rejoin(int rank) {
        std::unique_lock lock(m_);
        const std::uint64_t gen = generation_;
        ++rejoined_;
        auto active = [&] {
            return static_cast<int>(std::count(state_.begin(), state_.end(), State::active));
        };
        if (rejoined_ >= active()) {
            start_generation();
            return;
        }
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        if (!cv_.wait_until(lock, deadline, [&] { return generation_ != gen || rejoined_ >= active(); })) {
            --rejoined_;
            throw PeerFailure("rejoin on rank " + std::to_string(job_rank(rank)) + ": not every rank rejoined within " +
                                  std::to_string(timeout_.count()) + " ms",
                              {});
        }
        if (generation_ == gen) start_generation();  // the last active rank failed instead of rejoining
    }
    // Under the lock: abandons the calls in progress and numbers calls afresh.
    void start_generation() {
        rounds_.clear();
        interrupted_by_.reset();
        rejoined_ = 0;
        ++generation_;
        cv_.notify_all();
    }
    Interrupted interruption(const std::string& call) const {
        return Interrupted(call + ": rank " + std::to_string(job_rank(*interrupted_by_)) +
                               " asked every rank to stop for a repair",
                           job_rank(*interrupted_by_));
    }

    enum class State { active, failed, left };
    // A rank failing here after the survivors' group was made (a second failure noticed
    // late) fails there too, so that its survivors do not wait for it until the timeout.
    void set_state(int rank, State st) {
        std::shared_ptr<ThreadGroup> next;
        {
            std::lock_guard lock(m_);
            State& cur = state_.at(static_cast<std::size_t>(rank));
            if (cur != State::failed) cur = st;
            next = survivors_;
        }
        cv_.notify_all();
        if (!next) return;
        const int job = job_rank(rank);
        for (int i = 0; i < next->size(); ++i)
            if (next->job_rank(i) == job) next->set_state(i, st);
    }
    enum class Kind { allreduce_sum, allreduce_mean, broadcast, allgather, barrier };
    static const char* name(Kind k) {
        switch (k) {
            case Kind::allreduce_sum: return "allreduce(sum)";
            case Kind::allreduce_mean: return "allreduce(mean)";
            case Kind::broadcast: return "broadcast";
            case Kind::allgather: return "allgather";
            case Kind::barrier: return "barrier";
        }
        return "?";
    }
    struct Round {
        Kind kind;
        int root = 0;
        std::size_t count = 0;  // floats each rank passes
        std::vector<bool> arrived;
        int arrivals = 0, reduced = 0, departures = 0;
        std::vector<int> gave_up;  // ranks that left it with PeerFailure: it can no longer complete
    };

    // Runs collective number `seq` for `rank`: `in` is this rank's contribution, `out`
    // receives the result. Each rank copies its data into its own slot, the ranks reduce
    // one slice of the result each once all are in (adding in rank order), and each copies
    // the result out: the slots and the result are reused from call to call, and no copy
    // is made under the lock. A slot is rewritten only once every rank has left the
    // previous call; the result only once every rank has arrived at the next.
    void collective(int rank, std::uint64_t seq, Kind kind, int root, std::span<const float> in, std::span<float> out) {
        auto call = [&] {  // for messages only: this runs in every training step
            return std::string(name(kind)) + " #" + std::to_string(seq) + " on rank " + std::to_string(job_rank(rank));
        };
        std::unique_lock lock(m_);
        Round& r = rounds_[seq];
        if (r.arrived.empty()) {
            r.kind = kind;
            r.root = root;
            r.count = in.size();
            r.arrived.assign(static_cast<std::size_t>(size_), false);
        } else if (r.kind != kind || r.root != root || (kind != Kind::broadcast && r.count != in.size())) {
            throw ckpt::ConfigError("collective #" + std::to_string(seq) + ": rank " + std::to_string(rank) + " called " +
                                    describe(kind, root, in.size()) + ", another rank " +
                                    describe(r.kind, r.root, r.count));
        }
        if (interrupted_by_) {
            r.gave_up.push_back(rank);
            r.arrived[static_cast<std::size_t>(rank)] = true;
            ++r.arrivals;
            finish(seq, r);
            throw interruption(call());
        }
        if (!r.gave_up.empty()) {  // a late arrival: the others already gave up on this call
            const auto who = to_job(r.gave_up);
            r.arrived[static_cast<std::size_t>(rank)] = true;
            ++r.arrivals;
            finish(seq, r);
            if (any_gone()) throw gone_error(call());
            throw PeerFailure(call() + ": arrived after " + ranks_text(who) + " gave up on it", who);
        }
        if (kind != Kind::broadcast || rank == root) {
            // Slots are read until every rank has left the call that filled them: this
            // rank's slot may be rewritten once the previous call is over for all.
            const auto until = std::chrono::steady_clock::now() + timeout_;
            // a rank gone before arriving here: this call cannot complete
            auto hopeless = [&] {
                for (int q = 0; q < size_; ++q)
                    if (state_[static_cast<std::size_t>(q)] != State::active && !r.arrived[static_cast<std::size_t>(q)])
                        return true;
                return false;
            };
            if (!cv_.wait_until(lock, until,
                                [&] { return seq == 0 || !rounds_.count(seq - 1) || hopeless() || interrupted_by_; })) {
                r.gave_up.push_back(rank);
                finish(seq, r);
                throw PeerFailure(call() + ": ranks still in the previous call after " + std::to_string(timeout_.count()) +
                                      " ms",
                                  {});
            }
            // This call cannot complete: give up before touching the slot, which ranks still
            // in the previous call may be reading.
            if (hopeless() || interrupted_by_) {
                r.gave_up.push_back(rank);
                r.arrived[static_cast<std::size_t>(rank)] = true;
                ++r.arrivals;
                finish(seq, r);
                if (interrupted_by_) throw interruption(call());
                throw gone_error(call());
            }
            lock.unlock();
            slots_[static_cast<std::size_t>(rank)].assign(in.begin(), in.end());
            lock.lock();
        }
        r.arrived[static_cast<std::size_t>(rank)] = true;
        ++r.arrivals;
        cv_.notify_all();
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        auto absent = [&](bool gone_only) {
            std::vector<int> who;
            for (int q = 0; q < size_; ++q)
                if (!r.arrived[static_cast<std::size_t>(q)] &&
                    (!gone_only || state_[static_cast<std::size_t>(q)] != State::active))
                    who.push_back(q);
            return who;
        };
        // Complete once every rank's data is in, even if a rank fails afterwards.
        while (r.arrivals < size_) {
            if (interrupted_by_) {
                r.gave_up.push_back(rank);
                finish(seq, r);
                throw interruption(call());
            }
            if (!absent(true).empty()) {
                r.gave_up.push_back(rank);
                finish(seq, r);
                throw gone_error(call());
            }
            if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && r.arrivals < size_ && absent(true).empty() &&
                !interrupted_by_) {
                const auto late = to_job(absent(false));
                r.gave_up.push_back(rank);
                finish(seq, r);
                throw PeerFailure(call() + ": " + ranks_text(late) + " did not arrive within " +
                                      std::to_string(timeout_.count()) + " ms",
                                  late);
            }
        }
        const bool reducing = kind == Kind::allreduce_sum || kind == Kind::allreduce_mean;
        if (reducing) {
            // the first rank here sizes the result, before any rank writes to it; nobody reads
            // it now, every rank having left the previous call
            if (result_.size() != r.count) result_.resize(r.count);
            lock.unlock();
            reduce_slice(kind, rank, r.count);
            lock.lock();
            ++r.reduced;
            cv_.notify_all();
            // the result is whole once every rank reduced its slice; all of them are here
            if (!cv_.wait_until(lock, std::chrono::steady_clock::now() + timeout_, [&] { return r.reduced == size_; })) {
                finish(seq, r);
                throw PeerFailure(call() + ": the reduction did not finish within " + std::to_string(timeout_.count()) + " ms",
                                  {});
            }
        }
        lock.unlock();
        switch (kind) {
            case Kind::allreduce_sum:
            case Kind::allreduce_mean: std::copy(result_.begin(), result_.end(), out.begin()); break;
            case Kind::broadcast: {
                const auto& from = slots_[static_cast<std::size_t>(root)];
                if (from.size() != out.size()) {
                    lock.lock();
                    finish(seq, r);
                    throw ckpt::ConfigError("broadcast: rank " + std::to_string(job_rank(root)) + " sent " +
                                            std::to_string(from.size()) + " floats, rank " +
                                            std::to_string(job_rank(rank)) + " expected " + std::to_string(out.size()));
                }
                std::copy(from.begin(), from.end(), out.begin());
                break;
            }
            case Kind::allgather:
                for (const auto& part : slots_) out = std::span<float>(std::copy(part.begin(), part.end(), out.begin()), out.end());
                break;
            case Kind::barrier: break;
        }
        lock.lock();
        finish(seq, r);
    }

    // Slice `rank` of the reduction into result_, adding the slots in rank order so the
    // bits do not depend on arrival order.
    void reduce_slice(Kind kind, int rank, std::size_t count) {
        const std::size_t n = static_cast<std::size_t>(size_);
        const std::size_t lo = count * static_cast<std::size_t>(rank) / n, hi = count * (static_cast<std::size_t>(rank) + 1) / n;
        float* dst = result_.data();
        std::copy(slots_[0].begin() + static_cast<std::ptrdiff_t>(lo), slots_[0].begin() + static_cast<std::ptrdiff_t>(hi),
                  dst + lo);
        for (std::size_t q = 1; q < n; ++q) {
            const float* src = slots_[q].data();
            for (std::size_t i = lo; i < hi; ++i) dst[i] += src[i];
        }
        if (kind == Kind::allreduce_mean) {
            const auto div = static_cast<float>(size_);
            for (std::size_t i = lo; i < hi; ++i) dst[i] /= div;
        }
    }

    // Point to point is a rendezvous: the sender posts its buffer and waits while the
    // receiver copies straight out of it, once, outside the lock; no message is buffered, so
    // a large state costs one copy, not an allocation and two copies under the group's lock.
    void send(int src, int dst, int tag, std::span<const float> data) {
        check_peer(dst, "send");
        auto call = [&] {  // for messages only
            return "send on rank " + std::to_string(job_rank(src)) + " to rank " + std::to_string(job_rank(dst)) + " (tag " +
                   std::to_string(tag) + ")";
        };
        Post post{data, Post::State::posted, 0};
        const auto key = std::make_tuple(src, dst, tag);
        std::unique_lock lock(m_);
        auto& queue = mail_[key];
        queue.push_back(&post);
        cv_.notify_all();
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        auto withdraw = [&] {
            auto& q = mail_[key];
            q.erase(std::find(q.begin(), q.end(), &post));
            if (q.empty()) mail_.erase(key);
        };
        for (;;) {
            switch (post.state) {
                case Post::State::received: return;
                case Post::State::refused:
                    throw ckpt::ConfigError(call() + ": sent " + std::to_string(data.size()) + " floats, rank " +
                                            std::to_string(job_rank(dst)) + " expected " + std::to_string(post.expected));
                case Post::State::copying: cv_.wait(lock); continue;  // the copy is under way: it ends
                case Post::State::posted: break;
            }
            if (state_[static_cast<std::size_t>(dst)] != State::active) {
                withdraw();
                throw gone_error(call());
            }
            if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && post.state == Post::State::posted) {
                withdraw();
                throw PeerFailure(call() + ": not received within " + std::to_string(timeout_.count()) + " ms", {job_rank(dst)});
            }
        }
    }

    void recv(int src, int dst, int tag, std::span<float> data) {
        check_peer(src, "recv");
        std::unique_lock lock(m_);
        const auto key = std::make_tuple(src, dst, tag);
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        for (;;) {
            if (auto it = mail_.find(key); it != mail_.end()) {
                Post* post = it->second.front();
                it->second.pop_front();
                if (it->second.empty()) mail_.erase(it);
                if (post->data.size() != data.size()) {
                    post->state = Post::State::refused;
                    post->expected = data.size();
                    cv_.notify_all();
                    throw ckpt::ConfigError("recv on rank " + std::to_string(job_rank(dst)) + ": expected " +
                                            std::to_string(data.size()) + " floats from rank " + std::to_string(job_rank(src)) +
                                            " (tag " + std::to_string(tag) + "), it sent " + std::to_string(post->data.size()));
                }
                post->state = Post::State::copying;  // the sender waits, so its buffer stays valid
                lock.unlock();
                std::copy(post->data.begin(), post->data.end(), data.begin());
                lock.lock();
                post->state = Post::State::received;
                cv_.notify_all();
                return;
            }
            if (state_[static_cast<std::size_t>(src)] != State::active)
                throw gone_error("recv on rank " + std::to_string(job_rank(dst)) + " from rank " + std::to_string(job_rank(src)));
            if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !mail_.count(key))
                throw PeerFailure("recv on rank " + std::to_string(job_rank(dst)) + ": nothing from rank " + std::to_string(job_rank(src)) +
                                      " (tag " + std::to_string(tag) + ") within " + std::to_string(timeout_.count()) +
                                      " ms",
                                  {job_rank(src)});
        }
    }

    // PeerFailure for a call that cannot complete because ranks are gone: it names the
    // ranks that failed (those that only left after a failure are mentioned, not blamed).
    PeerFailure gone_error(const std::string& call) const {
        std::vector<int> failed, left;
        for (int q = 0; q < size_; ++q) {
            if (state_[static_cast<std::size_t>(q)] == State::failed) failed.push_back(job_rank(q));
            if (state_[static_cast<std::size_t>(q)] == State::left) left.push_back(job_rank(q));
        }
        std::string what = call + ": ";
        if (!failed.empty()) what += ranks_text(failed) + " failed";
        if (!left.empty()) what += std::string(failed.empty() ? "" : "; ") + ranks_text(left) + " left";
        return PeerFailure(what, failed.empty() ? left : failed);
    }

    std::vector<int> to_job(std::vector<int> ranks) const {
        for (int& r : ranks) r = job_rank(r);
        return ranks;
    }
    bool any_gone() const {
        return std::any_of(state_.begin(), state_.end(), [](State st) { return st != State::active; });
    }

    void check_peer(int peer, const char* what) const {
        if (peer < 0 || peer >= size_)
            throw ckpt::ConfigError(std::string(what) + ": rank " + std::to_string(peer) + " is not in a group of " +
                                    std::to_string(size_));
    }
    static std::string ranks_text(const std::vector<int>& ranks) {
        std::string s = ranks.size() == 1 ? "rank " : "ranks ";
        for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
        return s;
    }
    static std::string describe(Kind k, int root, std::size_t count) {
        std::string s = std::string(name(k)) + " of " + std::to_string(count) + " floats";
        if (k == Kind::broadcast) s += " from rank " + std::to_string(root);
        return s;
    }
    // The rank leaves round `seq` (the lock is held); the last one out removes it.
    void finish(std::uint64_t seq, Round& r) {
        if (++r.departures == size_) rounds_.erase(seq);
    }
    int size_;
    std::chrono::milliseconds timeout_;
    std::vector<int> job_ranks_;
    std::shared_ptr<ThreadGroup> survivors_;  // made by the first shrink() after a failure
    mutable std::mutex m_;
    std::condition_variable cv_;
    std::vector<State> state_;
    std::map<std::uint64_t, Round> rounds_;
    std::vector<std::vector<float>> slots_ = std::vector<std::vector<float>>(static_cast<std::size_t>(size_));
    std::vector<float> result_;
    std::optional<int> interrupted_by_;  // set by interrupt(), cleared when all rejoined
    std::uint64_t generation_ = 0;
    int rejoined_ = 0;
    struct Post {  // a send waiting for its receiver
        enum class State { posted, copying, received, refused };
        std::span<const float> data;
        State state;
        std::size_t expected;  // what the receiver expected, when it refused a wrong size
    };
    std::map<std::tuple<int, int, int>, std::deque<Post*>> mail_;  // (src, dst, tag) -> sends in order
};

/// One rank's handle on a ThreadGroup.
class ThreadComm {
public:
    ThreadComm(ThreadGroup& group, int rank) : group_(&group), rank_(rank) {
        if (rank < 0 || rank >= group.size())
            throw ckpt::ConfigError("rank " + std::to_string(rank) + " is not in a group of " + std::to_string(group.size()));
    }
    ThreadComm(std::shared_ptr<ThreadGroup> group, int rank) : ThreadComm(*group, rank) { owned_ = std::move(group); }
    int rank() const noexcept { return rank_; }
    int size() const noexcept { return group_->size(); }
    /// This rank's number in the original job (equal to rank() until a shrink()).
    int job_rank() const { return group_->job_rank(rank_); }
    ThreadGroup& group() noexcept { return *group_; }

    /// Declares this rank failed: the other ranks' calls that need it throw PeerFailure.
    void declare_failed() { group_->fail(rank_); }

    /// Asks every rank to stop for a repair of this one (their calls throw Interrupted).
    void interrupt() { group_->interrupt(rank_); }
    /// After an interrupt: waits for every active rank to rejoin, then starts a fresh
    /// numbering of calls; the calls that were in progress are abandoned.
    void rejoin() {
        group_->rejoin(rank_);
        seq_ = 0;
    }

    /// After a failure: a communicator over the ranks that are still active (ranks
    /// renumbered from 0 in job order; job_rank() keeps the original number). Every
    /// survivor gets the same group, made when the first of them asks, from the ranks not
    /// failed or left at that moment. Throws PeerFailure if this rank is not active.
    ThreadComm shrink() {
        auto next = group_->survivors(rank_);
        if (!next) throw PeerFailure("rank " + std::to_string(job_rank()) + " is no longer active", {job_rank()});
        const int me = job_rank();
        for (int i = 0; i < next->size(); ++i)
            if (next->job_rank(i) == me) return ThreadComm(std::move(next), i);
        throw PeerFailure("rank " + std::to_string(me) + " is not among the survivors", {me});
    }

    void allreduce(std::span<float> data, ReduceOp op) {
        const auto kind = op == ReduceOp::sum ? ThreadGroup::Kind::allreduce_sum : ThreadGroup::Kind::allreduce_mean;
        group_->collective(rank_, seq_++, kind, 0, data, data);
    }
    void broadcast(std::span<float> data, int root) {
        group_->check_peer(root, "broadcast");
        group_->collective(rank_, seq_++, ThreadGroup::Kind::broadcast, root, data, data);
    }
    void allgather(std::span<const float> in, std::span<float> out) {
        if (out.size() != in.size() * static_cast<std::size_t>(size()))
            throw ckpt::ConfigError("allgather: the output holds " + std::to_string(out.size()) + " floats, " +
                                    std::to_string(size()) + " ranks of " + std::to_string(in.size()) + " need " +
                                    std::to_string(in.size() * static_cast<std::size_t>(size())));
        group_->collective(rank_, seq_++, ThreadGroup::Kind::allgather, 0, in, out);
    }
    void barrier() { group_->collective(rank_, seq_++, ThreadGroup::Kind::barrier, 0, {}, {}); }
    void send(std::span<const float> data, int dst, int tag) { group_->send(rank_, dst, tag, data); }
    void recv(std::span<float> data, int src, int tag) { group_->recv(src, rank_, tag, data); }

private:
    ThreadGroup* group_;
    std::shared_ptr<ThreadGroup> owned_;  // keeps a shrunk group alive
    int rank_;
    std::uint64_t seq_ = 0;
};

static_assert(RecoverableCommunicator<ThreadComm>);

/// What run_ranks returns: each rank's exception, or null where the rank returned. It must
/// be looked at ([[nodiscard]]): rethrow() rethrows the failure that ended the run.
class [[nodiscard]] RankErrors : public std::vector<std::exception_ptr> {
public:
    using std::vector<std::exception_ptr>::vector;

    /// Whether any rank threw.
    bool any() const {
        return std::any_of(begin(), end(), [](const std::exception_ptr& e) { return e != nullptr; });
    }

    /// Rethrows the failure that ended the run: the first rank's own error, before the
    /// PeerFailures the others saw because of it. Returns when every rank returned.
    void rethrow() const {
        for (const auto& e : *this)
            if (e && !detail::holds<PeerFailure>(e)) std::rethrow_exception(e);
        for (const auto& e : *this)
            if (e) std::rethrow_exception(e);
    }
};

/// Runs fn(comm) on every rank of `group`, each on its own thread, and waits for all. A rank
/// whose fn throws is marked failed (so the others get PeerFailure instead of waiting), or
/// as having left when what it threw was a PeerFailure; each failure is logged (a notice:
/// printed by default) and the result holds each rank's exception, or null. Look at it:
/// `fault::run_ranks(group, fn).rethrow();` ends the program with the first rank's error.
inline RankErrors run_ranks(ThreadGroup& group, const std::function<void(ThreadComm&)>& fn) {
    RankErrors errors(static_cast<std::size_t>(group.size()));
    std::vector<std::thread> threads;
    for (int r = 0; r < group.size(); ++r)
        threads.emplace_back([&, r] {
            ThreadComm comm(group, r);
            try {
                fn(comm);
            } catch (const PeerFailure& e) {
                errors[static_cast<std::size_t>(r)] = std::current_exception();
                group.leave(r);
                ckpt::detail::log(ckpt::LogLevel::info, "rank " + std::to_string(r) + " stopped: " + e.what());
            } catch (...) {
                errors[static_cast<std::size_t>(r)] = std::current_exception();
                group.fail(r);
                ckpt::detail::log(ckpt::LogLevel::notice,
                                  "rank " + std::to_string(r) + " failed: " + ckpt::detail::message_of(std::current_exception()));
            }
        });
    for (auto& t : threads) t.join();
    return errors;
}

}  // namespace fault
