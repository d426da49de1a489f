"""PyTorch state_dicts as ckpt checkpoints. torch is imported when these are called, not
when ckpt is.

    import ckpt.torch
    model.load_state_dict(ckpt.torch.load_state_dict("runs/net-2_300.ckpt", prefix="model."))
    ckpt.torch.save_state_dict("net.ckpt", model.state_dict(), prefix="model.")

The prefix "model." is where the C++ library's TorchState keeps a module's parameters and
buffers, so files of a libtorch program load into the same network written in Python.
"""

from collections.abc import Mapping

from ._io import load, save
from .errors import ConfigError, LoadMismatch

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
    that); use them to copy from, as load_state_dict() does."""
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
                    value = torch.from_numpy(value)
            else:
                value = torch.from_numpy(value)
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
        if value.dtype not in _torch_dtypes(torch):
            raise ConfigError("tensor '%s' is %s, which a checkpoint cannot hold (float32, float64, float16, int32, "
                              "int64, uint8 and bool can be held)" % (name, value.dtype))
        value = value.detach().cpu().numpy()
    elif value is None:
        return
    elif isinstance(value, torch.device):
        value = str(value)
    out[name] = value


def _torch_dtype(dtype, torch):
    return dict(zip(("float32", "float64", "float16", "int32", "int64", "uint8", "bool"), _torch_dtypes(torch))).get(str(dtype))


def _torch_dtypes(torch):
    return (torch.float32, torch.float64, torch.float16, torch.int32, torch.int64, torch.uint8, torch.bool)


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
# The entries of the C++ library's TorchState (include/ckpt/torch.hpp), so that a training run
# moves between Python and a libtorch program in either direction: the module's parameters and
# buffers under "model.", the optimizer's kind, param groups and per-parameter state keyed by
# parameter name ("optimizer.state.fc.weight.exp_avg"; PyTorch's own state_dict keys it by
# index), the scheduler's position and the CPU generator's state.

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
_OWN = ("model.", "optimizer.", "scheduler.step_count", "torch.cpu_generator")


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
    if t.dtype not in _torch_dtypes(torch):
        raise ConfigError("tensor '%s' is %s, which a checkpoint cannot hold" % (name, t.dtype))
    return t.detach().cpu().contiguous().numpy()


def training_state(model, optimizer=None, scheduler=None, extra=None, generator=True, model_prefix="model."):
    """The entries a C++ TorchState of this module, optimizer and scheduler saves, as a dict
    for ckpt.save: a libtorch program's TorchState loads them, and load_training_state()
    loads what a TorchState saved. `extra`: more entries (the program's position)."""
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
        out["scheduler.step_count"] = int(scheduler.last_epoch)
    if generator:
        out["torch.cpu_generator"] = torch.get_rng_state().numpy()
    return out


def save_training_state(path, model, optimizer=None, scheduler=None, extra=None, generator=True, model_prefix="model.",
                        **options):
    """Writes training_state(...) as checkpoint `path`; `options` are ckpt.save's."""
    return save(path, training_state(model, optimizer, scheduler, extra, generator, model_prefix), **options)


def load_training_state(path, model, optimizer=None, scheduler=None, generator=True, model_prefix="model.",
                        key=None):
    """Loads a TorchState checkpoint (from a libtorch program or save_training_state) into the
    module, the optimizer (its param groups' options and the state of each parameter the file
    holds state for; the others get none, as before their first step), the scheduler and the
    CPU generator. Every tensor is checked against its target before anything is written: a
    name missing or left over, another dtype or shape, another optimizer kind or other
    parameters in a param group is a LoadMismatch. Returns the file's other entries."""
    torch = _torch()
    path = str(path)
    entries = load(path, key=key)
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
            raise LoadMismatch("'%s' holds the state of %s optimizer; this one is %s"
                               % (path, "a " + saved if saved else "no", kind), path)
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
    if scheduler is not None and "scheduler.step_count" not in entries:
        raise LoadMismatch("'%s' holds no scheduler position (scheduler.step_count)" % path, path)
    if generator and "torch.cpu_generator" not in entries:
        raise LoadMismatch("'%s' holds no generator state (torch.cpu_generator)" % path, path)

    # every check passed: write
    with torch.no_grad():
        for t, a in plan:
            t.copy_(torch.from_numpy(a.copy()))
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
    if scheduler is not None:
        scheduler.last_epoch = int(entries["scheduler.step_count"])
        scheduler._step_count = scheduler.last_epoch + 1
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
    if generator:
        torch.set_rng_state(torch.from_numpy(entries["torch.cpu_generator"].copy()))
    return {n: v for n, v in entries.items() if not n.startswith(_OWN)}
