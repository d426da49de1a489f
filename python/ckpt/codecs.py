"""Body codecs of format version 2 (docs/FORMAT.md section 9): zstd blocks and AES-256-GCM
segments, and the key files the `ckpt` tool takes. The writers make the same choices as the
C++ library's, so that a file compressed here holds the bytes the C++ library writes."""

import math
import os
import struct

from .errors import ConfigError, FormatError, AuthenticationError, KeyError as CkptKeyError, IoError, OutOfMemory

ZSTD, AES_256_GCM = 1, 2
CODEC_NAMES = {ZSTD: "zstd", AES_256_GCM: "aes-256-gcm"}

BLOCK_SIZE = 1 << 20          # zstd blocks and AES-GCM segments the writer makes
PROBE_SIZE = 16 << 10         # a block of at least 2 probes is compressed only if its first probe shrinks 2%
AES_PREFIX_SIZE = 64
AES_TAG_SIZE = 16
MAX_SEGMENT_SIZE = 1 << 30
KEY_SIZE = 32

# What a body may decode to unless the caller says otherwise: the larger of a floor, which
# every small file fits, and a multiple of the stored body, above what real states compress
# to (float weights barely shrink, zero-filled optimizer moments shrink most). A crafted file
# of n bytes then takes at most max(256 MiB, 64 n) however much its blocks claim.
DEFAULT_DECODED_FLOOR = 256 << 20
DEFAULT_DECODED_RATIO = 64


class MissingModule(ConfigError):
    """A codec's Python module is not installed: the file may be whole, this Python cannot
    read it."""


def _need(module, package):
    try:
        return __import__(module)
    except ImportError as e:
        raise MissingModule("this checkpoint needs the Python module '%s' (Debian: apt-get install %s)"
                            % (module, package)) from e


# --------------------------------------------------------------------------- keys

class Key:
    """A 256-bit AES key. Its bytes are never printed; `id` names it (section 9.3)."""

    __slots__ = ("_raw",)

    def __init__(self, raw):
        raw = bytes(raw)
        if len(raw) != KEY_SIZE:
            raise ConfigError("a key holds %d bytes, not %d" % (KEY_SIZE, len(raw)))
        self._raw = raw

    @classmethod
    def from_hex(cls, text):
        """A key given as 64 hexadecimal digits."""
        if not _is_hex_key(text):
            raise ConfigError("a key in hexadecimal is %d hexadecimal digits; the string given has %d characters, %d "
                              "of them not hexadecimal digits (not printed: it may hold key digits)"
                              % (2 * KEY_SIZE, len(text), sum(c not in _HEX for c in text)))
        return cls(bytes.fromhex(text))

    @classmethod
    def from_file(cls, path):
        """A key file as the `ckpt` tool reads it: 32 raw bytes, or 64 hexadecimal digits
        and an optional line end."""
        path = os.path.expanduser(os.fspath(path))
        # a name that looks like key digits (a key in hex mistyped) is never printed
        shown, where = ("'%s'" % path, path) if not _may_be_key(path) else (
            "named by a string of %d characters (not printed: it looks like key digits, and a key in hexadecimal is "
            "exactly %d of them)" % (len(path), 2 * KEY_SIZE), None)
        failed = None
        try:
            with open(path, "rb") as f:
                data = f.read(2 * KEY_SIZE + 3)
        except OSError as e:
            failed = e.errno, e.strerror
        if failed:  # raised out of the handler: the OSError, which holds the name, is not chained
            raise IoError("cannot read key file %s: %s" % (shown, failed[1]), where, failed[0])
        digits = data.rstrip(b"\r\n")
        if len(digits) == 2 * KEY_SIZE and all(c in b"0123456789abcdefABCDEF" for c in digits):
            return cls(bytes.fromhex(digits.decode("ascii")))
        if len(data) == KEY_SIZE:
            return cls(data)
        raise ConfigError("key file %s holds %s%d bytes; expected %d raw bytes or %d hexadecimal digits"
                          % (shown, "more than " if len(data) == 2 * KEY_SIZE + 3 else "", len(data), KEY_SIZE,
                             2 * KEY_SIZE), where)

    @classmethod
    def random(cls):
        return cls(os.urandom(KEY_SIZE))

    @property
    def id(self):
        """The 8-byte key id: HKDF-SHA256(key, empty salt, "ckpt key id")."""
        return _hkdf(self._raw, None, b"ckpt key id", 8)

    def raw(self):
        return self._raw

    def __repr__(self):
        return "ckpt.Key(id=%s)" % self.id.hex()


_HEX = frozenset("0123456789abcdefABCDEF")


def _is_hex_key(text):
    return isinstance(text, str) and len(text) == 2 * KEY_SIZE and all(c in _HEX for c in text)


def _may_be_key(path):
    """Whether a key file's path could be key digits mistyped: no directory part, and half a
    key's digits or more."""
    return isinstance(path, str) and "/" not in path and sum(c in _HEX for c in path) >= KEY_SIZE


def as_key(key):
    """None, a Key, 32 bytes, a str of exactly 64 hexadecimal digits (the key itself, never
    taken for a path), or the path of a key file (any other str or path-like)."""
    if key is None or isinstance(key, Key):
        return key
    if isinstance(key, (bytes, bytearray, memoryview)):
        return Key(key)
    if _is_hex_key(key):
        return Key.from_hex(key)
    if isinstance(key, (str, os.PathLike)):
        return Key.from_file(key)
    raise ConfigError("a key is 32 bytes, 64 hexadecimal digits, a key file's path or a ckpt.Key, not %s"
                      % type(key).__name__)


def _hkdf(key, salt, info, length):
    _need("cryptography", "python3-cryptography")
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(key)


# --------------------------------------------------------------------------- the budget

class Budget:
    """What a stored body of `stored` bytes may decode to: `limit` bytes (None: no limit)."""

    __slots__ = ("limit", "stored", "default")

    def __init__(self, limit, stored, default):
        self.limit, self.stored, self.default = limit, stored, default

    def check(self, size, path):
        """A FormatError when `size` bytes of output would exceed the budget."""
        if self.limit is not None and size > self.limit:
            raise over_budget(path, self.limit, self.stored, self.default)


def decoded_budget(max_decoded_bytes, stored_bytes):
    """The Budget of a stored body of `stored_bytes`: the default rule for None, no limit for
    math.inf, else `max_decoded_bytes` itself (a non-negative int)."""
    if max_decoded_bytes is None:
        return Budget(max(DEFAULT_DECODED_FLOOR, DEFAULT_DECODED_RATIO * stored_bytes), stored_bytes, True)
    if max_decoded_bytes == math.inf:
        return Budget(None, stored_bytes, False)
    if isinstance(max_decoded_bytes, bool) or not isinstance(max_decoded_bytes, int) or max_decoded_bytes < 0:
        raise ConfigError("max_decoded_bytes is a number of bytes (an int >= 0), None for the default (the larger of "
                          "%d bytes and %d times the stored body) or math.inf for no limit; got %r"
                          % (DEFAULT_DECODED_FLOOR, DEFAULT_DECODED_RATIO, max_decoded_bytes))
    return Budget(max_decoded_bytes, stored_bytes, False)


def over_budget(path, budget, stored_bytes, default):
    """The FormatError of a body that would decode to more than `budget` bytes; `default`:
    whether the budget is the default rule's."""
    why = ("the default max_decoded_bytes: the larger of %d bytes and %d times its %d stored bytes; pass a larger "
           "max_decoded_bytes for a file you trust" % (DEFAULT_DECODED_FLOOR, DEFAULT_DECODED_RATIO, stored_bytes)
           if default else "max_decoded_bytes")
    e = FormatError("checkpoint '%s' decodes to more than %d bytes (%s): refused before decoding"
                    % (path, budget, why), path)
    e.over_budget = True  # not damage: a file this reader was told not to decode (latest() stops at it)
    return e


def allocate(size, path, what):
    """A uint8 array of `size` bytes, or OutOfMemory naming the file when it cannot be allocated
    (NumPy's own MemoryError never reaches the caller)."""
    import numpy as np
    try:
        return np.empty(size, dtype=np.uint8)
    except MemoryError:
        raise OutOfMemory("checkpoint '%s' decodes to %d bytes (%s), more memory than this process could get; a "
                          "max_decoded_bytes below it refuses the file first" % (path, size, what), path) from None


# --------------------------------------------------------------------------- zstd

def zstd_blocks(writes):
    """Cuts the archive's bytes into blocks where the C++ writer cuts them. `writes` are the
    archive's writes in order, as (bytes-like, direct): a direct write is one the C++ writer
    hands on straight from memory (a write larger than its 64 KiB stream buffer has room for);
    a direct write of at least a block begins a new block. Yields memoryviews."""
    staged = bytearray()
    for data, direct in writes:
        data = memoryview(data).cast("B")
        n = len(data)
        if direct and n >= BLOCK_SIZE:
            if staged:
                yield memoryview(bytes(staged))
                staged = bytearray()
            whole = n - n % BLOCK_SIZE
            for at in range(0, whole, BLOCK_SIZE):
                yield data[at:at + BLOCK_SIZE]
            staged += data[whole:]
            continue
        at = 0
        while at < n:
            take = min(n - at, BLOCK_SIZE - len(staged))
            staged += data[at:at + take]
            at += take
            if len(staged) == BLOCK_SIZE:
                yield memoryview(bytes(staged))
                staged = bytearray()
    if staged:
        yield memoryview(bytes(staged))


def zstd_encode(blocks, level):
    """Section 9.2's stored form of `blocks`, as a list of byte strings."""
    zstandard = _need("zstandard", "python3-zstandard")
    cctx = zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True)
    out = []
    for block in blocks:
        n = len(block)
        frame = None
        if n < 2 * PROBE_SIZE or len(cctx.compress(block[:PROBE_SIZE])) < PROBE_SIZE - PROBE_SIZE // 50:
            frame = cctx.compress(block)
            if len(frame) >= n:
                frame = None
        if frame is None:
            out.append(struct.pack("<II", n, n))
            out.append(block)
        else:
            out.append(struct.pack("<II", n, len(frame)))
            out.append(frame)
    return out


def zstd_decode(stored, path, budget=None):
    """Undoes section 9.2: checks every block header first, then decompresses into one
    buffer of the decoded size (a numpy uint8 array, so that payloads stay aligned). `budget`
    (a Budget; None: no limit) is checked as the blocks' claims add up, before anything is
    allocated."""
    import numpy as np
    zstandard = _need("zstandard", "python3-zstandard")
    stored = memoryview(stored).cast("B")
    blocks, total, at = [], 0, 0

    def malformed(offset, why):
        return FormatError("checkpoint '%s' has a malformed zstd body: at byte %d of the stored body, %s"
                           % (path, offset, why), path)

    while at < len(stored):
        if len(stored) - at < 8:
            raise malformed(at, "%d bytes where a block header of 8 is expected" % (len(stored) - at))
        plain, kept = struct.unpack_from("<II", stored, at)
        if plain == 0 or plain > BLOCK_SIZE:
            raise malformed(at, "a block of %d bytes (1 .. %d)" % (plain, BLOCK_SIZE))
        if kept > plain:
            raise malformed(at, "a block stored in %d bytes, more than its %d" % (kept, plain))
        if len(stored) - at - 8 < kept:
            raise malformed(at, "a block of %d stored bytes, %d left" % (kept, len(stored) - at - 8))
        if kept < plain:
            try:
                declared = zstandard.frame_content_size(stored[at + 8:at + 8 + kept])
            except zstandard.ZstdError:
                declared = -1
            if declared != plain:
                raise malformed(at, "a zstd frame that does not declare the block's %d bytes" % plain)
        total += plain
        if budget is not None:
            budget.check(total, path)
        blocks.append((at + 8, plain, kept))
        at += 8 + kept
    out = allocate(total, path, "the sum of its zstd blocks")
    dctx = zstandard.ZstdDecompressor()
    pos = 0
    for (start, plain, kept) in blocks:
        src = stored[start:start + kept]
        if kept == plain:
            out[pos:pos + plain] = np.frombuffer(src, dtype=np.uint8)
        else:
            try:
                frame = dctx.decompressobj()
                got = frame.decompress(src)
            except zstandard.ZstdError as e:
                raise malformed(start - 8, "zstd says: %s" % e) from None
            if not frame.eof or frame.unused_data:  # the stored bytes are one whole frame
                raise malformed(start - 8, "%d stored bytes after its zstd frame" % len(frame.unused_data)
                                if frame.eof else "a zstd frame cut short")
            if len(got) != plain:
                raise malformed(start - 8, "a frame that decompresses to %d bytes, not %d" % (len(got), plain))
            out[pos:pos + plain] = np.frombuffer(got, dtype=np.uint8)
        pos += plain
    return out


# --------------------------------------------------------------------------- AES-256-GCM

def _aad(header56, prefix):
    return bytes(header56[:16]) + bytes(16) + bytes(header56[32:56]) + bytes(prefix)


def _nonce(i, last):
    return struct.pack("<QB3x", i, 1 if last else 0)


def aes_encode(plain, key, header56):
    """Section 9.3's stored form of `plain` (a list of byte strings, in order), under `key`,
    authenticating `header56` (the header's first 56 bytes; 16 to 31 are left out)."""
    _need("cryptography", "python3-cryptography")
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    salt = os.urandom(16)
    prefix = key.id + salt + struct.pack("<I", BLOCK_SIZE) + bytes(36)
    aead = AESGCM(_hkdf(key.raw(), salt, b"ckpt aes-256-gcm body", 32))
    aad = _aad(header56, prefix)
    data = b"".join(plain)  # (join takes memoryviews: no copy of each piece first)
    count = max(1, -(-len(data) // BLOCK_SIZE))
    out = [prefix]
    for i in range(count):
        out.append(aead.encrypt(_nonce(i, i == count - 1), data[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE], aad))
    return out


def aes_decode(stored, key, header56, path, budget=None):
    """Undoes section 9.3, checking as its table says; nothing of the plaintext is returned
    unless every tag matched. The plaintext is shorter than `stored`; it is held to `budget`
    all the same (a caller's own limit may be lower)."""
    import numpy as np
    stored = memoryview(stored).cast("B")
    if len(stored) < AES_PREFIX_SIZE + AES_TAG_SIZE:
        raise FormatError("checkpoint '%s' has a malformed aes-256-gcm body: %d bytes, fewer than its prefix and a tag"
                          % (path, len(stored)), path)
    prefix = bytes(stored[:AES_PREFIX_SIZE])
    if any(prefix[28:]):
        raise FormatError("checkpoint '%s' has a malformed aes-256-gcm body: reserved prefix bytes are not zero" % path,
                          path)
    seg = struct.unpack_from("<I", prefix, 24)[0]
    if seg == 0 or seg > MAX_SEGMENT_SIZE:
        raise FormatError("checkpoint '%s' has a malformed aes-256-gcm body: segment size %d (1 .. 2^30)"
                          % (path, seg), path)
    if key is None:
        raise CkptKeyError("checkpoint '%s' is encrypted (aes-256-gcm, key id %s): pass its key"
                           % (path, prefix[:8].hex()), path)
    if prefix[:8] != key.id:
        raise CkptKeyError("checkpoint '%s' was encrypted with key id %s, not with the key given (key id %s)"
                           % (path, prefix[:8].hex(), key.id.hex()), path)
    body = len(stored) - AES_PREFIX_SIZE
    rest = body % (seg + AES_TAG_SIZE)
    if rest != 0 and rest < AES_TAG_SIZE:
        raise FormatError("checkpoint '%s' has a malformed aes-256-gcm body: its last segment is shorter than a tag"
                          % path, path)
    count = -(-body // (seg + AES_TAG_SIZE))
    if budget is not None:
        budget.check(body - AES_TAG_SIZE * count, path)
    _need("cryptography", "python3-cryptography")
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    aead = AESGCM(_hkdf(key.raw(), prefix[8:24], b"ckpt aes-256-gcm body", 32))
    aad = _aad(header56, prefix)
    out = allocate(body - AES_TAG_SIZE * count, path, "its aes-256-gcm plaintext")
    at, pos = AES_PREFIX_SIZE, 0
    for i in range(count):
        n = min(seg + AES_TAG_SIZE, len(stored) - at)
        try:
            plain = aead.decrypt(_nonce(i, i == count - 1), bytes(stored[at:at + n]), aad)
        except InvalidTag:
            out.fill(0)
            raise AuthenticationError("checkpoint '%s' fails authentication in segment %d of %d: its body or header "
                                      "was altered after it was written" % (path, i + 1, count), path) from None
        out[pos:pos + len(plain)] = np.frombuffer(plain, dtype=np.uint8)
        at += n
        pos += len(plain)
    return out
