"""ArrayDataset: in-memory arrays behind the HDF5Dataset interface."""
from .dataset import Dataset


class ArrayDataset(Dataset):
    """In-memory ``(x, y)`` arrays indexed like ``HDF5Dataset``: ``len(ds)``
    samples, ``ds[index_array] -> (x[index], y[index])``. For data that fits
    in memory, tests and benchmarks."""

    def __init__(self, x, y):
        if len(x) != len(y):
            raise ValueError(f"ArrayDataset: x has {len(x)} samples but y has {len(y)}")
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]
