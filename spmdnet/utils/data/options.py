"""The DataLoader's argument checks: PyTorch's rules and messages for
``num_workers``, ``timeout``, ``prefetch_factor``, ``persistent_workers`` and
the mutually exclusive ``shuffle`` / ``sampler`` / ``batch_sampler`` /
``batch_size`` / ``drop_last``."""
from .dataset import IterableDataset


def check_options(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
                  drop_last, timeout, prefetch_factor, persistent_workers, prefetch):
    """PyTorch's checks of the DataLoader's arguments (its messages), and
    spmdnet's ``prefetch``."""
    if num_workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                         f"disable multiprocessing (got {num_workers})")
    if timeout < 0:
        raise ValueError(f"timeout option should be non-negative, got {timeout}")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError("prefetch_factor option could only be specified in "
                         "multiprocessing: let num_workers > 0 to enable multiprocessing, "
                         f"otherwise set prefetch_factor to None (got {prefetch_factor})")
    if prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError(f"prefetch_factor option should be non-negative, got "
                         f"{prefetch_factor}")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    if prefetch < 0:
        raise ValueError(f"prefetch must be non-negative, got {prefetch}")
    if isinstance(dataset, IterableDataset):
        for name, value in (("shuffle", shuffle), ("sampler", sampler),
                            ("batch_sampler", batch_sampler)):
            if value is not None and value is not False:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"{name} option, but got {name}={value!r}")
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None
                                      or drop_last):
        raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                         "shuffle, sampler, and drop_last")
    if batch_size is None and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually "
                         "exclusive with drop_last")
