"""The files of a series beside its checkpoints (docs/FORMAT.md section 12): the lock that
leaves a (directory, prefix) to one writer at a time, and the temporaries writers leave
behind when they are killed."""

import errno
import fcntl
import logging
import os
import re
import socket
import stat
import time
from dataclasses import dataclass

from ._names import series_of
from .errors import IoError, SeriesLocked, printable

__all__ = ["SeriesLock", "Temporary", "temporaries", "remove_temporaries"]

log = logging.getLogger("ckpt")

_WAIT = 0.2                 # how long a refused lock is asked for again, in seconds
_RETRY = 0.01               # and how often
_READ = 4096                # what a reader takes of a lock file
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
_STARTED = re.compile(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)Z")


def read_holder(text):
    """The `key value` lines of a lock file's text (section 12.1) as a dict; lines without a
    space are ignored."""
    out = {}
    for line in text.split("\n"):
        key, space, value = line.partition(" ")
        if space and key not in out:
            out[key] = value
    return out


def describe_holder(holder):
    """"pid N on host H since YYYY-MM-DD HH:MM:SS UTC", from what a lock file says."""
    if "pid" not in holder:
        return None
    text = "pid %s" % holder["pid"]
    if "host" in holder:
        text += " on host %s" % holder["host"]
    if "started" in holder:
        m = _STARTED.fullmatch(holder["started"])
        text += " since %s" % ("%s %s UTC" % m.groups() if m else holder["started"])
    return text


class SeriesLock:
    """The exclusive flock(2) lock on `{directory}/{prefix}.lock` (section 12.1). Each
    SeriesLock opens the file itself, so that two in one process (two threads) exclude each
    other as two processes do."""

    def __init__(self, directory, prefix):
        self.directory, self.prefix = directory, prefix
        self.path = os.path.join(directory, prefix + ".lock")
        self.fd = -1
        self.writable = False

    def _where(self):
        return "prefix '%s' in '%s'" % (self.prefix, self.directory)

    def _open(self):
        # O_NOFOLLOW: a symlink planted under the lock's name (a shared directory) would have the
        # writer truncate and write whatever file it points to
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            self.writable = True
            return True
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise IoError("the lock file '%s' of %s is a symbolic link, which a writer never follows: remove it "
                              "(it is not ckpt's)" % (self.path, self._where()), self.path, e.errno) from None
            if e.errno == errno.ENOENT and not os.path.isdir(self.directory):
                raise IoError("cannot write %s: the directory '%s' does not exist" % (self._where(), self.directory),
                              self.directory, errno.ENOENT) from None
            if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise IoError("cannot open the lock file '%s' of %s: %s" % (self.path, self._where(), e.strerror),
                              self.path, e.errno) from None
        # a directory this writer cannot write to: the lock file read-only when there is one
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            return True
        except OSError:
            return False

    def acquire(self):
        """Takes the lock, or raises SeriesLocked naming its holder. False when the series is
        left unlocked (a read-only directory without a lock file, a file system without
        flock); True when held."""
        if not self._open():
            return False
        try:
            return self._take()
        except BaseException:  # (an interrupt while it waits too): the file is not left open
            self._close()
            raise

    def _take(self):
        deadline = time.monotonic() + _WAIT
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self._holder()
                    self._close()
                    who = describe_holder(holder)
                    raise SeriesLocked("%s is held by %s" % (self._where(), who or "another writer (its lock file "
                                                              "'%s' names no holder yet)" % self.path),
                                       self.path, holder) from None
                time.sleep(_RETRY)
            except OSError as e:
                self._close()
                if e.errno in _UNSUPPORTED:
                    log.warning("%s is written without a lock: the file system of '%s' does not support flock (%s)",
                                printable(self._where()), printable(self.directory), e.strerror)
                    return False
                raise IoError("cannot lock '%s' for %s: %s" % (self.path, self._where(), e.strerror), self.path,
                              e.errno) from None
        who = describe_holder(self._holder())
        if who:  # a holder that ended without releasing the lock: it was killed
            log.warning("%s: taking the series over from %s, which ended without releasing its lock",
                        printable(self._where()), printable(who))
        if self.writable:
            lines = "ckpt-lock 1\npid %d\nhost %s\nstarted %s\n" % (
                os.getpid(), socket.gethostname(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            try:
                os.ftruncate(self.fd, 0)
                os.pwrite(self.fd, lines.encode("utf-8", "surrogateescape"), 0)
            except OSError as e:
                self._close()
                raise IoError("cannot write the lock file '%s' of %s: %s" % (self.path, self._where(), e.strerror),
                              self.path, e.errno) from None
        return True

    def _holder(self):
        try:
            raw = os.pread(self.fd, _READ, 0)
        except OSError:
            return {}
        return read_holder(raw.decode("utf-8", "surrogateescape"))

    def _close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def release(self):
        """A clean end: the file cut to nothing, then closed (which releases the lock). The
        file itself stays (section 12.1)."""
        if self.fd < 0:
            return
        if self.writable:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass  # the lock goes with the close all the same
        self._close()


# --------------------------------------------------------------------------- temporaries

_TEMP = re.compile(r"\.(.+)\.tmp-([0-9]{1,18})-([0-9]{1,18})", re.S)


@dataclass(frozen=True)
class Temporary:
    """A file a writer writes before renaming it to its final name (section 12.3): left behind
    when the writer was killed, unless it is being written (`writer_alive`: its pid is a live
    process on this host)."""
    path: str
    pid: int
    size: int
    writer_alive: bool


def pid_alive(pid):
    """Whether `pid` is a live process here (not an exited one)."""
    if pid <= 0 or pid >= 1 << 22:  # (no such pid: Linux's pid_max is at most 2^22)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


def _temporaries(directory, quiet=False):
    """(Temporary, final name) of each temporary in `directory`; none when it cannot be listed
    and `quiet`."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as e:
        if quiet:
            return []
        raise IoError("cannot list '%s': %s" % (directory, e.strerror), directory, e.errno) from None
    out = []
    for n in names:
        m = _TEMP.fullmatch(n)
        if not m:
            continue
        path = os.path.join(directory, n)
        try:
            st = os.lstat(path)
        except OSError:
            continue  # renamed or removed meanwhile
        if stat.S_ISREG(st.st_mode):
            pid = int(m.group(2))
            out.append((Temporary(path, pid, st.st_size, pid_alive(pid)), m.group(1)))
    return out


def temporaries(directory):
    """The temporaries ckpt writers left in `directory` (".{name}.tmp-{pid}-{n}"), in name
    order, each with its writer's pid, its size, and whether that writer is a live process."""
    return [t for t, _ in _temporaries(directory)]


def remove_temporaries(directory, prefix=None):
    """What a writer removes before it writes (section 12.3): every temporary of the series of
    `prefix`, whose lock the caller holds (no other writer of the series can be writing them),
    and any temporary whose writer is no live process. Each removal is logged (INFO)."""
    for t, final in _temporaries(directory, quiet=True):  # (a save that cannot list it reports why when it writes)
        ours = prefix is not None and series_of(final) == prefix
        if not ours and t.writer_alive:
            continue
        try:
            os.unlink(t.path)
        except FileNotFoundError:
            continue
        except OSError as e:
            log.warning("cannot remove the temporary '%s' left by pid %d: %s", printable(t.path), t.pid, e.strerror)
            continue
        log.info("removed the temporary '%s' (%d bytes) left by pid %d, %s", printable(t.path), t.size, t.pid,
                 "which is no live process" if not t.writer_alive
                 else "not writing it: this save holds the lock of prefix '%s'" % printable(prefix))
