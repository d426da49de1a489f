#pragma once
// Networks: a Sequential stack with named parameters, an expected input shape and a state
// dict. LeNet5 and the seed's data-parallel MLPs are defined here.
//
// A network (the Network concept the trainer takes) has
//   const Array& forward(const Array& x);     // (N, …) batch → (N, classes) logits
//   void backward(const Array& dlogits);      // fills every parameter's gradient
//   std::vector<Parameter*> parameters();
//   ckpt::ParamDict state_dict();             // views of the parameters, by name

#include <concepts>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core.hpp"
#include "layers.hpp"

namespace nn {

/// What the Trainer trains: forward(x) from a batch to its logits, backward(dlogits) filling every
/// parameter's gradient, parameters(), and state_dict() (views of the parameters, by name).
/// LeNet5, UceNet, DataParallelNet and any SequentialNet model it.
template <class N>
concept Network = requires(N& n, const Array& x) {
    { n.forward(x) } -> std::convertible_to<const Array&>;
    n.backward(x);
    { n.parameters() } -> std::convertible_to<std::vector<Parameter*>>;
    { n.state_dict() } -> std::same_as<ckpt::ParamDict>;
};

/// A Sequential stack as a network: checks the input shape, initializes the parameters
/// from `seed`, and lists them by name. Not movable: the parameter list points into it.
template <class Seq>
class SequentialNet {
public:
    SequentialNet(std::string name, Seq layers, std::vector<std::size_t> input_shape, std::uint64_t seed)
        : name_(std::move(name)), layers_(std::move(layers)), input_shape_(std::move(input_shape)) {
        std::mt19937_64 g(seed);
        layers_.initialize(g);
        layers_.parameters(params_);
    }
    SequentialNet(const SequentialNet&) = delete;
    SequentialNet& operator=(const SequentialNet&) = delete;

    const Array& forward(const Array& x) {
        if (x.dimension() != input_shape_.size() + 1 ||
            !std::equal(input_shape_.begin(), input_shape_.end(), x.shape().begin() + 1))
            throw ShapeError(name_ + " expects a batch of shape (N, " + shape_string(input_shape_).substr(1) +
                             ", got " + shape_string(x.shape()));
        return layers_.forward(x);
    }
    void backward(const Array& dlogits) { layers_.backward(dlogits); }
    std::vector<Parameter*> parameters() const { return params_; }
    ckpt::ParamDict state_dict() { return parameter_views(params_); }
    const std::vector<std::size_t>& input_shape() const noexcept { return input_shape_; }
    const std::string& name() const noexcept { return name_; }
    Seq& layers() noexcept { return layers_; }

private:
    std::string name_;
    Seq layers_;
    std::vector<std::size_t> input_shape_;
    std::vector<Parameter*> params_;
};

namespace detail {
using LeNet5Layers = Sequential<ToChannelMajor, Conv2d, ReLU, MaxPool2d, Conv2d, ReLU, MaxPool2d,
                                FlattenChannelMajor, Dense, ReLU, Dense, ReLU, Dense>;
inline LeNet5Layers lenet5_layers(std::size_t num_class, std::size_t num_channel) {
    const Dense::Options fc{.weight_init = Normal{0.02}, .bias_init = std::nullopt, .has_bias = true};
    return LeNet5Layers(ToChannelMajor{}, Conv2d("conv1", num_channel, 6, 5), ReLU{}, MaxPool2d(2, 2),
                        Conv2d("conv2", 6, 16, 5), ReLU{}, MaxPool2d(2, 2), FlattenChannelMajor{},
                        Dense("fc1", 16 * 5 * 5, 120, fc), ReLU{}, Dense("fc2", 120, 84, fc), ReLU{},
                        Dense("fc3", 84, num_class, fc));
}
}  // namespace detail

/// The seed's LeNet5 on (N, num_channel, 32, 32) images: conv 5×5 (valid) → ReLU → max pool
/// 2×2, twice (6 then 16 channels), then dense 400 → 120 → 84 → num_class with ReLUs;
/// Normal(0.02) on the dense weights, the seed's defaults elsewhere.
class LeNet5 : public SequentialNet<detail::LeNet5Layers> {
public:
    explicit LeNet5(std::size_t num_class = 10, std::size_t num_channel = 1, std::uint64_t seed = 1)
        : SequentialNet("LeNet5", detail::lenet5_layers(num_class, num_channel), {num_channel, 32, 32}, seed) {}
};

namespace detail {
using DataParallelNetLayers = Sequential<Flatten, MatMul, ReLU, Dense, ReLU, Dense, ReLU, Dense, ReLU, Dense>;
using UceNetLayers = Sequential<Flatten, MatMul, ReLU, Dense, ReLU, Dense>;
}  // namespace detail

/// The seed's data-parallel network on (N, 1, 28, 28) images: flatten, 784 → 512 MatMul
/// ("layer1.param", HeUniform(√5)), then dense 512 → 5120 → 5120 → 512 → 10 with ReLUs.
class DataParallelNet : public SequentialNet<detail::DataParallelNetLayers> {
public:
    explicit DataParallelNet(std::uint64_t seed = 1)
        : SequentialNet("DataParallelNet",
                        detail::DataParallelNetLayers(Flatten{}, MatMul("layer1.param", 28 * 28, 512), ReLU{},
                                                      Dense("layer2", 512, 5120), ReLU{}, Dense("layer3", 5120, 5120),
                                                      ReLU{}, Dense("layer4", 5120, 512), ReLU{},
                                                      Dense("layer5", 512, 10)),
                        {1, 28, 28}, seed) {}
};

/// The seed's smaller network for UCE repair: flatten, 784 → 512 MatMul, dense 512 → 512 → 10.
class UceNet : public SequentialNet<detail::UceNetLayers> {
public:
    explicit UceNet(std::uint64_t seed = 1)
        : SequentialNet("UceNet",
                        detail::UceNetLayers(Flatten{}, MatMul("layer1.param", 28 * 28, 512), ReLU{},
                                             Dense("layer2", 512, 512), ReLU{}, Dense("layer3", 512, 10)),
                        {1, 28, 28}, seed) {}
};

}  // namespace nn
