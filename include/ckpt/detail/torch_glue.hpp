#pragma once
// What TorchState (types/torch.hpp) needs to know of libtorch's optimizers and schedulers:
// each optimizer kind's options and per-parameter state fields, by name, and the members of
// StepLR that libtorch does not expose. Needs libtorch (the CMake target ckpt::torch).

#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "../ckpt.hpp"

namespace ckpt {

namespace detail::torch_glue {

namespace optim = ::torch::optim;

/// The state field of one optimizer kind: its name in the checkpoint and where it lives.
struct TensorField {
    const char* name;
    at::Tensor& (*get)(optim::OptimizerParamState&);
};

/// How one optimizer kind keeps its state: what makes a fresh state, its step counter (if
/// any), its tensors, and views of a param group's options.
struct OptimizerKind {
    const char* name;
    bool (*is)(const optim::Optimizer&);
    std::unique_ptr<optim::OptimizerParamState> (*make)();
    std::int64_t* (*step)(optim::OptimizerParamState&);
    std::vector<TensorField> tensors;
    void (*options)(optim::OptimizerOptions&, ParamDict&, const std::string& prefix);
};

template <class O>
bool is(const optim::Optimizer& o) {
    return dynamic_cast<const O*>(&o) != nullptr;
}
template <class S>
std::unique_ptr<optim::OptimizerParamState> make() {
    return std::make_unique<S>();
}
template <class S>
std::int64_t* step(optim::OptimizerParamState& s) {
    return &static_cast<S&>(s).step();
}
template <class S>
S& as(optim::OptimizerParamState& s) {
    return static_cast<S&>(s);
}

template <class Options>
void adam_options(optim::OptimizerOptions& o, ParamDict& d, const std::string& p) {
    auto& a = static_cast<Options&>(o);
    d.set(p + "lr", view_of(a.lr()));
    d.set(p + "betas.0", view_of(std::get<0>(a.betas())));
    d.set(p + "betas.1", view_of(std::get<1>(a.betas())));
    d.set(p + "eps", view_of(a.eps()));
    d.set(p + "weight_decay", view_of(a.weight_decay()));
    d.set(p + "amsgrad", view_of(a.amsgrad()));
}

inline const std::vector<OptimizerKind>& optimizer_kinds() {
    static const std::vector<OptimizerKind> kinds = {
        {"SGD", is<optim::SGD>, make<optim::SGDParamState>, nullptr,
         {{"momentum_buffer", [](auto& s) -> at::Tensor& { return as<optim::SGDParamState>(s).momentum_buffer(); }}},
         [](optim::OptimizerOptions& o, ParamDict& d, const std::string& p) {
             auto& a = static_cast<optim::SGDOptions&>(o);
             d.set(p + "lr", view_of(a.lr()));
             d.set(p + "momentum", view_of(a.momentum()));
             d.set(p + "dampening", view_of(a.dampening()));
             d.set(p + "weight_decay", view_of(a.weight_decay()));
             d.set(p + "nesterov", view_of(a.nesterov()));
         }},
        {"Adam", is<optim::Adam>, make<optim::AdamParamState>, step<optim::AdamParamState>,
         {{"exp_avg", [](auto& s) -> at::Tensor& { return as<optim::AdamParamState>(s).exp_avg(); }},
          {"exp_avg_sq", [](auto& s) -> at::Tensor& { return as<optim::AdamParamState>(s).exp_avg_sq(); }},
          {"max_exp_avg_sq", [](auto& s) -> at::Tensor& { return as<optim::AdamParamState>(s).max_exp_avg_sq(); }}},
         adam_options<optim::AdamOptions>},
        {"AdamW", is<optim::AdamW>, make<optim::AdamWParamState>, step<optim::AdamWParamState>,
         {{"exp_avg", [](auto& s) -> at::Tensor& { return as<optim::AdamWParamState>(s).exp_avg(); }},
          {"exp_avg_sq", [](auto& s) -> at::Tensor& { return as<optim::AdamWParamState>(s).exp_avg_sq(); }},
          {"max_exp_avg_sq", [](auto& s) -> at::Tensor& { return as<optim::AdamWParamState>(s).max_exp_avg_sq(); }}},
         adam_options<optim::AdamWOptions>},
        {"RMSprop", is<optim::RMSprop>, make<optim::RMSpropParamState>, step<optim::RMSpropParamState>,
         {{"square_avg", [](auto& s) -> at::Tensor& { return as<optim::RMSpropParamState>(s).square_avg(); }},
          {"momentum_buffer", [](auto& s) -> at::Tensor& { return as<optim::RMSpropParamState>(s).momentum_buffer(); }},
          {"grad_avg", [](auto& s) -> at::Tensor& { return as<optim::RMSpropParamState>(s).grad_avg(); }}},
         [](optim::OptimizerOptions& o, ParamDict& d, const std::string& p) {
             auto& a = static_cast<optim::RMSpropOptions&>(o);
             d.set(p + "lr", view_of(a.lr()));
             d.set(p + "alpha", view_of(a.alpha()));
             d.set(p + "eps", view_of(a.eps()));
             d.set(p + "weight_decay", view_of(a.weight_decay()));
             d.set(p + "momentum", view_of(a.momentum()));
             d.set(p + "centered", view_of(a.centered()));
         }},
        {"Adagrad", is<optim::Adagrad>, make<optim::AdagradParamState>, step<optim::AdagradParamState>,
         {{"sum", [](auto& s) -> at::Tensor& { return as<optim::AdagradParamState>(s).sum(); }}},
         [](optim::OptimizerOptions& o, ParamDict& d, const std::string& p) {
             auto& a = static_cast<optim::AdagradOptions&>(o);
             d.set(p + "lr", view_of(a.lr()));
             d.set(p + "lr_decay", view_of(a.lr_decay()));
             d.set(p + "weight_decay", view_of(a.weight_decay()));
             d.set(p + "initial_accumulator_value", view_of(a.initial_accumulator_value()));
             d.set(p + "eps", view_of(a.eps()));
         }},
    };
    return kinds;
}

/// The key libtorch's optimizers file a parameter's state under.
inline std::string state_key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

/// LRScheduler keeps its position in a protected member; a derived class may name it.
struct SchedulerAccess : optim::LRScheduler {
    static unsigned& step_count(optim::LRScheduler& s) { return s.*(&SchedulerAccess::step_count_); }
};

// StepLR keeps its step size and gamma private, with no getter. Access is not checked on the
// template arguments of an explicit specialization (C++20, P0692): naming the members there
// instantiates Expose, whose friend hands out the member pointers.
template <class Tag, auto Member>
struct Expose {
    friend constexpr auto member(Tag) { return Member; }
};
struct StepSize {
    friend constexpr auto member(StepSize);
};
struct Gamma {
    friend constexpr auto member(Gamma);
};
template <class T, std::size_t = sizeof(T)>
struct Instantiate {};
template <>
struct Instantiate<Expose<StepSize, &optim::StepLR::step_size_>> {};
template <>
struct Instantiate<Expose<Gamma, &optim::StepLR::gamma_>> {};

inline unsigned step_size(const optim::StepLR& s) { return s.*member(StepSize{}); }
inline double gamma(const optim::StepLR& s) { return s.*member(Gamma{}); }

/// libtorch's StepLR after `calls` step() calls from learning rate `lr` at none: it multiplies
/// by gamma at the calls after a multiple of step_size (PyTorch's at the multiples).
inline double libtorch_step_lr(double lr, std::int64_t calls, std::int64_t step_size, double gamma) {
    for (std::int64_t i = 0; calls > 0 && step_size > 0 && i < (calls - 1) / step_size; ++i) lr = gamma * lr;
    return lr;
}

/// A number as text, in its shortest exact form ("0.001", "5").
template <class T>
std::string text(T v) {
    char buf[32];
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

/// A param-group option's value (a 0-d view) as text.
inline std::string option_text(const Tensor& t) {
    switch (t.dtype()) {
        case DType::float64: return text(t.values<double>()[0]);
        case DType::boolean: return t.values<bool>()[0] ? "true" : "false";
        default: return t.describe();
    }
}

/// A tensor's elements as doubles (float64 or int64, as Python writes a list of numbers).
inline std::vector<double> doubles_of(const Tensor& t) {
    std::vector<double> out;
    if (t.dtype() == DType::float64)
        for (double v : t.values<double>()) out.push_back(v);
    else if (t.dtype() == DType::int64)
        for (std::int64_t v : t.values<std::int64_t>()) out.push_back(static_cast<double>(v));
    return out;
}

inline std::string quoted_list(const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
    return s;
}

}  // namespace detail::torch_glue

}  // namespace ckpt
