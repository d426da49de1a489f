"""The network of torch_resume/main.cpp in Python, and what the round trip checks do with it.

  torch_net.py evaluate WEIGHTS.safetensors DATA_DIR TEST_LIMIT
      loads the exported weights with load_state_dict(strict=True) and prints
      "correct=K total=N" on the first TEST_LIMIT test images
  torch_net.py init OUT.pt DATA_DIR TEST_LIMIT SEED
      saves a freshly initialized network's state_dict with torch.save and prints its
      "correct=K total=N"
  torch_net.py resave IN.ckpt OUT.ckpt
      loads a checkpoint of torch_resume into the network, Adam and the CPU generator with
      ckpt.torch.load_training_state, and writes them again, from those objects, with
      save_training_state (the example's own entries passed on), at the same epoch and step
Uses Debian's python3-torch and python3-numpy, and for resave the ckpt package (python/)."""
import gzip
import json
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 5)
        self.conv2 = torch.nn.Conv2d(8, 16, 5)
        self.fc1 = torch.nn.Linear(16 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.dropout(F.relu(self.fc1(x.flatten(1))), 0.25, self.training)
        return self.fc2(x)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def test_set(data_dir, limit):
    images = read_idx(f"{data_dir}/t10k-images-idx3-ubyte.gz")[:limit]
    labels = read_idx(f"{data_dir}/t10k-labels-idx1-ubyte.gz")[:limit]
    x = torch.from_numpy(images.copy()).reshape(-1, 1, 28, 28).to(torch.float32).div_(255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def correct(model, data_dir, limit):
    x, y = test_set(data_dir, limit)
    model.eval()
    with torch.no_grad():
        return int(model(x).argmax(1).eq(y).sum()), int(y.shape[0])


SAFETENSORS_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64}


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    buffer = raw[8 + n:]
    out = {}
    for name, spec in header.items():
        begin, end = spec["data_offsets"]
        array = np.frombuffer(buffer[begin:end], dtype=SAFETENSORS_DTYPES[spec["dtype"]]).reshape(spec["shape"])
        out[name] = torch.from_numpy(array.copy())
    return out


def main():
    torch.set_num_threads(1)
    command = sys.argv[1]
    if command == "evaluate":
        weights, data_dir, limit = sys.argv[2], sys.argv[3], int(sys.argv[4])
        model = Net()
        model.load_state_dict(load_safetensors(weights), strict=True)
        k, n = correct(model, data_dir, limit)
    elif command == "init":
        out, data_dir, limit, seed = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        torch.manual_seed(seed)
        model = Net()
        torch.save(model.state_dict(), out)
        k, n = correct(model, data_dir, limit)
    elif command == "resave":
        import ckpt
        import ckpt.torch
        source, out = sys.argv[2], sys.argv[3]
        model = Net()
        optimizer = torch.optim.Adam(model.parameters())
        rest = ckpt.torch.load_training_state(source, model, optimizer)
        header = ckpt.header(source)
        ckpt.torch.save_training_state(out, model, optimizer, extra=rest, epoch=header.epoch, step=header.step,
                                       overwrite=False)
        steps = {int(s["step"]) for s in optimizer.state.values()}
        print(f"resaved epoch {header.epoch} step {header.step}: {len(optimizer.state)} parameters' Adam state "
              f"at step {sorted(steps)}, lr {optimizer.param_groups[0]['lr']}, other entries {sorted(rest)}")
        return
    else:
        sys.exit(f"unknown command {command!r}")
    print(f"correct={k} total={n}")


if __name__ == "__main__":
    main()
