"""python3 -m ckpt ls|show|verify: exit codes, what they print, JSON that strict parsers read,
and the same entries as the C++ tool's `ckpt show --json`."""
import contextlib
import io
import json
import math
import os
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest

import ckpt
from ckpt import __main__ as cli
import support


def run(*args, expect=0):
    """`python3 -m ckpt ARGS`, run in this process (its main(), what `-m` runs): exit status,
    stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    sigpipe = signal.getsignal(signal.SIGPIPE)  # main() sets it for a pipe into `head`
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli.main(list(map(str, args)))
    finally:
        signal.signal(signal.SIGPIPE, sigpipe)
    r = subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())
    assert r.returncode == expect, "python3 -m ckpt %s: exit %d\n%s%s" % (" ".join(map(str, args)), r.returncode,
                                                                       r.stdout, r.stderr)
    return r


def test_python_minus_m_ckpt():
    env = dict(os.environ, PYTHONPATH=os.path.join(support.SOURCE, "python"), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-m", "ckpt", "show", support.golden("v1-text.ckpt")], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0 and "archive:        text" in r.stdout and "string.utf8" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "ckpt", "verify"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "usage:" in r.stderr


def strict_json(text):
    """JSON as RFC 8259 has it: NaN and Infinity are not values."""
    def refuse(constant):
        raise ValueError("not JSON: %s" % constant)
    return json.loads(text, parse_constant=refuse)


def test_verify_exit_codes(tmp_path):
    files = [support.golden(n) for n in sorted(support.GOLDEN_FILES)]
    r = run("verify", *files)  # the checksums need no key
    assert r.stdout.count("ok       ") == len(files) and "%d verified, 0 failed" % len(files) in r.stdout
    run("verify", *files, "--key-file", support.GOLDEN_KEY)
    damaged = bytearray(support.read(files[0]))
    damaged[100] ^= 1
    bad = support.write(tmp_path / "bad.ckpt", damaged)
    r = run("verify", files[1], bad, expect=1)
    assert "FAILED   %s: " % bad in r.stdout and "corrupt body" in r.stdout and "1 verified, 1 failed" in r.stdout
    r = run("verify", support.golden("v2-aes-256-gcm.ckpt"), "--key-file", support.write_key(tmp_path / "o.key",
                                                                                               bytes(32)), expect=1)
    assert support.GOLDEN_KEY_ID in r.stdout


def test_show_json_of_every_golden_file():
    want = support.golden_state()
    kinds = {np.ndarray: "tensor", int: "int64", float: "float64", bool: "bool", str: "string"}
    for name, (version, archive, codecs, epoch, step) in support.GOLDEN_FILES.items():
        out = strict_json(run("show", "--json", support.golden(name), "--key-file", support.GOLDEN_KEY).stdout)
        h = out["header"]
        assert (h["format_version"], h["archive"], h["codecs"], h["epoch"], h["step"]) == (
            version, archive, "+".join(codecs) or "none", epoch, step)
        assert out["checksum_verified"] is True
        assert [(e["name"], e["kind"]) for e in out["entries"]] == [(n, kinds[type(v)]) for n, v in want]
        for e, (n, v) in zip(out["entries"], want):
            if isinstance(v, np.ndarray):
                assert (e["dtype"], e["shape"], e["bytes"]) == (str(v.dtype), list(v.shape), v.nbytes)
            else:
                assert e["value"] == v and type(e["value"]) is type(v), n


def test_show_json_has_the_cpp_tools_layout(tool):
    """The same document as `ckpt show --json` but for checksum_verified (the C++ tool checks
    the checksum only with --stats or a key; Python always does)."""
    for name in [*support.GOLDEN_FILES, support.COLUMN_MAJOR_GOLDEN]:
        args = ["show", "--json", support.golden(name)]
        py, cpp = strict_json(run(*args).stdout), strict_json(tool.run(*args).stdout)
        py.pop("checksum_verified"), cpp.pop("checksum_verified")
        assert py == cpp, name


@pytest.mark.parametrize("archive", ["binary", "text", "xml"])
def test_show_json_of_bytes_strings_and_objects_has_the_cpp_tools_layout(tool, tmp_path, archive):
    bits = ckpt.bit_pattern_dtype
    entries = {"raw": b"\x00\xff\x1b", "none": b"", "names": ["a", "", "b\n\x1b"], "empty": [],
               "opt": {"lr": 0.5, "betas": np.array([0.9, 0.999]), "name": "adam", "steps": 3, "nesterov": False,
                       "c": np.complex64(1 - 2j), "bf": np.array(0x3F80, bits("bfloat16")), "nan": -math.nan,
                       "e4m3": np.array([0x38, 0xFF], bits("float8_e4m3fn")), "u": np.uint64(2**64 - 1)},
               "stats": {"mean": 0.5}, "no_items": {},
               "rng": ckpt.Object("std::mt19937", "stream text", "5489 1 2\n"),
               "label": ckpt.Object("Label", "boost binary", b"\x16\x00"),
               "text": ckpt.Object("Label", "boost text", "22 serialization::archive 18 1 x\n")}
    path = ckpt.save(str(tmp_path / "k.ckpt"), entries, archive=archive, zstd=3)
    py, cpp = strict_json(run("show", "--json", path).stdout), strict_json(tool.run("show", "--json", path).stdout)
    py.pop("checksum_verified"), cpp.pop("checksum_verified")
    assert py == cpp


def test_show_gives_logical_shapes_and_orders():
    out = strict_json(run("show", "--json", support.golden(support.COLUMN_MAJOR_GOLDEN)).stdout)
    tensors = [(e["name"], e["shape"], e["order"]) for e in out["entries"] if e["kind"] == "tensor"]
    assert tensors[:2] == [("f64.column_major", [2, 3], "column_major"), ("f64.row_major", [2, 3], "row_major")]
    assert "f64.column_major                         float64[2, 3] column-major 48 bytes" in run(
        "show", support.golden(support.COLUMN_MAJOR_GOLDEN)).stdout


def test_show_json_is_json_with_non_finite_values(tool, tmp_path):
    """Double scalars NaN and infinite: JSON has no such numbers; printed as the C++ tool prints
    them."""
    path = ckpt.save(str(tmp_path / "n.ckpt"), {"nan": math.nan, "inf": math.inf, "minus_inf": -math.inf,
                                               "half": 0.5, "ctrl": "a\x01b"})
    py = strict_json(run("show", "--json", path).stdout)
    cpp = strict_json(tool.run("show", "--json", path).stdout)
    assert [e["value"] for e in py["entries"]] == [e["value"] for e in cpp["entries"]] == [
        "nan", "inf", "-inf", 0.5, "a\x01b"]


def test_show_of_an_encrypted_file_without_its_key():
    r = run("show", support.golden("v2-zstd-aes-256-gcm.ckpt"))
    assert "zstd, aes-256-gcm" in r.stdout and "encrypted: pass --key-file" in r.stdout
    assert "string.utf8" not in r.stdout
    r = run("show", support.golden("v2-zstd-aes-256-gcm.ckpt"), "--key-file", support.GOLDEN_KEY)
    assert "entries:        16" in r.stdout and "string.utf8" in r.stdout


def test_errors_name_the_file(tmp_path):
    missing = str(tmp_path / "missing.ckpt")
    r = run("show", missing, expect=1)
    assert r.stderr.startswith("ckpt: cannot open '%s'" % missing) and r.stdout == ""
    r = run("show", support.write(tmp_path / "x\x1b.ckpt", b"junk"), expect=1)
    assert "x\\x1b.ckpt" in r.stderr and "\x1b" not in r.stderr


def test_ls_marks_the_latest(tmp_path):
    d = str(tmp_path)
    for e, s in ((1, 10), (2, 20)):
        ckpt.save(os.path.join(d, "job-%d_%d.ckpt" % (e, s)), {"w": np.zeros(1)}, epoch=e, step=s)
    lines = run("ls", d).stdout.splitlines()
    assert lines[0].startswith("FILE") and len(lines) == 3
    assert lines[2].startswith("job-2_20.ckpt") and lines[2].endswith("ok  <- latest") and "latest" not in lines[1]
    os.mkdir(tmp_path / "empty")
    assert run("ls", str(tmp_path / "empty")).stdout == "no checkpoints in '%s'\n" % (tmp_path / "empty")
    r = run("ls", str(tmp_path / "absent"), expect=1)
    assert r.stderr == "ckpt: checkpoint directory '%s' does not exist\n" % (tmp_path / "absent") and r.stdout == ""


def test_ls_gives_the_header_position_of_step_named_files(tmp_path):
    """A name that holds the global step alone says nothing of the epoch: ls shows the
    header's epoch and step."""
    d = str(tmp_path)
    ckpt.save(os.path.join(d, "heat-300.ckpt"), {"w": np.zeros(1)}, epoch=2, step=50)
    ckpt.save(os.path.join(d, "heat-2_60.ckpt"), {"w": np.zeros(1)}, epoch=2, step=60)
    out = strict_json(run("ls", "--json", d).stdout)
    assert [(os.path.basename(c["path"]), c["epoch"], c["step"]) for c in out["checkpoints"]] == [
        ("heat-2_60.ckpt", 2, 60), ("heat-300.ckpt", 2, 50)]
    assert out["temporaries"] == []
    lines = run("ls", d).stdout.splitlines()
    assert [line.split()[:4] for line in lines[1:]] == [["heat-2_60.ckpt", "0", "2", "60"],
                                                        ["heat-300.ckpt", "0", "2", "50"]]


# --------------------------------------------------------------------------- hostile names and files

HOSTILE_NAMES = [b"esc\x1b[31mred", b"bel\x07", b"cr\rover", b"line\nfeed", b"not utf-8 \xff\xfe", b"c1 \xc2\x9b2J"]


def _hostile_file(path):
    """A checkpoint whose entry names, a string value and a metric name hold control bytes
    and bytes that are not UTF-8 (FORMAT.md section 3: names and strings are byte strings)."""
    body = support.u64(len(HOSTILE_NAMES) + 2)
    for i, name in enumerate(HOSTILE_NAMES):
        body += support.string(name) + support.u32(1) + support.i64(i)
    body += support.string(b"s") + support.u32(4) + support.string(b"v\x1b]0;title\x07\xff")
    body += support.string(b"__ckpt.metric.loss\x1b[2J") + support.u32(2) + struct.pack("<d", 0.5)
    return support.write(path, support.make_file(body, epoch=1, step=1))


def _no_raw_control(text):
    return support.printable(text.replace("\t", " ")) and "\x1b" not in text


def test_show_and_verify_print_names_paths_and_values_escaped(tmp_path):
    path = _hostile_file(tmp_path / "evil\x1b[2J\x07.ckpt")
    out = run("show", path).stdout
    assert _no_raw_control(out), repr(out)
    for shown in ("esc\\x1b[31mred", "bel\\x07", "cr\\x0dover", "line\\x0afeed", "not utf-8 \\xff\\xfe", "c1 \\xc2\\x9b2J",
                  "string 'v\\x1b]0;title\\x07\\xff'", "__ckpt.metric.loss\\x1b[2J", "evil\\x1b[2J\\x07.ckpt"):
        assert shown in out, shown
    out = run("verify", path).stdout
    assert _no_raw_control(out) and "ok       %s" % str(path).replace("\x1b", "\\x1b").replace("\x07", "\\x07") in out


def test_show_json_keeps_names_exact_and_bytes_that_are_not_utf8_replaced(tmp_path):
    """JSON holds Unicode, escaped by the parser: control characters come back exact; a byte
    that is not UTF-8 cannot, and becomes U+FFFD."""
    path = _hostile_file(tmp_path / "h.ckpt")
    out = strict_json(run("show", "--json", path).stdout)
    names = [e["name"] for e in out["entries"]]
    assert names[:len(HOSTILE_NAMES)] == [n.decode("utf-8", "replace") for n in HOSTILE_NAMES]
    assert names[1] == "bel\x07" and names[4] == "not utf-8 \ufffd\ufffd"
    assert out["entries"][len(HOSTILE_NAMES)]["value"] == "v\x1b]0;title\x07\ufffd"


def test_every_command_runs_where_stdout_takes_only_utf8(tmp_path):
    """Names and file names that are not UTF-8 never reach a strict UTF-8 stdout unescaped."""
    d = tmp_path / "d"
    os.mkdir(d)
    _hostile_file(d / "exp-1_1.ckpt")
    ckpt.save(str(d / "exp\udcff-1_2.ckpt"), {"w\udcfe": np.zeros(1)}, epoch=1, step=2, metrics={"m\udcfd": 1.0})
    env = dict(os.environ, PYTHONPATH=os.path.join(support.SOURCE, "python"), PYTHONDONTWRITEBYTECODE="1",
               PYTHONIOENCODING="utf-8:strict")
    for args in (["show", d / "exp-1_1.ckpt"], ["show", "--json", d / "exp-1_1.ckpt"], ["ls", d], ["ls", "--json", d],
                 ["verify", d / "exp-1_1.ckpt", "%s/exp\udcff-1_2.ckpt" % d], ["show", "%s/exp\udcff-1_2.ckpt" % d]):
        r = subprocess.run([sys.executable, "-m", "ckpt", *map(str, args)], capture_output=True, env=env, timeout=60)
        assert r.returncode == 0 and r.stderr == b"", (args, r.stderr)
        text = r.stdout.decode("utf-8")  # (strict: raises on bytes that are not UTF-8)
        assert _no_raw_control(text), (args, text)
        if "--json" not in args:
            assert "\\xff" in text or "\\x1b" in text, (args, text)


def test_ls_prints_file_names_prefixes_and_metrics_escaped(tmp_path):
    d = tmp_path / "runs"
    os.makedirs(d / "sub\x1b]0;x\x07")
    ckpt.save(str(d / "exp\x1b[2J-1_1.ckpt"), {"w": np.zeros(1)}, epoch=1, step=1, metrics={"loss\x07\n": 0.5})
    ckpt.save(str(d / "sub\x1b]0;x\x07" / "job\r-5.ckpt"), {"w": np.zeros(1)}, epoch=1, step=5)
    support.write(d / ".exp\x1b-1_2.ckpt.tmp-1-0", b"left")  # a temporary, listed too
    out = run("ls", str(d)).stdout
    assert _no_raw_control(out), repr(out)
    for shown in ("exp\\x1b[2J-1_1.ckpt", "loss\\x07\\x0a=0.5", "sub\\x1b]0;x\\x07/job\\x0d-5.ckpt",
                  ".exp\\x1b-1_2.ckpt.tmp-1-0"):
        assert shown in out, shown
    out = strict_json(run("ls", "--json", str(d)).stdout)
    assert {c["path"] for c in out["checkpoints"]} == {str(d / "exp\x1b[2J-1_1.ckpt"),
                                                        str(d / "sub\x1b]0;x\x07" / "job\r-5.ckpt")}
    assert [c["metrics"] for c in out["checkpoints"] if c["metrics"]] == [{"loss\x07\n": 0.5}]
    empty = tmp_path / "nothing\x1b[2J"
    os.mkdir(empty)
    out = run("ls", str(empty), "--prefix", "p\x07").stdout
    assert out == "no checkpoints in '%s' with prefix 'p\\x07'\n" % str(empty).replace("\x1b", "\\x1b")


def test_max_decoded_bytes_on_every_command_that_reads(tmp_path):
    """The default budget refuses a bomb by name and figure; --max-decoded-bytes sets another,
    in bytes or with K, M, G, T."""
    bomb = support.write(tmp_path / "bomb.ckpt", support.zstd_bomb(4096))  # 4 GiB from 237 KB
    r = run("show", bomb, expect=1)
    assert r.stderr.startswith("ckpt: checkpoint '%s' decodes to more than %d bytes (the default max_decoded_bytes"
                               % (bomb, 256 << 20)) and r.stdout == ""
    r = run("show", bomb, "--max-decoded-bytes", "1G", expect=1)
    assert "decodes to more than %d bytes (max_decoded_bytes)" % (1 << 30) in r.stderr
    zstd = support.golden("v2-zstd.ckpt")
    assert "decodes to more than 1279 bytes" in run("show", zstd, "--max-decoded-bytes", "1279", expect=1).stderr
    assert "entries:        16" in run("show", zstd, "--max-decoded-bytes", "1280").stdout
    aes = support.golden("v2-aes-256-gcm.ckpt")
    r = run("verify", aes, "--key-file", support.GOLDEN_KEY, "--max-decoded-bytes", "869", expect=1)
    assert "FAILED   %s: checkpoint '%s' decodes to more than 869 bytes" % (aes, aes) in r.stdout
    run("verify", aes, "--key-file", support.GOLDEN_KEY, "--max-decoded-bytes", "1K")
    d = tmp_path / "runs"
    os.mkdir(d)
    ckpt.save(str(d / "exp-1_1.ckpt"), {"w": np.zeros(1000)}, epoch=1, step=1, zstd=3)
    listed = strict_json(run("ls", "--json", str(d), "--max-decoded-bytes", "100").stdout)["checkpoints"]
    assert "decodes to more than 100 bytes" in listed[0]["problem"]
    assert strict_json(run("ls", "--json", str(d)).stdout)["checkpoints"][0]["valid"] is True
    with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit) as info:
        cli.main(["show", zstd, "--max-decoded-bytes", "lots"])
    assert info.value.code == 2 and "'lots' is not a number of bytes" in err.getvalue()


def test_show_gives_bytes_strings_and_objects_escaped(tmp_path):
    """Bytes by their size and first bytes, a list of strings as its strings, a value map by
    its type and number of items, another object by type, encoding, size and the start of its
    text: control bytes escaped, in text and in JSON."""
    path = ckpt.save(str(tmp_path / "k.ckpt"), {
        "raw": b"\x1b[2J\x00ok\xff" * 10, "none": b"", "names": ["a\x1b]0;t\x07", "b\nc", "\udcff"] + ["x"] * 20,
        "empty": [], "opt": {"lr": 0.5, "betas": np.array([0.9, 0.999])}, "one": {"k": "v"},
        "rng": ckpt.Object("std::mt19937_64", "stream text", "5489 \x1b[31m" * 20),
        "stats": ckpt.Object("Stats", "boost binary", b"\x16\x00\x1b")}, archive="text")
    out = run("show", path).stdout
    assert _no_raw_control(out), repr(out)
    lines = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines() if line.startswith("  ")}
    assert lines["raw"] == "bytes 80 bytes '%s'..." % ("\\x1b[2J\\x00ok\\xff" * 4)  # the first 32 bytes
    assert lines["none"] == "bytes 0 bytes ''"
    assert lines["names"].startswith("strings 23 ['a\\x1b]0;t\\x07', 'b\\x0ac', '\\xff', 'x', ")
    assert lines["names"].endswith(", ... 7 more]") and lines["empty"] == "strings 0 []"
    assert lines["opt"] == "object map<string, any>, 2 items" and lines["one"] == "object map<string, string>, 1 item"
    assert lines["rng"].startswith("object std::mt19937_64 (stream text, 200 bytes) '5489 \\x1b[31m5489 ")
    assert lines["rng"].endswith("...'") and lines["stats"] == "object Stats (boost binary, 3 bytes)"
    # JSON as the C++ tool's `show --json` gives them: whole, in "value"
    doc = strict_json(run("show", "--json", path).stdout)
    entries = {e["name"]: e for e in doc["entries"]}
    assert entries["raw"] == {"name": "raw", "kind": "bytes", "value": {"size": 80, "hex": "1b5b324a006f6bff" * 10}}
    assert entries["none"]["value"] == {"size": 0, "hex": ""}
    assert entries["names"]["kind"] == "strings"
    assert entries["names"]["value"] == ["a\x1b]0;t\x07", "b\nc", "\ufffd"] + ["x"] * 20
    assert entries["empty"]["value"] == []
    assert entries["opt"] == {"name": "opt", "kind": "object", "value": {
        "type": "map<string, any>", "encoding": "value map", "size": 8 + (8 + 5 + 1 + 4 + 8 + 16) + (8 + 2 + 1 + 4 + 8),
        "items": {"betas": [0.9, 0.999], "lr": 0.5}}}
    assert entries["rng"]["value"] == {"type": "std::mt19937_64", "encoding": "stream text", "size": 200,
                                       "text": "5489 \x1b[31m" * 20}
    assert entries["stats"]["value"] == {"type": "Stats", "encoding": "boost binary", "size": 3, "hex": "16001b"}


def test_show_json_gives_the_numbers_of_a_value_map(tmp_path):
    """Each dtype's numbers as the C++ tool gives them: int64 and uint64 exact, bools as bools,
    the rest as doubles (a complex number as its two parts, bfloat16 and float8 by what their
    bits stand for), NaN and infinities as text."""
    bits = ckpt.bit_pattern_dtype
    values = {"i64": np.int64(-2**63), "u64": np.uint64(2**64 - 1), "i8": np.int8(-3), "t": np.bool_(True),
              "f32": np.float32(0.1), "c": np.complex64(1 - 2j), "cv": np.array([1 + 2j, 3 - 4j]),
              "bf16": np.array([0x3F80, 0xC0A0], bits("bfloat16")),
              "e4m3": np.array([0x38, 0xB9, 0x01, 0x7F, 0xFF], bits("float8_e4m3fn")),
              "e5m2": np.array([0x3C, 0x7C, 0xFC, 0xFE], bits("float8_e5m2")),
              "one": np.array(0x3C, bits("float8_e5m2")),
              "nan": -math.nan, "inf": math.inf, "mask": np.array([True, False]), "none": np.zeros(0, np.int32)}
    path = ckpt.save(str(tmp_path / "m.ckpt"), {"m": values})
    items = strict_json(run("show", "--json", path).stdout)["entries"][0]["value"]["items"]
    assert items == {"bf16": [1.0, -5.0], "c": [1.0, -2.0], "cv": [1.0, 2.0, 3.0, -4.0],
                     "e4m3": [1.0, -1.125, 2.0 ** -9, "nan", "-nan"], "e5m2": [1.0, "inf", "-inf", "-nan"],
                     "f32": float(np.float32(0.1)), "i64": -2**63, "i8": -3.0, "inf": "inf", "mask": [True, False],
                     "nan": "-nan", "none": [], "one": 1.0, "t": True, "u64": 2**64 - 1}
    assert type(items["i64"]) is int and type(items["t"]) is bool
