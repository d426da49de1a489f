"""Generated round trips: random dictionaries of every dtype, rank 0 to 6, in C and Fortran
order, empty tensors, long and non-ASCII names and scalars at their extremes, saved and loaded in
Python for each archive kind and codec chain; and a smaller set across languages, checked by the
C++ tool."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import ckpt
import support
from support import ARCHIVES, CODECS, DTYPES

KEY = ckpt.Key(bytes(range(50, 82)))


def generated(examples):
    """Settings of these tests: the profile's (conftest.py), `examples` cases, and tmp_path
    shared by a test's cases (each overwrites the same files)."""
    return settings(max_examples=examples, suppress_health_check=list(settings().suppress_health_check)
                    + [HealthCheck.function_scoped_fixture])


def names(alphabet=None):
    """Entry names: short or a few hundred characters long (a short text repeated, and another
    after it: generating every character of long texts is slow), any Unicode (or `alphabet`),
    never the reserved prefix."""
    text = (lambda **kw: st.text(alphabet, **kw)) if alphabet is not None else (lambda **kw: st.text(**kw))
    long = st.builds(lambda part, times, tail: part * times + tail, text(min_size=1, max_size=8),
                     st.integers(20, 50), text(max_size=8))
    return st.one_of(text(max_size=12), long).filter(lambda n: not n.startswith("__ckpt."))


def tensors(max_dims=6):
    """Arrays in C order, or in Fortran order (saved column-major, FORMAT.md 3.1, when that is
    not also C order)."""
    @st.composite
    def build(draw):
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=3))
        a = draw(hnp.arrays(dtype, shape))
        return np.asfortranarray(a) if draw(st.booleans(), label="fortran order") else a
    return st.one_of(build(), st.just(np.zeros((2, 0), dtype="<f4")), st.just(np.zeros((0,), dtype="|b1")))


INT64 = st.one_of(st.sampled_from([-2**63, 2**63 - 1, 0, -1, 1]), st.integers(-2**63, 2**63 - 1))


def doubles(finite, nan=True):
    extremes = [-0.0, 0.0, 5e-324, -1.7976931348623157e308, 2.2250738585072014e-308]
    if not finite:
        extremes += [math.inf, -math.inf] + [math.nan] * nan
    return st.one_of(st.sampled_from(extremes), st.floats(allow_nan=not finite and nan, allow_infinity=not finite))


def values(finite, text=st.text(max_size=40), max_dims=6, nan=True):
    return st.one_of(tensors(max_dims), INT64, doubles(finite, nan), st.booleans(), text)


def dicts(finite, name=names(), **kw):
    return st.dictionaries(name, values(finite, **kw), max_size=8)


def _codec_args(codec, zstd_level=1):
    return {"zstd": zstd_level if "zstd" in codec else None, "key": KEY if "aes" in codec else None}


@pytest.mark.parametrize("codec", CODECS)
@generated(30)
@given(data=st.data(), archive=st.sampled_from(ARCHIVES), epoch=st.integers(0, 2**63 - 1),
       step=st.integers(0, 2**63 - 1))
def test_round_trip_in_python(tmp_path, codec, data, archive, epoch, step):
    """Every codec chain, each with archive kinds drawn."""
    event("archive %s" % archive)
    entries = data.draw(dicts(finite=archive != "binary"), label="entries")
    path = str(tmp_path / "g.ckpt")
    ckpt.save(path, entries, epoch=epoch, step=step, archive=archive, **_codec_args(codec))
    h = ckpt.header(path)
    version = 2 if codec != "none" else 3 if archive == "binary" else 1
    assert (h.archive, h.epoch, h.step, h.version) == (archive, epoch, step, version)
    for mmap in (True, False):
        support.assert_entries(ckpt.load(path, key=KEY, mmap=mmap), entries)
    kinds = {np.ndarray: "tensor", int: "int64", float: "double", bool: "bool", str: "string"}
    assert [(e.name, e.kind) for e in ckpt.contents(path, key=KEY)] == [(n, kinds[type(v)])
                                                                      for n, v in entries.items()]


@generated(30)
@given(entries=st.dictionaries(names(), tensors(), max_size=6), archive=st.sampled_from(ARCHIVES))
@example(entries={"": np.zeros((2, 0), dtype="<f8"), "x" * 300: np.array(True), "日本": np.array(-0.0, "<f2")},
         archive="xml")
def test_load_into_what_was_saved(tmp_path, entries, archive):
    path = ckpt.save(str(tmp_path / "g.ckpt"), entries, archive=archive)
    targets = {n: np.zeros_like(a) for n, a in entries.items()}
    report = ckpt.load_into(path, targets)
    assert report.complete and not report.mismatched and report.rest == {}
    for n, a in entries.items():
        assert targets[n].tobytes() == a.tobytes(), n


# --------------------------------------------------------------------------- bytes, lists of strings, value maps

def map_numbers():
    """Numbers of a value map: Python bool, int and float, and NumPy scalars of every dtype
    NumPy has (bfloat16 and float8 have none)."""
    scalars = st.sampled_from(DTYPES).flatmap(
        lambda d: hnp.arrays(np.dtype(d), ()).map(lambda a: a[()]))
    return st.one_of(st.booleans(), INT64, doubles(finite=False), scalars)


def map_vectors():
    return st.sampled_from(DTYPES).flatmap(
        lambda d: hnp.arrays(np.dtype(d), hnp.array_shapes(min_dims=1, max_dims=1, min_side=0, max_side=5)))


value_maps = st.dictionaries(names(), st.one_of(map_numbers(), st.text(max_size=20), map_vectors()), max_size=6)
new_kinds = st.one_of(st.binary(max_size=300), st.lists(st.text(max_size=20), max_size=6), value_maps)


def _loaded(v):
    """What ckpt.load gives for a value saved in a value map."""
    if isinstance(v, str):
        return v
    if type(v) is bool:
        return np.bool_(v)
    if isinstance(v, int):
        return np.int64(v)
    if isinstance(v, float) and not isinstance(v, np.generic):
        return np.float64(v)
    a = np.asarray(v)
    a = a.astype(a.dtype.newbyteorder("<"))
    return a[()] if a.ndim == 0 else a


def _same(got, want):
    if isinstance(want, (np.ndarray, np.generic)):
        return type(got) is type(want) and got.dtype == want.dtype and got.tobytes() == want.tobytes()
    return type(got) is type(want) and got == want


@pytest.mark.parametrize("codec", CODECS)
@generated(30)
@given(data=st.data(), archive=st.sampled_from(ARCHIVES))
def test_bytes_strings_and_maps_round_trip_in_python(tmp_path, codec, data, archive):
    entries = data.draw(st.dictionaries(names(), new_kinds, max_size=6), label="entries")
    path = ckpt.save(str(tmp_path / "k.ckpt"), entries, archive=archive, **_codec_args(codec))
    got = ckpt.load(path, key=KEY)
    assert list(got) == list(entries)
    for name, v in entries.items():
        if isinstance(v, dict):
            keys = sorted(v, key=lambda k: k.encode("utf-8", "surrogateescape"))
            assert type(got[name]) is dict and list(got[name]) == keys, name
            for k in keys:
                assert _same(got[name][k], _loaded(v[k])), (name, k, got[name][k], v[k])
        else:
            assert type(got[name]) is type(v) and got[name] == v, name


# --------------------------------------------------------------------------- across languages

# Names an npz member can carry to the C++ tool unchanged: printable, not empty (".npy" is no
# member name). Strings without NUL (NumPy's fixed-width strings drop trailing NULs).
ZIP_SAFE = st.characters(blacklist_categories=("Cs", "Cc"))
npz_names = names(ZIP_SAFE).filter(bool)
npz_text = st.text(ZIP_SAFE, max_size=40)

pairs = st.tuples(st.sampled_from(ARCHIVES), st.sampled_from(CODECS))


@generated(15)
@given(data=st.data(), kinds=st.tuples(pairs, pairs))
def test_python_files_checked_by_the_cpp_tool(tool, tmp_path, data, kinds):
    """Two Python-written files of the same entries, of different archive kinds or codecs: the
    C++ tool verifies both (decrypting) and finds every entry bit-equal."""
    (archive_a, codec_a), (archive_b, codec_b) = kinds
    # `ckpt diff` compares double scalars by value: no NaN scalar (NaN elements are compared bit
    # for bit)
    entries = data.draw(dicts(finite=archive_a != "binary" or archive_b != "binary", nan=False), label="entries")
    key_file = support.write_key(tmp_path / "k.key", KEY.raw())
    a = ckpt.save(str(tmp_path / "a.ckpt"), entries, archive=archive_a, **_codec_args(codec_a, 3))
    b = ckpt.save(str(tmp_path / "b.ckpt"), entries, archive=archive_b, **_codec_args(codec_b, 1))
    tool.verify(a, key_file=key_file)
    tool.verify(b, key_file=key_file)
    tool.assert_bit_equal(a, b, key_file=key_file)


@generated(15)
@given(entries=st.dictionaries(npz_names, tensors(), min_size=1, max_size=6), kind=pairs)
def test_python_tensors_equal_to_the_numpy_npz(tool, tmp_path, entries, kind):
    archive, codec = kind
    key_file = support.write_key(tmp_path / "k.key", KEY.raw())
    support.write_npz(tmp_path / "g.npz", entries)
    path = ckpt.save(str(tmp_path / "g.ckpt"), entries, archive=archive, **_codec_args(codec, 2))
    tool.assert_bit_equal(path, tmp_path / "g.npz", key_file=key_file)


@generated(15)
@given(data=st.data(), kind=pairs)
def test_cpp_files_read_in_python(tool, tmp_path, data, kind):
    archive, codec = kind
    entries = data.draw(st.dictionaries(npz_names, values(archive != "binary", text=npz_text), min_size=1,
                                        max_size=6), label="entries")
    key_file = support.write_key(tmp_path / "k.key", KEY.raw())
    support.write_npz(tmp_path / "g.npz", entries)
    tool.import_(tmp_path / "g.npz", tmp_path / "g.ckpt", archive=archive, zstd=2 if "zstd" in codec else None,
                 key_file=key_file if "aes" in codec else None)
    support.assert_entries(ckpt.load(tmp_path / "g.ckpt", key=KEY), entries)


M = 1 << 20
BOUNDARY_SIZES = [0, 1, 100, (64 << 10) - 1, 64 << 10, (64 << 10) + 1, M - 100, M - 1, M, M + 1, 2 * M + 3]


@generated(12)
@given(layout=st.lists(st.tuples(st.sampled_from(BOUNDARY_SIZES), st.sampled_from(["random", "zeros", "string"])),
                       min_size=1, max_size=4),
       level=st.sampled_from([1, 3]))
def test_zstd_blocks_cut_where_the_cpp_library_cuts_them(tool, tmp_path, layout, level):
    """Payloads and strings of sizes around the 64 KiB stream buffer and the 1 MiB block, in a
    row: the same blocks, hence the same bytes, as the C++ library's binary body."""
    rng = np.random.default_rng(len(layout))
    entries = {"first": np.arange(3, dtype=np.int32)}
    for i, (size, fill) in enumerate(layout):
        entries["e%d" % i] = ("s" * size if fill == "string" else np.zeros(size, dtype=np.uint8) if fill == "zeros"
                              else rng.integers(0, 256, size, dtype=np.uint8))
    support.write_npz(tmp_path / "b.npz", entries)
    cpp = support.read(tool.import_(tmp_path / "b.npz", tmp_path / "cpp.ckpt", zstd=level))
    py = support.read(ckpt.save(str(tmp_path / "py.ckpt"), entries, zstd=level))
    assert py[:48] == cpp[:48] and py[64:] == cpp[64:]
