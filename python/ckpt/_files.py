"""Finding checkpoints in a directory, as the C++ library's latest(), best() and `ckpt ls`
do: by the run, epoch and step in their names, confirmed by their headers, verified by their
checksums; never by file times."""

import logging
import math
import os
from dataclasses import dataclass, field

from . import _format as F
from ._io import _Opened, contents, header, verify
from .errors import ConfigError, Error, IoError

__all__ = ["latest", "best", "ls", "Listed", "Skipped"]

log = logging.getLogger("ckpt")

_TEMP_MARKER = ".tmp-"


@dataclass
class _Name:
    run_prefix: str
    run: int
    epoch: int
    step: int
    global_step: int      # -1 unless the name carries it (StepNaming)
    breakpoint: bool
    epoch_in_name: bool


def _count(s):
    if not s or len(s) > 18 or not s.isascii() or not s.isdigit():
        return None
    return int(s)


def _parse_name(base, name):
    """MindSporeNaming's "{base}[_{run}]-{epoch}_{step}.ckpt", else StepNaming's
    "{base}[_{run}]-{global_step}.ckpt" ("_breakpoint.ckpt" for exception saves)."""
    if not name.startswith(base):
        return None
    rest = name[len(base):]
    if rest.startswith("-"):
        run, rest = 0, rest[1:]
    elif rest.startswith("_"):
        dash = rest.find("-")
        run = _count(rest[1:dash]) if dash > 0 else None
        if not run:
            return None
        rest = rest[dash + 1:]
    else:
        return None
    breakpoint = rest.endswith("_breakpoint.ckpt")
    if breakpoint:
        rest = rest[:-len("_breakpoint.ckpt")]
    elif rest.endswith(".ckpt"):
        rest = rest[:-len(".ckpt")]
    else:
        return None
    run_prefix = base if run == 0 else "%s_%d" % (base, run)
    epoch, _, step = rest.partition("_")
    if _ and _count(epoch) is not None and _count(step) is not None:
        return _Name(run_prefix, run, _count(epoch), _count(step), -1, breakpoint, True)
    if _count(rest) is not None:
        return _Name(run_prefix, run, 1, _count(rest), _count(rest), breakpoint, False)
    return None


def _names(directory):
    try:
        listed = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise IoError("checkpoint directory '%s' is not a directory" % directory, directory, 20) from None
    except OSError as e:
        raise IoError("cannot list '%s': %s" % (directory, e.strerror), directory, e.errno) from None
    return [n for n in listed if not (n.startswith(".") and _TEMP_MARKER in n)
            and os.path.isfile(os.path.join(directory, n))]


@dataclass
class _File:
    path: str
    name: _Name
    header: F.Header = None


def _owner(path):
    """The owner record (prefix, run, follows_run) of a file whose body has no codecs, read from
    its table of contents without verifying it; None when it has none or cannot be read."""
    try:
        with _Opened(path) as opened:
            if opened.header.codecs:
                return None
            entries = opened.table()
    except Error:
        return None
    return _owner_in({e.name: e.value for e in entries if e.kind == F.STRING})


def _owner_in(strings):
    """The owner record (prefix, run, follows_run) among a file's string entries, or None."""
    if "__ckpt.prefix" not in strings:
        return None
    return strings["__ckpt.prefix"], strings.get("__ckpt.run", ""), strings.get("__ckpt.follows_run", "")


def _foreign(owner, prefix, name):
    if owner is None:
        return None
    o_prefix, o_run, _ = owner
    if o_prefix == prefix and (o_run == name.run_prefix or not o_run):
        return None
    return ("it belongs to prefix '%s' (run '%s'), not to run '%s' of prefix '%s' as its name suggests"
            % (o_prefix, o_run, name.run_prefix, prefix))


def _order(f):
    return (f.name.run, f.name.global_step, f.name.epoch, f.name.step)


def _list(directory, prefix, breakpoint=False):
    directory = os.fspath(directory)
    out = []
    for n in _names(directory):
        name = _parse_name(prefix, n)
        if name is None or name.breakpoint != breakpoint:
            continue
        path = os.path.join(directory, n)
        if _foreign(_owner(path), prefix, name):
            try:
                verify(path)
                continue  # a file that verifies and records another owner is not ours
            except Error:
                pass      # damaged: its record is no evidence
        out.append(_File(path, name))
    out.sort(key=_order)
    return out


def _problem(f):
    """Why `f` is not a whole checkpoint whose header agrees with its name, or None."""
    try:
        f.header = verify(f.path)
    except Error as e:
        return str(e)
    return _against_name(f)


def _against_name(f):
    """Why the header of `f` (read already) disagrees with its name, or None."""
    h, n = f.header, f.name
    if n.epoch_in_name:
        if (h.epoch, h.step) != (n.epoch, n.step):
            return "its name says epoch %d step %d but its header says epoch %d step %d" % (n.epoch, n.step, h.epoch,
                                                                                              h.step)
    elif (h.step != n.step) if h.epoch == 1 else (h.step > n.step):
        return "its name says global step %d but its header says epoch %d step %d" % (n.step, h.epoch, h.step)
    return None


@dataclass(frozen=True)
class Skipped:
    """A checkpoint latest() or best() passed over, and why."""
    path: str
    reason: str


def _skip(f, why, skipped):
    log.warning("skipping checkpoint '%s': %s", f.path, why)
    if skipped is not None:
        skipped.append(Skipped(f.path, why))


def _run_number(prefix, run_prefix):
    if run_prefix == prefix:
        return 0
    if not run_prefix.startswith(prefix + "_"):
        return -1
    n = _count(run_prefix[len(prefix) + 1:])
    return -1 if n is None else n


def _check_prefix(prefix):
    if not isinstance(prefix, str) or not prefix or "/" in prefix:
        raise ConfigError("a checkpoint prefix is a non-empty name without '/', not %r: the directory comes first, "
                          "then the prefix (latest('runs', 'exp'))" % (prefix,))


def latest(directory, prefix, skipped=None, key=None):
    """The path of the newest checkpoint of `prefix` in `directory` that verifies, or None
    (also when the directory does not exist). Newer files that fail are passed over with a
    warning (logger "ckpt") and, when `skipped` is a list, a Skipped entry. An exception save
    ("..._breakpoint.ckpt") written after every regular checkpoint is the newest state and is
    returned. `key` is needed only to read the owner record of an encrypted exception save."""
    _check_prefix(prefix)
    found = None
    for f in reversed(_list(directory, prefix)):
        why = _problem(f)
        if why is None:
            found = f
            break
        _skip(f, why, skipped)
    for bp in reversed(_list(directory, prefix, breakpoint=True)):
        why = _problem(bp)
        if why:
            _skip(bp, why, skipped)
            continue
        try:
            owner = _owner_in({e.name: e.value for e in contents(bp.path, key=key) if e.kind == "string"})
        except Error as e:
            _skip(bp, str(e), skipped)
            continue
        if _foreign(owner, prefix, bp.name):
            continue
        if owner is None or not owner[2]:
            log.info("exception save '%s' does not record the run it continues: not resumed from", bp.path)
            continue
        run = _run_number(prefix, owner[2])
        position = lambda n: (n.global_step, n.epoch, n.step)  # noqa: E731
        if found and (run < found.name.run or (run == found.name.run and position(bp.name) <= position(found.name))):
            break
        log.info("the newest state of prefix '%s' is the exception save '%s'", prefix, bp.path)
        return bp.path
    return found.path if found else None


def _metric(entries, metric):
    """The value KeepBest ranks a file by: its recorded metric, or else an int64 or double
    entry of that name."""
    values = {e.name: e.value for e in entries if e.kind in ("int64", "double")}
    v = values.get(F.METRIC_PREFIX + metric, values.get(metric))
    return None if v is None or not math.isfinite(v) else float(v)


def best(directory, prefix, metric, mode="min", skipped=None, key=None):
    """The path of the checkpoint of `prefix` with the best value of `metric` ("min": smallest)
    that verifies, or None when no file records a finite value of it. Of equal values the
    newer file wins."""
    _check_prefix(prefix)
    if mode not in ("min", "max"):
        raise ConfigError("mode is 'min' or 'max', not %r" % (mode,))
    ranked = []
    for i, f in enumerate(_list(directory, prefix)):
        try:
            v = _metric(contents(f.path, key=key), metric)  # (which checks the checksum)
            f.header = header(f.path)
        except Error as e:
            _skip(f, str(e), skipped)
            continue
        if v is not None:
            ranked.append((v if mode == "min" else -v, -i, f))
    for _, _, f in sorted(ranked, key=lambda t: t[:2]):
        why = _against_name(f)
        if why is None:
            return f.path
        _skip(f, why, skipped)
    return None


@dataclass
class Listed:
    """A checkpoint ls() found: its name's parts, its header (None when unreadable), why it
    fails verification (None when it verifies), its recorded metrics, and whether latest()
    would take it among the regular checkpoints of its prefix."""
    path: str
    prefix: str
    run: int
    epoch: int
    step: int
    global_step: int
    kind: str                   # "regular" or "breakpoint"
    header: F.Header = None
    problem: str = None
    metrics: dict = field(default_factory=dict)
    latest: bool = False


def ls(directory, prefix=None, key=None):
    """Every checkpoint in `directory` named as ckpt names them (of `prefix`, or of every
    prefix found), ordered by prefix, run and position, each verified."""
    directory = os.fspath(directory)
    out = []
    for n in _names(directory):
        base = prefix
        if base is None:
            dash = n.rfind("-")
            if dash <= 0:
                continue
            base = n[:dash]
            head, _, run = base.rpartition("_")
            if head and _count(run):
                base = head
        name = _parse_name(base, n)
        if name is None:
            continue
        f = _File(os.path.join(directory, n), name)
        problem, entries, metrics = None, [], {}
        try:
            f.header = header(f.path)
            if key is None and f.header.encrypted:
                verify(f.path)  # the checksum needs no key; the entries do
            else:
                entries = contents(f.path, key=key)  # checks the checksum
            problem = _against_name(f)
        except Error as e:
            problem = str(e)
        # another's file (as latest() sees it, and `ckpt ls`); records of coded bodies are not read
        owner = _owner_in({e.name: e.value for e in entries if e.kind == "string"}) \
            if problem is None and not f.header.codecs else None
        if _foreign(owner, base, name):
            problem = ("named as run '%s' of prefix '%s' but it records prefix '%s' (run '%s'): not that prefix's "
                       "checkpoint" % (name.run_prefix, base, owner[0], owner[1]))
        if problem is None:
            metrics = {e.name[len(F.METRIC_PREFIX):]: e.value for e in entries
                       if e.name.startswith(F.METRIC_PREFIX) and e.kind == "double"}
        out.append(Listed(f.path, base, name.run, name.epoch, name.step, name.global_step,
                          "breakpoint" if name.breakpoint else "regular", f.header, problem, metrics))
    out.sort(key=lambda c: (c.prefix, c.run, c.global_step, c.epoch, c.step, c.kind))
    newest = {}
    for c in out:
        if c.kind == "regular" and c.problem is None:
            newest[c.prefix] = c
    for c in newest.values():
        c.latest = True
    return out
