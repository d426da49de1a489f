#pragma once
// libtorch glue. Not part of ckpt.hpp: link the CMake target ckpt::torch (Debian's
// libtorch-dev) and include this header.
//
//   ckpt::TorchState state(net, optimizer);      // parameters, buffers, optimizer state
//   state.scheduler(lr_scheduler);               // optional: its position
//   state.add("epoch", ckpt::view_of(epoch));    // optional: your own values, as views
//   mgr.restore(state);  …  mgr.on_step(progress, state);
//
// What a TorchState saves, by name:
//   model.{name}                        each parameter and buffer of the module, recursively,
//                                       under PyTorch's own names ("features.0.weight",
//                                       "bn.running_mean"); views: nothing is copied to save
//                                       them, and a load writes into the module's tensors
//   optimizer.kind                      "SGD", "Adam", "AdamW", "RMSprop" or "Adagrad"
//   optimizer.group.{g}.params          the names of param group g's parameters, one a line
//   optimizer.group.{g}.{option}        its options (lr, betas.0, betas.1, eps, momentum, …)
//   optimizer.state.{name}.{field}      a parameter's state (step, exp_avg, exp_avg_sq,
//                                       max_exp_avg_sq, momentum_buffer, square_avg,
//                                       grad_avg, sum), keyed by the parameter's name so that
//                                       another process's optimizer takes it
//   scheduler.step_count                the learning-rate scheduler's position
//   torch.cpu_generator                 the default CPU generator's state, so that a resumed
//                                       run draws the same numbers
//
// Optimizers create a parameter's state at its first step. A load therefore shapes the
// optimizer after the file it reads (ShapedByCheckpoint): it creates the state the file has
// and drops the state the file does not have, then loads into it. Tensors must be on the CPU,
// contiguous, and of a dtype ckpt stores (float32, float64, float16, int32, int64, uint8,
// bool); any other is refused, naming it, when the state is collected.

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ckpt.hpp"

namespace ckpt {

/// ckpt's dtype of a torch scalar type, if it has one.
inline std::optional<DType> dtype_of_torch(c10::ScalarType t) {
    switch (t) {
        case c10::ScalarType::Float: return DType::float32;
        case c10::ScalarType::Double: return DType::float64;
        case c10::ScalarType::Half: return DType::float16;
        case c10::ScalarType::Int: return DType::int32;
        case c10::ScalarType::Long: return DType::int64;
        case c10::ScalarType::Byte: return DType::uint8;
        case c10::ScalarType::Bool: return DType::boolean;
        default: return std::nullopt;
    }
}

/// A view of a torch tensor's memory under `name`: saving reads it, loading writes it. The
/// tensor must be on the CPU, contiguous and of a dtype ckpt stores; ConfigError otherwise.
inline Tensor torch_view(const at::Tensor& t, std::string_view name) {
    const std::string what = "torch tensor '" + std::string(name) + "'";
    if (!t.defined()) throw ConfigError(what + " is undefined");
    if (!t.device().is_cpu())
        throw ConfigError(what + " is on " + t.device().str() + ": ckpt reads CPU tensors (move it with .cpu() first)");
    const auto dtype = dtype_of_torch(t.scalar_type());
    if (!dtype)
        throw ConfigError(what + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                          ", which ckpt does not store (float32, float64, float16, int32, int64, uint8, bool)");
    if (!t.is_contiguous())
        throw ConfigError(what + " is not contiguous: call .contiguous() on it, or store a contiguous copy");
    Shape shape(t.sizes().begin(), t.sizes().end());
    return Tensor::view(*dtype, std::move(shape), t.data_ptr());
}

/// Views of a module's parameters and buffers, recursively, under PyTorch's names with
/// `prefix` before each.
inline ParamDict torch_state_dict(const torch::nn::Module& module, std::string_view prefix = "") {
    ParamDict dict;
    auto add = [&](const std::string& key, const at::Tensor& t) {
        const std::string name = std::string(prefix) + key;
        if (dict.contains(name)) throw ConfigError("two tensors of the module are named '" + name + "'");
        dict.set(name, torch_view(t, name));
    };
    for (const auto& item : module.named_parameters(/*recurse=*/true)) add(item.key(), item.value());
    for (const auto& item : module.named_buffers(/*recurse=*/true))
        if (item.value().defined()) add(item.key(), item.value());
    return dict;
}

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

}  // namespace detail::torch_glue

/// How a TorchState names the module's tensors, and whether it saves the CPU generator.
struct TorchStateOptions {
    std::string model_prefix = "model.";  ///< before each parameter's and buffer's name
    bool generator = true;                ///< the default CPU generator's state
};

/// A libtorch training state as one checkpointable object (see the top of this file):
/// CheckpointManager::on_step/save/restore, save_checkpoint(state.state_dict(), …) and
/// load_checkpoint_into take it. It refers to the module, optimizer and scheduler it was
/// given, which must outlive it.
class TorchState {
public:
    using Options = TorchStateOptions;

    explicit TorchState(torch::nn::Module& model, Options options = {}) : TorchState(model, nullptr, std::move(options)) {}
    TorchState(torch::nn::Module& model, torch::optim::Optimizer& optimizer, Options options = {})
        : TorchState(model, &optimizer, std::move(options)) {}
    /// A module held by a ModuleHolder (torch::nn::Linear, a TORCH_MODULE of your own).
    template <class Holder>
        requires requires(Holder& h) { { *h.ptr() } -> std::convertible_to<torch::nn::Module&>; }
    explicit TorchState(Holder& model, Options options = {}) : TorchState(*model.ptr(), std::move(options)) {}
    template <class Holder>
        requires requires(Holder& h) { { *h.ptr() } -> std::convertible_to<torch::nn::Module&>; }
    TorchState(Holder& model, torch::optim::Optimizer& optimizer, Options options = {})
        : TorchState(*model.ptr(), optimizer, std::move(options)) {}

    /// Also saves and restores `s`'s position (how many times step() was called; the
    /// optimizer's learning rates are restored with its param groups).
    TorchState& scheduler(torch::optim::LRScheduler& s) {
        scheduler_ = &s;
        return *this;
    }
    /// Also saves and loads `value` (a view of your own variable, e.g. ckpt::view_of(epoch)).
    TorchState& add(std::string name, Value value) {
        if (name.starts_with(detail::reserved_name_prefix))
            throw ConfigError("'" + name + "' starts with the reserved prefix '__ckpt.'");
        extra_.set(std::move(name), std::move(value));
        return *this;
    }

    /// What a save writes: views of the module's tensors and of the optimizer's state, copies
    /// of the few values kept elsewhere (the scheduler's position, the generator's state).
    ParamDict state_dict() {
        ParamDict d = base();
        if (optimizer_) {
            auto& states = optimizer_->state();
            for (const auto& [key, name] : param_names_) {
                const auto it = states.find(key);
                if (it != states.end()) add_param_state(d, name, *it->second);
            }
        }
        if (scheduler_) d.set("scheduler.step_count", std::int64_t{detail::torch_glue::SchedulerAccess::step_count(*scheduler_)});
        if (options_.generator) {
            const auto state = generator_state();
            d.set("torch.cpu_generator", Tensor::from(std::span<const std::uint8_t>(state), Shape{static_cast<std::int64_t>(state.size())}));
        }
        return d;
    }

    /// What a load writes into, shaped after the file (ShapedByCheckpoint): the optimizer
    /// gets state for exactly the parameters whose state the file holds.
    ParamDict state_dict_for(const std::vector<EntryInfo>& entries) {
        std::map<std::string, const EntryInfo*, std::less<>> in_file;
        for (const auto& e : entries) in_file.emplace(e.name, &e);
        ParamDict d = base();
        if (optimizer_) shape_optimizer(d, in_file);
        if (scheduler_) d.set("scheduler.step_count", view_of(scheduler_count_));
        if (options_.generator) {
            // the size libtorch's generator gives (a file of another size is a mismatch)
            loaded_generator_.assign(generator_state().size(), 0);
            d.set("torch.cpu_generator", view_of(loaded_generator_));
        }
        return d;
    }

    /// After a load: hands the scheduler its position and the generator its state, when the
    /// file had them.
    void loaded(const LoadReport& report) {
        auto was_loaded = [&](std::string_view name) {
            return std::find(report.param_not_load.begin(), report.param_not_load.end(), name) ==
                   report.param_not_load.end();
        };
        if (scheduler_ && was_loaded("scheduler.step_count")) {
            if (scheduler_count_ < 0 || scheduler_count_ > std::numeric_limits<unsigned>::max())
                throw LoadMismatch("scheduler.step_count " + std::to_string(scheduler_count_) + " is out of range");
            detail::torch_glue::SchedulerAccess::step_count(*scheduler_) = static_cast<unsigned>(scheduler_count_);
        }
        if (options_.generator && was_loaded("torch.cpu_generator")) {
            auto state = at::empty({static_cast<std::int64_t>(loaded_generator_.size())}, at::kByte);
            std::memcpy(state.data_ptr(), loaded_generator_.data(), loaded_generator_.size());
            auto gen = at::detail::getDefaultCPUGenerator();
            std::lock_guard lock(gen.mutex());
            gen.set_state(state);
        }
    }

private:
    using Kind = detail::torch_glue::OptimizerKind;

    TorchState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, Options options)
        : model_(model), optimizer_(optimizer), options_(std::move(options)) {
        if (!optimizer_) return;
        for (const auto& k : detail::torch_glue::optimizer_kinds())
            if (k.is(*optimizer_)) kind_ = &k;
        if (!kind_)
            throw ConfigError("ckpt::TorchState saves the state of SGD, Adam, AdamW, RMSprop and Adagrad; this "
                              "optimizer is another kind");
        std::unordered_map<std::string, std::string> by_key;
        for (const auto& item : model_.named_parameters(/*recurse=*/true))
            by_key.emplace(detail::torch_glue::state_key(item.value()), item.key());
        const auto& groups = optimizer_->param_groups();
        group_names_.resize(groups.size());
        for (std::size_t g = 0; g < groups.size(); ++g) {
            const auto& params = groups[g].params();
            for (std::size_t i = 0; i < params.size(); ++i) {
                const auto key = detail::torch_glue::state_key(params[i]);
                const auto it = by_key.find(key);
                if (it == by_key.end())
                    throw ConfigError("parameter " + std::to_string(i) + " of the optimizer's param group " +
                                      std::to_string(g) + " (shape " + c10::str(params[i].sizes()) +
                                      ") is not a parameter of the module: its state could not be named");
                param_names_.emplace(key, it->second);
                group_names_[g] += (group_names_[g].empty() ? "" : "\n") + it->second;
            }
        }
    }

    /// The module, the optimizer's kind and options, and the user's values.
    ParamDict base() {
        ParamDict d = torch_state_dict(model_, options_.model_prefix);
        if (optimizer_) {
            d.set("optimizer.kind", kind_->name);
            auto& groups = optimizer_->param_groups();
            for (std::size_t g = 0; g < groups.size(); ++g) {
                const std::string p = "optimizer.group." + std::to_string(g) + ".";
                d.set(p + "params", group_names_[g]);
                kind_->options(groups[g].options(), d, p);
            }
        }
        for (const auto& [name, value] : extra_) {
            if (d.contains(name)) throw ConfigError("the value added as '" + name + "' has the name of a torch tensor");
            d.set(name, value);
        }
        return d;
    }

    /// Views of one parameter's state: its step and its defined tensors.
    void add_param_state(ParamDict& d, const std::string& name, torch::optim::OptimizerParamState& s) {
        const std::string p = "optimizer.state." + name + ".";
        if (kind_->step) d.set(p + "step", view_of(*kind_->step(s)));
        for (const auto& f : kind_->tensors) {
            at::Tensor& t = f.get(s);
            if (t.defined()) d.set(p + f.name, torch_view(t, p + f.name));
        }
    }

    /// Gives the optimizer the state the file holds, in fresh or reused tensors, and returns
    /// their views. The param groups must hold the same parameters as the saved ones.
    void shape_optimizer(ParamDict& d, const std::map<std::string, const EntryInfo*, std::less<>>& in_file) {
        const auto kind = in_file.find("optimizer.kind");
        if (kind != in_file.end()) {
            const auto* saved = kind->second->scalar.get_if<std::string>();
            if (saved && *saved != kind_->name)
                throw LoadMismatch("the checkpoint holds the state of a " + *saved + " optimizer; this one is " +
                                   kind_->name);
        }
        auto& groups = optimizer_->param_groups();
        for (std::size_t g = 0; g < groups.size(); ++g) {
            const auto it = in_file.find("optimizer.group." + std::to_string(g) + ".params");
            const auto* saved = it == in_file.end() ? nullptr : it->second->scalar.get_if<std::string>();
            if (saved && *saved != group_names_[g])
                throw LoadMismatch("param group " + std::to_string(g) + " of the checkpoint's optimizer holds other "
                                   "parameters than this optimizer's: saved '" + *saved + "', here '" +
                                   group_names_[g] + "' (one name a line)");
        }
        auto& states = optimizer_->state();
        for (auto& group : groups) {
            for (auto& param : group.params()) {
                const auto key = detail::torch_glue::state_key(param);
                const std::string& name = param_names_.at(key);
                const std::string p = "optimizer.state." + name + ".";
                bool saved = kind_->step && in_file.contains(p + "step");
                for (const auto& f : kind_->tensors) saved = saved || in_file.contains(p + f.name);
                if (!saved) {
                    states.erase(key);  // none saved: as before its first step
                    continue;
                }
                auto& slot = states[key];
                if (!slot) slot = kind_->make();
                for (const auto& f : kind_->tensors) {
                    at::Tensor& t = f.get(*slot);
                    if (!in_file.contains(p + f.name)) {
                        t = at::Tensor();
                    } else if (!t.defined() || !t.sizes().equals(param.sizes()) ||
                               t.scalar_type() != param.scalar_type() || !t.is_contiguous()) {
                        t = at::zeros_like(param, at::MemoryFormat::Contiguous);
                    }
                }
                add_param_state(d, name, *slot);
            }
        }
    }

    static std::vector<std::uint8_t> generator_state() {
        auto gen = at::detail::getDefaultCPUGenerator();
        std::lock_guard lock(gen.mutex());
        const at::Tensor t = gen.get_state();
        const auto* p = static_cast<const std::uint8_t*>(t.data_ptr());
        return {p, p + t.numel()};
    }

    torch::nn::Module& model_;
    torch::optim::Optimizer* optimizer_;
    Options options_;
    const Kind* kind_ = nullptr;
    std::unordered_map<std::string, std::string> param_names_;  // state key -> parameter name
    std::vector<std::string> group_names_;                       // per param group: names, one a line
    torch::optim::LRScheduler* scheduler_ = nullptr;
    ParamDict extra_;
    std::int64_t scheduler_count_ = 0;
    std::vector<std::uint8_t> loaded_generator_;
};

}  // namespace ckpt
