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
TENSOR, INT64, DOUBLE, BOOL, STRING, BYTES, STRINGS, OBJECT = range(8)
KIND_NAMES = ("tensor", "int64", "double", "bool", "string", "bytes", "strings", "object")
# an object's encoding (section 3): how its data is laid out
OBJECT_ENCODINGS = ("boost binary", "boost text", "value map", "stream text")
VALUE_MAP = 2
_TEXT_ENCODINGS = ("boost text", "stream text")   # data that is text, returned as str
MAP_NUMBER, MAP_STRING, MAP_VECTOR = 1, 2, 3        # the tags of a value map's items
MAX_PLAUSIBLE_CODE = 255  # kinds and encodings above it are damage, not a newer writer's
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
    if version not in (1, 2, 3):
        raise VersionError("checkpoint '%s' has format version %d; this reader knows versions 1 to 3"
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
    if stages[:len(listed)] != tuple(listed) or (version != 2 and listed):
        raise FormatError("checkpoint '%s' has a malformed codec list %02x %02x %02x for format version %d"
                          % (path, c0, c1, c2, version), path)
    if version == 3 and archive != 0:
        raise FormatError("checkpoint '%s' is malformed: format version 3 holds binary bodies, not %s ones"
                          % (path, ARCHIVES[archive]), path)
    if file_size - HEADER_SIZE != length:
        if file_size - HEADER_SIZE < length:
            raise FormatError("checkpoint '%s' is truncated: its header says %d body bytes, the file has %d"
                              % (path, length, file_size - HEADER_SIZE), path)
        raise FormatError("checkpoint '%s' has %d trailing bytes after its %d-byte body"
                          % (path, file_size - HEADER_SIZE - length, length), path)
    return Header(version, ARCHIVES[archive], tuple(_codecs.CODEC_NAMES[c] for c in listed), length, checksum, epoch,
                  step, when, check, bytes(raw[:HEADER_SIZE]))


def header_prefix(archive, codecs, epoch, step, save_time_ns, chunked=False):
    """Header bytes 0 to 55 with the body length and checksum left zero (what AES-GCM
    authenticates). `chunked`: a version 3 body (binary, no codecs, chunk checksums)."""
    ids = [{"zstd": _codecs.ZSTD, "aes-256-gcm": _codecs.AES_256_GCM}[c] for c in codecs] + [0] * (3 - len(codecs))
    version = 2 if codecs else 3 if chunked else 1
    return _HEADER.pack(MAGIC, version, ARCHIVES.index(archive), *ids, 0, 0, epoch, step, save_time_ns, 0)[:56]


def finish_header(prefix56, body_length, body_checksum):
    head = prefix56[:16] + struct.pack("<QQ", body_length, body_checksum) + prefix56[32:56]
    return head + struct.pack("<Q", xxh3(head))


# --------------------------------------------------------------------------- entries

@dataclass
class Entry:
    """One entry of a table of contents. For a tensor, `offset` is its payload's offset in the
    body buffer it was parsed from (binary bodies), or its decoded payload is in `data`;
    `shape` is as stored: for a column-major tensor, its logical shape reversed. For bytes and
    objects, `nbytes` is the size of their data, and an object's `type` and `encoding` (its
    code) are kept beside its `value`."""
    name: str
    kind: int
    dtype: int = 0
    shape: tuple = ()
    nbytes: int = 0
    value: object = None
    offset: int = -1
    data: bytes = None
    column_major: bool = False
    type: str = None
    encoding: int = None
    chunk_hashes: tuple = None   # version 3: the xxh3 of each chunk of the payload

    @property
    def logical_shape(self):
        return self.shape[::-1] if self.column_major else self.shape


def decode_name(raw):
    return bytes(raw).decode("utf-8", "surrogateescape")


def encode_name(text):
    return text.encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Object:
    """An object entry (docs/FORMAT.md section 3, kind 7) as it is stored: `type` names it
    ("std::mt19937_64", "Stats"), `encoding` says how `data` is laid out: "boost binary",
    "boost text", "value map" or "stream text". `data` is a str for the two text encodings
    (bytes that are not UTF-8 kept as surrogate escapes, as names are), bytes otherwise.
    ckpt.load returns a value map as a dict and every other object as an Object; ckpt.save
    writes an Object as it is."""
    type: str
    encoding: str
    data: object

    def __post_init__(self):
        if not isinstance(self.type, str):
            raise ConfigError("an Object's type is a str, not %s" % type(self.type).__name__)
        if self.encoding not in OBJECT_ENCODINGS:
            raise ConfigError("an Object's encoding is one of %s, not %r"
                              % (", ".join(OBJECT_ENCODINGS), self.encoding))
        if self.encoding in _TEXT_ENCODINGS:
            if not isinstance(self.data, str):
                raise ConfigError("the data of an Object of encoding '%s' is a str, not %s"
                                  % (self.encoding, type(self.data).__name__))
        elif isinstance(self.data, (bytearray, memoryview)):
            object.__setattr__(self, "data", bytes(self.data))  # its own, and hashable as a frozen value is
        elif not isinstance(self.data, bytes):
            raise ConfigError("the data of an Object of encoding '%s' is bytes, not %s"
                              % (self.encoding, type(self.data).__name__))


class _MapError(Exception):
    """A value map that breaks section 3; `newer` when a newer writer may have written it (a
    dtype code this reader does not know)."""

    def __init__(self, why, newer=False):
        super().__init__(why)
        self.newer = newer


def decode_value_map(data):
    """The dict of a value map's bytes (section 3), checked: numbers as NumPy scalars of their
    dtype (bfloat16 and float8, which NumPy has no scalar of, as 0-d arrays of their bit
    patterns), strings as str, vectors as 1-d arrays of their own. Raises _MapError saying
    what is wrong, after "the value map of 'x'"."""
    data = bytes(data)
    n, at = len(data), 0

    def take(size, what):
        nonlocal at
        if size > n - at:
            raise _MapError("is cut short: %s needs %d bytes, %d are left" % (what, size, n - at))
        at += size
        return at - size

    def u64(what):
        return struct.unpack_from("<Q", data, take(8, what))[0]

    def dtype(key):
        code = struct.unpack_from("<I", data, take(4, "the dtype of key '%s'" % key))[0]
        if code >= len(DTYPES):
            raise _MapError("has unknown dtype code %d at key '%s' (this reader knows 0 to %d: %s)"
                            % (code, key, len(DTYPES) - 1, ", ".join(DTYPE_NAMES)), newer=True)
        return DTYPES[code]

    count = u64("the item count")
    if count > n - at:
        raise _MapError("claims %d items in %d bytes" % (count, n - at))
    out, last = {}, None
    for i in range(count):
        size = u64("the length of key %d" % i)
        start = take(size, "key %d of %d bytes" % (i, size))
        raw = data[start:start + size]
        key = decode_name(raw)
        if last is not None and raw <= last:
            raise _MapError("has key '%s' after '%s': keys are in increasing byte order, each once"
                            % (key, decode_name(last)))
        last = raw
        tag = data[take(1, "the tag of key '%s'" % key)]
        if tag == MAP_NUMBER:
            dt = dtype(key)
            start = take(dt.itemsize, "the number of key '%s'" % key)
            if dt.kind == "b" and data[start] > 1:  # as a bool entry: no other byte is a value
                raise _MapError("holds bool byte %d at key '%s'" % (data[start], key))
            a = np.frombuffer(data, dt, 1, start)
            out[key] = a.reshape(()).copy() if dt.metadata else a[0]  # (a scalar would lose what it stands for)
        elif tag == MAP_STRING:
            size = u64("the length of the string of key '%s'" % key)
            start = take(size, "the string of key '%s' of %d bytes" % (key, size))
            out[key] = decode_name(data[start:start + size])
        elif tag == MAP_VECTOR:
            dt = dtype(key)
            elements = u64("the element count of key '%s'" % key)
            start = take(elements * dt.itemsize, "the %d elements of key '%s'" % (elements, key))
            out[key] = np.frombuffer(data, dt, elements, start).copy()
        else:
            raise _MapError("has unknown tag %d at key '%s' (it knows 1 number, 2 string, 3 vector)" % (tag, key))
    if at != n:
        raise _MapError("has %d bytes after its last item" % (n - at))
    return out


def _map_item(v, name, key, path):
    """(tag and value bytes, what V of "map<string, V>" it is) of a value of a map."""
    def number(code, raw):
        return struct.pack("<BI", MAP_NUMBER, code) + raw, DTYPE_NAMES[code]
    if isinstance(v, str):  # (np.str_ too)
        try:
            raw = encode_name(v)
        except UnicodeEncodeError as e:
            raise ConfigError("entry '%s' key '%s' holds a string with %r at character %d, which has no UTF-8 bytes"
                              % (name, key, v[e.start], e.start), path) from None
        return struct.pack("<BQ", MAP_STRING, len(raw)) + raw, "string"
    if type(v) is bool:
        return number(DTYPE_NAMES.index("bool"), b"\1" if v else b"\0")
    if isinstance(v, int):
        if not -(1 << 63) <= v < 1 << 63:
            raise ConfigError("entry '%s' key '%s' holds %d, outside int64" % (name, key, v), path)
        return number(DTYPE_NAMES.index("int64"), struct.pack("<q", v))
    if isinstance(v, float) and not isinstance(v, np.generic):
        return number(DTYPE_NAMES.index("float64"), struct.pack("<d", v))
    if isinstance(v, (np.generic, np.ndarray)):
        a = np.asarray(v)
        if a.ndim > 1:
            raise ConfigError("entry '%s' key '%s' holds an array of rank %d; a map holds numbers and 1-d arrays"
                              % (name, key, a.ndim), path)
        try:
            code = dtype_code(a.dtype, name, path)
        except ConfigError:
            raise ConfigError("entry '%s' key '%s' holds dtype %s, which a checkpoint cannot hold (it holds %s)"
                              % (name, key, ckpt_dtype_name(a.dtype) or a.dtype, ", ".join(DTYPE_NAMES)),
                              path) from None
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if a.ndim == 0:  # a NumPy scalar, or a 0-d array (how a bfloat16 or float8 number loads)
            return number(code, a.tobytes())
        return struct.pack("<BIQ", MAP_VECTOR, code, a.size) + a.tobytes(), "vector<%s>" % DTYPE_NAMES[code]
    raise ConfigError("entry '%s' key '%s' holds a %s; a map holds bool, int, float, str, NumPy scalars and 1-d arrays"
                      % (name, key, type(v).__name__), path)


def encode_value_map(mapping, name, path=None):
    """(type, data) of the value map of `mapping` (section 3): str keys; values bool, int
    (int64), float (float64), NumPy scalars and 0-d arrays (numbers of their dtype), str, and
    1-d arrays (vectors); the items in the byte order of their keys. `type` is
    "map<string, V>", V what all the values are, or "any"."""
    items, kinds = [], set()
    for key, v in mapping.items():
        if not isinstance(key, str):
            raise ConfigError("entry '%s' has the key %r, a %s; the keys of a map are str"
                              % (name, key, type(key).__name__), path)
        try:
            raw = encode_name(key)
        except UnicodeEncodeError as e:
            raise ConfigError("entry '%s' has the key %r, which holds %r at character %d, which has no UTF-8 bytes"
                              % (name, key, key[e.start], e.start), path) from None
        item, kind = _map_item(v, name, key, path)
        kinds.add(kind)
        items.append((raw, key, item))
    items.sort(key=lambda item: item[0])
    for (a, key_a, _), (b, key_b, _) in zip(items, items[1:]):
        if a == b:  # (a surrogate escape can spell the bytes of another key)
            raise ConfigError("entry '%s' has the keys %r and %r, which are the same bytes"
                              % (name, key_a, key_b), path)
    parts = [struct.pack("<Q", len(items))]
    for raw, _, item in items:
        parts += [struct.pack("<Q", len(raw)), raw, item]
    return "map<string, %s>" % (kinds.pop() if len(kinds) == 1 else "any"), b"".join(parts)


def object_fields(obj, name, path=None):
    """(type, encoding code, data bytes) of a ckpt.Object, as an entry of kind OBJECT holds it;
    a value map's data checked, as a reader will check it."""
    for what, text in (("type", obj.type), ("data", obj.data if isinstance(obj.data, str) else "")):
        try:
            encode_name(text)
        except UnicodeEncodeError as e:
            raise ConfigError("the %s of object '%s' holds %r at character %d, which has no UTF-8 bytes"
                              % (what, name, text[e.start], e.start), path) from None
    code = OBJECT_ENCODINGS.index(obj.encoding)
    data = encode_name(obj.data) if isinstance(obj.data, str) else obj.data
    if code == VALUE_MAP:
        try:
            decode_value_map(data)
        except _MapError as e:
            raise ConfigError("object '%s' is a value map that a reader refuses: it %s" % (name, e), path) from None
    return obj.type, code, data


class _Parser:
    """Shared checks of section 8's list of limits."""

    def __init__(self, path, length):
        self.path, self.length = path, length
        self.names = set()
        self.payload_total = 0

    def fail(self, why):
        raise FormatError("checkpoint '%s' is malformed: %s" % (self.path, why), self.path)

    def newer(self, what):
        """Past the checksum, a code this reader does not know is a newer writer's, not damage."""
        raise VersionError("checkpoint '%s': %s; a newer version of ckpt reads it" % (self.path, what), self.path)

    def entry(self, name, kind):
        if name in self.names:
            self.fail("entry '%s' appears twice" % name)
        self.names.add(name)
        if kind > MAX_PLAUSIBLE_CODE:  # no writer numbers a kind so high: garbage, not a newer writer
            self.fail("entry '%s' has unknown value kind %d" % (name, kind))
        if kind > OBJECT:
            self.newer("entry '%s' has unknown value kind %d (this reader knows 0 to %d: %s)"
                       % (name, kind, OBJECT, ", ".join(KIND_NAMES)))
        return Entry(name, kind)

    def tensor_meta(self, e, dtype, dims, nbytes):
        if dtype >= len(DTYPES):
            self.newer("tensor '%s' has unknown dtype code %d (this reader knows 0 to %d: %s)"
                       % (e.name, dtype, len(DTYPES) - 1, ", ".join(DTYPE_NAMES)))
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

    def object_value(self, e, data):
        """What an object entry's data is to Python: a value map's dict (checked), or an
        Object."""
        encoding = OBJECT_ENCODINGS[e.encoding]
        if e.encoding == VALUE_MAP:
            try:
                return decode_value_map(data)
            except _MapError as m:
                (self.newer if m.newer else self.fail)("the value map of '%s' %s" % (e.name, m))
        return Object(e.type, encoding, decode_name(data) if encoding in _TEXT_ENCODINGS else bytes(data))


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


# The table of contents is the same fields in each archive kind (section 3); readers and
# writers of each kind give them their form. A field is named by its xml element (binary and
# text ignore the name): r.u32(tag, what), u64, i64, f64, text(tag, what) for a string,
# data(tag, n, what) for a block of n bytes, and left() the body bytes not yet read; writers
# take the value instead of `what`.

def _read_entries(r):
    count = r.u64(b"entries", "the entry count")
    if count > r.left():
        r.p.fail("entry count %d exceeds the body size" % count)
    entries = []
    for _ in range(count):
        name = r.text(b"name", "an entry name")
        e = r.p.entry(name, r.u32(b"kind", "the kind of '%s'" % name))
        _read_value(r, e)
        entries.append(e)
    return entries


def _read_value(r, e):
    name = e.name
    if e.kind == TENSOR:
        head = r.tensor_head() if hasattr(r, "tensor_head") else None
        if head is None:
            dtype, rank = r.u32(b"dtype", "the dtype of '%s'" % name), r.u32(b"rank", "the rank of '%s'" % name)
            if rank > MAX_RANK:
                r.p.fail("tensor '%s' has rank %d (at most %d)" % (name, rank, MAX_RANK))
            dims = [r.i64(b"dim", "a dim of '%s'" % name) for _ in range(rank)]
            head = dtype, dims, r.u64(b"nbytes", "the size of '%s'" % name)
        r.p.tensor_meta(e, *head)
        chunk = getattr(r, "chunk_bytes", 0)
        if chunk:
            count = -(-e.nbytes // chunk)
            if count > r.left() // 8:  # bounded by the body before anything is allocated
                r.p.fail("tensor '%s' of %d bytes needs %d chunk checksums, more than the body holds"
                         % (name, e.nbytes, count))
            e.chunk_hashes = r.hashes(count, "the chunk checksums of '%s'" % name)
    elif e.kind == INT64:
        e.value = r.i64(b"value", "the value of '%s'" % name)
    elif e.kind == DOUBLE:
        e.value = r.f64(b"value", "the value of '%s'" % name)
    elif e.kind == BOOL:
        v = r.u32(b"value", "the value of '%s'" % name)
        if v > 1:
            r.p.fail("entry '%s' holds bool value %d" % (name, v))
        e.value = v == 1
    elif e.kind == STRING:
        e.value = r.text(b"value", "the value of '%s'" % name)
    elif e.kind == BYTES:
        e.nbytes = r.u64(b"size", "the size of '%s'" % name)
        e.value = r.data(b"data", e.nbytes, "the bytes of '%s'" % name)
    elif e.kind == STRINGS:
        count = r.u64(b"count", "the string count of '%s'" % name)
        if count > r.left():  # every string takes a byte at least
            r.p.fail("entry '%s' claims %d strings, more than the %d bytes left in the body" % (name, count, r.left()))
        e.value = [r.text(b"value", "string %d of '%s'" % (i, name)) for i in range(count)]
    else:
        e.type = r.text(b"type", "the type of '%s'" % name)
        e.encoding = r.u32(b"encoding", "the encoding of '%s'" % name)
        if e.encoding > MAX_PLAUSIBLE_CODE:
            r.p.fail("object '%s' has unknown encoding %d" % (name, e.encoding))
        if e.encoding >= len(OBJECT_ENCODINGS):
            r.p.newer("object '%s' (%s) has unknown encoding %d (this reader knows 0 to %d: %s)"
                      % (name, e.type, e.encoding, len(OBJECT_ENCODINGS) - 1, ", ".join(OBJECT_ENCODINGS)))
        e.nbytes = r.u64(b"size", "the size of '%s'" % name)
        e.value = r.p.object_value(e, r.data(b"data", e.nbytes, "the data of '%s'" % name))


def _write_entries(w, entries):
    w.u64(b"entries", len(entries))
    for name, kind, v in entries:
        w.text(b"name", encode_name(name))
        w.u32(b"kind", kind)
        _write_value(w, name, kind, v)


def _write_value(w, name, kind, v):
    """`v` as _normalize gives it: an array, int, float, bool, str, bytes, a list of str, or an
    object's (type, encoding code, data bytes)."""
    if kind == TENSOR:
        w.u32(b"dtype", dtype_code(v.dtype, name))
        w.u32(b"rank", v.ndim)
        for d in v.shape:
            w.i64(b"dim", d)
        w.u64(b"nbytes", v.nbytes)
        chunk = getattr(w, "chunk_bytes", 0)
        if chunk:
            data = _payload(v)
            w.small(struct.pack("<%dQ" % -(-len(data) // chunk),
                                *(xxh3(data[at:at + chunk]) for at in range(0, len(data), chunk))))
    elif kind == INT64:
        w.i64(b"value", v)
    elif kind == DOUBLE:
        w.f64(b"value", v, name)
    elif kind == BOOL:
        w.u32(b"value", 1 if v else 0)
    elif kind == STRING:
        w.text(b"value", encode_name(v))
    elif kind == BYTES:
        w.u64(b"size", len(v))
        w.data(b"data", v)
    elif kind == STRINGS:
        w.u64(b"count", len(v))
        for s in v:
            w.text(b"value", encode_name(s))
    else:
        type_, encoding, data = v
        w.text(b"type", encode_name(type_))
        w.u32(b"encoding", encoding)
        w.u64(b"size", len(data))
        w.data(b"data", data)


# --------------------------------------------------------------------------- binary bodies

_U32, _U64, _I64, _F64 = (struct.Struct(f) for f in ("<I", "<Q", "<q", "<d"))
_TENSOR_HEAD = struct.Struct("<II")                                          # dtype, rank
_TENSOR_DIMS = [struct.Struct("<%dqQ" % k) for k in range(MAX_RANK + 1)]     # the dims and nbytes, by rank


class _BinaryReader:
    """The fields of a binary body (section 4) in `buf`: a memoryview of bytes, or an object
    that reads the body's bytes from a file on demand (len(), slices as bytes, and
    unpack_from(a struct.Struct, offset))."""

    def __init__(self, buf, path):
        self.buf, self.n, self.at = buf, len(buf), 0
        self.p = _Parser(path, self.n)
        self.window = hasattr(buf, "unpack_from")
        # what fields are unpacked from directly: the body in memory, or a window's first bytes
        self.head = buf.head() if self.window else buf
        self.head_n = len(self.head)
        self.hash_fields = {}  # struct.Struct of n hashes, by n

    def unpack(self, fields, at):
        if at + fields.size <= self.head_n:
            return fields.unpack_from(self.head, at)
        return self.buf.unpack_from(fields, at)

    def tensor_head(self):
        """(dtype, dims, nbytes) of a tensor entry in one or two unpacks (a table has many), or
        None, nothing read, when they may not all be there: the field-by-field path then says
        what is wrong."""
        at = self.at
        if self.n - at < _TENSOR_HEAD.size:
            return None
        dtype, rank = self.unpack(_TENSOR_HEAD, at)
        if rank > MAX_RANK or self.n - at - _TENSOR_HEAD.size < _TENSOR_DIMS[rank].size:
            return None
        *dims, nbytes = self.unpack(_TENSOR_DIMS[rank], at + _TENSOR_HEAD.size)
        self.at = at + _TENSOR_HEAD.size + _TENSOR_DIMS[rank].size
        return dtype, dims, nbytes

    def hashes(self, count, what):
        """`count` u64 chunk checksums, as a tuple."""
        fields = self.hash_fields.get(count)
        if fields is None:
            fields = self.hash_fields[count] = struct.Struct("<%dQ" % count)
        return self.unpack(fields, self.take(fields.size, what))

    def left(self):
        return self.n - self.at

    def take(self, size, what):
        if size > self.n - self.at:
            self.p.fail("%s needs %d bytes, the body has %d left" % (what, size, self.n - self.at))
        self.at += size
        return self.at - size

    def field(self, fields, what):
        at = self.at
        if fields.size > self.n - at:
            self.take(fields.size, what)  # (fails)
        self.at = at + fields.size
        return self.unpack(fields, at)[0]

    def u32(self, tag, what):
        return self.field(_U32, what)

    def u64(self, tag, what):
        return self.field(_U64, what)

    def i64(self, tag, what):
        return self.field(_I64, what)

    def f64(self, tag, what):
        return self.field(_F64, what)

    def data(self, tag, n, what):
        start = self.take(n, "%s of %d bytes" % (what, n))
        return bytes(self.buf[start:start + n])

    def text(self, tag, what):
        at = self.at
        if at + 8 <= self.head_n:  # (most are)
            n = _U64.unpack_from(self.head, at)[0]
            if n <= self.head_n - at - 8:
                self.at = at + 8 + n
                return decode_name(bytes(self.head[at + 8:at + 8 + n]))
        return decode_name(self.data(tag, self.u64(tag, what), what))


CHUNK_BYTES = 1 << 20                     # what save() checksums a version 3 body's payloads by
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 1 << 12, 1 << 30


def valid_chunk_bytes(n):
    return MIN_CHUNK_BYTES <= n <= MAX_CHUNK_BYTES and n & (n - 1) == 0


def check_chunk_bytes(n, fail):
    if not valid_chunk_bytes(n):
        fail("the chunk size %d is not a power of two from %d to %d" % (n, MIN_CHUNK_BYTES, MAX_CHUNK_BYTES))


def parse_binary(buf, path, chunked=False, toc=None):
    """The entries of a binary body held in `buf` (see _BinaryReader), with their payload
    offsets in `buf`. Payload bytes are not read. `chunked`: a version 3 body, whose chunk size,
    toc_check and the length of the bytes it covers go into `toc` (a dict) when given; the
    table of contents is then all that is read, the payload offsets computed (section 13)."""
    r = _BinaryReader(buf, path)
    if chunked:
        r.chunk_bytes = r.u64(b"chunk_bytes", "the chunk size")
        check_chunk_bytes(r.chunk_bytes, r.p.fail)
    entries = _read_entries(r)
    if chunked:
        end = r.at
        check = r.u64(b"toc_check", "the table of contents' check")
        if toc is not None:
            toc.update(chunk_bytes=r.chunk_bytes, end=end, check=check)
            at = r.at
            for e in entries:
                if e.kind == TENSOR:
                    e.offset = at + 4 + (ALIGNMENT - (at + 4) % ALIGNMENT) % ALIGNMENT
                    at = e.offset + e.nbytes
            if at != r.n:
                r.p.fail("the payloads end at body offset %d, the body at %d" % (at, r.n))
            return fold_order_records(entries, r.p)
    for e in entries:
        if e.kind != TENSOR:
            continue
        pad = r.u32(None, "the padding before '%s'" % e.name)
        if pad >= ALIGNMENT:
            r.p.fail("payload padding of %d bytes is invalid" % pad)
        r.take(pad, "the padding before '%s'" % e.name)
        e.offset = r.take(e.nbytes, "tensor '%s'" % e.name)
    if r.at != r.n:
        r.p.fail("%d bytes follow the last payload" % (r.n - r.at))
    return fold_order_records(entries, r.p)


class _BinaryWriter:
    """A binary body as (bytes-like, direct) pieces, direct for a block large enough for the
    C++ writer to hand on from memory."""

    def __init__(self):
        self.chunk, self.out = bytearray(), []

    def small(self, b):
        self.chunk.extend(b)

    def large(self, b):
        if len(b) >= _codecs.BLOCK_SIZE:
            if self.chunk:
                self.out.append((bytes(self.chunk), False))
                self.chunk = bytearray()
            self.out.append((b, True))
        else:
            self.chunk.extend(b)

    def written(self):
        return len(self.chunk) + sum(len(b) for b, _ in self.out)

    def u32(self, tag, v):
        self.chunk += _U32.pack(v)

    def u64(self, tag, v):
        self.chunk += _U64.pack(v)

    def i64(self, tag, v):
        self.chunk += _I64.pack(v)

    def f64(self, tag, v, name):
        self.chunk += _F64.pack(v)

    def text(self, tag, raw):
        self.u64(tag, len(raw))
        self.large(raw)

    def data(self, tag, data):
        self.large(data)

    def pieces(self):
        if self.chunk:
            self.out.append((bytes(self.chunk), False))
            self.chunk = bytearray()
        return self.out


def binary_writes(entries, path=None, chunk_bytes=0):
    """A binary body of `entries` as the archive writes it: (bytes-like, direct) pieces, direct
    for a string, block or payload large enough for the C++ writer to hand on from memory.
    `chunk_bytes`: a version 3 body, its payloads checksummed in chunks of that size."""
    w = _BinaryWriter()
    if chunk_bytes:
        w.chunk_bytes = chunk_bytes
        w.u64(b"chunk_bytes", chunk_bytes)
    _write_entries(w, entries)
    if chunk_bytes:
        hasher = xxhash.xxh3_64()
        for piece, _ in w.pieces():
            hasher.update(piece)
        w.u64(b"toc_check", hasher.intdigest())
    position = w.written()
    for name, kind, v in entries:
        if kind != TENSOR:
            continue
        pad = (ALIGNMENT - (position + 4) % ALIGNMENT) % ALIGNMENT
        w.small(struct.pack("<I", pad) + bytes(pad))
        data = _payload(v)
        w.large(data)
        position += 4 + pad + len(data)
    return w.pieces()


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
    """The items of a text body (section 5), and the fields of section 3 read as items."""

    def __init__(self, buf, path):
        self.buf, self.at, self.p = bytes(buf), 0, _Parser(path, len(buf))

    def left(self):
        return len(self.buf) - self.at

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

    def u32(self, tag, what):
        return self.u(32, what)

    def u64(self, tag, what):
        return self.u(64, what)

    def i64(self, tag, what):
        v = self.number(what, signed=True)
        if not -(1 << 63) <= v < 1 << 63:
            self.p.fail("%s is %d, outside int64" % (what, v))
        return v

    def f64(self, tag, what):
        return self.number(what, real=True)

    def data(self, tag, n, what):
        return self.block(n, what)

    def text(self, tag, what):
        n = self.u(64, "the length of " + what)
        return decode_name(self.block(n, what))

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


def parse_text(buf, path):
    r = _TextReader(buf, path)
    if not r.buf.startswith(_SIGNATURE):
        r.p.fail("a text body starts with '22 serialization::archive ', this one does not")
    r.at = len(_SIGNATURE)
    r.u(32, "the archive version")
    entries = _read_entries(r)
    for e in entries:
        if e.kind == TENSOR:
            e.data = r.block(e.nbytes, "the payload of '%s'" % e.name)
    r.skip_ws()
    if r.at != len(r.buf):
        r.p.fail("%d bytes follow the last item" % (len(r.buf) - r.at))
    return fold_order_records(entries, r.p)


class _TextWriter:
    def __init__(self, path=None):
        self.parts = [b"22 serialization::archive %d" % BOOST_ARCHIVE_VERSION]
        self.after_block = False
        self.path = path

    def number(self, text):
        self.parts.append((b"\n" if self.after_block else b" ") + text)
        self.after_block = False

    def block(self, data):
        self.parts.append(b"\n\n" + _b64(data) if len(data) else b"\n")
        self.after_block = True

    def u32(self, tag, v):
        self.number(b"%d" % v)

    u64 = i64 = u32

    def f64(self, tag, v, name):
        self.number(_f64_text(v, name, self.path))

    def text(self, tag, raw):
        self.number(b"%d" % len(raw))
        self.block(raw)

    def data(self, tag, data):
        self.block(data)


def text_writes(entries, path=None):
    w = _TextWriter(path)
    _write_entries(w, entries)
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
    """The elements of an xml body (section 6), and the fields of section 3 read as elements."""

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

    def u32(self, tag, what):
        return self.xnumber(tag, what, bits=32)

    def u64(self, tag, what):
        return self.xnumber(tag, what)

    def i64(self, tag, what):
        return self.xnumber(tag, what, signed=True)

    def f64(self, tag, what):
        return self.xnumber(tag, what, real=True)

    def text(self, tag, what):
        raw = self.element(tag)

        def unescape(m):
            if m.group(1) is None:
                self.p.fail("%s holds a '&' that starts no entity" % what)
            return _XML_UNESCAPE[m.group(1)]
        return decode_name(_XML_ENTITY.sub(unescape, raw))

    def data(self, tag, n, what):
        """A block of n bytes: the base64 lines of an element, as a payload's <data>."""
        sub = _TextReader(self.element(tag), self.p.path)
        data = sub.block(n, what)
        sub.skip_ws()
        if sub.at != len(sub.buf):
            self.p.fail("%s has more base64 characters than its size says" % what)
        return data


def parse_xml(buf, path):
    r = _XmlReader(buf, path)
    m = _XML_HEAD.match(r.buf)
    if not m:
        r.p.fail("an xml body starts with Boost's xml declaration, doctype and <boost_serialization ...>")
    r.at = m.end()
    entries = _read_entries(r)
    for e in entries:
        if e.kind == TENSOR:
            e.data = r.data(b"data", e.nbytes, "the payload of '%s'" % e.name)
    r.skip_ws()
    if not r.buf.startswith(b"</boost_serialization>", r.at) or r.buf[r.at + 22:].strip(_WS):
        r.p.fail("an xml body ends with </boost_serialization>")
    return fold_order_records(entries, r.p)


class _XmlWriter:
    def __init__(self, path=None):
        self.parts = [b'<?xml version="1.0" encoding="UTF-8" standalone="yes" ?>\n<!DOCTYPE boost_serialization>\n'
                      b'<boost_serialization signature="serialization::archive" version="%d">\n'
                      % BOOST_ARCHIVE_VERSION]
        self.path = path

    def element(self, tag, text):
        self.parts.append(b"<%s>%s</%s>\n" % (tag, text, tag))

    def u32(self, tag, v):
        self.element(tag, b"%d" % v)

    u64 = i64 = u32

    def f64(self, tag, v, name):
        self.element(tag, _f64_text(v, name, self.path))

    def text(self, tag, raw):
        self.element(tag, _xml_escape(raw))

    def data(self, tag, data):
        self.element(tag, b"\n" + _b64(data) + b"\n" if len(data) else b"\n")


def xml_writes(entries, path=None):
    w = _XmlWriter(path)
    _write_entries(w, entries)
    for name, kind, v in entries:
        if kind == TENSOR:
            w.data(b"data", _payload(v))
    w.parts.append(b"</boost_serialization>\n\n")
    return [(b"".join(w.parts), False)]


PARSERS = {"binary": parse_binary, "text": parse_text, "xml": parse_xml}
WRITERS = {"binary": binary_writes, "text": text_writes, "xml": xml_writes}
