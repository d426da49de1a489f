"""PyTorch state_dicts as ckpt checkpoints. torch is imported when these are called, not
when ckpt is.

    import ckpt.torch
    model.load_state_dict(ckpt.torch.load_state_dict("runs/net-2_300.ckpt", prefix="model."))
    ckpt.torch.save_state_dict("net.ckpt", model.state_dict(), prefix="model.")

The prefix "model." is where the C++ library's TorchState keeps a module's parameters and
buffers, so files of a libtorch program load into the same network written in Python.
"""

import logging
import weakref
from collections import Counter
from collections.abc import Mapping

from . import _format as F
from ._io import load, save
from .errors import ConfigError, LoadMismatch

log = logging.getLogger("ckpt")

__all__ = ["load_state_dict", "save_state_dict", "training_state", "save_training_state", "load_training_state"]


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ConfigError("ckpt.torch needs PyTorch (Debian: apt-get install python3-torch)") from e
    return torch


def load_state_dict(path, prefix="", key=None, mmap=False, max_decoded_bytes=None):
    """The entries of checkpoint `path` whose names start with `prefix`, the prefix removed,
    as a dict: tensors as torch tensors that share memory with the arrays ckpt.load returns,
    other values as they are. `mmap=True` maps an uncompressed binary body instead of reading
    it: the tensors are then read-only views of the file (torch warns that it cannot enforce
    that); use them to copy from, as load_state_dict() does. `key` and `max_decoded_bytes` are
    ckpt.load's."""
    torch = _torch()
    out = {}
    for name, value in load(path, key=key, mmap=mmap, max_decoded_bytes=max_decoded_bytes).items():
        if not name.startswith(prefix):
            continue
        if hasattr(value, "dtype"):
            if mmap:
                import warnings
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                    value = _tensor(value, name, torch)
            else:
                value = _tensor(value, name, torch)
        out[name[len(prefix):]] = value
    return out


def _flatten(prefix, value, out, torch):
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten("%s%s." % (prefix, k), v, out, torch)
        return
    name = prefix[:-1]
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _flatten("%s.%d." % (name, i), v, out, torch)
        return
    if isinstance(value, torch.Tensor):
        value = _array(value, name, torch)
    elif value is None:
        return
    elif isinstance(value, torch.device):
        value = str(value)
    out[name] = value


def _torch_dtype(dtype, torch):
    """The torch dtype of a numpy dtype as ckpt.load returns it (a bit pattern by its name: torch
    names its dtypes as the format does), or None when this PyTorch has none (float8 types came
    in PyTorch 2.1, unsigned integers above 8 bits in 2.3)."""
    import numpy as np
    return getattr(torch, F.ckpt_dtype_name(dtype) or np.dtype(dtype).name, None)


def _tensor(a, name, torch):
    """The torch tensor of an array ckpt.load returned, sharing its memory: bfloat16 and float8
    arrays, their bit patterns, are viewed as the torch dtype they stand for."""
    t_dtype = _torch_dtype(a.dtype, torch)
    if t_dtype is None:
        raise ConfigError("tensor '%s' is %s, which this PyTorch (%s) has no dtype for; ckpt.load returns it as "
                          "a NumPy array" % (name, F.ckpt_dtype_name(a.dtype) or a.dtype, torch.__version__))
    if F.ckpt_dtype_name(a.dtype):
        import numpy as np
        plain = a.view(np.int16 if a.dtype.itemsize == 2 else np.uint8)
        return torch.from_numpy(plain).view(t_dtype)
    return torch.from_numpy(a)


def save_state_dict(path, state_dict, prefix="", **options):
    """Writes `state_dict` as checkpoint `path`, each name given `prefix`: tensors (on any
    device; detached, copied to the CPU if need be) and int, float, bool and str values.
    Nested dicts, lists and tuples (an optimizer's state_dict) are flattened with dots, as
    `ckpt import` flattens a .pt file: "state.0.exp_avg", "param_groups.0.betas.1"; as there,
    None and empty containers give no entry and a torch.device is stored as its text. `options` are ckpt.save's (epoch, step, archive, zstd,
    key, overwrite)."""
    torch = _torch()
    flat = {}
    for k, v in state_dict.items():
        _flatten("%s%s." % (prefix, k), v, flat, torch)
    return save(path, flat, **options)


# --------------------------------------------------------------------------- training state
#
# The entries of the C++ library's TorchState (include/ckpt/types/torch.hpp), so that a training run
# moves between Python and a libtorch program in either direction: the module's parameters and
# buffers under "model.", the optimizer's kind, param groups and per-parameter state keyed by
# parameter name ("optimizer.state.fc.weight.exp_avg"; PyTorch's own state_dict keys it by
# index), the scheduler's whole state and the CPU generator's state.
#
# A scheduler is PyTorch's state_dict() of it, under "scheduler.":
#   scheduler.kind         its class: "StepLR", "CosineAnnealingWarmRestarts", ... (SCHEDULERS)
#   scheduler.convention   whose rules computed its learning rates: "pytorch" here, "libtorch"
#                          from a C++ TorchState
#   scheduler.{key}        each value of its state_dict(): an int as int64, a float as float64, a
#                          bool, a str; a list of numbers as a tensor (int64 when all are int, bool
#                          when all are bool, else float64); MultiStepLR's milestones (a Counter)
#                          as the int64 tensor of its elements, sorted; a dict, and a list of
#                          anything else, as entries below the key ("scheduler._schedule_phases.0.
#                          end_step"); None as no entry
#   scheduler._schedulers.{i}.*   each scheduler of a SequentialLR or ChainedScheduler, alike
# A libtorch TorchState writes scheduler.kind, .convention, .last_epoch (how many times step()
# was called, as here) and, for its StepLR, .step_size and .gamma.
# What a state_dict() holds that is code is the program's, not the file's: the functions of
# LambdaLR and MultiplicativeLR (as PyTorch's own state_dict() does, a plain function is left
# out and a callable object's attributes are saved), CyclicLR's scale function (rebuilt from its
# mode, or the program's scale_fn) and OneCycleLR's annealing function (saved as its
# anneal_strategy, "cos" or "linear"). A scheduler of another class, a subclass included, is
# refused by name when saved: what it keeps beyond its state_dict() is unknown.
#
# libtorch's StepLR lowers the learning rate one step() later than PyTorch's (after calls
# step_size + 1, 2 step_size + 1, ...; PyTorch's after step_size, 2 step_size, ...). Positions
# mean the same in both; at a boundary (last_epoch a multiple of step_size) the learning rates
# differ by one factor gamma, so loading a "libtorch" StepLR there multiplies it as PyTorch's
# StepLR would have, and the C++ load does the reverse: each goes on as an unbroken run of its
# own would. A libtorch scheduler of another kind has no PyTorch counterpart and is refused.

# Per optimizer kind: its options (name in the file, key in a param group, index in a tuple or
# None, type) and its state tensors; every kind but SGD counts steps.
_OPTIMIZERS = {
    "SGD": (("lr", "momentum", "dampening", "weight_decay", "nesterov"), ("momentum_buffer",)),
    "Adam": (("lr", "betas.0", "betas.1", "eps", "weight_decay", "amsgrad"), ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")),
    "AdamW": (("lr", "betas.0", "betas.1", "eps", "weight_decay", "amsgrad"), ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")),
    "RMSprop": (("lr", "alpha", "eps", "weight_decay", "momentum", "centered"), ("square_avg", "momentum_buffer", "grad_avg")),
    "Adagrad": (("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"), ("sum",)),
}
_FLAGS = ("nesterov", "amsgrad", "centered")
_OWN = ("model.", "optimizer.", "scheduler.", "torch.cpu_generator")

# PyTorch's schedulers, whose state_dict() holds their whole state (those of them this torch has).
SCHEDULERS = ("LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
              "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR",
              "CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR")
_NESTED = ("SequentialLR", "ChainedScheduler")
_CYCLIC_SCALES = {"triangular": "_triangular_scale_fn", "triangular2": "_triangular2_scale_fn",
                  "exp_range": "_exp_range_scale_fn"}


def _kind(optimizer, torch):
    for name in _OPTIMIZERS:
        if type(optimizer) is getattr(torch.optim, name):
            return name
    raise ConfigError("the training state holds SGD, Adam, AdamW, RMSprop and Adagrad optimizers; this one is %s"
                      % type(optimizer).__name__)


def _option(group, option):
    key, _, index = option.partition(".")
    value = group[key]
    return value[int(index)] if index else value


def _param_names(model, optimizer):
    """Per param group, the names of its parameters in the module."""
    by_id = {id(p): name for name, p in model.named_parameters()}
    groups = []
    for g, group in enumerate(optimizer.param_groups):
        names = []
        for i, p in enumerate(group["params"]):
            if id(p) not in by_id:
                raise ConfigError("parameter %d of the optimizer's param group %d (shape %s) is not a parameter of the "
                                  "module: its state could not be named" % (i, g, list(p.shape)))
            names.append(by_id[id(p)])
        groups.append(names)
    return groups


def _array(t, name, torch):
    """The numpy array of a torch tensor (detached, on the CPU, contiguous): bfloat16 and float8
    tensors as their bit patterns, marked with the dtype they stand for (ckpt.save writes them
    as that)."""
    dtype_name = str(t.dtype).replace("torch.", "")
    if dtype_name not in F.DTYPE_NAMES:
        raise ConfigError("tensor '%s' is %s, which a checkpoint cannot hold (quantized: dequantize it first)"
                          % (name, t.dtype))
    t = t.detach().cpu().contiguous()
    if dtype_name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        plain = torch.int16 if t.element_size() == 2 else torch.uint8
        return t.view(plain).numpy().view(F.bit_pattern_dtype(dtype_name))
    return t.numpy()


def _scheduler_kind(scheduler, torch, where):
    for name in SCHEDULERS:
        if type(scheduler) is getattr(torch.optim.lr_scheduler, name, None):
            return name
    cls = type(scheduler)
    raise ConfigError("%s is a %s.%s, not one of PyTorch's schedulers (%s), whose state_dict() holds their whole "
                      "state: ckpt cannot tell what another class keeps. Pass scheduler=None and save its state "
                      "yourself (extra=)" % (where, cls.__module__, cls.__qualname__, ", ".join(SCHEDULERS)))


def _scheduler_state(scheduler, torch, where="the scheduler"):
    """The scheduler's state_dict() and kind, without what is code (see above)."""
    kind = _scheduler_kind(scheduler, torch, where)
    if kind in _NESTED:
        state = {k: v for k, v in scheduler.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [_scheduler_state(s, torch, "%s's scheduler %d" % (where, i))
                                for i, s in enumerate(scheduler._schedulers)]
    else:
        state = dict(scheduler.state_dict())
        if kind == "CyclicLR":
            state.pop("_scale_fn_ref", None)
            state.pop("_scale_fn_custom", None)
        elif kind == "OneCycleLR":
            state["anneal_func"] = state["anneal_func"].__name__[len("_annealing_"):]
    state["kind"] = kind
    return state


def _scalar(v, np):
    """A number, bool or str as the Python value a checkpoint stores, or None if it is not one."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, str):
        return v
    return None


def _put(name, value, out, np):
    """`value` as entries named `name` and below it (see above)."""
    if value is None:
        return
    scalar = _scalar(value, np)
    if scalar is not None:
        out[name] = scalar
    elif isinstance(value, Counter):
        out[name] = np.array(sorted(value.elements()), dtype=np.int64)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError("'%s' has the key %r; checkpoint entries are named by text" % (name, k))
            _put("%s.%s" % (name, k), v, out, np)
    elif isinstance(value, (list, tuple)):
        items = [_scalar(v, np) for v in value]
        if value and all(type(v) is bool for v in items):
            out[name] = np.array(items, dtype=bool)
        elif all(type(v) in (int, float) for v in items):
            out[name] = np.array(items, dtype=np.int64 if value and all(type(v) is int for v in items) else np.float64)
        else:
            for i, v in enumerate(value):
                _put("%s.%d" % (name, i), v, out, np)
    else:
        raise ConfigError("'%s' is a %s, which a checkpoint cannot hold" % (name, type(value).__name__))


def _get(name, template, entries, path, np):
    """The value stored as `name` (see _put), shaped as `template`, the loading scheduler's own."""
    def mismatch(what):
        return LoadMismatch("'%s' holds %s as '%s'; this scheduler has %r there" % (path, what, name, template), path)
    if name in entries:
        v = entries[name]
        if hasattr(v, "dtype"):
            if v.ndim != 1 or not (isinstance(template, (list, tuple, Counter)) or template is None):
                raise mismatch("a %s%s tensor" % (v.dtype, list(v.shape)))
            if isinstance(template, Counter):
                return Counter(int(x) for x in v)
            return type(template)(v.tolist()) if isinstance(template, tuple) else v.tolist()
        kinds = {bool: "bool", int: "number", float: "number", str: "str"}
        if template is not None and kinds.get(type(_scalar(template, np))) != kinds.get(type(v)):
            raise mismatch("%s %r" % (type(v).__name__, v))
        return v
    below = [e for e in entries if e.startswith(name + ".")]
    if isinstance(template, Mapping) and not isinstance(template, Counter):
        return {k: _get("%s.%s" % (name, k), t, entries, path, np) for k, t in template.items()}
    if isinstance(template, (list, tuple)) and not all(type(_scalar(t, np)) in (bool, int, float) for t in template):
        n = len(template)
        if any(e == "%s.%d" % (name, n) or e.startswith("%s.%d." % (name, n)) for e in below):
            raise LoadMismatch("'%s' holds more than the %d items this scheduler has in '%s'" % (path, n, name), path)
        return type(template)(_get("%s.%d" % (name, i), t, entries, path, np) for i, t in enumerate(template))
    if template is None and not below:
        return None
    if template is None:
        raise mismatch("values below it (%s)" % ", ".join(below))
    raise LoadMismatch("'%s' holds no '%s' (this scheduler has %r there)" % (path, name, template), path)


def _scheduler_loader(scheduler, entries, path, torch, np):
    """Checks the file's state of `scheduler` against it; returns what loads it, run once every
    check of the file has passed (after the optimizer's options)."""
    own = _scheduler_state(scheduler, torch)
    kind = entries.get("scheduler.kind")
    if kind is None and "scheduler.step_count" in entries:  # written before schedulers were saved whole
        def load_position():
            log.warning("'%s' records only the scheduler's position (scheduler.step_count, written before ckpt saved "
                        "schedulers whole): the rest of this %s's state starts afresh", path, own["kind"])
            scheduler.last_epoch = int(entries["scheduler.step_count"])
            scheduler._step_count = scheduler.last_epoch + 1
            scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
        return load_position
    if kind is None:
        raise LoadMismatch("'%s' holds no scheduler state (scheduler.kind)" % path, path)
    convention = entries.get("scheduler.convention")
    if convention not in ("pytorch", "libtorch"):
        raise LoadMismatch("'%s' records the scheduler's convention as %r; ckpt knows 'pytorch' and 'libtorch'"
                           % (path, convention), path)
    if convention == "libtorch":
        if kind != "StepLR" or own["kind"] != "StepLR":
            raise LoadMismatch("'%s' holds the state of a libtorch %s scheduler; this one is PyTorch's %s (a libtorch "
                               "program's StepLR carries over to PyTorch's StepLR only)" % (path, kind, own["kind"]), path)
        state = dict(own, last_epoch=_get("scheduler.last_epoch", 0, entries, path, np),
                     step_size=_get("scheduler.step_size", own["step_size"], entries, path, np),
                     gamma=_get("scheduler.gamma", own["gamma"], entries, path, np), _get_lr_called_within_step=False)
        state["_step_count"] = state["last_epoch"] + 1

        def load_libtorch():
            _apply_scheduler_state(scheduler, state)
            k = scheduler.last_epoch
            if k > 0 and k % scheduler.step_size == 0:
                # libtorch's StepLR multiplies by gamma at the next call, PyTorch's has at this one
                for group in scheduler.optimizer.param_groups:
                    group["lr"] = group["lr"] * scheduler.gamma
                log.info("'%s': a libtorch StepLR at step %d, a multiple of its step_size, where PyTorch's has "
                         "lowered the learning rate and libtorch's not yet: the learning rate is PyTorch's, %s",
                         path, k, [group["lr"] for group in scheduler.optimizer.param_groups])
            scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
        return load_libtorch

    def check_kinds(prefix, state):
        saved = entries.get(prefix + "kind")
        if saved != state["kind"]:
            raise LoadMismatch("'%s' holds the state of %s scheduler as '%s'; this one is %s" % (
                path, "a " + saved if saved else "no", prefix[:-1], state["kind"]), path)
        for i, sub in enumerate(state.get("_schedulers", ()) if state["kind"] in _NESTED else ()):
            check_kinds("%s_schedulers.%d." % (prefix, i), sub)
    check_kinds("scheduler.", own)
    state = _get("scheduler", own, entries, path, np)

    def check_code(prefix, state):
        if state["kind"] == "OneCycleLR" and state["anneal_func"] not in ("cos", "linear"):
            raise LoadMismatch("'%s' holds %ranneal_func %r; OneCycleLR anneals by 'cos' or 'linear'"
                               % (path, prefix, state["anneal_func"]), path)
        if state["kind"] == "CyclicLR" and state["mode"] not in _CYCLIC_SCALES:
            raise LoadMismatch("'%s' holds %rmode %r; CyclicLR's modes are %s" % (
                path, prefix, state["mode"], ", ".join(_CYCLIC_SCALES)), path)
        for i, sub in enumerate(state["_schedulers"] if state["kind"] in _NESTED else ()):
            check_code("%s_schedulers.%d." % (prefix, i), sub)
    check_code("scheduler.", state)
    return lambda: _apply_scheduler_state(scheduler, state)


def _apply_scheduler_state(scheduler, state):
    state = dict(state)
    kind = state.pop("kind")
    if kind in _NESTED:
        subs = state.pop("_schedulers")
        scheduler.__dict__.update(state)
        for sub, sub_state in zip(scheduler._schedulers, subs):
            _apply_scheduler_state(sub, sub_state)
        return
    if kind == "OneCycleLR":
        state["anneal_func"] = getattr(scheduler, "_annealing_" + state["anneal_func"])
    scheduler.load_state_dict(state)
    if kind == "CyclicLR" and scheduler._scale_fn_custom is None:
        scheduler._scale_fn_ref = weakref.WeakMethod(getattr(scheduler, _CYCLIC_SCALES[scheduler.mode]))


def training_state(model, optimizer=None, scheduler=None, extra=None, generator=True, model_prefix="model."):
    """The entries a C++ TorchState of this module, optimizer and scheduler saves, as a dict
    for ckpt.save: a libtorch program's TorchState loads them, and load_training_state()
    loads what a TorchState saved. The scheduler's whole state is saved (see above); one that
    is not PyTorch's own is a ConfigError naming its class. `extra`: more entries (the
    program's position)."""
    import numpy as np
    torch = _torch()
    out = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        out[model_prefix + name] = _array(t, model_prefix + name, torch)
    state = []
    if optimizer is not None:
        kind = _kind(optimizer, torch)
        options, fields = _OPTIMIZERS[kind]
        out["optimizer.kind"] = kind
        for g, (group, names) in enumerate(zip(optimizer.param_groups, _param_names(model, optimizer))):
            p = "optimizer.group.%d." % g
            out[p + "params"] = "\n".join(names)
            for option in options:
                v = _option(group, option)
                out[p + option] = np.array(bool(v)) if option in _FLAGS else np.array(float(v))
            for param, name in zip(group["params"], names):
                s = optimizer.state.get(param)
                if not s:
                    continue
                p = "optimizer.state.%s." % name
                if kind != "SGD":
                    state.append((p + "step", np.array(int(float(s["step"])), dtype=np.int64)))
                for f in fields:
                    if s.get(f) is not None:
                        state.append((p + f, _array(s[f], p + f, torch)))
    for name, v in (extra or {}).items():
        if name in out:
            raise ConfigError("the extra entry '%s' has the name of an entry of the training state" % name)
        out[name] = v
    out.update(state)
    if scheduler is not None:
        _put("scheduler", _scheduler_state(scheduler, torch), out, np)
        out["scheduler.convention"] = "pytorch"
    if generator:
        out["torch.cpu_generator"] = torch.get_rng_state().numpy()
    return out


def save_training_state(path, model, optimizer=None, scheduler=None, extra=None, generator=True, model_prefix="model.",
                        **options):
    """Writes training_state(...) as checkpoint `path`; `options` are ckpt.save's."""
    return save(path, training_state(model, optimizer, scheduler, extra, generator, model_prefix), **options)


def load_training_state(path, model, optimizer=None, scheduler=None, generator=True, model_prefix="model.",
                        key=None, max_decoded_bytes=None):
    """Loads a TorchState checkpoint (from a libtorch program or save_training_state) into the
    module, the optimizer (its param groups' options and the state of each parameter the file
    holds state for; the others get none, as before their first step), the scheduler and the
    CPU generator. Every tensor is checked against its target before anything is written: a
    name missing or left over, another dtype or shape, another optimizer or scheduler kind or
    other parameters in a param group is a LoadMismatch. The scheduler takes the file's whole
    state (its settings too, as PyTorch's load_state_dict() does); a StepLR saved by a libtorch
    program goes on as PyTorch's would (see above). Returns the file's other entries.
    `key` and `max_decoded_bytes` are ckpt.load's."""
    import numpy as np
    torch = _torch()
    path = str(path)
    entries = load(path, key=key, max_decoded_bytes=max_decoded_bytes)
    plan = []

    def target(name, t):
        if name not in entries:
            raise LoadMismatch("'%s' holds no '%s'" % (path, name), path)
        a = entries[name]
        if not hasattr(a, "dtype") or _torch_dtype(a.dtype, torch) != t.dtype or tuple(a.shape) != tuple(t.shape):
            raise LoadMismatch("'%s' holds '%s' as %s, the target is %s%s" % (
                path, name, "%s%s" % (a.dtype, list(a.shape)) if hasattr(a, "dtype") else type(a).__name__, t.dtype,
                list(t.shape)), path)
        plan.append((t, a))

    model_names = set()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        model_names.add(model_prefix + name)
        target(model_prefix + name, t)
    left = sorted(n for n in entries if n.startswith(model_prefix) and n not in model_names)
    if left:
        raise LoadMismatch("'%s' holds module tensors this module does not have: %s" % (path, ", ".join(left)), path)

    new_state = {}
    if optimizer is not None:
        kind = _kind(optimizer, torch)
        options, fields = _OPTIMIZERS[kind]
        saved = entries.get("optimizer.kind")
        if saved != kind:
            raise LoadMismatch("'%s' holds the state of %s; this one is %s"
                               % (path, "optimizer " + saved if saved else "no optimizer", kind), path)
        for g, (group, names) in enumerate(zip(optimizer.param_groups, _param_names(model, optimizer))):
            p = "optimizer.group.%d." % g
            if entries.get(p + "params") != "\n".join(names):
                raise LoadMismatch("param group %d of the optimizer in '%s' holds other parameters than this "
                                   "optimizer's: saved %r, here %r" % (g, path, entries.get(p + "params"),
                                                                       "\n".join(names)), path)
            for option in options:
                if p + option not in entries:
                    raise LoadMismatch("'%s' holds no '%s'" % (path, p + option), path)
            for param, name in zip(group["params"], names):
                s = "optimizer.state.%s." % name
                held = {f: entries[s + f] for f in fields if s + f in entries}
                if not held and s + "step" not in entries:
                    continue
                state = {}
                for f, a in held.items():
                    t = torch.empty(param.shape, dtype=param.dtype)
                    target(s + f, t)
                    state[f] = t
                if kind != "SGD":
                    step = int(entries[s + "step"])
                    state["step"] = step if kind == "RMSprop" else torch.tensor(float(step))
                elif "momentum_buffer" not in state:
                    state["momentum_buffer"] = None
                new_state[param] = state
    load_scheduler = _scheduler_loader(scheduler, entries, path, torch, np) if scheduler is not None else None
    if generator and "torch.cpu_generator" not in entries:
        raise LoadMismatch("'%s' holds no generator state (torch.cpu_generator)" % path, path)

    # every check passed: write
    with torch.no_grad():
        for t, a in plan:
            t.copy_(_tensor(a.copy(), "", torch))
    if optimizer is not None:
        options, _ = _OPTIMIZERS[_kind(optimizer, torch)]
        for g, group in enumerate(optimizer.param_groups):
            p = "optimizer.group.%d." % g
            for option in options:
                key_, _, index = option.partition(".")
                v = entries[p + option]
                v = v.item() if hasattr(v, "item") else v
                if index:
                    values = list(group[key_])
                    values[int(index)] = v
                    group[key_] = tuple(values)
                else:
                    group[key_] = bool(v) if option in _FLAGS else v
        optimizer.state.clear()
        optimizer.state.update(new_state)
    if load_scheduler is not None:
        load_scheduler()
    if generator:
        torch.set_rng_state(_tensor(entries["torch.cpu_generator"].copy(), "torch.cpu_generator", torch))
    return {n: v for n, v in entries.items() if not n.startswith(_OWN)}
