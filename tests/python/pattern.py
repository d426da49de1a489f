"""The state that tests/interop_pattern.hpp builds, built again with NumPy: every dtype, ranks
0 to 4, an empty tensor, non-ASCII names, and scalars of every kind. Element k (in C order) of
a tensor is a fixed function of k, so both sides agree bit for bit without sharing a file."""
import numpy as np

SHAPES = [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 2)]
DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int32": np.int32,
          "int64": np.int64, "uint8": np.uint8, "bool": np.bool_}


def values(dtype, shape):
    n = int(np.prod(shape, dtype=np.int64))
    k = np.arange(n, dtype=np.int64)
    if dtype in ("float32", "float64", "float16"):
        v = (k % 251) * 0.25 - 17.5
    elif dtype == "int32":
        v = k * 7919 - 100000
    elif dtype == "int64":
        v = k * 1234567891011 - 5000000000000000
    elif dtype == "uint8":
        v = (k * 37) % 256
    else:
        v = k % 3 == 0
    return v.astype(DTYPES[dtype]).reshape(shape)


def tensors():
    """name -> array, in the order the C++ side sets them."""
    out = {}
    for dtype in DTYPES:
        for rank, shape in enumerate(SHAPES):
            out[f"{dtype}.rank{rank}"] = values(dtype, shape)
    out["empty"] = np.zeros((0, 3), dtype=np.float32)
    out["größe.gewicht"] = values("float32", (2, 2))
    out["层.权重"] = values("int64", (3,))
    return out


SCALARS = {"epoch_num": 6, "lr": 0.01, "nesterov": True, "note": "ünïcode \"quoted\"\ttab", "empty_string": ""}
