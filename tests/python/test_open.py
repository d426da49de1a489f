"""ckpt.open(): one entry, or rows of an array, read and verified alone in a format version 3
file (docs/FORMAT.md section 13); older files verified whole; and the bytes of version 3 as
the C++ library writes them."""
import numpy as np
import pytest

import ckpt
import support
from support import golden

CHUNK = 4096


def _state():
    return {"w": np.arange(64 * 256, dtype=np.float32).reshape(64, 256), "b": np.array([0.5, -1.5, 2.5]),
            "m": np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)), "step": 1200, "name": "lenet"}


def _offset(path, name):
    """The file offset of a payload, from a body read as FORMAT.md section 13 says."""
    from ckpt import _format as F
    body = memoryview(support.read(path))[64:]
    return 64 + next(e.offset for e in F.parse_binary(body, path, True) if e.name == name)


def test_open_reads_entries_and_rows_checking_only_their_chunks(tmp_path):
    path = ckpt.save(str(tmp_path / "s.ckpt"), _state(), chunk_bytes=CHUNK)
    assert ckpt.header(path).version == 3
    want = _state()
    with ckpt.open(path) as r:
        assert [e.name for e in r.entries()] == list(want)
        assert r.bytes_read == 0
        assert (r.read_rows("w", 10, 12) == want["w"][10:12]).all()
        assert r.bytes_read == CHUNK                      # rows 8 to 11 are chunk 2
        assert (r.read_rows("w", 3, 10) == want["w"][3:10]).all()
        assert r.bytes_read == 4 * CHUNK
        assert r.read_rows("w", 7, 7).shape == (0, 256)
        assert (r.read("w") == want["w"]).all()
        m = r.read("m")
        assert (m == want["m"]).all() and m.flags.f_contiguous
        assert r.read("step") == 1200 and r.read("name") == "lenet"
        with pytest.raises(ckpt.LoadMismatch, match="has no entry 'nope'"):
            r.read("nope")
        with pytest.raises(ckpt.LoadMismatch, match="it has 64 rows"):
            r.read_rows("w", 60, 65)
        with pytest.raises(ckpt.LoadMismatch, match="column-major"):
            r.read_rows("m", 0, 1)


def test_a_damaged_chunk_fails_only_the_reads_that_touch_it(tmp_path):
    path = ckpt.save(str(tmp_path / "s.ckpt"), _state(), chunk_bytes=CHUNK)
    data = bytearray(support.read(path))
    data[_offset(path, "w") + 5 * CHUNK + 100] ^= 1     # chunk 5: rows 20 to 23
    support.write(path, bytes(data))
    want = _state()["w"]
    with ckpt.open(path) as r:
        assert (r.read_rows("w", 0, 20) == want[:20]).all()
        assert (r.read_rows("w", 24, 64) == want[24:]).all()
        with pytest.raises(ckpt.ChecksumError, match=r"chunk 6 of 16 of tensor 'w' \(bytes 20480 to 24576"):
            r.read_rows("w", 19, 21)
        with pytest.raises(ckpt.ChecksumError):
            r.read("w")


@pytest.mark.parametrize("at", [17, 61 + 3, 2], ids=["name length", "a chunk hash", "chunk_bytes"])
def test_a_damaged_table_of_contents_is_a_checksum_error(tmp_path, at):
    path = ckpt.save(str(tmp_path / "s.ckpt"), _state(), chunk_bytes=CHUNK)
    data = bytearray(support.read(path))
    data[64 + at] ^= 0x40
    support.write(path, bytes(data))
    with pytest.raises(ckpt.ChecksumError):
        ckpt.open(path)


def test_a_table_whose_check_fails_is_refused_even_with_the_body_resealed(tmp_path):
    path = ckpt.save(str(tmp_path / "s.ckpt"), _state(), chunk_bytes=CHUNK)
    data = bytearray(support.read(path))
    data[64 + 24] = ord("v")   # w's name
    support.write(path, support.reseal(bytes(data)))
    ckpt.verify(path)
    with pytest.raises(ckpt.ChecksumError, match="corrupt table of contents"):
        ckpt.open(path)


@pytest.mark.parametrize("options", [{"chunk_bytes": 0}, {"archive": "text"}, {"zstd": 3}], ids=["v1", "text", "zstd"])
def test_other_files_are_verified_whole_at_open(tmp_path, options):
    path = ckpt.save(str(tmp_path / "s.ckpt"), _state(), **options)
    assert ckpt.header(path).version in (1, 2)
    want = _state()
    with ckpt.open(path) as r:
        assert (r.read("w") == want["w"]).all() and (r.read_rows("w", 10, 12) == want["w"][10:12]).all()
        assert r.bytes_read == 0
    data = bytearray(support.read(path))
    data[-3] ^= 1
    support.write(path, bytes(data))
    with pytest.raises(ckpt.ChecksumError):
        ckpt.open(path)


@pytest.mark.parametrize("bad", [1000, 4097, 2048, 1 << 31, 4096.0])
def test_chunk_bytes_is_a_power_of_two_in_range(tmp_path, bad):
    with pytest.raises(ckpt.ConfigError, match="chunk_bytes is a power of two"):
        ckpt.save(str(tmp_path / "s.ckpt"), _state(), chunk_bytes=bad)


def test_save_writes_the_golden_version_3_body(tmp_path):
    """The C++ library wrote v3-binary.ckpt; the Python writer gives the same body."""
    version, archive, codecs, epoch, step = support.GOLDEN_FILES["v3-binary.ckpt"]
    want = support.read(golden("v3-binary.ckpt"))
    path = ckpt.save(str(tmp_path / "g.ckpt"), dict(support.golden_state()), epoch=epoch, step=step,
                     chunk_bytes=support.GOLDEN_CHUNK_BYTES)
    got = support.read(path)
    assert got[:48] == want[:48] and got[64:] == want[64:]
    with ckpt.open(golden("v3-binary.ckpt")) as r:
        for name, value in support.golden_state():
            got = r.read(name)
            assert support.same_value(got, value), name


def test_worked_example_of_section_13(tmp_path):
    """FORMAT.md section 13's 136-byte body, written by ckpt.save."""
    body = bytes.fromhex(
        "0010000000000000 0100000000000000 0100000000000000 78 00000000 00000000 01000000 0200000000000000"
        "0800000000000000 b7f434718fd7e84d 1d9005e6d6345877 37000000" + "00" * 55 + "0000803f00000040")
    path = ckpt.save(str(tmp_path / "x.ckpt"), {"x": np.array([1, 2], dtype=np.float32)}, chunk_bytes=4096)
    assert support.read(path)[64:] == body
    assert ckpt.header(path).version == 3
