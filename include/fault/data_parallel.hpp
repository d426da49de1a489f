#pragma once
// Data-parallel training: N replicas, each with all the parameters and a shard of every
// batch (MnistDataset::shard), averaging their gradients through a Communicator before
// identical updates. This is where fault/ meets nn/.
//
//   fault::broadcast_parameters(comm, net.parameters());      // replicas start identical
//   nn::Momentum inner(net.parameters(), 0.01, 0.9);
//   fault::DataParallelOptimizer opt(inner, comm);             // the seed's OptTFTWrapper
//   nn::Trainer trainer(net, opt, {}, comm.rank());
//
// The wrapper reports, for every step, the phase its rank reached: gradients reduced,
// updating, updated. After a failure the survivors compare these reports to know which
// ranks hold a consistent state, and for which step.

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../nn/core.hpp"
#include "communicator.hpp"

namespace fault {

/// How far a rank got with a step. A rank's parameters are those after `step` when the
/// phase is `updated` or `gradients_reduced` (the update of step + 1 has not begun), and
/// torn when it is `updating`.
enum class Phase : std::uint8_t { idle, gradients_reduced, updating, updated };

inline const char* phase_name(Phase p) {
    switch (p) {
        case Phase::idle: return "idle";
        case Phase::gradients_reduced: return "gradients reduced";
        case Phase::updating: return "updating";
        case Phase::updated: return "updated";
    }
    return "?";
}

/// A rank's report: the last step whose update it completed, and the phase of the next.
struct PhaseReport {
    int rank = 0;
    std::int64_t completed_step = 0;  ///< global steps whose update this rank completed
    Phase phase = Phase::idle;        ///< where the rank stands in step completed_step + 1
    bool consistent() const noexcept { return phase != Phase::updating; }
};

/// Makes every rank's parameters equal to those of `root`.
template <Communicator Comm>
void broadcast_parameters(Comm& comm, const std::vector<nn::Parameter*>& params, int root = 0) {
    for (nn::Parameter* p : params) comm.broadcast(std::span<float>(p->value.data(), p->value.size()), root);
}

/// Wraps an optimizer for data-parallel training: synchronize_gradients() replaces every
/// gradient by its mean over the ranks (one allreduce over all of them), step() applies
/// the inner optimizer, and both record the phase (the seed's OptTFTWrapper). The trainer
/// calls synchronize_gradients() before the update, so a peer failure surfacing there
/// leaves this rank's state consistent.
template <class Opt, Communicator Comm>
class DataParallelOptimizer {
public:
    DataParallelOptimizer(Opt& inner, Comm& comm) : inner_(inner), comm_(comm), params_(inner.parameters()) {
        std::size_t n = 0;
        for (const nn::Parameter* p : params_) n += p->grad.size();
        flat_.resize(n);
    }

    void synchronize_gradients() {
        float* out = flat_.data();
        for (const nn::Parameter* p : params_) out = std::copy(p->grad.begin(), p->grad.end(), out);
        comm_.allreduce(std::span<float>(flat_), ReduceOp::mean);
        const float* in = flat_.data();
        for (nn::Parameter* p : params_) {
            std::copy(in, in + p->grad.size(), p->grad.data());
            in += p->grad.size();
        }
        phase_.store(Phase::gradients_reduced);
    }
    void step() {
        phase_.store(Phase::updating);
        inner_.step();
        completed_.fetch_add(1);
        phase_.store(Phase::updated);
    }

    ckpt::ParamDict state_dict() { return inner_.state_dict(); }
    ckpt::ParamDict hyperparameters() const { return inner_.hyperparameters(); }
    const std::vector<nn::Parameter*>& parameters() const noexcept { return params_; }

    /// This rank's phase report; safe to read from another thread.
    PhaseReport report() const { return {comm_.rank(), completed_.load(), phase_.load()}; }
    /// Sets the completed-step count, after a resume at global step n.
    void set_completed_steps(std::int64_t n) {
        completed_.store(n);
        phase_.store(Phase::updated);
    }
    Opt& inner() noexcept { return inner_; }

private:
    Opt& inner_;
    Comm& comm_;
    std::vector<nn::Parameter*> params_;
    std::vector<float> flat_;
    std::atomic<std::int64_t> completed_{0};
    std::atomic<Phase> phase_{Phase::idle};
};

}  // namespace fault
