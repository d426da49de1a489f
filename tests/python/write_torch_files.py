"""Writes the PyTorch files that tests/test_torch.cpp reads, with Debian's python3-torch, the way
training scripts write them (torch.save of a state_dict, of a dict of model, optimizer and
counters, ...), and beside each file NAME.pt what ckpt::load_torch must make of it, written
without torch's serialization in formats ckpt already reads:
   NAME.expected.npz    every tensor, as NumPy sees it, under its flattened name, in C order
                        (np.savez): load_torch gives non-contiguous views in C order
   NAME.expected.json   {"order": every entry's flattened name in order, "values": the other
                        entries (ints, floats, bools, strings) under their flattened names}
Flattening is load_torch's: nested dicts, lists and tuples joined with dots, int keys as their
decimal text, None left out, a torch.device as its text.
Files that load_torch must refuse are written too (see refused_files); torch.save of them must
work, since those are files users have.
   write_torch_files.py DIR"""
import json
import os
import pickle
import sys
import zipfile
from collections import OrderedDict

import numpy as np

try:
    import torch
    import torch.nn as nn
except ImportError:
    sys.exit("python3-torch is missing: the PyTorch import tests need it (bash scripts/deps.sh installs it)")


class Net(nn.Module):
    """A small CNN: convolution, batch norm (with its int64 num_batches_tracked), linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def flatten(obj, name, out):
    if obj is None:
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            assert isinstance(key, (str, int)) and not isinstance(key, bool)
            flatten(value, f"{name}.{key}" if name else str(key), out)
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            flatten(value, f"{name}.{index}" if name else str(index), out)
    elif isinstance(obj, torch.device):
        out[name] = str(obj)
    else:
        assert isinstance(obj, (torch.Tensor, bool, int, float, str)), (name, type(obj))
        out[name] = obj


def save_with_expectations(obj, folder, stem, **save_args):
    torch.save(obj, f"{folder}/{stem}.pt", **save_args)
    entries = {}
    flatten(obj, "", entries)
    tensors = {k: v.detach().numpy().copy(order="C") for k, v in entries.items() if isinstance(v, torch.Tensor)}
    values = {k: v for k, v in entries.items() if not isinstance(v, torch.Tensor)}
    np.savez(f"{folder}/{stem}.expected.npz", **tensors)
    with open(f"{folder}/{stem}.expected.json", "w", encoding="utf-8") as f:
        json.dump({"order": list(entries), "values": values}, f, ensure_ascii=False)


def trained_net():
    torch.manual_seed(7)
    net = Net()
    net.train()
    for _ in range(2):  # batch norm's running statistics move, num_batches_tracked becomes 2
        net(torch.randn(2, 3, 4, 4))
    return net


def value_files(folder):
    net = trained_net()
    save_with_expectations(net.state_dict(), folder, "cnn")
    # the same state_dict with pickle protocol 4 (FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL)
    save_with_expectations(net.state_dict(), folder, "cnn_protocol4", pickle_protocol=4)

    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    loss = net(torch.randn(2, 3, 4, 4)).square().sum()
    loss.backward()
    opt.step()
    save_with_expectations({"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "best_loss": 0.25,
                            "note": "größe ünïcode", "done": False, "scheduler": None}, folder, "training")

    torch.manual_seed(11)
    matrix = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    tied = torch.randn(2, 3)
    assert not matrix.t().is_contiguous() and not matrix[:, ::2].is_contiguous()
    save_with_expectations({
        "f16": torch.randn(2, 3).half(),
        "f64": torch.randn(4, dtype=torch.float64),
        "i32": torch.tensor([-7, 0, 2**31 - 1], dtype=torch.int32),
        "i64": torch.tensor([[-2**63, 2**63 - 1]]),
        "u8": torch.tensor([0, 1, 255], dtype=torch.uint8),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "i16": torch.tensor([-32768, 0, 32767], dtype=torch.int16),
        "c64": torch.tensor([1 + 2j, 0.5 - 3.5j], dtype=torch.complex64),
        "c128": torch.tensor([[0.25 - 1j]], dtype=torch.complex128),
        "flags": torch.tensor([True, False, True]),
        "scalar_f32": torch.tensor(2.5),
        "scalar_i64": torch.tensor(-9),
        "scalar_bool": torch.tensor(True),
        "empty": torch.zeros(2, 0),
        "empty_i64": torch.zeros(0, dtype=torch.int64),
        "matrix": matrix,
        "transposed": matrix.t(),            # non-contiguous: shares matrix's storage
        "row": matrix[1],                    # a slice at an offset of the same storage
        "every_other": matrix[:, ::2],       # strided
        "column": matrix[:, 2:3],            # size-1 dimension, offset
        "tied.a": tied,
        "tied.b": tied,                      # the same tensor object twice
        "param": nn.Parameter(torch.ones(2, 2)),
        "device": torch.device("cuda", 1),
        "nested": {"list": [1, 2.5, "x", None, True], "tuple": (torch.ones(1), -3), 5: "int key",
                   "größe": OrderedDict(w=torch.zeros(1, 1, 1, 1, dtype=torch.float16))},
    }, folder, "kinds")


class RebuildOutOfRange:
    """Pickles as _rebuild_tensor_v2 over a 6-element storage, from offset 4 with 3 elements."""

    def __reduce__(self):
        storage = torch.arange(6, dtype=torch.float32).storage()
        return torch._utils._rebuild_tensor_v2, (storage, 4, (3,), (1,), False, OrderedDict())


class Model:
    """A user's class: torch.save pickles its objects by reference to it."""

    def __init__(self):
        self.w = torch.ones(2)


def refused_files(folder):
    torch.save({"w": torch.ones(2), "config": Model()}, f"{folder}/user_class.pt")
    torch.save({"w": torch.ones(2), "hook": os.system}, f"{folder}/os_system.pt")
    torch.save({"ok": torch.ones(2), "half_brain": torch.ones(3, dtype=torch.bfloat16)}, f"{folder}/bfloat16.pt")
    torch.save({"small": torch.ones(3, dtype=torch.int8)}, f"{folder}/int8.pt")
    torch.save({"w": torch.ones(2)}, f"{folder}/legacy.pt", _use_new_zipfile_serialization=False)
    torch.save({"wide": torch.zeros(1).expand(100)}, f"{folder}/expanded.pt")
    torch.save({"w": RebuildOutOfRange()}, f"{folder}/out_of_range.pt")
    torch.save(torch.ones(2), f"{folder}/bare_tensor.pt")
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), f"{folder}/torchscript.pt")
    # cnn.pt with the record of one storage 4 bytes short: the zip is sound, the storage is not
    with zipfile.ZipFile(f"{folder}/cnn.pt") as src, zipfile.ZipFile(f"{folder}/short_storage.pt", "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data/0"):
                data = data[:-4]
            dst.writestr(info.filename, data)
    # a storage record deflated from 4 KiB whose zip entry claims the 4 MB that its persistent
    # id needs (within deflate's 1032:1): nothing that large may be allocated before it arrives
    torch.save({"w": torch.zeros(1_000_000)}, f"{folder}/big.pt")
    with zipfile.ZipFile(f"{folder}/big.pt") as src, zipfile.ZipFile(f"{folder}/claims_too_much.pt", "w") as dst:
        for info in src.infolist():
            if info.filename.endswith("/data/0"):
                dst.writestr(info.filename, os.urandom(4096), compress_type=zipfile.ZIP_DEFLATED)
            else:
                dst.writestr(info.filename, src.read(info))
    os.remove(f"{folder}/big.pt")
    raw = bytearray(open(f"{folder}/claims_too_much.pt", "rb").read())
    name = b"big/data/0"  # its local header's and its directory entry's uncompressed size
    for signature, size_at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = 0
        while True:
            at = raw.index(signature, at)
            name_at = at + (30 if signature == b"PK\x03\x04" else 46)
            if raw[name_at:name_at + len(name)] == name:
                raw[at + size_at:at + size_at + 4] = (4_000_000).to_bytes(4, "little")
                break
            at += 4
    open(f"{folder}/claims_too_much.pt", "wb").write(raw)
    # pickles torch.save never writes, in its zip: a set (protocol 4's EMPTY_SET opcode), lists
    # holding each other 2**60 times over, a list holding itself, dicts nested 200 deep
    shared = [1, 2]
    for _ in range(60):
        shared = [shared, shared]
    looped = []
    looped.append(looped)
    deep = leaf = {}
    for _ in range(200):
        leaf["k"] = {}
        leaf = leaf["k"]
    for stem, obj, protocol in (("set", {"s": {1, 2}}, 4), ("shared", {"x": shared}, 2), ("looped", {"l": looped}, 2),
                                ("deep", deep, 2)):
        with zipfile.ZipFile(f"{folder}/{stem}.pt", "w") as z:
            z.writestr(f"{stem}/data.pkl", pickle.dumps(obj, protocol=protocol))
            z.writestr(f"{stem}/version", "3\n")


def main(folder):
    value_files(folder)
    refused_files(folder)


if __name__ == "__main__":
    main(sys.argv[1])
