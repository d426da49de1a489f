"""Python and the C++ library read each other's files: every kind the C++ tool writes (archive
kind x codecs) loads in Python equal to its source, every kind Python writes passes the C++
tool's verify and diff; and for the same entries Python writes the C++ library's bytes."""
import functools
import json
import math
import os
import struct

import numpy as np
import pytest

import ckpt
from ckpt import codecs as C
import support
from support import ARCHIVES, CODECS, DTYPES

EPOCH, STEP = 4, 321


def _values(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    d = np.dtype(dtype)
    if d.kind == "f":
        v = rng.standard_normal(n) * 100
    elif d.kind == "c":
        v = rng.standard_normal(n) * 100 + 1j * rng.standard_normal(n)
    elif d.kind == "b":
        v = rng.integers(0, 2, n)
    else:
        info = np.iinfo(d)
        v = rng.integers(info.min, info.max, n, dtype=d, endpoint=True)
    return v.astype(d).reshape(shape)


def interop_entries(non_finite_scalars=True):
    """Every dtype at ranks 0 to 3, empty tensors, NaN, infinities and -0.0 in every float dtype,
    names beyond ASCII, and scalars of every kind (non-finite doubles only where the archive can
    hold them)."""
    out = {}
    for i, dtype in enumerate(DTYPES):
        for rank, shape in enumerate([(), (5,), (2, 3), (2, 1, 3)]):
            out["%s.rank%d" % (np.dtype(dtype).name, rank)] = _values(dtype, shape, 10 * i + rank)
    out["empty.f32"] = np.zeros((2, 0), dtype="<f4")
    out["empty.i64"] = np.zeros((0,), dtype="<i8")
    for dtype in ("<f2", "<f4", "<f8"):
        out["special.%s" % np.dtype(dtype).name] = np.array([math.nan, math.inf, -math.inf, -0.0, 0.0, 1.0],
                                                           dtype=dtype)
    nan = np.array([0x7FF8000000000001, 0xFFF0000000000001, 1], dtype="<u8").view("<f8")  # payloads, a subnormal
    out["special.f64.bits"] = nan
    out["größe.gewicht"] = _values("<f4", (2, 2), 99)
    out["层.权重"] = _values("<i8", (3,), 98)
    # column-major (FORMAT.md 3.1): Fortran-ordered in the npz, column-major in both writers
    out["fortran.f32"] = np.asfortranarray(_values("<f4", (3, 4), 97))
    out["fortran.square.i64"] = np.asfortranarray(_values("<i8", (3, 3), 96))
    out["fortran.rank3.f16"] = np.asfortranarray(_values("<f2", (2, 3, 2), 95))
    out.update({"int.min": -2**63, "int.max": 2**63 - 1, "int.zero": 0, "double.neg_zero": -0.0,
                "double.tiny": 5e-324, "double.third": 1 / 3, "flag.on": True, "flag.off": False,
                "text": "ünïcode \"quoted\" <x> & 'y'\ttab", "text.empty": ""})
    if non_finite_scalars:
        out.update({"double.nan": math.nan, "double.inf": math.inf, "double.minus_inf": -math.inf})
    return out


def _codec_options(codec, key_file):
    return {"zstd": 3 if "zstd" in codec else None, "key_file": key_file if "aes" in codec else None}


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    return support.write_key(tmp_path_factory.mktemp("key") / "k.key", bytes(range(100, 132)))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("archive", ARCHIVES)
def test_cpp_written_files_read_in_python(tool, tmp_path, key_file, archive, codec):
    entries = interop_entries(non_finite_scalars=archive == "binary")
    support.write_npz(tmp_path / "in.npz", entries)
    out = tool.import_(tmp_path / "in.npz", tmp_path / "cpp.ckpt", archive=archive, epoch=EPOCH, step=STEP,
                       **_codec_options(codec, key_file))
    h = ckpt.header(out)
    assert (h.archive, h.epoch, h.step) == (archive, EPOCH, STEP)
    assert h.codecs == {"none": (), "zstd": ("zstd",), "aes": ("aes-256-gcm",),
                        "zstd+aes": ("zstd", "aes-256-gcm")}[codec]
    for mmap in (True, False):
        support.assert_entries(ckpt.load(out, key=key_file, mmap=mmap), entries)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("archive", ARCHIVES)
def test_python_written_files_pass_the_cpp_tool(tool, tmp_path, key_file, archive, codec):
    entries = interop_entries(non_finite_scalars=archive == "binary")
    # `ckpt diff` compares double scalars by value, and a NaN is not equal to itself; NaN
    # elements of tensors it compares bit for bit
    entries.pop("double.nan", None)
    support.write_npz(tmp_path / "in.npz", entries)
    opts = _codec_options(codec, key_file)
    path = str(tmp_path / "py.ckpt")
    ckpt.save(path, entries, epoch=EPOCH, step=STEP, archive=archive, zstd=opts["zstd"],
              key=opts["key_file"])
    tool.verify(path, key_file=key_file)
    tool.assert_bit_equal(path, tmp_path / "in.npz", key_file=key_file)
    # and against what the C++ library writes of the same entries (binary, compressed)
    other = tool.import_(tmp_path / "in.npz", tmp_path / "cpp.ckpt", zstd=1)
    tool.assert_bit_equal(path, other, key_file=key_file)


def test_bit_pattern_dtypes_cross_both_ways(tool, tmp_path):
    """bfloat16 and the float8 types, which NumPy has no dtype for: the C++ tool imports them
    from safetensors, Python reads their bit patterns under the dtype's name, writes them back,
    and the C++ tool finds its file and Python's bit-equal."""
    bits = {name: np.array(range(3, 256, 7), dtype=ckpt.bit_pattern_dtype(name)).reshape(-1, 1)
            for name in support.BIT_PATTERN_DTYPES}
    names = {"bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
    header, buffer = {}, b""
    for name, a in bits.items():
        header[name] = {"dtype": names[name], "shape": list(a.shape), "data_offsets": [len(buffer), len(buffer) + a.nbytes]}
        buffer += a.tobytes()
    text = json.dumps(header).encode()
    support.write(tmp_path / "in.safetensors", struct.pack("<Q", len(text)) + text + buffer)
    cpp = tool.import_(tmp_path / "in.safetensors", tmp_path / "cpp.ckpt")
    got = ckpt.load(cpp)
    assert [e.dtype for e in ckpt.contents(cpp)] == list(bits)
    for name, a in bits.items():
        assert ckpt.dtype_name(got[name].dtype) == name and got[name].tobytes() == a.tobytes(), name
    py = ckpt.save(str(tmp_path / "py.ckpt"), got)
    tool.assert_bit_equal(py, cpp)
    # a plain uint16 array is uint16, not bfloat16
    ckpt.save(tmp_path / "plain.ckpt", {"bfloat16": got["bfloat16"].view("<u2").astype("<u2")})
    assert [e.dtype for e in ckpt.contents(tmp_path / "plain.ckpt")] == ["uint16"]


def test_cpp_diff_sees_a_one_bit_difference(tool, tmp_path):
    """The comparisons above can fail: one bit of one element, or one scalar, is a difference."""
    entries = interop_entries(non_finite_scalars=False)
    support.write_npz(tmp_path / "in.npz", entries)
    tool.assert_bit_equal(ckpt.save(str(tmp_path / "same.ckpt"), entries), tmp_path / "in.npz")
    flipped = dict(entries, **{"float32.rank2": entries["float32.rank2"].copy()})
    flipped["float32.rank2"].view("<u4")[1, 2] ^= 1
    ckpt.save(tmp_path / "py.ckpt", flipped)
    assert tool.diff_counts(tmp_path / "py.ckpt", tmp_path / "in.npz")[4] == 1
    ckpt.save(tmp_path / "py.ckpt", dict(entries, **{"int.max": 2**63 - 2}))
    assert tool.diff_counts(tmp_path / "py.ckpt", tmp_path / "in.npz")[4] == 1


def test_cpp_verify_refuses_a_damaged_python_file(tool, tmp_path):
    path = ckpt.save(str(tmp_path / "py.ckpt"), interop_entries())
    raw = bytearray(support.read(path))
    raw[200] ^= 0x10
    support.write(path, raw)
    r = tool.run("verify", path, expect=1)
    assert "py.ckpt" in r.stdout + r.stderr


def test_key_file_of_raw_bytes(tool, tmp_path):
    """A key file of 32 raw bytes, the other form both read."""
    raw = bytes(range(7, 39))
    key_path = support.write(tmp_path / "raw.key", raw)
    entries = {"w": np.arange(6, dtype=np.float32)}
    ckpt.save(tmp_path / "py.ckpt", entries, key=key_path)
    tool.verify(tmp_path / "py.ckpt", key_file=key_path)
    support.write_npz(tmp_path / "in.npz", entries)
    tool.import_(tmp_path / "in.npz", tmp_path / "cpp.ckpt", key_file=key_path)
    support.assert_entries(ckpt.load(tmp_path / "cpp.ckpt", key=raw), entries)


def test_names_and_strings_that_are_not_utf8(tool, tmp_path):
    """Names and strings are bytes (FORMAT.md section 3): bytes that are not UTF-8 come back as
    the same bytes when a loaded dictionary is saved again, in every archive kind."""
    from support import i64, make_file, string, u32, u64
    body = u64(2) + string(b"bad\xff\xfename") + u32(4) + string(b"v\xc3") + string(b"ok") + u32(1) + i64(5)
    original = support.write(tmp_path / "raw.ckpt", make_file(body))
    loaded = ckpt.load(original)
    assert list(loaded) == ["bad\udcff\udcfename", "ok"]
    for archive in ARCHIVES:
        again = ckpt.save(str(tmp_path / ("again-%s.ckpt" % archive)), loaded, archive=archive, chunk_bytes=0)
        assert ckpt.load(again) == loaded
        tool.assert_bit_equal(original, again)
    assert support.read(tmp_path / "again-binary.ckpt")[64:] == body


# --------------------------------------------------------------------------- byte identity

@functools.lru_cache(maxsize=None)
def identity_entries():
    """Arrays over 1 MiB (a payload that starts a block; random bytes, which the zstd writer's
    probe leaves uncompressed; a ramp, which compresses), a string over 1 MiB, and small entries
    of every kind around them. Made once: the tests only read them."""
    rng = np.random.default_rng(7)
    out = {"small.f32": _values("<f4", (3, 4), 1), "random.u8": rng.integers(0, 256, (5 << 18) + 3, dtype=np.uint8),
           "step": 12345, "lr": 0.001, "nesterov": True, "note": "ünïcode",
           "ramp.f32": np.arange(300_001, dtype=np.float32), "empty": np.zeros((2, 0), dtype=np.int32),
           "long.text": "".join(chr(0x41 + i % 26) for i in range((1 << 20) + 77)),
           "rank0.f16": np.array(1.5, dtype=np.float16), "mask": rng.integers(0, 2, 1000).astype(bool),
           "i64.normal": rng.integers(-2**40, 2**40, 50_000),
           # column-major, one over 1 MiB (a payload that starts a block), a square one
           "fortran.f64": np.asfortranarray(rng.standard_normal((700, 200))),
           "fortran.square.u8": np.asfortranarray(rng.integers(0, 256, (9, 9), dtype=np.uint8)),
           "fortran.rank3.i32": np.asfortranarray(_values("<i4", (2, 3, 4), 8))}
    for dtype in DTYPES:
        out["every.%s" % np.dtype(dtype).name] = _values(dtype, (2, 3), 5)
    return out


@pytest.fixture(scope="module")
def identity_npz(tmp_path_factory):
    path = tmp_path_factory.mktemp("identity") / "in.npz"
    support.write_npz(path, identity_entries())
    return path


def _blocks(stored):
    """(input length, stored length) of each block of a zstd stored form."""
    out, at = [], 0
    while at < len(stored):
        plain, kept = struct.unpack_from("<II", stored, at)
        out.append((plain, kept))
        at += 8 + kept
    assert at == len(stored)
    return out


@pytest.mark.parametrize("zstd", [None, 1, 3, 12], ids=lambda z: "zstd%s" % z if z else "plain")
@pytest.mark.parametrize("archive", ARCHIVES)
def test_same_bytes_as_the_cpp_library(tool, tmp_path, identity_npz, archive, zstd):
    cpp = support.read(tool.import_(identity_npz, tmp_path / "cpp.ckpt", archive=archive, zstd=zstd, epoch=EPOCH,
                                    step=STEP))
    py = support.read(ckpt.save(str(tmp_path / "py.ckpt"), identity_entries(), epoch=EPOCH, step=STEP,
                                archive=archive, zstd=zstd))
    assert len(py) == len(cpp)
    assert py[:48] == cpp[:48], "headers differ"
    if py[64:] != cpp[64:]:
        at = next(i for i in range(64, len(py)) if py[i] != cpp[i])
        pytest.fail("bodies differ first at file offset %d of %d" % (at, len(py)))
    if zstd and archive == "binary":
        # the data exercise the writer's choices: a block ended early where the large payload
        # begins, blocks stored as they are (random bytes), and compressed ones
        blocks = _blocks(py[64:])
        assert any(plain < 1 << 20 for plain, _ in blocks[:-1])
        assert any(plain == kept for plain, kept in blocks) and any(kept < plain for plain, kept in blocks)


def test_the_probe_decides_as_in_the_cpp_library(tool, tmp_path):
    """Blocks whose first 16 KiB are random but for a run of zeros, the rest zeros: the probe
    (FORMAT.md 9.2: compress the block only if its first 16 KiB shrink below 16 057 bytes) lets
    some through and stores others as they are, on both sides of the threshold alike."""
    rng = np.random.default_rng(3)
    data = np.zeros((8, 1 << 20), dtype=np.uint8)
    for block, run in zip(data, (260, 300, 330, 345, 355, 370, 410, 450)):
        block[run:16 << 10] = rng.integers(0, 256, (16 << 10) - run, dtype=np.uint8)
    entries = {"blocks": data}
    support.write_npz(tmp_path / "p.npz", entries)
    cpp = support.read(tool.import_(tmp_path / "p.npz", tmp_path / "cpp.ckpt", zstd=1))
    py = support.read(ckpt.save(str(tmp_path / "py.ckpt"), entries, zstd=1))
    kinds = [kept < plain for plain, kept in _blocks(py[64:])]
    assert True in kinds[1:] and False in kinds[1:], kinds  # (block 0 is the table of contents)
    assert py[:48] == cpp[:48] and py[64:] == cpp[64:]


@pytest.mark.parametrize("archive,zstd", [("binary", 19), ("text", 19), ("xml", 7)])
def test_same_bytes_at_other_levels(tool, tmp_path, archive, zstd):
    entries = interop_entries(non_finite_scalars=archive == "binary")
    support.write_npz(tmp_path / "in.npz", entries)
    cpp = support.read(tool.import_(tmp_path / "in.npz", tmp_path / "cpp.ckpt", archive=archive, zstd=zstd))
    py = support.read(ckpt.save(str(tmp_path / "py.ckpt"), entries, archive=archive, zstd=zstd))
    assert py[:48] == cpp[:48] and py[64:] == cpp[64:]


@pytest.mark.parametrize("archive,zstd,large", [(a, z, False) for a in ARCHIVES for z in (None, 3)]
                         + [("binary", 3, True), ("text", None, True)])
def test_encrypted_files_hold_the_same_plaintext(tool, tmp_path, key_file, identity_npz, archive, zstd, large):
    """The small entries, and the large ones (bodies of several 1 MiB segments)."""
    key = ckpt.Key.from_file(key_file)
    entries = identity_entries() if large else interop_entries(non_finite_scalars=archive == "binary")
    npz = identity_npz if large else support.write_npz(tmp_path / "in.npz", entries)
    cpp_path = tool.import_(npz, tmp_path / "cpp.ckpt", archive=archive, zstd=zstd, key_file=key_file, epoch=EPOCH,
                            step=STEP)
    py_path = ckpt.save(str(tmp_path / "py.ckpt"), entries, epoch=EPOCH, step=STEP, archive=archive, zstd=zstd,
                        key=key)
    again = ckpt.save(str(tmp_path / "again.ckpt"), entries, epoch=EPOCH, step=STEP, archive=archive, zstd=zstd,
                      key=key)
    cpp, py = support.read(cpp_path), support.read(py_path)
    assert py[:16] == cpp[:16] and py[32:48] == cpp[32:48]   # all but lengths, checksums, save time
    prefixes = [f[64:128] for f in (cpp, py, support.read(again))]
    for p in prefixes:
        assert p[:8] == key.id and p[24:28] == struct.pack("<I", 1 << 20) and p[28:] == bytes(36)
    assert len({p[8:24] for p in prefixes}) == 3, "every file has a salt of its own"
    plain = [bytes(C.aes_decode(np.frombuffer(f, np.uint8)[64:], key, f[:56], "f")) for f in (cpp, py)]
    assert plain[0] == plain[1]
    # the plaintext is what the same save without encryption stores
    unencrypted = support.read(ckpt.save(str(tmp_path / "plain.ckpt"), entries, archive=archive, zstd=zstd,
                                         chunk_bytes=0))
    assert plain[1] == unencrypted[64:]
    assert len(py) == len(cpp)


def test_segments_of_a_large_encrypted_body(tmp_path, tool, key_file):
    """A body of several 1 MiB segments: the C++ tool authenticates Python's, and cutting the
    file at a segment boundary (checksums recomputed) fails authentication."""
    entries = {"big": np.arange(700_000, dtype=np.float32)}  # 2.8 MB: three segments
    path = ckpt.save(str(tmp_path / "py.ckpt"), entries, key=key_file)
    tool.verify(path, key_file=key_file)
    support.assert_entries(ckpt.load(path, key=key_file), entries)
    raw = support.read(path)
    cut = support.reseal(raw[:64 + 64 + 2 * ((1 << 20) + 16)])
    support.write(tmp_path / "cut.ckpt", cut)
    with pytest.raises(ckpt.AuthenticationError, match="segment 2 of 2"):  # not sealed as the last
        ckpt.load(tmp_path / "cut.ckpt", key=key_file)
    assert tool.run("verify", tmp_path / "cut.ckpt", "--key-file", key_file, expect=1)


def test_python_cli_matches_the_tool_on_golden_files(tool):
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.path.join(support.SOURCE, "python"))
    files = [support.golden(n) for n in sorted(support.GOLDEN_FILES)]
    r = subprocess.run([sys.executable, "-m", "ckpt", "verify", *files, "--key-file", support.GOLDEN_KEY],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "%d verified, 0 failed" % len(files) in r.stdout, r.stdout + r.stderr
    tool.verify(files[0])
