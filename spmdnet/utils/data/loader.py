"""DataLoader: batches of sampler indices, read ahead by a background thread.

While the model trains on batch k, a thread reads batches k+1..k+prefetch
(one h5py read each; NumPy and h5py release the GIL for much of that work)
and, on a GPU rank, uploads them through pinned memory on a side stream.
An exception in the thread is raised again in the training loop.
``wait_s`` accumulates the time the training loop waited for data.

``state_dict()`` / ``load_state_dict()`` resume mid-epoch exactly (as
torchdata's stateful DataLoader): the state counts the batches delivered to
the training loop, never those read ahead. With a ``DistributedSampler`` it
is the sampler's state advanced past those batches (once a pass has
delivered every batch, the next epoch from its start); with any other
sampler, the number of batches the next pass skips.

``transform`` (see ``data.transforms``) is applied to each batch's ``x``
after its upload, with a generator seeded from the sampler's seed and epoch,
the rank and the batch's position in the epoch: the same batches, augmented
the same way, on a rerun and after a resume.

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

from ... import backend
from ...distributed import bound_device
from .transforms import batch_seed

_DONE = object()


class _Failure:
    def __init__(self, exc):
        self.exc = exc


class DataLoader:
    """Iterate ``(x, y)`` batches of ``ds`` in the order of ``sampler``
    (default: every index in order); ``drop_last`` drops a short last batch;
    ``device`` is "cpu", "gpu" or None (the rank's device from ``dist``);
    ``transform(x, rng)`` maps each batch (e.g. ``transforms.RandomCrop``)."""

    def __init__(self, ds, batch_size, sampler=None, drop_last=False, prefetch=2, device=None,
                 transform=None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be non-negative, got {prefetch}")
        self.dataset, self.batch_size, self.sampler = ds, int(batch_size), sampler
        self.drop_last, self.prefetch, self.device = drop_last, int(prefetch), device
        self.transform = transform
        self.wait_s = 0.0
        # the current or last pass: [sampler state at its start, batches, delivered]
        self._pass = None
        self._skip = 0  # batches the next pass skips (a loaded state without a position)

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
        """Batches in the next pass (after a resume: those left)."""
        n = len(self._indices())
        full = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return max(0, full - self._skip)

    def _device(self):
        if self.device is not None:
            return self.device
        return bound_device()

    def _load(self, index, device, seed_key=None):
        x, y = self.dataset[index]
        if device == "gpu":
            x, y = backend.upload(x), (None if y is None else backend.upload(y))
        if self.transform is not None:
            x = self.transform(x, batch_seed(*seed_key))
        return x, y

    def _seed_keys(self, first, count):
        """(seed, epoch, rank, position in the rank's epoch) of batches
        first..first+count-1 of this pass, taken when the pass starts."""
        s = self.sampler
        seed, epoch, rank = (int(getattr(s, k, 0)) for k in ("seed", "epoch", "rank"))
        base = int(getattr(s, "start_index", 0))
        return [(seed, epoch, rank, base + (first + k) * self.batch_size) for k in range(count)]

    def __iter__(self):
        batches, device = self.batches(), self._device()
        start = self._sampler_state()
        self._pass = [start, len(batches), self._skip]
        count = len(batches) - self._skip
        keys = self._seed_keys(self._skip, count) if self.transform is not None else [None] * count
        batches = list(zip(batches[self._skip:], keys))
        self._skip = 0
        if self.prefetch == 0 or (device == "cpu" and getattr(self.dataset, "cached", False)):
            items = self._iterate_inline(batches, device)
        else:
            items = self._iterate_prefetched(batches, device)
        try:
            for item in items:
                self._pass[2] += 1  # delivered: the loop holds it from here
                yield item
        finally:
            items.close()  # a loop that breaks out stops the reader thread now

    def _iterate_inline(self, batches, device):
        for index, seed_key in batches:
            t0 = time.perf_counter()
            item = self._load(index, device, seed_key)
            self.wait_s += time.perf_counter() - t0
            yield item

    def _iterate_prefetched(self, batches, device):
        ready, stop = queue.Queue(maxsize=self.prefetch), threading.Event()

        def work():
            try:
                for index, seed_key in batches:
                    if stop.is_set():
                        return
                    ready.put(self._load(index, device, seed_key))
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

    # -- resuming -----------------------------------------------------------------------
    def _sampler_state(self):
        has_state = hasattr(self.sampler, "state_dict") and hasattr(self.sampler,
                                                                   "load_state_dict")
        return self.sampler.state_dict() if has_state else None

    def state_dict(self):
        """Where the next pass continues: the batches delivered so far by the
        current (or last) pass count as done, the ones read ahead do not.
        JSON-serialisable; the same on every rank of a DistributedSampler."""
        state = {"batch_size": self.batch_size, "sampler": self._sampler_state(),
                 "batches_done": self._skip}
        if self._pass is None:
            return state
        start, total, done = self._pass
        if start is not None and "start_index" in start and "epoch" in start:
            sampler = dict(start)
            if done >= total:  # the pass is complete: the next epoch, from its start
                sampler.update(epoch=start["epoch"] + 1, start_index=0)
            else:  # short of the end: start_index + done * batch_size < num_samples
                sampler["start_index"] = start["start_index"] + done * self.batch_size
            return dict(state, sampler=sampler, batches_done=0)
        return dict(state, batches_done=0 if done >= total else done)

    def load_state_dict(self, state):
        """Continue where ``state`` (from ``state_dict``) left off: the next
        pass yields exactly the batches an uninterrupted run would have."""
        if state["batch_size"] != self.batch_size:
            raise ValueError(f"cannot resume a DataLoader of batch_size {self.batch_size} "
                             f"from a state of batch_size {state['batch_size']}")
        if state.get("sampler") is not None:
            if not hasattr(self.sampler, "load_state_dict"):
                raise ValueError(f"the state holds a sampler state but this DataLoader's "
                                 f"sampler {self.sampler!r} cannot load one")
            self.sampler.load_state_dict(state["sampler"])
        self._pass, self._skip = None, int(state.get("batches_done", 0))
