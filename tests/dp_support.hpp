#pragma once
// Helpers for the data-parallel suites: a rank's shard of a small Fashion-MNIST set, the
// parameters as one vector, and the optimizer stack with or without state sharding.

#include <fault/fault.hpp>

#include <vector>

namespace test {

using Params = std::vector<std::vector<float>>;
template <class Comm = fault::ThreadComm>
using DpOptOn = fault::DataParallelOptimizer<nn::Momentum, Comm>;
using DpOpt = DpOptOn<>;

/// Rank `rank`'s slice of every batch of 32 over 256 test images (8 steps an epoch).
inline nn::MnistDataset shard_of(int ranks, int rank, bool shuffle = true) {
    nn::MnistDataset ds(CKPT_FASHION_MNIST_DIR, nn::Usage::test);
    ds.take(256).map({nn::Rescale(1.0 / 255.0, 0), nn::HWC2CHW()}).batch(32, true);
    if (shuffle) ds.shuffle(3);
    ds.shard(static_cast<std::size_t>(ranks), static_cast<std::size_t>(rank));
    return ds;
}

inline std::vector<float> flat(const std::vector<nn::Parameter*>& params) {
    std::vector<float> out;
    for (const nn::Parameter* p : params) out.insert(out.end(), p->value.begin(), p->value.end());
    return out;
}

/// Momentum(0.01, 0.9) in a DataParallelOptimizer over `Comm`; with shard_size > 1 each rank
/// keeps the optimizer state of its piece of the parameters only.
template <class Comm = fault::ThreadComm>
class DpStack {
public:
    DpStack(nn::UceNet& net, Comm& comm, int shard_size)
        : stack_(net.parameters(), comm, fault::ShardLayout{shard_size}, 0.01, 0.9) {}
    DpOptOn<Comm>& opt() { return stack_.optimizer(); }

private:
    fault::ShardedOptimizer<nn::Momentum, Comm> stack_;
};

}  // namespace test
