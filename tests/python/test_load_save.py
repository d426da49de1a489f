"""load_into's checks and report, save's refusals, what a failed save leaves behind, and the
values beside tensors: bytes, lists of strings and objects (value maps among them)."""
import base64
import errno
import os
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ckpt
import support


def _state():
    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -2, 3], dtype=np.int64),
            "mask": np.array([True, False]), "lr": 0.5, "epoch_seen": 7, "name": "net", "flag": True}


def _targets(fill=-9):
    """Targets shaped like _state()'s tensors, filled with a value the file does not hold."""
    return {"w": np.full((2, 3), fill, dtype=np.float32), "b": np.full(3, fill, dtype=np.int64),
            "mask": np.ones(2, dtype=bool)}


def _untouched(targets, fill=-9):
    return all((a == fill).all() if a.dtype != bool else a.all() for a in targets.values())


@pytest.fixture
def saved(tmp_path):
    return ckpt.save(str(tmp_path / "s.ckpt"), _state())


@pytest.mark.parametrize("name", sorted(support.GOLDEN_FILES))
def test_load_into_every_golden_file(name):
    want = dict(support.golden_state())
    targets = {n: np.zeros_like(v) for n, v in want.items() if isinstance(v, np.ndarray)}
    report = ckpt.load_into(support.golden(name), targets, key=support.GOLDEN_KEY)
    assert report.complete and report.missing == report.unexpected == report.mismatched == []
    for n, a in targets.items():
        assert a.tobytes() == want[n].tobytes(), n
    assert list(report.rest) == [n for n, v in want.items() if not isinstance(v, np.ndarray)]
    for n, v in report.rest.items():
        assert support.same_value(v, want[n]), n


def test_load_into_fills_the_targets(saved):
    targets = _targets()
    report = ckpt.load_into(saved, targets)
    for n, a in targets.items():
        assert a.tobytes() == _state()[n].tobytes()
    assert report.rest == {"lr": 0.5, "epoch_seen": 7, "name": "net", "flag": True}


@pytest.mark.parametrize("change,what", [
    (("w", np.zeros((2, 3), dtype=np.float64)), "w: checkpoint float32[2, 3], target float64[2, 3]"),
    (("w", np.zeros((3, 2), dtype=np.float32)), "w: checkpoint float32[2, 3], target float32[3, 2]"),
    (("b", np.zeros(3, dtype=np.int32)), "b: checkpoint int64[3], target int32[3]"),
    (("mask", np.zeros(2, dtype=np.uint8)), "mask: checkpoint bool[2], target uint8[2]"),
    (("extra", np.zeros(1)), "not in the checkpoint: extra"),
])
def test_strict_load_into_writes_nothing_when_it_fails(saved, change, what):
    targets = _targets()
    name, target = change
    targets[name] = target
    before = target.copy()
    with pytest.raises(ckpt.LoadMismatch) as info:
        ckpt.load_into(saved, targets)
    assert what in str(info.value) and saved in str(info.value) and "nothing was written" in str(info.value)
    assert _untouched({n: a for n, a in targets.items() if n != name})
    assert target.tobytes() == before.tobytes()


def test_strict_load_into_refuses_a_tensor_without_target(saved):
    targets = _targets()
    del targets["b"]
    with pytest.raises(ckpt.LoadMismatch, match="without a target: b"):
        ckpt.load_into(saved, targets)
    assert _untouched(targets)


def test_non_strict_load_into_reports_and_loads_the_rest(saved):
    targets = _targets()
    del targets["b"]
    targets["w"] = np.zeros((3, 2), dtype=np.float32)
    targets["absent"] = np.zeros(4)
    report = ckpt.load_into(saved, targets, strict=False)
    assert report.mismatched == ["w: checkpoint float32[2, 3], target float32[3, 2]"]
    assert sorted(report.missing) == ["absent", "w"] and sorted(report.unexpected) == ["b", "w"]
    assert not report.complete
    assert (targets["w"] == 0).all() and (targets["absent"] == 0).all()
    assert targets["mask"].tobytes() == _state()["mask"].tobytes()
    assert report.rest["b"].tobytes() == _state()["b"].tobytes()
    assert report.rest["lr"] == 0.5 and report.rest["name"] == "net"


def test_load_into_targets_of_other_layouts(saved):
    """A big-endian target and a strided view: the values arrive, in the target's layout."""
    big = np.zeros((2, 3), dtype=">f4")
    backing = np.zeros(6, dtype=np.int64)
    view = backing[::2]
    ckpt.load_into(saved, {"w": big, "b": view, "mask": np.zeros(2, dtype=bool)})
    assert big.dtype == np.dtype(">f4") and (big == _state()["w"]).all()
    assert list(backing) == [1, 0, -2, 0, 3, 0]


def test_load_into_a_big_endian_target_after_others(tmp_path):
    """The target of another byte order comes after one that was written: all or nothing."""
    path = ckpt.save(str(tmp_path / "o.ckpt"), {"first": np.arange(3.0), "second": np.arange(4, dtype=np.int32)})
    first, second = np.zeros(3), np.zeros(4, dtype=">i4")
    ckpt.load_into(path, {"first": first, "second": second})
    assert list(first) == [0, 1, 2] and list(second) == [0, 1, 2, 3]


@pytest.mark.parametrize("target,match", [(np.zeros((2, 3), dtype=np.float32), "read-only"),
                                          ([0.0] * 6, "not a numpy array")])
def test_load_into_unusable_targets(saved, target, match):
    if isinstance(target, np.ndarray):
        target.flags.writeable = False
    targets = _targets()
    targets["w"] = target
    with pytest.raises(ckpt.ConfigError, match=match):
        ckpt.load_into(saved, targets)
    assert _untouched({n: a for n, a in targets.items() if n != "w"})


def test_load_into_encrypted(tmp_path, other_key_file):
    path = ckpt.save(str(tmp_path / "e.ckpt"), _state(), zstd=3, key=support.GOLDEN_KEY)
    with pytest.raises(ckpt.KeyError):
        ckpt.load_into(path, _targets())
    with pytest.raises(ckpt.KeyError):
        ckpt.load_into(path, _targets(), key=other_key_file)
    targets = _targets()
    ckpt.load_into(path, targets, key=support.GOLDEN_KEY)
    assert targets["w"].tobytes() == _state()["w"].tobytes()


# --------------------------------------------------------------------------- save

def _left_behind(directory):
    return sorted(os.listdir(directory))


BAD_ENTRIES = {
    "reserved name": ({"__ckpt.prefix": "exp"}, "reserved"),
    "reserved metric": ({"__ckpt.metric.loss": 0.5}, "reserved"),
    "longdouble": ({"t": np.zeros(2, dtype=np.longdouble)}, "dtype float128"),
    "clongdouble": ({"t": np.zeros(2, dtype=np.clongdouble)}, "dtype complex256"),
    "bit pattern of the wrong width": ({"t": np.zeros(2, dtype=np.dtype("<u4", metadata={"ckpt_dtype": "bfloat16"}))},
                                       "dtype bfloat16"),
    "bit pattern of no dtype": ({"t": np.zeros(2, dtype=np.dtype("<u2", metadata={"ckpt_dtype": "float4"}))},
                                "dtype float4"),
    "object": ({"t": np.array([1, "a"], dtype=object)}, "dtype object"),
    "str array": ({"t": np.array(["a", "b"])}, "dtype <U1"),
    "datetime": ({"t": np.zeros(2, dtype="datetime64[s]")}, "datetime64"),
    "numpy longdouble scalar": ({"t": np.longdouble(3)}, "dtype float128"),
    "None": ({"t": None}, "NoneType"),
    "list": ({"t": [1, 2]}, "list"),
    "set": ({"t": {"a", "b"}}, "set"),
    "int over int64": ({"t": 2**63}, "outside int64"),
    "int under int64": ({"t": -2**63 - 1}, "outside int64"),
    "name not str": ({1: 2}, "names are str"),
    "name bytes": ({b"x": 2}, "names are str"),
    "duplicate pairs": ([("a", 1), ("a", 2)], "appears twice"),
    "surrogate in a name": ({"x\ud800": 1}, r"entry name 'x\\ud800' holds '\\ud800' at character 1"),
    "surrogate in a string": ({"s": "v\udfff"}, r"the string of entry 's' holds '\\udfff'"),
}


@pytest.mark.parametrize("case", sorted(BAD_ENTRIES))
def test_save_refuses_what_a_checkpoint_cannot_hold(tmp_path, case):
    entries, match = BAD_ENTRIES[case]
    path = str(tmp_path / "r.ckpt")
    for archive in ("binary", "xml"):
        with pytest.raises(ckpt.ConfigError, match=match) as info:
            ckpt.save(path, entries, archive=archive)
        assert isinstance(info.value, ValueError)
        assert _left_behind(tmp_path) == []


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("archive", ["text", "xml"])
def test_non_finite_doubles_only_in_binary(tmp_path, archive, value):
    path = str(tmp_path / "n.ckpt")
    with pytest.raises(ckpt.ConfigError, match="entry 'loss' holds %r" % value):
        ckpt.save(path, {"w": np.zeros(2), "loss": value}, archive=archive, zstd=3)
    assert _left_behind(tmp_path) == []
    ckpt.save(path, {"loss": value}, archive="binary")
    assert support.same_value(ckpt.load(path)["loss"], value)
    # non-finite tensor elements are stored in every archive kind
    ckpt.save(path, {"w": np.array([value])}, archive=archive)
    assert ckpt.load(path)["w"].tobytes() == np.array([value]).tobytes()


@pytest.mark.parametrize("options,match", [
    ({"zstd": 0}, "zstd is a compression level"), ({"zstd": 23}, "zstd is a compression level"),
    ({"zstd": -200000}, "zstd is a compression level"), ({"zstd": 3.0}, "zstd is a compression level"),
    ({"zstd": "3"}, "zstd is a compression level"), ({"zstd": True}, "zstd is a compression level"),
    ({"archive": "json"}, "archive is one of"), ({"archive": "BINARY"}, "archive is one of"),
    ({"epoch": -1}, "epoch is a non-negative int"), ({"step": 2**63}, "step is a non-negative int"),
    ({"epoch": 1.0}, "epoch is a non-negative int"), ({"step": np.float64(3)}, "step is a non-negative int"),
    ({"step": True}, "step is a non-negative int"), ({"epoch": np.int64(-1)}, "epoch is a non-negative int"),
    ({"key": bytes(31)}, "a key holds 32 bytes, not 31"), ({"key": 12345}, "a key is 32 bytes"),
])
def test_save_refuses_bad_options(tmp_path, options, match):
    with pytest.raises(ckpt.ConfigError, match=match):
        ckpt.save(str(tmp_path / "o.ckpt"), _state(), **options)
    assert _left_behind(tmp_path) == []


def test_save_with_a_key_file_that_is_not_there(tmp_path):
    with pytest.raises(ckpt.IoError, match="cannot read key file"):
        ckpt.save(str(tmp_path / "o.ckpt"), _state(), key=str(tmp_path / "missing.key"))
    assert _left_behind(tmp_path) == []


def test_names_and_strings_loaded_from_bytes_that_are_not_utf8_save_again(tmp_path):
    """Bytes that are not UTF-8 load as surrogate escapes, and save as the same bytes."""
    entries = {"name\udcff": "value\udc80\udcfe", "plain": "ok"}
    path = ckpt.save(str(tmp_path / "b.ckpt"), entries, archive="xml")
    assert ckpt.load(path) == entries
    assert b"<name>name\xff</name>" in support.read(path)


def test_a_refused_save_leaves_the_old_file(tmp_path, saved):
    before = support.read(saved)
    for bad in ({"t": np.zeros(1, dtype=np.longdouble)}, {"loss": float("nan")}):
        with pytest.raises(ckpt.ConfigError):
            ckpt.save(saved, dict(_state(), **bad), archive="text")
    assert support.read(saved) == before and _left_behind(tmp_path) == ["s.ckpt"]


def test_overwrite_false_refuses_an_existing_file(tmp_path, saved):
    before = support.read(saved)
    with pytest.raises(ckpt.IoError, match="exists and overwrite=False") as info:
        ckpt.save(saved, {"other": 1}, overwrite=False)
    assert info.value.errno == errno.EEXIST and info.value.path == saved
    assert support.read(saved) == before and _left_behind(tmp_path) == ["s.ckpt"]
    fresh = ckpt.save(str(tmp_path / "fresh.ckpt"), {"other": 1}, overwrite=False)
    assert ckpt.load(fresh) == {"other": 1}
    assert _left_behind(tmp_path) == ["fresh.ckpt", "s.ckpt"]
    ckpt.save(saved, {"other": 2})  # overwrite=True, the default, replaces it
    assert ckpt.load(saved) == {"other": 2}


def test_a_save_that_fails_while_writing_leaves_the_old_file(tmp_path, saved):
    """The file size limit cuts the write short (EFBIG): an IoError, the old file as it was, no
    temporary left."""
    before = support.read(saved)
    script = textwrap.dedent("""
        import resource, signal, sys
        import numpy as np
        import ckpt
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
        try:
            ckpt.save(sys.argv[1], {"big": np.ones(1 << 16)})
        except ckpt.IoError as e:
            print("IoError", e.errno, e)
            sys.exit(0)
        sys.exit("the save did not fail")
        """)
    env = dict(os.environ, PYTHONPATH=os.path.join(support.SOURCE, "python"), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", script, saved], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("IoError %d" % errno.EFBIG) and saved in r.stdout
    assert support.read(saved) == before and _left_behind(tmp_path) == ["s.ckpt"]


def test_save_into_a_missing_directory(tmp_path):
    with pytest.raises(ckpt.IoError) as info:
        ckpt.save(str(tmp_path / "no" / "such" / "dir.ckpt"), _state())
    assert info.value.errno == errno.ENOENT


def test_save_takes_arrays_of_any_layout(tmp_path):
    fortran = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    big = np.arange(6, dtype=">i4").reshape(2, 3)
    strided = np.arange(20, dtype=np.float64)[::3]
    transposed_slice = np.arange(30, dtype=np.int64).reshape(5, 6)[::2].T  # neither C nor F order
    path = ckpt.save(str(tmp_path / "l.ckpt"), [("f", fortran), ("big", big), ("s", strided), ("t", transposed_slice),
                                                ("np_scalar", np.float32(2.5))])
    got = ckpt.load(path)
    assert list(got) == ["f", "big", "s", "t", "np_scalar"]  # the order given
    for name, want in (("f", fortran), ("big", big), ("s", strided), ("t", transposed_slice)):
        assert got[name].dtype == want.dtype.newbyteorder("<") and (got[name] == want).all()
        assert got[name].dtype.byteorder in "<=|"
    assert got["np_scalar"].shape == () and got["np_scalar"].dtype == np.float32  # a 0-d tensor
    # Fortran order is kept: column-major, its bytes as they lie (FORMAT.md 3.1); the others in C order
    assert support.fortran(got["f"]) and not support.fortran(got["t"]) and got["t"].flags.c_contiguous
    body = support.read(path)[64:]
    assert body.find(fortran.tobytes(order="F")) > 0 and body.find(np.ascontiguousarray(transposed_slice).tobytes()) > 0
    assert [(e.name, e.shape, e.order) for e in ckpt.contents(path) if e.kind == "tensor"][:2] == [
        ("f", (3, 4), "column_major"), ("big", (2, 3), "row_major")]


def test_a_fortran_array_is_saved_without_a_copy_and_its_record_is_reserved(tmp_path):
    """The writer hands the array's own memory on (its transpose is a C-ordered view of it), and
    no program entry may take a record's name."""
    fortran = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    items = ckpt._io._normalize({"m": fortran}, "x")
    assert [(n, k) for n, k, _ in items] == [("m", 0), ("__ckpt.order.m", 4)]
    assert np.shares_memory(items[0][2], fortran) and items[0][2].shape == (3, 2)
    with pytest.raises(ckpt.ConfigError, match="reserved"):
        ckpt.save(str(tmp_path / "r.ckpt"), {"m": fortran, "__ckpt.order.m": "column_major"})


def test_load_into_across_orders_and_a_transposed_target(tmp_path):
    m = np.asfortranarray(np.arange(9, dtype=np.float32).reshape(3, 3))
    path = ckpt.save(str(tmp_path / "m.ckpt"), {"m": m, "w": np.asfortranarray(np.ones((2, 3)))})
    target = {"m": np.zeros((3, 3), np.float32), "w": np.zeros((2, 3))}  # C order
    ckpt.load_into(path, target)
    assert (target["m"] == m).all() and target["m"][0, 1] == 1.0
    with pytest.raises(ckpt.LoadMismatch, match=r"w: checkpoint float64\[2, 3\] column-major, target float64\[3, 2\]"):
        ckpt.load_into(path, {"m": target["m"], "w": np.zeros((3, 2))})


def test_python_scalar_kinds_stay_apart(tmp_path):
    path = ckpt.save(tmp_path / "k.ckpt", {"t": True, "one": 1, "f": 1.0, "s": "1"})
    got = ckpt.load(path)
    assert [type(v) for v in got.values()] == [bool, int, float, str]
    assert [e.kind for e in ckpt.contents(path)] == ["bool", "int64", "double", "string"]


def test_arrays_loaded_by_mmap_survive_a_replacing_save(tmp_path):
    """Saves rename a new file over the old one: a map of the old file keeps its values."""
    path = ckpt.save(str(tmp_path / "m.ckpt"), {"w": np.arange(100.0)})
    old = ckpt.load(path, mmap=True)["w"]
    ckpt.save(path, {"w": np.zeros(100)})
    assert (old == np.arange(100.0)).all() and (ckpt.load(path)["w"] == 0).all()
    assert _left_behind(tmp_path) == ["m.ckpt"]


def test_the_obvious_misuses_get_an_error_that_says_what_to_do(tmp_path):
    # what ckpt.load(ckpt.latest(...)) meets in a directory without checkpoints
    with pytest.raises(ckpt.ConfigError, match="latest\\(\\) returns None"):
        ckpt.load(ckpt.latest(tmp_path, "exp"))
    with pytest.raises(ckpt.ConfigError, match="the directory comes first, then the prefix"):
        ckpt.latest(tmp_path, "runs/exp")


# --------------------------------------------------------------------------- loads under another's rewrite

HOLDS = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import ckpt
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    path, mode = sys.argv[1], sys.argv[2]
    state = ckpt.load(path) if mode == "default" else ckpt.load(path, mmap=True)
    print("loaded", flush=True)
    sys.stdin.readline()  # the file has been changed meanwhile
    w = state["w"]
    print("same" if (w == np.arange(w.size)).all() and state["n"] == 7 else "changed", flush=True)
    """)


def _cut(path):
    os.truncate(path, 100)


def _copied_over(path):
    """What `cp other path` does: the file opened with O_TRUNC and written again in place."""
    other = support.read(ckpt.save(path + ".other", {"w": np.zeros(1 << 16), "n": 8}))
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, other)
    finally:
        os.close(fd)


@pytest.mark.parametrize("change", [_cut, _copied_over], ids=["truncated", "cp over it"])
def test_what_load_returns_outlives_a_change_of_the_file(tmp_path, change):
    """By default the arrays are the process's own: a file cut short or rewritten in place
    afterwards changes nothing loaded, and kills nothing. A map (mmap=True) is the file, as the
    docstring warns: it dies with SIGBUS, or sees the new bytes."""
    env = dict(os.environ, PYTHONPATH=os.path.join(support.SOURCE, "python"), PYTHONDONTWRITEBYTECODE="1")
    outcomes = {}
    for mode in ("default", "mmap"):
        path = ckpt.save(str(tmp_path / ("%s.ckpt" % mode)), {"w": np.arange(float(1 << 16)), "n": 7})
        p = subprocess.Popen([sys.executable, "-c", HOLDS, path, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert p.stdout.readline() == "loaded\n"
            change(path)
            out, err = p.communicate("go\n", timeout=60)
        finally:
            p.kill()
            p.wait(30)
        outcomes[mode] = (p.returncode, out)
    assert outcomes["default"] == (0, "same\n"), outcomes
    assert outcomes["mmap"] == ((-7, "") if change is _cut else (0, "changed\n")), outcomes  # 7: SIGBUS


READS_WHILE_CHANGED = textwrap.dedent("""
    import os, resource, sys, time
    import numpy as np
    import ckpt
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    path = sys.argv[1]
    good = {7: np.arange(float(1 << 17)), 8: np.zeros(1 << 17)}
    counts = {"whole": 0, "refused": 0}
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        for read in (lambda: ckpt.load(path), lambda: ckpt.verify(path), lambda: ckpt.contents(path),
                     lambda: ckpt.latest(os.path.dirname(path), "cut"),
                     lambda: ckpt.load_into(path, {"w": np.empty(1 << 17)})):
            try:
                got = read()
            except (ckpt.FormatError, ckpt.UnreadableCheckpoints) as e:
                counts["refused"] += 1
                continue
            if isinstance(got, dict):  # a load: one of the two files, whole
                assert (got["w"] == good[got["n"]]).all(), "a load mixed two files"
            counts["whole"] += 1
    print(counts["whole"], counts["refused"], flush=True)
    """)


def test_reads_while_another_process_cuts_and_rewrites_the_file_never_kill_the_reader(tmp_path):
    """load, verify, contents, latest and load_into, each again and again while another process
    cuts the file short and rewrites it in place: each read gives a whole file or an error,
    never a signal (a map of the file would die with SIGBUS)."""
    path = str(tmp_path / "cut-1.ckpt")
    whole = {n: support.read(ckpt.save(path, {"w": v, "n": n}, step=1))
             for n, v in ((8, np.zeros(1 << 17)), (7, np.arange(float(1 << 17))))}
    env = dict(os.environ, PYTHONPATH=os.path.join(support.SOURCE, "python"), PYTHONDONTWRITEBYTECODE="1")
    with open(tmp_path / "stderr", "w") as err:  # (latest() warns of every damaged file it meets)
        p = subprocess.Popen([sys.executable, "-c", READS_WHILE_CHANGED, path, "1.0"], stdout=subprocess.PIPE,
                             stderr=err, text=True, env=env)
    try:
        rng = np.random.default_rng(1)
        deadline = time.monotonic() + 60
        while p.poll() is None and time.monotonic() < deadline:
            raw = whole[7 if rng.random() < 0.5 else 8]
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # as cp does
            try:
                os.write(fd, raw[:int(rng.integers(0, len(raw)))])
                os.ftruncate(fd, int(rng.integers(0, len(raw))))
                os.pwrite(fd, raw, 0)
            finally:
                os.close(fd)
            time.sleep(0.003)  # whole for a while, so that some reads find it whole
        out, _ = p.communicate(timeout=60)
    finally:
        p.kill()
        p.wait(30)
    assert p.returncode == 0, (p.returncode, support.read(tmp_path / "stderr")[-2000:])
    whole_reads, refused = map(int, out.split())
    assert whole_reads > 0 and whole_reads + refused >= 10, out


# --------------------------------------------------------------------------- keys

def _golden_hex():
    return support.read(support.GOLDEN_KEY).decode().strip()


def test_a_key_of_64_hex_digits_is_the_key_never_a_path(tmp_path, monkeypatch):
    golden_hex = _golden_hex()
    other_hex = bytes(range(32)).hex()
    # a file named as the key's digits, holding another key: not what is read
    monkeypatch.chdir(tmp_path)
    support.write(tmp_path / golden_hex, (other_hex + "\n").encode())
    path = support.golden("v2-zstd-aes-256-gcm.ckpt")
    support.assert_entries(ckpt.load(path, key=golden_hex), support.golden_state())
    assert ckpt.Key.from_hex(golden_hex.upper()).id.hex() == support.GOLDEN_KEY_ID
    saved = ckpt.save(str(tmp_path / "e.ckpt"), {"w": np.ones(3)}, key=other_hex)
    assert (ckpt.load(saved, key=bytes(range(32)))["w"] == 1).all()
    # a path-like of those digits is a key file's path
    assert ckpt.codecs.as_key(tmp_path / golden_hex).id == ckpt.Key(bytes(range(32))).id


def _messages(e):
    """Everything an exception and those chained to it say."""
    out = []
    while e is not None:
        out += [str(e), repr(e), str(getattr(e, "path", "")), str(e.args)]
        e = e.__cause__ or e.__context__
    return " | ".join(out)


def test_no_message_holds_a_key_given_in_hex(tmp_path):
    other_hex = bytes(range(32)).hex()
    path = support.golden("v2-aes-256-gcm.ckpt")
    with pytest.raises(ckpt.KeyError) as info:  # another key than the file's
        ckpt.load(path, key=other_hex)
    said = _messages(info.value)
    assert support.GOLDEN_KEY_ID in said and other_hex not in said
    assert ckpt.Key.from_hex(other_hex).id.hex() in said
    malformed = [other_hex[:-1], other_hex + "0", other_hex[:-1] + "g", " " + other_hex, other_hex + "\n",
                 other_hex[:40]]
    for bad in malformed:
        for attempt in (lambda: ckpt.load(path, key=bad), lambda: ckpt.save(str(tmp_path / "k.ckpt"), {}, key=bad),
                        lambda: ckpt.Key.from_file(bad), lambda: ckpt.Key.from_hex(bad)):
            with pytest.raises(ckpt.Error) as info:
                attempt()
            said = _messages(info.value)
            assert bad.strip() not in said and other_hex[:32] not in said, said
            assert "not printed" in said, said
    assert not os.path.exists(tmp_path / "k.ckpt")


def test_epoch_and_step_of_any_integer_type(tmp_path):
    for epoch, step in ((np.int64(2), np.int32(5)), (np.uint64(3), np.int16(7)), (np.int8(0), 2**63 - 1)):
        h = ckpt.header(ckpt.save(str(tmp_path / "i.ckpt"), {"w": np.zeros(1)}, epoch=epoch, step=step))
        assert (h.epoch, h.step) == (int(epoch), int(step)) and type(h.epoch) is int and type(h.step) is int


# --------------------------------------------------------------------------- bytes, lists of strings, objects

KEY = ckpt.Key(bytes(range(50, 82)))
CODEC_OPTIONS = {"none": {}, "zstd": {"zstd": 3}, "aes": {"key": KEY}, "zstd+aes": {"zstd": 3, "key": KEY}}


def _bfloat16(bits):
    a = np.zeros((), ckpt.bit_pattern_dtype("bfloat16"))
    a[()] = bits
    return a


def _values():
    """One entry of each new kind and form, with what ckpt.load gives back for it (and, for
    objects, the type contents() names)."""
    every_byte = bytes(range(256))
    return [
        ("bytes", b"\x00\x01raw\xff\n<&>", b"\x00\x01raw\xff\n<&>"),
        ("bytes.empty", b"", b""),
        ("bytes.every", every_byte * 3, every_byte * 3),       # base64 of several lines
        ("bytes.bytearray", bytearray(b"ba"), b"ba"),
        ("bytes.memoryview", memoryview(np.array([1.5], "<f8")), np.array([1.5], "<f8").tobytes()),
        ("strings", ["a", "", "Gr\u00fc\u00dfe \u65e5\u672c", "<a & 'b'>\t\"q\"", "line\nfeed", "x\udcff"],
         ["a", "", "Gr\u00fc\u00dfe \u65e5\u672c", "<a & 'b'>\t\"q\"", "line\nfeed", "x\udcff"]),
        ("strings.empty", [], []),
        ("strings.tuple", ("one", "two"), ["one", "two"]),
        ("strings.one_empty", [""], [""]),
        ("map.float64", {"lr": 0.5, "momentum": 0.9, "eps": 1e-300}, {"eps": np.float64(1e-300), "lr": np.float64(0.5),
                                                                       "momentum": np.float64(0.9)}),
        ("map.int64", {"b": 2**63 - 1, "a": -2**63}, {"a": np.int64(-2**63), "b": np.int64(2**63 - 1)}),
        ("map.bool", {"yes": True, "no": np.bool_(False)}, {"no": np.False_, "yes": np.True_}),
        ("map.string", {"name": "adam", "empty": "", "utf8": "\u2713 \u00e9"},
         {"empty": "", "name": "adam", "utf8": "\u2713 \u00e9"}),
        ("map.vector", {"v": np.arange(4, dtype=np.int32), "w": np.array([-1, 7], ">i4"), "none": np.zeros(0, "<i4")},
         {"none": np.zeros(0, "<i4"), "v": np.arange(4, dtype="<i4"), "w": np.array([-1, 7], "<i4")}),
        ("map.mixed", {"f32": np.float32(1.5), "u64": np.uint64(2**64 - 1), "c": np.complex128(1 - 2j),
                       "h": np.float16(-0.0), "bf": _bfloat16(0x3F80), "s": "x", "mask": np.array([True, False]),
                       "strided": np.arange(10.0)[::3], "n": 3, "x": 2.5, "t": True},
         {"bf": _bfloat16(0x3F80), "c": np.complex128(1 - 2j), "f32": np.float32(1.5), "h": np.float16(-0.0),
          "mask": np.array([True, False]), "n": np.int64(3), "s": "x", "strided": np.array([0.0, 3.0, 6.0, 9.0]),
          "t": np.True_, "u64": np.uint64(2**64 - 1), "x": np.float64(2.5)}),
        ("map.empty", {}, {}),
        ("map.keys", {"\udcff": 1, "\ue000": 2, "": 3, "\u00e9": 4, "Z": 5, "aa": 6, "a": 7},  # in byte order
         {"": np.int64(3), "Z": np.int64(5), "a": np.int64(7), "aa": np.int64(6), "\u00e9": np.int64(4),
          "\ue000": np.int64(2), "\udcff": np.int64(1)}),
        ("object.binary", ckpt.Object("Stats", "boost binary", every_byte), ckpt.Object("Stats", "boost binary",
                                                                                        every_byte)),
        ("object.text", ckpt.Object("Stats", "boost text", "22 serialization::archive 18 0 0 3\n"),
         ckpt.Object("Stats", "boost text", "22 serialization::archive 18 0 0 3\n")),
        ("object.stream", ckpt.Object("std::mt19937_64", "stream text", "5489 1 2 \udcfe"),
         ckpt.Object("std::mt19937_64", "stream text", "5489 1 2 \udcfe")),
        ("object.empty", ckpt.Object("<empty> & 'so'", "stream text", ""),
         ckpt.Object("<empty> & 'so'", "stream text", "")),
        ("object.map", ckpt.Object("map<string, int64>", "value map", support.u64(1) + support.string("k") + b"\1"
                                   + support.u32(4) + support.i64(-5)), {"k": np.int64(-5)}),
    ]


MAP_TYPES = {"map.float64": "map<string, float64>", "map.int64": "map<string, int64>", "map.bool": "map<string, bool>",
             "map.string": "map<string, string>", "map.vector": "map<string, vector<int32>>",
             "map.mixed": "map<string, any>", "map.empty": "map<string, any>", "map.keys": "map<string, int64>",
             "object.map": "map<string, int64>"}


def _same(got, want):
    """`got` is `want` exactly: of the same type, and for NumPy values of the same dtype (its
    bit-pattern meaning too) and bytes; dicts in the same order."""
    if isinstance(want, dict):
        return type(got) is dict and list(got) == list(want) and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return type(got) is list and len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, (np.ndarray, np.generic)):
        return (type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
                and ckpt._format.ckpt_dtype_name(got.dtype) == ckpt._format.ckpt_dtype_name(want.dtype)
                and got.tobytes() == want.tobytes())
    return type(got) is type(want) and got == want


@pytest.mark.parametrize("codec", sorted(CODEC_OPTIONS))
@pytest.mark.parametrize("archive", ["binary", "text", "xml"])
def test_bytes_strings_and_objects_round_trip(tmp_path, archive, codec):
    values = _values()
    entries = [(name, given) for name, given, _ in values] + [("w", np.arange(3.0)), ("n", 7)]
    path = ckpt.save(str(tmp_path / "k.ckpt"), entries, archive=archive, **CODEC_OPTIONS[codec])
    for mmap in (False, True):
        got = ckpt.load(path, key=KEY, mmap=mmap)
        assert list(got) == [name for name, _ in entries]
        for name, _, want in values:
            assert _same(got[name], want), "%s: got %r, expected %r" % (name, got[name], want)
    info = {e.name: e for e in ckpt.contents(path, key=KEY)}
    for name, _, want in values:
        e = info[name]
        kind = {"map": "object"}.get(name.split(".")[0], name.split(".")[0])
        assert e.kind == kind and _same(e.value, want), name
        if kind == "bytes":
            assert e.nbytes == len(want)
        if kind == "object":
            assert e.type == MAP_TYPES.get(name, getattr(want, "type", None)), (name, e.type)
            assert e.encoding == ("value map" if isinstance(want, dict) else want.encoding)
    # what was loaded saves as the same bytes: maps keep their dtypes, objects their encodings
    again = ckpt.save(str(tmp_path / "again.ckpt"), ckpt.load(path, key=KEY), archive=archive)
    plain = ckpt.save(str(tmp_path / "plain.ckpt"), entries, archive=archive)
    assert support.read(again)[64:] == support.read(plain)[64:]


def test_the_bodies_of_bytes_strings_and_objects_in_each_archive_kind(tmp_path):
    """The fields of docs/FORMAT.md section 3 in each archive kind, byte for byte, built here
    from the document (a value map's bytes too)."""
    from support import string, u32, u64, i64
    value_map = (u64(3) + string("a") + b"\2" + u64(1) + b"x" + string("b") + b"\1" + u32(1) + struct.pack("<d", 2.5)
                 + string("v") + b"\3" + u32(3) + u64(2) + struct.pack("<2i", 1, -2))
    entries = [("b", b"\x00\xff"), ("s", ["x", ""]), ("o", ckpt.Object("T", "stream text", "1 2")),
               ("m", {"v": np.array([1, -2], np.int32), "b": 2.5, "a": "x"}), ("i", 5)]
    binary = (u64(5) + string("b") + u32(5) + u64(2) + b"\x00\xff" + string("s") + u32(6) + u64(2) + string("x")
              + string("") + string("o") + u32(7) + string("T") + u32(3) + u64(3) + b"1 2" + string("m") + u32(7)
              + string("map<string, any>") + u32(2) + u64(len(value_map)) + value_map + string("i") + u32(1) + i64(5))
    b64 = base64.b64encode(value_map)
    b64 = b"\n".join(b64[i:i + 76] for i in range(0, len(b64), 76))
    text = (b"22 serialization::archive 18 5 1\n\nYg==\n5 2\n\nAP8=\n1\n\ncw==\n6 2 1\n\neA==\n0\n\n1\n\nbw==\n"
            b"7 1\n\nVA==\n3 3\n\nMSAy\n1\n\nbQ==\n7 16\n\nbWFwPHN0cmluZywgYW55Pg==\n2 %d\n\n%s\n1\n\naQ==\n1 5\n"
            % (len(value_map), b64))
    xml = (b'<?xml version="1.0" encoding="UTF-8" standalone="yes" ?>\n<!DOCTYPE boost_serialization>\n'
           b'<boost_serialization signature="serialization::archive" version="18">\n<entries>5</entries>\n'
           b"<name>b</name>\n<kind>5</kind>\n<size>2</size>\n<data>\nAP8=\n</data>\n"
           b"<name>s</name>\n<kind>6</kind>\n<count>2</count>\n<value>x</value>\n<value></value>\n"
           b"<name>o</name>\n<kind>7</kind>\n<type>T</type>\n<encoding>3</encoding>\n<size>3</size>\n"
           b"<data>\nMSAy\n</data>\n"
           b"<name>m</name>\n<kind>7</kind>\n<type>map&lt;string, any&gt;</type>\n<encoding>2</encoding>\n"
           b"<size>%d</size>\n<data>\n%s\n</data>\n<name>i</name>\n<kind>1</kind>\n<value>5</value>\n"
           b"</boost_serialization>\n\n" % (len(value_map), b64))
    for archive, body in (("binary", binary), ("text", text), ("xml", xml)):
        path = ckpt.save(str(tmp_path / ("%s.ckpt" % archive)), entries, archive=archive, chunk_bytes=0)
        assert support.read(path)[64:] == body, archive
        # and a file built from the document reads as what was saved
        built = support.write(tmp_path / ("built-%s.ckpt" % archive),
                              support.make_file(body, archive=ARCHIVE_CODES[archive]))
        assert _same(ckpt.load(built), ckpt.load(path))


ARCHIVE_CODES = {"binary": 0, "text": 1, "xml": 2}


def test_empty_bytes_and_strings_in_text_and_xml(tmp_path):
    """Blocks of no bytes: a line feed alone in text, `<data>↵</data>` in xml."""
    entries = {"b": b"", "s": [], "e": [""], "o": ckpt.Object("T", "boost binary", b"")}
    text = support.read(ckpt.save(str(tmp_path / "t.ckpt"), entries, archive="text"))[64:]
    assert text == (b"22 serialization::archive 18 4 1\n\nYg==\n5 0\n\n1\n\ncw==\n6 0 1\n\nZQ==\n6 1 0\n\n1\n\nbw==\n"
                    b"7 1\n\nVA==\n0 0\n\n")
    xml = support.read(ckpt.save(str(tmp_path / "x.ckpt"), entries, archive="xml"))[64:]
    assert b"<kind>5</kind>\n<size>0</size>\n<data>\n</data>\n" in xml and b"<count>0</count>\n<name>e</name>" in xml
    assert b"<count>1</count>\n<value></value>\n" in xml
    for path in (tmp_path / "t.ckpt", tmp_path / "x.ckpt"):
        assert _same(ckpt.load(path), {"b": b"", "s": [], "e": [""], "o": entries["o"]})


def test_loaded_vectors_and_lists_are_the_callers_own(tmp_path):
    path = ckpt.save(str(tmp_path / "v.ckpt"), {"m": {"v": np.arange(3.0)}, "s": ["a"]})
    first = ckpt.load(path)
    assert first["m"]["v"].flags.writeable
    first["m"]["v"][0] = 9
    first["s"].append("b")
    assert ckpt.load(path)["m"]["v"][0] == 0 and ckpt.load(path)["s"] == ["a"]
    assert ckpt.load(path, mmap=True)["m"]["v"].flags.writeable


def test_load_into_reports_the_new_kinds_among_the_rest(tmp_path):
    path = ckpt.save(str(tmp_path / "r.ckpt"), {"w": np.zeros(2), "b": b"x", "s": ["y"], "m": {"k": "v"}})
    report = ckpt.load_into(path, {"w": np.ones(2)})
    assert report.complete and report.rest == {"b": b"x", "s": ["y"], "m": {"k": "v"}}


def test_python_values_of_every_kind_stay_apart(tmp_path):
    """A str is a string, a list of str strings, bytes bytes, a dict an object; an array of
    strings or a list of numbers is still no value a checkpoint holds."""
    path = ckpt.save(tmp_path / "k.ckpt", {"s": "ab", "l": ["ab"], "b": b"ab", "m": {"ab": "ab"}, "one": 1})
    assert [e.kind for e in ckpt.contents(path)] == ["string", "strings", "bytes", "object", "int64"]
    assert [type(v) for v in ckpt.load(path).values()] == [str, list, bytes, dict, int]
    for refused in ([1, 2], ("a", 1), np.array(["a", "b"]), {"a", "b"}):
        with pytest.raises(ckpt.ConfigError, match="(entry|tensor) 'x'"):
            ckpt.save(tmp_path / "r.ckpt", {"x": refused})


BAD_VALUES = {
    "key int": ({"m": {1: 2.0}}, r"entry 'm' has the key 1, a int; the keys of a map are str"),
    "key bytes": ({"m": {b"k": 2.0}}, r"entry 'm' has the key b'k', a bytes"),
    "key without UTF-8": ({"m": {"k\ud800": 1}}, r"entry 'm' has the key 'k\\ud800'.*no UTF-8 bytes"),
    "keys of the same bytes": ({"m": {"\u00e9": 1, "\udcc3\udca9": 2}}, r"entry 'm' has the keys .* the same bytes"),
    "value None": ({"m": {"k": None}}, r"entry 'm' key 'k' holds a NoneType"),
    "value list": ({"m": {"k": [1.0]}}, r"entry 'm' key 'k' holds a list"),
    "value dict": ({"m": {"k": {"j": 1}}}, r"entry 'm' key 'k' holds a dict"),
    "value bytes": ({"m": {"k": b"x"}}, r"entry 'm' key 'k' holds a bytes"),
    "value complex": ({"m": {"k": 1j}}, r"entry 'm' key 'k' holds a complex"),
    "value rank 2": ({"m": {"k": np.zeros((2, 2))}}, r"entry 'm' key 'k' holds an array of rank 2"),
    "value object array": ({"m": {"k": np.array([1, "a"], dtype=object)}}, r"entry 'm' key 'k' holds dtype object"),
    "value longdouble": ({"m": {"k": np.longdouble(1)}}, r"entry 'm' key 'k' holds dtype float128"),
    "value datetime": ({"m": {"k": np.datetime64("2020-01-01")}}, r"entry 'm' key 'k' holds dtype datetime64"),
    "value over int64": ({"m": {"k": 2**63}}, r"entry 'm' key 'k' holds 9223372036854775808, outside int64"),
    "value string without UTF-8": ({"m": {"k": "v\udfff"}}, r"entry 'm' key 'k' holds a string with '\\udfff'"),
    "list item int": ({"l": ["a", 2]}, r"entry 'l' is a list whose item 1 is of type int"),
    "list item bytes": ({"l": [b"a"]}, r"entry 'l' is a list whose item 0 is of type bytes"),
    "list item without UTF-8": ({"l": ["a", "\ud800"]}, r"string 1 of entry 'l' holds '\\ud800'"),
    "object type without UTF-8": ({"o": ckpt.Object("T\ud800", "stream text", "")}, r"the type of object 'o'"),
    "object text without UTF-8": ({"o": ckpt.Object("T", "boost text", "\ud800")}, r"the data of object 'o'"),
    "object map of bad bytes": ({"o": ckpt.Object("map<string, any>", "value map", support.u64(1))},
                                r"object 'o' is a value map that a reader refuses: it claims 1 items in 0 bytes"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_save_refuses_maps_lists_and_objects_a_checkpoint_cannot_hold(tmp_path, case):
    entries, match = BAD_VALUES[case]
    for archive in ("binary", "text", "xml"):
        with pytest.raises(ckpt.ConfigError, match=match):
            ckpt.save(str(tmp_path / "r.ckpt"), dict(entries, w=np.zeros(2)), archive=archive)
        assert _left_behind(tmp_path) == []


@pytest.mark.parametrize("args,match", [
    (("T", "json", b""), "an Object's encoding is one of boost binary, boost text, value map, stream text, not 'json'"),
    (("T", 2, b""), "an Object's encoding is one of"),
    ((b"T", "boost binary", b""), "an Object's type is a str, not bytes"),
    (("T", "boost binary", "text"), "the data of an Object of encoding 'boost binary' is bytes, not str"),
    (("T", "value map", None), "the data of an Object of encoding 'value map' is bytes, not NoneType"),
    (("T", "stream text", b"1 2"), "the data of an Object of encoding 'stream text' is a str, not bytes"),
])
def test_an_object_is_made_of_what_it_can_hold(args, match):
    with pytest.raises(ckpt.ConfigError, match=match):
        ckpt.Object(*args)


def test_an_object_holds_bytes_of_its_own():
    raw = bytearray(b"ab")
    obj = ckpt.Object("T", "boost binary", raw)
    raw[0] = 0
    assert obj.data == b"ab" and type(obj.data) is bytes and hash(obj) == hash(ckpt.Object("T", "boost binary", b"ab"))
    with pytest.raises(AttributeError):
        obj.data = b"x"


def test_save_with_its_arguments_swapped_says_so(tmp_path):
    """The C++ save_checkpoint takes the state first; ckpt.save takes the path first. Swapped,
    they are a ConfigError saying which comes first, and nothing is written; a path of another
    type names the type."""
    target = tmp_path / "run-1.ckpt"
    with pytest.raises(ckpt.ConfigError, match=r"takes the path first, then the entries"):
        ckpt.save({"w": np.ones(2, np.float32)}, str(target))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ckpt.ConfigError, match=r"a checkpoint path is a str, bytes or os.PathLike, not int"):
        ckpt.load(3)
