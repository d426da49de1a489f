"""python3 -m ckpt ls|show|verify: the `ckpt` tool's reading commands, in Python."""

import argparse
import json
import math
import os
import signal
import sys
import time

from . import contents, header, ls, verify
from ._files import temporaries_under
from .codecs import as_key
from .errors import Error, printable


def _when(ns):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def _json_value(v):
    """JSON has no NaN or infinity: those as the C++ tool prints them."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"
    return v


def _ls(args):
    found = ls(args.dir, args.prefix, key=args.key_file)
    left = temporaries_under(args.dir)  # every temporary there, whatever its prefix
    if args.json:
        print(json.dumps({"directory": args.dir, "checkpoints": [
            {"path": c.path, "prefix": c.prefix, "run": c.run, "epoch": c.epoch, "step": c.step, "kind": c.kind,
             "valid": c.problem is None, "problem": c.problem, "latest": c.latest,
             "metrics": {k: _json_value(v) for k, v in c.metrics.items()},
             "save_time": _when(c.header.save_time_ns) if c.header else None} for c in found],
            "temporaries": [{"path": t.path, "pid": t.pid, "size": t.size,
                             "writer": "running" if t.writer_alive else "gone"} for t in left]}, indent=2))
        return 0
    if not found:
        print("no checkpoints in '%s'%s" % (args.dir, " with prefix '%s'" % args.prefix if args.prefix else ""))
        _print_temporaries(left, args.dir)
        return 0
    print("%-44s %4s %6s %8s %-10s %-20s %s" % ("FILE", "RUN", "EPOCH", "STEP", "KIND", "SAVED", "STATUS"))
    for c in found:
        status = "INVALID: " + c.problem if c.problem else "ok"
        metrics = "  " + " ".join("%s=%.6g" % kv for kv in sorted(c.metrics.items())) if c.metrics else ""
        print("%-44s %4s %6s %8s %-10s %-20s %s%s%s" % (
            os.path.relpath(c.path, args.dir), "-" if c.run is None else c.run, "-" if c.epoch is None else c.epoch,
            "-" if c.step is None else c.step, c.kind or "-", _when(c.header.save_time_ns) if c.header else "-",
            status, metrics, "  <- latest" if c.latest else ""))
    _print_temporaries(left, args.dir)
    return 0


def _print_temporaries(left, directory):
    if not left:
        return
    gone = [t for t in left if not t.writer_alive]
    print("\n%d temporar%s (%d bytes)%s:" % (len(left), "y" if len(left) == 1 else "ies", sum(t.size for t in left),
                                            ", %d left by writers that are gone: the next save here removes them"
                                            % len(gone) if gone else ""))
    for t in left:
        print("  %-44s %10d bytes  pid %-8d %s" % (printable(os.path.relpath(t.path, directory)), t.size, t.pid,
                                                   "running" if t.writer_alive else "gone"))


def _show(args):
    """The C++ tool's `ckpt show` (--json: the same layout and names)."""
    h = header(args.file)
    entries = None
    if not h.encrypted or args.key_file:
        entries = contents(args.file, key=args.key_file)  # checks the checksum
    else:
        verify(args.file)
    if args.json:
        out = {"path": args.file,
               "header": {"format_version": h.version, "archive": h.archive, "codecs": "+".join(h.codecs) or "none",
                          "body_bytes": h.body_length, "epoch": h.epoch, "step": h.step,
                          "save_time": _when(h.save_time_ns), "checksum_xxh3": "%016x" % h.body_checksum},
               "checksum_verified": True,
               "entries": None if entries is None else [
                   {"name": e.name, "kind": _JSON_KINDS.get(e.kind, e.kind),
                    **({"dtype": e.dtype, "shape": list(e.shape), "order": e.order, "bytes": e.nbytes}
                       if e.kind == "tensor" else {"value": _json_value(e.value)})} for e in entries]}
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return 0
    for k, v in (("path", args.file), ("format_version", h.version), ("archive", h.archive),
                 ("codecs", ", ".join(h.codecs) or "none"), ("epoch", h.epoch), ("step", h.step),
                 ("save_time", _when(h.save_time_ns)), ("body_bytes", h.body_length),
                 ("body_xxh3", "%016x" % h.body_checksum)):
        print("%-15s %s" % (k + ":", v))
    if entries is None:
        print("entries         encrypted: pass --key-file to list them")
        return 0
    print("entries:        %d" % len(entries))
    for e in entries:
        what = ("%s%s%s %d bytes" % (e.dtype, list(e.shape), " column-major" if e.order == "column_major" else "",
                                     e.nbytes) if e.kind == "tensor" else "%s %r" % (e.kind, e.value))
        print("  %-40s %s" % (e.name, what))
    return 0


_JSON_KINDS = {"double": "float64"}  # the C++ tool's names of the kinds


def _verify(args):
    failed = 0
    for path in args.files:
        try:
            verify(path, key=args.key_file)
            print("ok       %s" % path)
        except Error as e:
            failed += 1
            print("FAILED   %s: %s" % (path, e))
    print("%d verified, %d failed" % (len(args.files) - failed, failed))
    return 1 if failed else 0


def main(argv=None):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    parser = argparse.ArgumentParser(prog="python3 -m ckpt", description="Read and check ckpt checkpoint files.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ls", help="list the checkpoints in a directory, each verified; mark what latest() takes")
    p.add_argument("dir")
    p.add_argument("--prefix")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_ls)
    p = sub.add_parser("show", help="a checkpoint's header and table of contents")
    p.add_argument("file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_show)
    p = sub.add_parser("verify", help="check files' headers and checksums (and, with a key, decrypt them)")
    p.add_argument("files", nargs="+")
    p.set_defaults(run=_verify)
    for p in sub.choices.values():
        p.add_argument("--key-file", help="the key of encrypted checkpoints (32 bytes, or 64 hex digits)")
    args = parser.parse_args(argv)
    try:
        if args.key_file:
            args.key_file = as_key(args.key_file)
        return args.run(args)
    except Error as e:
        print("ckpt: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
