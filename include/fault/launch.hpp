#pragma once
// Where a worker process learns its place in the job: the environment its launcher set.
// ckpt-run sets all of these; Slurm, Kubernetes or torchrun-style launchers set RANK and
// WORLD_SIZE, and the seed's msrun sets MS_NODE_ID and MS_WORKER_NUM, read as aliases.
//
//   RANK (or MS_NODE_ID)           this worker's node id, 0 <= RANK < WORLD_SIZE
//   WORLD_SIZE (or MS_WORKER_NUM)  the number of workers
//   CKPT_STORE                     the store URL (file:///dir, redis://host:port)
//   MS_RECOVERY_PATH               where recovery files go (optional)
//   CKPT_RESTARTS                  how many times ckpt-run restarted this worker (optional)

#include <cstdlib>
#include <optional>
#include <string>

#include "../ckpt/error.hpp"

namespace fault {

/// A worker's place in the job, as its launcher set it in the environment (launch_env() reads it).
struct LaunchEnv {
    int rank = 0;               ///< RANK (or MS_NODE_ID); 0 when no launcher set it
    int world_size = 1;         ///< WORLD_SIZE (or MS_WORKER_NUM); 1 when no launcher set it
    bool launched = false;      ///< whether a launcher set RANK and WORLD_SIZE (or their aliases)
    std::string store;          ///< empty when CKPT_STORE is not set
    std::string recovery_path;  ///< MS_RECOVERY_PATH, or empty
    int restarts = 0;           ///< CKPT_RESTARTS: how often ckpt-run started this worker again

    /// CKPT_STORE, the store every worker of the job meets in; a ConfigError saying how to
    /// set it when no launcher did.
    const std::string& store_url() const {
        if (store.empty())
            throw ckpt::ConfigError(std::string("environment: CKPT_STORE is not set") +
                                    (launched ? "" : ", nor RANK and WORLD_SIZE") +
                                    ": start the workers with ckpt-run (ckpt-run --nproc N --store file:///dir -- PROGRAM), "
                                    "or set CKPT_STORE=file:///dir or redis://host:port with RANK and WORLD_SIZE");
        return store;
    }
};

namespace detail {

inline std::optional<std::string> env(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) return std::nullopt;
    return std::string(v);
}

inline int env_int(const char* name, const std::string& text) {
    std::size_t used = 0;
    int v = 0;
    try {
        v = std::stoi(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != text.size())
        throw ckpt::ConfigError(std::string("environment: ") + name + "='" + text + "' is not an integer");
    return v;
}

// A setting and its alias: they must agree when both are set.
inline std::optional<int> env_pair(const char* name, const char* alias) {
    const auto a = env(name), b = env(alias);
    if (a && b && env_int(name, *a) != env_int(alias, *b))
        throw ckpt::ConfigError(std::string("environment: ") + name + "=" + *a + " and " + alias + "=" + *b + " disagree");
    if (a) return env_int(name, *a);
    if (b) return env_int(alias, *b);
    return std::nullopt;
}

}  // namespace detail

/// Reads the settings above. Without RANK/MS_NODE_ID and WORLD_SIZE/MS_WORKER_NUM the
/// worker is alone (rank 0 of 1). ConfigError naming the variable for anything malformed.
inline LaunchEnv launch_env() {
    LaunchEnv e;
    const auto rank = detail::env_pair("RANK", "MS_NODE_ID");
    const auto world = detail::env_pair("WORLD_SIZE", "MS_WORKER_NUM");
    if (rank.has_value() != world.has_value())
        throw ckpt::ConfigError(std::string("environment: ") + (rank ? "RANK is set but not WORLD_SIZE" : "WORLD_SIZE is set but not RANK") +
                                " (or their aliases MS_NODE_ID, MS_WORKER_NUM)");
    if (rank) {
        e.rank = *rank;
        e.world_size = *world;
        e.launched = true;
    }
    if (e.world_size < 1) throw ckpt::ConfigError("environment: WORLD_SIZE=" + std::to_string(e.world_size) + ": at least 1");
    if (e.rank < 0 || e.rank >= e.world_size)
        throw ckpt::ConfigError("environment: RANK=" + std::to_string(e.rank) + " is not in a world of " +
                                std::to_string(e.world_size));
    e.store = detail::env("CKPT_STORE").value_or("");
    e.recovery_path = detail::env("MS_RECOVERY_PATH").value_or("");
    if (const auto r = detail::env("CKPT_RESTARTS")) e.restarts = detail::env_int("CKPT_RESTARTS", *r);
    return e;
}

}  // namespace fault
