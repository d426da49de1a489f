"""The shared corpus of hostile files (tests/hostile/, its manifest cases.json), read by the
Python package: every checkpoint case gets the verdict the C++ library gives it, within the
memory and time every reader promises (docs/ROBUSTNESS.md, "Hostile files").

The manifest is a JSON array of cases {"file", "format", "expect", "contains", "why"}: `file`
relative to tests/hostile/, `format` "ckpt", "safetensors", "npz" or "pt" (Python reads only
"ckpt" files), `expect` "ok" or the name of the exception (FormatError, ChecksumError,
VersionError, KeyError, ...) and `contains` a substring of its message. A case may also name
a `key` file (relative to tests/hostile/) and a `max_decoded_bytes`.

Beside the corpus, bodies built here hold hostile values of the kinds that came in ckpt 0.2
(bytes, lists of strings, objects and value maps)."""
import base64
import json
import os
import re
import struct
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


# --------------------------------------------------------------------------- bytes, lists of strings, objects
#
# Bodies built here from docs/FORMAT.md section 3, their checksums right (the writer was hostile,
# not the disk): values of kinds 5 to 7 that claim more than the body holds, codes of a newer
# writer, and value maps that break its rules. Each is refused with its exception, naming the
# file, the entry (and the key), quickly and within little memory.

from support import make_file, string, u32, u64  # noqa: E402

XML_HEAD = (b'<?xml version="1.0" encoding="UTF-8" standalone="yes" ?>\n<!DOCTYPE boost_serialization>\n'
            b'<boost_serialization signature="serialization::archive" version="18">\n')
XML_END = b"</boost_serialization>\n\n"


def _binary(*entries):
    return make_file(u64(len(entries)) + b"".join(entries))


def _entry(name, kind, value):
    return string(name) + u32(kind) + value


def _object(data, encoding=2, type_="map<string, any>"):
    return _entry("m", 7, string(type_) + u32(encoding) + u64(len(data)) + data)


def _map(*items, count=None):
    return u64(len(items) if count is None else count) + b"".join(items)


def _number(key, code, raw):
    return string(key) + b"\1" + u32(code) + raw


def _f64(key, v):
    return _number(key, 1, struct.pack("<d", v))


NEW_KIND_CASES = {
    # codes of a newer writer
    "kind 8": (_binary(_entry("k", 8, bytes(8))), ckpt.VersionError,
               r"entry 'k' has unknown value kind 8 \(this reader knows 0 to 7.*a newer version of ckpt reads it"),
    # a code no writer would number: damage, not a newer writer
    "kind 256": (_binary(_entry("k", 256, b"")), ckpt.FormatError, "is malformed: entry 'k' has unknown value kind 256"),
    "kind 2^32-1": (_binary(_entry("k", 2**32 - 1, b"")), ckpt.FormatError, "unknown value kind 4294967295"),
    "encoding 256": (_binary(_object(b"", encoding=256, type_="T")), ckpt.FormatError,
                     "is malformed: object 'm' has unknown encoding 256"),
    "text kind 8": (make_file(b"22 serialization::archive 18 1 1\n\naw==\n8 0\n", archive=1), ckpt.VersionError,
                    "entry 'k' has unknown value kind 8"),
    "xml kind 8": (make_file(XML_HEAD + b"<entries>1</entries>\n<name>k</name>\n<kind>8</kind>\n<value>0</value>\n"
                             + XML_END, archive=2), ckpt.VersionError, "entry 'k' has unknown value kind 8"),
    "encoding 4": (_binary(_object(b"", encoding=4, type_="T")), ckpt.VersionError,
                   r"object 'm' \(T\) has unknown encoding 4 \(this reader knows 0 to 3.*a newer version of ckpt"),
    "text encoding 4": (make_file(b"22 serialization::archive 18 1 1\n\nbQ==\n7 1\n\nVA==\n4 0\n\n", archive=1),
                        ckpt.VersionError, r"object 'm' \(T\) has unknown encoding 4"),
    "xml encoding 4": (make_file(XML_HEAD + b"<entries>1</entries>\n<name>m</name>\n<kind>7</kind>\n<type>T</type>\n"
                                 b"<encoding>4</encoding>\n<size>0</size>\n<data>\n</data>\n" + XML_END, archive=2),
                       ckpt.VersionError, r"object 'm' \(T\) has unknown encoding 4"),
    "map dtype 17": (_binary(_object(_map(_number("k", 17, b"\0")))), ckpt.VersionError,
                     "the value map of 'm' has unknown dtype code 17 at key 'k'"),
    # sizes and counts beyond the body
    "bytes of 2^62": (_binary(_entry("b", 5, u64(1 << 62) + b"abc")), ckpt.FormatError,
                      "the bytes of 'b' of 4611686018427387904 bytes needs"),
    "bytes of 2^64-1": (_binary(_entry("b", 5, u64(2**64 - 1))), ckpt.FormatError, "the bytes of 'b'"),
    "text bytes of 2^62": (make_file(b"22 serialization::archive 18 1 1\n\nYg==\n5 4611686018427387904\n\nAAAA\n",
                                     archive=1), ckpt.FormatError, "the bytes of 'b' of 4611686018427387904 bytes "
                                                                   "exceeds the body size"),
    "xml bytes of 2^62": (make_file(XML_HEAD + b"<entries>1</entries>\n<name>b</name>\n<kind>5</kind>\n"
                                    b"<size>4611686018427387904</size>\n<data>\nAAAA\n</data>\n" + XML_END, archive=2),
                          ckpt.FormatError, "the bytes of 'b' of 4611686018427387904 bytes exceeds"),
    "xml bytes longer than their size": (make_file(XML_HEAD + b"<entries>1</entries>\n<name>b</name>\n<kind>5</kind>\n"
                                                   b"<size>1</size>\n<data>\nAAAA\n</data>\n" + XML_END, archive=2),
                                         ckpt.FormatError, "the bytes of 'b'"),
    "strings 2^60": (_binary(_entry("s", 6, u64(1 << 60) + bytes(64))), ckpt.FormatError,
                     "entry 's' claims 1152921504606846976 strings"),
    "strings as many as the bytes left": (_binary(_entry("s", 6, u64(4096) + bytes(4096))), ckpt.FormatError,
                                          "string 512 of 's' needs 8 bytes, the body has 0 left"),
    "a string of 2^62": (_binary(_entry("s", 6, u64(2) + string("a") + u64(1 << 62) + b"abc")), ckpt.FormatError,
                         "string 1 of 's' of 4611686018427387904 bytes"),
    "text strings 2^60": (make_file(b"22 serialization::archive 18 1 1\n\ncw==\n6 1152921504606846976 0\n\n",
                                    archive=1), ckpt.FormatError, "entry 's' claims 1152921504606846976 strings"),
    "text strings 2^64": (make_file(b"22 serialization::archive 18 1 1\n\ncw==\n6 18446744073709551616 0\n\n",
                                    archive=1), ckpt.FormatError, "the string count of 's' is 18446744073709551616"),
    "xml strings 2^60": (make_file(XML_HEAD + b"<entries>1</entries>\n<name>s</name>\n<kind>6</kind>\n"
                                   b"<count>1152921504606846976</count>\n<value></value>\n" + XML_END, archive=2),
                         ckpt.FormatError, "entry 's' claims 1152921504606846976 strings"),
    "xml strings fewer than their count": (
        make_file(XML_HEAD + b"<entries>1</entries>\n<name>s</name>\n<kind>6</kind>\n<count>3</count>\n"
                  b"<value>a</value>\n" + XML_END, archive=2), ckpt.FormatError, "expected <value>"),
    "object type of 2^62": (_binary(_entry("o", 7, u64(1 << 62) + b"T")), ckpt.FormatError,
                            "the type of 'o' of 4611686018427387904 bytes"),
    "object data of 2^62": (_binary(_entry("o", 7, string("T") + u32(0) + u64(1 << 62) + b"abc")), ckpt.FormatError,
                            "the data of 'o' of 4611686018427387904 bytes"),
    # value maps that break section 3
    "map keys decreasing": (_binary(_object(_map(_f64("b", 1.0), _f64("a", 2.0)))), ckpt.FormatError,
                            "the value map of 'm' has key 'a' after 'b': keys are in increasing byte order"),
    "map key twice": (_binary(_object(_map(_f64("a", 1.0), _f64("a", 2.0)))), ckpt.FormatError,
                      "the value map of 'm' has key 'a' after 'a'"),
    "map keys in code point order": (_binary(_object(_map(_f64(b"\xff", 1.0), _f64("\ue000", 2.0)))),
                                     ckpt.FormatError, "has key '\ue000' after '\\\\xff'"),
    "map tag 0": (_binary(_object(_map(string("k") + b"\0"))), ckpt.FormatError,
                  r"the value map of 'm' has unknown tag 0 at key 'k' \(it knows 1 number, 2 string, 3 vector\)"),
    "map tag 4": (_binary(_object(_map(string("k") + b"\4" + u64(0)))), ckpt.FormatError,
                  "the value map of 'm' has unknown tag 4 at key 'k'"),
    "map number cut short": (_binary(_object(_map(_number("k", 1, b"\0\0\0")))), ckpt.FormatError,
                             "the value map of 'm' is cut short: the number of key 'k' needs 8 bytes, 3 are left"),
    "map tag cut short": (_binary(_object(_map(string("k")))), ckpt.FormatError,
                          "the value map of 'm' is cut short: the tag of key 'k' needs 1 bytes"),
    "map string cut short": (_binary(_object(_map(string("k") + b"\2" + u64(10) + b"abc"))), ckpt.FormatError,
                             "the value map of 'm' is cut short: the string of key 'k' of 10 bytes"),
    "map vector cut short": (_binary(_object(_map(string("k") + b"\3" + u32(1) + u64(2) + bytes(15)))),
                             ckpt.FormatError, "the value map of 'm' is cut short: the 2 elements of key 'k'"),
    "map fewer items than its count": (_binary(_object(_map(_f64("a", 1.0), count=2))), ckpt.FormatError,
                                       "the value map of 'm' is cut short: the length of key 1 needs 8 bytes"),
    "map bytes after the last item": (_binary(_object(_map(_f64("a", 1.0)) + b"\0")), ckpt.FormatError,
                                      "the value map of 'm' has 1 bytes after its last item"),
    "map count 2^62": (_binary(_object(_map(count=1 << 62) + bytes(32))), ckpt.FormatError,
                       "the value map of 'm' claims 4611686018427387904 items in 32 bytes"),
    "map count 2^64-1": (_binary(_object(_map(count=2**64 - 1))), ckpt.FormatError,
                         "the value map of 'm' claims 18446744073709551615 items in 0 bytes"),
    "map key of 2^62": (_binary(_object(_map(u64(1 << 62) + b"k", count=1))), ckpt.FormatError,
                        "the value map of 'm' is cut short: key 0 of 4611686018427387904 bytes"),
    "map vector of 2^61 float64": (_binary(_object(_map(string("k") + b"\3" + u32(1) + u64(1 << 61) + bytes(64)))),
                                   ckpt.FormatError, "the 2305843009213693952 elements of key 'k' needs "
                                                     "18446744073709551616 bytes, 64 are left"),
    "map bool byte 2": (_binary(_object(_map(_number("k", 6, b"\2")))), ckpt.FormatError,
                        "the value map of 'm' holds bool byte 2 at key 'k'"),
    "map only a count": (_binary(_object(b"\0\0\0")), ckpt.FormatError,
                         "the value map of 'm' is cut short: the item count needs 8 bytes, 3 are left"),
    "text map keys decreasing": (make_file(b"22 serialization::archive 18 1 1\n\nbQ==\n7 1\n\nVA==\n2 %d\n\n%s\n" % (
        len(_map(_f64("b", 1.0), _f64("a", 2.0))), base64.b64encode(_map(_f64("b", 1.0), _f64("a", 2.0)))),
        archive=1), ckpt.FormatError, "the value map of 'm' has key 'a' after 'b'"),
    "xml map tag 9": (make_file(XML_HEAD + b"<entries>1</entries>\n<name>m</name>\n<kind>7</kind>\n<type>T</type>\n"
                                b"<encoding>2</encoding>\n<size>17</size>\n<data>\n%s\n</data>\n" % base64.b64encode(
                                    _map(string("") + b"\x09")) + XML_END, archive=2),
                      ckpt.FormatError, "the value map of 'm' has unknown tag 9 at key ''"),
}


@pytest.mark.parametrize("case", sorted(NEW_KIND_CASES))
def test_hostile_bytes_strings_and_objects(tmp_path, case):
    data, cls, match = NEW_KIND_CASES[case]
    path = support.write(tmp_path / "h\x1b.ckpt", data)
    assert ckpt.verify(path).body_length == len(data) - 64  # the checksums match
    for read in (lambda: ckpt.load(path), lambda: ckpt.load(path, mmap=True), lambda: ckpt.contents(path)):
        tracemalloc.start()
        started = time.monotonic()
        try:
            with pytest.raises(ckpt.Error) as info:
                read()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        e, message = info.value, str(info.value)
        assert type(e) is cls, "%s: %s, expected %s: %s" % (case, type(e).__name__, cls.__name__, message)
        assert re.search(match, message), "%s: %r does not match %r" % (case, message, match)
        assert e.path == path and "h\\x1b.ckpt" in message and support.printable(message), message
        assert time.monotonic() - started < SECONDS
        assert peak < 4 << 20, "%s: %d bytes allocated" % (case, peak)


def test_a_value_map_is_checked_in_every_archive_kind_and_behind_zstd(tmp_path):
    """The same bad map (keys out of order) in a body of each archive kind, as it is and
    compressed (section 9.2): refused alike, after the codec was undone."""
    import zstandard
    good, bad = _map(_f64("a", 2.0), _f64("b", 1.0)), _map(_f64("b", 1.0), _f64("a", 2.0))
    for code, archive in enumerate(("binary", "text", "xml")):
        # the package's body of a valid map of the same length, its map replaced
        path = ckpt.save(str(tmp_path / ("%s.ckpt" % archive)), {"m": {"a": 2.0, "b": 1.0}}, archive=archive,
                         chunk_bytes=0)
        body = support.read(path)[64:]
        assert (good in body) != (base64.b64encode(good) in body)
        body = body.replace(good, bad).replace(base64.b64encode(good), base64.b64encode(bad))
        frame = zstandard.ZstdCompressor(write_content_size=True).compress(body)
        for name, data in (("plain", make_file(body, archive=code)),
                           ("zstd", make_file(u32(len(body)) + u32(len(frame)) + frame, version=2, archive=code,
                                              codecs=(1, 0, 0)))):
            path = support.write(tmp_path / ("%s-%s.ckpt" % (archive, name)), data)
            with pytest.raises(ckpt.FormatError, match="the value map of 'm' has key 'a' after 'b'"):
                ckpt.load(path)
