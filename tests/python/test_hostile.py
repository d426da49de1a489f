"""The shared corpus of hostile files (tests/hostile/, its manifest cases.json), read by the
Python package: every checkpoint case gets the verdict the C++ library gives it, within the
memory and time every reader promises (docs/ROBUSTNESS.md, "Hostile files").

The manifest is a JSON array of cases {"file", "format", "expect", "contains", "why"}: `file`
relative to tests/hostile/, `format` "ckpt", "safetensors", "npz" or "pt" (Python reads only
"ckpt" files), `expect` "ok" or the name of the exception (FormatError, ChecksumError,
VersionError, KeyError, ...) and `contains` a substring of its message. A case may also name
a `key` file (relative to tests/hostile/) and a `max_decoded_bytes`."""
import json
import os
import time
import tracemalloc

import pytest

import ckpt
import support

HOSTILE = os.path.join(support.SOURCE, "tests", "hostile")
MANIFEST = os.path.join(HOSTILE, "cases.json")
SECONDS = 2.0   # what reading one file of the corpus may take, at most (they are small)


def _cases(manifest):
    with open(manifest, encoding="utf-8") as f:
        cases = json.load(f)
    assert isinstance(cases, list) and cases, "%s holds no array of cases" % manifest
    for c in cases:
        assert {"file", "format", "expect"} <= set(c), "a case without file, format or expect: %r" % (c,)
    return cases


def _ckpt_cases():
    if not os.path.exists(MANIFEST):
        return []
    return [c for c in _cases(MANIFEST) if c["format"] == "ckpt"]


def _outcome(read, path):
    """(the name of the exception `read()` raised, or "ok"; its message, or ""), checking that
    an error is a ckpt error naming the file, printable, and that reading stayed within the
    bounds of memory (the default budget over the file) and time."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        read()
        got, message = "ok", ""
    except ckpt.Error as e:
        got, message = type(e).__name__, str(e)
        assert e.path == path and support.printable(message), "%s: %r" % (path, message)
        assert ckpt.errors.printable(path) in message, "%s: the message does not name the file: %s" % (path, message)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    took = time.monotonic() - started
    budget = max(ckpt.codecs.DEFAULT_DECODED_FLOOR, ckpt.codecs.DEFAULT_DECODED_RATIO * os.path.getsize(path))
    assert peak <= 3 * os.path.getsize(path) + budget + (16 << 20), "%s: %d bytes allocated" % (path, peak)
    assert took < SECONDS, "%s: read in %.2f s" % (path, took)
    return got, message


def check_case(directory, case):
    """Reads case `case` of a manifest in `directory` as ckpt.load and ckpt.verify do, and
    checks the verdict: load() raises the exception `expect` names, its message holding
    `contains` (or returns, for "ok"); verify(), which reads only the header and checks the
    checksum, raises the same or nothing (and nothing for "ok")."""
    path = os.path.join(directory, case["file"])
    options = {}
    if case.get("key"):
        options["key"] = os.path.join(directory, case["key"])
    if case.get("max_decoded_bytes") is not None:
        options["max_decoded_bytes"] = case["max_decoded_bytes"]
    want, contains = case["expect"], case.get("contains", "")
    why = "%s (%s)" % (case["file"], case.get("why", "no reason given"))
    got, message = _outcome(lambda: ckpt.load(path, **options), path)
    assert got == want, "%s: ckpt.load: %s, expected %s: %s" % (why, got, want, message)
    assert contains in message, "%s: ckpt.load's message does not hold %r: %s" % (why, contains, message)
    got, message = _outcome(lambda: ckpt.verify(path), path)
    if want == "ok":
        assert got == "ok", "%s: ckpt.verify: %s: %s" % (why, got, message)
    elif got != "ok":
        assert got == want and contains in message, "%s: ckpt.verify: %s, expected %s (or ok): %s" % (
            why, got, want, message)


def test_the_manifest_lists_files_that_are_there():
    assert os.path.exists(MANIFEST), "the shared corpus has no manifest: %s" % MANIFEST
    cases = _cases(MANIFEST)
    for c in cases:
        assert c["format"] in ("ckpt", "safetensors", "npz", "pt"), c
        assert os.path.isfile(os.path.join(HOSTILE, c["file"])), "%s: no such file" % c["file"]
    assert any(c["format"] == "ckpt" for c in cases)


CASES = _ckpt_cases()


@pytest.mark.parametrize("case", CASES, ids=["%s-%d" % (c["file"], i) for i, c in enumerate(CASES)])
def test_a_hostile_checkpoint_gets_the_verdict_of_the_manifest(case):
    check_case(HOSTILE, case)
