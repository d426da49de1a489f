"""python3 -m ckpt ls|show|verify: exit codes, what they print, JSON that strict parsers read,
and the same entries as the C++ tool's `ckpt show --json`."""
import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np

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
    assert r.stdout.count("ok       ") == 6 and "6 verified, 0 failed" in r.stdout
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
