"""Loading, saving and checking checkpoint files."""

import errno as _errno
import functools
import itertools
import logging
import math
import mmap as _mmap
import numbers
import os
import secrets
import struct
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import xxhash

from . import _format as F
from . import _series
from . import codecs as C
from ._names import series_of
from .errors import ChecksumError, ConfigError, Error, FormatError, IoError, LoadMismatch, OutOfMemory, printable

__all__ = ["load", "load_into", "save", "header", "verify", "contents", "EntryInfo", "LoadReport"]

log = logging.getLogger("ckpt")


def _fspath(path):
    """A path argument as a str (or bytes), "~" expanded."""
    if path is None:
        raise ConfigError("no checkpoint path (None); ckpt.latest() returns None when a directory holds no "
                          "checkpoint of the prefix")
    try:
        text = os.fspath(path)
    except TypeError:
        raise ConfigError("a checkpoint path is a str, bytes or os.PathLike, not %s" % type(path).__name__) from None
    return os.path.expanduser(text)


def _io_error(what, path, e):
    return IoError("cannot %s '%s': %s" % (what, path, e.strerror or e), path, e.errno or 0)


def _shown(path):
    try:
        return _fspath(path)
    except (Error, TypeError):
        return str(path)


def _foreign():
    """The exceptions of what a reader calls (Python, NumPy, zstandard) that say an input could
    not be read; ckpt's readers turn any that get through into a ckpt error naming the file."""
    types = [ValueError, ArithmeticError, IndexError, struct.error, RecursionError]
    zstandard = sys.modules.get("zstandard")
    if zstandard is not None:
        types.append(zstandard.ZstdError)
    return tuple(types)


def _reader(fn):
    """`fn(path, ...)` raising nothing but ckpt errors, each naming the file: MemoryError and
    the exceptions of NumPy, zstandard and the standard library never reach its caller."""
    @functools.wraps(fn)
    def read(path, *args, **kwargs):
        try:
            return fn(path, *args, **kwargs)
        except Error:
            raise
        except MemoryError:
            shown = _shown(path)
            try:
                size = " (%d bytes)" % os.path.getsize(shown)
            except (OSError, ValueError):
                size = ""
            # the machine's shortage, not the file's damage, as the C++ readers say of std::bad_alloc
            raise OutOfMemory("not enough memory to read checkpoint '%s'%s" % (shown, size), shown) from None
        except OSError as e:
            raise _io_error("read", _shown(path), e) from None
        except _foreign() as e:
            shown = _shown(path)
            raise FormatError("checkpoint '%s' cannot be read: %s (%s)" % (shown, e, type(e).__name__), shown) from e
    return read


def _read_exactly(fd, view, offset, path):
    """Fills `view` from file offset `offset`; a short read is a truncated file."""
    done = 0
    while done < len(view):
        try:
            got = os.preadv(fd, [view[done:]], offset + done)
        except OSError as e:
            raise _io_error("read", path, e) from None
        if got == 0:
            raise FormatError("checkpoint '%s' is truncated: it ended while being read" % path, path)
        done += got


_CHUNK = 4 << 20              # what a reading thread preads at a time
_THREADED_MIN = 32 << 20      # bodies from this size are read by two threads


def _read_hashed(fd, buf, offset, path):
    """Fills `buf` (a uint8 array) from file offset `offset` and returns the xxh3 of its bytes,
    hashing each chunk right after it is read, while it is in the cache. A large body is read
    by two threads that take chunks in turn (pread releases the GIL, and each thread faults in
    its own part of the new memory); the calling thread hashes the chunks in order as they
    arrive."""
    view = memoryview(buf).cast("B")
    n = len(view)
    cuts = [*range(0, n, _CHUNK), n]
    count = len(cuts) - 1
    hasher = xxhash.xxh3_64()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if n < _THREADED_MIN or cpus < 2:
        for i in range(count):
            chunk = view[cuts[i]:cuts[i + 1]]
            _read_exactly(fd, chunk, offset + cuts[i], path)
            hasher.update(chunk)
        return hasher.intdigest()
    done = bytearray(count)
    claim = itertools.count()     # both threads take the next chunk from it
    arrived = threading.Condition()
    helper_failed, stop, helper_done = [], [], []

    def read(i):
        _read_exactly(fd, view[cuts[i]:cuts[i + 1]], offset + cuts[i], path)
        with arrived:
            done[i] = 1
            arrived.notify()

    def helper():
        try:
            for i in claim:
                if i >= count or stop:
                    break
                read(i)
        except BaseException as e:
            helper_failed.append(e)
        finally:
            with arrived:
                helper_done.append(True)
                arrived.notify()

    hashed = 0

    def hash_arrived():
        nonlocal hashed
        while hashed < count and done[hashed]:
            hasher.update(view[cuts[hashed]:cuts[hashed + 1]])
            hashed += 1

    thread = threading.Thread(target=helper, name="ckpt-read", daemon=True)
    thread.start()
    try:
        for i in claim:
            if i >= count or helper_failed:
                break
            read(i)
            hash_arrived()
        while hashed < count and not helper_failed:
            with arrived:
                while not done[hashed] and not helper_done:
                    arrived.wait()
            hash_arrived()
            if hashed < count and helper_done:
                break
    finally:
        stop.append(True)
        thread.join()
    if helper_failed:
        raise helper_failed[0]
    return hasher.intdigest()


_HASH_CHUNK = 1 << 20         # what verify() reads at a time into the buffer it hashes


class _Window:
    """The body of an open file, read on demand through a window of 64 KiB: what parse_binary
    reads of a table of contents, without mapping the file or reading the payloads."""

    SIZE = 64 << 10

    def __init__(self, opened):
        self.fd, self.path, self.n = opened.fd, opened.path, opened.header.body_length
        self.start, self.data = 0, b""

    def __len__(self):
        return self.n

    def _get(self, at, size):
        if not self.start <= at <= at + size <= self.start + len(self.data):
            buf = bytearray(min(max(size, self.SIZE), self.n - at))
            _read_exactly(self.fd, memoryview(buf), F.HEADER_SIZE + at, self.path)
            self.start, self.data = at, bytes(buf)
        return memoryview(self.data)[at - self.start:at - self.start + size]

    def __getitem__(self, s):
        return self._get(s.start, s.stop - s.start)

    def head(self):
        """The body's first bytes, as many as the window holds (bytes)."""
        self._get(0, min(self.SIZE, self.n))
        return self.data

    def unpack_from(self, fields, at):
        """`fields` (a struct.Struct) unpacked from body offset `at`."""
        start = at - self.start
        if 0 <= start <= len(self.data) - fields.size:  # in the window: no view made (a table has many fields)
            return fields.unpack_from(self.data, start)
        return fields.unpack_from(self._get(at, fields.size))


class _Opened:
    """An open checkpoint whose header passed section 8's steps 1 to 8."""

    def __init__(self, path):
        self.path = _fspath(path)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise _io_error("open", self.path, e) from None
        try:
            self.size = os.fstat(self.fd).st_size
            raw = os.pread(self.fd, F.HEADER_SIZE, 0)
            self.header = F.parse_header(raw, self.path, self.size)
        except OSError as e:
            self.close()
            raise _io_error("read", self.path, e) from None
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def checksum_failure(self):
        return ChecksumError("checkpoint '%s' has a corrupt body (its checksum does not match)" % self.path, self.path)

    def mapped_body(self):
        """The body as a read-only memory map, its checksum checked."""
        flags = _mmap.MAP_SHARED | getattr(_mmap, "MAP_POPULATE", 0)
        if self.size == 0:
            raise FormatError("checkpoint '%s' is empty" % self.path, self.path)
        try:
            mm = _mmap.mmap(self.fd, self.size, flags=flags, prot=_mmap.PROT_READ)
        except OSError as e:
            raise _io_error("map", self.path, e) from None
        body = memoryview(mm)[F.HEADER_SIZE:]
        if F.xxh3(body) != self.header.body_checksum:
            body.release()
            mm.close()
            raise self.checksum_failure()
        return mm, body

    def hashed_body(self, n=None):
        """The xxh3 of the stored body (or of its first `n` bytes), read through one reused
        buffer: nothing mapped (a file cut short under a map kills the process with SIGBUS;
        here it is an error), and no memory of the body's size."""
        n = self.header.body_length if n is None else n
        view = memoryview(bytearray(min(n, _HASH_CHUNK)))
        hasher = xxhash.xxh3_64()
        for at in range(0, n, _HASH_CHUNK):
            chunk = view[:min(_HASH_CHUNK, n - at)]
            _read_exactly(self.fd, chunk, F.HEADER_SIZE + at, self.path)
            hasher.update(chunk)
        return hasher.intdigest()

    def check_body(self):
        if self.hashed_body() != self.header.body_checksum:
            raise self.checksum_failure()

    def table(self):
        """The entries of the body, payloads not read and the checksum NOT checked: a binary
        body without codecs read on demand (its table of contents), any other read whole."""
        h = self.header
        if h.archive == "binary" and not h.codecs:
            return F.parse_binary(_Window(self), self.path, h.version == 3)
        if h.codecs:
            raise ConfigError("checkpoint '%s' has a coded body (%s): its entries need it decoded"
                              % (self.path, "+".join(h.codecs)), self.path)
        return F.PARSERS[h.archive](memoryview(self.stored_body()), self.path)

    def stored_body(self):
        """The stored body read into memory, its checksum checked."""
        buf = np.empty(self.header.body_length, dtype=np.uint8)
        if _read_hashed(self.fd, buf, F.HEADER_SIZE, self.path) != self.header.body_checksum:
            raise self.checksum_failure()
        return buf

    def decoded_body(self, key, max_decoded_bytes):
        """Section 8 steps 10 to 12: the archive's bytes, as a uint8 array, each stage's output
        held to the budget of max_decoded_bytes before it is allocated."""
        h = self.header
        budget = C.decoded_budget(max_decoded_bytes, h.body_length)
        key = C.as_key(key)
        body = self.stored_body()
        if h.encrypted and key is None:
            raise C.CkptKeyError("checkpoint '%s' is encrypted (aes-256-gcm): pass its key (key=..., a key file or "
                                 "32 bytes)" % self.path, self.path)
        try:
            for codec in reversed(h.codecs):
                if codec == "aes-256-gcm":
                    body = C.aes_decode(body, key, h.raw[:56], self.path, budget)
                else:
                    body = C.zstd_decode(body, self.path, budget)
        except C.MissingModule as e:
            raise C.MissingModule("checkpoint '%s' cannot be decoded here: %s" % (self.path, e), self.path) from None
        return body


def _parse(opened, key, use_mmap, max_decoded_bytes):
    """The entries of an opened file and the buffer their payload offsets refer to."""
    C.decoded_budget(max_decoded_bytes, 0)  # (a wrong value is refused whether or not it is used)
    h = opened.header
    if h.archive == "binary" and not h.codecs and use_mmap:
        mm, body = opened.mapped_body()
        try:
            entries = F.parse_binary(body, opened.path, h.version == 3)
        finally:
            body.release()
        return entries, mm, F.HEADER_SIZE
    body = opened.decoded_body(key, max_decoded_bytes) if h.codecs else opened.stored_body()
    view = memoryview(body).cast("B")
    if h.archive == "binary":
        entries = F.parse_binary(view, opened.path, h.version == 3)
    else:
        entries = F.PARSERS[h.archive](view, opened.path)
    return entries, body, 0


def _tensor(e, buf, base, writable, path=None):
    """The array of a tensor entry; a column-major tensor as the Fortran-ordered array of its
    logical shape over the same bytes (the transpose of the stored row-major array)."""
    dtype = F.DTYPES[e.dtype]
    try:
        if e.data is not None:
            a = np.frombuffer(e.data, dtype=dtype).reshape(e.shape)
            if e.column_major:
                a = a.T
            return a.copy(order="K") if writable else a
        a = np.ndarray(e.shape, dtype=dtype, buffer=buf, offset=base + e.offset)
        return a.T if e.column_major else a
    except ValueError as err:  # a shape NumPy cannot hold: rank over 32, or dims beside a 0 beyond its sizes
        raise FormatError("checkpoint '%s': tensor '%s' of shape %s cannot be a NumPy array (%s)"
                          % (path, e.name, list(e.logical_shape), err), path) from None


def _read(path, key, mmap, max_decoded_bytes):
    with _Opened(path) as opened:
        return _parse(opened, key, mmap, max_decoded_bytes)


@_reader
def load(path, key=None, mmap=False, max_decoded_bytes=None):
    """The entries of checkpoint `path` as a dict, in the file's order: tensors as numpy
    arrays, int64, double, bool and string values as int, float, bool and str, bytes as
    bytes, lists of strings as lists of str, value maps as dicts (str keys; numbers as NumPy
    scalars of their dtype, strings as str, vectors as 1-d arrays) and other objects as
    ckpt.Object. Entries the writer reserved (`__ckpt.*`) are left out. A column-major tensor
    (docs/FORMAT.md section 3.1) is an array of its logical shape in Fortran order, over the
    same bytes.

    The body is read into memory of its own, which the (writable) arrays share: what another
    process does to the file afterwards changes nothing loaded. `mmap=True` instead makes the
    tensors of a binary body without codecs read-only views into a memory map of the file:
    nothing is copied, but the arrays then change when the file is rewritten in place (`cp`
    over it), and reading them after the file was cut short kills the process with SIGBUS.
    ckpt's own writers replace a file by renaming a new one over it, which leaves a map of the
    old one intact. Compressed, encrypted, text and xml bodies are always decoded into memory.
    The body's checksum is checked before anything is returned.

    `key`: for encrypted files, a ckpt.Key, 32 bytes or a key file's path.
    `max_decoded_bytes`: the most a body with codecs may decode to, refused (FormatError)
    before anything is allocated. None, the default, allows the larger of 256 MiB and 64 times
    the body as stored, which no real state exceeds but for one compressed from little but
    zeros; pass a larger int for such a file you trust, or math.inf for no limit.
    """
    path = _fspath(path)
    entries, buf, base = _read(path, key, mmap, max_decoded_bytes)
    out = {}
    for e in entries:
        if e.name.startswith(F.RESERVED_PREFIX):
            continue
        out[e.name] = _tensor(e, buf, base, writable=not mmap, path=path) if e.kind == F.TENSOR else e.value
    return out


@dataclass
class LoadReport:
    """What load_into() did: target arrays the file did not fill, file tensors with no target,
    names whose dtype or shape differ (also in one of the other two), and the file's other
    entries (scalars and tensors not loaded)."""
    missing: list = field(default_factory=list)
    unexpected: list = field(default_factory=list)
    mismatched: list = field(default_factory=list)
    rest: dict = field(default_factory=dict)

    @property
    def complete(self):
        return not self.missing and not self.unexpected


@_reader
def load_into(path, arrays, strict=True, key=None, max_decoded_bytes=None, mmap=False):
    """Writes the tensors of checkpoint `path` into the arrays of `arrays` (a mapping of names
    to writable numpy arrays), checking dtypes and shapes first: nothing is written unless
    the whole load can be done. `strict`: a target the file does not fill, a file tensor with
    no target, or another dtype or shape is a LoadMismatch; otherwise those are reported and
    the rest is loaded. The body is read into memory first; `mmap=True` copies from a map of
    the file instead (no second copy of the body, but see load() for what a map risks)."""
    path = _fspath(path)
    entries, buf, base = _read(path, key, mmap, max_decoded_bytes)
    report = LoadReport()
    plan = []
    found = set()
    for e in entries:
        if e.name.startswith(F.RESERVED_PREFIX):
            continue
        if e.kind != F.TENSOR:
            report.rest[e.name] = e.value
            continue
        target = arrays.get(e.name)
        if target is None:
            report.unexpected.append(e.name)
            report.rest[e.name] = _tensor(e, buf, base, writable=True, path=path)
            continue
        found.add(e.name)
        if not isinstance(target, np.ndarray):
            raise ConfigError("load_into: the target of '%s' is a %s, not a numpy array" % (e.name, type(target).__name__))
        dtype = F.DTYPES[e.dtype]
        if not F.same_dtype(target.dtype, dtype) or tuple(target.shape) != e.logical_shape:
            report.mismatched.append("%s: checkpoint %s%s%s, target %s%s" % (
                e.name, F.DTYPE_NAMES[e.dtype], list(e.logical_shape), " column-major" if e.column_major else "",
                target.dtype, list(target.shape)))
            report.missing.append(e.name)
            report.unexpected.append(e.name)
            continue
        if not target.flags.writeable:
            raise ConfigError("load_into: the target of '%s' is read-only" % e.name)
        plan.append((target, e))
    report.missing.extend(n for n in arrays if n not in found)
    if strict and (report.missing or report.unexpected):
        parts = []
        if report.mismatched:
            parts.append("of another dtype or shape: " + "; ".join(report.mismatched))
        only_missing = [n for n in report.missing if n in arrays and n not in found]
        if only_missing:
            parts.append("not in the checkpoint: " + ", ".join(only_missing))
        extra = [n for n in report.unexpected if n not in arrays]
        if extra:
            parts.append("without a target: " + ", ".join(extra))
        raise LoadMismatch("strict load of '%s' failed, nothing was written: %s" % (path, "; ".join(parts)), path)
    for target, e in plan:
        # "equiv": the checks above let a target of either byte order through; copyto puts each
        # element in its place whatever the memory orders of the two
        np.copyto(target, _tensor(e, buf, base, writable=False), casting="equiv")
    return report


@dataclass(frozen=True)
class EntryInfo:
    """One entry of a table of contents: a tensor's dtype name, logical shape, size and storage
    order, or another entry's value as ckpt.load returns it; for bytes and objects `nbytes` is
    the size of their data, and an object's `type` and `encoding` are given too."""
    name: str
    kind: str                   # "tensor", "int64", "double", "bool", "string", "bytes", "strings" or "object"
    dtype: str = None
    shape: tuple = None
    nbytes: int = 0
    value: object = None
    order: str = None           # tensors: "row_major" or "column_major"
    type: str = None            # objects: what the writer named them ("map<string, float64>", "std::mt19937_64")
    encoding: str = None        # objects: "boost binary", "boost text", "value map" or "stream text"


_KIND_NAMES = F.KIND_NAMES


@_reader
def contents(path, key=None, max_decoded_bytes=None):
    """The table of contents of checkpoint `path` (reserved `__ckpt.*` entries included, but
    for storage order records, which become the tensors' `order`), in order, without the
    payloads; the checksum is checked. `max_decoded_bytes` as for load()."""
    path = _fspath(path)
    C.decoded_budget(max_decoded_bytes, 0)
    with _Opened(path) as opened:
        h = opened.header
        if h.archive == "binary" and not h.codecs:
            opened.check_body()
            entries = opened.table()  # the table of contents alone, read again (from the cache)
        else:
            entries, _, _ = _parse(opened, key, False, max_decoded_bytes)
    return [_entry_info(e) for e in entries]


def _entry_info(e):
    if e.kind == F.TENSOR:
        return EntryInfo(e.name, "tensor", F.DTYPE_NAMES[e.dtype], e.logical_shape, e.nbytes, None,
                         F.COLUMN_MAJOR if e.column_major else "row_major")
    if e.kind == F.OBJECT:
        return EntryInfo(e.name, "object", nbytes=e.nbytes, value=e.value, type=e.type,
                         encoding=F.OBJECT_ENCODINGS[e.encoding])
    return EntryInfo(e.name, _KIND_NAMES[e.kind], nbytes=e.nbytes, value=e.value)


class Reader:
    """An open checkpoint, from ckpt.open(): its entries, and any one of them, or rows of an
    array, read on demand. A format version 3 file (binary, no codecs: what save() and the C++
    library write by default) has its header and table of contents checked when opened, and
    each read checks only the chunks it reads. Any other file is verified and read whole when
    opened. Use it in a `with` block, or close() it."""

    def __init__(self, path, key=None, max_decoded_bytes=None):
        self.path = path
        self._opened, self._buf, self._base = None, None, 0
        self.bytes_read = 0     # payload bytes read by read() and read_rows(), whole chunks counted
        opened = _Opened(path)
        try:
            self.header = opened.header
            if self.header.version == 3:
                toc, window = {}, _Window(opened)
                try:
                    entries = F.parse_binary(window, path, True, toc)
                except FormatError:  # damage is reported as such: a malformed table in a whole file is not
                    opened.check_body()
                    raise
                self._check_toc(opened, toc, window)
                self.chunk_bytes = toc["chunk_bytes"]
                self._opened, opened = opened, None
            else:
                entries, self._buf, self._base = _parse(opened, key, False, max_decoded_bytes)
        finally:
            if opened is not None:
                opened.close()
        self._entries = {e.name: e for e in entries if not e.name.startswith(F.RESERVED_PREFIX)}

    def _check_toc(self, opened, toc, window):
        end, head = toc["end"], window.head()
        got = F.xxh3(memoryview(head)[:end]) if end <= len(head) else opened.hashed_body(end)  # (most tables fit)
        if got != toc["check"]:
            raise ChecksumError("checkpoint '%s' has a corrupt table of contents (its check does not match)"
                                % self.path, self.path)

    def close(self):
        if self._opened is not None:
            self._opened.close()
            self._opened = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def entries(self):
        """The entries in file order (reserved `__ckpt.*` ones left out), as contents() gives them."""
        return [_entry_info(e) for e in self._entries.values()]

    def _entry(self, name):
        e = self._entries.get(name)
        if e is None:
            raise LoadMismatch("checkpoint '%s' has no entry '%s'" % (self.path, name))
        return e

    def read(self, name):
        """Entry `name` as load() gives it: an array read and checked chunk by chunk, or the value."""
        e = self._entry(name)
        if e.kind != F.TENSOR:
            return e.value
        if self._opened is None and self._buf is not None:
            return _tensor(e, self._buf, self._base, True, self.path)
        rows = e.shape[0] if e.shape else 1
        a = self._rows(e, 0, rows)
        a = a.reshape(e.shape)
        return a.T if e.column_major else a

    def read_rows(self, name, begin, end):
        """Rows [begin, end) of row-major array `name` along its first axis; only the chunks that
        hold them are read and checked."""
        e = self._entry(name)
        if e.kind != F.TENSOR or not e.shape or e.column_major:
            raise LoadMismatch("cannot read rows of '%s' in '%s': rows are slices of a row-major array of rank 1 or "
                               "more%s" % (name, self.path, " (it is column-major: read it whole)" if e.column_major
                                           else ""))
        if not 0 <= begin <= end <= e.shape[0]:
            raise LoadMismatch("cannot read rows [%d, %d) of '%s' in '%s': it has %d rows"
                               % (begin, end, name, self.path, e.shape[0]))
        if self._opened is None:
            return _tensor(e, self._buf, self._base, True, self.path)[begin:end].copy()
        return self._rows(e, begin, end).reshape((end - begin,) + tuple(e.shape[1:]))

    def _rows(self, e, begin, end):
        if self._opened is None:
            raise ConfigError("checkpoint '%s' is closed" % self.path)
        rows = e.shape[0] if e.shape else 1
        row = e.nbytes // rows if rows else 0
        lo, hi, chunk = begin * row, end * row, self.chunk_bytes
        first = lo // chunk
        last = first if hi == lo else (hi - 1) // chunk + 1
        start, stop = first * chunk, min(e.nbytes, last * chunk)
        buf = np.empty(stop - start, dtype=np.uint8)
        _read_exactly(self._opened.fd, memoryview(buf), F.HEADER_SIZE + e.offset + start, self.path)
        self.bytes_read += stop - start
        for k in range(first, last):
            piece = buf[k * chunk - start:min((k + 1) * chunk, e.nbytes) - start]
            if F.xxh3(piece) != e.chunk_hashes[k]:
                raise ChecksumError("checkpoint '%s' is corrupt: chunk %d of %d of tensor '%s' (bytes %d to %d of its "
                                    "payload) fails its checksum" % (self.path, k + 1, len(e.chunk_hashes), e.name,
                                                                     k * chunk, min((k + 1) * chunk, e.nbytes)),
                                    self.path)
        return buf[lo - start:hi - start].view(F.DTYPES[e.dtype])


@_reader
def open(path, key=None, max_decoded_bytes=None):
    """Opens checkpoint `path` to read its entries one at a time (a Reader): in a format
    version 3 file each read checks only the chunks it reads, so one entry of a large file
    costs its own bytes. `key` and `max_decoded_bytes` as for load(), for files read whole."""
    return Reader(_fspath(path), key, max_decoded_bytes)


@_reader
def header(path):
    """The header of checkpoint `path`, checked (magic, version, header check, archive kind,
    codec list, body length); the body is not read."""
    with _Opened(path) as opened:
        return opened.header


@_reader
def verify(path, key=None, max_decoded_bytes=None):
    """Checks that `path` is a whole checkpoint whose body matches its checksum (no key
    needed) and returns its header. With `key`, an encrypted body is also decrypted and
    authenticated, and every body parsed (decoded within `max_decoded_bytes`, as by load())."""
    with _Opened(path) as opened:
        if key is None:
            C.decoded_budget(max_decoded_bytes, 0)  # (a wrong value is refused whether or not it is used)
            opened.check_body()
        else:
            _parse(opened, key, False, max_decoded_bytes)
        return opened.header


# --------------------------------------------------------------------------- saving

_sequence = itertools.count()


def _encodable(text, what, path):
    """A ConfigError unless `text` has bytes to write: UTF-8, or the bytes of a name or string
    that was not UTF-8 in the file it was loaded from (surrogate escapes)."""
    try:
        F.encode_name(text)
    except UnicodeEncodeError as e:
        raise ConfigError("%s holds %r at character %d, which has no UTF-8 bytes" % (what, text[e.start], e.start),
                          path) from None


def _normalize(entries, path):
    items = entries.items() if isinstance(entries, Mapping) else entries
    out, seen = [], set()
    for name, v in items:
        if not isinstance(name, str):
            raise ConfigError("entry names are str, not %s (%r)" % (type(name).__name__, name), path)
        _encodable(name, "entry name %r" % name, path)
        if name in seen:
            raise ConfigError("entry '%s' appears twice" % name, path)
        seen.add(name)
        if name.startswith(F.RESERVED_PREFIX):
            raise ConfigError("entry name '%s' starts with '%s', which is reserved for what ckpt records itself"
                              % (name, F.RESERVED_PREFIX), path)
        if type(v) is bool:
            out.append((name, F.BOOL, v))
        elif isinstance(v, int) and not isinstance(v, bool):
            if not -(1 << 63) <= v < 1 << 63:
                raise ConfigError("entry '%s' holds %d, outside int64" % (name, v), path)
            out.append((name, F.INT64, int(v)))
        elif isinstance(v, float) and not isinstance(v, np.generic):
            out.append((name, F.DOUBLE, float(v)))
        elif isinstance(v, str):
            _encodable(v, "the string of entry %r" % name, path)
            out.append((name, F.STRING, v))
        elif isinstance(v, (bytes, bytearray, memoryview)) and not isinstance(v, np.generic):
            out.append((name, F.BYTES, v if type(v) is bytes else bytes(v)))  # (a memoryview's len() counts items)
        # before lists and dicts: what NumPy takes is a tensor, as it was before they had kinds of their own
        elif isinstance(v, (np.ndarray, np.generic)) or hasattr(v, "__array__"):
            a = np.asarray(v)
            F.dtype_code(a.dtype, name, path)
            if a.ndim > F.MAX_RANK:
                raise ConfigError("tensor '%s' has rank %d (at most %d)" % (name, a.ndim, F.MAX_RANK), path)
            if a.dtype.byteorder == ">":
                a = a.astype(a.dtype.newbyteorder("<"))
            if a.ndim >= 2 and a.flags.f_contiguous and not a.flags.c_contiguous:
                # column-major, as it lies (section 3.1): the transpose's C-order bytes, and the record
                out.append((name, F.TENSOR, a.T))
                out.append((F.ORDER_PREFIX + name, F.STRING, F.COLUMN_MAJOR))
            else:
                out.append((name, F.TENSOR, a if a.flags.c_contiguous else a.copy(order="C")))  # (ascontiguousarray makes 0-d 1-d)
        elif isinstance(v, (list, tuple)):
            for i, s in enumerate(v):
                if not isinstance(s, str):
                    raise ConfigError("entry '%s' is a %s whose item %d is of type %s; a checkpoint holds lists of "
                                      "str (numbers go in arrays)" % (name, type(v).__name__, i, type(s).__name__),
                                      path)
                _encodable(s, "string %d of entry %r" % (i, name), path)
            out.append((name, F.STRINGS, list(v)))
        elif isinstance(v, Mapping):
            type_, data = F.encode_value_map(v, name, path)
            out.append((name, F.OBJECT, (type_, F.VALUE_MAP, data)))
        elif isinstance(v, F.Object):
            out.append((name, F.OBJECT, F.object_fields(v, name, path)))
        else:
            raise ConfigError("entry '%s' is a %s; a checkpoint holds numpy arrays, int, float, bool, str, bytes, "
                              "lists of str, dicts (value maps) and ckpt.Object" % (name, type(v).__name__), path)
    return out


def _metric_entries(metrics, path):
    out = []
    for name, v in (metrics or {}).items():
        if not isinstance(name, str) or not name:
            raise ConfigError("a metric needs a name, not %r" % (name,), path)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
            raise ConfigError("metric '%s' is %r; a metric is a finite number" % (name, v), path)
        out.append((F.METRIC_PREFIX + name, F.DOUBLE, float(v)))
    return out


def _write_all(fd, data, path):
    view = memoryview(data).cast("B")
    while len(view):
        try:
            n = os.write(fd, view)
        except OSError as e:
            raise _io_error("write", path, e) from None
        view = view[n:]


def _fsync_dir(directory, path):
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise _io_error("open the directory of", path, e) from None
    try:
        os.fsync(fd)
    except OSError as e:
        raise _io_error("fsync the directory of", path, e) from None
    finally:
        os.close(fd)


def save(path, entries, epoch=0, step=0, archive="binary", zstd=None, key=None, overwrite=True, metrics=None,
         chunk_bytes=F.CHUNK_BYTES):
    """Writes `entries` (a mapping, or pairs, of names to numpy arrays, int, float, bool, str,
    bytes, lists or tuples of str, dicts and ckpt.Object) as checkpoint `path`, atomically:
    into a temporary beside it, fsynced, renamed over `path`, the directory fsynced. A crash
    leaves the old file or the new one, whole.

    `archive`: "binary", "text" or "xml". `zstd`: a compression level (1 .. 22), or None.
    `key`: encrypt with AES-256-GCM (a ckpt.Key, 32 bytes or a key file's path). `epoch` and
    `step` go into the header. `overwrite=False` refuses to replace an existing file.
    `metrics` (names to finite numbers, e.g. {"val_loss": 0.31}) are recorded as the C++
    manager records them (`__ckpt.metric.{name}`), for best(), `ckpt ls --best` and KeepBest.
    An array in Fortran order (F-contiguous, not C-contiguous, rank 2 or more) is saved
    column-major as it lies, without a copy (docs/FORMAT.md section 3.1); other arrays that are
    not C-contiguous are copied into C order.

    A dict is saved as a value map (an object, docs/FORMAT.md section 3): str keys to bool,
    int (int64), float (float64), NumPy scalars (numbers of their dtype), str and 1-d arrays
    (vectors), its type "map<string, V>" with V what all its values are (float64, string,
    vector<int32>, ...) or "any". A ckpt.Object is saved as it is.

    For the same entries, position and options the file holds the bytes the C++ library
    writes, but for the save time (and the salt and ciphertext of an encrypted body).

    A binary body without codecs is written as format version 3: its table of contents holds
    the checksum of each `chunk_bytes` piece of each array (a power of two from 4 KiB to 1 GiB),
    so that open() reads and verifies one entry alone. `chunk_bytes=0` writes a version 1 file,
    which readers before version 3 read."""
    if isinstance(path, Mapping) and isinstance(entries, (str, bytes, os.PathLike)):
        raise ConfigError("save(path, entries) takes the path first, then the entries (C++ save_checkpoint takes the "
                          "state first); got the entries, then '%s'" % os.fspath(entries))
    path = _fspath(path)
    if archive not in F.ARCHIVES:
        raise ConfigError("archive is one of %s, not %r" % (", ".join(F.ARCHIVES), archive), path)
    if zstd is not None and (type(zstd) is not int or zstd == 0 or not -(1 << 17) <= zstd <= 22):
        raise ConfigError("zstd is a compression level in -131072 .. 22 other than 0, or None; got %r" % (zstd,), path)
    position = []
    for what, v in (("epoch", epoch), ("step", step)):
        # any integer type (np.int64 too) but bool, which is no position
        if not isinstance(v, numbers.Integral) or isinstance(v, (bool, np.bool_)) or not 0 <= v < 1 << 63:
            raise ConfigError("%s is a non-negative int, not %r" % (what, v), path)
        position.append(int(v))
    epoch, step = position
    key = C.as_key(key)
    items = _normalize(entries, path) + _metric_entries(metrics, path)
    codecs = (["zstd"] if zstd is not None else []) + (["aes-256-gcm"] if key is not None else [])
    if type(chunk_bytes) is not int or (chunk_bytes and not F.valid_chunk_bytes(chunk_bytes)):
        raise ConfigError("chunk_bytes is a power of two from %d to %d, or 0 for a version 1 file; got %r"
                          % (F.MIN_CHUNK_BYTES, F.MAX_CHUNK_BYTES, chunk_bytes), path)
    chunked = archive == "binary" and not codecs and chunk_bytes != 0
    prefix56 = F.header_prefix(archive, codecs, epoch, step, time.time_ns(), chunked)
    if chunked:
        pieces = F.binary_writes(items, path, chunk_bytes)
    else:
        pieces = F.WRITERS[archive](items, path)
    if zstd is not None:
        pieces = C.zstd_encode(C.zstd_blocks(pieces), zstd)
    else:
        pieces = [data for data, _ in pieces]
    if key is not None:
        pieces = C.aes_encode(pieces, key, prefix56)
    directory = os.path.dirname(path) or "."
    prefix = series_of(os.path.basename(path)) if isinstance(path, str) else None
    lock = _series.SeriesLock(directory, prefix) if prefix else None
    held = lock.acquire() if lock else False  # SeriesLocked when another writes the series
    try:
        _series.remove_temporaries(directory, prefix if held else None)
        _write_file(path, directory, prefix56, pieces, overwrite)
    finally:
        if lock:
            lock.release()
    return path


_TEMPORARY_TRIES = 16    # names tried for a temporary before a save gives up


def _create_temporary(path, directory):
    """A new temporary beside `path` (docs/FORMAT.md section 12.3), opened for writing: (name,
    fd). A name that exists (another user may create names in a shared directory, a symlink
    among them) is never opened: O_EXCL|O_NOFOLLOW refuses it, and the next name tried is a
    random one, which nobody can have made ready, a bounded number of times."""
    base = os.path.basename(path)
    for attempt in range(_TEMPORARY_TRIES):
        n = next(_sequence) if attempt == 0 else secrets.randbelow(10 ** 18)
        temp = os.path.join(directory, ".%s.tmp-%d-%d" % (base, os.getpid(), n))
        try:
            return temp, os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno not in (_errno.EEXIST, _errno.ELOOP):
                raise _io_error("create a temporary for", path, e) from None
            if attempt == 0:
                log.warning("the temporary '%s' for '%s' exists already (made by another): writing under a random "
                            "name instead", printable(temp), printable(path))
    raise IoError("cannot create a temporary for '%s': %d names tried in '%s' exist already (another user may be "
                  "making them); nothing written" % (path, _TEMPORARY_TRIES, directory), path, _errno.EEXIST)


def _write_file(path, directory, prefix56, pieces, overwrite):
    """The atomic commit: a temporary beside `path`, fsync, rename, fsync of the directory.
    The rename replaces whatever is at `path` (a symlink there is replaced, never followed)."""
    temp, fd = _create_temporary(path, directory)
    try:
        try:
            hasher = xxhash.xxh3_64()
            length = 0
            _write_all(fd, bytes(F.HEADER_SIZE), path)
            for data in pieces:
                hasher.update(data)
                _write_all(fd, data, path)
                length += len(memoryview(data).cast("B"))
            os.pwrite(fd, F.finish_header(prefix56, length, hasher.intdigest()), 0)
            os.fsync(fd)
        except OSError as e:
            raise _io_error("write", path, e) from None
        finally:
            os.close(fd)
        try:
            if overwrite:
                os.replace(temp, path)
            else:
                os.link(temp, path)
                os.unlink(temp)
        except OSError as e:
            if e.errno == _errno.EEXIST:
                raise IoError("checkpoint '%s' exists and overwrite=False: not replaced" % path, path, e.errno) from None
            raise _io_error("rename a temporary to", path, e) from None
        _fsync_dir(directory, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
