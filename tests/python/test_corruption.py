"""Damaged, altered and hostile files: each refused with the exception docs/FORMAT.md section 8
names, a message that names the file and prints safely, and never an array of wrong values.
Hostile tables of contents (checksums recomputed) are refused quickly, without allocating
what they claim."""
import base64
import json
import math
import os
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc

import numpy as np
import pytest
import xxhash
import zstandard

import ckpt
from ckpt.errors import printable as escaped
import support
from support import GOLDEN_FILES, GOLDEN_KEY, golden, i64, make_file, payload, reseal, string, tensor_toc, u32, u64

ENCRYPTED = [n for n in sorted(GOLDEN_FILES) if "aes" in n]


def refused(path, cls=ckpt.FormatError, match=None, **kwargs):
    """Loads `path`, expecting `cls`; checks that the error names the file and prints safely,
    and returns it."""
    kwargs.setdefault("key", GOLDEN_KEY)
    path = str(path)
    with pytest.raises(cls, match=match) as info:
        got = ckpt.load(path, **kwargs)
        pytest.fail("loaded %d entries from a damaged file" % len(got))
    e = info.value
    assert e.path == path and escaped(path) in str(e), str(e)
    assert support.printable(str(e)), repr(str(e))
    return e


def _flip_cases(name):
    size = os.path.getsize(golden(name))
    for at in range(64):
        yield at, at % 8
        yield at, (at + 3) % 8
    for at in range(64, size):
        yield at, at % 8


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_every_bit_flip_is_refused(tmp_path, name):
    """Two bits of every header byte and one of every body byte: never data, always the error
    of the first check that fails."""
    raw = support.read(golden(name))
    path = str(tmp_path / name)
    for at, bit in _flip_cases(name):
        damaged = bytearray(raw)
        damaged[at] ^= 1 << bit
        support.write(path, damaged)
        if at < 8:
            want, match = ckpt.FormatError, "is not a ckpt checkpoint"
        elif at < 12 and struct.unpack_from("<I", damaged, 8)[0] not in (1, 2, 3):
            want, match = ckpt.VersionError, "format version"
        elif at < 64:
            want, match = ckpt.ChecksumError, "corrupt header"
        else:
            want, match = ckpt.ChecksumError, "corrupt body"
        for mmap in (True, False) if name == "v1-binary.ckpt" else (False,):  # (mmap maps binary bodies only)
            e = refused(path, want, match=match, mmap=mmap)
            assert not isinstance(e, ckpt.AuthenticationError)
        with pytest.raises(want):
            ckpt.verify(path)


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_truncated_files_are_refused(tmp_path, name):
    raw = support.read(golden(name))
    path = str(tmp_path / name)
    for n in sorted(set(range(0, 80)) | set(range(80, len(raw), 37)) | {len(raw) - 1}):
        support.write(path, raw[:n])
        match = "not a ckpt checkpoint" if n < 8 else "truncated"
        for mmap in (True, False):
            refused(path, ckpt.FormatError, match=match, mmap=mmap)
        with pytest.raises(ckpt.FormatError, match=match):
            ckpt.header(path)


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_trailing_bytes_are_refused(tmp_path, name):
    raw = support.read(golden(name))
    for extra in (b"\0", b"\n", bytes(64), os.urandom(4096)):
        path = support.write(tmp_path / name, raw + extra)
        e = refused(path, ckpt.FormatError, match="%d trailing bytes" % len(extra))
        assert not isinstance(e, ckpt.ChecksumError)


def test_wrong_magic(tmp_path):
    raw = support.read(golden("v1-binary.ckpt"))
    for at in range(8):
        damaged = bytearray(raw)
        damaged[at] = ord("?")
        refused(support.write(tmp_path / "m.ckpt", damaged), match="is not a ckpt checkpoint")
    # a text-mode transfer: \r\n made \n
    refused(support.write(tmp_path / "m.ckpt", raw.replace(b"\r\n", b"\n", 1)), match="is not a ckpt checkpoint")
    refused(support.write(tmp_path / "m.ckpt", b"PK\x03\x04" + bytes(100)), match="is not a ckpt checkpoint")


@pytest.mark.parametrize("version", [0, 4, 255, 2**32 - 1])
def test_unknown_version_even_with_a_valid_header_check(tmp_path, version):
    raw = bytearray(support.read(golden("v1-binary.ckpt")))
    struct.pack_into("<I", raw, 8, version)
    path = support.write(tmp_path / "v.ckpt", reseal(raw))
    e = refused(path, ckpt.VersionError, match="format version %d" % version)
    assert isinstance(e, ckpt.FormatError)
    with pytest.raises(ckpt.VersionError):
        ckpt.verify(path)


@pytest.mark.parametrize("field,value,match", [
    (12, b"\x03", "unknown archive kind 3"),
    (13, b"\x03", "unknown codec 3"),
    (13, b"\x00\x01", "malformed codec list"),
    (13, b"\x02\x01", None),        # aes-256-gcm first, then zstd: a valid list, but the body is not that
])
def test_codec_lists(tmp_path, field, value, match):
    raw = bytearray(support.read(golden("v2-zstd.ckpt")))
    raw[field:field + len(value)] = value
    e = refused(support.write(tmp_path / "c.ckpt", reseal(raw)), ckpt.FormatError, match=match)
    assert not isinstance(e, ckpt.ChecksumError)


def test_version_1_with_codecs_is_malformed(tmp_path):
    raw = bytearray(support.read(golden("v2-zstd.ckpt")))
    struct.pack_into("<I", raw, 8, 1)
    refused(support.write(tmp_path / "c.ckpt", reseal(raw)), match="malformed codec list")


def test_version_2_without_codecs_reads_its_body_as_stored(tmp_path):
    """FORMAT.md section 2: ckpt's reader accepts a version 2 header whose codec bytes are 0."""
    raw = bytearray(support.read(golden("v1-xml.ckpt")))
    struct.pack_into("<I", raw, 8, 2)
    support.assert_entries(ckpt.load(support.write(tmp_path / "v2.ckpt", reseal(raw))), support.golden_state())


# --------------------------------------------------------------------------- encryption

@pytest.mark.parametrize("name", ENCRYPTED)
def test_altered_encrypted_body_fails_authentication(tmp_path, name):
    raw = support.read(golden(name))
    body = len(raw) - 128  # after the header and the prefix
    for at in [128, 128 + body // 2, len(raw) - 17, len(raw) - 16, len(raw) - 1,  # ciphertext, tag
               72, 80, 87]:                                                       # salt (in the prefix)
        damaged = bytearray(raw)
        damaged[at] ^= 0x01
        path = support.write(tmp_path / name, reseal(damaged))
        ckpt.verify(path)  # the checksums match: only the key can tell
        e = refused(path, ckpt.AuthenticationError, match="fails authentication in segment 1 of 1")
        assert isinstance(e, ckpt.ChecksumError)
        with pytest.raises(ckpt.AuthenticationError):
            ckpt.verify(path, key=GOLDEN_KEY)


@pytest.mark.parametrize("field,offset", [("epoch", 32), ("step", 40), ("save time", 48), ("archive", 12)])
def test_altered_header_fields_fail_authentication(tmp_path, field, offset):
    raw = bytearray(support.read(golden("v2-aes-256-gcm.ckpt")))
    raw[offset] ^= 0x02 if field != "archive" else 0x03  # text (1) -> xml (2)
    path = support.write(tmp_path / "h.ckpt", reseal(raw))
    refused(path, ckpt.AuthenticationError)


def test_cut_encrypted_body(tmp_path):
    """Shorter than a prefix and a tag; a last segment shorter than its tag."""
    raw = support.read(golden("v2-aes-256-gcm.ckpt"))
    refused(support.write(tmp_path / "a.ckpt", reseal(raw[:64 + 79])), match="fewer than its prefix and a tag")
    stored = len(raw) - 64 - 64
    damaged = bytearray(raw)
    struct.pack_into("<I", damaged, 64 + 24, stored - 5 - 16)  # two segments, the last of 5 bytes
    refused(support.write(tmp_path / "b.ckpt", reseal(damaged)), match="shorter than a tag")


@pytest.mark.parametrize("offset,value,match", [(88, 0, "segment size 0"), (88, 2**30 + 1, "segment size"),
                                                (92, 1, "reserved prefix bytes"), (124, 1 << 24, "reserved")])
def test_malformed_prefix(tmp_path, offset, value, match):
    raw = bytearray(support.read(golden("v2-aes-256-gcm.ckpt")))
    struct.pack_into("<I", raw, offset, value)
    e = refused(support.write(tmp_path / "p.ckpt", reseal(raw)), ckpt.FormatError, match=match)
    assert not isinstance(e, ckpt.ChecksumError)


@pytest.mark.parametrize("name", ENCRYPTED)
def test_wrong_key_names_both_key_ids(name, other_key_file):
    other = ckpt.Key.from_file(other_key_file)
    e = refused(golden(name), ckpt.KeyError, key=other_key_file)
    assert support.GOLDEN_KEY_ID in str(e) and other.id.hex() in str(e)
    assert not isinstance(e, ckpt.FormatError)
    assert other.raw().hex() not in str(e)
    with pytest.raises(ckpt.KeyError):
        ckpt.verify(golden(name), key=other)
    with pytest.raises(ckpt.KeyError):
        ckpt.contents(golden(name), key=other)


@pytest.mark.parametrize("name", ENCRYPTED)
def test_no_key_for_an_encrypted_file(name):
    e = refused(golden(name), ckpt.KeyError, key=None, match="encrypted")
    assert not isinstance(e, ckpt.FormatError)
    ckpt.verify(golden(name))  # the checksum needs no key


def test_damage_is_a_checksum_error_whatever_the_key(tmp_path, other_key_file):
    raw = bytearray(support.read(golden("v2-zstd-aes-256-gcm.ckpt")))
    raw[300] ^= 4
    path = support.write(tmp_path / "d.ckpt", raw)
    for key in (None, GOLDEN_KEY, other_key_file):
        e = refused(path, ckpt.ChecksumError, key=key, match="corrupt body")
        assert not isinstance(e, ckpt.AuthenticationError)


# --------------------------------------------------------------------------- zstd

def _zstd_file(stored, archive=0):
    return make_file(stored, version=2, archive=archive, codecs=(1, 0, 0))


def _golden_zstd_block():
    raw = support.read(golden("v2-zstd.ckpt"))
    plain, kept = struct.unpack_from("<II", raw, 64)
    return plain, raw[72:72 + kept]


def _malformed_zstd_cases():
    plain, frame = _golden_zstd_block()
    tiny = zstandard.ZstdCompressor(write_content_size=True).compress(b"x" * 100)
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 100)
    return {
        "input length 0": u32(0) + u32(0),
        "input length over 1 MiB": u32((1 << 20) + 1) + u32((1 << 20) + 1) + bytes(16),
        "stored length over input length": u32(plain) + u32(plain + 1) + frame + bytes(plain + 1 - len(frame)),
        "stored bytes missing": u32(plain) + u32(len(frame) + 1) + frame,
        "half a block header": u32(plain) + u32(len(frame)) + frame + u32(5),
        "frame declaring another size": u32(plain + 1) + u32(len(frame)) + frame,
        "frame without a content size": u32(100) + u32(len(no_size)) + no_size,
        "not a frame": u32(plain) + u32(40) + bytes(40),
        "frame cut short": u32(plain) + u32(len(frame) - 10) + frame[:-10],
        "bytes after the frame": u32(plain) + u32(len(frame) + 5) + frame + b"\x01\x02\x03\x04\x05",
        "a second frame": u32(plain) + u32(len(frame) + len(tiny)) + frame + tiny,
    }


@pytest.mark.parametrize("case", sorted(_malformed_zstd_cases()))
def test_malformed_zstd_bodies(tmp_path, case):
    path = support.write(tmp_path / "z.ckpt", _zstd_file(_malformed_zstd_cases()[case]))
    ckpt.verify(path)  # whole, and its checksums match
    e = refused(path, ckpt.FormatError, match="malformed zstd body")
    assert not isinstance(e, ckpt.ChecksumError)


def test_the_golden_zstd_block_rebuilt_reads():
    """The cases above start from a block that reads: only their damage is refused."""
    plain, frame = _golden_zstd_block()
    raw = support.read(golden("v2-zstd.ckpt"))
    assert _zstd_file(u32(plain) + u32(len(frame)) + frame)[64:] == raw[64:]


def _claims(blocks):
    """A zstd stored form of `blocks` blocks, each a small frame that stands for 1 MiB."""
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(1 << 20))
    assert len(frame) < 100
    return (u32(1 << 20) + u32(len(frame)) + frame) * blocks


def test_max_decoded_bytes_refuses_before_allocating(tmp_path):
    path = support.write(tmp_path / "bomb.ckpt", _zstd_file(_claims(512)))  # 512 MiB from 30 KB
    tracemalloc.start()
    try:
        refused(path, ckpt.FormatError, match=r"decodes to more than %d bytes \(max_decoded_bytes\)" % (8 << 20),
                max_decoded_bytes=8 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, "peak allocation %d bytes" % peak
    # under the limit, the body is decoded (and then is no binary body)
    path = support.write(tmp_path / "two.ckpt", _zstd_file(_claims(2)))
    e = refused(path, ckpt.FormatError, max_decoded_bytes=2 << 20)
    assert "decodes to more" not in str(e)


def test_max_decoded_bytes_at_the_exact_size():
    refused(golden("v2-zstd.ckpt"), match="decodes to more than 1279 bytes", max_decoded_bytes=1279)
    support.assert_entries(ckpt.load(golden("v2-zstd.ckpt"), max_decoded_bytes=1280), support.golden_state())
    support.assert_entries(ckpt.load(golden("v2-zstd-aes-256-gcm.ckpt"), key=GOLDEN_KEY, max_decoded_bytes=2155),
                           support.golden_state())
    # an encrypted body's plaintext (870 bytes of text body) is held to it too
    refused(golden("v2-aes-256-gcm.ckpt"), match="decodes to more than 869 bytes", max_decoded_bytes=869)
    support.assert_entries(ckpt.load(golden("v2-aes-256-gcm.ckpt"), key=GOLDEN_KEY, max_decoded_bytes=870),
                           support.golden_state())


def test_a_zstd_bomb_is_refused_by_default(tmp_path):
    """237 KB whose blocks claim 4 GiB: refused under the default budget (the larger of 256 MiB
    and 64 times the stored body) before anything of that size is allocated, by every reader
    that decodes bodies."""
    path = support.write(tmp_path / "bomb.ckpt", _zstd_file(_claims(4096)))
    assert os.path.getsize(path) < 240_000
    match = r"decodes to more than %d bytes \(the default max_decoded_bytes" % (256 << 20)
    for read in (lambda: ckpt.load(path), lambda: ckpt.contents(path), lambda: ckpt.verify(path, key=GOLDEN_KEY),
                 lambda: ckpt.load_into(path, {}, strict=False)):
        tracemalloc.start()
        started = time.monotonic()
        try:
            with pytest.raises(ckpt.FormatError, match=match) as info:
                read()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert time.monotonic() - started < 1.0
        assert peak < 4 << 20, "peak allocation %d bytes" % peak
        assert info.value.path == path and "%d stored bytes" % (os.path.getsize(path) - 64) in str(info.value)
    ckpt.verify(path)  # its checksum holds: only decoding it is refused
    # the figure is the caller's to set: a trusted file that decodes to more passes with a larger one
    two = support.write(tmp_path / "two.ckpt", _zstd_file(_claims(2)))
    refused(two, match=r"decodes to more than 1048576 bytes \(max_decoded_bytes\)", max_decoded_bytes=1 << 20)
    for limit in (None, 2 << 20, math.inf):
        e = refused(two, max_decoded_bytes=limit)  # decoded, and then not a binary body
        assert "decodes to more" not in str(e)


def test_the_default_budget_grows_with_the_stored_body():
    budget = ckpt.codecs.decoded_budget
    assert budget(None, 1000).limit == 256 << 20
    assert budget(None, 10 << 20).limit == 640 << 20
    assert budget(math.inf, 10).limit is None and budget(5, 10 << 20).limit == 5


@pytest.mark.parametrize("value", [-1, "1", 1.5, True, [1]])
def test_a_max_decoded_bytes_that_is_no_size_is_refused(value):
    for name in ("v1-binary.ckpt", "v2-zstd.ckpt"):  # used or not
        for read in (ckpt.load, ckpt.contents):
            with pytest.raises(ckpt.ConfigError, match="max_decoded_bytes is a number of bytes"):
                read(golden(name), max_decoded_bytes=value)
        with pytest.raises(ckpt.ConfigError, match="max_decoded_bytes"):
            ckpt.verify(golden(name), max_decoded_bytes=value)


def test_memory_that_cannot_be_had_is_a_ckpt_error(tmp_path):
    """With the address space limited (RLIMIT_AS) below what a file needs, NumPy's
    MemoryError never reaches the caller: a zstd claim allowed by the caller (math.inf) is
    ckpt.OutOfMemory saying so, and so is the body of a large file without codecs (as
    std::bad_alloc is in C++); both name the file, and are MemoryErrors too, not FormatErrors
    (the file may be whole: a lookup must not take it for damaged)."""
    bomb = support.write(tmp_path / "bomb.ckpt", _zstd_file(_claims(4096)))
    large = str(tmp_path / "large.ckpt")
    body = 3 << 30  # a sparse file: nothing written but the header
    with open(large, "wb") as f:
        head = support.MAGIC + struct.pack("<IB3BQQqqq", 1, 0, 0, 0, 0, body, 0, 0, 0, 0)
        f.write(head + u64(xxhash.xxh3_64_intdigest(head)))
        f.truncate(64 + body)
    script = textwrap.dedent("""
        import math, resource, sys
        import ckpt
        used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30),) * 2)
        for path, options in ((sys.argv[1], {"max_decoded_bytes": math.inf}), (sys.argv[2], {})):
            try:
                ckpt.load(path, **options)
            except ckpt.Error as e:
                print(type(e).__name__, e.path == path, isinstance(e, MemoryError), isinstance(e, ckpt.FormatError), e)
        """)
    env = dict(os.environ, PYTHONPATH=os.path.join(support.SOURCE, "python"), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", script, bomb, large], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    assert lines[0].startswith("OutOfMemory True True False checkpoint '%s' decodes to 4294967296 bytes (the sum of "
                               "its zstd blocks), more memory than this process could get" % bomb)
    assert lines[1] == "OutOfMemory True True False not enough memory to read checkpoint '%s' (%d bytes)" % (
        large, 64 + body)


# --------------------------------------------------------------------------- hostile tables of contents

def _binary(toc, payloads=b""):
    return make_file(toc + payloads)


def _ordered(record, match):
    """A body of a rank-2 tensor 'm', a rank-1 tensor 'v' and then `record`, an entry (the
    payloads follow)."""
    toc = u64(3) + tensor_toc("m", 5, [2, 2], 4) + tensor_toc("v", 5, [2], 2) + record
    body = toc + payload(len(toc), b"\1\2\3\4")
    return _binary(body + payload(len(body), b"\5\6")), match


HUGE = 1 << 40
XML_HEAD = (b'<?xml version="1.0" encoding="UTF-8" standalone="yes" ?>\n<!DOCTYPE boost_serialization>\n'
            b'<boost_serialization signature="serialization::archive" version="18">\n')
HOSTILE = {
    # binary bodies
    "entry count 2^60": (_binary(u64(1 << 60) + bytes(64)), "entry count"),
    "entry count 2^64-1": (_binary(u64(2**64 - 1)), "entry count"),
    "name length 2^63": (_binary(u64(1) + u64(1 << 63) + b"name"), "name"),
    "string value 2^62": (_binary(u64(1) + string("s") + u32(4) + u64(1 << 62) + b"abc"), "value of 's'"),
    "dims claiming terabytes": (_binary(u64(1) + tensor_toc("t", 0, [1 << 20, 1 << 20], 4 << 40) + u32(0) + bytes(8)),
                                "impossible shape"),
    "nbytes claiming terabytes": (_binary(u64(1) + tensor_toc("t", 0, [2], 4 << 40) + u32(36) + bytes(44)),
                                  "should hold 8 bytes"),
    "dims whose product overflows": (_binary(u64(1) + tensor_toc("t", 5, [1 << 62, 1 << 62, 4], 0)),
                                     "impossible shape"),
    "negative dim": (_binary(u64(1) + tensor_toc("t", 0, [-1, 2], 0)), "impossible shape"),
    "rank 65": (_binary(u64(1) + tensor_toc("t", 5, [1] * 65, 1) + u32(0) + b"\0"), "rank 65"),
    "rank 2^32-1": (_binary(u64(1) + string("t") + u32(0) + u32(0) + u32(2**32 - 1) + bytes(64)), "rank 4294967295"),
    "payloads beyond the body": (_binary(u64(2) + tensor_toc("a", 5, [HUGE], HUGE) + tensor_toc("b", 5, [HUGE], HUGE)),
                                 "impossible shape"),
    "payloads adding up beyond the body": (
        _binary(u64(2) + tensor_toc("a", 5, [60], 60) + tensor_toc("b", 5, [60], 60) + u32(0) + bytes(8)),
        "add up to more than"),
    "duplicate names": (_binary(u64(2) + string("a") + u32(1) + i64(1) + string("a") + u32(1) + i64(2)),
                        "entry 'a' appears twice"),
    "bool value 2": (_binary(u64(1) + string("b") + u32(3) + u32(2)), "bool value 2"),
    "kind 8": (_binary(u64(1) + string("k") + u32(8) + bytes(8)), "unknown value kind 8"),
    "dtype 17": (_binary(u64(1) + tensor_toc("t", 17, [1], 1) + u32(0) + b"\0"), "unknown dtype code 17"),
    "padding of 64": (_binary(u64(1) + tensor_toc("t", 5, [1], 1) + u32(64) + bytes(65)), "padding of 64 bytes"),
    "a payload cut short": (_binary(u64(1) + tensor_toc("t", 5, [100], 100) + u32(0) + bytes(60)), "tensor 't'"),
    "a byte after the last payload": (_binary(u64(1) + tensor_toc("t", 5, [1], 1), payload(8 + 45, b"\1") + b"\0"),
                                      "1 bytes follow the last payload"),
    # storage order records (FORMAT.md 3.1)
    "order record of another value": _ordered(string("__ckpt.order.m") + u32(4) + string("row_major"),
                                              "record '__ckpt.order.m' of tensor 'm' holds 'row_major'"),
    "order record not a string": _ordered(string("__ckpt.order.m") + u32(1) + i64(1),
                                          "record '__ckpt.order.m' of tensor 'm' holds no string"),
    "order record of no tensor": _ordered(string("__ckpt.order.q") + u32(4) + string("column_major"),
                                          r"record '__ckpt.order.q' names no tensor entry \('q'\)"),
    "order record of rank 1": _ordered(string("__ckpt.order.v") + u32(4) + string("column_major"),
                                       "marks tensor 'v' of rank 1 column-major"),
    # text bodies
    "text entry count 2^60": (make_file(b"22 serialization::archive 18 1152921504606846976\n", archive=1),
                              "entry count"),
    "text name length 2^62": (make_file(b"22 serialization::archive 18 1 4611686018427387904\n\nAAAA\n", archive=1),
                              "exceeds the body size"),
    "text signature length 2^40": (make_file(b"1099511627776 serialization::archive 18 0\n", archive=1),
                                   "starts with '22 serialization::archive '"),
    "text dims claiming terabytes": (
        make_file(b"22 serialization::archive 18 1 1\n\ndA==\n0 0 2 1048576 1048576 4398046511104\n", archive=1),
        "impossible shape"),
    "text negative count": (make_file(b"22 serialization::archive 18 -1\n", archive=1), "entry count"),
    "text number of 5000 digits": (make_file(b"22 serialization::archive 18 1 1\n\nYQ==\n1 " + b"7" * 5000 + b"\n",
                                             archive=1), "the value of 'a' at byte 41 of the body has 5000 digits"),
    # xml bodies
    "xml entry count 2^60": (make_file(XML_HEAD + b"<entries>1152921504606846976</entries>\n"
                                       b"</boost_serialization>\n\n", archive=2), "entry count"),
    "xml dims claiming terabytes": (make_file(
        XML_HEAD + b"<entries>1</entries>\n"
        b"<name>t</name>\n<kind>0</kind>\n<dtype>1</dtype>\n<rank>2</rank>\n<dim>1099511627776</dim>\n"
        b"<dim>1099511627776</dim>\n<nbytes>9671406556917033397649408</nbytes>\n</boost_serialization>\n\n",
        archive=2), "out of range|impossible shape"),
    "xml number of 5000 digits": (make_file(XML_HEAD + b"<entries>1</entries>\n<name>a</name>\n<kind>1</kind>\n<value>"
                                            + b"7" * 5000 + b"</value>\n</boost_serialization>\n\n", archive=2),
                                  "the value of 'a' has 5000 digits, out of range"),
    "xml element never closed": (make_file(XML_HEAD + b"<entries>1</entries>\n<name>" + b"x" * 1000, archive=2),
                                 "not closed"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_table_of_contents(tmp_path, case):
    data, match = HOSTILE[case]
    path = support.write(tmp_path / "h.ckpt", data)
    ckpt.verify(path)  # checksums match: the writer was hostile, not the disk
    for mmap in (True, False):
        tracemalloc.start()
        started = time.monotonic()
        try:
            e = refused(path, ckpt.FormatError, match=match, mmap=mmap)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert time.monotonic() - started < 2.0
        assert peak < 4 << 20, "peak allocation %d bytes" % peak
        assert not isinstance(e, ckpt.ChecksumError)
        assert "malformed" in str(e) or "version" in str(e)
    with pytest.raises(ckpt.FormatError):
        ckpt.contents(path)


def test_numbers_with_leading_zeros_read_as_the_cpp_library_reads_them(tool, tmp_path):
    """Text and xml numbers are read in time linear in their digits: leading zeros, which C++
    streams skip, whatever their number (Python's int() refuses more than 4300 digits)."""
    zeros = b"0" * 100_000
    text = make_file(b"22 serialization::archive 18 " + zeros + b"1 1\n\nYQ==\n1 -" + zeros + b"7\n", archive=1)
    xml = make_file(XML_HEAD + b"<entries>" + zeros + b"1</entries>\n<name>a</name>\n<kind>1</kind>\n<value>-" + zeros
                    + b"7</value>\n</boost_serialization>\n\n", archive=2)
    for name, data in (("t.ckpt", text), ("x.ckpt", xml)):
        path = support.write(tmp_path / name, data)
        started = time.monotonic()
        assert ckpt.load(path) == {"a": -7}
        assert time.monotonic() - started < 0.5
        assert json.loads(tool.run("show", "--json", path).stdout)["entries"] == [
            {"name": "a", "kind": "int64", "value": -7}]


def test_base64_with_white_space_between_every_character(tmp_path):
    """White space may stand between any two base64 characters; it is skipped at the speed of
    bytes methods, not a character at a time."""
    data = bytes(range(256)) * (16 << 10)  # 4 MiB: 11 MB of text
    toc = b"22 serialization::archive 18 1 1\n\nYQ==\n0 5 1 %d %d\n" % (len(data), len(data))
    b64 = np.frombuffer(base64.b64encode(data), dtype=np.uint8)
    spaced = np.stack([b64, np.full_like(b64, ord(" "))], axis=1).tobytes()
    path = support.write(tmp_path / "s.ckpt", make_file(toc + spaced, archive=1))
    started = time.monotonic()
    assert ckpt.load(path)["a"].tobytes() == data
    assert time.monotonic() - started < 0.4  # (a character at a time: 1.3 s)


def test_a_hostile_body_behind_zstd(tmp_path):
    """The same limits apply to a body that passed through codecs."""
    body = u64(1) + tensor_toc("t", 0, [1 << 20, 1 << 20], 4 << 40) + u32(0)
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(body)
    path = support.write(tmp_path / "z.ckpt", _zstd_file(u32(len(body)) + u32(len(frame)) + frame))
    refused(path, match="impossible shape")


def test_a_zero_dim_beside_huge_ones(tmp_path):
    """No elements, yet dims no array can have: refused as a FormatError, not NumPy's error."""
    body = u64(1) + tensor_toc("t", 0, [0, 1 << 62], 0) + payload(8 + 1 + 8 + 12 + 16 + 8, b"")
    path = support.write(tmp_path / "z.ckpt", make_file(body))
    assert ckpt.contents(path)[0].shape == (0, 1 << 62)
    for mmap in (True, False):
        refused(path, ckpt.FormatError, match="'t'", mmap=mmap)


def test_a_rank_numpy_cannot_hold(tmp_path):
    """Rank 40 is valid (at most 64) and the C++ library reads it; NumPy holds 32 dims."""
    body = u64(1) + tensor_toc("t", 0, [1] * 40, 4) + payload(8 + 1 + 8 + 12 + 40 * 8 + 8, b"\0\0\x80\x3f")
    path = support.write(tmp_path / "r.ckpt", make_file(body))
    assert ckpt.contents(path)[0].shape == (1,) * 40
    for mmap in (True, False):
        refused(path, ckpt.FormatError, match="tensor 't' of shape .* cannot be a NumPy array", mmap=mmap)
    with pytest.raises(ckpt.FormatError):
        ckpt.load_into(path, {}, strict=False)


def test_names_with_control_bytes_print_escaped(tmp_path):
    name = b"bad\x1b[2J\x07name\xff\xfe"
    body = u64(2) + string(name) + u32(1) + i64(1) + string(name) + u32(1) + i64(2)
    path = support.write(tmp_path / "n.ckpt", make_file(body))
    e = refused(path, match="appears twice")
    assert "bad\\x1b[2J\\x07name\\xff\\xfe" in str(e)


def test_a_file_name_with_control_bytes_prints_escaped(tmp_path):
    path = support.write(tmp_path / "evil\x1b]0;title\x07.ckpt", b"not a checkpoint at all")
    e = refused(path, match="not a ckpt checkpoint")
    assert "evil\\x1b]0;title\\x07.ckpt" in str(e)
    assert e.path == path  # the attribute keeps the name as it is


def test_missing_file_is_an_io_error(tmp_path):
    path = str(tmp_path / "nothing.ckpt")
    with pytest.raises(ckpt.IoError) as info:
        ckpt.load(path)
    assert path in str(info.value) and info.value.errno == 2 and isinstance(info.value, OSError)
    with pytest.raises(ckpt.IoError):
        ckpt.load(str(tmp_path))  # a directory
