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
// The repaired rank raises DeviceMemoryError on the first operation touching the damaged
// memory (UceRepair touches every attached tensor when a step begins, as its forward pass
// would) and interrupts the other ranks; they meet in Communicator::rejoin(), exchange what
// they hold, and the ReplicaSelector picks the source among the healthy ranks holding the
// newest consistent step. When no healthy replica holds it, the step fails as usual and the
// last-words path takes over.

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
    int repaired_rank = -1;         ///< the job rank whose device was repaired
    int source_rank = -1;           ///< the replica the state was copied from
    std::int64_t global_step = 0;   ///< the step the state was at
    bool redone = true;             ///< the interrupted step was run again (else taken as done)
    double seconds = 0;             ///< from the error's detection to the state being whole again
    double stop_seconds = 0;        ///< of which waiting for every rank to stop (finish its computation)
};

template <RecoverableCommunicator Comm, Backend B, ReplicaSelector Sel = LowestHealthyRank>
class UceRepair {
public:
    UceRepair(Comm& comm, B& backend, Sel selector = {}) : comm_(comm), backend_(backend), selector_(std::move(selector)) {
        if (comm.size() < 2)
            throw ckpt::ConfigError("UCE repair needs a replica to copy from: a data-parallel job of at least 2 ranks, "
                                    "this one has " + std::to_string(comm.size()));
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

        // what each rank holds: completed step, consistent, healthy
        struct Report {
            std::int64_t job_rank, global_step, consistent, healthy;
        };
        const auto reports = detail::allgather_records(
            comm_, Report{comm_.job_rank(), ctx.global_step, ctx.consistent ? 1 : 0,
                          backend_.health() == Health::healthy ? 1 : 0});
        std::int64_t newest = -1;
        for (const auto& r : reports)
            if (r.consistent && r.healthy) newest = std::max(newest, r.global_step);
        std::vector<int> holders;  // group ranks (the same as job ranks until a shrink)
        int repaired = -1;
        for (std::size_t q = 0; q < reports.size(); ++q) {
            const auto& r = reports[q];
            if (r.consistent && r.healthy && r.global_step == newest) holders.push_back(static_cast<int>(q));
            if (!r.healthy) repaired = static_cast<int>(r.job_rank);
        }
        if (holders.empty()) {
            ckpt::detail::log(ckpt::LogLevel::warning,
                              "UCE repair: no healthy rank holds a consistent state; the step fails");
            return nn::StepRecovery::none;
        }
        const int source = selector_.choose(holders);

        if (damaged) {  // the seed's sequence: stop, clean, repair
            backend_.stop();
            backend_.clean();
            backend_.repair();
        }
        // every float tensor from the source (an identical copy for healthy replicas)
        for (auto& [name, value] : ctx.state())
            if (ckpt::Tensor* t = value.template get_if<ckpt::Tensor>(); t && t->dtype() == ckpt::DType::float32)
                comm_.broadcast(t->values<float>(), source);
        backend_.touch_all();

        RepairRecord rec;
        rec.repaired_rank = repaired;
        rec.source_rank = source;
        rec.global_step = newest;
        rec.redone = ctx.global_step == newest;
        rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        rec.stop_seconds = stop_seconds;
        records_.push_back(rec);
        if (ctx.global_step == newest) return nn::StepRecovery::redo;
        if (ctx.global_step + 1 == newest) return nn::StepRecovery::done;
        ckpt::detail::log(ckpt::LogLevel::warning, "UCE repair: rank " + std::to_string(comm_.job_rank()) + " is at step " +
                                                       std::to_string(ctx.global_step) + ", the replicas at " +
                                                       std::to_string(newest) + "; the step fails");
        return nn::StepRecovery::none;
    }

    /// The repairs this rank took part in.
    const std::vector<RepairRecord>& records() const noexcept { return records_; }

private:
    Comm& comm_;
    B& backend_;
    Sel selector_;
    std::vector<RepairRecord> records_;
};

/// Injects a UCE into tensor `name` of a rank's device at the end of global step `step`
/// (for tests and examples).
template <class Device>
class InjectUce {
public:
    InjectUce(Device& device, std::string tensor, std::int64_t global_step, int rank)
        : device_(device), tensor_(std::move(tensor)), step_(global_step), rank_(rank) {}
    void on_step_end(nn::RunContext& ctx) {
        if (fired_ || ctx.global_step != step_ || ctx.rank != rank_) return;
        fired_ = true;
        device_.inject_uce(tensor_);
    }
    bool fired() const noexcept { return fired_; }

private:
    Device& device_;
    std::string tensor_;
    std::int64_t step_;
    int rank_;
    bool fired_ = false;
};

}  // namespace fault
