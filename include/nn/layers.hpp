#pragma once
// Layers with hand-written forward and backward passes. GEMM-shaped work goes to BLAS:
// convolution is one im2col + GEMM over the whole batch, dense layers are one GEMM each.
//
// Every layer has
//   const Array& forward(const Array& x);                   // keeps what backward needs
//   const Array& backward(const Array& dy, bool need_dx);   // fills parameter gradients
//   void parameters(std::vector<Parameter*>&);              // appends its parameters, if any
//   void initialize(std::mt19937_64&);                      // draws its initial values
// and returns references to buffers it owns, reused from step to step.
//
// Layout: Conv2d and MaxPool2d take channel-major feature maps (C, N, H, W), the layout in
// which the batched GEMM writes its result, so no transpose is needed between convolution
// layers. ToChannelMajor turns an (N, C, H, W) batch into that layout; FlattenChannelMajor
// turns it back into (N, C·H·W) rows in the usual C, H, W order.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core.hpp"
#include "init.hpp"

namespace nn {

namespace detail {
inline void expect_rank(const Array& x, std::size_t rank, const std::string& layer) {
    if (x.dimension() != rank)
        throw ShapeError(layer + " expects a " + std::to_string(rank) + "-D input, got shape " +
                         shape_string(x.shape()));
}
template <class Shape>
void resize(Array& a, const Shape& shape) {
    if (!std::equal(a.shape().begin(), a.shape().end(), shape.begin(), shape.end())) a.resize(shape);
}
inline void resize(Array& a, std::initializer_list<std::size_t> shape) {
    resize(a, std::vector<std::size_t>(shape));
}
/// Transposes a rows × cols grid of contiguous blocks of `block` floats:
/// block (r, c) of src goes to block (c, r) of dst.
inline void transpose_blocks(const float* src, float* dst, std::size_t rows, std::size_t cols, std::size_t block) {
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c)
            std::memcpy(dst + (c * rows + r) * block, src + (r * cols + c) * block, block * sizeof(float));
}
}  // namespace detail

/// Rectified linear unit, elementwise on any shape.
class ReLU {
public:
    const Array& forward(const Array& x) {
        detail::resize(y_, x.shape());
        // restrict and a branch-free form let the compiler vectorize; a branch on the sign
        // of random activations mispredicts half the time
        const float* __restrict in = x.data();
        float* __restrict out = y_.data();
        for (std::size_t i = 0, n = x.size(); i < n; ++i) out[i] = std::max(in[i], 0.0f);
        return y_;
    }
    const Array& backward(const Array& dy, bool = true) {
        detail::resize(dx_, dy.shape());
        const float* __restrict y = y_.data();
        const float* __restrict g = dy.data();
        float* __restrict out = dx_.data();
        for (std::size_t i = 0, n = dy.size(); i < n; ++i) {
            const float gi = g[i];  // loaded unconditionally, so the select needs no branch
            out[i] = y[i] > 0.0f ? gi : 0.0f;
        }
        return dx_;
    }
    void parameters(std::vector<Parameter*>&) {}
    void initialize(std::mt19937_64&) {}

private:
    Array y_, dx_;
};

/// (N, C, H, W) → channel-major (C, N, H, W).
class ToChannelMajor {
public:
    const Array& forward(const Array& x) {
        detail::expect_rank(x, 4, "ToChannelMajor");
        const std::size_t n = x.shape()[0], c = x.shape()[1], hw = x.shape()[2] * x.shape()[3];
        in_shape_ = {n, c, x.shape()[2], x.shape()[3]};
        detail::resize(y_, {c, n, x.shape()[2], x.shape()[3]});
        detail::transpose_blocks(x.data(), y_.data(), n, c, hw);
        return y_;
    }
    const Array& backward(const Array& dy, bool need_dx = true) {
        if (!need_dx) return dx_;
        const std::size_t n = in_shape_[0], c = in_shape_[1], hw = in_shape_[2] * in_shape_[3];
        detail::resize(dx_, in_shape_);
        detail::transpose_blocks(dy.data(), dx_.data(), c, n, hw);
        return dx_;
    }
    void parameters(std::vector<Parameter*>&) {}
    void initialize(std::mt19937_64&) {}

private:
    std::vector<std::size_t> in_shape_;
    Array y_, dx_;
};

/// Channel-major (C, N, H, W) → (N, C·H·W).
class FlattenChannelMajor {
public:
    const Array& forward(const Array& x) {
        detail::expect_rank(x, 4, "FlattenChannelMajor");
        in_shape_.assign(x.shape().begin(), x.shape().end());
        const std::size_t c = in_shape_[0], n = in_shape_[1], hw = in_shape_[2] * in_shape_[3];
        detail::resize(y_, {n, c * hw});
        detail::transpose_blocks(x.data(), y_.data(), c, n, hw);
        return y_;
    }
    const Array& backward(const Array& dy, bool = true) {
        const std::size_t c = in_shape_[0], n = in_shape_[1], hw = in_shape_[2] * in_shape_[3];
        detail::resize(dx_, in_shape_);
        detail::transpose_blocks(dy.data(), dx_.data(), n, c, hw);
        return dx_;
    }
    void parameters(std::vector<Parameter*>&) {}
    void initialize(std::mt19937_64&) {}

private:
    std::vector<std::size_t> in_shape_;
    Array y_, dx_;
};

/// (N, d1, d2, …) → (N, d1·d2·…), the seed's Flatten on ordinary (batch-major) input.
class Flatten {
public:
    const Array& forward(const Array& x) {
        if (x.dimension() < 1) throw ShapeError("Flatten expects an input with a batch dimension");
        in_shape_.assign(x.shape().begin(), x.shape().end());
        const std::size_t n = in_shape_[0];
        detail::resize(y_, {n, n ? x.size() / n : 0});
        std::copy(x.data(), x.data() + x.size(), y_.data());
        return y_;
    }
    const Array& backward(const Array& dy, bool need_dx = true) {
        if (!need_dx) return dx_;
        detail::resize(dx_, in_shape_);
        std::copy(dy.data(), dy.data() + dy.size(), dx_.data());
        return dx_;
    }
    void parameters(std::vector<Parameter*>&) {}
    void initialize(std::mt19937_64&) {}

private:
    std::vector<std::size_t> in_shape_;
    Array y_, dx_;
};

enum class Padding { valid, same };

struct Conv2dOptions {
    std::size_t stride = 1;
    Padding pad_mode = Padding::valid;
    bool has_bias = false;
    Initializer weight_init = HeUniform{sqrt5};
};

/// 2-D convolution on channel-major (C, N, H, W) maps; weight (out, in, k, k) as in the
/// seed. Defaults follow the seed: HeUniform(√5) weights, no bias.
class Conv2d {
public:
    using Options = Conv2dOptions;
    Conv2d(std::string name, std::size_t in_channels, std::size_t out_channels, std::size_t kernel_size,
           Options options = {})
        : in_(in_channels), out_(out_channels), k_(kernel_size), opt_(std::move(options)) {
        if (!in_ || !out_ || !k_ || !opt_.stride) throw ckpt::ConfigError("Conv2d '" + name + "': zero size");
        weight_.name = name + ".weight";
        weight_.value = Array::from_shape({out_, in_, k_, k_});
        weight_.grad = Array::from_shape({out_, in_, k_, k_});
        if (opt_.has_bias) {
            bias_.name = name + ".bias";
            bias_.value = Array::from_shape({out_});
            bias_.grad = Array::from_shape({out_});
        }
    }
    void initialize(std::mt19937_64& g) {
        nn::initialize(weight_.value, opt_.weight_init, g);
        if (opt_.has_bias) BiasUniform{fan_in(weight_.value.shape())}(bias_.value, g);
    }
    void parameters(std::vector<Parameter*>& out) {
        out.push_back(&weight_);
        if (opt_.has_bias) out.push_back(&bias_);
    }

    const Array& forward(const Array& x) {
        detail::expect_rank(x, 4, weight_.name);
        if (x.shape()[0] != in_)
            throw ShapeError(weight_.name + " expects " + std::to_string(in_) + " input channels in a (C, N, H, W) map, got shape " +
                             shape_string(x.shape()));
        n_ = x.shape()[1];
        h_ = x.shape()[2];
        w_ = x.shape()[3];
        geometry();
        const std::size_t kk = in_ * k_ * k_, p = n_ * oh_ * ow_;
        detail::resize(col_, {kk, p});
        im2col(x.data(), col_.data());
        detail::resize(y_, {out_, n_, oh_, ow_});
        blas::gemm(false, false, out_, p, kk, 1.0f, weight_.value.data(), col_.data(), 0.0f, y_.data());
        if (opt_.has_bias)
            for (std::size_t o = 0; o < out_; ++o) {
                float* row = y_.data() + o * p;
                const float b = bias_.value.data()[o];
                for (std::size_t i = 0; i < p; ++i) row[i] += b;
            }
        return y_;
    }

    const Array& backward(const Array& dy, bool need_dx = true) {
        const std::size_t kk = in_ * k_ * k_, p = n_ * oh_ * ow_;
        blas::gemm(false, true, out_, kk, p, 1.0f, dy.data(), col_.data(), 0.0f, weight_.grad.data());
        if (opt_.has_bias)
            for (std::size_t o = 0; o < out_; ++o) {
                const float* row = dy.data() + o * p;
                float s = 0.0f;
                for (std::size_t i = 0; i < p; ++i) s += row[i];
                bias_.grad.data()[o] = s;
            }
        if (!need_dx) return dx_;
        detail::resize(dcol_, {kk, p});
        blas::gemm(true, false, kk, p, out_, 1.0f, weight_.value.data(), dy.data(), 0.0f, dcol_.data());
        detail::resize(dx_, {in_, n_, h_, w_});
        dx_.fill(0.0f);
        col2im(dcol_.data(), dx_.data());
        return dx_;
    }

private:
    void geometry() {
        const std::size_t s = opt_.stride;
        if (opt_.pad_mode == Padding::valid) {
            if (h_ < k_ || w_ < k_)
                throw ShapeError(weight_.name + ": a " + std::to_string(h_) + "x" + std::to_string(w_) +
                                 " input is smaller than the " + std::to_string(k_) + "x" + std::to_string(k_) +
                                 " kernel");
            oh_ = (h_ - k_) / s + 1;
            ow_ = (w_ - k_) / s + 1;
            pt_ = pl_ = 0;
        } else {  // as TensorFlow and the seed: output ceil(in / stride), extra padding at the end
            oh_ = (h_ + s - 1) / s;
            ow_ = (w_ + s - 1) / s;
            const std::size_t ph = std::max<std::ptrdiff_t>(0, static_cast<std::ptrdiff_t>((oh_ - 1) * s + k_) -
                                                                    static_cast<std::ptrdiff_t>(h_));
            const std::size_t pw = std::max<std::ptrdiff_t>(0, static_cast<std::ptrdiff_t>((ow_ - 1) * s + k_) -
                                                                    static_cast<std::ptrdiff_t>(w_));
            pt_ = ph / 2;
            pl_ = pw / 2;
        }
    }

    // Visits every (row of col, input row) pair as f(col_offset, input_offset, first, end):
    // [first, end) are the output columns whose input column lies inside the image, and
    // input_offset is the input element of output column `first` (column ow reads
    // input_offset + (ow - first) * stride).
    template <class F>
    void for_each_patch_row(F&& f) const {
        const std::size_t s = opt_.stride, ohw = oh_ * ow_, p = n_ * ohw;
        for (std::size_t c = 0; c < in_; ++c)
            for (std::size_t kh = 0; kh < k_; ++kh)
                for (std::size_t kw = 0; kw < k_; ++kw) {
                    const std::size_t r = (c * k_ + kh) * k_ + kw;
                    // output columns ow with 0 <= ow*s + kw - pl < w
                    std::size_t first = 0;
                    while (first < ow_ && first * s + kw < pl_) ++first;
                    std::size_t end = first;
                    while (end < ow_ && end * s + kw - pl_ < w_) ++end;
                    for (std::size_t n = 0; n < n_; ++n)
                        for (std::size_t oh = 0; oh < oh_; ++oh) {
                            const std::ptrdiff_t ih = static_cast<std::ptrdiff_t>(oh * s + kh) -
                                                      static_cast<std::ptrdiff_t>(pt_);
                            const std::size_t col_off = r * p + n * ohw + oh * ow_;
                            if (ih < 0 || ih >= static_cast<std::ptrdiff_t>(h_)) f(col_off, 0, first, first);
                            else
                                f(col_off, ((c * n_ + n) * h_ + static_cast<std::size_t>(ih)) * w_ + first * s + kw - pl_,
                                  first, end);
                        }
                }
    }

    void im2col(const float* x, float* col) const {
        const std::size_t s = opt_.stride;
        if (s == 1 && pt_ == 0 && pl_ == 0 && oh_ + k_ - 1 == h_ && ow_ + k_ - 1 == w_) {
            // unpadded stride 1 (LeNet's case): plain copies of short rows, no calls
            for (std::size_t c = 0; c < in_; ++c)
                for (std::size_t kh = 0; kh < k_; ++kh)
                    for (std::size_t kw = 0; kw < k_; ++kw) {
                        float* __restrict dst = col + ((c * k_ + kh) * k_ + kw) * n_ * oh_ * ow_;
                        for (std::size_t n = 0; n < n_; ++n) {
                            const float* __restrict src = x + ((c * n_ + n) * h_ + kh) * w_ + kw;
                            for (std::size_t oh = 0; oh < oh_; ++oh, dst += ow_, src += w_)
                                for (std::size_t ow = 0; ow < ow_; ++ow) dst[ow] = src[ow];
                        }
                    }
            return;
        }
        for_each_patch_row([&](std::size_t col_off, std::size_t in_off, std::size_t first, std::size_t end) {
            float* dst = col + col_off;
            std::fill(dst, dst + first, 0.0f);
            if (first < end) {
                const float* src = x + in_off;
                if (s == 1) std::memcpy(dst + first, src, (end - first) * sizeof(float));
                else
                    for (std::size_t ow = first; ow < end; ++ow) dst[ow] = src[(ow - first) * s];
            }
            std::fill(dst + end, dst + ow_, 0.0f);
        });
    }

    void col2im(const float* col, float* dx) const {
        const std::size_t s = opt_.stride;
        if (s == 1 && pt_ == 0 && pl_ == 0 && oh_ + k_ - 1 == h_ && ow_ + k_ - 1 == w_) {
            for (std::size_t c = 0; c < in_; ++c)
                for (std::size_t kh = 0; kh < k_; ++kh)
                    for (std::size_t kw = 0; kw < k_; ++kw) {
                        const float* __restrict src = col + ((c * k_ + kh) * k_ + kw) * n_ * oh_ * ow_;
                        for (std::size_t n = 0; n < n_; ++n) {
                            float* __restrict dst = dx + ((c * n_ + n) * h_ + kh) * w_ + kw;
                            for (std::size_t oh = 0; oh < oh_; ++oh, src += ow_, dst += w_)
                                for (std::size_t ow = 0; ow < ow_; ++ow) dst[ow] += src[ow];
                        }
                    }
            return;
        }
        for_each_patch_row([col, dx, s](std::size_t col_off, std::size_t in_off, std::size_t first, std::size_t end) {
            if (s == 1) add_row(dx + in_off, col + col_off + first, end - first);
            else
                for (std::size_t ow = first; ow < end; ++ow) dx[in_off + (ow - first) * s] += col[col_off + ow];
        });
    }
    static void add_row(float* __restrict dst, const float* __restrict src, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
    }

    std::size_t in_, out_, k_;
    Options opt_;
    Parameter weight_, bias_;
    std::size_t n_ = 0, h_ = 0, w_ = 0, oh_ = 0, ow_ = 0, pt_ = 0, pl_ = 0;
    Array col_, dcol_, y_, dx_;
};

/// Max pooling over k×k windows with stride s, valid padding, on (A, B, H, W) maps (either
/// layout: each H×W plane is pooled on its own). Ties go to the first maximum.
class MaxPool2d {
public:
    MaxPool2d(std::size_t kernel_size = 2, std::size_t stride = 2) : k_(kernel_size), s_(stride) {
        if (!k_ || !s_) throw ckpt::ConfigError("MaxPool2d: zero kernel size or stride");
    }
    const Array& forward(const Array& x) {
        detail::expect_rank(x, 4, "MaxPool2d");
        in_shape_.assign(x.shape().begin(), x.shape().end());
        const std::size_t planes = in_shape_[0] * in_shape_[1], h = in_shape_[2], w = in_shape_[3];
        if (h < k_ || w < k_) throw ShapeError("MaxPool2d: input " + shape_string(x.shape()) + " smaller than the window");
        const std::size_t oh = (h - k_) / s_ + 1, ow = (w - k_) / s_ + 1;
        detail::resize(y_, {in_shape_[0], in_shape_[1], oh, ow});
        argmax_.resize(y_.size());
        for (std::size_t pl = 0; pl < planes; ++pl) {
            const float* in = x.data() + pl * h * w;
            float* out = y_.data() + pl * oh * ow;
            std::uint32_t* arg = argmax_.data() + pl * oh * ow;
            for (std::size_t i = 0; i < oh; ++i)
                for (std::size_t j = 0; j < ow; ++j) {
                    std::size_t best = i * s_ * w + j * s_;
                    for (std::size_t a = 0; a < k_; ++a)
                        for (std::size_t b = 0; b < k_; ++b) {
                            const std::size_t at = (i * s_ + a) * w + j * s_ + b;
                            if (in[at] > in[best]) best = at;
                        }
                    out[i * ow + j] = in[best];
                    arg[i * ow + j] = static_cast<std::uint32_t>(best);
                }
        }
        return y_;
    }
    const Array& backward(const Array& dy, bool need_dx = true) {
        if (!need_dx) return dx_;
        detail::resize(dx_, in_shape_);
        dx_.fill(0.0f);
        const std::size_t planes = in_shape_[0] * in_shape_[1], hw = in_shape_[2] * in_shape_[3];
        const std::size_t ohw = dy.size() / std::max<std::size_t>(planes, 1);
        for (std::size_t pl = 0; pl < planes; ++pl) {
            float* out = dx_.data() + pl * hw;
            const float* g = dy.data() + pl * ohw;
            const std::uint32_t* arg = argmax_.data() + pl * ohw;
            for (std::size_t i = 0; i < ohw; ++i) out[arg[i]] += g[i];
        }
        return dx_;
    }
    void parameters(std::vector<Parameter*>&) {}
    void initialize(std::mt19937_64&) {}

private:
    std::size_t k_, s_;
    std::vector<std::size_t> in_shape_;
    std::vector<std::uint32_t> argmax_;
    Array y_, dx_;
};

struct DenseOptions {
    Initializer weight_init = HeUniform{sqrt5};
    std::optional<Initializer> bias_init;  ///< unset: the seed's default, Uniform(±1/sqrt(in))
    bool has_bias = true;
};

/// Fully connected layer on (N, in) rows: y = x · Wᵀ + b, weight (out, in) as in the seed.
/// Defaults follow the seed: HeUniform(√5) weights, Uniform(±1/sqrt(in)) bias.
class Dense {
public:
    using Options = DenseOptions;
    Dense(std::string name, std::size_t in_features, std::size_t out_features, Options options = {})
        : in_(in_features), out_(out_features), opt_(std::move(options)) {
        if (!in_ || !out_) throw ckpt::ConfigError("Dense '" + name + "': zero size");
        weight_.name = name + ".weight";
        weight_.value = Array::from_shape({out_, in_});
        weight_.grad = Array::from_shape({out_, in_});
        if (opt_.has_bias) {
            bias_.name = name + ".bias";
            bias_.value = Array::from_shape({out_});
            bias_.grad = Array::from_shape({out_});
        }
    }
    void initialize(std::mt19937_64& g) {
        nn::initialize(weight_.value, opt_.weight_init, g);
        if (opt_.has_bias) nn::initialize(bias_.value, opt_.bias_init.value_or(BiasUniform{double(in_)}), g);
    }
    void parameters(std::vector<Parameter*>& out) {
        out.push_back(&weight_);
        if (opt_.has_bias) out.push_back(&bias_);
    }
    const Array& forward(const Array& x) {
        if (x.dimension() != 2 || x.shape()[1] != in_)
            throw ShapeError(weight_.name + " expects input (N, " + std::to_string(in_) + "), got shape " +
                             shape_string(x.shape()));
        x_ = &x;
        const std::size_t n = x.shape()[0];
        detail::resize(y_, {n, out_});
        if (opt_.has_bias)
            for (std::size_t i = 0; i < n; ++i) std::copy_n(bias_.value.data(), out_, y_.data() + i * out_);
        blas::gemm(false, true, n, out_, in_, 1.0f, x.data(), weight_.value.data(), opt_.has_bias ? 1.0f : 0.0f,
                   y_.data());
        return y_;
    }
    const Array& backward(const Array& dy, bool need_dx = true) {
        const std::size_t n = dy.shape()[0];
        blas::gemm(true, false, out_, in_, n, 1.0f, dy.data(), x_->data(), 0.0f, weight_.grad.data());
        if (opt_.has_bias) {
            float* db = bias_.grad.data();
            std::fill(db, db + out_, 0.0f);
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t o = 0; o < out_; ++o) db[o] += dy.data()[i * out_ + o];
        }
        if (!need_dx) return dx_;
        detail::resize(dx_, {n, in_});
        blas::gemm(false, false, n, in_, out_, 1.0f, dy.data(), weight_.value.data(), 0.0f, dx_.data());
        return dx_;
    }

private:
    std::size_t in_, out_;
    Options opt_;
    Parameter weight_, bias_;
    const Array* x_ = nullptr;  // the input of the last forward (owned by the layer before)
    Array y_, dx_;
};

/// y = x · P with a parameter P of shape (in, out) and no bias: the seed's MatMulCell.
class MatMul {
public:
    MatMul(std::string name, std::size_t in_features, std::size_t out_features, Initializer init = HeUniform{sqrt5})
        : in_(in_features), out_(out_features), init_(std::move(init)) {
        param_.name = std::move(name);
        param_.value = Array::from_shape({in_, out_});
        param_.grad = Array::from_shape({in_, out_});
    }
    void initialize(std::mt19937_64& g) { nn::initialize(param_.value, init_, g); }
    void parameters(std::vector<Parameter*>& out) { out.push_back(&param_); }
    const Array& forward(const Array& x) {
        if (x.dimension() != 2 || x.shape()[1] != in_)
            throw ShapeError(param_.name + " expects input (N, " + std::to_string(in_) + "), got shape " +
                             shape_string(x.shape()));
        x_ = &x;
        detail::resize(y_, {x.shape()[0], out_});
        blas::gemm(false, false, x.shape()[0], out_, in_, 1.0f, x.data(), param_.value.data(), 0.0f, y_.data());
        return y_;
    }
    const Array& backward(const Array& dy, bool need_dx = true) {
        const std::size_t n = dy.shape()[0];
        blas::gemm(true, false, in_, out_, n, 1.0f, x_->data(), dy.data(), 0.0f, param_.grad.data());
        if (!need_dx) return dx_;
        detail::resize(dx_, {n, in_});
        blas::gemm(false, true, n, in_, out_, 1.0f, dy.data(), param_.value.data(), 0.0f, dx_.data());
        return dx_;
    }

private:
    std::size_t in_, out_;
    Initializer init_;
    Parameter param_;
    const Array* x_ = nullptr;
    Array y_, dx_;
};

/// Layers applied in order. Composition is static: the layer types are template arguments.
template <class... Layers>
class Sequential {
public:
    explicit Sequential(Layers... layers) : layers_(std::move(layers)...) {}

    const Array& forward(const Array& x) {
        const Array* cur = &x;
        std::apply([&](auto&... l) { ((cur = &l.forward(*cur)), ...); }, layers_);
        return *cur;
    }
    /// Backward through all layers; the first computes no input gradient unless `need_dx`.
    const Array& backward(const Array& dy, bool need_dx = false) {
        const Array* cur = &dy;
        backward_from<sizeof...(Layers)>(cur, need_dx);
        return *cur;
    }
    void parameters(std::vector<Parameter*>& out) {
        std::apply([&](auto&... l) { (l.parameters(out), ...); }, layers_);
    }
    void initialize(std::mt19937_64& g) {
        std::apply([&](auto&... l) { (l.initialize(g), ...); }, layers_);
    }
    template <std::size_t I>
    auto& layer() {
        return std::get<I>(layers_);
    }

private:
    template <std::size_t I>
    void backward_from(const Array*& cur, bool need_dx) {
        if constexpr (I > 0) {
            cur = &std::get<I - 1>(layers_).backward(*cur, I > 1 || need_dx);
            backward_from<I - 1>(cur, need_dx);
        }
    }
    std::tuple<Layers...> layers_;
};

}  // namespace nn
