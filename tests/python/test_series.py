"""The files of a series beside its checkpoints (docs/FORMAT.md section 12) as the Python
package writes them: save() holds the series' lock while it writes, and refuses a series
another process or thread holds, naming the holder; it takes over from a holder that was
killed; it removes the temporaries killed writers left; ls and `python -m ckpt ls` list
them."""
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import ckpt
from ckpt import _series
import support

ENV = dict(os.environ, PYTHONPATH=os.path.join(support.SOURCE, "python"), PYTHONDONTWRITEBYTECODE="1")
HELD_BY = re.compile(r"prefix '(.*)' in '(.*)' is held by pid (\d+) on host (.*) since "
                     r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC")


def state(n=4):
    return {"w": np.arange(float(n)), "step": n}


class Holder:
    """Another process holding the lock of a series as a writer does (the package's own
    SeriesLock: flock, then its lines written), until it is killed."""

    def __init__(self, directory, prefix):
        code = textwrap.dedent("""
            import sys, time
            from ckpt import _series
            lock = _series.SeriesLock(sys.argv[1], sys.argv[2])
            assert lock.acquire()
            print("held", flush=True)
            time.sleep(60)
            """)
        self.process = subprocess.Popen([sys.executable, "-c", code, directory, prefix], stdout=subprocess.PIPE,
                                        text=True, env=ENV)
        line = self._line()
        assert line == "held\n", line

    def _line(self):
        got = []
        reader = threading.Thread(target=lambda: got.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        assert got, "the holder said nothing for 30 s"
        return got[0]

    @property
    def pid(self):
        return self.process.pid

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(30) == -signal.SIGKILL
        self.process.stdout.close()


@pytest.fixture
def holder(tmp_path):
    held = []

    def hold(prefix="exp"):
        held.append(Holder(str(tmp_path), prefix))
        return held[-1]
    yield hold
    for h in held:
        if h.process.poll() is None:
            h.kill()


def dead_pid():
    """The pid of a process that has ended."""
    p = subprocess.Popen(["true"])
    p.wait(30)
    return p.pid


def test_a_save_locks_its_series_and_releases_it(tmp_path):
    d = str(tmp_path)
    ckpt.save(os.path.join(d, "exp-1_10.ckpt"), state(), epoch=1, step=10)
    # the lock file stays, emptied: a clean end (section 12.1)
    assert sorted(os.listdir(d)) == ["exp-1_10.ckpt", "exp.lock"]
    assert support.read(os.path.join(d, "exp.lock")) == b""
    assert oct(os.stat(os.path.join(d, "exp.lock")).st_mode & 0o777) == "0o644"
    # names of no series take no lock
    for name in ("m.ckpt", "exp-1_10.ckpt.bak", "exp-x.ckpt"):
        ckpt.save(os.path.join(d, name), state())
    assert sorted(os.listdir(d)) == ["exp-1_10.ckpt", "exp-1_10.ckpt.bak", "exp-x.ckpt", "exp.lock", "m.ckpt"]


def test_a_series_another_process_holds_is_refused_naming_the_holder(tmp_path, holder):
    d = str(tmp_path)
    h = holder("exp")
    before = sorted(os.listdir(d))
    # every name of the series: MindSpore, step-named, a later run, an exception save
    for name in ("exp-1_10.ckpt", "exp-10.ckpt", "exp_2-1_5.ckpt", "exp_2-1_5_breakpoint.ckpt"):
        t0 = time.monotonic()
        with pytest.raises(ckpt.SeriesLocked) as info:
            ckpt.save(os.path.join(d, name), state(), epoch=1, step=10)
        waited = time.monotonic() - t0
        assert 0.19 <= waited < 5, waited  # asked again for 200 ms
        m = HELD_BY.fullmatch(str(info.value))
        assert m, str(info.value)
        assert m.group(1, 2, 3, 4) == ("exp", d, str(h.pid), socket.gethostname())
        assert isinstance(info.value, ckpt.ConfigError) and info.value.holder["pid"] == str(h.pid)
        assert sorted(os.listdir(d)) == before  # nothing written, no temporary left
    # other series of the directory are free
    for name in ("expert-1_10.ckpt", "exp_x-3.ckpt", "other-1.ckpt"):
        ckpt.save(os.path.join(d, name), state())
    h.kill()
    ckpt.save(os.path.join(d, "exp-1_10.ckpt"), state(), epoch=1, step=10)


def test_a_lock_held_by_util_linux_flock(tmp_path):
    """flock(1) holds the file without writing a holder into it: refused all the same."""
    d = str(tmp_path)
    lock = os.path.join(d, "exp.lock")
    # (its own process group: the shell it starts holds the lock too, and ends with it)
    p = subprocess.Popen(["flock", "--exclusive", lock, "-c", "echo held; exec sleep 60"], stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        assert p.stdout.readline() == "held\n"
        with pytest.raises(ckpt.SeriesLocked, match="prefix 'exp' in '%s' is held by another writer \\(its lock file "
                           "'%s' names no holder yet\\)" % (d, lock)):
            ckpt.save(os.path.join(d, "exp-1.ckpt"), state(), step=1)
        assert not os.path.exists(os.path.join(d, "exp-1.ckpt"))
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)
        p.stdout.close()
    ckpt.save(os.path.join(d, "exp-1.ckpt"), state(), step=1)


def test_a_holder_killed_with_sigkill_is_taken_over(tmp_path, holder, caplog):
    d = str(tmp_path)
    h = holder("exp")
    lines = support.read(os.path.join(d, "exp.lock")).decode().splitlines()
    assert lines[:3] == ["ckpt-lock 1", "pid %d" % h.pid, "host %s" % socket.gethostname()]
    assert re.fullmatch(r"started \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", lines[3]) and len(lines) == 4
    h.kill()  # the kernel releases its lock; its lines stay
    with caplog.at_level(logging.WARNING, logger="ckpt"):
        ckpt.save(os.path.join(d, "exp-1_1.ckpt"), state(), epoch=1, step=1)
    notices = [r.getMessage() for r in caplog.records if "taking the series over" in r.getMessage()]
    assert len(notices) == 1 and "from pid %d on host %s since " % (h.pid, socket.gethostname()) in notices[0], notices
    assert "prefix 'exp' in '%s'" % d in notices[0]
    assert support.read(os.path.join(d, "exp.lock")) == b""
    assert ckpt.latest(d, "exp") == os.path.join(d, "exp-1_1.ckpt")


def test_threads_of_one_process_exclude_each_other(tmp_path):
    """flock locks an open file description: a save in one thread holds the series against a
    save from another thread of the same process."""
    d = str(tmp_path)
    lock = _series.SeriesLock(d, "exp")  # what a save holds while it writes
    assert lock.acquire()
    outcome = []

    def save():
        try:
            outcome.append(ckpt.save(os.path.join(d, "exp-2.ckpt"), state(), step=2))
        except ckpt.SeriesLocked as e:
            outcome.append(e)
    try:
        worker = threading.Thread(target=save)
        worker.start()
        worker.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], ckpt.SeriesLocked), outcome
        assert HELD_BY.fullmatch(str(outcome[0])).group(3) == str(os.getpid())
        assert not os.path.exists(os.path.join(d, "exp-2.ckpt"))
    finally:
        lock.release()
    worker = threading.Thread(target=save)
    worker.start()
    worker.join(30)
    assert outcome[1] == os.path.join(d, "exp-2.ckpt")


def test_concurrent_saves_of_threads_never_overlap(tmp_path):
    """Threads saving one series at once: each save either writes a whole file or is refused
    with SeriesLocked; the lock file ends empty."""
    d = str(tmp_path)
    results = []

    def saves(k):
        for i in range(6):
            try:
                ckpt.save(os.path.join(d, "exp-%d.ckpt" % (10 * k + i)), state(1 << 14), step=10 * k + i)
                results.append("saved")
            except ckpt.SeriesLocked as e:
                assert HELD_BY.fullmatch(str(e)) or "names no holder yet" in str(e), str(e)
                results.append("refused")
    workers = [threading.Thread(target=saves, args=(k,)) for k in (1, 2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert len(results) == 12 and "saved" in results
    saved = [c for c in ckpt.ls(d, "exp")]
    assert len(saved) == results.count("saved") and all(c.problem is None for c in saved)
    assert support.read(os.path.join(d, "exp.lock")) == b"" and ckpt.temporaries(d) == []


def test_an_interrupted_wait_leaves_no_lock_file_open(tmp_path, holder):
    """An exception while a save waits for the lock (an interrupt, here an alarm's) closes the
    lock file: no descriptor of it stays behind in the process."""
    holder("exp")

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted()
    before = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # within the 200 ms a save waits
        with pytest.raises(Interrupted):
            ckpt.save(str(tmp_path / "exp-1.ckpt"), state(), step=1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    lock = str(tmp_path / "exp.lock")
    open_fds = [os.path.realpath("/proc/self/fd/" + fd) for fd in os.listdir("/proc/self/fd")]
    assert lock not in open_fds


def test_a_refused_save_creates_no_lock_file(tmp_path):
    with pytest.raises(ckpt.ConfigError):
        ckpt.save(str(tmp_path / "exp-1.ckpt"), {"t": np.zeros(2, np.longdouble)}, step=1)
    assert os.listdir(tmp_path) == []


def test_save_into_a_missing_directory_says_so(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(ckpt.IoError, match="the directory '%s' does not exist" % missing) as info:
        ckpt.save(str(missing / "exp-1.ckpt"), state(), step=1)
    assert info.value.errno == 2 and not os.path.exists(tmp_path / "no")


# --------------------------------------------------------------------------- temporaries

def temporary(directory, final, pid, size=10):
    return support.write(os.path.join(directory, ".%s.tmp-%d-0" % (final, pid)), b"x" * size)


def test_a_save_removes_its_series_temporaries_and_those_of_dead_writers(tmp_path, holder, caplog):
    d = str(tmp_path)
    live = holder("other")  # a live process, whose temporaries of another series are kept
    dead = dead_pid()
    removed = [temporary(d, "exp-1.ckpt", live.pid),       # of the series: no one else writes it now
               temporary(d, "exp_1-2_3.ckpt", dead),
               temporary(d, "zzz-1.ckpt", dead),            # of another series, its writer gone
               temporary(d, "notes.txt", dead)]
    kept = [temporary(d, "other-1.ckpt", live.pid),
            temporary(d, "expert-1.ckpt", live.pid),
            support.write(os.path.join(d, ".exp-1.ckpt.tmp-x-0"), b"x"),   # not a writer's name
            support.write(os.path.join(d, "exp-1.ckpt.tmp-1-0"), b"x")]
    assert {t.path: t.writer_alive for t in ckpt.temporaries(d)} == {
        removed[0]: True, removed[1]: False, removed[2]: False, removed[3]: False, kept[0]: True, kept[1]: True}
    with caplog.at_level(logging.INFO, logger="ckpt"):
        ckpt.save(os.path.join(d, "exp-2.ckpt"), state(), step=2)
    assert all(not os.path.exists(p) for p in removed) and all(os.path.exists(p) for p in kept)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "removed the temporary" in
              r.getMessage()]
    assert sorted(logged) == sorted(
        ["removed the temporary '%s' (10 bytes) left by pid %d, %s" % (
            p, pid, "which is no live process" if pid == dead else
            "not writing it: this save holds the lock of prefix 'exp'")
         for p, pid in zip(removed, (live.pid, dead, dead, dead))])
    # a save of no series removes only what dead writers left
    again = temporary(d, "exp-3.ckpt", live.pid)
    gone = temporary(d, "exp-4.ckpt", dead)
    ckpt.save(os.path.join(d, "plain.ckpt"), state())
    assert os.path.exists(again) and not os.path.exists(gone)


KILLED_SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    import ckpt
    state = {"w": np.ones(4 << 20)}          # 32 MiB: each save takes a while to fsync
    print("saving", flush=True)
    i = 0
    while True:
        ckpt.save(sys.argv[1] + "/exp-%d.ckpt" % i, state, step=i)
        i += 1
    """)


def killed_mid_save(d):
    """Kills a Python process that saves in a loop while it writes a temporary: the temporary it
    leaves. Tries again (a few times) when the kill came just after a rename."""
    for attempt in range(5):
        p = subprocess.Popen([sys.executable, "-c", KILLED_SAVER, d], stdout=subprocess.PIPE, text=True, env=ENV)
        try:
            assert p.stdout.readline() == "saving\n"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                mine = [t for t in _series.temporaries(d) if t.pid == p.pid and t.size > 0]
                if mine:
                    break
                time.sleep(0.002)
            p.send_signal(signal.SIGKILL)
            p.wait(30)
        finally:
            p.kill()
            p.wait(30)
            p.stdout.close()
        left = [t for t in ckpt.temporaries(d) if t.pid == p.pid]
        if left:
            return p.pid, left
    pytest.fail("no save was killed while writing its temporary in 5 tries")


def test_a_killed_save_leaves_a_temporary_that_ls_shows_and_the_next_save_removes(tmp_path, caplog):
    d = str(tmp_path)
    pid, left = killed_mid_save(d)
    assert len(left) == 1 and not left[0].writer_alive and left[0].size == os.path.getsize(left[0].path)
    assert re.fullmatch(r"\.exp-\d+\.ckpt\.tmp-%d-\d+" % pid, os.path.basename(left[0].path))
    assert left[0].path not in [c.path for c in ckpt.ls(d)]  # never a checkpoint
    # python -m ckpt ls: in the listing, and in --json as the C++ tool prints it
    r = subprocess.run([sys.executable, "-m", "ckpt", "ls", d], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "1 temporary (%d bytes), 1 left by writers that are gone" % left[0].size in r.stdout
    assert re.search(r"^  %s +%d bytes  pid %-8d gone$" % (re.escape(os.path.basename(left[0].path)), left[0].size,
                                                           pid), r.stdout, re.M), r.stdout
    r = subprocess.run([sys.executable, "-m", "ckpt", "ls", "--json", d], capture_output=True, text=True, env=ENV,
                       timeout=60)
    assert json.loads(r.stdout)["temporaries"] == [{"path": left[0].path, "pid": pid, "size": left[0].size,
                                                    "writer": "gone"}]
    with caplog.at_level(logging.INFO, logger="ckpt"):
        ckpt.save(os.path.join(d, "exp-1000.ckpt"), state(), step=1000)
    assert ckpt.temporaries(d) == [] and any(left[0].path in r.getMessage() for r in caplog.records)
    r = subprocess.run([sys.executable, "-m", "ckpt", "ls", "--json", d], capture_output=True, text=True, env=ENV,
                       timeout=60)
    assert json.loads(r.stdout)["temporaries"] == []


def test_temporaries_of_a_live_writer_are_running(tmp_path, holder):
    d = str(tmp_path)
    h = holder("zzz")
    path = temporary(d, "abc-1.ckpt", h.pid, size=123)
    assert ckpt.temporaries(d) == [ckpt.Temporary(path, h.pid, 123, True)]
    r = subprocess.run([sys.executable, "-m", "ckpt", "ls", "--json", d], capture_output=True, text=True, env=ENV,
                       timeout=60)
    assert json.loads(r.stdout)["temporaries"] == [{"path": path, "pid": h.pid, "size": 123, "writer": "running"}]
    with pytest.raises(ckpt.IoError, match="does not exist"):
        ckpt.temporaries(str(tmp_path / "absent"))


# --------------------------------------------------------------------------- names another user made first

def next_temporaries(directory, final, count):
    """The names the next `count` saves of this process would give their first temporaries
    (docs/FORMAT.md section 12.3: ".{final}.tmp-{pid}-{n}", n the process's own sequence)."""
    n = next(ckpt._io._sequence)
    return [os.path.join(directory, ".%s.tmp-%d-%d" % (final, os.getpid(), n + 1 + i)) for i in range(count)]


def test_a_temporary_name_another_made_first_is_passed_for_a_random_one(tmp_path, caplog):
    """Another local user who creates the names a save will use first (a shared 1777 directory)
    blocks no save, and loses nothing: each save writes under a random name instead."""
    d = str(tmp_path)
    theirs = next_temporaries(d, "out.ckpt", 3)
    for p in theirs:
        support.write(p, b"theirs")
    with caplog.at_level(logging.WARNING, logger="ckpt"):
        for step in range(3):
            ckpt.save(os.path.join(d, "out.ckpt"), state(), step=step)
    assert ckpt.load(os.path.join(d, "out.ckpt"))["step"] == 4 and ckpt.header(os.path.join(d, "out.ckpt")).step == 2
    assert all(support.read(p) == b"theirs" for p in theirs)
    assert sorted(os.listdir(d)) == sorted(["out.ckpt"] + [os.path.basename(p) for p in theirs])
    warned = [r.getMessage() for r in caplog.records if "exists already" in r.getMessage()]
    assert warned == ["the temporary '%s' for '%s' exists already (made by another): writing under a random name "
                      "instead" % (p, os.path.join(d, "out.ckpt")) for p in theirs]


def test_a_symlink_where_the_temporary_goes_is_never_followed(tmp_path):
    d = str(tmp_path)
    victim = support.write(tmp_path / "victim", b"precious")
    planted = next_temporaries(d, "exp-1.ckpt", 1)[0]
    os.symlink(victim, planted)
    ckpt.save(os.path.join(d, "exp-1.ckpt"), state(), step=1)
    assert support.read(victim) == b"precious" and os.readlink(planted) == victim
    assert ckpt.load(os.path.join(d, "exp-1.ckpt"))["step"] == 4


def test_a_symlink_at_the_final_name_is_replaced_never_followed(tmp_path):
    d = str(tmp_path)
    victim = support.write(tmp_path / "victim", b"precious")
    os.symlink(victim, os.path.join(d, "out.ckpt"))
    with pytest.raises(ckpt.IoError, match="exists and overwrite=False"):
        ckpt.save(os.path.join(d, "out.ckpt"), state(), overwrite=False)
    ckpt.save(os.path.join(d, "out.ckpt"), state())
    assert support.read(victim) == b"precious" and not os.path.islink(os.path.join(d, "out.ckpt"))
    assert sorted(os.listdir(d)) == ["out.ckpt", "victim"]


def test_a_symlink_planted_as_the_lock_file_is_refused_and_its_target_kept(tmp_path):
    """A writer would truncate and write the file a lock-file symlink points to."""
    d = tmp_path / "shared"
    os.mkdir(d)
    victim = support.write(tmp_path / "victim", b"precious")
    os.symlink(victim, d / "exp.lock")
    with pytest.raises(ckpt.IoError, match="the lock file '%s' of prefix 'exp' in '%s' is a symbolic link"
                       % (d / "exp.lock", d)):
        ckpt.save(str(d / "exp-1.ckpt"), state(), step=1)
    assert support.read(victim) == b"precious" and sorted(os.listdir(d)) == ["exp.lock"]
