#pragma once
// Initializers with the seed's names and rules, driven by a generator whose output is the
// same on every platform (std::mt19937_64 is fully specified; the distributions are ours,
// because the standard library's are not).

#include <cmath>
#include <cstdint>
#include <random>
#include <variant>

#include "core.hpp"

namespace nn {

/// The seed's fan-in: shape[1] times the receptive field (a 2-D (a, b) tensor has fan-in b).
inline double fan_in(const Array::shape_type& shape) {
    if (shape.size() < 2) return static_cast<double>(shape.empty() ? 1 : shape[0]);
    double f = static_cast<double>(shape[1]);
    for (std::size_t i = 2; i < shape.size(); ++i) f *= static_cast<double>(shape[i]);
    return f;
}

namespace detail {
/// A double in [0, 1) from 53 random bits.
inline double uniform01(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }
}  // namespace detail

/// Normal(0, sigma), by Box-Muller.
struct Normal {
    double sigma = 0.01;
    void operator()(Array& a, std::mt19937_64& g) const {
        for (std::size_t i = 0; i < a.size(); i += 2) {
            const double u1 = 1.0 - detail::uniform01(g), u2 = detail::uniform01(g);
            const double r = std::sqrt(-2.0 * std::log(u1)) * sigma, t = 2.0 * M_PI * u2;
            a.data()[i] = static_cast<float>(r * std::cos(t));
            if (i + 1 < a.size()) a.data()[i + 1] = static_cast<float>(r * std::sin(t));
        }
    }
};

/// Uniform(-scale, scale).
struct Uniform {
    double scale = 0.07;
    void operator()(Array& a, std::mt19937_64& g) const {
        for (float& v : a) v = static_cast<float>((2.0 * detail::uniform01(g) - 1.0) * scale);
    }
};

/// Kaiming uniform for leaky ReLU with negative slope `a`, fan-in mode: bound
/// sqrt(2 / (1 + a²)) · sqrt(3 / fan_in). HeUniform(√5) gives bound 1/sqrt(fan_in).
struct HeUniform {
    double negative_slope = 0.0;
    void operator()(Array& a, std::mt19937_64& g) const {
        const double gain = std::sqrt(2.0 / (1.0 + negative_slope * negative_slope));
        Uniform{gain * std::sqrt(3.0 / fan_in(a.shape()))}(a, g);
    }
};

struct Zeros {
    void operator()(Array& a, std::mt19937_64&) const { a.fill(0.0f); }
};

/// Uniform(±1/sqrt(fan_in)) with the fan-in of a given weight: the seed's default bias.
struct BiasUniform {
    double fan_in = 1;
    void operator()(Array& a, std::mt19937_64& g) const { Uniform{1.0 / std::sqrt(fan_in)}(a, g); }
};

using Initializer = std::variant<Normal, Uniform, HeUniform, Zeros, BiasUniform>;

inline void initialize(Array& a, const Initializer& init, std::mt19937_64& g) {
    std::visit([&](const auto& i) { i(a, g); }, init);
}

inline constexpr double sqrt5 = 2.23606797749978969640917366873127623544;

}  // namespace nn
