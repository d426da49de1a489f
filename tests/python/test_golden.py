"""The golden files of tests/golden/ (written once by the C++ library) read in Python: every
entry equal to the values they were written from, the header fields of docs/FORMAT.md section
10, and the decoded bodies of the version 2 files equal to the version 1 bodies."""
import os

import numpy as np
import pytest

import ckpt
from ckpt import codecs as C
import support
from support import GOLDEN_FILES, golden


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "read"])
@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_golden_file_reads_back_exactly(name, mmap):
    got = ckpt.load(golden(name), key=support.GOLDEN_KEY, mmap=mmap)
    support.assert_entries(got, support.golden_state())


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_golden_header(name):
    version, archive, codecs, epoch, step = GOLDEN_FILES[name]
    h = ckpt.header(golden(name))
    assert (h.version, h.archive, h.codecs, h.epoch, h.step) == (version, archive, codecs, epoch, step)
    assert h.body_length == os.path.getsize(golden(name)) - 64
    assert h.compressed == ("zstd" in codecs) and h.encrypted == ("aes-256-gcm" in codecs)
    assert h.raw == support.read(golden(name))[:64]
    # verify() needs no key (it stops at the body checksum); with the key it decrypts too
    assert ckpt.verify(golden(name)) == h
    assert ckpt.verify(golden(name), key=support.GOLDEN_KEY) == h


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_golden_contents(name):
    toc = ckpt.contents(golden(name), key=support.GOLDEN_KEY)
    kinds = {np.ndarray: "tensor", int: "int64", float: "double", bool: "bool", str: "string"}
    want = support.golden_state()
    assert [e.name for e in toc] == [n for n, _ in want]
    for e, (n, v) in zip(toc, want):
        assert e.kind == kinds[type(v)], n
        if isinstance(v, np.ndarray):
            assert (e.dtype, e.shape, e.nbytes, e.value) == (str(v.dtype), v.shape, v.nbytes, None), n
        else:
            assert support.same_value(e.value, v), n


def test_golden_key_forms():
    """The key as a key file (hex digits and a line feed), its 32 bytes, or a ckpt.Key; its id
    is the one README.md gives."""
    key = ckpt.Key.from_file(support.GOLDEN_KEY)
    assert key.id.hex() == support.GOLDEN_KEY_ID
    raw = bytes.fromhex(support.read(support.GOLDEN_KEY).decode().strip())
    assert ckpt.Key(raw).id == key.id
    assert support.GOLDEN_KEY_ID in repr(key) and raw.hex() not in repr(key)
    for k in (key, raw, support.GOLDEN_KEY):
        support.assert_entries(ckpt.load(golden("v2-zstd-aes-256-gcm.ckpt"), key=k), support.golden_state())


def test_binary_arrays_own_their_memory_or_map_the_file():
    mapped = ckpt.load(golden("v1-binary.ckpt"), mmap=True)
    assert not mapped["f32.rank2"].flags.writeable
    owned = ckpt.load(golden("v1-binary.ckpt"))  # the default: memory of its own
    owned["f32.rank2"][0, 0] = 7.0  # the file is not touched
    assert ckpt.load(golden("v1-binary.ckpt"))["f32.rank2"][0, 0] == -1.5


def test_payloads_are_64_byte_aligned_in_the_map():
    for name, a in ckpt.load(golden("v1-binary.ckpt"), mmap=True).items():
        if isinstance(a, np.ndarray) and a.nbytes:
            assert a.ctypes.data % 64 == 0, name


def _decoded(name):
    """The archive's bytes of a golden file, its codecs undone by ckpt.codecs."""
    raw = support.read(golden(name))
    h = ckpt.header(golden(name))
    body = np.frombuffer(raw, dtype=np.uint8)[64:]
    for codec in reversed(h.codecs):
        if codec == "aes-256-gcm":
            body = C.aes_decode(body, ckpt.Key.from_file(support.GOLDEN_KEY), raw[:56], name)
        else:
            body = C.zstd_decode(body, name)
    return bytes(body)


@pytest.mark.parametrize("v2,v1", [("v2-zstd.ckpt", "v1-binary.ckpt"), ("v2-aes-256-gcm.ckpt", "v1-text.ckpt"),
                                   ("v2-zstd-aes-256-gcm.ckpt", "v1-xml.ckpt")])
def test_version_2_bodies_decode_to_the_version_1_bodies(v2, v1):
    assert _decoded(v2) == support.read(golden(v1))[64:]


def test_worked_example_of_section_4(tmp_path):
    """FORMAT.md section 4's 200-byte file, written by ckpt.save: the same bytes but the save
    time and header check; and read back."""
    want = bytes.fromhex(
        "89434b50540d0a1a0100000000000000 8800000000000000 46ba689df2f68392"
        "0100000000000000 0a00000000000000 63d6478d630beb18 81678350c134b2f5"
        "0300000000000000 0100000000000000 77 00000000 00000000 01000000 0200000000000000"
        "0800000000000000 0200000000000000 6c72 02000000 000000000000e03f"
        "0300000000000000 746167 04000000 0200000000000000 6f6b 20000000" + "00" * 32 + "0000c03f000000c0")
    path = str(tmp_path / "w.ckpt")
    ckpt.save(path, {"w": np.array([1.5, -2.0], dtype=np.float32), "lr": 0.5, "tag": "ok"}, epoch=1, step=10,
              chunk_bytes=0)
    got = support.read(path)
    assert len(got) == 200 and got[:48] == want[:48] and got[64:] == want[64:]
    support.assert_entries(ckpt.load(support.write(tmp_path / "doc.ckpt", want)),
                           [("w", np.array([1.5, -2.0], dtype="<f4")), ("lr", 0.5), ("tag", "ok")])


def test_empty_dictionary(tmp_path):
    for archive, body in (("binary", bytes(8)), ("text", b"22 serialization::archive 18 0\n")):
        path = str(tmp_path / (archive + ".ckpt"))
        ckpt.save(path, {}, archive=archive, chunk_bytes=0)
        assert support.read(path)[64:] == body
        assert ckpt.load(path) == {}


# --------------------------------------------------------------------------- storage order

@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "read"])
def test_column_major_golden_file_reads_as_fortran_arrays(mmap):
    """docs/FORMAT.md section 3.1: column-major tensors come back as Fortran-ordered arrays of
    their logical shapes, over the bytes of the file's map (nothing copied) or of the read body."""
    path = golden(support.COLUMN_MAJOR_GOLDEN)
    got = ckpt.load(path, mmap=mmap)
    support.assert_entries(got, support.golden_column_major_state())
    m = got["f64.column_major"]
    assert (m == got["f64.row_major"]).all() and m[1, 2] == 12.5
    assert m.flags.writeable == (not mmap)
    if mmap:
        # a view of the map: the stored row-major (3, 2) array, transposed
        assert m.base is not None and m.T.flags.c_contiguous and m.ctypes.data % 64 == 0
    h = ckpt.header(path)
    assert (h.version, h.archive, h.codecs, h.epoch, h.step) == support.COLUMN_MAJOR_HEADER


def test_column_major_golden_contents():
    toc = ckpt.contents(golden(support.COLUMN_MAJOR_GOLDEN))
    assert [(e.name, e.shape, e.order) for e in toc if e.kind == "tensor"] == [
        ("f64.column_major", (2, 3), "column_major"), ("f64.row_major", (2, 3), "row_major"),
        ("f32.rank3", (2, 3, 4), "column_major"), ("i32.square", (3, 3), "column_major"),
        ("f32.empty", (0, 3), "column_major")]
    assert not any(e.name.startswith("__ckpt.order.") for e in toc)


def test_column_major_golden_loads_into_c_ordered_arrays():
    """Into arrays of either order: each element in its place, the square matrix not transposed."""
    for order in "CF":
        targets = {n: np.zeros(v.shape, v.dtype, order=order) for n, v in support.golden_column_major_state()
                   if isinstance(v, np.ndarray)}
        report = ckpt.load_into(golden(support.COLUMN_MAJOR_GOLDEN), targets)
        assert report.complete and not report.mismatched
        for n, v in support.golden_column_major_state():
            if isinstance(v, np.ndarray):
                assert (targets[n] == v).all(), (order, n)
        assert targets["i32.square"][0, 1] == -3

