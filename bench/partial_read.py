#!/usr/bin/python3
"""One entry of a checkpoint read in Python: ckpt.open(path).read(name), which reads and
checks only the entry's chunks (format version 3), against a full verified ckpt.load of the
same file, and np.load of an uncompressed npz of the same arrays (which checks nothing).

The state is 100 float32 arrays of 1 % of --mib MiB each (default 256 MiB). Warm page cache,
one process; the contenders alternate, the order rotating every round; medians of --rounds
rounds (default 9). Each round reads another entry. Before every timed read, memory of the
state's size is allocated, touched and freed, as bench/python_io.py does, so that each
contender starts from just-freed memory rather than from what the one before it freed, and
the garbage collector is run, then held off while the read is timed (as bench/python_io.py).

  PYTHONPATH=python /usr/bin/python3 bench/partial_read.py [--dir DIR] [--mib N] [--rounds N]

The last line is machine-readable. Exit status 1 if a read gives back other values than were
saved, or the run did not time what it planned (every round's reads, each no faster than
memory); a missed target does not fail the run.
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

TENSORS = 100
MAX_BYTES_PER_SECOND = 1e12   # faster than memory: nothing was moved


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    if args.mib < 1 or args.rounds < 1:
        ap.error("--mib and --rounds must be at least 1")
    work = args.dir or tempfile.mkdtemp(prefix="partial_read-", dir="/var/tmp")
    files = [os.path.join(work, n) for n in ("partial.ckpt", "partial.npz")]
    try:
        return run(work, files, args)
    finally:
        if args.dir:
            for f in files:
                if os.path.exists(f):
                    os.unlink(f)
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(work, files, args):
    print("machine: %s, %d cpus, python %s, numpy %s" % (platform.processor() or platform.machine(), os.cpu_count(),
                                                        platform.python_version(), np.__version__))
    print("dir: %s\ndate: %s" % (work, time.strftime("%Y-%m-%d %H:%M:%S %Z")))
    cols = 1024
    rows = max(16, (args.mib << 20) // TENSORS // 4 // cols)
    rng = np.random.default_rng(0)
    state = {"layer.%d" % i: rng.random((rows, cols), dtype=np.float32) for i in range(TENSORS)}
    entry_bytes = rows * cols * 4
    path, npz = files
    ckpt.save(path, state)
    np.savez(npz, **state)
    print("state: %d float32 arrays of [%d, %d] (%.2f MiB each); format version %d"
          % (TENSORS, rows, cols, entry_bytes / 2**20, ckpt.header(path).version))

    def full(name):
        return ckpt.load(path)[name]

    def entry(name):
        with ckpt.open(path) as r:
            return r.read(name)

    def npz_entry(name):
        with np.load(npz) as z:
            return z[name]

    contenders = [("full", full), ("entry", entry), ("npz", npz_entry)]
    times = {n: [] for n, _ in contenders}
    same = True
    for round_ in range(args.rounds):
        name = "layer.%d" % ((round_ * 37 + 11) % TENSORS)
        k = round_ % len(contenders)
        for label, fn in contenders[k:] + contenders[:k]:
            np.ones(TENSORS * entry_bytes, dtype=np.uint8)  # allocated, touched, freed
            gc.collect()
            gc.disable()  # a collection of the whole process would fall on whichever read allocates then
            t0 = time.perf_counter()
            got = fn(name)
            times[label].append(time.perf_counter() - t0)
            gc.enable()
            same = same and np.array_equal(got, state[name])
            got = None  # freed here, not in the next read's time (a full load's body is 256 MiB to unmap)
    failed = []
    for label, ts in times.items():
        if len(ts) != args.rounds:
            failed.append("%s: planned %d reads, timed %d" % (label, args.rounds, len(ts)))
    moved = {"full": TENSORS * entry_bytes, "entry": entry_bytes, "npz": entry_bytes}
    med = {label: statistics.median(ts) for label, ts in times.items()}
    for label, t in med.items():
        if not t > 0 or moved[label] / t > MAX_BYTES_PER_SECOND:
            failed.append("%s: implausible: %d bytes in %.6f s" % (label, moved[label], t))
    if not same:
        failed.append("a read gave back other values than were saved")
    print("medians of %d rounds (ms):" % args.rounds)
    print("  full   ckpt.load (every byte checked)       %9.3f" % (med["full"] * 1e3))
    print("  entry  ckpt.open().read (its chunks checked) %9.3f   entry / full %.4f (target <= 0.05)"
          % (med["entry"] * 1e3, med["entry"] / med["full"]))
    print("  npz    np.load(npz)[name] (nothing checked)  %9.3f   entry / npz  %.2f"
          % (med["npz"] * 1e3, med["entry"] / med["npz"]))
    print("result: entry/full=%.4f entry/npz=%.3f full_ms=%.3f entry_ms=%.3f npz_ms=%.3f"
          % (med["entry"] / med["full"], med["entry"] / med["npz"], med["full"] * 1e3, med["entry"] * 1e3,
             med["npz"] * 1e3))
    for f in failed:
        print("partial_read.py: %s" % f, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
