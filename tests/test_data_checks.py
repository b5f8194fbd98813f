"""Data checked at open time (issue 18): sample dtypes, empty files, and
train/test feature shapes, each error naming the file, the key and the rank."""
import h5py
import numpy as np
import pytest

from spmdnet import data
from spmdnet.data import ArrayDataset, HDF5Dataset, check_same_features


def write(path, x, y=None):
    with h5py.File(path, "w") as f:
        f["x"] = x
        f["y"] = np.zeros(len(x), np.int64) if y is None else y
    return path


@pytest.mark.parametrize("key", ["x", "y"])
def test_strings_are_refused_naming_file_key_and_rank(tmp_path, key):
    numbers, strings = np.zeros((4, 3), np.float32), np.array([b"a", b"b", b"c", b"d"])
    path = write(tmp_path / "s.h5", strings.reshape(4, 1) if key == "x" else numbers,
                 strings if key == "y" else None)
    with pytest.raises(TypeError, match=rf"s.h5 \(rank .+\): '{key}' holds \|S1 values"):
        HDF5Dataset(path)


def test_integer_and_bool_samples_are_numbers(tmp_path):
    ds = HDF5Dataset(write(tmp_path / "i.h5", np.ones((3, 2), np.uint8),
                           np.array([True, False, True])))
    assert len(ds) == 3 and ds.sample_shape == (2,) and ds.label_shape == ()


def test_empty_dataset_is_refused(tmp_path):
    path = write(tmp_path / "e.h5", np.zeros((0, 64), np.float32))
    with pytest.raises(ValueError, match=r"e.h5 \(rank .+\): 'x' holds no samples \(shape \(0, 64"):
        HDF5Dataset(path)


def test_train_and_test_feature_shapes_must_agree(tmp_path):
    train = HDF5Dataset(write(tmp_path / "train.h5", np.zeros((5, 64), np.float32)))
    test = HDF5Dataset(write(tmp_path / "test.h5", np.zeros((5, 10), np.float32)))
    with pytest.raises(ValueError) as info:
        check_same_features(train, test)
    msg = str(info.value)
    assert "train.h5" in msg and "test.h5" in msg and "(64,)" in msg and "(10,)" in msg
    check_same_features(train, HDF5Dataset(write(tmp_path / "ok.h5", np.ones((2, 64)))))


def test_label_shapes_and_in_memory_datasets(tmp_path):
    train = HDF5Dataset(write(tmp_path / "train.h5", np.zeros((5, 4)), np.zeros((5, 2))))
    with pytest.raises(ValueError, match="in-memory ArrayDataset holds samples of shape"):
        check_same_features(train, ArrayDataset(np.zeros((3, 4)), np.zeros(3)))
    check_same_features(train, ArrayDataset(np.zeros((3, 4)), np.zeros((3, 2))))
    check_same_features(HDF5Dataset(tmp_path / "train.h5", y=None), data.ArrayDataset(
        np.zeros((3, 4)), np.zeros(3)))
