"""spmdnet.load reads files written by PyTorch 2.13 (tests/fixtures/torch_files,
values checked against the .npz PyTorch wrote beside them), spmdnet.save writes
PyTorch's layout (storages shared, views with offsets and strides), and a file
whose pickle names any other global is refused before anything from it runs."""
import io
import pickle
import zipfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import spmdnet as sn
from spmdnet.serialization import _format

FIXTURES = Path(__file__).parent / "fixtures" / "torch_files"


def _expected(name):
    with np.load(FIXTURES / f"{name}.npz") as f:
        return {k: f[k] for k in f.files}


def _same(tensor, array):
    assert isinstance(tensor, sn.Tensor)
    assert tensor.array.dtype == array.dtype and tensor.shape == array.shape
    np.testing.assert_array_equal(tensor.array, array)


def test_resnet_state_dict_from_pytorch():
    sd = sn.load(FIXTURES / "resnet_state.pt")
    expected = _expected("resnet_state")
    assert type(sd).__name__ == "OrderedDict" and list(sd) == list(expected)
    for key, array in expected.items():
        _same(sd[key], array)
    counter = sd["layer1.0.bn2.num_batches_tracked"]
    assert counter.array.dtype == np.int64 and counter.shape == () and int(counter) == 2


def test_pytorch_resnet_state_runs_in_an_spmdnet_model():
    """The same architecture in spmdnet, loaded from PyTorch's file, gives
    PyTorch's eval-mode output (stored by the fixture script)."""
    nn = sn.nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)

        def forward(self, x):
            inner = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
            return (x + inner).relu()

    class TinyResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(4)
            self.layer1 = nn.Sequential(Block(4))
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            x = self.layer1(self.bn(self.stem(x)).relu())
            return self.fc(x.mean((2, 3)))

    model = TinyResNet()
    model.load_state_dict(sn.load(FIXTURES / "resnet_state.pt"))
    model.eval()
    io_ = _expected("resnet_io")
    with sn.no_grad():
        out = model(sn.tensor(io_["x"]))
    np.testing.assert_allclose(out.array, io_["y"], rtol=1e-5, atol=1e-6)


def test_adamw_state_dict_from_pytorch():
    osd = sn.load(FIXTURES / "adamw_state.pt")
    for key, array in _expected("adamw_state").items():
        index, name = key.split(".")
        _same(osd["state"][int(index)][name], array)
    assert float(osd["state"][0]["step"]) == 2.0 and osd["state"][0]["step"].shape == ()
    (group,) = osd["param_groups"]
    assert group["lr"] == 1e-3 and group["betas"] == (0.9, 0.999)
    assert group["weight_decay"] == 0.01 and group["foreach"] is None
    assert group["params"] == list(range(11))


def test_tied_weights_and_views_stay_shared():
    tied = sn.load(FIXTURES / "tied.pt")
    for key, array in _expected("tied").items():
        _same(tied[key], array)
    assert np.shares_memory(tied["embed.weight"].array, tied["head.weight"].array)
    views = sn.load(FIXTURES / "views.pt")
    for key, array in _expected("views").items():
        _same(views[key], array)
        assert np.shares_memory(views[key].array, views["base"].array)
    views["base"].array[2, 0] = -1.0  # one storage: the row and the transpose see it
    assert views["row"].array[0] == -1.0 and views["t"].array[0, 2] == -1.0


def test_every_dtype_and_the_plain_values_from_pytorch():
    data = sn.load(FIXTURES / "dtypes.pt")
    for key, array in _expected("dtypes").items():
        _same(data["tensors"][key], array)
    assert data["meta"] == {"epoch": 3, "name": "run", "lr": 0.1, "flag": None,
                            "shape": (2, 3), "dtype": np.dtype(np.float16),
                            "pair": (1, [2.0, "x"])}


def test_bfloat16_loads_as_bfloat16_bit_for_bit():
    data = sn.load(FIXTURES / "bfloat16.pt")
    expected = _expected("bfloat16")  # the exact values, as float32
    for name in ("w", "w_view"):
        assert data[name].dtype == sn.bfloat16
        np.testing.assert_array_equal(data[name].array.astype(np.float32), expected[name])
    assert np.shares_memory(data["w"].array, data["w_view"].array)
    assert data["w"].array[2] == np.float32(3.140625)  # a bfloat16 (8 significant bits)


def test_bfloat16_round_trips_every_bit_pattern():
    """Every bfloat16 (NaNs, infinities, subnormals) saved and loaded: the
    same 16 bits; and widened to float32, the float32 with those top bits."""
    raw = np.arange(2**16, dtype=np.uint16)
    back = _round_trip(sn.tensor(raw.view(sn.bfloat16)))
    assert back.dtype == sn.bfloat16
    assert np.array_equal(back.array.view(np.uint16), raw)
    wide = back.array.astype(np.float32)
    assert np.array_equal((wide.view(np.uint32) >> 16).astype(np.uint16), raw)


def _round_trip(obj, **load_args):
    buffer = io.BytesIO()
    sn.save(obj, buffer)
    buffer.seek(0)
    return sn.load(buffer, **load_args)


def test_round_trip_keeps_values_types_and_sharing():
    base = sn.tensor(np.arange(24.0).reshape(4, 6))
    weight = sn.nn.Parameter(np.linspace(-1, 1, 6, dtype=np.float32))
    frozen = sn.nn.Parameter(np.ones(3, np.float32), requires_grad=False)
    obj = {"base": base, "t": base.transpose(0, 1), "cols": base[1:, ::2], "row": base[3],
           "w": weight, "w_again": weight, "frozen": frozen, "scalar": sn.tensor(7),
           "empty": sn.zeros(0, 2), "c": sn.tensor(np.array([1 + 2j], np.complex64)),
           "nested": [1, (2.5, None), {"s": "x", "set": {3, 4}, "z": 1 - 1j}],
           "np_scalar": np.float64(0.25), "array": np.arange(3, dtype=np.int16),
           "dtype": sn.float16, "np_type": np.int32, "dev": sn.device("cuda", 1)}
    back = _round_trip(obj)
    for key in ("base", "t", "cols", "row", "scalar", "empty", "c"):
        _same(back[key], obj[key].array)
    for key in ("t", "cols", "row"):
        assert np.shares_memory(back[key].array, back["base"].array)
        assert back[key].array.strides == obj[key].array.strides
    assert back["w"] is back["w_again"] and isinstance(back["w"], sn.nn.Parameter)
    assert back["w"].requires_grad and not back["frozen"].requires_grad
    _same(back["w"], weight.array)
    assert back["nested"] == [1, (2.5, None), {"s": "x", "set": {3, 4}, "z": 1 - 1j}]
    assert back["np_scalar"] == 0.25 and type(back["np_scalar"]) is float
    _same(back["array"], obj["array"])  # arrays are saved as tensors (PyTorch reads them)
    assert back["dtype"] == np.float16 and back["np_type"] == np.dtype(np.int32)
    assert back["dev"] == sn.device("cuda:1") and isinstance(back["dev"], sn.device)


def test_written_layout_is_pytorchs():
    buffer = io.BytesIO()
    sn.save({"a": sn.ones(3), "b": sn.zeros(2, dtype=sn.int64)}, buffer)
    archive = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    names = archive.namelist()
    assert names[0] == "archive/data.pkl" and "archive/byteorder" in names
    assert archive.read("archive/version") == b"3\n"
    assert archive.read("archive/byteorder") == b"little"
    for info in archive.infolist():
        assert info.compress_type == zipfile.ZIP_STORED
        if info.filename.startswith("archive/data/"):
            start = info.header_offset + 30 + len(info.filename) + len(info.extra)
            assert start % 64 == 0, info.filename
    assert np.frombuffer(archive.read("archive/data/1"), "<i8").tolist() == [0, 0]
    data = archive.read("archive/data.pkl")
    assert data[:2] == b"\x80\x02"  # pickle protocol 2
    for name in (b"torch._utils\n_rebuild_tensor_v2", b"torch\nFloatStorage",
                 b"torch\nLongStorage"):
        assert name in data


def test_pytorch_files_survive_a_round_trip_through_our_writer():
    for name in ("resnet_state", "views", "dtypes"):
        first = sn.load(FIXTURES / f"{name}.pt")
        again = _round_trip(first)
        flat = again["tensors"] if name == "dtypes" else again
        for key, array in _expected(name).items():
            _same(flat[key], array)


def test_paths_and_file_objects(tmp_path):
    path = tmp_path / "state.pt"
    sn.save({"x": sn.arange(4)}, path)
    _same(sn.load(str(path))["x"], np.arange(4))
    with open(path, "rb") as f:
        _same(sn.load(f)["x"], np.arange(4))

    class Pipe(io.RawIOBase):  # a stream that cannot seek (a socket, a pipe)
        def __init__(self, payload):
            self._payload = io.BytesIO(payload)

        def readable(self):
            return True

        def readinto(self, b):
            return self._payload.readinto(b)

    _same(sn.load(Pipe(path.read_bytes()))["x"], np.arange(4))


def _archive_with_pickle(data_pkl, storages=()):
    buffer = io.BytesIO()
    writer = _format.ArchiveWriter(buffer)
    writer.write("data.pkl", data_pkl)
    for key, payload in storages:
        writer.write(f"data/{key}", payload)
    writer.write("version", b"3\n")
    writer.close()
    buffer.seek(0)
    return buffer


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os  # noqa: PLC0415 - the global the malicious pickle names
        return os.system, (f"touch {self.marker}",)


def test_a_file_that_would_run_code_is_refused_with_nothing_run(tmp_path):
    marker = tmp_path / "ran"
    payload = pickle.dumps({"weights": [1.0], "evil": _RunsCode(marker)}, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match=r"GLOBAL (os|posix)\.system"):
        sn.load(_archive_with_pickle(payload))
    assert not marker.exists()


def test_weights_only_refuses_classes_and_false_admits_them(tmp_path):
    model = sn.nn.Linear(2, 3)
    sn.save(model, tmp_path / "model.pt")
    with pytest.raises(pickle.UnpicklingError, match="spmdnet.nn"):
        sn.load(tmp_path / "model.pt")
    back = sn.load(tmp_path / "model.pt", weights_only=False)
    assert isinstance(back, sn.nn.Linear)
    _same(back.weight, model.weight.array)


def test_safe_globals_admit_what_the_user_vouches_for(tmp_path):
    sn.save({"ratio": Fraction(1, 3)}, tmp_path / "f.pt")
    with pytest.raises(pickle.UnpicklingError, match=r"GLOBAL fractions\.Fraction"):
        sn.load(tmp_path / "f.pt")
    with sn.serialization.safe_globals([Fraction]):
        assert sn.load(tmp_path / "f.pt") == {"ratio": Fraction(1, 3)}
    with pytest.raises(pickle.UnpicklingError):
        sn.load(tmp_path / "f.pt")  # the block's admission ended with it
    sn.serialization.add_safe_globals([Fraction])
    try:
        assert sn.load(tmp_path / "f.pt")["ratio"] == Fraction(1, 3)
        assert Fraction in sn.serialization.get_safe_globals()
    finally:
        sn.serialization.clear_safe_globals()


def test_out_of_bounds_layout_is_refused():
    pid = (b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\n"  # ('storage', FloatStorage,
           b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x02tQ")  # '0', 'cpu', 2 elements)
    rebuild = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(" + pid
               + b"K\x00K\x05\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtR.")
    buffer = _archive_with_pickle(rebuild, [("0", np.zeros(2, "<f4").tobytes())])
    with pytest.raises(pickle.UnpicklingError, match="does not fit its storage"):
        sn.load(buffer)


def test_wrong_formats_are_named(tmp_path):
    with pytest.raises(RuntimeError, match="legacy"):
        sn.load(FIXTURES / "legacy.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(RuntimeError, match="not a zip archive"):
        sn.load(tmp_path / "junk.pt")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("folder/readme.txt", "hi")
    with pytest.raises(RuntimeError, match="data.pkl"):
        sn.load(tmp_path / "other.zip")


def _on_cuda_0(obj):
    """A file like ours whose storages say they were saved on cuda:0."""
    buffer = io.BytesIO()
    sn.save(obj, buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    records = [(n.split("/", 1)[1], source.read(n)) for n in source.namelist()]
    data_pkl = dict(records)["data.pkl"].replace(b"X\x03\x00\x00\x00cpu",
                                                 b"X\x06\x00\x00\x00cuda:0")
    return _archive_with_pickle(data_pkl, [(n[5:], p) for n, p in records
                                           if n.startswith("data/")])


@pytest.mark.skipif(sn.cuda.is_available(), reason="checks the CPU-only answer")
def test_map_location_on_a_machine_without_gpu():
    with pytest.raises(RuntimeError, match="map_location='cpu'"):
        sn.load(_on_cuda_0({"x": sn.ones(2)}))
    for where in ("cpu", sn.device("cpu"), {"cuda:0": "cpu"}):
        loaded = sn.load(_on_cuda_0({"x": sn.ones(2)}), map_location=where)
        _same(loaded["x"], np.ones(2, np.float32))
    seen = []

    def record(storage, location):
        seen.append(location)
        return storage

    sn.load(_on_cuda_0({"x": sn.ones(2)}), map_location=record)
    assert seen == ["cuda:0"]


@pytest.mark.skipif(not sn.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_tensors_save_with_their_location_and_load_back_there():
    base = sn.tensor(np.arange(12.0, dtype=np.float32).reshape(3, 4), device="cuda")
    buffer = io.BytesIO()
    sn.save({"base": base, "t": base.transpose(0, 1)}, buffer)
    assert b"cuda:" in zipfile.ZipFile(io.BytesIO(buffer.getvalue())).read("archive/data.pkl")
    buffer.seek(0)
    back = sn.load(buffer)
    assert back["base"].device.type == "cuda" and back["t"].device.type == "cuda"
    np.testing.assert_array_equal(back["t"].array.get(), np.arange(12.0).reshape(3, 4).T)
    back["base"].array[0, 1] = -7.0  # one storage on the GPU too
    assert float(back["t"].array[1, 0]) == -7.0
    buffer.seek(0)
    host = sn.load(buffer, map_location="cpu")
    assert host["base"].device == "cpu"
    views = sn.load(FIXTURES / "views.pt", map_location="cuda")
    for key, array in _expected("views").items():
        assert views[key].device.type == "cuda"
        np.testing.assert_array_equal(views[key].array.get(), array)
