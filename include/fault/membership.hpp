#pragma once
// Membership in a store: which worker processes make up a job, which of them are alive, and
// the generations they train in. It replaces the seed's scheduler process: no rank is
// special, and the store may restart.
//
//   fault::Membership members(store, node_id, world_size, {.cooldown = std::chrono::seconds(30)});
//   auto gen = members.form(members.latest() + 1, fault::Membership::everyone);
//
// A worker claims its node id (a rank of the job) with its process identity and keeps a
// heartbeat. A node id held by a live process is refused to another; one whose process
// died may be claimed again only once the cooldown has passed since its last heartbeat
// (the seed's 30 s): the newcomer waits by itself and logs why. The living are told from
// the dead by their process (same host: /proc) or by their heartbeat (another host: not
// moved for `lease`).
//
// A generation is a numbered group of node ids that train together; its members are
// written once, with an atomic create, by whichever worker sees first that the group is
// complete, so every worker agrees on it. Keys: node/<id>, beat/<id>, latest, g<k>/…
//
// In an elastic job (form_elastic), a generation does not wait long for the dead: the
// survivors go on without a node that is not back within a deadline, and a node that comes
// back later joins the next generation, which the others form at a checkpoint of theirs.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../ckpt/log.hpp"
#include "communicator.hpp"
#include "store.hpp"

namespace fault {

namespace detail {

inline std::string host_name() {
    char buf[256] = {};
    ::gethostname(buf, sizeof buf - 1);
    return buf;
}

// A process as "pid starttime" (starttime from /proc, so that a pid used again by another
// process is not mistaken for the first); empty when it is not running.
inline std::string process_id(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
    if (close == std::string::npos || close + 2 > stat.size()) return {};
    std::istringstream fields(stat.substr(close + 2));
    std::string state, field;
    fields >> state;
    for (int i = 4; i <= 22 && fields >> field; ++i) {}  // field 22: starttime
    if (state == "Z" || state == "X") return {};          // dead, not yet reaped
    return std::to_string(pid) + " " + field;
}

// Whether the process "pid starttime" (as process_id() gave it) is still running.
inline bool process_running(const std::string& id) {
    const auto space = id.find(' ');
    return space != std::string::npos && process_id(static_cast<pid_t>(std::stol(id.substr(0, space)))) == id;
}

inline std::int64_t wall_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// "g<number>/", built by appending (GCC 12 warns falsely on "g" + std::to_string(n) + "/")
inline std::string generation_prefix(int number) {
    std::string g = "g";
    g += std::to_string(number);
    g += '/';
    return g;
}

inline std::string join_ids(const std::vector<int>& ids, const char* sep = ",") {
    std::string s;
    for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
    return s;
}
inline std::vector<int> parse_ids(const std::string& text) {
    std::vector<int> ids;
    std::istringstream in(text);
    for (std::string part; std::getline(in, part, ',');)
        if (!part.empty()) ids.push_back(std::stoi(part));
    return ids;
}

}  // namespace detail

/// How long a heartbeat may stand still, how long a dead node id stays reserved, how long each
/// wait lasts.
struct MembershipOptions {
    std::chrono::milliseconds lease = std::chrono::milliseconds(1500);  ///< a heartbeat not moved this long: dead
    std::chrono::milliseconds cooldown = std::chrono::seconds(30);      ///< before a dead node id is claimed again
    std::chrono::milliseconds timeout = std::chrono::seconds(30);       ///< every wait (the cooldown comes on top)
};

/// A generation: node ids (job ranks, ascending) that train together, and its store prefix.
struct Generation {
    int number = 0;
    std::vector<int> members;
    std::string prefix() const { return detail::generation_prefix(number); }
    /// This node's rank in the generation, or -1.
    int index_of(int node) const {
        const auto it = std::find(members.begin(), members.end(), node);
        return it == members.end() ? -1 : static_cast<int>(it - members.begin());
    }
};

/// This worker's membership of a job, kept in a Store with no scheduler process: it claims its
/// node id with its process identity and a heartbeat, tells live nodes from dead ones, and forms
/// numbered generations that every worker agrees on (GlooComm uses it).
class Membership {
public:
    /// Who may form a generation: every node of the job (a start, or recovery after a
    /// restart), or the survivors of the current one (the dead left out).
    enum Policy { everyone, survivors };

    /// Claims `node_id` with this process's identity (a dead holder's only once the cooldown has
    /// passed since its last heartbeat, waited out here) and starts the heartbeat. ConfigError when a
    /// live process holds it, or the job was started with another world size.
    Membership(Store& store, int node_id, int world_size, MembershipOptions options = {})
        : store_(store), id_(node_id), world_(world_size), options_(options),
          me_(detail::host_name() + " " + detail::process_id(::getpid())) {
        if (world_size < 1) throw ckpt::ConfigError("membership: a world of " + std::to_string(world_size) + " nodes");
        if (node_id < 0 || node_id >= world_size)
            throw ckpt::ConfigError("membership: node id " + std::to_string(node_id) + " is not in a world of " +
                                    std::to_string(world_size));
        if (!store_.create("world_size", std::to_string(world_))) {
            const auto theirs = store_.wait("world_size", options_.timeout);
            if (theirs != std::to_string(world_))
                throw ckpt::ConfigError("membership: node " + std::to_string(id_) + " was started with a world of " +
                                        std::to_string(world_) + " nodes, the job in " + store_.url() + " has " + theirs);
        }
        claim();  // before the first heartbeat: a dead holder's last beat dates its death
        heartbeat_ = std::thread([this] { beat(); });
    }
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;
    /// Stops the heartbeat and gives the node id back: a clean exit needs no cooldown.
    ~Membership() {
        {
            std::lock_guard lock(m_);
            stop_ = true;
        }
        cv_.notify_all();
        if (heartbeat_.joinable()) heartbeat_.join();
        try {
            if (store_.get(node_key(id_)) == me_) store_.erase(node_key(id_));
        } catch (const StoreError&) {
        }
    }

    int node_id() const noexcept { return id_; }
    int world_size() const noexcept { return world_; }
    Store& store() noexcept { return store_; }
    const MembershipOptions& options() const noexcept { return options_; }

    /// Whether node `id`'s process is alive: asked directly on this host; elsewhere, its
    /// heartbeat moved within the lease (as far as this process has watched it).
    bool alive(int id) {
        if (id == id_) return true;
        const auto holder = store_.get(node_key(id));
        if (!holder) return false;
        if (const auto local = local_process(*holder)) return detail::process_running(*local);
        return beating(id);
    }

    /// Whether the process that joined generation `number` as node `id` still runs. One
    /// whose node id another process has taken over since is dead: a restarted worker that
    /// registered at once does not make its predecessor look alive to the survivors.
    bool alive_in(int number, int id) {
        if (id == id_) return true;
        const auto joined = store_.get(detail::generation_prefix(number) + "join/" + std::to_string(id));
        if (joined && store_.get(node_key(id)) != joined) return false;
        return alive(id);
    }

    /// The newest generation formed (0 before the first).
    int latest() {
        const auto v = store_.get("latest");
        return v ? std::stoi(*v) : 0;
    }

    /// Joins generation `number` and waits until it is formed: by every node of the job
    /// (`everyone`), or by each of `expected` that is still alive (`survivors`). Returns it;
    /// PeerFailure if it formed without this node or did not form in time.
    Generation form(int number, Policy policy, const std::vector<int>& expected = {}) {
        // a survivor may still be in a call that ends only at its timeout (see GlooComm), then
        // come: wait twice the timeout, and the cooldown on top for a node started anew
        const auto wait = 2 * options_.timeout + (policy == everyone ? options_.cooldown : std::chrono::milliseconds(0));
        std::vector<int> candidates = expected;
        if (policy == everyone || candidates.empty())
            for (int q = 0; q < world_; ++q) candidates.push_back(q);
        return settle(number, wait, candidates, false, [&](int q) {
            return policy == everyone || (alive(q) && !declared_failed(number - 1, q));
        });
    }

    /// Joins generation `number` of an elastic job and waits until it is formed by whichever
    /// nodes come: every node of the job that is alive (a survivor, or one training in the
    /// current generation, which joins at its next checkpoint) is waited for up to `wait`; a
    /// node that is not (dead, or restarting) only for `dead_wait` from now (in the job's first
    /// generation, one not registered yet as long as `form` waits). Returns it;
    /// PeerFailure if it formed without this node, the job went on to a later generation
    /// meanwhile (as a store restarted empty can make it look), or it did not form in time.
    Generation form_elastic(int number, std::chrono::milliseconds dead_wait, std::chrono::milliseconds wait) {
        std::vector<int> candidates(static_cast<std::size_t>(world_));
        for (int q = 0; q < world_; ++q) candidates[static_cast<std::size_t>(q)] = q;
        const auto now = std::chrono::steady_clock::now();
        const auto dead_until = now + dead_wait;
        // the job's first generation: a node not registered yet is starting, not dead (its
        // process may start late on a busy host); it is waited for as long as `form` would
        const auto start_wait = std::max(dead_wait, 2 * options_.timeout + options_.cooldown);
        const auto start_until = now + start_wait;
        return settle(number, std::max({wait, dead_wait, number == 1 ? start_wait : dead_wait}), candidates, true,
                      [&](int q) {
                          if (alive(q) && !declared_failed(number - 1, q)) return true;
                          const auto t = std::chrono::steady_clock::now();
                          if (number == 1 && !store_.get(node_key(q))) return t < start_until;
                          return t < dead_until;
                      });
    }

    /// The nodes that have joined generation `number` (ascending): in an elastic job, workers
    /// waiting to be taken in while the generation before it trains.
    std::vector<int> joined(int number) {
        std::vector<int> ids;
        const std::string g = detail::generation_prefix(number);
        for (int q = 0; q < world_; ++q)
            if (store_.get(g + "join/" + std::to_string(q))) ids.push_back(q);
        return ids;
    }

    /// Marks this node failed in generation `number`: survivors forming the next one do
    /// not wait for it.
    void declare_failed(int number) { store_.set(failed_key(number, id_), "1"); }
    bool declared_failed(int number, int id) { return store_.get(failed_key(number, id)).has_value(); }

private:
    // Joins generation `number` and waits until its members are written: by the first node
    // to see every candidate either joined or not to be waited for (`wait_for(q)` false).
    // `passed_by`: give up when the job's latest generation reaches `number` without it.
    template <class WaitFor>
    Generation settle(int number, std::chrono::milliseconds wait, std::vector<int> candidates, bool passed_by,
                      WaitFor wait_for) {
        const std::string g = detail::generation_prefix(number);
        if (const int newest = latest(); number <= newest && !store_.get(g + "join/" + std::to_string(id_)))
            throw PeerFailure("node " + std::to_string(id_) + " asks to join generation " + std::to_string(number) +
                                  ", but the job in " + store_.url() + " has gone on to generation " + std::to_string(newest) +
                                  " without it: this worker fell behind; restart it to join the next one",
                              {id_});
        store_.set(g + "join/" + std::to_string(id_), me_);
        const auto deadline = std::chrono::steady_clock::now() + wait;
        std::sort(candidates.begin(), candidates.end());
        candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
        std::vector<int> missing;
        for (;;) {
            if (const auto m = store_.get(g + "members")) {
                Generation gen{number, detail::parse_ids(*m)};
                if (gen.index_of(id_) < 0)
                    throw PeerFailure("generation " + std::to_string(number) + " formed without node " + std::to_string(id_) +
                                          " (members " + *m + ")",
                                      {id_});
                if (latest() < number) store_.set("latest", std::to_string(number));
                if (latest_seen_.load() < number) latest_seen_.store(number);
                return gen;
            }
            // members are written before "latest": a generation formed since the look above is
            // taken by the next one; one the job passed without this node is given up
            if (const int newest = latest(); passed_by && newest >= number) {
                if (store_.get(g + "members")) continue;
                throw PeerFailure("generation " + std::to_string(number) + " on node " + std::to_string(id_) +
                                      ": the job in " + store_.url() + " went on to generation " + std::to_string(newest),
                                  {id_});
            }
            std::vector<int> in;
            missing.clear();
            for (int q : candidates) {
                if (store_.get(g + "join/" + std::to_string(q))) in.push_back(q);
                else if (wait_for(q)) missing.push_back(q);
            }
            if (missing.empty() && !in.empty()) {
                store_.create(g + "members", detail::join_ids(in));  // the first to see it complete decides
                continue;
            }
            if (std::chrono::steady_clock::now() >= deadline)
                throw PeerFailure("generation " + std::to_string(number) + " on node " + std::to_string(id_) + ": node" +
                                      (missing.size() == 1 ? " " : "s ") + detail::join_ids(missing, ", ") +
                                      " did not join within " + std::to_string(wait.count()) + " ms (" + store_.url() + ")",
                                  missing);
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }

    static std::string node_key(int id) { return "node/" + std::to_string(id); }
    static std::string beat_key(int id) { return "beat/" + std::to_string(id); }
    static std::string failed_key(int number, int id) { return detail::generation_prefix(number) + "failed/" + std::to_string(id); }

    // "pid starttime" of a holder on this host, or nothing for another host's.
    std::optional<std::string> local_process(const std::string& holder) const {
        const auto space = holder.find(' ');
        if (space == std::string::npos || holder.substr(0, space) != detail::host_name()) return std::nullopt;
        return holder.substr(space + 1);
    }

    // Whether node `id`'s heartbeat moved within the lease, by this process's watch. Called
    // from the training thread and from GlooComm's watch thread at once.
    bool beating(int id) {
        const auto now = std::chrono::steady_clock::now();
        const std::string v = store_.get(beat_key(id)).value_or("");
        std::lock_guard lock(watched_mutex_);
        auto& w = watched_[id];
        if (!w.seen || w.value != v) w = {true, v, now};
        return now - w.since < options_.lease;
    }

    // Claims node/<id>; waits out the cooldown of a dead holder; refuses a live one within a
    // lease (time for a predecessor that is just exiting to be gone), not the whole timeout:
    // two workers started with one node id are a mistake to name at once.
    void claim() {
        const auto deadline = std::chrono::steady_clock::now() + std::min(options_.timeout, options_.lease);
        for (;;) {
            if (store_.create(node_key(id_), me_)) return;
            const auto holder = store_.get(node_key(id_));
            if (!holder) continue;  // given back meanwhile
            if (*holder == me_) return;
            if (holder_alive(*holder)) {
                if (std::chrono::steady_clock::now() >= deadline)
                    throw ckpt::ConfigError("membership: node id " + std::to_string(id_) + " in " + store_.url() +
                                            " is held by a live worker (host, pid, start: " + *holder +
                                            "); two workers with one node id?");
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                continue;
            }
            // the holder died: the cooldown runs from its last heartbeat
            const auto last = last_beat_wall(id_);
            const auto left = std::chrono::milliseconds(options_.cooldown.count() - (detail::wall_ms() - last));
            if (left.count() > 0) {
                ckpt::detail::log(ckpt::LogLevel::warning,
                                  "membership: node id " + std::to_string(id_) + " was held by a process that died " +
                                      std::to_string((detail::wall_ms() - last) / 1000.0).substr(0, 5) +
                                      " s ago; waiting " + std::to_string(left.count()) +
                                      " ms (the cooldown) before registering it again");
                std::this_thread::sleep_for(left);
            }
            // one newcomer takes over a given dead holder
            if (store_.create("takeover/" + std::to_string(id_) + "/" + *holder, me_)) {
                store_.set(node_key(id_), me_);
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
    // A holder of our node id: alive if its process runs (this host) or its heartbeat moves.
    bool holder_alive(const std::string& holder) {
        if (const auto local = local_process(holder)) return detail::process_running(*local);
        // another host: watch its heartbeat for a lease
        const std::string first = store_.get(beat_key(id_)).value_or("");
        std::this_thread::sleep_for(options_.lease);
        return store_.get(beat_key(id_)).value_or("") != first;
    }
    std::int64_t last_beat_wall(int id) {
        const std::string v = store_.get(beat_key(id)).value_or("");
        const auto space = v.find(' ');
        if (space == std::string::npos) return 0;  // never beat: no cooldown to wait
        return std::stoll(v.substr(space + 1));
    }

    void beat() {
        std::unique_lock lock(m_);
        const auto period = std::max(options_.lease / 5, std::chrono::milliseconds(10));
        while (!stop_) {
            lock.unlock();
            try {
                store_.set(beat_key(id_), std::to_string(++beats_) + " " + std::to_string(detail::wall_ms()));
                republish();
            } catch (const StoreError&) {  // the store is away: the next beat tries again
            }
            lock.lock();
            cv_.wait_for(lock, period, [&] { return stop_; });
        }
    }

    // A store restarted without persistence has lost the job's keys: each worker sets again
    // what it knows (its node id, the world size, the newest generation it saw).
    void republish() {
        if (!store_.get(node_key(id_))) {
            if (store_.create(node_key(id_), me_))
                ckpt::detail::log(ckpt::LogLevel::warning, "membership: the store " + store_.url() + " lost node id " +
                                                               std::to_string(id_) + "; registered it again");
        }
        store_.create("world_size", std::to_string(world_));
        const int seen = latest_seen_.load();
        if (seen > 0) {
            const auto v = store_.get("latest");
            if (!v || std::stoi(*v) < seen) store_.set("latest", std::to_string(seen));
        }
    }

    struct Watch {
        bool seen = false;
        std::string value;
        std::chrono::steady_clock::time_point since;
    };

    Store& store_;
    int id_, world_;
    MembershipOptions options_;
    std::string me_;  // "host pid starttime"
    std::map<int, Watch> watched_;
    std::mutex watched_mutex_;
    std::mutex m_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::uint64_t beats_ = 0;
    std::atomic<int> latest_seen_{0};  // the newest generation this worker was part of
    std::thread heartbeat_;
};

}  // namespace fault
