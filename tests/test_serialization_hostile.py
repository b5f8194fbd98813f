"""Hostile and broken files against ``spmdnet.load(f)`` (``weights_only=True``,
the default): pickles assembled opcode by opcode and zip archives written
record by record. Each must be refused with one ``pickle.UnpicklingError``
naming the file and the reason (or, where the file is valid, load its
value), fast and without a large allocation; and after each, a clean file
(the canary) still loads exactly, and no class or shared object the
loader uses has changed."""
import collections
import io
import pickle
import struct
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

import spmdnet as sn
from spmdnet.serialization import _rebuild

FIXTURES = Path(__file__).parent / "fixtures" / "torch_files"
NAME = "hostile.pt"  # every hostile file is read from a file object of this name

# -- pickle opcodes, assembled by hand ------------------------------------------
P2 = b"\x80\x02"


def glob(module, name):
    return b"c" + f"{module}\n{name}\n".encode()


def text(s):
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def small(n):
    return b"K" + bytes([n])


def pid(key="0", kind="FloatStorage", location="cpu", numel=4):
    """BINPERSID of ('storage', torch.<kind>, key, location, numel)."""
    return (b"(" + text("storage") + glob("torch", kind) + text(key) + text(location)
            + b"J" + struct.pack("<i", numel) + b"tQ")


def rebuild(size=(4,), stride=(1,), **storage):
    """torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())"""
    dims = b"(" + b"".join(small(n) for n in size) + b"t"
    steps = b"(" + b"".join(small(n) for n in stride) + b"t"
    return (glob("torch._utils", "_rebuild_tensor_v2") + b"(" + pid(**storage) + small(0)
            + dims + steps + b"\x89" + glob("collections", "OrderedDict") + b")RtR")


def doubling(levels):
    """A tuple DAG of ``levels`` levels, each holding the previous one
    twice through the memo: 2**levels leaves if expanded, 3 bytes a level."""
    out = b")"
    for level in range(levels):
        out += b"q" + bytes([level]) + b"h" + bytes([level]) + b"\x86"
    return out


FOUR_FLOATS = np.arange(4, dtype="<f4").tobytes()


# -- zip archives, record by record -----------------------------------------------
def archive(data_pkl, storages=(("0", FOUR_FLOATS),), extra=()):
    """A well-formed torch.save archive around ``data_pkl``."""
    return raw_zip([("archive/data.pkl", data_pkl)]
                   + [(f"archive/data/{k}", p) for k, p in storages]
                   + [("archive/version", b"3\n"), *extra])


def raw_zip(records):
    """A zip written byte by byte. A record is (name, payload) stored, or
    (name, payload, method, declared size, crc) for lying or compressed
    ones: what zipfile would not write."""
    out, central = io.BytesIO(), b""
    for record in records:
        name, payload = record[0].encode(), record[1]
        method, size, crc = (record[2:] if len(record) > 2
                             else (0, len(payload), zlib.crc32(payload)))
        offset = out.tell()
        fields = (20, 0, method, 0, 33, crc, len(payload), size, len(name))
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields, 0) + name + payload)
        central += (struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, *fields, 0, 0, 0, 0,
                                0o600 << 16, offset) + name)
    start = out.tell()
    out.write(central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(records),
                                    len(records), len(central), start, 0))
    return out.getvalue()


def deflated_zeros(nbytes):
    """(raw deflate stream, crc) of ``nbytes`` zero bytes, made in
    milliseconds: after a full flush zlib's output for a block of zeros is
    the same each time, so one block's bytes are repeated."""
    block = 1 << 20
    assert nbytes % block == 0
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = z.compress(bytes(block)) + z.flush(zlib.Z_FULL_FLUSH)
    again = z.compress(bytes(block)) + z.flush(zlib.Z_FULL_FLUSH)
    assert z.compress(bytes(block)) + z.flush(zlib.Z_FULL_FLUSH) == again
    return first + again * (nbytes // block - 1) + z.flush(), 0


# -- the canary and the shared state every load must leave alone --------------------
def _canary_value():
    weight = sn.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    return collections.OrderedDict(weight=weight, view=weight[1], steps=sn.tensor(7),
                                   meta={"size": (2, 3), "name": "canary", "dtype": sn.float64})


CANARY = io.BytesIO()
sn.save(_canary_value(), CANARY)


def check_canary():
    back = sn.load(io.BytesIO(CANARY.getvalue()))
    assert type(back) is collections.OrderedDict and list(back) == ["weight", "view", "steps",
                                                                    "meta"]
    assert back["weight"].array.dtype == np.float32 and type(back["weight"]) is sn.Tensor
    np.testing.assert_array_equal(back["weight"].array, np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(back["view"].array, [3.0, 4.0, 5.0])
    assert np.shares_memory(back["weight"].array, back["view"].array)
    assert back["steps"].array.dtype == np.int64 and back["steps"].item() == 7
    assert back["meta"] == {"size": (2, 3), "name": "canary", "dtype": np.dtype(np.float64)}
    resnet = sn.load(FIXTURES / "resnet_state.pt")
    with np.load(FIXTURES / "resnet_state.npz") as expected:
        assert sorted(resnet) == sorted(expected.files)
        for key in expected.files:
            assert resnet[key].array.dtype == expected[key].dtype
            np.testing.assert_array_equal(resnet[key].array, expected[key])


def snapshot():
    """What a hostile file could have changed: the classes and the shared
    objects of the allow-list, and the admitted globals."""
    kinds = {k: (v.name, v.dtype_name) for k, v in _rebuild.ALLOWED.items()
             if isinstance(v, _rebuild.StorageType)}
    dtypes = {k: (v.str, v.kind, v.itemsize) for k, v in _rebuild.ALLOWED.items()
              if isinstance(v, np.dtype)}
    # copyreg caches ``__slotnames__`` on a class the first time one of its
    # objects is copied or pickled: Python's own bookkeeping, not a file's doing
    classes = (sn.Tensor, sn.nn.Parameter, sn.device, _rebuild.StorageType,
               collections.OrderedDict)
    return {"classes": [{k: v for k, v in vars(c).items() if k != "__slotnames__"}
                        for c in classes],
            "allowed": dict(_rebuild.ALLOWED), "kinds": kinds, "dtypes": dtypes,
            "size": (_rebuild._size.__defaults__, dict(vars(_rebuild._size))),
            "rebuild": _rebuild._rebuild_tensor_v2.__defaults__,
            "device": (sn.device("cuda", 1).type, sn.device("cuda", 1).index),
            "safe": sn.serialization.get_safe_globals()}


BEFORE = snapshot()


def refused(data, reason, **kwargs):
    """Load ``data`` (bytes of a file): one UnpicklingError naming the file
    and matching ``reason``, no chained cause, then the canary."""
    stream = io.BytesIO(data)
    stream.name = NAME
    with pytest.raises(pickle.UnpicklingError, match=reason) as info:
        sn.load(stream, **kwargs)
    assert str(info.value).startswith(f"{NAME}: "), str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__ in (True, False)
    assert snapshot() == BEFORE
    check_canary()
    return info.value


def bounded(data, reason=None, seconds=2.0, peak_mb=32, **kwargs):
    """Refused (or, with ``reason`` None, loaded) within ``seconds`` and
    ``peak_mb`` MiB of Python-tracked allocation (NumPy's included)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        if reason is None:
            result = sn.load(io.BytesIO(data), **kwargs)
        else:
            result = refused(data, reason, **kwargs)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert elapsed < seconds and peak < peak_mb, (elapsed, peak)
    assert snapshot() == BEFORE
    check_canary()
    return result


# -- a file that changes the process for later loads: nothing is changed --------------
SHARED_STATE = {
    "BUILD onto torch.FloatStorage (its dtype)": (
        glob("torch", "FloatStorage") + b"}" + text("dtype_name") + text("int32") + b"sb",
        "BUILD onto a StorageType, which this file did not create"),
    "a failing load after BUILD onto FloatStorage": (
        glob("torch", "FloatStorage") + b"N}" + text("dtype_name") + text("int32")
        + b"s\x86b0" + glob("os", "system"),
        "BUILD onto a StorageType"),
    "BUILD __setstate__ onto the Tensor class": (
        glob("torch", "Tensor") + b"}" + text("__setstate__") + glob("builtins", "print")
        + b"sb", "Unsupported global: GLOBAL builtins.print"),
    "BUILD __reduce__ onto the Tensor class": (
        glob("torch", "Tensor") + b"N}" + text("__reduce__") + glob("torch", "Size")
        + b"s\x86b", "BUILD onto a type, which this file did not create"),
    "BUILD __defaults__ onto torch.Size": (
        glob("torch", "Size") + b"N}" + text("__defaults__") + small(5) + b"\x85s\x86b",
        "BUILD onto a function"),
    "BUILD onto a dtype (np.dtype.__setstate__)": (
        glob("torch", "float32") + b"(K\x03" + text("<") + b"NNNJ\xff\xff\xff\xffJ\x04\x00"
        b"\x00\x00K\x00tb", r"BUILD onto a \w*DType, which this file did not create"),
    "BUILD onto a device": (
        glob("torch", "device") + text("cpu") + b"\x85R}" + text("type") + text("cuda")
        + b"sb", r"setting the state of a device \(BUILD\) is not admitted"),
    "a Tensor whose .array is a str (BUILD)": (
        rebuild() + b"N}" + text("array") + text("abc") + b"s\x86b",
        "BUILD would set attributes of a Tensor"),
    "a Tensor without .array (NEWOBJ)": (
        glob("torch", "Tensor") + b")\x81", r"creating Tensor through __new__"),
    "Tensor('abc') called by the file": (
        glob("torch", "Tensor") + text("abc") + b"\x85R", "calling Tensor is not admitted"),
    "Tensor({...}) called by the file": (
        glob("torch", "Tensor") + b"}" + small(1) + small(2) + b"s\x85R",
        "calling Tensor is not admitted"),
    "SETITEM onto a shared dtype": (
        glob("torch", "float32") + small(1) + small(2) + b"s", r"SETITEM onto a \w*DType"),
    "APPEND onto a storage shared between tensors": (
        pid() + small(1) + b"a", "APPEND onto a ndarray"),
    "BUILD onto a storage shared between tensors": (
        pid() + b"}b", "BUILD onto a ndarray"),
    "BUILD onto the OrderedDict class": (
        glob("collections", "OrderedDict") + b"N}" + text("keys") + small(1) + b"s\x86b",
        "BUILD onto a type"),
    "BUILD replacing an OrderedDict's method": (
        glob("collections", "OrderedDict") + b")R}" + text("keys") + small(1) + b"sb",
        "not a plain attribute"),
}


@pytest.mark.parametrize("case", list(SHARED_STATE))
def test_nothing_shared_is_changed(case):
    body, reason = SHARED_STATE[case]
    refused(archive(P2 + body + b"."), reason)


def test_dunder_free_state_dict_metadata_still_loads():
    """What BUILD is for: a state dict's ``_metadata`` attribute."""
    data = (P2 + glob("collections", "OrderedDict") + b")R" + text("w") + rebuild() + b"s}"
            + text("_metadata") + b"}" + text("") + b"}" + text("version") + small(1)
            + b"sssb.")
    back = sn.load(io.BytesIO(archive(data)))
    assert back._metadata == {"": {"version": 1}}
    np.testing.assert_array_equal(back["w"].array, np.arange(4.0))
    check_canary()


# -- zip records: duplicated, ambiguous, lying about their size --------------------
def test_duplicate_and_ambiguous_records_are_refused():
    good = P2 + rebuild() + b"."
    twice = raw_zip([("archive/data.pkl", good), ("archive/data/0", FOUR_FLOATS),
                     ("archive/data/0", np.full(4, 7, "<f4").tobytes())])
    refused(twice, r"1 duplicated record\(s\) \('archive/data/0'\).*ambiguous")
    two_pickles = raw_zip([("archive/data.pkl", good), ("other/data.pkl", good),
                           ("archive/data/0", FOUR_FLOATS)])
    refused(two_pickles, "holds 2 data.pkl records")
    outside = archive(good, extra=[("elsewhere/data/0", FOUR_FLOATS)])
    refused(outside, "lies outside the archive's folder 'archive/'")


def test_a_storage_record_must_hold_exactly_its_tensor():
    refused(archive(P2 + rebuild() + b".", [("0", FOUR_FLOATS[:8])]),
            "holds 8 bytes, but its tensors need 4 float32 elements of 4 bytes = 16")
    refused(archive(P2 + rebuild() + b".", [("0", FOUR_FLOATS + bytes(4))]),
            "holds 20 bytes")


def test_a_deflated_bomb_is_refused_before_it_is_inflated():
    """3 GiB of zeros deflated into 3 MiB, named by a 4-element tensor:
    refused from the record's declared size, nothing inflated."""
    stream, crc = deflated_zeros(3 << 30)
    assert len(stream) < 4 << 20
    bomb = raw_zip([("archive/data.pkl", P2 + rebuild() + b"."),
                    ("archive/data/0", stream, 8, 3 << 30, crc)])
    bounded(bomb, "holds 3221225472 bytes, but its tensors need 4 float32")


def test_the_total_size_limit_is_the_callers(monkeypatch):
    """An honest 16 MiB deflated storage: refused under a smaller limit
    (the keyword, or SPMDNET_LOAD_MAX_BYTES) before anything is read; loaded
    under a larger one, equal to what was written."""
    stream, _ = deflated_zeros(16 << 20)
    numel = (16 << 20) // 4
    data = raw_zip([("archive/data.pkl", P2 + rebuild(size=(), stride=(), numel=numel) + b"."),
                    ("archive/data/0", stream, 8, 16 << 20, zlib.crc32(bytes(16 << 20)))])
    bounded(data, "needs 16777216 bytes more: past the limit of 1048576 bytes", max_bytes=1 << 20)
    monkeypatch.setenv("SPMDNET_LOAD_MAX_BYTES", str(1 << 20))
    bounded(data, "or SPMDNET_LOAD_MAX_BYTES")
    back = sn.load(io.BytesIO(data), max_bytes=17 << 20)
    assert back.shape == () and back.item() == 0.0  # a 0-d view of the first element
    monkeypatch.setenv("SPMDNET_LOAD_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="SPMDNET_LOAD_MAX_BYTES='lots'"):
        sn.load(io.BytesIO(data))


def test_records_lying_about_their_size_or_method():
    good = P2 + rebuild() + b"."
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    packed = deflate.compress(FOUR_FLOATS) + deflate.flush()
    ok = raw_zip([("archive/data.pkl", good),
                  ("archive/data/0", packed, 8, 16, zlib.crc32(FOUR_FLOATS))])
    np.testing.assert_array_equal(sn.load(io.BytesIO(ok)).array, np.arange(4.0))  # PyTorch too
    impossible = raw_zip([("archive/data.pkl", good),
                          ("archive/data/0", packed, 8, 1 << 31, 0)])
    refused(impossible, "declares 2147483648 bytes from .* deflated bytes, which that method "
                        "cannot produce")
    refused(raw_zip([("archive/data.pkl", good), ("archive/data/0", packed, 12, 16, 0)]),
            "compression method 12: PyTorch's reader, and spmdnet's, read stored and deflated")
    refused(raw_zip([("archive/data.pkl", good), ("archive/data/0", FOUR_FLOATS, 0, 16, 7)]),
            r"record 'archive/data/0' is damaged \(BadZipFile: Bad CRC-32")
    refused(raw_zip([("archive/data.pkl", good), ("archive/data/0", b"\xff" * 9, 8, 16, 0)]),
            r"record 'archive/data/0' is damaged \(error: Error -3")
    whole = archive(good)
    refused(whole[:len(whole) - 30], r"damaged zip archive \(BadZipFile")
    stored_lie = raw_zip([("archive/data.pkl", good), ("archive/data/0", FOUR_FLOATS, 0, 1 << 30,
                                                       0)])
    refused(stored_lie, "declares 1073741824 bytes from 16 stored bytes")


# -- the pickle's own memory and time bombs ------------------------------------------
def test_a_huge_memo_index_costs_nothing():
    """LONG_BINPUT 2**29 - 1 (Python's C unpickler sizes its memo to it,
    ~8 GiB): a valid pickle, loaded at once."""
    data = archive(P2 + b"]r\xff\xff\xff\x1f" + b"j\xff\xff\xff\x1f" + b"\x86.")
    assert bounded(data) == ([], [])
    refused(archive(P2 + b"]r\xff\xff\xff\x1fj\xfe\xff\xff\x1f."),
            "memo index 536870910 was never put")


def test_shared_references_cannot_expand():
    """Graphs of 2**60 leaves built from 180 bytes of memo references."""
    location = b"(" + text("storage") + glob("torch", "FloatStorage") + text("0")
    as_location = P2 + location + doubling(60) + small(4) + b"tQ."
    bounded(archive(as_location), "storage location a tuple of 2 items is not a device name")
    as_tensor = P2 + glob("torch", "Tensor") + doubling(60) + b"\x85R."
    bounded(archive(as_tensor), "calling Tensor is not admitted")
    as_key = P2 + b"}" + doubling(60) + small(1) + b"s."
    bounded(archive(as_key), "used as a dict key or set item expands to more than 10000")
    in_set = P2 + b"(" + doubling(60) + b"\x91."
    bounded(archive(in_set), "expands to more than 10000")
    as_size = P2 + glob("torch", "Size") + doubling(60) + b"\x85R."
    bounded(archive(as_size), r"torch.Size's argument is a tuple of 2 items, not an int")
    as_pid = P2 + doubling(60) + b"Q."
    bounded(archive(as_pid), "persistent id a tuple of 2 items is not a torch storage")
    shared = P2 + doubling(60) + b"."  # loading the graph itself is fine: nothing walks it
    value = bounded(archive(shared))
    assert value[0] is value[1]


def test_deep_nesting_is_bounded_without_recursion():
    deep = P2 + b"]" * 20_000 + b"a" * 19_999 + b"."
    bounded(archive(deep), "nest more than 500 levels deep")
    fine = P2 + b"]" * 400 + b"a" * 399 + b"."
    value = sn.load(io.BytesIO(archive(fine)))
    for _ in range(399):
        value = value[0]
    assert value == []


def test_depth_through_shared_containers_counts():
    """Lists L0 > L1 > ... > L1999 pickled leaf first, so that each level is
    a memo reference: Python's pickler writes it without recursing, and the
    result's 2000 levels are refused though no single walk goes deep."""
    chain = [[]]
    for _ in range(1999):
        chain.append([chain[-1]])
    bounded(archive(pickle.dumps(chain, 2)), "nest more than 500 levels deep")


def test_many_keys_sharing_one_large_tuple_are_bounded():
    """20,000 dict keys (i, T) with T a tuple of 9,000 items through the memo:
    1.8 * 10**8 items hashed from a 200 kB pickle; refused at 10 per byte."""
    big = b"(" + small(0) * 9000 + b"tq\x00"
    keys = b"".join(b"J" + struct.pack("<i", i) + b"h\x00\x86N" for i in range(20_000))
    data = P2 + b"}" + big + b"0(" + keys + b"u."
    bounded(archive(data), "hold more than 10 items per byte of the pickle", seconds=5)


def test_objects_built_count_against_the_byte_limit():
    """200,000 empty lists from 200 kB of one-byte opcodes (~60 bytes each
    in memory): refused under a 1 MiB limit, loaded under the default."""
    data = archive(P2 + b"(" + b"]" * 200_000 + b"l.")
    refused(data, "builds more containers and objects than the load's byte limit",
            max_bytes=1 << 20)
    assert len(sn.load(io.BytesIO(data))) == 200_000


def test_an_enormous_view_of_a_small_storage_is_refused():
    too_big = (P2 + glob("torch._utils", "_rebuild_tensor_v2") + b"(" + pid() + small(0)
               + b"(\x8a\x05\x00\x00\x00\x00\x01\x8a\x05\x00\x00\x00\x00\x01t(K\x00K\x00t"
               + b"\x89" + glob("collections", "OrderedDict") + b")RtR.")
    bounded(archive(too_big), "calling _rebuild_tensor_v2 failed: ValueError: array is too big")


# -- everything else broken: one clear UnpicklingError each ---------------------------
UNCLEAR = {
    "no STOP": (P2 + small(1), "ends at byte 4 without its STOP opcode"),
    "not an opcode": (P2 + b"\xff.", r"opcode b'\\xff' at byte 2 is not a pickle opcode"),
    "extension code": (P2 + b"\x82\x01.", "opcode 'EXT1' at byte 2 is not admitted"),
    "out-of-band buffer": (P2 + b"\x97.", "opcode 'NEXT_BUFFER' at byte 2 is not admitted"),
    "empty stack": (P2 + b"s.", r"pops an empty stack \(opcode SETITEM at byte 2\)"),
    "no MARK": (P2 + b"]e.", "needs a MARK that is not there"),
    "APPEND onto an int": (P2 + small(1) + small(2) + b"a.", "APPEND onto 1"),
    "unhashable key": (P2 + b"}]" + small(1) + b"s.", "a list of 0 items cannot be a dict key"),
    "cut inside an opcode": (P2 + b"X\xff\x00\x00\x00ab", "ends inside the opcode"),
    "a 5000-digit INT": (P2 + b"I" + b"9" * 5000 + b"\n.", "is not an integer"),
    "protocol 6": (b"\x80\x06N.", "pickle protocol 6"),
    "bad UTF-8": (P2 + b"X\x01\x00\x00\x00\xff.", "not valid UTF-8"),
    "a persistent id of 3 items": (P2 + b"(" + text("storage") + small(1) + small(2) + b"tQ.",
                                   "persistent id a tuple of 3 items is not a torch storage"),
    "a missing storage record": (P2 + rebuild(key="9") + b".", "no storage record data/'9'"),
    "a negative size": (P2 + glob("torch._utils", "_rebuild_tensor_v2") + b"(" + pid()
                        + small(0) + b"J\xff\xff\xff\xff\x85K\x01\x85\x89}tR.",
                        r"bad tensor layout in file: offset 0, size \(-1,\)"),
    "a layout past its storage": (P2 + rebuild(size=(5,)) + b".",
                                  r"tensor of size \(5,\), stride \(1,\), offset 0 does not fit"),
    "float dims": (P2 + glob("torch", "Size") + b"(G?\xf0\x00\x00\x00\x00\x00\x00t\x85R.",
                   "torch.Size's argument is 1.0, not an int"),
    "an unknown device": (P2 + rebuild(location="tpu:0") + b".", "'tpu:0' is not a device"),
    "requires_grad on integers": (
        P2 + glob("torch._utils", "_rebuild_tensor_v2") + b"(" + pid(kind="LongStorage",
                                                                     numel=2)
        + small(0) + b"K\x02\x85K\x01\x85\x88}tR.",
        "calling _rebuild_tensor_v2 failed: TypeError: only floating point tensors can require"),
    "hooks on a parameter": (
        P2 + glob("torch._utils", "_rebuild_parameter") + b"(" + rebuild() + b"\x88}"
        + small(1) + small(2) + b"stR.", "backward hooks in a file"),
    "a global that runs code": (P2 + glob("os", "system") + text("echo hi") + b"\x85R.",
                                "Unsupported global: GLOBAL os.system"),
    "a device of a list": (P2 + glob("torch", "device") + b"]\x85R.",
                           "torch.device takes a name and an index, got a list of 0 items"),
}


@pytest.mark.parametrize("case", list(UNCLEAR))
def test_each_broken_pickle_is_named(case):
    body, reason = UNCLEAR[case]
    storages = [("0", FOUR_FLOATS)] if b"LongStorage" not in body else [("0", bytes(16))]
    refused(archive(body, storages), reason)


def test_formats_that_are_not_torch_save_files():
    error = refused(b"not a checkpoint at all", "not a zip archive")
    assert isinstance(error, RuntimeError)  # as before, and as PyTorch's reader raises
    refused((FIXTURES / "legacy.pt").read_bytes(), "legacy")
    refused(raw_zip([("folder/readme.txt", b"hi")]), "has no <archive>/data.pkl")


# -- what a valid file may hold: unchanged, and the protocols Python writes ------------
def test_plain_data_of_every_protocol_loads_as_python_reads_it():
    value = {"ints": [0, -1, 255, 65535, 2**31, -2**63, 2**100], "floats": [1.5, -0.0],
             "text": ["", "é", "x" * 300], "bytes": b"\x00\xff", "nested": ((1,), [2], {3}),
             "frozen": frozenset({(1, 2)}), "complex": 1 + 2j, "none": None, "bools": [True],
             "od": collections.OrderedDict(a=1), "shared": [[1]] * 2}
    for protocol in range(6):
        data = pickle.dumps(value, protocol)
        assert sn.load(io.BytesIO(archive(data, ()))) == value, protocol
    check_canary()


def test_pytorch_fixtures_still_load_exactly():
    for name in ("dtypes", "adamw_state", "tied", "views"):
        loaded = sn.load(FIXTURES / f"{name}.pt")
        assert loaded is not None
    check_canary()
    assert snapshot() == BEFORE


def test_python_attributes_on_pytorch_tensors_are_dropped_with_a_warning():
    """attrs.pt (PyTorch 2.13): a Parameter with ``.tag`` and a tensor with
    ``.note``; spmdnet's tensors have no ``__dict__``: values load, each
    dropped attribute is named."""
    with pytest.warns(UserWarning) as caught:
        back = sn.load(FIXTURES / "attrs.pt")
    said = " ".join(str(w.message) for w in caught)
    assert "Parameter in the file carries Python attributes ('tag')" in said
    assert "tensor in the file carries Python attributes ('note')" in said
    assert type(back["p"]) is sn.nn.Parameter and back["p"].requires_grad
    assert type(back["t"]) is sn.Tensor
    np.testing.assert_array_equal(back["p"].array, np.ones(2, np.float32))
    np.testing.assert_array_equal(back["t"].array, np.ones(2, np.float32))
    check_canary()


def test_weights_only_none_is_true_as_in_pytorch():
    refused(archive(P2 + glob("os", "system") + b"."), "GLOBAL os.system", weights_only=None)


def test_weights_only_false_still_runs_pythons_unpickler(tmp_path):
    path = tmp_path / "f.pt"
    sn.save({"x": sn.tensor([1.0, 2.0]), "d": collections.Counter("aab")}, path)
    back = sn.load(path, weights_only=False)
    assert back["d"] == collections.Counter("aab")
    refused(path.read_bytes(), "GLOBAL collections.Counter")


def test_tensors_of_str_dict_or_none_are_type_errors():
    """PyTorch 2.13: ``torch.Tensor("abc")`` and ``torch.tensor("abc")`` raise
    TypeError "new(): invalid data type 'str'", ``torch.Tensor({1: 2})``
    TypeError (``torch.tensor({1: 2})`` RuntimeError); never a str or
    object tensor."""
    for make in (sn.Tensor, sn.tensor, sn.as_tensor, sn.nn.Parameter):
        for data, message in (("abc", "new\\(\\): invalid data type 'str'"),
                              (b"ab", "invalid data type 'bytes'"),
                              ({1: 2}, "cannot make a tensor of dict data"),
                              ({1, 2}, "cannot make a tensor of set data"),
                              (None, "cannot make a tensor of NoneType data"),
                              ([1, "a"], "cannot make a tensor of list data")):
            with pytest.raises(TypeError, match=message):
                make(data)
    assert sn.tensor([1, 2.5]).dtype == sn.float32 and sn.tensor(True).dtype == sn.bool
