"""DataLoader: batches of sampler indices, read ahead by a background thread.

While the model trains on batch k, a thread reads batches k+1..k+prefetch
(one h5py read each; NumPy and h5py release the GIL for much of that work)
and, on a GPU rank, uploads them through pinned memory on a side stream.
An exception in the thread is raised again in the training loop.
``wait_s`` accumulates the time the training loop waited for data.

A dataset held in memory (``HDF5Dataset.cached``) on a CPU rank is read
inline, without the thread: a batch is then a fancy index taking
microseconds, less than handing it between threads, and the thread would
only compete with the training loop for the GIL (train_mlp.py on digits
trained about 15% slower with it).
"""
import queue
import threading
import time

import numpy as np

from .. import backend

_DONE = object()


class _Failure:
    def __init__(self, exc):
        self.exc = exc


class DataLoader:
    """Iterate ``(x, y)`` batches of ``ds`` in the order of ``sampler``
    (default: every index in order); ``drop_last`` drops a short last batch;
    ``device`` is "cpu", "gpu" or None (the rank's device from ``dist``)."""

    def __init__(self, ds, batch_size, sampler=None, drop_last=False, prefetch=2, device=None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be non-negative, got {prefetch}")
        self.dataset, self.batch_size, self.sampler = ds, int(batch_size), sampler
        self.drop_last, self.prefetch, self.device = drop_last, int(prefetch), device
        self.wait_s = 0.0

    def _indices(self):
        if self.sampler is None:
            return np.arange(len(self.dataset), dtype=np.int64)
        if hasattr(self.sampler, "indices"):
            return np.asarray(self.sampler.indices(), dtype=np.int64)
        return np.fromiter(iter(self.sampler), dtype=np.int64)

    def batches(self):
        """This epoch's index arrays, one per batch."""
        idx = self._indices()
        stop = len(idx) - len(idx) % self.batch_size if self.drop_last else len(idx)
        return [idx[i:i + self.batch_size] for i in range(0, stop, self.batch_size)]

    def __len__(self):
        n = len(self._indices())
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _device(self):
        if self.device is not None:
            return self.device
        from ..distributed.world import _state  # noqa: PLC0415 - the rank's bound device, if any
        return _state["world"].device if _state["world"] is not None else "cpu"

    def _load(self, index, device):
        x, y = self.dataset[index]
        if device == "gpu":
            return backend.upload(x), (None if y is None else backend.upload(y))
        return x, y

    def __iter__(self):
        batches, device = self.batches(), self._device()
        if self.prefetch == 0 or (device == "cpu" and getattr(self.dataset, "cached", False)):
            for index in batches:
                t0 = time.perf_counter()
                item = self._load(index, device)
                self.wait_s += time.perf_counter() - t0
                yield item
            return
        yield from self._iterate_prefetched(batches, device)

    def _iterate_prefetched(self, batches, device):
        ready, stop = queue.Queue(maxsize=self.prefetch), threading.Event()

        def work():
            try:
                for index in batches:
                    if stop.is_set():
                        return
                    ready.put(self._load(index, device))
                ready.put(_DONE)
            except BaseException as exc:  # re-raised in the training loop
                ready.put(_Failure(exc))

        thread = threading.Thread(target=work, name="spmdnet-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                t0 = time.perf_counter()
                item = ready.get()
                self.wait_s += time.perf_counter() - t0
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                try:
                    ready.get_nowait()
                except queue.Empty:
                    thread.join(0.01)
