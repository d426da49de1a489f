"""Finding checkpoints in a directory, as the C++ library's latest(), best() and `ckpt ls`
do: by the run, epoch and step in their names, confirmed by their headers, verified by their
checksums; never by file times."""

import errno
import logging
import math
import os
from dataclasses import dataclass, field

from . import _format as F
from . import _series
from ._io import _Opened, _reader, contents, header, verify
from ._names import count as _count, guess as _guess, parse as _parse_name
from ._series import Temporary
from .codecs import MissingModule
from .errors import ConfigError, Error, IoError, KeyError as CkptKeyError, UnreadableCheckpoints, VersionError, printable

__all__ = ["latest", "best", "ls", "temporaries", "Listed", "Skipped", "Temporary"]

log = logging.getLogger("ckpt")


def _directory(directory):
    """A directory argument as a str, "~" expanded; an IoError unless it is a directory."""
    if directory is None:
        raise ConfigError("no checkpoint directory (None)")
    given = os.fspath(directory)
    directory = os.path.expanduser(given)
    shown = "'%s'" % directory if directory == given else "'%s' ('%s')" % (directory, given)
    try:
        os.listdir(directory)
    except FileNotFoundError:
        raise IoError("checkpoint directory %s does not exist" % shown, directory, errno.ENOENT) from None
    except NotADirectoryError:
        raise IoError("checkpoint directory %s is not a directory" % shown, directory, errno.ENOTDIR) from None
    except OSError as e:
        raise IoError("cannot list %s: %s" % (shown, e.strerror), directory, e.errno) from None
    return directory


def _names(directory):
    try:
        listed = sorted(os.listdir(directory))
    except FileNotFoundError:
        raise IoError("checkpoint directory '%s' does not exist" % directory, directory, errno.ENOENT) from None
    except NotADirectoryError:
        raise IoError("checkpoint directory '%s' is not a directory" % directory, directory, errno.ENOTDIR) from None
    except OSError as e:
        raise IoError("cannot list '%s': %s" % (directory, e.strerror), directory, e.errno) from None
    return [n for n in listed if not (n.startswith(".") and ".tmp-" in n)
            and os.path.isfile(os.path.join(directory, n))]


@dataclass
class _File:
    path: str
    name: object          # a _names.Name
    header: F.Header = None


@_reader
def _table(path):
    """The table of contents of a file whose body has no codecs, not verified; None for one
    with codecs."""
    with _Opened(path) as opened:
        return None if opened.header.codecs else opened.table()


def _owner(path):
    """The owner record (prefix, run, follows_run) of a file whose body has no codecs, read from
    its table of contents without verifying it; None when it has none or cannot be read."""
    try:
        entries = _table(path)
    except Error:
        return None
    if entries is None:
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
    """(why, what to do) when `f` is not a whole checkpoint whose header agrees with its name
    (what to do is None when it is damaged, see _cannot_read()); (None, None) when it is."""
    try:
        f.header = verify(f.path)
    except Error as e:
        return str(e), _cannot_read(e)
    return _against_name(f), None


_GONE = "gone"


def _cannot_read(e):
    """What to do about error `e`, when it says that a file this reader cannot read may be
    whole (a newer format, no key, a missing module, no permission); None when it says that
    the file is damaged; _GONE when the file was removed since it was listed."""
    if isinstance(e, VersionError):
        return "upgrade ckpt to a version that reads it"
    if isinstance(e, CkptKeyError):
        return "pass its key (key=...)"
    if isinstance(e, MissingModule):
        return "install the module it names"
    if getattr(e, "over_budget", False):
        return "pass a larger max_decoded_bytes"
    if isinstance(e, IoError):
        return _GONE if e.errno == errno.ENOENT else "make it readable"
    return None


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
    log.warning("skipping checkpoint '%s': %s", printable(f.path), printable(why))
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


def _quoted(names, most=10):
    names = sorted(names)
    shown = ", ".join("'%s'" % n for n in names[:most])
    return shown + (" and %d more" % (len(names) - most) if len(names) > most else "")


def _prefixes_there(directory):
    found = set()
    for n in _names(directory):
        g = _guess(n)
        if g:
            found.add(g[0])
    return "prefixes there: %s" % _quoted(found) if found else "no checkpoint of any prefix there"


def _notice(text, *args):
    """Why latest() or best() returns None: a warning of logger "ckpt", which Python prints on
    stderr when no logging is set up."""
    log.warning(text, *(printable(a) if isinstance(a, str) else a for a in args))


def _reasons(files):
    """Each file's reason, "'path': " before those that do not name it."""
    return "; ".join(s.reason if s.path in s.reason else "'%s': %s" % (s.path, s.reason) for s in files)


def _unreadable(directory, prefix, files, actions, what, before=()):
    """UnreadableCheckpoints for `files` (Skipped) this reader cannot read, what to do about
    them, and the damaged files passed over before them."""
    todo = []
    for a in actions:
        if a not in todo:
            todo.append(a)
    one = len(files) == 1
    return UnreadableCheckpoints(
        "%s of prefix '%s' in '%s' cannot be read here: %s%s. %s not passed over, so that a job neither goes on from "
        "an older state nor starts over without a word: %s, or pass fall_back=True to %s"
        % ("checkpoint '%s'" % files[0].path if one else "%d checkpoints" % len(files), prefix, directory,
           _reasons(files), "; passed over before it, as damaged: %s" % _reasons(before) if before else "",
           "It is" if one else "They are", ", or ".join(todo), what),
        files[0].path if one else directory, list(before) + list(files), directory, prefix)


def _none_usable(directory, prefix, passed):
    """UnreadableCheckpoints when checkpoints were found and every one was passed over."""
    return UnreadableCheckpoints(
        "no checkpoint of prefix '%s' in '%s' can be used: %d found, none whole (%s). Rather than start over as if "
        "there were none: repair or remove them, or pass fall_back=True to have None"
        % (prefix, directory, len(passed), _reasons(passed)),
        directory, passed, directory, prefix)


def latest(directory, prefix, skipped=None, key=None, fall_back=False, max_decoded_bytes=None):
    """The path of the newest checkpoint of `prefix` in `directory` that verifies, or None when
    the directory holds none of the prefix (with a notice naming the prefixes it holds). "~" is
    expanded; a directory that does not exist is an IoError.

    From the newest checkpoint back: a damaged file (checksum, truncated, malformed, its name
    and header disagree) is passed over with a warning (logger "ckpt") and, when `skipped` is a
    list, a Skipped entry. A file that may be whole but that this reader cannot read (a newer
    format version, an encrypted exception save without its key, a missing module, no
    permission) stops the search: UnreadableCheckpoints, so that a job does not resume from an
    older state, or start over, without a word. Files found of which none is usable are
    UnreadableCheckpoints too. `fall_back=True` passes over those files as over damaged ones
    and returns an older checkpoint, or None.

    An exception save ("..._breakpoint.ckpt") written after every regular checkpoint is the
    newest state and is returned. `key` is needed only to read the owner record of an
    encrypted exception save; `max_decoded_bytes` (as for load()) bounds what the owner record
    of a compressed one may decode to, and one over it stops the search like a file this
    reader cannot read."""
    _check_prefix(prefix)
    directory = _directory(directory)
    passed = []

    def pass_over(f, why):
        _skip(f, why, skipped)
        passed.append(Skipped(f.path, why))

    regular = _list(directory, prefix)
    found = None
    for f in reversed(regular):
        why, action = _problem(f)
        if why is None:
            found = f
            break
        if action == _GONE:
            continue
        if action and not fall_back:
            raise _unreadable(directory, prefix, [Skipped(f.path, why)], [action],
                              "take the newest checkpoint older than it", passed)
        pass_over(f, why)
    position = lambda n: (n.global_step, n.epoch, n.step)  # noqa: E731
    breakpoints = _list(directory, prefix, breakpoint=True)
    for bp in reversed(breakpoints):
        why, action = _problem(bp)
        owner = None
        if why is None:
            try:
                entries = contents(bp.path, key=key, max_decoded_bytes=max_decoded_bytes)
                owner = _owner_in({e.name: e.value for e in entries if e.kind == "string"})
            except Error as e:
                why, action = str(e), _cannot_read(e)
        if why is not None:
            if action == _GONE:
                continue
            newer = found is None or (bp.name.run, position(bp.name)) > (found.name.run, position(found.name))
            if action and newer and not fall_back:
                raise _unreadable(directory, prefix, [Skipped(bp.path, why)], [action],
                                  "pass over this exception save", passed)
            pass_over(bp, why)
            continue
        if _foreign(owner, prefix, bp.name):
            continue
        if owner is None or not owner[2]:
            log.info("exception save '%s' does not record the run it continues: not resumed from", printable(bp.path))
            continue
        run = _run_number(prefix, owner[2])
        if found and (run < found.name.run or (run == found.name.run and position(bp.name) <= position(found.name))):
            break
        log.info("the newest state of prefix '%s' is the exception save '%s'", printable(prefix), printable(bp.path))
        return bp.path
    if found:
        return found.path
    if passed and not fall_back:
        raise _none_usable(directory, prefix, passed)
    if passed:
        _notice("no usable checkpoint of prefix '%s' in '%s': %d passed over (fall_back=True)", prefix, directory,
                len(passed))
    elif regular or breakpoints:
        _notice("no checkpoint of prefix '%s' in '%s' to resume from: only exception saves, none of which is "
                "resumed from (see the log at level INFO)", prefix, directory)
    else:
        _notice("no checkpoint of prefix '%s' in '%s' (%s)", prefix, directory, _prefixes_there(directory))
    return None


def _metric(entries, metric):
    """The value KeepBest ranks a file by: its recorded metric, or else an int64 or double
    entry of that name."""
    values = {e.name: e.value for e in entries if e.kind in ("int64", "double")}
    v = values.get(F.METRIC_PREFIX + metric, values.get(metric))
    return None if v is None or not math.isfinite(v) else float(v)


def best(directory, prefix, metric, mode="min", skipped=None, key=None, fall_back=False, max_decoded_bytes=None):
    """The path of the checkpoint of `prefix` with the best value of `metric` ("min": smallest)
    that verifies. Of equal values the newer file wins. "~" is expanded; a directory that does
    not exist is an IoError.

    None, with a notice (logger "ckpt"), when the directory holds no checkpoint of the prefix
    or no file records a finite value of `metric` (the notice names the metrics recorded).
    Damaged files are passed over with a warning (and in `skipped`), as by latest(). Any file
    may hold the best value, so any file this reader cannot read but that may be whole (a newer
    format version, an encrypted file without its key, a missing module, one that decodes to
    more than `max_decoded_bytes`, as for load()) is UnreadableCheckpoints, as are files of
    which none is whole; `fall_back=True` passes over them instead and ranks the others."""
    _check_prefix(prefix)
    if mode not in ("min", "max"):
        raise ConfigError("mode is 'min' or 'max', not %r" % (mode,))
    directory = _directory(directory)
    files = _list(directory, prefix)
    ranked, passed, unreadable, actions, recorded = [], [], [], [], set()
    present = 0
    for i, f in enumerate(files):
        try:
            entries = contents(f.path, key=key, max_decoded_bytes=max_decoded_bytes)  # (which checks the checksum)
            f.header = header(f.path)
        except Error as e:
            action = _cannot_read(e)
            if action == _GONE:
                continue
            present += 1
            if action and not fall_back:
                unreadable.append(Skipped(f.path, str(e)))
                actions.append(action)
                continue
            _skip(f, str(e), skipped)
            passed.append(Skipped(f.path, str(e)))
            continue
        present += 1
        recorded.update(e.name[len(F.METRIC_PREFIX):] for e in entries if e.name.startswith(F.METRIC_PREFIX))
        v = _metric(entries, metric)
        if v is not None:
            ranked.append((v if mode == "min" else -v, -i, f))
    if unreadable:
        raise _unreadable(directory, prefix, unreadable, actions, "rank the others")
    for _, _, f in sorted(ranked, key=lambda t: t[:2]):
        why = _against_name(f)
        if why is None:
            return f.path
        _skip(f, why, skipped)
        passed.append(Skipped(f.path, why))
    if present and len(passed) == present and not fall_back:
        raise _none_usable(directory, prefix, passed)
    if not files:
        _notice("no checkpoint of prefix '%s' in '%s' (%s)", prefix, directory, _prefixes_there(directory))
    elif not ranked:
        _notice("no checkpoint of prefix '%s' in '%s' records a finite value of metric '%s' (%s)", prefix, directory,
                metric, "metrics recorded: %s" % _quoted(recorded) if recorded else "none records a metric")
    else:
        _notice("no usable checkpoint of prefix '%s' in '%s' records metric '%s': %d passed over", prefix,
                directory, metric, len(passed))
    return None


@dataclass
class Listed:
    """A checkpoint ls() found: its name's parts (the epoch and step of a file named by its
    global step alone from its header, when that reads), its header (None when unreadable),
    why it fails verification (None when it verifies), its recorded metrics, and whether
    latest() would take it among the regular checkpoints of its prefix in its directory. A
    `.ckpt` file named as no checkpoint of a series has `prefix`, `run` and `kind` None, and its
    header's epoch and step."""
    path: str
    prefix: str
    run: int
    epoch: int
    step: int
    global_step: int
    kind: str                   # "regular" or "breakpoint"; None for a file of no series
    header: F.Header = None
    problem: str = None
    metrics: dict = field(default_factory=dict)
    latest: bool = False


LS_DEPTH = 5   # `ckpt ls` reads subdirectories this deep: files 5 levels below the directory, not 6


def _walk(directory):
    """(directory, names of its files) for `directory` and its subdirectories down to LS_DEPTH
    levels, as `ckpt ls` reads them: in name order, a symlink to a file taken as the file, a
    symlink to a directory not entered (no loops; no walk out of the tree). Temporaries are
    not among the names."""
    out = []

    def visit(d, depth):
        try:
            with os.scandir(d) as it:
                found = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise IoError("cannot list '%s': %s" % (d, e.strerror), d, e.errno) from None
        names, below = [], []
        for e in found:
            try:
                if e.is_dir(follow_symlinks=False):
                    below.append(e.path)
                elif e.is_file() and not (e.name.startswith(".") and ".tmp-" in e.name):
                    names.append(e.name)
            except OSError:
                continue  # gone meanwhile
        out.append((d, names))
        if depth < LS_DEPTH:
            for sub in below:
                visit(sub, depth + 1)

    visit(directory, 0)
    return out


def ls(directory, prefix=None, key=None, max_decoded_bytes=None):
    """Every checkpoint in `directory` and its subdirectories (LS_DEPTH levels, as `ckpt ls`
    reads them), each verified: the files named as ckpt names them (of `prefix`, or of every
    prefix found) and, without `prefix`, every other `.ckpt` file. Ordered by directory,
    prefix, run and position. A file whose owner record (docs/FORMAT.md section 3) names
    another prefix is listed under that prefix when its name is one of that prefix's, and has
    a problem when it is not. A file named by its global step alone gets its epoch and step
    from its header when that reads. "~" is expanded; a directory that does not exist is an
    IoError. Temporaries are not listed here: see temporaries(). `key` and
    `max_decoded_bytes` are load()'s, for the entries of coded bodies."""
    directory = _directory(directory)
    out = []
    for where, names in _walk(directory):
        for n in names:
            if prefix is None:
                found = _guess(n)
                if found is None and not n.endswith(".ckpt"):
                    continue
                base, name = found if found else (None, None)
            else:
                base, name = prefix, _parse_name(prefix, n)
                if name is None:
                    continue
            out.append(_listed(os.path.join(where, n), n, base, name, key, max_decoded_bytes))
    out.sort(key=lambda c: (os.path.dirname(c.path), c.prefix is not None, c.prefix or "", c.run or 0,
                            c.global_step, c.epoch if c.epoch is not None else -1,
                            c.step if c.step is not None else -1, c.kind or "", c.path))
    newest = {}
    for c in out:
        if c.kind == "regular" and c.problem is None:
            newest[os.path.dirname(c.path), c.prefix] = c
    for c in newest.values():
        c.latest = True
    return out


def _listed(path, n, base, name, key, max_decoded_bytes):
    """The Listed of file `path` (named `n`), verified; `base` and `name` what its name says
    (None for a file of no series)."""
    f = _File(path, name)
    problem, entries, metrics = None, [], {}
    try:
        f.header = header(path)
        if key is None and f.header.encrypted:
            verify(path)  # the checksum needs no key; the entries do
        else:
            entries = contents(path, key=key, max_decoded_bytes=max_decoded_bytes)  # checks the checksum
    except Error as e:
        problem = str(e)
    if name is not None and problem is None and not f.header.codecs:
        # whose it is, as latest() and `ckpt ls` see it; records of coded bodies are not read
        owner = _owner_in({e.name: e.value for e in entries if e.kind == "string"})
        if _foreign(owner, base, name):
            again = _parse_name(owner[0], n)
            if again is not None and again.run_prefix == owner[1] and again.breakpoint == name.breakpoint:
                base, name = owner[0], again  # its recorded prefix's file ("exp_1-50.ckpt" of prefix "exp_1")
                f.name = name
            else:
                problem = ("named as run '%s' of prefix '%s' but it records prefix '%s' (run '%s'): not that "
                           "prefix's checkpoint" % (name.run_prefix, base, owner[0], owner[1]))
    if name is not None and problem is None:
        problem = _against_name(f)
    if problem is None:
        metrics = {e.name[len(F.METRIC_PREFIX):]: e.value for e in entries
                   if e.name.startswith(F.METRIC_PREFIX) and e.kind == "double"}
    if name is None:
        h = f.header
        return Listed(path, None, None, h.epoch if h else None, h.step if h else None, -1, None, h, problem, metrics)
    epoch, step = name.epoch, name.step
    if not name.epoch_in_name and f.header is not None:  # the name holds the global step alone
        epoch, step = f.header.epoch, f.header.step
    return Listed(path, base, name.run, epoch, step, name.global_step,
                  "breakpoint" if name.breakpoint else "regular", f.header, problem, metrics)


def temporaries_under(directory):
    """The temporaries of `directory` and of the subdirectories ls() reads."""
    return [t for d, _ in _walk(directory) for t in _series.temporaries(d)]


def temporaries(directory):
    """The temporaries writers left in `directory` (docs/FORMAT.md section 12.3:
    ".{name}.tmp-{pid}-{n}"), each a Temporary(path, pid, size, writer_alive): a writer killed
    mid-write leaves one, which the next save() into the directory removes (those of its series,
    and those whose writer is no live process). "~" is expanded; a directory that does not
    exist is an IoError."""
    return _series.temporaries(_directory(directory))
