"""latest(), best() and ls() over directories of runs: by the names (MindSpore's
{prefix}[_{run}]-{epoch}_{step}.ckpt and StepNaming's {prefix}[_{run}]-{global_step}.ckpt),
confirmed by the headers, verified by the checksums; and the C++ tool's choice beside them."""
import json
import logging
import os
import shutil
import subprocess
import sys

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


def with_record(tool, directory, name, epoch, step, record, **metrics):
    """A checkpoint the C++ library writes with an owner record and recorded metrics (entries
    ckpt.save keeps for the library)."""
    entries = {"w": np.arange(3.0)}
    entries.update({"__ckpt." + k: v for k, v in record.items()})
    entries.update({"__ckpt.metric." + k: float(v) for k, v in metrics.items()})
    npz = os.path.join(directory, ".%s.npz" % name)
    support.write_npz(npz, entries)
    out = tool.import_(npz, os.path.join(directory, name), epoch=epoch, step=step)
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
    d = str(tmp_path)
    damage(put(d, "exp-1_1.ckpt", 1, 1))
    support.write(os.path.join(d, "exp-1_2.ckpt"), b"")
    skipped = []
    assert ckpt.latest(d, "exp", skipped=skipped) is None
    assert [os.path.basename(s.path) for s in skipped] == ["exp-1_2.ckpt", "exp-1_1.ckpt"]
    assert "is not a ckpt checkpoint" in skipped[0].reason and "corrupt body" in skipped[1].reason


def test_latest_of_nothing(tmp_path):
    assert ckpt.latest(str(tmp_path / "absent"), "exp") is None
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
    assert (by["st-300.ckpt"].global_step, by["st-300.ckpt"].epoch) == (300, 1)
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
        assert (py[name].run, py[name].epoch, py[name].step, py[name].problem is None, py[name].latest) == (
            c["run"], c["epoch"], c["step"], c["valid"], c["latest"]), name


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
