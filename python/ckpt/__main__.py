"""python3 -m ckpt ls|show|verify: the `ckpt` tool's reading commands, in Python."""

import argparse
import json
import math
import os
import re
import signal
import sys
import time

import numpy as np

from . import contents, header, ls, verify
from . import open as ckpt_open
from ._files import temporaries_under
from ._format import ckpt_dtype_name
from .codecs import as_key
from .errors import Error, printable


def _when(ns):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def _text(s):
    """A name, path, prefix or string value as text output shows it: escaped as error messages
    are (control characters and undecodable bytes as \\xNN), and a line feed or tab too, so
    that one value stays on its line of the table."""
    return printable(s).replace("\n", "\\x0a").replace("\t", "\\x09")


def _json_text(v):
    """A str as JSON holds it: bytes of a name or string that are not UTF-8 (kept by
    surrogateescape) become U+FFFD, as JSON holds only Unicode; any other value as it is."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return v


def _json(doc):
    """`doc` with every str of it (keys too) made JSON text."""
    if isinstance(doc, dict):
        return {_json_text(k): _json(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_json(v) for v in doc]
    return _json_text(doc)


_C1 = re.compile("[\x7f-\x9f]")


def _dump(doc):
    """`doc` as JSON text: UTF-8 as it is, and what JSON leaves raw of the controls a terminal
    acts on (DEL, C1) escaped too; a parser reads the same strings back."""
    text = json.dumps(_json(doc), indent=2, ensure_ascii=False)
    return _C1.sub(lambda m: "\\u%04x" % ord(m.group()), text)


_SIZE = re.compile(r"([0-9]{1,20})(|K|M|G|T|KiB|MiB|GiB|TiB)")


def _size(text):
    """--max-decoded-bytes: a number of bytes, with K, M, G or T (KiB ...: powers of 1024)."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise argparse.ArgumentTypeError("'%s' is not a number of bytes (such as 1073741824 or 1G)" % _text(text))
    return int(m.group(1)) << (10 * "KMGT".find(m.group(2)[:1]) + 10 if m.group(2) else 0)


def _json_double(v):
    """JSON has no NaN or infinity: those as the C++ tool prints them (std::to_chars)."""
    if math.isfinite(v):
        return v
    return ("-" if math.copysign(1.0, v) < 0 else "") + ("nan" if math.isnan(v) else "inf")


def _json_value(v):
    """A scalar's value in JSON."""
    return _json_double(v) if isinstance(v, float) else v


def _ls(args):
    found = ls(args.dir, args.prefix, key=args.key_file, max_decoded_bytes=args.max_decoded_bytes)
    left = temporaries_under(args.dir)  # every temporary there, whatever its prefix
    if args.json:
        print(_dump({"directory": args.dir, "checkpoints": [
            {"path": c.path, "prefix": c.prefix, "run": c.run, "epoch": c.epoch, "step": c.step, "kind": c.kind,
             "valid": c.problem is None, "problem": c.problem, "latest": c.latest,
             "metrics": {k: _json_value(v) for k, v in c.metrics.items()},
             "save_time": _when(c.header.save_time_ns) if c.header else None} for c in found],
            "temporaries": [{"path": t.path, "pid": t.pid, "size": t.size,
                             "writer": "running" if t.writer_alive else "gone"} for t in left]}))
        return 0
    if not found:
        print("no checkpoints in '%s'%s" % (_text(args.dir), " with prefix '%s'" % _text(args.prefix)
                                             if args.prefix else ""))
        _print_temporaries(left, args.dir)
        return 0
    print("%-44s %4s %6s %8s %-10s %-20s %s" % ("FILE", "RUN", "EPOCH", "STEP", "KIND", "SAVED", "STATUS"))
    for c in found:
        status = "INVALID: " + _text(c.problem) if c.problem else "ok"
        metrics = "  " + " ".join("%s=%.6g" % (_text(k), v) for k, v in sorted(c.metrics.items())) if c.metrics else ""
        print("%-44s %4s %6s %8s %-10s %-20s %s%s%s" % (
            _text(os.path.relpath(c.path, args.dir)), "-" if c.run is None else c.run,
            "-" if c.epoch is None else c.epoch, "-" if c.step is None else c.step, c.kind or "-",
            _when(c.header.save_time_ns) if c.header else "-", status, metrics, "  <- latest" if c.latest else ""))
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
        print("  %-44s %10d bytes  pid %-8d %s" % (_text(os.path.relpath(t.path, directory)), t.size, t.pid,
                                                   "running" if t.writer_alive else "gone"))


def _show_entry(args):
    """`show --entry NAME`: one entry, read and verified alone in a format version 3 file."""
    with ckpt_open(args.file, key=args.key_file, max_decoded_bytes=args.max_decoded_bytes) as r:
        info = next((e for e in r.entries() if e.name == args.entry), None)
        r.read(args.entry)  # (checks its chunks; LoadMismatch naming the file when there is no such entry)
        alone = r.header.version == 3
        read = r.bytes_read if alone else r.header.body_length
    if args.json:
        print(_dump({"path": args.file, "entry": {"name": info.name, "kind": _JSON_KINDS.get(info.kind, info.kind),
                                                  **_json_fields(info)},
                     "verified_alone": alone, "bytes_read": read}))
        return 0
    print("%s\n  entry '%s', %s" % (_text(args.file), _text(args.entry),
                                   "read and verified alone: %d of the %d body bytes" % (read, r.header.body_length)
                                   if alone else "the whole file was read and verified (format version %d; only "
                                   "version 3 files are read in parts)" % r.header.version))
    print("  %-40s %s" % (_text(info.name), _described(info)))
    return 0


def _show(args):
    """The C++ tool's `ckpt show` (--json: the same layout and names)."""
    if args.entry is not None:
        return _show_entry(args)
    h = header(args.file)
    entries = None
    if not h.encrypted or args.key_file:
        # (checks the checksum)
        entries = contents(args.file, key=args.key_file, max_decoded_bytes=args.max_decoded_bytes)
    else:
        verify(args.file)
    if args.json:
        out = {"path": args.file,
               "header": {"format_version": h.version, "archive": h.archive, "codecs": "+".join(h.codecs) or "none",
                          "body_bytes": h.body_length, "epoch": h.epoch, "step": h.step,
                          "save_time": _when(h.save_time_ns), "checksum_xxh3": "%016x" % h.body_checksum},
               "checksum_verified": True,
               "entries": None if entries is None else [
                   {"name": e.name, "kind": _JSON_KINDS.get(e.kind, e.kind), **_json_fields(e)} for e in entries]}
        print(_dump(out))
        return 0
    for k, v in (("path", _text(args.file)), ("format_version", h.version), ("archive", h.archive),
                 ("codecs", ", ".join(h.codecs) or "none"), ("epoch", h.epoch), ("step", h.step),
                 ("save_time", _when(h.save_time_ns)), ("body_bytes", h.body_length),
                 ("body_xxh3", "%016x" % h.body_checksum)):
        print("%-15s %s" % (k + ":", v))
    if entries is None:
        print("entries         encrypted: pass --key-file to list them")
        return 0
    print("entries:        %d" % len(entries))
    for e in entries:
        print("  %-40s %s" % (_text(e.name), _described(e)))
    return 0


_JSON_KINDS = {"double": "float64"}  # the C++ tool's names of the kinds
_SHOWN_BYTES = 32     # of a bytes entry, what `show` prints
_SHOWN_CHARS = 60     # of a string of a list, or an object's text
_SHOWN_STRINGS = 16   # of a list of strings


def _short(text, limit):
    return text if len(text) <= limit else text[:limit] + "..."


def _described(e):
    """An entry as `show` prints it after its name: a tensor's dtype, shape and size, a
    scalar's value; bytes by their size and first bytes, a list of strings by its first
    strings, an object by its type (and encoding, size and start of a text)."""
    if e.kind == "tensor":
        return "%s%s%s %d bytes" % (e.dtype, list(e.shape), " column-major" if e.order == "column_major" else "",
                                    e.nbytes)
    if e.kind == "string":
        return "string '%s'" % _text(e.value)
    if e.kind == "bytes":
        return "bytes %d bytes '%s'%s" % (e.nbytes, _text(e.value[:_SHOWN_BYTES]),
                                          "..." if e.nbytes > _SHOWN_BYTES else "")
    if e.kind == "strings":
        shown = ["'%s'" % _text(_short(s, _SHOWN_CHARS)) for s in e.value[:_SHOWN_STRINGS]]
        if len(e.value) > _SHOWN_STRINGS:
            shown.append("... %d more" % (len(e.value) - _SHOWN_STRINGS))
        return "strings %d [%s]" % (len(e.value), ", ".join(shown))
    if e.kind == "object":
        if e.encoding == "value map":
            return "object %s, %d item%s" % (_text(e.type), len(e.value), "" if len(e.value) == 1 else "s")
        text = " '%s'" % _text(_short(e.value.data, _SHOWN_CHARS)) if isinstance(e.value.data, str) else ""
        return "object %s (%s, %d bytes)%s" % (_text(e.type), e.encoding, e.nbytes, text)
    return "%s %r" % (e.kind, e.value)


def _json_fields(e):
    """An entry's fields in `show --json` but for its name and kind, as the C++ tool gives
    them: bytes as their size and hex, an object as its type, encoding and size and a value
    map's items, a boost binary's hex or a text encoding's text."""
    if e.kind == "tensor":
        return {"dtype": e.dtype, "shape": list(e.shape), "order": e.order, "bytes": e.nbytes}
    if e.kind == "bytes":
        return {"value": {"size": e.nbytes, "hex": e.value.hex()}}
    if e.kind == "object":
        value = {"type": e.type, "encoding": e.encoding, "size": e.nbytes}
        if e.encoding == "value map":
            value["items"] = {k: _json_item(v) for k, v in e.value.items()}
        elif isinstance(e.value.data, bytes):
            value["hex"] = e.value.data.hex()
        else:
            value["text"] = e.value.data
        return {"value": value}
    return {"value": _json_value(e.value)}  # (a list of strings as a list)


def _e4m3fn(bits):
    """The value of a float8_e4m3fn bit pattern (docs/FORMAT.md section 3)."""
    sign = -1.0 if bits & 0x80 else 1.0
    exponent, mantissa = (bits >> 3) & 15, bits & 7
    if exponent == 15 and mantissa == 7:
        return math.copysign(math.nan, sign)
    return sign * (mantissa / 8 * 2.0 ** -6 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7))


_E4M3FN = np.array([_e4m3fn(b) for b in range(256)])


def _numbers(a):
    """The numbers of an array of a value map, as the C++ tool gives them in JSON: bools,
    int64 and uint64 exactly, every other dtype as doubles, a complex number as its two
    parts, bfloat16 and float8 by what their bit patterns stand for."""
    bits = ckpt_dtype_name(a.dtype)
    flat = a.reshape(-1)
    if bits == "bfloat16":
        flat = (flat.astype(np.uint32) << 16).view(np.float32)
    elif bits == "float8_e5m2":  # the upper byte of a float16
        flat = (flat.astype(np.uint16) << 8).view(np.float16)
    elif bits == "float8_e4m3fn":
        flat = _E4M3FN[flat]
    elif a.dtype.kind == "c":
        flat = flat.view(np.float64 if a.dtype.itemsize == 16 else np.float32)
    if flat.dtype.kind == "b":
        return [bool(x) for x in flat]
    if flat.dtype.kind in "iu" and flat.dtype.itemsize == 8:
        return [int(x) for x in flat]
    return [_json_double(float(x)) for x in flat]


def _json_item(v):
    """An item of a value map in JSON: a string, a number (a complex one as [re, im]), or a
    vector as the list of its numbers."""
    if isinstance(v, str):
        return v
    a = np.asarray(v)
    numbers = _numbers(a)
    return numbers if a.ndim == 1 or len(numbers) != 1 else numbers[0]


def _verify(args):
    failed = 0
    for path in args.files:
        try:
            verify(path, key=args.key_file, max_decoded_bytes=args.max_decoded_bytes)
            print("ok       %s" % _text(path))
        except Error as e:
            failed += 1
            print("FAILED   %s: %s" % (_text(path), _text(str(e))))
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
    p.add_argument("--entry", metavar="NAME", help="show one entry, reading and verifying only its bytes (a file of "
                                                   "format version 3; others are verified whole)")
    p.set_defaults(run=_show)
    p = sub.add_parser("verify", help="check files' headers and checksums (and, with a key, decrypt them)")
    p.add_argument("files", nargs="+")
    p.set_defaults(run=_verify)
    for p in sub.choices.values():
        p.add_argument("--key-file", help="the key of encrypted checkpoints (32 bytes, or 64 hex digits)")
        p.add_argument("--max-decoded-bytes", type=_size, metavar="BYTES",
                       help="the most a compressed or encrypted body may decode to (default: the larger of 256 MiB "
                            "and 64 times the body as stored)")
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
