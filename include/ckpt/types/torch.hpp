#pragma once
// libtorch glue. Not part of ckpt.hpp: link the CMake target ckpt::torch (Debian's
// libtorch-dev) and include this header.
//
//   ckpt::TorchState state(net, optimizer);      // parameters, buffers, optimizer state
//   state.scheduler(lr_scheduler);               // optional: its whole state
//   state.data_position(position);               // optional: the data's seed, batch size, epoch, step
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
//   scheduler.kind                      the learning-rate scheduler's class: "StepLR", or the
//                                       name of your own class (SchedulerState::step_count_only)
//   scheduler.convention                whose rules computed its learning rates: "libtorch" here,
//                                       "pytorch" from Python (python/ckpt/torch.py)
//   scheduler.last_epoch                how many times its step() was called (PyTorch's name, of
//                                       the same count)
//   scheduler.step_size, scheduler.gamma   a StepLR's settings
//   scheduler.{field}                   from Python: the rest of PyTorch's state_dict() of it
//                                       (base_lrs, _last_lr, …), read here for the conversion below
//   data.seed, data.batch_size          with data_position(): what the samples of a step depend
//                                       on; a resume under others is refused, naming them
//   data.epoch, data.step               with data_position(): where the run is in its data
//   torch.cpu_generator                 the default CPU generator's state, so that a resumed
//                                       run draws the same numbers
// (Files written before schedulers were saved whole hold "scheduler.step_count" alone; they
// still load, with a notice.)
//
// Optimizers create a parameter's state at its first step. A load therefore shapes the
// optimizer after the file it reads (ShapedByCheckpoint): it creates the state the file has
// and drops the state the file does not have, then loads into it. Tensors must be on the CPU,
// contiguous, and of a dtype ckpt stores (float32, float64, float16, int32, int64, uint8,
// bool); any other is refused, naming it, when the state is collected.
//
// What a load changes, it says (through ckpt's log, once per load, as notices): param-group
// options that differ from what the optimizer had (a new learning rate gives way to the
// checkpoint's: set it after restore() to keep it; a rate a StepLR reached by its own schedule
// is no news), a scheduler whose settings differ from the file's, a schedule continued from
// the other language's StepLR, and, in a non-strict load,
// the parameters whose optimizer state was not loaded because the model gained or lost them.
// Such a parameter is also named in the LoadReport, as "optimizer.state.{name}" (param_not_load)
// for one that gets no state, and by its state's entries (ckpt_not_load) for one left out.
//
// libtorch's StepLR lowers the learning rate one step() later than PyTorch's (at calls
// step_size + 1, 2 step_size + 1, …, PyTorch's at step_size, 2 step_size, …). The position
// means the same on both sides; at a boundary (last_epoch a multiple of step_size) the two
// disagree by one factor gamma, so a load from a "pytorch" file there sets the learning rate
// libtorch's StepLR would have, and Python's load does the reverse: each side goes on as an
// unbroken run of its own would.

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "../ckpt.hpp"
#include "../detail/torch_glue.hpp"

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
        case c10::ScalarType::Char: return DType::int8;
        case c10::ScalarType::Short: return DType::int16;
        case c10::ScalarType::BFloat16: return DType::bfloat16;
        case c10::ScalarType::ComplexFloat: return DType::complex64;
        case c10::ScalarType::ComplexDouble: return DType::complex128;
        default: return std::nullopt;  // quantized types; libtorch 1.13 has no unsigned above 8 bits, nor float8
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
                          ", which ckpt does not store (a quantized dtype: dequantize it first)");
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

/// How a TorchState names the module's tensors, and whether it saves the CPU generator.
struct TorchStateOptions {
    std::string model_prefix = "model.";  ///< before each parameter's and buffer's name
    bool generator = true;                ///< the default CPU generator's state
};

/// What of a learning-rate scheduler TorchState::scheduler() saves. `whole`: every member of
/// one of the classes ckpt knows (libtorch's StepLR: its position, step size and gamma);
/// another class is refused, by name. `step_count_only`: the position alone, for a class of
/// your own whose learning rates follow from it and the optimizer's current ones (as
/// LRScheduler's get_lrs() sees them) — what you declare by choosing it.
enum class SchedulerState { whole, step_count_only };

/// Where a run is in its data, as TorchState::data_position() saves it. The seed and the batch
/// size decide which samples a step takes: a resume under others would train on other samples
/// at the same step, so it is refused, naming both. The epoch and step are the program's to
/// advance; a load restores them.
struct DataPosition {
    std::uint64_t seed = 0;       ///< what the order of the samples is drawn from
    std::int64_t batch_size = 0;  ///< samples a step takes
    std::int64_t epoch = 0;       ///< the epoch in progress, as the program counts them
    std::int64_t step = 0;        ///< steps done in it
};

/// A libtorch training state as one checkpointable object: the module's parameters and buffers
/// (views, under "model."), the optimizer's state and param groups, the CPU generator, and
/// optionally a scheduler, a data position and values of your own (the names are listed at
/// the top of torch.hpp). A ShapedByCheckpoint target:
/// CheckpointManager::on_step/save/restore, save_checkpoint(state.state_dict(), …) and
/// load_checkpoint_into take it. It refers to the module, optimizer, scheduler and data
/// position it was given, which must outlive it.
class TorchState {
public:
    using Options = TorchStateOptions;

    explicit TorchState(torch::nn::Module& model, Options options = {}) : TorchState(model, nullptr, std::move(options)) {}
    TorchState(torch::nn::Module& model, torch::optim::Optimizer& optimizer, Options options = {})
        : TorchState(model, &optimizer, std::move(options)) {}
    /// A module held by a ModuleHolder (torch::nn::Linear, a TORCH_MODULE of your own).
    template <class Holder>
        requires requires(Holder& h) { { *h.ptr() } -> std::convertible_to<torch::nn::Module&>; }
    explicit TorchState(Holder& model, Options options = {}) : TorchState(model.ptr(), std::move(options)) {}
    template <class Holder>
        requires requires(Holder& h) { { *h.ptr() } -> std::convertible_to<torch::nn::Module&>; }
    TorchState(Holder& model, torch::optim::Optimizer& optimizer, Options options = {})
        : TorchState(model.ptr(), optimizer, std::move(options)) {}
    /// A module held by a shared_ptr (std::make_shared<Net>()), which the state keeps alive.
    template <std::derived_from<torch::nn::Module> M>
    explicit TorchState(std::shared_ptr<M> model, Options options = {})
        : TorchState(checked(model), nullptr, std::move(options)) {
        owner_ = std::move(model);
    }
    template <std::derived_from<torch::nn::Module> M>
    TorchState(std::shared_ptr<M> model, torch::optim::Optimizer& optimizer, Options options = {})
        : TorchState(checked(model), &optimizer, std::move(options)) {
        owner_ = std::move(model);
    }

    /// Also saves and restores `s`'s state (see SchedulerState); the optimizer's learning rates
    /// are restored with its param groups. A scheduler of a class ckpt does not know is refused
    /// here, by name, unless `what` is step_count_only.
    TorchState& scheduler(torch::optim::LRScheduler& s, SchedulerState what = SchedulerState::whole) {
        const bool step_lr = typeid(s) == typeid(torch::optim::StepLR);
        const std::string name = c10::demangle(typeid(s).name());
        if (what == SchedulerState::whole && !step_lr)
            throw ConfigError("ckpt::TorchState saves the whole state of libtorch's StepLR; this scheduler is a " + name +
                              ", whose members ckpt cannot see. If its learning rates follow from its step count alone, "
                              "say so: state.scheduler(s, ckpt::SchedulerState::step_count_only)");
        scheduler_ = &s;
        scheduler_kind_ = step_lr && what == SchedulerState::whole ? "StepLR" : name;
        step_lr_ = step_lr && what == SchedulerState::whole;
        return *this;
    }
    /// Also saves `position` (see DataPosition): a load checks its seed and batch size against
    /// the file's and restores its epoch and step.
    TorchState& data_position(DataPosition& position) {
        data_ = &position;
        return *this;
    }
    /// Also saves and loads `value` (a view of your own variable, e.g. ckpt::view_of(epoch)).
    TorchState& add(std::string name, Value value) {
        if (name.starts_with(detail::reserved_name_prefix))
            throw ConfigError("'" + name + "' starts with the reserved prefix '__ckpt.'");
        extra_.set(std::move(name), std::move(value));
        return *this;
    }
    /// Also saves and loads the torch tensor `t` (a sampler's permutation, a running statistic):
    /// a load writes into its memory. It must be on the CPU, contiguous and of a dtype ckpt
    /// holds; a ConfigError says otherwise, here. The state keeps the tensor's storage alive.
    TorchState& add(std::string name, const at::Tensor& t) {
        Tensor view = torch_view(t, name);
        extra_tensors_.push_back(t);
        return add(std::move(name), Value(std::move(view)));
    }

    /// What a save writes: views of the module's tensors, of the optimizer's state and options
    /// and of the data position; copies of the few values kept elsewhere (the scheduler's,
    /// the generator's state).
    ParamDict state_dict() {
        ParamDict d = torch_state_dict(model_, options_.model_prefix);
        if (optimizer_) {
            add_options(d, [&](std::size_t g) -> torch::optim::OptimizerOptions& {
                return optimizer_->param_groups()[g].options();
            });
            auto& states = optimizer_->state();
            for (const auto& [key, name] : param_names_) {
                const auto it = states.find(key);
                if (it != states.end()) add_param_state(d, name, *it->second);
            }
        }
        if (scheduler_) {
            d.set("scheduler.kind", scheduler_kind_);
            d.set("scheduler.convention", "libtorch");
            d.set("scheduler.last_epoch", std::int64_t{detail::torch_glue::SchedulerAccess::step_count(*scheduler_)});
            if (step_lr_) {
                const auto& s = static_cast<const torch::optim::StepLR&>(*scheduler_);
                d.set("scheduler.step_size", std::int64_t{detail::torch_glue::step_size(s)});
                d.set("scheduler.gamma", detail::torch_glue::gamma(s));
            }
        }
        if (data_) {
            d.set("data.seed", static_cast<std::int64_t>(data_->seed));
            d.set("data.batch_size", data_->batch_size);
            d.set("data.epoch", view_of(data_->epoch));
            d.set("data.step", view_of(data_->step));
        }
        add_extra(d);
        if (options_.generator) {
            const auto state = generator_state();
            d.set("torch.cpu_generator", Tensor::from(std::span<const std::uint8_t>(state), Shape{static_cast<std::int64_t>(state.size())}));
        }
        return d;
    }

    /// What a load writes into, shaped after the file (ShapedByCheckpoint): the optimizer
    /// gets state for exactly the parameters whose state the file holds and that fit them. The
    /// optimizer's options and the scheduler's state are read into copies, which loaded()
    /// hands over once the load has succeeded. A data position of another seed or batch size,
    /// another optimizer or scheduler kind, or parameters in other param groups than when saved
    /// are refused here, before anything is read into the module.
    ParamDict state_dict_for(const std::vector<EntryInfo>& entries) {
        InFile in_file;
        for (const auto& e : entries) in_file.emplace(e.name, &e);
        load_ = Load{};
        ParamDict d = torch_state_dict(model_, options_.model_prefix);
        if (optimizer_) shape_optimizer(d, in_file);
        if (scheduler_) shape_scheduler(d, in_file);
        if (data_) shape_data(d, in_file);
        add_extra(d);
        if (options_.generator) {
            // the size libtorch's generator gives (a file of another size is a mismatch)
            loaded_generator_.assign(generator_state().size(), 0);
            d.set("torch.cpu_generator", view_of(loaded_generator_));
        }
        return d;
    }

    /// After a load: hands the optimizer its options, the scheduler its state and the generator
    /// its state, when the file had them, and says what the load overrode or left out.
    void loaded(const LoadReport& report) {
        auto was_loaded = [&](std::string_view name) {
            return std::find(report.param_not_load.begin(), report.param_not_load.end(), name) ==
                   report.param_not_load.end();
        };
        // a seed or batch size the file held as tensors, which state_dict_for() could not read
        if (data_ && (load_.data_seed != static_cast<std::int64_t>(data_->seed) ||
                      load_.data_batch_size != data_->batch_size))
            throw LoadMismatch(data_mismatch(load_.data_seed, load_.data_batch_size));
        std::vector<Override> overridden;
        if (optimizer_) {
            auto& states = optimizer_->state();
            for (auto& [key, state] : load_.states)
                if (state) states[key] = std::move(state);
                else states.erase(key);
            overridden = apply_options(was_loaded);
        }
        if (scheduler_) apply_scheduler(was_loaded, overridden);
        if (optimizer_) say_overridden(overridden);
        if (!load_.fresh.empty() || !load_.reshaped.empty() || !load_.left_out.empty()) {
            using detail::torch_glue::quoted_list;
            std::string msg = "the optimizer's state was loaded for the parameters the checkpoint and this model share;";
            if (!load_.fresh.empty()) msg += " none for " + quoted_list(load_.fresh) + " (not in the checkpoint's optimizer);";
            if (!load_.reshaped.empty()) msg += " none for " + quoted_list(load_.reshaped) + " (another shape or dtype there);";
            if (!load_.left_out.empty())
                msg += " the checkpoint's state of " + quoted_list(load_.left_out) + " was left out (not parameters here);";
            msg.pop_back();
            detail::log(LogLevel::notice, msg + ". Those without start as before their first step");
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
    using InFile = std::map<std::string, const EntryInfo*, std::less<>>;

    /// An option a load changed: its param group and name, its value before, the checkpoint's.
    struct Override {
        std::size_t group;
        std::string option;
        Tensor before;  // a copy
        std::string after;
    };

    /// What one load reads into and found, until loaded() hands it over.
    struct Load {
        std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;  // per param group
        std::vector<std::pair<std::string, std::unique_ptr<torch::optim::OptimizerParamState>>> states;  // none: erase
        std::vector<std::string> fresh, reshaped, left_out;                    // parameters, by name
        bool legacy_scheduler = false;  // "scheduler.step_count" alone
        std::string convention = "libtorch";
        std::int64_t last_epoch = 0;
        std::int64_t step_size = 0;
        double gamma = 0;
        unsigned count_before = 0;     // the scheduler's step count before the load
        ParamDict scheduler_tensors;   // from Python: base_lrs, _last_lr, …
        std::int64_t data_seed = 0;
        std::int64_t data_batch_size = 0;
    };

    template <class M>
    static torch::nn::Module& checked(const std::shared_ptr<M>& model) {
        if (!model) throw ConfigError("ckpt::TorchState was given an empty module pointer");
        return *model;
    }

    TorchState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, Options options)
        : model_(model), optimizer_(optimizer), options_(std::move(options)) {
        // a dtype ckpt cannot hold is refused now, not at the first save hours later
        for (const auto& items : {model_.named_parameters(true), model_.named_buffers(true)})
            for (const auto& item : items)
                if (item.value().defined() && !dtype_of_torch(item.value().scalar_type()))
                    throw ConfigError("torch tensor '" + options_.model_prefix + item.key() + "' has dtype " +
                                      std::string(c10::toString(item.value().scalar_type())) +
                                      ", which ckpt does not store (a quantized dtype: dequantize it first)");
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

    /// The optimizer's kind and each param group's parameters and options, the options of the
    /// object `options_of(g)` returns.
    template <class OptionsOf>
    void add_options(ParamDict& d, OptionsOf&& options_of) {
        d.set("optimizer.kind", kind_->name);
        for (std::size_t g = 0; g < group_names_.size(); ++g) {
            const std::string p = "optimizer.group." + std::to_string(g) + ".";
            d.set(p + "params", group_names_[g]);
            kind_->options(options_of(g), d, p);
        }
    }

    void add_extra(ParamDict& d) {
        for (const auto& [name, value] : extra_) {
            if (d.contains(name)) throw ConfigError("the value added as '" + name + "' has the name of a torch tensor");
            d.set(name, value);
        }
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

    /// Copies of the options to load into, and the optimizer's state shaped after the file: in
    /// fresh or reused tensors for the parameters the file holds state for and whose shape and
    /// dtype it matches, none for the others. A parameter the file's optimizer did not hold
    /// gets a placeholder target, "optimizer.state.{name}", which the file cannot fill: a
    /// strict load names it, a non-strict one reports it. Parameters in another param group
    /// than when saved are refused: the groups' options would go to other parameters.
    void shape_optimizer(ParamDict& d, const InFile& in_file) {
        const auto kind = in_file.find("optimizer.kind");
        if (kind != in_file.end()) {
            const auto* saved = kind->second->scalar.get_if<std::string>();
            if (saved && *saved != kind_->name)
                throw LoadMismatch("the checkpoint holds the state of optimizer " + *saved + "; this one is " +
                                   kind_->name);
        }
        auto& groups = optimizer_->param_groups();
        for (auto& group : groups) load_.options.push_back(group.options().clone());
        add_options(d, [&](std::size_t g) -> torch::optim::OptimizerOptions& { return *load_.options[g]; });

        // which param group each parameter was in when saved (when the file says)
        std::map<std::string, std::size_t, std::less<>> saved_group;
        bool groups_known = false;
        for (std::size_t g = 0;; ++g) {
            const auto it = in_file.find("optimizer.group." + std::to_string(g) + ".params");
            const auto* names = it == in_file.end() ? nullptr : it->second->scalar.get_if<std::string>();
            if (!names) break;
            groups_known = true;
            for (std::size_t at = 0; at <= names->size();) {
                const auto end = std::min(names->find('\n', at), names->size());
                if (end > at) saved_group.emplace(names->substr(at, end - at), g);
                at = end + 1;
            }
        }
        std::set<std::string, std::less<>> here;
        for (std::size_t g = 0; g < groups.size(); ++g)
            for (const auto& param : groups[g].params()) {
                const std::string& name = param_names_.at(detail::torch_glue::state_key(param));
                here.insert(name);
                const auto it = saved_group.find(name);
                if (it != saved_group.end() && it->second != g)
                    throw LoadMismatch("parameter '" + name + "' is in param group " + std::to_string(g) +
                                       " of this optimizer but was in group " + std::to_string(it->second) +
                                       " of the checkpoint's: the groups' options would go to other parameters");
            }

        const auto dtype_here = [](const at::Tensor& t) { return dtype_of_torch(t.scalar_type()); };
        auto& states = optimizer_->state();
        for (auto& group : groups) {
            for (auto& param : group.params()) {
                const auto key = detail::torch_glue::state_key(param);
                const std::string& name = param_names_.at(key);
                const std::string p = "optimizer.state." + name + ".";
                bool saved = kind_->step && in_file.contains(p + "step");
                bool fits = true;
                for (const auto& f : kind_->tensors) {
                    const auto e = in_file.find(p + f.name);
                    if (e == in_file.end()) continue;
                    saved = true;
                    const Shape shape(param.sizes().begin(), param.sizes().end());
                    if (e->second->kind != ValueKind::tensor || e->second->dtype != dtype_here(param) ||
                        e->second->logical_shape() != shape)
                        fits = false;
                }
                if (!saved || !fits) {
                    load_.states.emplace_back(key, nullptr);  // none loaded: as before its first step
                    if (!fits) load_.reshaped.push_back(name);
                    else if (groups_known && !saved_group.contains(name)) load_.fresh.push_back(name);
                    else continue;
                    d.set("optimizer.state." + name, Tensor(DType::int64, Shape{}));
                    continue;
                }
                // a copy of the state, over the same tensors where they fit: a refused load leaves
                // the optimizer as it was, a load writes into its tensors
                const auto it = states.find(key);
                auto slot = it != states.end() ? it->second->clone() : kind_->make();
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
                load_.states.emplace_back(key, std::move(slot));
            }
        }
        // the file's state of parameters this optimizer does not hold
        std::set<std::string> left_out;
        for (const auto& [entry, info] : in_file) {
            if (!entry.starts_with("optimizer.state.")) continue;
            const auto dot = entry.rfind('.');
            if (dot <= 16) continue;
            if (std::string name = entry.substr(16, dot - 16); !here.contains(name)) left_out.insert(std::move(name));
        }
        load_.left_out.assign(left_out.begin(), left_out.end());
    }

    /// Targets for the scheduler's state in the file, after checking that it is this
    /// scheduler's kind (of either language's convention).
    void shape_scheduler(ParamDict& d, const InFile& in_file) {
        load_.count_before = detail::torch_glue::SchedulerAccess::step_count(*scheduler_);
        auto text = [&](std::string_view name) -> const std::string* {
            const auto it = in_file.find(name);
            return it == in_file.end() ? nullptr : it->second->scalar.get_if<std::string>();
        };
        const auto* kind = text("scheduler.kind");
        if (!kind && in_file.contains("scheduler.step_count")) {  // written before schedulers were saved whole
            load_.legacy_scheduler = true;
            d.set("scheduler.step_count", view_of(load_.last_epoch));
            return;
        }
        if (const auto* convention = text("scheduler.convention")) {
            if (*convention != "libtorch" && *convention != "pytorch")
                throw LoadMismatch("the checkpoint's scheduler.convention is '" + *convention +
                                   "'; ckpt knows \"libtorch\" and \"pytorch\"");
            load_.convention = *convention;
        }
        if (kind && *kind != scheduler_kind_)
            throw LoadMismatch("the checkpoint holds the state of " +
                               std::string(load_.convention == "pytorch" ? "PyTorch's " : "a ") + *kind +
                               " scheduler; this one is " + scheduler_kind_);
        d.set("scheduler.last_epoch", view_of(load_.last_epoch));
        if (load_.convention == "pytorch")  // the lists of PyTorch's state_dict(): base_lrs, _last_lr
            for (const auto& [name, e] : in_file)
                if (name.starts_with("scheduler.") && e->kind == ValueKind::tensor) {
                    load_.scheduler_tensors.set(name, Tensor::uninitialized(e->dtype, e->logical_shape()));
                    d.set(name, load_.scheduler_tensors.at(name));
                }
        if (!step_lr_) return;
        d.set("scheduler.step_size", view_of(load_.step_size));
        d.set("scheduler.gamma", view_of(load_.gamma));
    }

    /// Targets for the data position, after checking the file's seed and batch size.
    void shape_data(ParamDict& d, const InFile& in_file) {
        auto saved = [&](std::string_view name) -> std::optional<std::int64_t> {
            const auto it = in_file.find(name);
            if (it == in_file.end()) return std::nullopt;
            const auto* v = it->second->scalar.get_if<std::int64_t>();
            return v ? std::optional(*v) : std::nullopt;
        };
        const auto seed = saved("data.seed");
        const auto batch = saved("data.batch_size");
        if ((seed && *seed != static_cast<std::int64_t>(data_->seed)) || (batch && *batch != data_->batch_size))
            throw LoadMismatch(data_mismatch(seed.value_or(static_cast<std::int64_t>(data_->seed)),
                                             batch.value_or(data_->batch_size)));
        load_.data_seed = static_cast<std::int64_t>(data_->seed);
        load_.data_batch_size = data_->batch_size;
        d.set("data.seed", view_of(load_.data_seed));
        d.set("data.batch_size", view_of(load_.data_batch_size));
        d.set("data.epoch", view_of(data_->epoch));
        d.set("data.step", view_of(data_->step));
    }

    std::string data_mismatch(std::int64_t seed, std::int64_t batch_size) const {
        std::string what;
        if (batch_size != data_->batch_size)
            what = "batch size " + std::to_string(batch_size) + " when saved, " + std::to_string(data_->batch_size) + " now";
        if (seed != static_cast<std::int64_t>(data_->seed))
            what += (what.empty() ? "" : "; ") + std::string("seed ") + std::to_string(seed) + " when saved, " +
                    std::to_string(static_cast<std::int64_t>(data_->seed)) + " now";
        return "the checkpoint's data position was taken under other data settings (" + what + "): resuming at its "
               "epoch and step would train on other samples. Resume with the same settings, or start over from the "
               "checkpoint's weights without its data position (a TorchState without data_position())";
    }

    /// Hands the optimizer the loaded options; returns those that changed.
    template <class WasLoaded>
    std::vector<Override> apply_options(const WasLoaded& was_loaded) {
        std::vector<Override> changed;
        auto& groups = optimizer_->param_groups();
        for (std::size_t g = 0; g < groups.size() && g < load_.options.size(); ++g) {
            const std::string p = "optimizer.group." + std::to_string(g) + ".";
            ParamDict now, read;
            kind_->options(groups[g].options(), now, p);
            kind_->options(*load_.options[g], read, p);
            for (const auto& entry : read) {
                const std::string& name = entry.name;
                if (!was_loaded(name)) continue;
                const Tensor& from = read.tensor(name);
                Tensor& to = now.tensor(name);
                if (std::memcmp(from.data(), to.data(), to.nbytes()) == 0) continue;
                changed.push_back({g, name.substr(p.size()), to.clone(), detail::torch_glue::option_text(from)});
                std::memcpy(to.data(), from.data(), to.nbytes());
            }
        }
        return changed;
    }

    /// Hands the scheduler its position; converts a PyTorch StepLR's learning rate at a
    /// boundary to libtorch's; says what does not carry over. Drops from `overridden` the
    /// learning rates this scheduler's own schedule accounts for.
    template <class WasLoaded>
    void apply_scheduler(const WasLoaded& was_loaded, std::vector<Override>& overridden) {
        using namespace detail::torch_glue;
        const char* position = load_.legacy_scheduler ? "scheduler.step_count" : "scheduler.last_epoch";
        if (!was_loaded(position)) return;
        const std::int64_t k = load_.last_epoch;
        if (k < 0 || k > std::numeric_limits<unsigned>::max())
            throw LoadMismatch(std::string(position) + " " + std::to_string(k) + " is out of range");
        SchedulerAccess::step_count(*scheduler_) = static_cast<unsigned>(k);
        if (load_.legacy_scheduler) {
            detail::log(LogLevel::notice, "the checkpoint records only the scheduler's position (scheduler.step_count, "
                                          "written before ckpt saved schedulers whole): its kind and settings are not "
                                          "checked against this " + scheduler_kind_ + "'s");
            return;
        }
        if (!step_lr_) return;
        const auto& s = static_cast<const torch::optim::StepLR&>(*scheduler_);
        const double saved_gamma = load_.gamma;
        if (was_loaded("scheduler.step_size") && was_loaded("scheduler.gamma") &&
            (load_.step_size != step_size(s) || saved_gamma != gamma(s)))
            detail::log(LogLevel::notice,
                        "the checkpoint's StepLR had step_size " + text(load_.step_size) + " and gamma " +
                            text(saved_gamma) + "; this one's, step_size " + text(step_size(s)) + " and gamma " +
                            text(gamma(s)) +
                            ", stay (a libtorch StepLR fixes them when it is made): the schedule goes on with them");
        auto& groups = optimizer_->param_groups();
        if (load_.convention == "pytorch" && k > 0 && load_.step_size > 0 && k % load_.step_size == 0 &&
            saved_gamma != 0) {
            // PyTorch's StepLR has multiplied by gamma at this call, libtorch's does at the next:
            // take the learning rate back to libtorch's, by the saved base_lrs when they give it
            const auto* base = load_.scheduler_tensors.find("scheduler.base_lrs");
            const auto bases = base && was_loaded("scheduler.base_lrs") ? doubles_of(*base->get_if<Tensor>())
                                                                          : std::vector<double>{};
            std::string lrs;
            for (std::size_t g = 0; g < groups.size(); ++g) {
                auto& o = groups[g].options();
                const double pytorch = o.get_lr();
                double lr = pytorch / saved_gamma;
                if (g < bases.size()) {
                    const double chained = libtorch_step_lr(bases[g], k, load_.step_size, saved_gamma);
                    if (chained * saved_gamma == pytorch) lr = chained;
                }
                o.set_lr(lr);
                lrs += (lrs.empty() ? "" : ", ") + text(lr);
            }
            detail::log(LogLevel::notice,
                        "the checkpoint's StepLR was stepped by PyTorch, whose StepLR lowers the learning rate one "
                        "step() earlier than libtorch's; at its step " + std::to_string(k) + " (a multiple of its "
                        "step_size) libtorch's has not yet: the learning rate is set to libtorch's, " + lrs);
        }
        // a learning rate this StepLR's schedule gives from the one set before the load is not news
        if (load_.count_before != 0) return;
        std::erase_if(overridden, [&](const Override& o) {
            return o.option == "lr" && libtorch_step_lr(o.before.values<double>()[0], k, step_size(s), gamma(s)) ==
                                           groups[o.group].options().get_lr();
        });
    }

    /// One notice for the options the load changed, old and new values (a learning rate as the
    /// scheduler left it).
    void say_overridden(const std::vector<Override>& overridden) {
        if (overridden.empty()) return;
        std::string msg = "the checkpoint's optimizer options replaced values this program had set:";
        for (const auto& o : overridden) {
            const double lr = optimizer_->param_groups()[o.group].options().get_lr();
            msg += " param group " + std::to_string(o.group) + "'s " + o.option + " " +
                   detail::torch_glue::option_text(o.before) + " -> " +
                   (o.option == "lr" ? detail::torch_glue::text(lr) : o.after) + ",";
        }
        msg.pop_back();
        detail::log(LogLevel::notice, msg + " (to keep this program's values, set them after restore())");
    }

    static std::vector<std::uint8_t> generator_state() {
        auto gen = at::detail::getDefaultCPUGenerator();
        std::lock_guard lock(gen.mutex());
        const at::Tensor t = gen.get_state();
        const auto* p = static_cast<const std::uint8_t*>(t.data_ptr());
        return {p, p + t.numel()};
    }

    std::shared_ptr<torch::nn::Module> owner_;  // a module given by shared_ptr, kept alive
    torch::nn::Module& model_;
    torch::optim::Optimizer* optimizer_;
    Options options_;
    const Kind* kind_ = nullptr;
    std::unordered_map<std::string, std::string> param_names_;  // state key -> parameter name
    std::vector<std::string> group_names_;                       // per param group: names, one a line
    torch::optim::LRScheduler* scheduler_ = nullptr;
    std::string scheduler_kind_;  // "StepLR", or the class's name when only its step count is saved
    bool step_lr_ = false;
    DataPosition* data_ = nullptr;
    ParamDict extra_;
    std::vector<at::Tensor> extra_tensors_;  // add(name, tensor): their storage, kept alive
    Load load_;
    std::vector<std::uint8_t> loaded_generator_;
};

}  // namespace ckpt
