"""The exceptions ckpt raises, the same tree as the C++ library's (include/ckpt/error.hpp).

    Error                       anything ckpt raises
    ├── IoError                 open/read/write/fsync/rename failed (also an OSError)
    ├── FormatError             not a checkpoint, truncated, malformed body
    │   ├── ChecksumError       header check or body checksum does not match
    │   │   └── AuthenticationError  an encrypted body fails its authentication tag
    │   └── VersionError        a format version (archive kind, codec, dtype) this reader does not know
    ├── KeyError                an encrypted file and no key, or another key than its own
    ├── LoadMismatch            load_into found missing, unexpected or mismatched tensors
    ├── UnreadableCheckpoints   latest()/best() found checkpoints, but none it may use
    └── ConfigError             invalid arguments or values that cannot be saved
        └── SeriesLocked        another writer holds the series' lock (docs/FORMAT.md 12.1)

Every message names the file (and the entry, key id or rank) and what was expected, and is
printable whatever bytes a damaged or hostile file put in it.
"""

import errno as _errno

__all__ = ["Error", "IoError", "FormatError", "ChecksumError", "AuthenticationError", "VersionError",
           "KeyError", "LoadMismatch", "UnreadableCheckpoints", "ConfigError", "SeriesLocked", "printable"]


def printable(text):
    """`text` safe to print: control characters (C0 but newline and tab, DEL, C1) and
    undecodable bytes become \\xNN, as ckpt::detail::printable does in C++."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "surrogateescape")
    out = []
    for ch in text:
        cp = ord(ch)
        if 0xDC80 <= cp <= 0xDCFF:  # an undecodable byte, kept by surrogateescape
            out.append("\\x%02x" % (cp - 0xDC00))
        elif (cp < 0x20 and ch not in "\n\t") or cp == 0x7F:
            out.append("\\x%02x" % cp)
        elif 0x80 <= cp <= 0x9F:
            out.extend("\\x%02x" % b for b in ch.encode("utf-8"))
        elif 0xD800 <= cp <= 0xDFFF:
            out.append("\\x%02x" % (cp & 0xFF))
        else:
            out.append(ch)
    return "".join(out)


class Error(Exception):
    """Anything ckpt raises. `path` is the file concerned, or None."""

    def __init__(self, message, path=None):
        super().__init__(printable(message))
        self.path = None if path is None else str(path)


class IoError(Error, OSError):
    """An operating-system call failed; `errno` says which error."""

    def __init__(self, message, path=None, err=0):
        Error.__init__(self, message, path)
        self.errno = err
        self.strerror = _errno.errorcode.get(err, "")

    def __str__(self):
        return self.args[0]


class FormatError(Error):
    """Not a checkpoint, or one that breaks docs/FORMAT.md."""


class ChecksumError(FormatError):
    """A checksum does not match: the file is damaged."""


class AuthenticationError(ChecksumError):
    """The stored bytes match their checksum and the key is the file's own, yet the body or
    the header fails authentication: altered after it was written."""


class VersionError(FormatError):
    """A format version this reader does not know, or in an intact file an archive kind, a
    codec or a dtype code it does not know: written by a newer ckpt, not damaged."""


class KeyError(Error):  # noqa: A001 -- mirrors ckpt::KeyError; not a lookup failure
    """An encrypted file read without a key, or with another key than its own. Messages name
    key ids, never key bytes."""


class OutOfMemory(Error, MemoryError):
    """Reading a file needed memory this process could not get: the file may be whole. A
    file's claims are checked against its size before anything is allocated, so this is the
    machine's shortage, not the file's damage."""


class LoadMismatch(Error):
    """load_into() found tensors missing, unexpected, or of another dtype or shape."""


class ConfigError(Error, ValueError):
    """Invalid arguments, or values a checkpoint cannot hold."""


class UnreadableCheckpoints(Error):
    """latest() or best() found checkpoints of the prefix but may use none of them: the newest
    is intact yet this reader cannot read it (a newer format version, no key, a missing
    module), or every one is damaged. Not the same answer as "no checkpoint": a job that
    started over here would lose its state. `files` lists each file (path, reason);
    `directory` and `prefix` name the series. fall_back=True passes over such files instead."""

    def __init__(self, message, path=None, files=(), directory=None, prefix=None):
        super().__init__(message, path)
        self.files = list(files)
        self.directory = directory
        self.prefix = prefix


class SeriesLocked(ConfigError):
    """Another writer (a process, or another thread's save) holds the lock of the series
    (directory, prefix). `holder` is what its lock file says: a dict with "pid", "host" and
    "started" when it names them."""

    def __init__(self, message, path=None, holder=None):
        super().__init__(message, path)
        self.holder = dict(holder or {})
