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
from .errors import ConfigError

__all__ = ["load_state_dict", "save_state_dict"]


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
        if value.dtype not in _DTYPES(torch):
            raise ConfigError("tensor '%s' is %s, which a checkpoint cannot hold (float32, float64, float16, int32, "
                              "int64, uint8 and bool can be held)" % (name, value.dtype))
        value = value.detach().cpu().numpy()
    elif value is None:
        return
    elif isinstance(value, torch.device):
        value = str(value)
    out[name] = value


def _DTYPES(torch):
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
