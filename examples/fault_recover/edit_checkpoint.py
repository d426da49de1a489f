"""Edits fault_recover's newest checkpoint in Python and saves it where the example's restart
takes it: the same entries at the same epoch and step, under the next run prefix
(lenet_{N}-{epoch}_{step}.ckpt), which orders after every file already there. The original
stays as it was.

  edit_checkpoint.py resave DIR              the newest checkpoint, loaded and saved unchanged
  edit_checkpoint.py reinit DIR SEED         the same with the classifier (fc3) re-initialized
  edit_checkpoint.py reinit-safetensors IN OUT SEED
                                             the same change on a .safetensors file that
                                             `ckpt export` wrote, with NumPy alone (no ckpt
                                             package): the tensors' bytes rewritten in place
  edit_checkpoint.py newest DIR              "EPOCH STEP NEXT_NAME PATH" of the newest checkpoint

resave and reinit print the path written. The package comes from PYTHONPATH (python/ of the
repository), imported only where it is used; it needs Debian's python3-numpy and
python3-xxhash."""
import json
import os
import struct
import sys

import numpy as np

PREFIX = "lenet"


def reinit_classifier(state, seed):
    """The edit, as new arrays by name: fc3 (the last layer) drawn anew in NumPy, its bias and
    the momentum of both zeroed, as one would to train the classifier again on the features
    learned so far."""
    w = state["fc3.weight"]
    rng = np.random.default_rng(seed)
    new = {"fc3.weight": (rng.standard_normal(w.shape) * 0.05).astype(w.dtype)}
    for name in ("fc3.bias", "moments.fc3.weight", "moments.fc3.bias"):
        new[name] = np.zeros_like(state[name])
    return new


def reinit_safetensors(source, target, seed):
    """reinit_classifier on a .safetensors file: its header (with the scalars in its metadata)
    kept as it is, the edited tensors' bytes overwritten."""
    with open(source, "rb") as f:
        raw = bytearray(f.read())
    (n,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8:8 + n])
    tensors = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if spec["dtype"] != "F32":
            sys.exit("edit_checkpoint: %s is %s; this edit reads F32 tensors only" % (name, spec["dtype"]))
        begin, end = spec["data_offsets"]
        tensors[name] = np.frombuffer(raw, dtype="<f4", count=(end - begin) // 4,
                                      offset=8 + n + begin).reshape(spec["shape"])
    for name, value in reinit_classifier(tensors, seed).items():
        np.copyto(tensors[name], value, casting="no")  # writes into raw
    with open(target, "wb") as f:
        f.write(raw)


def newest(directory):
    """The newest valid checkpoint, its position, and the name of the next run's file there."""
    import ckpt
    path = ckpt.latest(directory, PREFIX)
    if path is None:
        sys.exit("edit_checkpoint: no valid checkpoint of '%s' in '%s'" % (PREFIX, directory))
    h = ckpt.header(path)
    run = max(c.run for c in ckpt.ls(directory, PREFIX)) + 1
    return h.epoch, h.step, "%s_%d-%d_%d.ckpt" % (PREFIX, run, h.epoch, h.step), path


def edit(directory, seed):
    import ckpt
    epoch, step, name, path = newest(directory)
    state = ckpt.load(path)
    if seed is not None:
        state.update(reinit_classifier(state, seed))
    return ckpt.save(os.path.join(directory, name), state, epoch=epoch, step=step)


def main(argv):
    if len(argv) == 3 and argv[1] == "resave":
        print(edit(argv[2], None))
    elif len(argv) == 4 and argv[1] == "reinit":
        print(edit(argv[2], int(argv[3])))
    elif len(argv) == 5 and argv[1] == "reinit-safetensors":
        reinit_safetensors(argv[2], argv[3], int(argv[4]))
    elif len(argv) == 3 and argv[1] == "newest":
        print(*newest(argv[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
