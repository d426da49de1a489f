#pragma once
// SoftmaxCrossEntropyWithLogits, as in the seed: softmax over the last axis, cross entropy
// against class indices (sparse) or per-class targets, reduced by mean or sum.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core.hpp"

namespace nn {

enum class Reduction { mean, sum };

/// The seed's loss: softmax over the last axis, then cross entropy against class indices (sparse,
/// the default) or per-class targets, reduced by mean (the default) or sum.
class SoftmaxCrossEntropyWithLogits {
public:
    SoftmaxCrossEntropyWithLogits() = default;  // sparse, mean: the seed's settings
    explicit SoftmaxCrossEntropyWithLogits(bool sparse, Reduction reduction = Reduction::mean)
        : sparse_(sparse), reduction_(reduction) {}

    bool sparse() const noexcept { return sparse_; }

    /// Loss of (N, C) logits against N class indices in [0, C).
    float forward(const Array& logits, std::span<const std::int32_t> labels) {
        if (!sparse_) throw ckpt::ConfigError("SoftmaxCrossEntropyWithLogits(sparse=false) takes per-class targets, not indices");
        const auto [n, c] = check(logits, labels.size());
        for (std::size_t i = 0; i < n; ++i)
            if (labels[i] < 0 || static_cast<std::size_t>(labels[i]) >= c)
                throw DataError("label " + std::to_string(labels[i]) + " of sample " + std::to_string(i) +
                                " in the batch is outside the " + std::to_string(c) + " classes [0, " +
                                std::to_string(c - 1) + "]");
        softmax(logits);
        double total = 0.0;
        for (std::size_t i = 0; i < n; ++i) {
            float* row = grad_.data() + i * c;
            const auto y = static_cast<std::size_t>(labels[i]);
            total -= log_prob_[i * c + y];
            row[y] -= 1.0f;
        }
        return finish(total, n);
    }

    /// Loss of (N, C) logits against (N, C) target distributions (sparse=false).
    float forward(const Array& logits, const Array& targets) {
        if (sparse_) throw ckpt::ConfigError("SoftmaxCrossEntropyWithLogits(sparse=true) takes class indices");
        const auto [n, c] = check(logits, targets.dimension() == 2 ? targets.shape()[0] : 0);
        if (targets.shape()[1] != c)
            throw ShapeError("targets " + shape_string(targets.shape()) + " do not match logits " +
                             shape_string(logits.shape()));
        softmax(logits);
        double total = 0.0;
        for (std::size_t i = 0; i < n * c; ++i) {
            total -= static_cast<double>(targets.data()[i]) * log_prob_[i];
            grad_.data()[i] -= targets.data()[i];
        }
        return finish(total, n);
    }

    /// d loss / d logits of the last forward.
    const Array& backward() const { return grad_; }

private:
    std::pair<std::size_t, std::size_t> check(const Array& logits, std::size_t labels) const {
        if (logits.dimension() != 2 || logits.shape()[1] == 0)
            throw ShapeError("SoftmaxCrossEntropyWithLogits expects (N, C) logits, got shape " +
                             shape_string(logits.shape()));
        if (logits.shape()[0] != labels)
            throw ShapeError("SoftmaxCrossEntropyWithLogits: " + std::to_string(logits.shape()[0]) +
                             " rows of logits but " + std::to_string(labels) + " labels");
        return {logits.shape()[0], logits.shape()[1]};
    }
    // grad_ = softmax(logits), log_prob_ = log softmax(logits), per row, stably.
    void softmax(const Array& logits) {
        const std::size_t n = logits.shape()[0], c = logits.shape()[1];
        detail_resize(n, c);
        for (std::size_t i = 0; i < n; ++i) {
            const float* z = logits.data() + i * c;
            float* p = grad_.data() + i * c;
            double* lp = log_prob_.data() + i * c;
            const float m = *std::max_element(z, z + c);
            double sum = 0.0;
            for (std::size_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(z[j] - m));
            const double log_sum = std::log(sum);
            for (std::size_t j = 0; j < c; ++j) {
                lp[j] = static_cast<double>(z[j] - m) - log_sum;
                p[j] = static_cast<float>(std::exp(lp[j]));
            }
        }
    }
    void detail_resize(std::size_t n, std::size_t c) {
        if (grad_.shape().size() != 2 || grad_.shape()[0] != n || grad_.shape()[1] != c) grad_.resize({n, c});
        log_prob_.resize(n * c);
    }
    float finish(double total, std::size_t n) {
        const double scale = reduction_ == Reduction::mean ? 1.0 / static_cast<double>(n) : 1.0;
        if (scale != 1.0)
            for (float& g : grad_) g = static_cast<float>(g * scale);
        return static_cast<float>(total * scale);
    }

    bool sparse_ = true;
    Reduction reduction_ = Reduction::mean;
    Array grad_;
    std::vector<double> log_prob_;
};

}  // namespace nn
