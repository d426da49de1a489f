"""latest(), best() and ls() over directories of runs: by the names (MindSpore's
{prefix}[_{run}]-{epoch}_{step}.ckpt and StepNaming's {prefix}[_{run}]-{global_step}.ckpt),
confirmed by the headers, verified by the checksums; and the C++ tool's choice beside them."""
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ckpt
import support


def put(directory, name, epoch, step, **entries):
    return ckpt.save(os.path.join(directory, name), dict({"w": np.arange(4.0) * step}, **entries), epoch=epoch,
                     step=step)


def damage(path):
    raw = bytearray(support.read(path))
    raw[-1] ^= 0x40
    support.write(path, raw)


def with_record(tool, directory, name, epoch, step, record, key_file=None, **metrics):
    """A checkpoint the C++ library writes with an owner record and recorded metrics (entries
    ckpt.save keeps for the library)."""
    entries = {"w": np.arange(3.0)}
    entries.update({"__ckpt." + k: v for k, v in record.items()})
    entries.update({"__ckpt.metric." + k: float(v) for k, v in metrics.items()})
    npz = os.path.join(directory, ".%s.npz" % name)
    support.write_npz(npz, entries)
    out = tool.import_(npz, os.path.join(directory, name), epoch=epoch, step=step, key_file=key_file)
    os.unlink(npz)
    return str(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of "exp" (the second restarted as exp_1), the newest file of run 1 damaged, one
    whose header disagrees with its name, a temporary, StepNaming files of "st", and names that
    only look like checkpoints of "exp". Tests that add files take a copy (own_runs)."""
    d = str(tmp_path_factory.mktemp("runs"))
    put(d, "exp-1_100.ckpt", 1, 100)
    put(d, "exp-2_200.ckpt", 2, 200)
    put(d, "exp_1-1_50.ckpt", 1, 50)
    put(d, "exp_1-2_80.ckpt", 2, 80)
    put(d, "exp_1-2_90.ckpt", 9, 90)          # its header: epoch 9
    damage(put(d, "exp_1-3_10.ckpt", 3, 10))  # the newest: damaged
    put(d, ".exp_1-4_0.ckpt.tmp-4242-0", 4, 0)  # a save in progress
    put(d, "expert-9_9.ckpt", 9, 9)
    put(d, "exp_x-9_9.ckpt", 9, 9)
    put(d, "exp-9_9.ckpt.bak", 9, 9)
    os.mkdir(os.path.join(d, "exp-10_0.ckpt"))
    put(d, "st-100.ckpt", 1, 100)
    put(d, "st-250.ckpt", 1, 250)
    put(d, "st-300.ckpt", 2, 50)              # a later epoch: its step is within the global step
    put(d, "st-400.ckpt", 1, 399)             # epoch 1, yet not the global step of its name
    return d


@pytest.fixture
def own_runs(runs, tmp_path):
    return shutil.copytree(runs, str(tmp_path / "runs"))


def test_latest_skips_damaged_and_disagreeing_files(runs, caplog):
    skipped = []
    with caplog.at_level(logging.WARNING, logger="ckpt"):
        assert ckpt.latest(runs, "exp", skipped=skipped) == os.path.join(runs, "exp_1-2_80.ckpt")
    assert [os.path.basename(s.path) for s in skipped] == ["exp_1-3_10.ckpt", "exp_1-2_90.ckpt"]
    assert "corrupt body" in skipped[0].reason
    assert skipped[1].reason == "its name says epoch 2 step 90 but its header says epoch 9 step 90"
    assert sum("skipping checkpoint" in r.getMessage() for r in caplog.records) == 2


def test_latest_of_step_names(runs):
    skipped = []
    assert ckpt.latest(runs, "st", skipped=skipped) == os.path.join(runs, "st-300.ckpt")
    assert [(os.path.basename(s.path), s.reason) for s in skipped] == [
        ("st-400.ckpt", "its name says global step 400 but its header says epoch 1 step 399")]


def test_latest_of_run_0_alone(tmp_path):
    d = str(tmp_path)
    for e, s in ((1, 100), (1, 20), (10, 5), (2, 0)):
        put(d, "job-%d_%d.ckpt" % (e, s), e, s)
    assert ckpt.latest(d, "job") == os.path.join(d, "job-10_5.ckpt")  # by number, not text


def test_latest_when_every_file_fails(tmp_path):
    """Files found and none usable is not "no checkpoint": an error listing each, unless
    fall_back=True, which gives None as before."""
    d = str(tmp_path)
    damage(put(d, "exp-1_1.ckpt", 1, 1))
    support.write(os.path.join(d, "exp-1_2.ckpt"), b"")
    skipped = []
    with pytest.raises(ckpt.UnreadableCheckpoints, match="no checkpoint of prefix 'exp' in '%s' can be used: 2 found"
                       % d) as info:
        ckpt.latest(d, "exp", skipped=skipped)
    assert [os.path.basename(s.path) for s in info.value.files] == ["exp-1_2.ckpt", "exp-1_1.ckpt"]
    assert "fall_back=True" in str(info.value) and info.value.directory == d and info.value.prefix == "exp"
    assert [os.path.basename(s.path) for s in skipped] == ["exp-1_2.ckpt", "exp-1_1.ckpt"]
    skipped = []
    assert ckpt.latest(d, "exp", skipped=skipped, fall_back=True) is None
    assert [os.path.basename(s.path) for s in skipped] == ["exp-1_2.ckpt", "exp-1_1.ckpt"]
    assert "is not a ckpt checkpoint" in skipped[0].reason and "corrupt body" in skipped[1].reason


def test_latest_of_nothing(tmp_path):
    with pytest.raises(ckpt.IoError, match="checkpoint directory '%s' does not exist" % (tmp_path / "absent")):
        ckpt.latest(str(tmp_path / "absent"), "exp")
    assert ckpt.latest(str(tmp_path), "exp") is None
    path = put(str(tmp_path), "exp-1_1.ckpt", 1, 1)
    with pytest.raises(ckpt.IoError, match="is not a directory"):
        ckpt.latest(path, "exp")
    for prefix in ("", "a/b", None):
        with pytest.raises(ckpt.ConfigError, match="prefix"):
            ckpt.latest(str(tmp_path), prefix)


def test_ls_marks_what_latest_takes(runs):
    listed = ckpt.ls(runs)
    names = [os.path.basename(c.path) for c in listed]
    assert names == ["exp-1_100.ckpt", "exp-2_200.ckpt", "exp_1-1_50.ckpt", "exp_1-2_80.ckpt", "exp_1-2_90.ckpt",
                     "exp_1-3_10.ckpt", "exp_x-9_9.ckpt", "expert-9_9.ckpt", "st-100.ckpt", "st-250.ckpt",
                     "st-300.ckpt", "st-400.ckpt"]
    by = {os.path.basename(c.path): c for c in listed}
    assert [n for n, c in by.items() if c.latest] == ["exp_1-2_80.ckpt", "exp_x-9_9.ckpt", "expert-9_9.ckpt",
                                                      "st-300.ckpt"]
    assert (by["exp_1-2_80.ckpt"].prefix, by["exp_1-2_80.ckpt"].run) == ("exp", 1)
    assert by["exp_x-9_9.ckpt"].prefix == "exp_x" and by["expert-9_9.ckpt"].prefix == "expert"
    assert "corrupt body" in by["exp_1-3_10.ckpt"].problem and by["exp_1-3_10.ckpt"].header is not None
    assert by["exp_1-2_90.ckpt"].problem.startswith("its name says epoch 2 step 90")
    # named by its global step alone: its epoch and step are its header's
    assert (by["st-300.ckpt"].global_step, by["st-300.ckpt"].epoch, by["st-300.ckpt"].step) == (300, 2, 50)
    assert (by["st-100.ckpt"].epoch, by["st-100.ckpt"].step) == (1, 100)
    assert [c.path for c in ckpt.ls(runs, "st")] == [c.path for c in listed if c.prefix == "st"]


def _cpp_latest(tool, directory, prefix):
    """The file `ckpt ls --json --prefix` marks as latest, or None."""
    out = json.loads(tool.run("ls", "--json", "--prefix", prefix, directory).stdout)
    marked = [c["path"] for g in out["checkpoints"] for c in g["checkpoints"] if c["latest"]]
    assert len(marked) <= 1, marked
    return marked[0] if marked else None


def _cpp_listed(tool, directory, prefix):
    out = json.loads(tool.run("ls", "--json", "--prefix", prefix, directory).stdout)
    return {os.path.basename(c["path"]): c for g in out["checkpoints"] for c in g["checkpoints"]}


@pytest.mark.parametrize("prefix", ["exp", "st", "expert", "nothing"])
def test_latest_agrees_with_the_cpp_tool(tool, runs, prefix):
    assert ckpt.latest(runs, prefix) == _cpp_latest(tool, runs, prefix)
    cpp = _cpp_listed(tool, runs, prefix)
    py = {os.path.basename(c.path): c for c in ckpt.ls(runs, prefix)}
    assert sorted(py) == sorted(cpp)
    for name, c in cpp.items():
        assert (py[name].run, py[name].problem is None, py[name].latest) == (c["run"], c["valid"], c["latest"]), name
        # a file named by its global step alone is at its header's epoch and step in both
        assert (py[name].epoch, py[name].step) == (c["epoch"], c["step"]), name


def test_latest_after_each_change(tool, tmp_path):
    """A directory that grows and is damaged save by save: both pick the same file each time."""
    d = str(tmp_path)
    steps = [(1, 10), (1, 20), (2, 5), (2, 30), (3, 1)]
    for i, (epoch, step) in enumerate(steps):
        put(d, "exp-%d_%d.ckpt" % (epoch, step), epoch, step)
        if i % 2:
            damage(os.path.join(d, "exp-%d_%d.ckpt" % steps[i - 1]))
        assert ckpt.latest(d, "exp") == _cpp_latest(tool, d, "exp") == os.path.join(d, "exp-%d_%d.ckpt" % (epoch, step))
    os.unlink(os.path.join(d, "exp-3_1.ckpt"))
    put(d, "exp_1-1_1.ckpt", 1, 1)  # a restart: run 1 is newer than every file of run 0
    assert ckpt.latest(d, "exp") == _cpp_latest(tool, d, "exp") == os.path.join(d, "exp_1-1_1.ckpt")


def test_a_file_recording_another_owner_is_not_latest(tool, own_runs):
    """Named as run 2 of "exp", it records prefix "other": it is another job's."""
    runs = own_runs
    with_record(tool, runs, "exp_2-1_1.ckpt", 1, 1, {"prefix": "other", "run": "other_2"})
    with_record(tool, runs, "exp_1-2_85.ckpt", 2, 85, {"prefix": "exp", "run": "exp_1"})
    skipped = []
    assert ckpt.latest(runs, "exp", skipped=skipped) == os.path.join(runs, "exp_1-2_85.ckpt")
    assert not any("exp_2" in s.path for s in skipped)
    assert ckpt.latest(runs, "exp") == _cpp_latest(tool, runs, "exp")
    # ls() says so too, as `ckpt ls` does, and marks as latest what latest() returns
    listed = {os.path.basename(c.path): c for c in ckpt.ls(runs, "exp")}
    assert listed["exp_2-1_1.ckpt"].problem == ("named as run 'exp_2' of prefix 'exp' but it records prefix 'other' "
                                                "(run 'other_2'): not that prefix's checkpoint")
    assert [n for n, c in listed.items() if c.latest] == ["exp_1-2_85.ckpt"]
    cpp = _cpp_listed(tool, runs, "exp")
    assert cpp["exp_2-1_1.ckpt"]["problem"] == listed["exp_2-1_1.ckpt"].problem
    assert {n: (c.problem is None, c.latest) for n, c in listed.items()} == {
        n: (c["valid"], c["latest"]) for n, c in cpp.items()}


def test_an_exception_save_written_last_is_the_newest_state(tool, tmp_path):
    d = str(tmp_path)
    put(d, "exp-1_10.ckpt", 1, 10)
    with_record(tool, d, "exp_1-1_20.ckpt", 1, 20, {"prefix": "exp", "run": "exp_1"})
    # written by run 1 after its step 20; an older one of run 0; one recording no run it follows
    bp = with_record(tool, d, "exp_1-1_25_breakpoint.ckpt", 1, 25,
                     {"prefix": "exp", "run": "exp_1", "follows_run": "exp_1"})
    with_record(tool, d, "exp-1_15_breakpoint.ckpt", 1, 15, {"prefix": "exp", "run": "exp", "follows_run": "exp"})
    assert ckpt.latest(d, "exp") == bp
    os.unlink(bp)
    with_record(tool, d, "exp_1-1_30_breakpoint.ckpt", 1, 30, {"prefix": "exp", "run": "exp_1"})
    assert ckpt.latest(d, "exp") == os.path.join(d, "exp_1-1_20.ckpt")
    listed = {os.path.basename(c.path): c for c in ckpt.ls(d, "exp")}
    assert listed["exp_1-1_30_breakpoint.ckpt"].kind == "breakpoint" and not listed["exp_1-1_30_breakpoint.ckpt"].latest


def test_best_by_a_plain_entry(tmp_path):
    d = str(tmp_path)
    for step, loss in ((1, 0.5), (2, 0.25), (3, 0.75), (4, 0.25), (5, float("nan"))):
        put(d, "exp-1_%d.ckpt" % step, 1, step, val_loss=loss, acc=1 - loss)
    assert ckpt.best(d, "exp", "val_loss") == os.path.join(d, "exp-1_4.ckpt")  # the newer of equals
    assert ckpt.best(d, "exp", "acc", mode="max") == os.path.join(d, "exp-1_4.ckpt")
    assert ckpt.best(d, "exp", "val_loss", mode="max") == os.path.join(d, "exp-1_3.ckpt")
    damage(os.path.join(d, "exp-1_4.ckpt"))
    skipped = []
    assert ckpt.best(d, "exp", "val_loss", skipped=skipped) == os.path.join(d, "exp-1_2.ckpt")
    assert [os.path.basename(s.path) for s in skipped] == ["exp-1_4.ckpt"]
    assert ckpt.best(d, "exp", "missing") is None
    with pytest.raises(ckpt.ConfigError, match="mode"):
        ckpt.best(d, "exp", "val_loss", mode="lowest")


@pytest.mark.parametrize("spec,mode", [("val_loss", "min"), ("val_loss:max", "max"), ("acc:max", "max")])
def test_best_agrees_with_the_cpp_tool(tool, tmp_path, spec, mode):
    d = str(tmp_path)
    metric = spec.split(":")[0]
    for i, loss in enumerate((0.9, 0.4, 0.7, 0.4, 0.1, 0.6)):
        path = with_record(tool, d, "exp-1_%d.ckpt" % (i + 1), 1, i + 1, {"prefix": "exp", "run": "exp"},
                           val_loss=loss, acc=1 - loss)
        if loss == 0.1:
            damage(path)  # the best value, but damaged
    out = json.loads(tool.run("ls", "--json", "--prefix", "exp", "--best", spec, d).stdout)
    marked = [c["path"] for g in out["checkpoints"] for c in g["checkpoints"] if c.get("best")]
    assert len(marked) == 1
    assert ckpt.best(d, "exp", metric, mode=mode) == marked[0]
    listed = {os.path.basename(c.path): c for c in ckpt.ls(d, "exp")}
    assert listed["exp-1_2.ckpt"].metrics == {"val_loss": 0.4, "acc": 0.6}


def test_python_ls_json_matches_the_tool(tool, runs):
    env = dict(os.environ, PYTHONPATH=os.path.join(support.SOURCE, "python"), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-m", "ckpt", "ls", "--json", "--prefix", "exp", runs], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    py = {os.path.basename(c["path"]): c for c in json.loads(r.stdout)["checkpoints"]}
    cpp = _cpp_listed(tool, runs, "exp")
    assert sorted(py) == sorted(cpp)
    for name in cpp:
        for field in ("run", "epoch", "step", "kind", "valid", "latest", "save_time"):
            assert py[name][field] == cpp[name][field], (name, field)



# --------------------------------------------------------------------------- saying why nothing was found

ENV = dict(os.environ, PYTHONPATH=os.path.join(support.SOURCE, "python"), PYTHONDONTWRITEBYTECODE="1")


def notices(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "ckpt" and r.levelno == logging.WARNING]


def test_no_checkpoint_of_the_prefix_is_none_with_a_notice(tmp_path, caplog):
    d = str(tmp_path)
    put(d, "heat-1_10.ckpt", 1, 10)
    put(d, "heat_1-1_20.ckpt", 1, 20)
    put(d, "cool-5.ckpt", 1, 5)
    with caplog.at_level(logging.WARNING, logger="ckpt"):
        assert ckpt.latest(d, "heta") is None
        assert ckpt.best(d, "heta", "loss") is None
    assert notices(caplog) == ["no checkpoint of prefix 'heta' in '%s' (prefixes there: 'cool', 'heat')" % d] * 2
    caplog.clear()
    os.mkdir(os.path.join(d, "empty"))
    with caplog.at_level(logging.WARNING, logger="ckpt"):
        assert ckpt.latest(os.path.join(d, "empty"), "heat") is None
    assert notices(caplog) == ["no checkpoint of prefix 'heat' in '%s' (no checkpoint of any prefix there)"
                               % os.path.join(d, "empty")]


def test_the_notice_reaches_stderr_without_any_logging_set_up(tmp_path):
    """Python's last-resort handler prints warnings of a logger nobody configured: a script that
    resumes with latest() sees why it starts over."""
    put(str(tmp_path), "heat-1_10.ckpt", 1, 10)
    r = subprocess.run([sys.executable, "-c", "import ckpt, sys; print(ckpt.latest(sys.argv[1], 'haet'))",
                        str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 0 and r.stdout == "None\n"
    assert r.stderr == "no checkpoint of prefix 'haet' in '%s' (prefixes there: 'heat')\n" % tmp_path


@pytest.mark.parametrize("find", [lambda d: ckpt.latest(d, "exp"), lambda d: ckpt.best(d, "exp", "loss"),
                                  lambda d: ckpt.ls(d), lambda d: ckpt.temporaries(d)],
                         ids=["latest", "best", "ls", "temporaries"])
def test_a_missing_directory_is_an_error(tmp_path, find):
    for missing in (str(tmp_path / "runs"), str(tmp_path / "runs") + "/"):
        with pytest.raises(ckpt.IoError, match="checkpoint directory '%s' does not exist" % missing) as info:
            find(missing)
        assert info.value.errno == 2 and info.value.path == missing


def test_a_directory_under_home_is_found(tmp_path, monkeypatch):
    """"~" is expanded in directories and paths, as a shell would."""
    monkeypatch.setenv("HOME", str(tmp_path))
    os.mkdir(tmp_path / "runs")
    path = ckpt.save("~/runs/exp-1_10.ckpt", {"w": np.arange(3.0)}, epoch=1, step=10, metrics={"loss": 0.5})
    full = str(tmp_path / "runs" / "exp-1_10.ckpt")
    assert path == full and os.path.exists(full)
    assert ckpt.latest("~/runs", "exp") == ckpt.best("~/runs", "exp", "loss") == full
    assert [c.path for c in ckpt.ls("~/runs")] == [full]
    assert ckpt.header("~/runs/exp-1_10.ckpt").step == ckpt.verify("~/runs/exp-1_10.ckpt").step == 10
    assert (ckpt.load("~/runs/exp-1_10.ckpt")["w"] == np.arange(3.0)).all()
    assert [e.name for e in ckpt.contents("~/runs/exp-1_10.ckpt")] == ["w", "__ckpt.metric.loss"]
    target = {"w": np.zeros(3)}
    ckpt.load_into("~/runs/exp-1_10.ckpt", target)
    assert (target["w"] == np.arange(3.0)).all() and ckpt.temporaries("~/runs") == []
    with pytest.raises(ckpt.IoError, match="checkpoint directory '%s' \\('~/nothing'\\) does not exist"
                       % (tmp_path / "nothing")):
        ckpt.latest("~/nothing", "exp")


def test_a_metric_no_file_records_is_none_with_a_notice(tmp_path, caplog):
    d = str(tmp_path)
    for step, loss in ((1, 0.5), (2, 0.25)):
        ckpt.save(os.path.join(d, "exp-1_%d.ckpt" % step), {"w": np.zeros(2)}, epoch=1, step=step,
                  metrics={"val_loss": loss, "acc": 1 - loss})
    with caplog.at_level(logging.WARNING, logger="ckpt"):
        assert ckpt.best(d, "exp", "val_los") is None
    assert notices(caplog) == ["no checkpoint of prefix 'exp' in '%s' records a finite value of metric 'val_los' "
                               "(metrics recorded: 'acc', 'val_loss')" % d]
    caplog.clear()
    put(d, "plain-1_1.ckpt", 1, 1)
    with caplog.at_level(logging.WARNING, logger="ckpt"):
        assert ckpt.best(d, "plain", "val_loss") is None
    assert notices(caplog) == ["no checkpoint of prefix 'plain' in '%s' records a finite value of metric 'val_loss' "
                               "(none records a metric)" % d]


# --------------------------------------------------------------------------- unreadable is not absent

def newer_version(path, field=8, value=struct.pack("<I", 4)):
    """`path` made the file of a newer writer: a header value this reader does not know (the
    format version by default), the header check and checksum made right: intact, not damaged."""
    raw = bytearray(support.read(path))
    raw[field:field + len(value)] = value
    support.write(path, support.reseal(raw))
    return path


def test_a_newest_checkpoint_this_version_cannot_read_stops_latest(tmp_path, caplog):
    d = str(tmp_path)
    older = put(d, "exp-1_10.ckpt", 1, 10)
    newest = newer_version(put(d, "exp-1_20.ckpt", 1, 20))
    with pytest.raises(ckpt.UnreadableCheckpoints) as info:
        ckpt.latest(d, "exp")
    e = info.value
    assert str(e).startswith("checkpoint '%s' of prefix 'exp' in '%s' cannot be read here: checkpoint '%s' has "
                             "format version 4" % (newest, d, newest))
    assert "upgrade ckpt" in str(e) and "fall_back=True" in str(e) and older not in str(e)
    assert [f.path for f in e.files] == [newest] and e.path == newest and isinstance(e, ckpt.Error)
    # passing over it is asked for: the older one, the newer one reported
    skipped = []
    with caplog.at_level(logging.WARNING, logger="ckpt"):
        assert ckpt.latest(d, "exp", skipped=skipped, fall_back=True) == older
    assert [s.path for s in skipped] == [newest] and "format version 4" in skipped[0].reason
    assert any("skipping checkpoint '%s'" % newest in m for m in notices(caplog))
    # alone, with fall_back: None
    os.unlink(older)
    assert ckpt.latest(d, "exp", fall_back=True) is None
    with pytest.raises(ckpt.UnreadableCheckpoints, match="format version 4"):
        ckpt.latest(d, "exp")


def test_damaged_files_before_an_unreadable_one_are_named_with_it(tmp_path):
    d = str(tmp_path)
    put(d, "exp-1_10.ckpt", 1, 10)
    unreadable = newer_version(put(d, "exp-1_20.ckpt", 1, 20))
    damaged = put(d, "exp-1_30.ckpt", 1, 30)
    damage(damaged)
    skipped = []
    with pytest.raises(ckpt.UnreadableCheckpoints) as info:
        ckpt.latest(d, "exp", skipped=skipped)
    assert [f.path for f in info.value.files] == [damaged, unreadable]
    assert "passed over before it, as damaged: checkpoint '%s' has a corrupt body" % damaged in str(info.value)
    assert [s.path for s in skipped] == [damaged]


@pytest.mark.parametrize("field,value,match", [
    (12, b"\x03", "unknown archive kind 3"),
    (13, b"\x03", "unknown codec 3"),
])
def test_header_values_of_a_newer_writer_are_version_errors(tmp_path, field, value, match):
    path = put(str(tmp_path), "exp-1_1.ckpt", 1, 1)
    raw = bytearray(support.read(path))
    struct.pack_into("<I", raw, 8, 2)  # a version 2 header, whose codec list may name codecs
    support.write(path, support.reseal(raw))
    newer_version(path, field, value)
    with pytest.raises(ckpt.VersionError, match=match):
        ckpt.verify(path)
    with pytest.raises(ckpt.UnreadableCheckpoints, match=match):
        ckpt.latest(str(tmp_path), "exp")
    # the same byte in a header whose check fails is damage, not a newer writer
    raw = bytearray(support.read(path))
    raw[40] ^= 1
    support.write(path, raw)
    with pytest.raises(ckpt.ChecksumError, match="corrupt header"):
        ckpt.verify(path)


def test_an_unknown_dtype_in_a_verified_body_is_a_version_error(tmp_path):
    body = support.u64(1) + support.tensor_toc("t", 19, [1], 1)
    path = support.write(tmp_path / "d.ckpt", support.make_file(body + support.payload(len(body), b"\x01")))
    ckpt.verify(path)  # intact
    for mmap in (False, True):
        with pytest.raises(ckpt.VersionError, match="checkpoint '%s': tensor 't' has unknown dtype code 19 \\(this "
                           "reader knows 0 to 16" % path):
            ckpt.load(path, mmap=mmap)


def test_an_encrypted_exception_save_without_its_key_stops_latest(tool, tmp_path, other_key_file):
    """Written after the newest regular checkpoint, it may be the newest state: without its
    key, latest() cannot tell, and says so."""
    d = str(tmp_path)
    regular = put(d, "exp-1_10.ckpt", 1, 10)
    bp = with_record(tool, d, "exp-1_15_breakpoint.ckpt", 1, 15, {"prefix": "exp", "run": "exp", "follows_run": "exp"},
                     key_file=other_key_file)
    with pytest.raises(ckpt.UnreadableCheckpoints, match="pass its key") as info:
        ckpt.latest(d, "exp")
    assert [f.path for f in info.value.files] == [bp]
    assert ckpt.latest(d, "exp", key=other_key_file) == bp
    assert ckpt.latest(d, "exp", fall_back=True) == regular


def test_best_refuses_what_it_cannot_read(tmp_path, other_key_file):
    """Any file may hold the best value: one this reader cannot read stops best() too."""
    d = str(tmp_path)
    for step, loss in ((1, 0.5), (2, 0.25)):
        ckpt.save(os.path.join(d, "exp-1_%d.ckpt" % step), {"w": np.zeros(2)}, epoch=1, step=step,
                  metrics={"loss": loss})
    secret = ckpt.save(os.path.join(d, "exp-1_3.ckpt"), {"w": np.zeros(2)}, epoch=1, step=3, metrics={"loss": 0.1},
                       key=other_key_file)
    newer = newer_version(ckpt.save(os.path.join(d, "exp-1_4.ckpt"), {"w": np.zeros(2)}, epoch=1, step=4,
                                    metrics={"loss": 0.05}))
    with pytest.raises(ckpt.UnreadableCheckpoints) as info:
        ckpt.best(d, "exp", "loss")
    assert [f.path for f in info.value.files] == [secret, newer]
    assert "pass its key" in str(info.value) and "upgrade ckpt" in str(info.value)
    assert "fall_back=True to rank the others" in str(info.value)
    skipped = []
    assert ckpt.best(d, "exp", "loss", skipped=skipped, fall_back=True) == os.path.join(d, "exp-1_2.ckpt")
    assert [s.path for s in skipped] == [secret, newer]
    os.unlink(newer)
    assert ckpt.best(d, "exp", "loss", key=other_key_file) == secret
    # every file damaged: not None
    for f in os.listdir(d):
        if f.endswith(".ckpt"):
            damage(os.path.join(d, f))
    with pytest.raises(ckpt.UnreadableCheckpoints, match="can be used: 3 found"):
        ckpt.best(d, "exp", "loss", key=other_key_file)
    assert ckpt.best(d, "exp", "loss", key=other_key_file, fall_back=True) is None


MISSING_ZSTANDARD = textwrap.dedent("""
    import sys
    sys.modules["zstandard"] = None   # as where python3-zstandard is not installed: import fails
    import ckpt
    try:
        ckpt.best(sys.argv[1], "exp", "loss")
    except ckpt.UnreadableCheckpoints as e:
        print(e)
    print(ckpt.best(sys.argv[1], "exp", "loss", fall_back=True))
    """)


def test_a_codec_whose_module_is_missing_is_not_damage(tmp_path):
    d = str(tmp_path)
    plain = ckpt.save(os.path.join(d, "exp-1_1.ckpt"), {"w": np.zeros(2)}, epoch=1, step=1, metrics={"loss": 0.5})
    packed = ckpt.save(os.path.join(d, "exp-1_2.ckpt"), {"w": np.zeros(2)}, epoch=1, step=2, metrics={"loss": 0.1},
                       zstd=3)
    r = subprocess.run([sys.executable, "-c", MISSING_ZSTANDARD, d], capture_output=True, text=True, env=ENV,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("checkpoint '%s' of prefix 'exp' in '%s' cannot be read here: checkpoint '%s' cannot be "
                               "decoded here: this checkpoint needs the Python module 'zstandard'" % (packed, d, packed))
    assert "install the module it names" in lines[0] and lines[1] == plain


def _tree(tool, d):
    """Checkpoints in subdirectories (one too deep for `ckpt ls`), .ckpt files of no series,
    files whose owner record names another prefix, and symlinks to a file and to a directory."""
    put(d, "exp-1_10.ckpt", 1, 10)
    ckpt.save(os.path.join(d, "final.ckpt"), {"w": np.zeros(2)}, epoch=3, step=7)
    support.write(os.path.join(d, "broken.ckpt"), b"junk")
    with_record(tool, d, "exp_1-50.ckpt", 1, 50, {"prefix": "exp_1", "run": "exp_1"})  # prefix "exp_1"'s file
    with_record(tool, d, "exp_2-60.ckpt", 1, 60, {"prefix": "other", "run": "other"})  # renamed by hand
    with_record(tool, d, "exp_4-80.ckpt", 1, 80, {"prefix": "exp", "run": "exp_9"})
    deep = os.path.join(d, "sub")
    os.makedirs(os.path.join(deep, "deeper"))
    put(deep, "exp-2_20.ckpt", 2, 20)
    put(deep, "exp-2_30.ckpt", 2, 30)
    put(os.path.join(deep, "deeper"), "job-5.ckpt", 1, 5)
    five = os.path.join(d, "a", "b", "c", "d", "e")
    os.makedirs(os.path.join(five, "f"))
    put(five, "x-1.ckpt", 1, 1)                   # 5 levels down: listed
    put(os.path.join(five, "f"), "y-1.ckpt", 1, 1)  # 6: not
    os.symlink(".", os.path.join(d, "loop"))
    os.symlink("final.ckpt", os.path.join(d, "link.ckpt"))


@pytest.mark.parametrize("prefix", [None, "exp"])
def test_ls_reads_subdirectories_and_judges_files_as_the_cpp_tool_does(tool, tmp_path, prefix):
    d = str(tmp_path)
    _tree(tool, d)
    py = {os.path.relpath(c.path, d): c for c in ckpt.ls(d, prefix)}
    out = json.loads(tool.run("ls", "--json", d, *(["--prefix", prefix] if prefix else [])).stdout)
    cpp = {os.path.relpath(c["path"], d): dict(c, prefix=g["prefix"] or None) for g in out["checkpoints"]
           for c in g["checkpoints"]}
    assert sorted(py) == sorted(cpp)
    assert ("a/b/c/d/e/x-1.ckpt" in py, "a/b/c/d/e/f/y-1.ckpt" in py) == (prefix is None, False)
    assert ("final.ckpt" in py, "sub/deeper/job-5.ckpt" in py) == (prefix is None, prefix is None)
    for name, c in cpp.items():
        p = py[name]
        assert (p.prefix, p.problem is None, p.latest) == (c["prefix"], c["valid"], c["latest"]), name
        assert (p.run, p.epoch, p.step) == (c.get("run"), c.get("epoch", p.epoch), c.get("step", p.step)), name
        if "records prefix" in (c.get("problem") or ""):
            assert p.problem == c["problem"], name
    assert py["exp_1-50.ckpt"].prefix == "exp_1" and py["exp_1-50.ckpt"].latest
    assert "records prefix 'other'" in py["exp_2-60.ckpt"].problem
    assert [n for n, c in py.items() if c.latest] == (
        ["exp-1_10.ckpt", "exp_1-50.ckpt", "sub/exp-2_30.ckpt"] if prefix else
        ["exp-1_10.ckpt", "exp_1-50.ckpt", "a/b/c/d/e/x-1.ckpt", "sub/exp-2_30.ckpt", "sub/deeper/job-5.ckpt"])
    if prefix is None:
        assert (py["final.ckpt"].kind, py["final.ckpt"].run, py["final.ckpt"].epoch) == (None, None, 3)
        assert "is not a ckpt checkpoint" in py["broken.ckpt"].problem and py["link.ckpt"].problem is None
    assert "records prefix 'exp' (run 'exp_9')" in py["exp_4-80.ckpt"].problem


def test_a_file_over_the_decoded_budget_is_unreadable_not_damaged(tmp_path):
    """best() decodes every file; one that would decode to more than max_decoded_bytes may be
    whole: it is not passed over as damaged, and the error says what to do."""
    d = str(tmp_path)
    for step, loss in ((1, 0.5), (2, 0.25)):
        ckpt.save(os.path.join(d, "exp-1_%d.ckpt" % step), {"w": np.zeros(1000)}, epoch=1, step=step, zstd=3,
                  metrics={"loss": loss})
    assert ckpt.best(d, "exp", "loss") == os.path.join(d, "exp-1_2.ckpt")
    with pytest.raises(ckpt.UnreadableCheckpoints, match="decodes to more than 100 bytes .*pass a larger "
                       "max_decoded_bytes") as info:
        ckpt.best(d, "exp", "loss", max_decoded_bytes=100)
    assert len(info.value.files) == 2
    assert ckpt.best(d, "exp", "loss", max_decoded_bytes=100, fall_back=True) is None
