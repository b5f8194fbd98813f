"""Image data: the MNIST / CIFAR-10 writers on small files written here in
the exact formats, the restricted unpickler, and the batch transforms
(against plain-NumPy loops, and their seeding through the DataLoader)."""
import gzip
import pickle

import numpy as np
import pytest

from spmdnet.data import ArrayDataset, DataLoader, DistributedSampler, HDF5Dataset, datasets
from spmdnet.data import transforms as T
from tests.test_hdf5 import Solo, idx_bytes


def cifar_batch(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, 10, n)


def write_cifar_bin(path, data, labels):
    path.write_bytes(np.concatenate([labels.astype(np.uint8)[:, None], data], axis=1).tobytes())


def write_cifar_pickle(path, data, labels, protocol=2):
    batch = {b"batch_label": b"training batch 1 of 5", b"labels": [int(v) for v in labels],
             b"data": data, b"filenames": [b"img_%d.png" % i for i in range(len(labels))]}
    path.write_bytes(pickle.dumps(batch, protocol=protocol))


@pytest.mark.parametrize("version", ["bin", "py2", "py5"])
def test_make_cifar10_from_either_version(tmp_path, version):
    (d1, l1), (d2, l2) = cifar_batch(3, 0), cifar_batch(2, 1)
    paths = []
    for i, (d, lab) in enumerate([(d1, l1), (d2, l2)], 1):
        if version == "bin":
            paths.append(tmp_path / f"data_batch_{i}.bin")
            write_cifar_bin(paths[-1], d, lab)
        else:
            paths.append(tmp_path / f"data_batch_{i}")
            write_cifar_pickle(paths[-1], d, lab, protocol=2 if version == "py2" else 5)
    out = datasets.make_cifar10(paths, tmp_path / "c.h5", comm=Solo())
    x, y = HDF5Dataset(out)[np.arange(5)]
    expected = np.concatenate([d1, d2]).reshape(5, 3, 32, 32) / 255.0
    assert x.shape == (5, 3, 32, 32) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_allclose(x, expected, rtol=1e-6)
    assert y.tolist() == np.concatenate([l1, l2]).tolist()
    flat = datasets.make_cifar10(paths[0], tmp_path / "f.h5", comm=Solo(), layout="flat")
    np.testing.assert_allclose(HDF5Dataset(flat)[np.arange(3)][0], d1 / 255.0, rtol=1e-6)


def test_cifar10_bad_files_are_named(tmp_path):
    cut = tmp_path / "data_batch_1.bin"
    cut.write_bytes(b"\0" * 3074)
    with pytest.raises(ValueError, match="3074 bytes is not a whole number") as err:
        datasets.read_cifar10(cut)
    assert str(cut) in str(err.value)
    wrong = tmp_path / "wrong"
    wrong.write_bytes(pickle.dumps({b"labels": [1]}))
    with pytest.raises(ValueError, match="not a CIFAR-10 python batch"):
        datasets.read_cifar10(wrong)


class Evil:
    def __reduce__(self):
        import os  # noqa: PLC0415 - the global the malicious pickle names
        return os.system, ("echo pwned > /dev/null",)


@pytest.mark.parametrize("payload, name", [
    (b"cos\nsystem\n(S'echo pwned'\ntR.", "os.system"),
    (pickle.dumps(Evil()), "system"),
    (pickle.dumps({b"data": Evil(), b"labels": []}), "system"),
    (b"cbuiltins\neval\n(S'1'\ntR.", "builtins.eval"),
    (pickle.dumps(np.array([Evil()], dtype=object)), "system"),  # inside an object array
])
def test_the_restricted_unpickler_refuses_other_globals(tmp_path, payload, name):
    path = tmp_path / "data_batch_1"
    path.write_bytes(payload)
    with pytest.raises(ValueError, match=f"refusing to load global .*{name}") as err:
        datasets.read_cifar10(path)
    assert str(path) in str(err.value)


def test_the_restricted_unpickler_loads_plain_data():
    data = {b"k": [1, 2.5, "s", b"b", (3, None, True)], "a": np.arange(6.0).reshape(2, 3)}
    for protocol in (2, 4, 5):
        back = datasets.restricted_load(pickle.dumps(data, protocol=protocol))
        assert back[b"k"] == data[b"k"]
        np.testing.assert_array_equal(back["a"], data["a"])


@pytest.mark.parametrize("layout, shape", [("image", (4, 1, 5, 6)), ("flat", (4, 30))])
def test_make_mnist_layouts(tmp_path, layout, shape):
    images = np.random.default_rng(0).integers(0, 256, (4, 5, 6), dtype=np.uint8)
    (tmp_path / "i.gz").write_bytes(gzip.compress(idx_bytes(images)))
    (tmp_path / "l").write_bytes(idx_bytes(np.arange(4, dtype=np.uint8)))
    out = datasets.make_fashion_mnist(tmp_path / "i.gz", tmp_path / "l", tmp_path / "m.h5",
                                      comm=Solo(), layout=layout)
    x, y = HDF5Dataset(out)[np.arange(4)]
    assert x.shape == shape and y.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(x.reshape(4, 5, 6), images / 255.0, rtol=1e-6)
    with pytest.raises(ValueError, match="layout must be 'image' or 'flat', got 'nchw'"):
        datasets.make_mnist(tmp_path / "i.gz", tmp_path / "l", tmp_path / "n.h5",
                            comm=Solo(), layout="nchw")


def test_digits_image_layout(tmp_path):
    train, test = datasets.make_digits(tmp_path, comm=Solo(), layout="image")
    flat_train, _ = datasets.make_digits(tmp_path, comm=Solo())
    assert HDF5Dataset(train).sample_shape == (1, 8, 8) and train != flat_train
    np.testing.assert_array_equal(HDF5Dataset(train)[np.arange(9)][0].reshape(9, 64),
                                  HDF5Dataset(flat_train)[np.arange(9)][0])


# -- transforms ------------------------------------------------------------------------------
def batch(n=5, c=2, h=4, w=5, dtype=np.float32):
    return np.random.default_rng(1).standard_normal((n, c, h, w)).astype(dtype)


def test_random_crop_against_a_numpy_loop():
    x, p, size = batch(), 2, (3, 4)
    out = T.RandomCrop(size, padding=p)(x, np.random.default_rng(7))
    rng = np.random.default_rng(7)  # the same draws: all tops, then all lefts
    top, left = rng.integers(0, 4 + 2 * p - 3 + 1, 5), rng.integers(0, 5 + 2 * p - 4 + 1, 5)
    for i in range(5):
        padded = np.zeros((2, 4 + 2 * p, 5 + 2 * p), np.float32)
        padded[:, p:p + 4, p:p + 5] = x[i]
        np.testing.assert_array_equal(out[i], padded[:, top[i]:top[i] + 3, left[i]:left[i] + 4])
    assert out.dtype == np.float32 and out.shape == (5, 2, 3, 4)
    same = T.RandomCrop(4, padding=0)(x[..., :4], np.random.default_rng(0))
    np.testing.assert_array_equal(same, x[..., :4])  # nothing to choose: the identity
    with pytest.raises(ValueError, match="larger than the padded images"):
        T.RandomCrop(9, padding=1)(x, np.random.default_rng(0))


def test_horizontal_flip_and_normalize_against_numpy():
    x = batch(n=64)
    out = T.RandomHorizontalFlip()(x, np.random.default_rng(3))
    flip = np.random.default_rng(3).random(64) < 0.5
    assert 0 < flip.sum() < 64
    for i in range(64):
        np.testing.assert_array_equal(out[i], x[i, :, :, ::-1] if flip[i] else x[i])
    np.testing.assert_array_equal(T.RandomHorizontalFlip(1.0)(x, np.random.default_rng(0)),
                                  x[..., ::-1])
    mean, std = [0.5, -1.0], [2.0, 0.25]
    norm = T.Normalize(mean, std)(x)
    assert norm.dtype == np.float32
    for c in range(2):
        np.testing.assert_allclose(norm[:, c], (x[:, c] - mean[c]) / std[c], rtol=1e-6)
    with pytest.raises(ValueError, match="2 channel means but the batch has 3"):
        T.Normalize(mean, std)(batch(c=3))
    with pytest.raises(ValueError, match="image batches"):
        T.RandomHorizontalFlip()(x[0], np.random.default_rng(0))


def augmented(rank, epoch=0, size=2, state=None, take=None):
    x, y = batch(n=24, c=1, h=6, w=6), np.arange(24)
    sampler = DistributedSampler(24, num_replicas=size, rank=rank, seed=5)
    sampler.set_epoch(epoch)
    aug = T.Compose([T.RandomCrop(6, padding=2), T.RandomHorizontalFlip()])
    loader = DataLoader(ArrayDataset(x, y), 4, sampler=sampler, transform=aug, device="cpu")
    if state is not None:
        loader.load_state_dict(state)
    out = []
    for xb, yb in loader:
        out.append((xb, yb))
        if take is not None and len(out) == take:
            return out, loader.state_dict()
    return out, loader.state_dict()


def test_loader_transform_is_seeded_per_rank_epoch_and_position():
    a, b = augmented(0)[0], augmented(0)[0]
    assert len(a) == 3
    for (xa, ya), (xb, yb) in zip(a, b):  # same seed, epoch, rank: the same batches
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    other_rank, other_epoch = augmented(1)[0], augmented(0, epoch=1)[0]
    assert not np.array_equal(a[0][0], other_rank[0][0])
    assert not np.array_equal(a[0][0], other_epoch[0][0])
    assert not np.array_equal(a[0][0], a[1][0])  # batches of one epoch differ too


@pytest.mark.parametrize("prefetch_take", [1, 2])
def test_a_resumed_loader_yields_the_same_augmented_batches(prefetch_take):
    full, _ = augmented(1)
    first, state = augmented(1, take=prefetch_take)
    rest, _ = augmented(1, state=state)
    assert len(first) + len(rest) == len(full)
    for (xa, ya), (xb, yb) in zip(full, first + rest):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
