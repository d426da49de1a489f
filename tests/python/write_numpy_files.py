"""Writes files in the formats ckpt imports, the way Python programs write them:
   numpy.npz (np.savez), numpy_compressed.npz (np.savez_compressed) and python.safetensors
   (the safetensors layout written with json and struct, tensors sorted by name as the
   reference writer does). Besides pattern.py's tensors, each npz has a Fortran-ordered and a
   big-endian array and the scalars as NumPy saves them.
   write_numpy_files.py DIR"""
import json
import struct
import sys

import numpy as np

import pattern

SAFETENSORS_DTYPES = {"float32": "F32", "float64": "F64", "float16": "F16", "int32": "I32", "int64": "I64",
                      "uint8": "U8", "bool": "BOOL", "int8": "I8", "int16": "I16", "uint16": "U16", "uint32": "U32",
                      "uint64": "U64", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def safetensors_dtype(dtype):
    """A bit pattern's dtype by what it stands for (its metadata), others by NumPy's name."""
    return SAFETENSORS_DTYPES[(dtype.metadata or {}).get("ckpt_dtype", dtype.name)]


def save_safetensors(arrays, metadata, path):
    header, chunks, offset = {}, [], 0
    for name in sorted(arrays):
        data = np.ascontiguousarray(arrays[name]).tobytes()
        header[name] = {"dtype": safetensors_dtype(arrays[name].dtype), "shape": list(arrays[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header = {"__metadata__": metadata, **header}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def main(folder):
    arrays = pattern.tensors("npz")
    extra = {"fortran": np.asfortranarray(pattern.values("float32", (3, 4))),
             "bigendian": pattern.values("int32", (2, 3)).astype(">i4")}
    assert extra["fortran"].flags.f_contiguous and not extra["fortran"].flags.c_contiguous
    np.savez(f"{folder}/numpy.npz", **arrays, **extra, **pattern.SCALARS)
    np.savez_compressed(f"{folder}/numpy_compressed.npz", **arrays, **extra, **pattern.SCALARS)
    save_safetensors(pattern.tensors("safetensors"), {"format": "pt", "note": pattern.SCALARS["note"]}, f"{folder}/python.safetensors")


if __name__ == "__main__":
    main(sys.argv[1])
