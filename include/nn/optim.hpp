#pragma once
// Optimizers. Their state (momentum buffers) is named after the parameters, as in the
// seed's checkpoints ("moments.fc1.weight"), so that it is saved and resumed with them.
//
// An optimizer has
//   void step();                              // applies the parameters' gradients
//   ckpt::ParamDict state_dict();             // views of its state tensors, loadable in place
//   ckpt::ParamDict hyperparameters() const;  // learning_rate, momentum, …: saved, not loaded

#include <cstddef>
#include <string>
#include <vector>

#include "core.hpp"

namespace nn {

namespace detail {
inline std::vector<Parameter> state_like(const std::vector<Parameter*>& params, const std::string& prefix) {
    std::vector<Parameter> state;
    state.reserve(params.size());
    for (Parameter* p : params) {
        Parameter s;
        s.name = prefix + p->name;
        s.value = Array::from_shape(p->value.shape());
        s.value.fill(0.0f);
        state.push_back(std::move(s));
    }
    return state;
}
inline ckpt::ParamDict views_of(std::vector<Parameter>& state) {
    ckpt::ParamDict d;
    for (Parameter& s : state) d.set(s.name, ckpt::view_of(s.value));
    return d;
}
inline void check_hyper(double v, const char* what, const char* opt) {
    if (!(v >= 0.0)) throw ckpt::ConfigError(std::string(opt) + ": " + what + " must be >= 0, got " + std::to_string(v));
}
}  // namespace detail

/// The seed's Momentum (ApplyMomentum): accum = momentum·accum + g; p -= lr·accum, or with
/// use_nesterov p -= lr·(g + momentum·accum). With weight_decay, g = grad + weight_decay·p.
class Momentum {
public:
    Momentum(std::vector<Parameter*> params, double learning_rate, double momentum, double weight_decay = 0.0,
             bool use_nesterov = false)
        : params_(std::move(params)), lr_(learning_rate), momentum_(momentum), wd_(weight_decay),
          nesterov_(use_nesterov), moments_(detail::state_like(params_, "moments.")) {
        detail::check_hyper(lr_, "learning_rate", "Momentum");
        detail::check_hyper(momentum_, "momentum", "Momentum");
        detail::check_hyper(wd_, "weight_decay", "Momentum");
    }
    void step() {
        const auto lr = static_cast<float>(lr_), mu = static_cast<float>(momentum_), wd = static_cast<float>(wd_);
        for (std::size_t k = 0; k < params_.size(); ++k) {
            float* p = params_[k]->value.data();
            const float* g = params_[k]->grad.data();
            float* a = moments_[k].value.data();
            for (std::size_t i = 0, n = params_[k]->value.size(); i < n; ++i) {
                const float grad = wd != 0.0f ? g[i] + wd * p[i] : g[i];
                a[i] = mu * a[i] + grad;
                p[i] -= nesterov_ ? lr * (grad + mu * a[i]) : lr * a[i];
            }
        }
    }
    ckpt::ParamDict state_dict() { return detail::views_of(moments_); }
    ckpt::ParamDict hyperparameters() const {
        return ckpt::ParamDict{{"learning_rate", lr_}, {"momentum", momentum_}, {"weight_decay", wd_}};
    }
    const std::vector<Parameter*>& parameters() const noexcept { return params_; }

private:
    std::vector<Parameter*> params_;
    double lr_, momentum_, wd_;
    bool nesterov_;
    std::vector<Parameter> moments_;
};

/// The seed's SGD: with momentum > 0, accum = momentum·accum + (1 − dampening)·g (accum = g
/// on the first step), g = nesterov ? g + momentum·accum : accum; then p -= lr·g.
class SGD {
public:
    explicit SGD(std::vector<Parameter*> params, double learning_rate = 0.1, double momentum = 0.0,
                 double dampening = 0.0, double weight_decay = 0.0, bool nesterov = false)
        : params_(std::move(params)), lr_(learning_rate), momentum_(momentum), dampening_(dampening),
          wd_(weight_decay), nesterov_(nesterov), accum_(detail::state_like(params_, "accum.")) {
        detail::check_hyper(lr_, "learning_rate", "SGD");
        detail::check_hyper(momentum_, "momentum", "SGD");
        detail::check_hyper(dampening_, "dampening", "SGD");
        detail::check_hyper(wd_, "weight_decay", "SGD");
        if (nesterov_ && (momentum_ <= 0.0 || dampening_ != 0.0))
            throw ckpt::ConfigError("SGD: nesterov needs momentum > 0 and dampening 0");
        stat_.name = "stat";
        stat_.value = Array::from_shape({1});
        stat_.value(0) = 1.0f;  // 1 until the first step, as in the seed
    }
    void step() {
        const auto lr = static_cast<float>(lr_), mu = static_cast<float>(momentum_),
                   keep = static_cast<float>(1.0 - dampening_), wd = static_cast<float>(wd_);
        const bool first = stat_.value(0) != 0.0f;
        for (std::size_t k = 0; k < params_.size(); ++k) {
            float* p = params_[k]->value.data();
            const float* g = params_[k]->grad.data();
            float* a = accum_[k].value.data();
            for (std::size_t i = 0, n = params_[k]->value.size(); i < n; ++i) {
                float grad = wd != 0.0f ? g[i] + wd * p[i] : g[i];
                if (mu != 0.0f) {
                    a[i] = first ? grad : mu * a[i] + keep * grad;
                    grad = nesterov_ ? grad + mu * a[i] : a[i];
                }
                p[i] -= lr * grad;
            }
        }
        stat_.value(0) = 0.0f;
    }
    ckpt::ParamDict state_dict() {
        ckpt::ParamDict d = momentum_ != 0.0 ? detail::views_of(accum_) : ckpt::ParamDict{};
        d.set(stat_.name, ckpt::view_of(stat_.value));
        return d;
    }
    ckpt::ParamDict hyperparameters() const {
        return ckpt::ParamDict{{"learning_rate", lr_},
                               {"momentum", momentum_},
                               {"dampening", dampening_},
                               {"weight_decay", wd_}};
    }
    const std::vector<Parameter*>& parameters() const noexcept { return params_; }

private:
    std::vector<Parameter*> params_;
    double lr_, momentum_, dampening_, wd_;
    bool nesterov_;
    std::vector<Parameter> accum_;
    Parameter stat_;
};

}  // namespace nn
