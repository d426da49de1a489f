#pragma once
// UCE in-place repair (the seed's UCE fault recovery): when a rank's device reports an
// uncorrectable memory error, every rank stops where it stands, the rank's device is
// stopped, cleaned and repaired, the parameters and optimizer state are copied to it from a
// healthy replica, and training goes on in the same process: the interrupted step is redone
// (or, if a replica already completed it, taken as done). There is no controller; rank 0
// may be the one repaired.
//
//   fault::AscendModel device(rank);
//   fault::attach(device, trainer.load_target());        // parameters and optimizer state live there
//   fault::UceRepair repair(comm, device);
//   trainer.train(epochs, data, nn::callbacks(repair, …));
//
// The damaged rank raises DeviceMemoryError on the first operation touching the damaged
// memory (UceRepair touches every attached tensor when a step begins, as its forward pass
// would) and interrupts the other ranks; they meet in Communicator::rejoin() and exchange
// what they hold. Every rank that is damaged, torn inside an update or a step behind gets
// the state of a healthy rank keeping the same piece of the optimizer state at the newest
// step (the ReplicaSelector picks it among them), sent to it alone. When some rank has no
// such replica, or its device cannot be repaired, that rank declares itself failed
// (RepairFailed) and the others fail the step with PeerFailure: a LastWordsCheckpoint among
// the callbacks then saves what the survivors hold.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../ckpt/log.hpp"
#include "../ckpt/param_dict.hpp"
#include "../nn/callbacks.hpp"
#include "backend.hpp"
#include "communicator.hpp"
#include "data_parallel.hpp"
#include "replica_selector.hpp"

namespace fault {

/// Attaches every float32 tensor of `views` (for instance Trainer::load_target(): the
/// parameters and the optimizer state) to the backend, under its checkpoint name.
template <Backend B>
void attach(B& backend, ckpt::ParamDict views) {
    for (auto& [name, value] : views)
        if (ckpt::Tensor* t = value.template get_if<ckpt::Tensor>(); t && t->dtype() == ckpt::DType::float32)
            backend.attach(name, t->values<float>());
}

/// One repair, as a rank saw it.
struct RepairRecord {
    int repaired_rank = -1;         ///< the job rank whose device was repaired (-1: none was damaged)
    int source_rank = -1;           ///< the replica that rank's state was copied from
    std::int64_t global_step = 0;   ///< the step the state was at
    bool redone = true;             ///< the interrupted step was run again (else taken as done)
    double seconds = 0;             ///< from the error's detection to the state being whole again
    double stop_seconds = 0;        ///< of which waiting for every rank to stop (finish its computation)
};

/// A rank's state could not be repaired in place: no healthy replica of its piece of the
/// state, or its device could not be repaired. The rank has declared itself failed; the
/// others go on to the last words.
class RepairFailed : public ckpt::Error {
public:
    using ckpt::Error::Error;
};

/// Who UCE repair copies from, and how the optimizer state is split.
template <ReplicaSelector Sel = LowestHealthyRank>
struct UceRepairOptions {
    Sel selector{};
    ShardLayout layout{};  ///< the optimizer's: a rank's state comes from a rank keeping the same piece
};

/// The callback that repairs a rank's device in place after an uncorrectable memory error: every
/// rank stops, the device is stopped, cleaned and repaired, the state is copied to it from a
/// healthy rank keeping the same optimizer piece, and the step is redone (or taken as done), in
/// the same process. A rank that cannot be repaired fails with RepairFailed. records() lists the
/// repairs.
template <RecoverableCommunicator Comm, Backend B, ReplicaSelector Sel = LowestHealthyRank>
class UceRepair {
public:
    UceRepair(Comm& comm, B& backend, UceRepairOptions<Sel> options = {})
        : comm_(comm), backend_(backend), options_(std::move(options)) {
        options_.layout.require_replicas(comm.size(), "UCE repair");
    }

    /// A step's forward pass reads every parameter: the damaged memory surfaces here.
    void on_step_begin(nn::RunContext&) { backend_.touch_all(); }

    nn::StepRecovery on_step_failed(nn::RunContext& ctx) {
        const auto error = std::current_exception();
        const bool damaged = detail::holds<DeviceMemoryError>(error);
        if (!damaged && !detail::holds<Interrupted>(error)) return nn::StepRecovery::none;
        const auto start = std::chrono::steady_clock::now();
        if (damaged) comm_.interrupt();
        comm_.rejoin();
        const double stop_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

        const auto reports = detail::allgather_records(
            comm_, Report{comm_.job_rank(), ctx.global_step, ctx.consistent ? 1 : 0,
                          backend_.health() == Health::healthy ? 1 : 0, options_.layout.shard_of(comm_.job_rank())});
        const Plan plan = make_plan(reports);
        const int me = comm_.rank();
        if (!plan.unrepairable.empty()) {
            ckpt::detail::log(ckpt::LogLevel::warning, plan.problem);
            if (std::find(plan.unrepairable.begin(), plan.unrepairable.end(), me) != plan.unrepairable.end()) {
                comm_.declare_failed();
                throw RepairFailed(plan.problem);
            }
            std::vector<int> lost;  // job ranks, as every PeerFailure names them
            for (int q : plan.unrepairable) lost.push_back(reports[static_cast<std::size_t>(q)].job_rank);
            std::sort(lost.begin(), lost.end());
            // meets the failures the unrepairable ranks declared (the last words take over from
            // there); what it says is whichever declaration it met first: the plan says all
            try {
                comm_.barrier();
            } catch (const PeerFailure&) {
            }
            throw PeerFailure(plan.problem, std::move(lost));
        }

        if (damaged) {  // the seed's sequence: stop, clean, repair
            try {
                backend_.stop();
                backend_.clean();
                backend_.repair();
            } catch (const std::exception& e) {
                comm_.declare_failed();
                throw RepairFailed("UCE repair: the device of rank " + std::to_string(comm_.job_rank()) +
                                   " cannot be repaired: " + e.what());
            }
        }
        // every float tensor of each rank needing it, from its source
        for (std::size_t q = 0; q < reports.size(); ++q) {
            const int src = plan.source[q];
            if (src < 0 || (me != src && me != static_cast<int>(q))) continue;
            int tag = 0;
            for (auto& [name, value] : ctx.state())
                if (ckpt::Tensor* t = value.template get_if<ckpt::Tensor>(); t && t->dtype() == ckpt::DType::float32) {
                    if (me == src) comm_.send(t->values<float>(), static_cast<int>(q), tag++);
                    else comm_.recv(t->values<float>(), src, tag++);
                }
        }
        backend_.touch_all();
        comm_.barrier();  // every rank is whole again (or learns here of a rank that is not)

        RepairRecord rec;
        for (std::size_t q = 0; q < reports.size(); ++q)
            if (!reports[q].healthy) {
                rec.repaired_rank = static_cast<int>(reports[q].job_rank);
                rec.source_rank = static_cast<int>(reports[static_cast<std::size_t>(plan.source[q])].job_rank);
            }
        rec.global_step = plan.newest;
        rec.redone = ctx.global_step == plan.newest;
        rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        rec.stop_seconds = stop_seconds;
        records_.push_back(rec);
        return ctx.global_step == plan.newest ? nn::StepRecovery::redo : nn::StepRecovery::done;
    }

    /// The repairs this rank took part in.
    const std::vector<RepairRecord>& records() const noexcept { return records_; }

private:
    struct Report {
        std::int64_t job_rank, global_step, consistent, healthy, shard;
    };
    struct Plan {
        std::int64_t newest = -1;
        std::vector<int> source;        // by rank: the rank its state comes from, -1 if none is needed
        std::vector<int> unrepairable;  // ranks that cannot be brought to the newest step
        std::string problem;
    };

    // Every rank not healthy, torn, or not at the newest step gets the state of a healthy
    // rank keeping the same piece at the newest step. A rank more than one step away cannot
    // rejoin the loop at the right step.
    Plan make_plan(const std::vector<Report>& reports) const {
        Plan plan;
        for (const auto& r : reports)
            if (r.consistent && r.healthy) plan.newest = std::max(plan.newest, r.global_step);
        plan.source.assign(reports.size(), -1);
        for (std::size_t q = 0; q < reports.size(); ++q) {
            const auto& r = reports[q];
            if (r.healthy && r.consistent && r.global_step == plan.newest) continue;
            std::vector<int> holders;
            for (std::size_t h = 0; h < reports.size(); ++h)
                if (reports[h].healthy && reports[h].consistent && reports[h].global_step == plan.newest &&
                    reports[h].shard == r.shard)
                    holders.push_back(static_cast<int>(h));
            const bool aligned = r.global_step == plan.newest || r.global_step + 1 == plan.newest;
            if (holders.empty() || !aligned) {
                plan.unrepairable.push_back(static_cast<int>(q));
                plan.problem += std::string(plan.problem.empty() ? "UCE repair: " : "; ") + "rank " +
                                std::to_string(r.job_rank) + " (" + (r.healthy ? "" : "memory error, ") +
                                (r.consistent ? "" : "torn update, ") + "at step " + std::to_string(r.global_step) +
                                ") " +
                                (holders.empty() ? "has no healthy replica of its state piece " + std::to_string(r.shard) +
                                                       " at step " + std::to_string(plan.newest)
                                                 : "cannot rejoin the replicas at step " + std::to_string(plan.newest));
                continue;
            }
            plan.source[q] = options_.selector.choose(holders);
        }
        if (!plan.unrepairable.empty()) plan.problem += "; falling back to the last words";
        return plan;
    }

    Comm& comm_;
    B& backend_;
    UceRepairOptions<Sel> options_;
    std::vector<RepairRecord> records_;
};

/// Injects a UCE into tensor `name` of a rank's device at the end of global step `step`
/// (for tests and examples); with `repairable` false, one the device cannot recover from.
template <class Device>
class InjectUce {
public:
    /// A device that can say which tensors it holds must hold `tensor` (unless `global_step`
    /// is 0: no injection): a wrong name is a ConfigError now, not a failure at that step.
    InjectUce(Device& device, std::string tensor, std::int64_t global_step, int rank, bool repairable = true)
        : device_(device), tensor_(std::move(tensor)), step_(global_step), rank_(rank), repairable_(repairable) {
        if constexpr (requires { { device.holds(tensor_) } -> std::convertible_to<bool>; })
            if (step_ > 0 && !device.holds(tensor_))  // step 0 never fires: nothing to check
                throw ckpt::ConfigError("InjectUce: the device holds no tensor '" + tensor_ +
                                        "' (attach the state first; names as in the checkpoint, e.g. layer2.weight)");
    }
    void on_step_end(nn::RunContext& ctx) {
        if (fired_ || ctx.global_step != step_ || ctx.rank != rank_) return;
        fired_ = true;
        device_.inject_uce(tensor_, 0, 16, repairable_);
    }
    bool fired() const noexcept { return fired_; }

private:
    Device& device_;
    std::string tensor_;
    std::int64_t step_;
    int rank_;
    bool repairable_;
    bool fired_ = false;
};

}  // namespace fault
