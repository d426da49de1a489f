#pragma once
// The data of the seed's data-parallel tutorials (last words, UCE repair).

#include <nn/data.hpp>

#include <cstddef>

namespace examples {

/// Rescale(1/255) + Normalize(0.1307, 0.3081) + HWC2CHW, int32 labels, batches of 32 per
/// rank (a global batch of 32 x ranks), this rank's shard; the first `limit` images.
inline nn::MnistDataset seed_dp_dataset(const boost::filesystem::path& dir, std::size_t limit, int ranks, int rank) {
    nn::MnistDataset ds(dir, nn::Usage::train);
    if (limit) ds.take(limit);
    ds.map({nn::Rescale(1.0 / 255.0, 0), nn::Normalize({0.1307}, {0.3081}), nn::HWC2CHW()});
    ds.map_label(nn::TypeCast(ckpt::DType::int32));
    ds.batch(32 * static_cast<std::size_t>(ranks), true);
    ds.shard(static_cast<std::size_t>(ranks), static_cast<std::size_t>(rank));
    return ds;
}

}  // namespace examples
