#!/usr/bin/python3
"""The Python package's load and save against NumPy's and PyTorch's own files.

A state of --mib MiB (default 256) in the shape of a model's: a few large float32 tensors
holding 90 % of the bytes and about a hundred small ones (float32, float16, int64, 0-d).
Warm page cache, one process, the contenders alternating (the order rotates every round),
medians of --rounds rounds (default 5):

  load  ckpt.load(mmap=True), memory map: as returned (the checksum already read every byte)
        ckpt.load(mmap=True), then every byte read (a reduction over each array)
        ckpt.load(mmap=False), the default: the body read into memory of its own
        np.load of an uncompressed .npz (np.savez), every array materialized (np.load is lazy)
        torch.load of the same state_dict (torch.save of torch tensors)
  save  ckpt.save: atomic (temporary, fsync, rename, fsync of the directory)
        np.savez, then fsync of the file and of its directory: as durable as ckpt.save
        torch.save, then the same fsyncs (for information)
        Every save goes to a new file, after os.sync(), so that no fsync pays for the dirty
        pages of the contender before it.

Before every timed load, memory of the state's size is allocated, touched and freed, so that
every contender starts from just-freed memory (see docs/PERFORMANCE.md: first touch of memory
the VM handed back costs many times more, and would fall on whichever contender comes first).

  PYTHONPATH=python /usr/bin/python3 bench/python_io.py [--dir DIR] [--mib N] [--rounds N]

--dir: default a fresh directory under /var/tmp (on disk), removed at the end; with --dir,
only the bench's own files are removed. /dev/shm measures each contender apart from the disk.
The last line is machine-readable. Exit status 1 if anything loaded differs from what was
saved, or the run did not time what it planned: every round's loads, each returning every
array, and saves, each leaving a file of at least the state's size, none of them faster than
memory; a missed target does not fail the run.
"""

import argparse
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import ckpt  # noqa: E402

try:
    import torch
except ImportError:  # the torch contenders are skipped
    torch = None

# More bytes a second than any machine's memory gives one process: a load or save timed faster
# than this moved nothing in the time taken.
MAX_BYTES_PER_SECOND = 1e12

TARGETS = {  # ratio name: the least it should be
    "load: ckpt.load(mmap=False) / np.load(npz)": 1.0,
    "load: ckpt.load(mmap=False) / torch.load": 5.0,
    "save: ckpt.save / np.savez+fsync": 0.9,
}


def make_state(mib, seed=0):
    """A model-like state of about `mib` MiB: 6 large float32 tensors with 90 % of the bytes,
    90 small float32 tensors of 12 sizes, 2 float16 tensors and 2 int64 counters."""
    total = mib << 20
    rng = np.random.default_rng(seed)
    state = {}
    large = int(total * 0.9) // 6 // 4  # float32 elements of each large tensor
    cols = 1024 if large >= 1024 else 1
    for i in range(6):
        name = "embed.weight" if i == 0 else "layers.%d.mlp.weight" % (i - 1)
        state[name] = rng.random((large // cols, cols), dtype=np.float32)
    rest = total - sum(a.nbytes for a in state.values())
    weights = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]  # relative sizes of the small tensors
    unit = max(1, rest // 4 // (sum(weights) * 90 // len(weights) + 2))
    for i in range(90):
        layer, part = divmod(i, 6)
        name = "layers.%d.%s" % (layer, ("ln1.weight", "ln1.bias", "attn.qkv.bias", "attn.out.bias",
                                         "ln2.weight", "ln2.bias")[part])
        state[name] = rng.random(unit * weights[i % len(weights)], dtype=np.float32)
    state["head.scale"] = rng.random(unit, dtype=np.float32).astype(np.float16)
    state["head.shift"] = rng.random((4, 8), dtype=np.float32).astype(np.float16)
    state["step"] = np.array(123456, dtype=np.int64)
    state["epoch"] = np.array(7, dtype=np.int64)
    return state


def read_every_byte(arrays):
    """Reads every byte of each array once (a reduction over its bytes as the widest integers
    that divide it): what a consumer of a lazily mapped state pays on first use."""
    acc = 0
    for a in arrays:
        flat = a.reshape(-1).view(np.uint8)
        for t in (np.uint64, np.uint32, np.uint16, np.uint8):
            if flat.nbytes % np.dtype(t).itemsize == 0:
                break
        if flat.nbytes:
            acc ^= int(np.bitwise_xor.reduce(flat.view(t)))
    return acc


def fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fs_type(path):
    """The file system type of `path`, from the longest mount point in /proc/mounts."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                mnt = fields[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, "%s (%s on %s)" % (fields[2], fields[0], mnt)
    except OSError:
        pass
    return kind


def machine_facts(directory):
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        pass
    thp = "?"
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().strip()
    except OSError:
        pass
    print("machine: %s, %d CPUs (%d usable), Linux %s, transparent huge pages %s"
          % (cpu, os.cpu_count(), len(os.sched_getaffinity(0)), platform.release(), thp))
    print("python %s, numpy %s, torch %s, xxhash %s" % (
        platform.python_version(), np.__version__, torch.__version__ if torch else "(not installed: skipped)",
        getattr(__import__("xxhash"), "VERSION", "?")))
    if torch:
        print("torch threads: %d" % torch.get_num_threads())
    print("directory: %s, %s" % (directory, fs_type(directory)))
    print("load average: %.2f %.2f %.2f" % os.getloadavg())


def busy_seconds():
    """CPU seconds spent by the whole machine (from /proc/stat; None if unreadable) and by
    this process, so far."""
    mine = sum(os.times()[:2])
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None, mine
    # user nice system idle iowait irq softirq steal ...: everything but idle and iowait
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK"), mine


def same(state, loaded):
    if list(loaded) != list(state):
        return False
    for k, v in state.items():
        w = loaded[k]
        if torch is not None and isinstance(w, torch.Tensor):
            w = w.numpy()
        if w.dtype != v.dtype or w.shape != v.shape or not np.array_equal(w, v):
            return False
    return True


def prime(nbytes):
    """Allocates, touches and frees `nbytes` of memory: the next allocation gets just-freed
    pages, whoever makes it."""
    np.ones(nbytes, dtype=np.uint8)


def timed(fn):
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out
    finally:
        gc.enable()


def run(args, directory):
    state = make_state(args.mib)
    payload = sum(a.nbytes for a in state.values())
    print("state: %d tensors, %.1f MiB of payload (%d large float32 of %.1f MiB, the rest %.2f MiB)"
          % (len(state), payload / (1 << 20), 6, state["embed.weight"].nbytes / (1 << 20),
             (payload - 6 * state["embed.weight"].nbytes) / (1 << 20)))
    tstate = {k: torch.from_numpy(v) for k, v in state.items()} if torch else None
    files = []

    def path(name):
        p = os.path.join(directory, "python_io-" + name)
        files.append(p)
        return p

    ck, npz, pt = path("load.ckpt"), path("load.npz"), path("load.pt")
    ckpt.save(ck, state)
    np.savez(npz, **state)
    if torch:
        torch.save(tstate, pt)
    os.sync()

    def load_npz():
        with np.load(npz) as z:
            return {k: z[k] for k in z.files}

    loads = {
        "ckpt.load (mmap)": lambda: ckpt.load(ck, mmap=True),
        "ckpt.load (mmap) + read every byte": lambda: (lambda d: (read_every_byte(d.values()), d)[1])(
            ckpt.load(ck, mmap=True)),
        "ckpt.load(mmap=False)": lambda: ckpt.load(ck, mmap=False),
        "np.load(npz), materialized": load_npz,
    }
    if torch:
        loads["torch.load"] = lambda: torch.load(pt)

    serial = iter(range(1 << 30))

    def save_ckpt():
        ckpt.save(path("save-%d.ckpt" % next(serial)), state)

    def save_npz():
        p = path("save-%d.npz" % next(serial))
        np.savez(p, **state)
        fsync_path(p)
        fsync_path(directory, directory=True)

    def save_torch():
        p = path("save-%d.pt" % next(serial))
        torch.save(tstate, p)
        fsync_path(p)
        fsync_path(directory, directory=True)

    saves = {"ckpt.save": save_ckpt, "np.savez+fsync": save_npz}
    if torch:
        saves["torch.save+fsync"] = save_torch

    # An untimed warm-up round that also checks what each contender loads.
    bad = []
    for name, fn in loads.items():
        if not same(state, fn()):
            bad.append(name)
    for name, fn in saves.items():
        fn()
    back = [p for p in files if p.endswith(".ckpt") and "save-" in p]
    if not same(state, ckpt.load(back[-1])):
        bad.append("ckpt.save")
    for p in files[3:]:
        os.unlink(p)
    del files[3:]

    times = {name: [] for name in list(loads) + list(saves)}
    whole = {name: 0 for name in times}  # timed loads that returned every array, saves that left the whole file
    busy0, mine0, wall0 = *busy_seconds(), time.perf_counter()
    for r in range(args.rounds):
        order = list(loads)
        order = order[r % len(order):] + order[:r % len(order)]
        for name in order:
            prime(payload)
            t, out = timed(loads[name])
            whole[name] += len(out) == len(state)
            del out
            times[name].append(t)
        order = list(saves)
        order = order[r % len(order):] + order[:r % len(order)]
        for name in order:
            for p in files[3:]:
                os.unlink(p)
            del files[3:]
            os.sync()
            t, _ = timed(saves[name])
            times[name].append(t)
            whole[name] += os.path.getsize(files[-1]) >= payload
        if args.verbose:
            print("round %d: %s" % (r + 1, ", ".join("%s %.1f" % (n, v[-1] * 1e3) for n, v in times.items())))
    busy1, mine1, wall1 = *busy_seconds(), time.perf_counter()
    for p in files:
        os.unlink(p)
    if busy0 is not None:
        print("\nduring the timed rounds (%.1f s) the rest of the machine (other processes, kernel threads such as "
              "writeback) used %.1f CPU-seconds, this process %.1f"
              % (wall1 - wall0, max(0.0, busy1 - busy0 - (mine1 - mine0)), mine1 - mine0))

    med = {name: statistics.median(v) for name, v in times.items()}
    print("\n%-36s %9s %9s %9s %9s" % ("medians of %d rounds" % args.rounds, "ms", "MB/s", "min ms", "max ms"))
    for name, v in times.items():
        print("%-36s %9.1f %9.0f %9.1f %9.1f" % (name, med[name] * 1e3, payload / med[name] / 1e6, min(v) * 1e3,
                                                  max(v) * 1e3))

    ratios = {}

    def ratio(a, b):  # how many times faster a is than b
        if a in med and b in med:
            ratios["%s: %s / %s" % ("save" if a in saves else "load", a, b)] = med[b] / med[a]

    for a in ("ckpt.load(mmap=False)", "ckpt.load (mmap)", "ckpt.load (mmap) + read every byte"):
        ratio(a, "np.load(npz), materialized")
        ratio(a, "torch.load")
    ratio("ckpt.save", "np.savez+fsync")
    ratio("ckpt.save", "torch.save+fsync")
    print("\nratios (baseline time / ckpt time; above 1: ckpt is faster)")
    short = {}
    for name, v in ratios.items():
        key = name.replace("np.load(npz), materialized", "np.load(npz)")
        target = TARGETS.get(key)
        print("  %-72s %6.2fx%s" % (name, v, "" if target is None else "   target >= %.1f: %s"
                                    % (target, "met" if v >= target else "MISSED")))
        short[key] = v
    print("load average: %.2f %.2f %.2f" % os.getloadavg())
    if bad:
        print("WRONG DATA from: " + ", ".join(bad))
    tags = (("load_copy/npz", "load: ckpt.load(mmap=False) / np.load(npz)"),
            ("load_copy/torch", "load: ckpt.load(mmap=False) / torch.load"),
            ("load_mmap/npz", "load: ckpt.load (mmap) / np.load(npz)"),
            ("load_mmap_read/npz", "load: ckpt.load (mmap) + read every byte / np.load(npz)"),
            ("save/npz", "save: ckpt.save / np.savez+fsync"))
    print("python_io " + " ".join("%s=%.2f" % (tag, short[k]) for tag, k in tags if k in short))
    failed = check_timed(args.rounds, payload, times, whole, loads)
    return 1 if bad or failed else 0


def check_timed(rounds, payload, times, whole, loads):
    """Whether the run timed what it planned (see the top); says on stderr what it did not."""
    failed = []
    for name, v in times.items():
        what = "loads that returned every array" if name in loads else "saves that left a file of the whole state"
        if len(v) != rounds or whole[name] != rounds:
            failed.append("%s: %s: planned %d, timed %d, %d whole" % (name, what, rounds, len(v), whole[name]))
        med = statistics.median(v) if v else 0
        if not med > 0 or payload / med > MAX_BYTES_PER_SECOND:
            failed.append("%s: implausible: %.3f MiB in %.6f ms, above %.0f GB/s"
                          % (name, payload / (1 << 20), med * 1e3, MAX_BYTES_PER_SECOND / 1e9))
    for line in failed:
        print("python_io: " + line, file=sys.stderr)
    if failed:
        print("python_io: %d check(s) of what was timed failed: the figures above do not measure what they say"
              % len(failed), file=sys.stderr)
    return bool(failed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="directory for the files (default: a new one under /var/tmp)")
    ap.add_argument("--mib", type=int, default=256, help="size of the state in MiB (default 256)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    ap.add_argument("--verbose", action="store_true", help="print every round's times")
    args = ap.parse_args()
    if args.mib < 1 or args.rounds < 1:
        ap.error("--mib and --rounds are at least 1")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
        directory, remove = args.dir, False
    else:
        directory, remove = tempfile.mkdtemp(prefix="python_io-", dir="/var/tmp"), True
    try:
        machine_facts(directory)
        return run(args, directory)
    finally:
        if remove:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
