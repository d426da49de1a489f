"""ckpt: read, write and check ckpt checkpoint files from Python, on NumPy.

    import ckpt
    state = ckpt.load("runs/lenet-3_1875.ckpt")          # {name: np.ndarray | int | float | bool | str | ...}
    state["fc3.weight"] = state["fc3.weight"] * 0.5
    ckpt.save("runs/lenet-4_0.ckpt", state, epoch=4, step=0)
    ckpt.latest("runs", "lenet")                        # the newest checkpoint that verifies

The files are those of the C++ library (docs/FORMAT.md): either side reads what the other
writes. Compressed bodies need the `zstandard` module, encrypted ones `cryptography`.
"""

from .errors import (AuthenticationError, ChecksumError, ConfigError, Error, FormatError, IoError, KeyError,
                     LoadMismatch, OutOfMemory, SeriesLocked, UnreadableCheckpoints, VersionError)
from .codecs import Key
from ._format import Header, Object, bit_pattern_dtype, dtype_name
from ._io import EntryInfo, LoadReport, Reader, contents, header, load, load_into, open, save, verify
from ._files import Listed, Skipped, Temporary, best, latest, ls, temporaries

__version__ = "0.2.0"

__all__ = ["load", "load_into", "save", "open", "Reader", "header", "verify", "contents", "latest", "best", "ls", "temporaries", "Key",
           "dtype_name", "bit_pattern_dtype", "Header", "Object", "EntryInfo", "LoadReport", "Listed", "Skipped",
           "Temporary", "Error", "IoError", "FormatError", "ChecksumError", "AuthenticationError", "VersionError",
           "KeyError", "OutOfMemory", "LoadMismatch", "UnreadableCheckpoints", "ConfigError", "SeriesLocked"]
