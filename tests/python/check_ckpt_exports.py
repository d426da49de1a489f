"""Reads what ckpt wrote with NumPy alone and checks every value against pattern.py.
   check_ckpt_exports.py DIR   (DIR holds pattern.npz, pattern_compressed.npz, pattern.safetensors,
   and column_major.npz and column_major.safetensors: pattern.py's float32 (3, 4) and int64
   (2, 3, 4) arrays, each saved from a column-major tensor)"""
import json
import struct
import sys

import numpy as np

import pattern

SAFETENSORS_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I32": "<i4", "I64": "<i8", "U8": "|u1",
                      "BOOL": "|b1", "I8": "|i1", "I16": "<i2", "U16": "<u2", "U32": "<u4", "U64": "<u8",
                      "BF16": pattern.DTYPES["bfloat16"], "F8_E4M3": pattern.DTYPES["float8_e4m3fn"],
                      "F8_E5M2": pattern.DTYPES["float8_e5m2"]}


def same(name, got, want):
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    assert got.tobytes() == want.tobytes(), f"{name}: values differ"


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    buffer = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    arrays = {}
    for name, spec in header.items():
        begin, end = spec["data_offsets"]
        arrays[name] = np.frombuffer(buffer[begin:end], dtype=SAFETENSORS_DTYPES[spec["dtype"]]).reshape(spec["shape"])
    return arrays, meta


def main(folder):
    want = pattern.tensors("npz")
    for npz in ("pattern.npz", "pattern_compressed.npz"):
        with np.load(f"{folder}/{npz}") as data:
            assert set(data.files) == set(want) | set(pattern.SCALARS), f"{npz}: keys {sorted(data.files)}"
            for name, array in want.items():
                same(f"{npz}:{name}", data[name], array)
            assert data["epoch_num"].dtype == np.int64 and data["epoch_num"] == 6
            assert data["lr"].dtype == np.float64 and data["lr"] == 0.01
            assert data["nesterov"].dtype == np.bool_ and bool(data["nesterov"]) is True
            assert str(data["note"]) == pattern.SCALARS["note"], repr(str(data["note"]))
            assert str(data["empty_string"]) == ""
    want = pattern.tensors("safetensors")
    arrays, meta = load_safetensors(f"{folder}/pattern.safetensors")
    assert set(arrays) == set(want), f"safetensors: tensors {sorted(arrays)}"
    for name, array in want.items():
        same(f"safetensors:{name}", arrays[name], array)
    assert meta["epoch_num"] == "6" and float(meta["lr"]) == 0.01 and meta["nesterov"] == "true"
    assert meta["note"] == pattern.SCALARS["note"] and meta["empty_string"] == ""
    assert json.loads(meta["ckpt.kinds"]) == {"epoch_num": "int64", "lr": "float64", "nesterov": "bool"}
    # column-major tensors: Fortran-ordered arrays in the npz, their bytes as they were; the
    # same values in C order in the safetensors file, which has no order
    column_major = {"matrix": pattern.values("float32", (3, 4)), "cube": pattern.values("int64", (2, 3, 4))}
    with np.load(f"{folder}/column_major.npz") as data:
        for name, array in column_major.items():
            got = data[name]
            assert got.flags.f_contiguous and not got.flags.c_contiguous, f"column_major.npz:{name} is not in Fortran order"
            same(f"column_major.npz:{name}", np.ascontiguousarray(got), array)
    arrays, _ = load_safetensors(f"{folder}/column_major.safetensors")
    for name, array in column_major.items():
        same(f"column_major.safetensors:{name}", arrays[name], array)
    print("numpy read ckpt's npz and safetensors files: all values identical")


if __name__ == "__main__":
    main(sys.argv[1])
