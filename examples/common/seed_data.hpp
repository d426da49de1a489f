#pragma once
// The data of the seed's data-parallel tutorials (last words, UCE repair).

#include <nn/data.hpp>

#include <cstddef>

namespace examples {

/// Rescale(1/255) + Normalize(0.1307, 0.3081) + HWC2CHW, int32 labels, batches of 32 per
/// rank (a global batch of 32 x ranks, or `global_batch`), this rank's shard; the first
/// `limit` images. A global batch kept whatever the ranks keeps the samples of every step.
inline nn::MnistDataset seed_dp_dataset(const boost::filesystem::path& dir, std::size_t limit, int ranks, int rank,
                                        std::size_t global_batch = 0) {
    nn::MnistDataset ds(dir, nn::Usage::train);
    if (limit) ds.take(limit);
    ds.map({nn::Rescale(1.0 / 255.0, 0), nn::Normalize({0.1307}, {0.3081}), nn::HWC2CHW()});
    ds.map_label(nn::TypeCast(ckpt::DType::int32));
    ds.batch(global_batch ? global_batch : 32 * static_cast<std::size_t>(ranks), true);
    ds.shard(static_cast<std::size_t>(ranks), static_cast<std::size_t>(rank));
    return ds;
}

}  // namespace examples
