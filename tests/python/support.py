"""What the tests of the Python package share: the golden files and the values they were
written from, the C++ `ckpt` tool, npz files written as the tool imports them, and files
built byte by byte from docs/FORMAT.md (with struct and xxhash, nothing of the package), to
damage and reseal."""
import io
import math
import os
import re
import struct
import subprocess
import zipfile

import numpy as np
import xxhash

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(SOURCE, "tests", "golden")
GOLDEN_KEY = os.path.join(GOLDEN, "v2.key")
GOLDEN_KEY_ID = "35c37aad6d66b291"
MAGIC = b"\x89CKPT\r\n\x1a"

# docs/FORMAT.md section 10 and tests/golden/README.md: file -> (version, archive, codecs, epoch, step)
GOLDEN_FILES = {
    "v1-binary.ckpt": (1, "binary", (), 3, 1200),
    "v1-text.ckpt": (1, "text", (), 4, 1600),
    "v1-xml.ckpt": (1, "xml", (), 5, 2000),
    "v2-zstd.ckpt": (2, "binary", ("zstd",), 6, 2400),
    "v2-aes-256-gcm.ckpt": (2, "text", ("aes-256-gcm",), 7, 2800),
    "v2-zstd-aes-256-gcm.ckpt": (2, "xml", ("zstd", "aes-256-gcm"), 8, 3200),
    "v3-binary.ckpt": (3, "binary", (), 10, 4000),
}
GOLDEN_CHUNK_BYTES = 4096    # what v3-binary.ckpt checksums its payloads by (FORMAT.md section 13)

# docs/FORMAT.md section 3.1: the golden file of column-major tensors (golden_column_major_state)
COLUMN_MAJOR_GOLDEN = "v1-column-major.ckpt"
COLUMN_MAJOR_HEADER = (1, "binary", (), 9, 3600)

ARCHIVES = ("binary", "text", "xml")
CODECS = ("none", "zstd", "aes", "zstd+aes")
# the checkpoint dtypes NumPy has (bfloat16 and the float8 types travel as bit patterns:
# BIT_PATTERN_DTYPES)
DTYPES = ("<f4", "<f8", "<f2", "<i4", "<i8", "|u1", "|b1", "|i1", "<i2", "<u2", "<u4", "<u8", "<c8", "<c16")
BIT_PATTERN_DTYPES = {"bfloat16": "<u2", "float8_e4m3fn": "|u1", "float8_e5m2": "|u1"}


def golden(name):
    return os.path.join(GOLDEN, name)


def golden_state():
    """tests/golden_state.hpp's golden_state(), in its order: (name, value) pairs."""
    f64 = np.array([1.0 / 3.0, -0.0, 1.0e300, -math.inf, 0.0], dtype="<f8")
    f64.view("<u8")[4] = 0x7FF8000000000001  # a NaN with a payload
    octets = [0, 1, 2, 127, 128, 200, 254, 255] + [(i * 37 + 11) & 0xFF for i in range(8, 96)]
    return [
        ("f32.rank2", np.array([-1.5, -0.25, 0.0, 0.5, 3.140625, 1.0e-3], dtype="<f4").reshape(2, 3)),
        ("int64", -9007199254740993),
        ("f64.rank1", f64),
        ("double", 0.1),
        ("f16.rank3", np.array([0x3C00, 0xC000, 0x7BFF, 0x0001], dtype="<u2").view("<f2").reshape(2, 1, 2)),
        ("bool.true", True),
        ("i32.rank1", np.array([-2**31, -1, 0, 1, 2**31 - 1], dtype="<i4")),
        ("string", "hello"),
        ("i64.rank2", np.array([-2**63, -2, 3, 2**63 - 1], dtype="<i8").reshape(2, 2)),
        ("string.empty", ""),
        ("u8.rank3", np.array(octets, dtype="u1").reshape(2, 3, 16)),
        ("string.utf8", "Gr\u00fc\u00dfe \u65e5\u672c \u2713 <a & b> \"q\" 'x'\ttab"),
        ("bool.rank1", np.array([True, False, False, True, True])),
        ("bool.false", False),
        ("f32.rank0", np.array(42.5, dtype="<f4")),
        ("f32.empty", np.zeros((0, 3), dtype="<f4")),
    ]


def golden_column_major_state():
    """tests/golden_state.hpp's golden_column_major_state(): (name, value) pairs, the
    column-major tensors as arrays in Fortran order."""
    m = np.array([[0.5, 1.5, 2.5], [10.5, 11.5, 12.5]], dtype="<f8")   # 10 i + j + 0.5
    i, j, k = np.indices((2, 3, 4))
    return [
        ("f64.column_major", np.asfortranarray(m)),
        ("f64.row_major", m),
        ("step", 3600),
        ("f32.rank3", np.asfortranarray((100 * i + 10 * j + k).astype("<f4"))),
        ("i32.square", np.asfortranarray((3 * np.indices((3, 3))[0] + np.indices((3, 3))[1] - 4).astype("<i4"))),
        ("f32.empty", np.zeros((0, 3), dtype="<f4")),
    ]


def fortran(a):
    """Whether `a` is a Fortran-ordered array that is not also in C order: what ckpt saves
    column-major, and what it loads a column-major tensor as."""
    return a.ndim >= 2 and a.flags.f_contiguous and not a.flags.c_contiguous


def same_value(got, want):
    """Whether `got` (what ckpt loaded) is `want` exactly: an array of the same dtype, shape,
    values (bit for bit) and memory order (Fortran or C), or a scalar of the same type and
    bits."""
    if isinstance(want, np.ndarray):
        return (isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
                and got.tobytes() == want.tobytes() and fortran(got) == fortran(want))
    if type(got) is not type(want):
        return False
    if isinstance(want, float):
        return struct.pack("<d", got) == struct.pack("<d", want)
    return got == want


def assert_entries(got, want):
    """`got` (a dict from ckpt.load) holds `want` (pairs or a dict) exactly, in its order."""
    want = list(want.items()) if isinstance(want, dict) else list(want)
    assert list(got) == [name for name, _ in want]
    for name, value in want:
        assert same_value(got[name], value), "%r: got %r, expected %r" % (name, got[name], value)


def write_npz(path, entries):
    """An npz file as the C++ tool imports it: arrays as 0-d or larger .npy members, Python
    int, float and bool as 0-d members marked "ckpt:scalar" (so that they come back as scalars),
    str as '<U' members."""
    with zipfile.ZipFile(path, "w") as z:
        for name, value in (entries.items() if isinstance(entries, dict) else entries):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            if isinstance(value, (bool, int, float)):
                info.comment = b"ckpt:scalar"
            z.writestr(info, buf.getvalue())
    return path


def write_key(path, raw):
    with open(path, "w") as f:
        f.write(bytes(raw).hex() + "\n")
    return path


# --------------------------------------------------------------------------- the C++ tool

_DIFF_SUMMARY = re.compile(r"(\d+) entries in A, (\d+) in B: (\d+) bit-equal, (\d+) within tolerance, (\d+) different")


class Tool:
    """The C++ `ckpt` command-line tool of the build."""

    def __init__(self, path):
        self.path = path

    def run(self, *args, expect=0):
        r = subprocess.run([self.path, *map(str, args)], capture_output=True, text=True, timeout=120)
        if expect is not None:
            assert r.returncode == expect, "ckpt %s: exit %d, expected %d\n%s%s" % (
                " ".join(map(str, args)), r.returncode, expect, r.stdout, r.stderr)
        return r

    def import_(self, src, out, archive="binary", zstd=None, key_file=None, epoch=0, step=0):
        args = ["import", src, out, "--archive", archive, "--epoch", epoch, "--step", step, "--force"]
        if zstd is not None:
            args += ["--zstd", zstd]
        if key_file is not None:
            args += ["--key-file", key_file]
        self.run(*args)
        return out

    def verify(self, path, key_file=None):
        self.run("verify", path, *(["--key-file", key_file] if key_file else []))

    def diff_counts(self, a, b, key_file=None):
        """(entries in A, in B, bit-equal, within tolerance, different) as `ckpt diff` counts them."""
        r = self.run("diff", a, b, *(["--key-file", key_file] if key_file else []), expect=None)
        m = _DIFF_SUMMARY.search(r.stdout)
        assert m, "ckpt diff %s %s printed no summary (exit %d)\n%s%s" % (a, b, r.returncode, r.stdout, r.stderr)
        counts = tuple(int(g) for g in m.groups())
        assert (r.returncode == 0) == (counts[4] == 0), r.stdout
        return counts

    def assert_bit_equal(self, a, b, key_file=None):
        n_a, n_b, bit_equal, close, different = self.diff_counts(a, b, key_file)
        assert n_a == n_b == bit_equal and close == different == 0, "ckpt diff %s %s: %d/%d entries, %d bit-equal" % (
            a, b, n_a, n_b, bit_equal)


# --------------------------------------------------------------------------- files byte by byte

def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def i64(v):
    return struct.pack("<q", v)


def string(raw):
    raw = raw.encode() if isinstance(raw, str) else raw
    return u64(len(raw)) + raw


def tensor_toc(name, dtype, dims, nbytes):
    """A binary table-of-contents entry of kind 0."""
    return string(name) + u32(0) + u32(dtype) + u32(len(dims)) + b"".join(i64(d) for d in dims) + u64(nbytes)


def payload(at, data):
    """A binary payload slot whose pad field starts at body offset `at`."""
    pad = (64 - (at + 4) % 64) % 64
    return u32(pad) + bytes(pad) + data


def make_file(body, version=1, archive=0, codecs=(0, 0, 0), epoch=0, step=0, save_time=0):
    """A whole file: section 2's header, its checksums computed, then `body`."""
    head = MAGIC + struct.pack("<IB3BQQqqq", version, archive, *codecs, len(body), xxhash.xxh3_64_intdigest(body),
                               epoch, step, save_time)
    return head + u64(xxhash.xxh3_64_intdigest(head)) + body


def zstd_bomb(blocks):
    """A binary checkpoint whose zstd body is `blocks` blocks, each a frame of 50 bytes that
    stands for 1 MiB of zeros (section 9.2): 58 bytes of file per MiB claimed."""
    import zstandard
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(1 << 20))
    return make_file((u32(1 << 20) + u32(len(frame)) + frame) * blocks, version=2, codecs=(1, 0, 0))


def reseal(raw):
    """`raw` with its body length, body checksum and header check recomputed."""
    raw = bytearray(raw)
    struct.pack_into("<QQ", raw, 16, len(raw) - 64, xxhash.xxh3_64_intdigest(bytes(raw[64:])))
    struct.pack_into("<Q", raw, 56, xxhash.xxh3_64_intdigest(bytes(raw[:56])))
    return bytes(raw)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data):
    """`data` as the whole of file `path`. Written over the old bytes and then cut to size, not
    truncated first: ext4 flushes a file truncated to nothing when it is closed, which would
    make the thousands of damaged files some tests write wait for the disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        view = memoryview(bytes(data))
        while view:
            view = view[os.write(fd, view):]
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    return str(path)


def printable(text):
    """No control character but line feed and tab."""
    return not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in text)
