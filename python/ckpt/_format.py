"""The bytes of a checkpoint file (docs/FORMAT.md): the header, and the body in each of the
three archive kinds, read and written. Nothing here touches a file."""

import base64
import binascii
import math
import re
import struct
from dataclasses import dataclass, field

import numpy as np
import xxhash

from .errors import ChecksumError, ConfigError, FormatError, VersionError
from . import codecs as _codecs

MAGIC = b"\x89CKPT\r\n\x1a"
HEADER_SIZE = 64
ALIGNMENT = 64
MAX_RANK = 64
BOOST_ARCHIVE_VERSION = 18   # what Boost 1.74's archives write, as the C++ library built on it does
RESERVED_PREFIX = "__ckpt."
METRIC_PREFIX = "__ckpt.metric."
ORDER_PREFIX = "__ckpt.order."    # section 3.1: "__ckpt.order.{name}" = "column_major" after a column-major tensor
COLUMN_MAJOR = "column_major"

ARCHIVES = ("binary", "text", "xml")
TENSOR, INT64, DOUBLE, BOOL, STRING = range(5)
# NumPy has no bfloat16 nor 8-bit floats: such tensors are returned as their bit patterns,
# uint16 and uint8 arrays whose dtype carries {"ckpt_dtype": name} as its metadata, so that
# ckpt.save writes them back as what they were (and ckpt.torch makes torch.bfloat16 of them).
def _bits(base, name):
    return np.dtype(base, metadata={"ckpt_dtype": name})


DTYPES = (np.dtype("<f4"), np.dtype("<f8"), np.dtype("<f2"), np.dtype("<i4"), np.dtype("<i8"), np.dtype("u1"),
          np.dtype("?"), np.dtype("i1"), np.dtype("<i2"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8"),
          _bits("<u2", "bfloat16"), _bits("u1", "float8_e4m3fn"), _bits("u1", "float8_e5m2"), np.dtype("<c8"),
          np.dtype("<c16"))
DTYPE_NAMES = ("float32", "float64", "float16", "int32", "int64", "uint8", "bool", "int8", "int16", "uint16", "uint32",
               "uint64", "bfloat16", "float8_e4m3fn", "float8_e5m2", "complex64", "complex128")
_BITS_CODES = {DTYPE_NAMES[i]: i for i, d in enumerate(DTYPES) if d.metadata}
_DTYPE_CODES = {(d.kind, d.itemsize): i for i, d in enumerate(DTYPES) if not d.metadata}


def ckpt_dtype_name(dtype):
    """What a bit-pattern dtype stands for ("bfloat16", ...), or None for a plain NumPy dtype."""
    meta = np.dtype(dtype).metadata
    return meta.get("ckpt_dtype") if meta else None


def xxh3(data):
    return xxhash.xxh3_64_intdigest(data)


def dtype_code(dtype, name, path=None):
    """The format's code of a numpy dtype (of either byte order), or a ConfigError naming the
    entry."""
    d = np.dtype(dtype)
    bits = ckpt_dtype_name(d)
    code = _BITS_CODES.get(bits) if bits is not None else _DTYPE_CODES.get((d.kind, d.itemsize))
    if code is not None and bits is not None and d.itemsize != DTYPES[code].itemsize:
        raise ConfigError("tensor '%s' has dtype %s in elements of %d bytes: its bit patterns take %d"
                          % (name, bits, d.itemsize, DTYPES[code].itemsize), path)
    if code is None:
        raise ConfigError("tensor '%s' has dtype %s, which a checkpoint cannot hold (it holds %s)"
                          % (name, bits or d, ", ".join(DTYPE_NAMES)), path)
    return code


def dtype_name(dtype):
    """The checkpoint dtype a numpy dtype is saved as: "float32", ..., and for a bit-pattern
    array ckpt.load returned, what it stands for ("bfloat16", "float8_e4m3fn", "float8_e5m2")."""
    return DTYPE_NAMES[dtype_code(dtype, "?")]


def bit_pattern_dtype(name):
    """The numpy dtype that holds `name` ("bfloat16", "float8_e4m3fn" or "float8_e5m2"), which
    NumPy has no dtype for, as bit patterns: uint16 or uint8, marked so that ckpt.save writes
    the array as `name`. np.zeros(3, ckpt.bit_pattern_dtype("bfloat16")) is a bfloat16 tensor."""
    if name not in _BITS_CODES:
        raise ConfigError("%r is not a dtype ckpt holds as bit patterns (%s)" % (name, ", ".join(_BITS_CODES)))
    return DTYPES[_BITS_CODES[name]]


def same_dtype(a, b):
    """Whether two numpy dtypes hold the same checkpoint dtype: byte order aside, and a bit
    pattern (bfloat16, float8) apart from the plain integers of its width."""
    a, b = np.dtype(a), np.dtype(b)
    return a.newbyteorder("=") == b.newbyteorder("=") and ckpt_dtype_name(a) == ckpt_dtype_name(b)


# --------------------------------------------------------------------------- the header

_HEADER = struct.Struct("<8sIB3BQQqqqQ")


@dataclass(frozen=True)
class Header:
    """A file's header (docs/FORMAT.md section 2)."""
    version: int
    archive: str                 # "binary", "text" or "xml"
    codecs: tuple                # names of the codecs, in the order applied: ("zstd", "aes-256-gcm")
    body_length: int
    body_checksum: int
    epoch: int
    step: int
    save_time_ns: int
    header_check: int
    raw: bytes = field(repr=False, default=b"")

    @property
    def compressed(self):
        return "zstd" in self.codecs

    @property
    def encrypted(self):
        return "aes-256-gcm" in self.codecs


def parse_header(raw, path, file_size):
    """Checks steps 2 to 8 of section 8 on the first 64 bytes of a file of `file_size` bytes."""
    if len(raw) < 8 or raw[:8] != MAGIC:
        raise FormatError("'%s' is not a ckpt checkpoint (its first bytes are not the checkpoint magic)" % path, path)
    if len(raw) < HEADER_SIZE:
        raise FormatError("checkpoint '%s' is truncated: %d bytes, shorter than the %d-byte header"
                          % (path, len(raw), HEADER_SIZE), path)
    magic, version, archive, c0, c1, c2, length, checksum, epoch, step, when, check = _HEADER.unpack_from(raw)
    if version not in (1, 2):
        raise VersionError("checkpoint '%s' has format version %d; this reader knows versions 1 and 2"
                           % (path, version), path)
    if xxh3(raw[:56]) != check:
        raise ChecksumError("checkpoint '%s' has a corrupt header (its header check does not match)" % path, path)
    # past the header check, values this reader does not know were written by a newer ckpt
    if archive > 2:
        raise VersionError("checkpoint '%s' has unknown archive kind %d (this reader knows 0 binary, 1 text, 2 xml): "
                           "a newer version of ckpt reads it" % (path, archive), path)
    stages = (c0, c1, c2)
    for c in stages:
        if c > 2:
            raise VersionError("checkpoint '%s' names unknown codec %d (this reader knows 1 zstd, 2 aes-256-gcm): "
                               "a newer version of ckpt reads it" % (path, c), path)
    listed = [c for c in stages if c]
    if stages[:len(listed)] != tuple(listed) or (version == 1 and listed):
        raise FormatError("checkpoint '%s' has a malformed codec list %02x %02x %02x for format version %d"
                          % (path, c0, c1, c2, version), path)
    if file_size - HEADER_SIZE != length:
        if file_size - HEADER_SIZE < length:
            raise FormatError("checkpoint '%s' is truncated: its header says %d body bytes, the file has %d"
                              % (path, length, file_size - HEADER_SIZE), path)
        raise FormatError("checkpoint '%s' has %d trailing bytes after its %d-byte body"
                          % (path, file_size - HEADER_SIZE - length, length), path)
    return Header(version, ARCHIVES[archive], tuple(_codecs.CODEC_NAMES[c] for c in listed), length, checksum, epoch,
                  step, when, check, bytes(raw[:HEADER_SIZE]))


def header_prefix(archive, codecs, epoch, step, save_time_ns):
    """Header bytes 0 to 55 with the body length and checksum left zero (what AES-GCM
    authenticates)."""
    ids = [{"zstd": _codecs.ZSTD, "aes-256-gcm": _codecs.AES_256_GCM}[c] for c in codecs] + [0] * (3 - len(codecs))
    return _HEADER.pack(MAGIC, 2 if codecs else 1, ARCHIVES.index(archive), *ids, 0, 0, epoch, step,
                        save_time_ns, 0)[:56]


def finish_header(prefix56, body_length, body_checksum):
    head = prefix56[:16] + struct.pack("<QQ", body_length, body_checksum) + prefix56[32:56]
    return head + struct.pack("<Q", xxh3(head))


# --------------------------------------------------------------------------- entries

@dataclass
class Entry:
    """One entry of a table of contents. For a tensor, `offset` is its payload's offset in the
    body buffer it was parsed from (binary bodies), or its decoded payload is in `data`;
    `shape` is as stored: for a column-major tensor, its logical shape reversed."""
    name: str
    kind: int
    dtype: int = 0
    shape: tuple = ()
    nbytes: int = 0
    value: object = None
    offset: int = -1
    data: bytes = None
    column_major: bool = False

    @property
    def logical_shape(self):
        return self.shape[::-1] if self.column_major else self.shape


def decode_name(raw):
    return bytes(raw).decode("utf-8", "surrogateescape")


def encode_name(text):
    return text.encode("utf-8", "surrogateescape")


class _Parser:
    """Shared checks of section 8's list of limits."""

    def __init__(self, path, length):
        self.path, self.length = path, length
        self.names = set()
        self.payload_total = 0

    def fail(self, why):
        raise FormatError("checkpoint '%s' is malformed: %s" % (self.path, why), self.path)

    def entry(self, name, kind):
        if name in self.names:
            self.fail("entry '%s' appears twice" % name)
        self.names.add(name)
        if kind > STRING:
            self.fail("entry '%s' has unknown value kind %d" % (name, kind))
        return Entry(name, kind)

    def tensor_meta(self, e, dtype, dims, nbytes):
        if dtype >= len(DTYPES):  # parsed after the checksum passed: not damage, a newer writer
            raise VersionError("checkpoint '%s': tensor '%s' has unknown dtype code %d (this reader knows 0 to %d: %s); "
                               "a newer version of ckpt reads it" % (self.path, e.name, dtype, len(DTYPES) - 1,
                                                                     ", ".join(DTYPE_NAMES)), self.path)
        numel = 1
        for d in dims:
            if d < 0:
                self.fail("tensor '%s' has an impossible shape %s" % (e.name, list(dims)))
            numel *= d
        if numel and numel > self.length:  # every element takes a byte at least
            self.fail("tensor '%s' has an impossible shape %s" % (e.name, list(dims)))
        want = numel * DTYPES[dtype].itemsize
        if want != nbytes:
            self.fail("tensor '%s' of %s%s should hold %d bytes, not %d"
                      % (e.name, DTYPE_NAMES[dtype], list(dims), want, nbytes))
        self.payload_total += nbytes
        if self.payload_total > self.length:
            self.fail("tensor payloads add up to more than the body's %d bytes" % self.length)
        e.dtype, e.shape, e.nbytes = dtype, tuple(dims), nbytes


def fold_order_records(entries, p):
    """Section 3.1: marks the tensors that storage order records name column-major and drops
    the records."""
    records = [e for e in entries if e.name.startswith(ORDER_PREFIX)]
    if not records:
        return entries
    tensors = {e.name: e for e in entries if e.kind == TENSOR}
    for r in records:
        name = r.name[len(ORDER_PREFIX):]
        if r.kind != STRING or r.value != COLUMN_MAJOR:
            p.fail("the storage order record '%s' of tensor '%s' holds %s, not '%s'"
                   % (r.name, name, "'%s'" % r.value if r.kind == STRING else "no string", COLUMN_MAJOR))
        t = tensors.get(name)
        if t is None:
            p.fail("the storage order record '%s' names no tensor entry ('%s')" % (r.name, name))
        if len(t.shape) < 2:
            p.fail("the storage order record '%s' marks tensor '%s' of rank %d column-major; only tensors of rank 2 "
                   "or more have an order" % (r.name, name, len(t.shape)))
        t.column_major = True
    return [e for e in entries if not e.name.startswith(ORDER_PREFIX)]


# --------------------------------------------------------------------------- binary bodies

def parse_binary(buf, path):
    """The entries of a binary body held in `buf` (a memoryview of bytes, or an object that
    reads the body's bytes from a file on demand: len(), slices as bytes, unpack_from), with
    their payload offsets in `buf`. Payload bytes are not read."""
    p = _Parser(path, len(buf))
    unpack = buf.unpack_from if hasattr(buf, "unpack_from") else lambda fmt, at: struct.unpack_from(fmt, buf, at)
    n = len(buf)
    at = 0

    def take(size, what):
        nonlocal at
        if size > n - at:
            p.fail("%s needs %d bytes, the body has %d left" % (what, size, n - at))
        at += size
        return at - size

    def u32(what):
        return unpack("<I", take(4, what))[0]

    def u64(what):
        return unpack("<Q", take(8, what))[0]

    def string(what):
        size = u64(what)
        start = take(size, "%s of %d bytes" % (what, size))
        return bytes(buf[start:start + size])

    count = u64("the entry count")
    if count > n - at:
        p.fail("entry count %d exceeds the body size" % count)
    entries = []
    for _ in range(count):
        name = decode_name(string("an entry name"))
        e = p.entry(name, u32("entry '%s'" % name))
        if e.kind == TENSOR:
            dtype, rank = u32("tensor '%s'" % name), u32("tensor '%s'" % name)
            if rank > MAX_RANK:
                p.fail("tensor '%s' has rank %d (at most %d)" % (name, rank, MAX_RANK))
            dims = unpack("<%dq" % rank, take(8 * rank, "tensor '%s'" % name))
            p.tensor_meta(e, dtype, dims, u64("tensor '%s'" % name))
        elif e.kind == INT64:
            e.value = unpack("<q", take(8, "entry '%s'" % name))[0]
        elif e.kind == DOUBLE:
            e.value = unpack("<d", take(8, "entry '%s'" % name))[0]
        elif e.kind == BOOL:
            v = u32("entry '%s'" % name)
            if v > 1:
                p.fail("entry '%s' holds bool value %d" % (name, v))
            e.value = v == 1
        else:
            e.value = decode_name(string("the value of '%s'" % name))
        entries.append(e)
    for e in entries:
        if e.kind != TENSOR:
            continue
        pad = u32("the padding before '%s'" % e.name)
        if pad >= ALIGNMENT:
            p.fail("payload padding of %d bytes is invalid" % pad)
        take(pad, "the padding before '%s'" % e.name)
        e.offset = take(e.nbytes, "tensor '%s'" % e.name)
    if at != n:
        p.fail("%d bytes follow the last payload" % (n - at))
    return fold_order_records(entries, p)


def binary_writes(entries, path=None):
    """A binary body of `entries` as the archive writes it: (bytes-like, direct) pieces, direct
    for a string or payload large enough for the C++ writer to hand on from memory."""
    chunk = bytearray()
    out = []

    def small(b):
        chunk.extend(b)

    def large(b):
        nonlocal chunk
        if len(b) >= _codecs.BLOCK_SIZE:
            if chunk:
                out.append((bytes(chunk), False))
                chunk = bytearray()
            out.append((b, True))
        else:
            chunk.extend(b)

    position = 0
    small(struct.pack("<Q", len(entries)))
    for name, kind, v in entries:
        raw = encode_name(name)
        small(struct.pack("<Q", len(raw)))
        large(raw)
        small(struct.pack("<I", kind))
        if kind == TENSOR:
            small(struct.pack("<II", dtype_code(v.dtype, name), v.ndim))
            small(struct.pack("<%dq" % v.ndim, *v.shape))
            small(struct.pack("<Q", v.nbytes))
        elif kind == INT64:
            small(struct.pack("<q", v))
        elif kind == DOUBLE:
            small(struct.pack("<d", v))
        elif kind == BOOL:
            small(struct.pack("<I", 1 if v else 0))
        else:
            s = encode_name(v)
            small(struct.pack("<Q", len(s)))
            large(s)
    position += len(chunk) + sum(len(b) for b, _ in out)
    for name, kind, v in entries:
        if kind != TENSOR:
            continue
        pad = (ALIGNMENT - (position + 4) % ALIGNMENT) % ALIGNMENT
        small(struct.pack("<I", pad) + bytes(pad))
        data = _payload(v)
        large(data)
        position += 4 + pad + len(data)
    if chunk:
        out.append((bytes(chunk), False))
    return out


def _payload(a):
    """The payload bytes of a C-contiguous little-endian array, without a copy."""
    return a.reshape(-1).view(np.uint8).data


# --------------------------------------------------------------------------- text bodies

_B64_LINE = 76
_WS = b" \t\r\n\f\v"
_SIGNATURE = b"22 serialization::archive "


def _b64(data):
    """Base64 in lines of 76 characters, as Boost's archives write it."""
    text = base64.b64encode(bytes(data))
    if len(text) <= _B64_LINE:
        return text
    return b"\n".join(text[i:i + _B64_LINE] for i in range(0, len(text), _B64_LINE))


def _f64_text(v, name, path):
    if not math.isfinite(v):
        raise ConfigError("entry '%s' holds %r, which text and xml archives cannot store (use a binary archive)"
                          % (name, v), path)
    return b"%.17e" % v


_WS_RUN = re.compile(rb"[ \t\r\n\f\v]*")
_LEADING_ZEROS = re.compile(rb"0*")


def _integer(text):
    """The int of a decimal integer token, in time linear in its length: leading zeros are
    skipped (as C++ streams read them), and more than 20 digits after them are out of every
    range read here (int() of a long string takes time quadratic in its length, and Python
    refuses more than 4300 digits); None then."""
    negative = text.startswith(b"-")
    digits = text[1:] if negative else text
    digits = digits[_LEADING_ZEROS.match(digits).end():]
    if len(digits) > 20:
        return None
    v = int(digits) if digits else 0
    return -v if negative else v


class _TextReader:
    def __init__(self, buf, path):
        self.buf, self.at, self.p = bytes(buf), 0, _Parser(path, len(buf))

    def skip_ws(self):
        self.at = _WS_RUN.match(self.buf, self.at).end()

    _NUMBER = re.compile(rb"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")

    def number(self, what, signed=False, real=False):
        self.skip_ws()
        m = self._NUMBER.match(self.buf, self.at)
        if not m or (m.group(1) or m.group(2)) and not real or (m.group(0).startswith(b"-") and not (signed or real)):
            self.p.fail("expected %s at byte %d of the body" % (what, self.at))
        self.at = m.end()
        if self.at < len(self.buf) and self.buf[self.at] not in _WS:
            self.p.fail("expected %s at byte %d of the body" % (what, m.start()))
        if real:
            return float(m.group(0))
        v = _integer(m.group(0))
        if v is None:
            self.p.fail("%s at byte %d of the body has %d digits, out of range" % (what, m.start(), m.end() - m.start()))
        return v

    def u(self, bits, what):
        v = self.number(what)
        if v >= 1 << bits:
            self.p.fail("%s is %d, more than %d bits" % (what, v, bits))
        return v

    def i64(self, what):
        v = self.number(what, signed=True)
        if not -(1 << 63) <= v < 1 << 63:
            self.p.fail("%s is %d, outside int64" % (what, v))
        return v

    def block(self, n, what):
        """n bytes of base64, with any white space between its characters."""
        if n > len(self.buf) - self.at:
            self.p.fail("%s of %d bytes exceeds the body size" % (what, n))
        want = 4 * -(-n // 3)
        if want == 0:
            return b""
        self.skip_ws()
        # the lines as written: 76 characters and a line feed
        end = self.at + want + max(0, (want - 1) // _B64_LINE)
        text = self.buf[self.at:end].translate(None, _WS)
        if len(text) != want or (end < len(self.buf) and self.buf[end] not in _WS):
            text, end = self._collect(want, what)
        self.at = end
        try:
            data = base64.b64decode(text, validate=True)
        except binascii.Error:
            self.p.fail("%s is not valid base64" % what)
        if len(data) != n:
            self.p.fail("%s decodes to %d bytes, not %d" % (what, len(data), n))
        return data

    def _collect(self, want, what):
        """`want` base64 characters from self.at on, with white space anywhere between them, in
        time linear in the bytes read: each slice is as long as the characters still wanted,
        so it never takes one too many, and white space goes at the speed of bytes methods."""
        got, at, b, n = [], self.at, self.buf, len(self.buf)
        count = 0
        while count < want:
            at = _WS_RUN.match(b, at).end()
            if at == n:
                self.p.fail("%s ends early: %d of %d base64 characters" % (what, count, want))
            piece = b[at:at + want - count].translate(None, _WS)
            at = min(n, at + want - count)
            got.append(piece)
            count += len(piece)
        if at < n and b[at] not in _WS:
            self.p.fail("%s has more base64 characters than its length says" % what)
        return b"".join(got), at

    def string(self, what):
        n = self.u(64, "the length of " + what)
        return decode_name(self.block(n, what))


def parse_text(buf, path):
    r = _TextReader(buf, path)
    if not r.buf.startswith(_SIGNATURE):
        r.p.fail("a text body starts with '22 serialization::archive ', this one does not")
    r.at = len(_SIGNATURE)
    r.u(32, "the archive version")
    count = r.u(64, "the entry count")
    if count > len(r.buf) - r.at:
        r.p.fail("entry count %d exceeds the body size" % count)
    entries = []
    for _ in range(count):
        name = r.string("an entry name")
        e = r.p.entry(name, r.u(32, "the kind of '%s'" % name))
        _read_value(r, e, lambda what: r.u(32, what), lambda what: r.u(64, what), r.i64,
                    lambda what: r.number(what, real=True), r.string)
        entries.append(e)
    for e in entries:
        if e.kind == TENSOR:
            e.data = r.block(e.nbytes, "the payload of '%s'" % e.name)
    r.skip_ws()
    if r.at != len(r.buf):
        r.p.fail("%d bytes follow the last item" % (len(r.buf) - r.at))
    return fold_order_records(entries, r.p)


def _read_value(r, e, u32, u64, i64, f64, string):
    name = e.name
    if e.kind == TENSOR:
        dtype, rank = u32("the dtype of '%s'" % name), u32("the rank of '%s'" % name)
        if rank > MAX_RANK:
            r.p.fail("tensor '%s' has rank %d (at most %d)" % (name, rank, MAX_RANK))
        dims = [i64("a dim of '%s'" % name) for _ in range(rank)]
        r.p.tensor_meta(e, dtype, dims, u64("the size of '%s'" % name))
    elif e.kind == INT64:
        e.value = i64("the value of '%s'" % name)
    elif e.kind == DOUBLE:
        e.value = f64("the value of '%s'" % name)
    elif e.kind == BOOL:
        v = u32("the value of '%s'" % name)
        if v > 1:
            r.p.fail("entry '%s' holds bool value %d" % (name, v))
        e.value = v == 1
    else:
        e.value = string("the value of '%s'" % name)


class _TextWriter:
    def __init__(self):
        self.parts = [b"22 serialization::archive %d" % BOOST_ARCHIVE_VERSION]
        self.after_block = False

    def number(self, text):
        self.parts.append((b"\n" if self.after_block else b" ") + text)
        self.after_block = False

    def block(self, data):
        self.parts.append(b"\n\n" + _b64(data) if len(data) else b"\n")
        self.after_block = True


def text_writes(entries, path=None):
    w = _TextWriter()
    w.number(b"%d" % len(entries))
    for name, kind, v in entries:
        raw = encode_name(name)
        w.number(b"%d" % len(raw))
        w.block(raw)
        w.number(b"%d" % kind)
        if kind == TENSOR:
            w.number(b"%d" % dtype_code(v.dtype, name))
            w.number(b"%d" % v.ndim)
            for d in v.shape:
                w.number(b"%d" % d)
            w.number(b"%d" % v.nbytes)
        elif kind == INT64:
            w.number(b"%d" % v)
        elif kind == DOUBLE:
            w.number(_f64_text(v, name, path))
        elif kind == BOOL:
            w.number(b"1" if v else b"0")
        else:
            s = encode_name(v)
            w.number(b"%d" % len(s))
            w.block(s)
    for name, kind, v in entries:
        if kind == TENSOR:
            w.block(_payload(v))
    w.parts.append(b"\n")
    return [(b"".join(w.parts), False)]


# --------------------------------------------------------------------------- xml bodies

_XML_HEAD = re.compile(rb'<\?xml version="1\.0" encoding="UTF-8" standalone="yes" \?>\n<!DOCTYPE boost_serialization>\n'
                       rb'<boost_serialization signature="serialization::archive" version="[0-9]+">\n')
_XML_ESCAPES = ((b"&", b"&amp;"), (b"<", b"&lt;"), (b">", b"&gt;"), (b'"', b"&quot;"), (b"'", b"&apos;"))
_XML_ENTITY = re.compile(rb"&(amp|lt|gt|quot|apos);|&")
_XML_UNESCAPE = {b"amp": b"&", b"lt": b"<", b"gt": b">", b"quot": b'"', b"apos": b"'"}


def _xml_escape(raw):
    for a, b in _XML_ESCAPES:
        raw = raw.replace(a, b)
    return raw


class _XmlReader(_TextReader):
    def element(self, tag):
        self.skip_ws()
        open_, close = b"<" + tag + b">", b"</" + tag + b">"
        if not self.buf.startswith(open_, self.at):
            self.p.fail("expected <%s> at byte %d of the body" % (tag.decode(), self.at))
        start = self.at + len(open_)
        end = self.buf.find(close, start)
        if end < 0:
            self.p.fail("<%s> at byte %d is not closed" % (tag.decode(), self.at))
        self.at = end + len(close)
        return self.buf[start:end]

    def xnumber(self, tag, what, signed=False, real=False, bits=64):
        text = self.element(tag)
        m = self._NUMBER.fullmatch(text)
        if not m or (m.group(1) or m.group(2)) and not real or (text.startswith(b"-") and not (signed or real)):
            self.p.fail("%s is '%s', not a number of its kind" % (what, decode_name(text[:40])))
        if real:
            return float(text)
        v = _integer(text)
        if v is None:
            self.p.fail("%s has %d digits, out of range" % (what, len(text)))
        if not signed and v >= 1 << bits or signed and not -(1 << 63) <= v < 1 << 63:
            self.p.fail("%s is %d, out of range" % (what, v))
        return v

    def xstring(self, tag, what):
        raw = self.element(tag)

        def unescape(m):
            if m.group(1) is None:
                self.p.fail("%s holds a '&' that starts no entity" % what)
            return _XML_UNESCAPE[m.group(1)]
        return decode_name(_XML_ENTITY.sub(unescape, raw))


def parse_xml(buf, path):
    r = _XmlReader(buf, path)
    m = _XML_HEAD.match(r.buf)
    if not m:
        r.p.fail("an xml body starts with Boost's xml declaration, doctype and <boost_serialization ...>")
    r.at = m.end()
    count = r.xnumber(b"entries", "the entry count")
    if count > len(r.buf) - r.at:
        r.p.fail("entry count %d exceeds the body size" % count)
    entries = []
    for _ in range(count):
        name = r.xstring(b"name", "an entry name")
        e = r.p.entry(name, r.xnumber(b"kind", "the kind of '%s'" % name, bits=32))
        tags = iter((b"dtype", b"rank")) if e.kind == TENSOR else None

        def u32(what, tags=tags):
            return r.xnumber(next(tags) if tags else b"value", what, bits=32)
        _read_value(r, e, u32, lambda what: r.xnumber(b"nbytes", what),
                    lambda what: r.xnumber(b"dim" if e.kind == TENSOR else b"value", what, signed=True),
                    lambda what: r.xnumber(b"value", what, real=True), lambda what: r.xstring(b"value", what))
        entries.append(e)
    for e in entries:
        if e.kind != TENSOR:
            continue
        text = r.element(b"data")
        sub = _TextReader(text, path)
        e.data = sub.block(e.nbytes, "the payload of '%s'" % e.name)
        sub.skip_ws()
        if sub.at != len(sub.buf):
            r.p.fail("the payload of '%s' has more base64 characters than its size says" % e.name)
    r.skip_ws()
    if not r.buf.startswith(b"</boost_serialization>", r.at) or r.buf[r.at + 22:].strip(_WS):
        r.p.fail("an xml body ends with </boost_serialization>")
    return fold_order_records(entries, r.p)


def xml_writes(entries, path=None):
    parts = [b'<?xml version="1.0" encoding="UTF-8" standalone="yes" ?>\n<!DOCTYPE boost_serialization>\n'
             b'<boost_serialization signature="serialization::archive" version="%d">\n' % BOOST_ARCHIVE_VERSION]

    def el(tag, text):
        parts.append(b"<%s>%s</%s>\n" % (tag, text, tag))
    el(b"entries", b"%d" % len(entries))
    for name, kind, v in entries:
        el(b"name", _xml_escape(encode_name(name)))
        el(b"kind", b"%d" % kind)
        if kind == TENSOR:
            el(b"dtype", b"%d" % dtype_code(v.dtype, name))
            el(b"rank", b"%d" % v.ndim)
            for d in v.shape:
                el(b"dim", b"%d" % d)
            el(b"nbytes", b"%d" % v.nbytes)
        elif kind == INT64:
            el(b"value", b"%d" % v)
        elif kind == DOUBLE:
            el(b"value", _f64_text(v, name, path))
        elif kind == BOOL:
            el(b"value", b"1" if v else b"0")
        else:
            el(b"value", _xml_escape(encode_name(v)))
    for name, kind, v in entries:
        if kind == TENSOR:
            data = _payload(v)
            el(b"data", b"\n" + _b64(data) + b"\n" if len(data) else b"\n")
    parts.append(b"</boost_serialization>\n\n")
    return [(b"".join(parts), False)]


PARSERS = {"binary": parse_binary, "text": parse_text, "xml": parse_xml}
WRITERS = {"binary": binary_writes, "text": text_writes, "xml": xml_writes}
