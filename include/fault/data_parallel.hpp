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
// With optimizer-state sharding (the seed's optimizer_weight_shard_size), each rank keeps
// the optimizer state of one piece of every parameter and updates only that piece; the
// updated pieces are then exchanged so that every rank holds all the parameters again:
//
//   const fault::ShardLayout layout{2};                                   // shard size 2
//   fault::OptimizerShard shard(net.parameters(), layout, comm);          // this rank's pieces
//   nn::Momentum inner(shard.parameters(), 0.01, 0.9);                    // state for them only
//   fault::DataParallelOptimizer opt(inner, comm, shard);
//
// or, the same in one object, fault::ShardedOptimizer<nn::Momentum, Comm> (below).
//
// The wrapper reports, for every step, the phase its rank reached: gradients reduced,
// updating, updated. After a failure the survivors compare these reports to know which
// ranks hold a consistent state, and for which step.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../ckpt/reshard.hpp"
#include "../nn/core.hpp"
#include "communicator.hpp"

namespace fault {

/// How the optimizer state is split among the data-parallel ranks (the seed's
/// optimizer_weight_shard_size). With shard size s, every parameter's state is cut into s
/// contiguous pieces and rank r keeps piece r % s. The ranks keeping the same piece form a
/// replica group, {j, j + s, j + 2s, …}: ranks / s copies of it. Shard size 1, the default,
/// is plain data parallelism: one replica group of every rank.
struct ShardLayout {
    int shard_size = 1;

    int shard_of(int rank) const noexcept { return rank % shard_size; }
    /// The ranks (of `ranks`) that keep piece `shard`, ascending.
    std::vector<int> replica_group(int shard, int ranks) const {
        std::vector<int> g;
        for (int r = shard; r < ranks; r += shard_size) g.push_back(r);
        return g;
    }
    /// Elements [first, last) of an n-element tensor that piece `shard` covers.
    std::pair<std::size_t, std::size_t> piece(std::size_t n, int shard) const noexcept {
        const auto s = static_cast<std::size_t>(shard_size), j = static_cast<std::size_t>(shard);
        return {n * j / s, n * (j + 1) / s};
    }

    /// Throws ConfigError unless the shard size divides `ranks`.
    void check(int ranks) const {
        if (shard_size < 1 || ranks % shard_size != 0)
            throw ckpt::ConfigError("optimizer shard size " + std::to_string(shard_size) + " does not divide the " +
                                    std::to_string(ranks) + " data-parallel ranks");
    }
    /// Throws ConfigError unless every piece has a replica (`feature` says who needs one).
    void require_replicas(int ranks, std::string_view feature) const {
        check(ranks);
        if (ranks / shard_size < 2)
            throw ckpt::ConfigError(std::string(feature) + " needs a replica of every rank's state, and " +
                                    std::to_string(ranks) + " data-parallel rank(s) with optimizer shard size " +
                                    std::to_string(shard_size) + " keep a single copy of each piece: use at least " +
                                    "2 ranks and a shard size of at most half of them");
    }
};

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

/// This rank's piece of every parameter under a ShardLayout: parameters of their own
/// (same names, piece-sized; a piece that is the whole tensor keeps its shape, a partial
/// one is flat) for the inner optimizer to update and keep state for.
class OptimizerShard {
public:
    template <Communicator Comm>
    OptimizerShard(const std::vector<nn::Parameter*>& params, ShardLayout layout, const Comm& comm)
        : full_(params), layout_(layout), shard_(layout.shard_of(comm.rank())) {
        layout.check(comm.size());
        pieces_.reserve(params.size());
        for (const nn::Parameter* p : params) {
            const auto [lo, hi] = layout.piece(p->value.size(), shard_);
            nn::Parameter piece;
            piece.name = p->name;
            if (hi - lo == p->value.size()) piece.value = nn::Array::from_shape(p->value.shape());
            else piece.value = nn::Array::from_shape({hi - lo});
            std::copy(p->value.begin() + static_cast<std::ptrdiff_t>(lo), p->value.begin() + static_cast<std::ptrdiff_t>(hi),
                      piece.value.begin());
            piece.grad = nn::Array::from_shape(piece.value.shape());
            pieces_.push_back(std::move(piece));
        }
        for (auto& piece : pieces_) piece_ptrs_.push_back(&piece);
    }
    OptimizerShard(const OptimizerShard&) = delete;
    OptimizerShard& operator=(const OptimizerShard&) = delete;

    /// The pieces this rank updates: build the inner optimizer on these.
    const std::vector<nn::Parameter*>& parameters() const noexcept { return piece_ptrs_; }
    /// The whole parameters the pieces come from.
    const std::vector<nn::Parameter*>& full_parameters() const noexcept { return full_; }
    const ShardLayout& layout() const noexcept { return layout_; }
    int shard() const noexcept { return shard_; }

private:
    std::vector<nn::Parameter*> full_;
    ShardLayout layout_;
    int shard_;
    std::vector<nn::Parameter> pieces_;
    std::vector<nn::Parameter*> piece_ptrs_;
};

/// Wraps an optimizer for data-parallel training: synchronize_gradients() replaces every
/// gradient by its mean over the ranks (one allreduce over all of them), step() applies
/// the inner optimizer, and both record the phase (the seed's OptTFTWrapper). The trainer
/// calls synchronize_gradients() before the update, so a peer failure surfacing there
/// leaves this rank's state consistent.
///
/// With an OptimizerShard, step() updates this rank's pieces, then every piece is broadcast
/// from a rank that keeps it. The update of the state is undone when that exchange fails, so
/// a peer failure during it also leaves the rank consistent, at the previous step.
template <class Opt, Communicator Comm>
class DataParallelOptimizer {
public:
    DataParallelOptimizer(Opt& inner, Comm& comm) : inner_(inner), comm_(comm), params_(inner.parameters()) {
        flat_.resize(total_size());
    }
    DataParallelOptimizer(Opt& inner, Comm& comm, OptimizerShard& shard)
        : inner_(inner), comm_(comm), shard_(&shard), params_(shard.full_parameters()) {
        if (inner.parameters() != shard.parameters())
            throw ckpt::ConfigError("a sharded DataParallelOptimizer needs an inner optimizer built on "
                                    "OptimizerShard::parameters()");
        flat_.resize(total_size());
        const int s = shard.layout().shard_size;
        shard_offsets_.assign(static_cast<std::size_t>(s) + 1, 0);
        for (int j = 0; j < s; ++j) {
            std::size_t n = 0;
            for (const nn::Parameter* p : params_) {
                const auto [lo, hi] = shard.layout().piece(p->value.size(), j);
                n += hi - lo;
            }
            shard_offsets_[static_cast<std::size_t>(j) + 1] = shard_offsets_[static_cast<std::size_t>(j)] + n;
        }
    }

    void synchronize_gradients() {
        float* out = flat_.data();
        for (const nn::Parameter* p : params_) out = std::copy(p->grad.begin(), p->grad.end(), out);
        comm_.allreduce(std::span<float>(flat_), ReduceOp::mean);
        const float* in = flat_.data();
        if (!shard_) {
            for (nn::Parameter* p : params_) {
                std::copy(in, in + p->grad.size(), p->grad.data());
                in += p->grad.size();
            }
        } else {  // this rank's pieces: gradients, and values (resumes and repairs write the whole parameters)
            const auto& pieces = shard_->parameters();
            for (std::size_t k = 0; k < params_.size(); ++k) {
                const auto [lo, hi] = shard_->layout().piece(params_[k]->value.size(), shard_->shard());
                std::copy(in + lo, in + hi, pieces[k]->grad.data());
                std::copy(params_[k]->value.data() + lo, params_[k]->value.data() + hi, pieces[k]->value.data());
                in += params_[k]->grad.size();
            }
        }
        phase_.store(Phase::gradients_reduced);
    }

    void step() {
        phase_.store(Phase::updating);
        if (!shard_) {
            inner_.step();
        } else {
            save_state();
            inner_.step();
            try {
                gather_pieces();
            } catch (...) {
                restore_state();  // the parameters are untouched: the previous step's state again
                phase_.store(Phase::gradients_reduced);
                throw;
            }
        }
        completed_.fetch_add(1);
        phase_.store(Phase::updated);
    }

    /// False while an update is partly applied (after a failure inside it).
    bool consistent() const noexcept { return phase_.load() != Phase::updating; }

    ckpt::ParamDict state_dict() { return inner_.state_dict(); }
    /// The inner optimizer's, and with sharding "optimizer.shard_size" and "optimizer.shard".
    ckpt::ParamDict hyperparameters() const {
        ckpt::ParamDict d = inner_.hyperparameters();
        if (shard_) {
            d.set("optimizer.shard_size", static_cast<std::int64_t>(shard_->layout().shard_size));
            d.set("optimizer.shard", static_cast<std::int64_t>(shard_->shard()));
        }
        return d;
    }
    /// Refuses a checkpoint holding another piece of the optimizer state than this rank's
    /// (the trainer calls it before loading anything).
    void check_checkpoint(const ckpt::ParamDict& dict, const std::string& where) const {
        const std::int64_t size = dict.contains("optimizer.shard_size") ? dict.get<std::int64_t>("optimizer.shard_size") : 1;
        const std::int64_t piece = dict.contains("optimizer.shard") ? dict.get<std::int64_t>("optimizer.shard") : 0;
        const std::int64_t want_size = shard_ ? shard_->layout().shard_size : 1;
        const std::int64_t want_piece = shard_ ? shard_->shard() : 0;
        if (size != want_size || piece != want_piece)
            throw ckpt::LoadMismatch(where + " holds optimizer-state piece " + std::to_string(piece) + " of " +
                                     std::to_string(size) + "; rank " + std::to_string(comm_.rank()) + " keeps piece " +
                                     std::to_string(want_piece) + " of " + std::to_string(want_size));
    }
    const std::vector<nn::Parameter*>& parameters() const noexcept { return params_; }

    /// Where this rank's optimizer-state tensors sit in the global ones, for the global
    /// index and resharding loads: sharded, the state "X.w" of this rank's piece of parameter
    /// w is elements [lo, hi) of a tensor of w's shape; unsharded, nothing (all whole).
    /// "optimizer.shard", which differs between the ranks, is the new layout's own after a
    /// load (claim_resharded()): any rank's copy serves.
    ckpt::PieceMap piece_map() {
        ckpt::PieceMap out;
        if (!shard_) return out;
        out["optimizer.shard"] = ckpt::PiecePlace::replicated();
        const auto& pieces = shard_->parameters();
        for (const auto& [name, value] : inner_.state_dict()) {
            const ckpt::Tensor* t = value.template get_if<ckpt::Tensor>();
            if (!t) continue;
            for (std::size_t k = 0; k < pieces.size(); ++k) {
                const std::string& w = pieces[k]->name;
                const bool of_w = name.size() > w.size() && name.compare(name.size() - w.size(), w.size(), w) == 0 &&
                                  name[name.size() - w.size() - 1] == '.';
                if (!of_w || t->numel() != pieces[k]->value.size()) continue;
                ckpt::Shape shape(params_[k]->value.shape().begin(), params_[k]->value.shape().end());
                out[name] = {name, std::move(shape), shard_->layout().piece(params_[k]->value.size(), shard_->shard()).first};
                break;
            }
        }
        return out;
    }
    /// Makes a state loaded for this rank from another layout (ckpt::load_resharded) say this
    /// rank's piece, as check_checkpoint wants.
    void claim_resharded(ckpt::ParamDict& state) const {
        state.set("optimizer.shard_size", static_cast<std::int64_t>(shard_ ? shard_->layout().shard_size : 1));
        state.set("optimizer.shard", static_cast<std::int64_t>(shard_ ? shard_->shard() : 0));
    }

    /// This rank's phase report; safe to read from another thread.
    PhaseReport report() const { return {comm_.rank(), completed_.load(), phase_.load()}; }
    /// Sets the completed-step count, after a resume at global step n.
    void set_completed_steps(std::int64_t n) {
        completed_.store(n);
        phase_.store(Phase::updated);
    }
    Opt& inner() noexcept { return inner_; }

private:
    std::size_t total_size() const {
        std::size_t n = 0;
        for (const nn::Parameter* p : params_) n += p->grad.size();
        return n;
    }

    // Every piece from the lowest rank keeping it (rank j keeps piece j), staged in flat_
    // (free once the gradients are in the pieces) so that the parameters change only once
    // all pieces have arrived.
    void gather_pieces() {
        const ShardLayout& layout = shard_->layout();
        const auto& pieces = shard_->parameters();
        const int mine = shard_->shard();
        float* own = flat_.data() + shard_offsets_[static_cast<std::size_t>(mine)];
        for (const nn::Parameter* piece : pieces) own = std::copy(piece->value.begin(), piece->value.end(), own);
        for (int j = 0; j < layout.shard_size; ++j) {
            const auto lo = shard_offsets_[static_cast<std::size_t>(j)], hi = shard_offsets_[static_cast<std::size_t>(j) + 1];
            comm_.broadcast(std::span<float>(flat_.data() + lo, hi - lo), j);
        }
        for (int j = 0; j < layout.shard_size; ++j) {
            const float* in = flat_.data() + shard_offsets_[static_cast<std::size_t>(j)];
            for (nn::Parameter* p : params_) {
                const auto [lo, hi] = layout.piece(p->value.size(), j);
                std::copy(in, in + (hi - lo), p->value.data() + lo);
                in += hi - lo;
            }
        }
    }
    // The inner optimizer's state before its update, to undo it.
    void save_state() {
        undo_.clear();
        for (auto& [name, value] : inner_.state_dict())
            if (const ckpt::Tensor* t = value.template get_if<ckpt::Tensor>())
                undo_.insert(undo_.end(), t->data(), t->data() + t->nbytes());
    }
    void restore_state() {
        const std::byte* in = undo_.data();
        for (auto& [name, value] : inner_.state_dict())
            if (ckpt::Tensor* t = value.template get_if<ckpt::Tensor>()) {
                std::memcpy(t->data(), in, t->nbytes());
                in += t->nbytes();
            }
    }

    Opt& inner_;
    Comm& comm_;
    OptimizerShard* shard_ = nullptr;
    std::vector<nn::Parameter*> params_;
    std::vector<float> flat_;
    std::vector<std::size_t> shard_offsets_;  // where piece j starts in the staging buffer
    std::vector<std::byte> undo_;
    std::atomic<std::int64_t> completed_{0};
    std::atomic<Phase> phase_{Phase::idle};
};

/// The usual composition in one object: an Opt built on this rank's piece of the
/// parameters under `layout` (all of them when it does not shard), wrapped in a
/// DataParallelOptimizer. The trainer takes optimizer().
///
/// ```
/// fault::ShardedOptimizer<nn::Momentum, fault::ThreadComm> opt(net.parameters(), comm, {2}, 0.01, 0.9);
/// nn::Trainer trainer(net, opt.optimizer(), {}, comm.rank());
/// ```
template <class Opt, Communicator Comm>
class ShardedOptimizer {
public:
    template <class... OptArgs>
    ShardedOptimizer(const std::vector<nn::Parameter*>& params, Comm& comm, ShardLayout layout, OptArgs&&... opt_args) {
        layout.check(comm.size());
        if (layout.shard_size > 1) shard_.emplace(params, layout, comm);
        inner_.emplace(shard_ ? shard_->parameters() : params, std::forward<OptArgs>(opt_args)...);
        if (shard_) wrapper_.emplace(*inner_, comm, *shard_);
        else wrapper_.emplace(*inner_, comm);
    }
    DataParallelOptimizer<Opt, Comm>& optimizer() noexcept { return *wrapper_; }
    Opt& inner() noexcept { return *inner_; }

private:
    std::optional<OptimizerShard> shard_;
    std::optional<Opt> inner_;
    std::optional<DataParallelOptimizer<Opt, Comm>> wrapper_;
};

}  // namespace fault
