"""The state that tests/interop_pattern.hpp builds, built again with NumPy: every dtype, ranks
0 to 4, an empty tensor, non-ASCII names, and scalars of every kind. Element k (in C order) of
a tensor is a fixed function of k, so both sides agree bit for bit without sharing a file."""
import numpy as np

SHAPES = [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 2)]
# bfloat16 and the 8-bit floats, which NumPy has no dtype for, are their bit patterns, as
# ckpt.load returns them
DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int32": np.int32,
          "int64": np.int64, "uint8": np.uint8, "bool": np.bool_, "int8": np.int8, "int16": np.int16,
          "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
          "bfloat16": np.dtype("<u2", metadata={"ckpt_dtype": "bfloat16"}),
          "float8_e4m3fn": np.dtype("u1", metadata={"ckpt_dtype": "float8_e4m3fn"}),
          "float8_e5m2": np.dtype("u1", metadata={"ckpt_dtype": "float8_e5m2"}),
          "complex64": np.complex64, "complex128": np.complex128}
# what each file format holds (interop_pattern.hpp's pattern_holds)
NOT_IN = {"safetensors": ("complex64", "complex128"), "npz": ("bfloat16", "float8_e4m3fn", "float8_e5m2"),
          "checkpoint": ()}


def values(dtype, shape):
    n = int(np.prod(shape, dtype=np.int64))
    k = np.arange(n, dtype=np.int64)
    f = (k % 251) * 0.25 - 17.5
    if dtype in ("float32", "float64", "float16"):
        v = f
    elif dtype == "int32":
        v = k * 7919 - 100000
    elif dtype == "int64":
        v = k * 1234567891011 - 5000000000000000
    elif dtype == "uint8":
        v = (k * 37) % 256
    elif dtype == "int8":
        v = (k * 37) % 256 - 128
    elif dtype == "int16":
        v = (k * 4099) % 65536 - 32768
    elif dtype == "uint16":
        v = (k * 4099) % 65536
    elif dtype == "uint32":
        v = (k.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(2 ** 32)
    elif dtype == "uint64":
        v = k.astype(np.uint64) * np.uint64(11400714819323198485)  # wraps, as C++'s unsigned arithmetic
    elif dtype == "bfloat16":
        v = f.astype(np.float32).view(np.uint32) >> 16  # exact: the pattern's numbers fit in 8 bits
    elif dtype == "float8_e4m3fn":
        v = (k * 37 + 11) % 256
    elif dtype == "float8_e5m2":
        v = (k * 53 + 7) % 256
    elif dtype in ("complex64", "complex128"):
        v = f + 1j * (-f / 2)
    else:
        v = k % 3 == 0
    return v.astype(DTYPES[dtype]).reshape(shape)


def tensors(fmt="checkpoint"):
    """name -> array, in the order the C++ side sets them, of the dtypes `fmt` holds."""
    out = {}
    for dtype in DTYPES:
        if dtype in NOT_IN[fmt]:
            continue
        for rank, shape in enumerate(SHAPES):
            out[f"{dtype}.rank{rank}"] = values(dtype, shape)
    out["empty"] = np.zeros((0, 3), dtype=np.float32)
    out["größe.gewicht"] = values("float32", (2, 2))
    out["层.权重"] = values("int64", (3,))
    return out


SCALARS = {"epoch_num": 6, "lr": 0.01, "nesterov": True, "note": "ünïcode \"quoted\"\ttab", "empty_string": ""}
