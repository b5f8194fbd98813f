"""DataLoader: PyTorch's loader (arguments, errors, batches), read ahead.

Batches are what PyTorch's loader gives: ``collate_fn`` (default:
``default_collate``) of the samples of each batch of indices, Tensors for
arrays and numbers. A dataset's ``__getitems__(indices)`` is used when it
has one, its list going to ``collate_fn``. spmdnet's array-backed datasets
(``HDF5Dataset``, ``TokenDataset``, ``ArrayDataset``, ``TensorDataset``, a
``Subset`` of one) read a batch with one fancy index (one HDF5 read) when
``collate_fn`` is the default: the same Tensors, without building the
samples one by one. A dataset without labels (``HDF5Dataset(y=None)``)
gives ``[x, None]`` there (PyTorch's collate refuses None).

``num_workers=0``: batches are read in the rank's process; a background
thread reads ``prefetch`` batches ahead where it helps (a batched dataset
not held in memory, or a GPU rank, whose upload goes through pinned memory
on a side stream). An in-memory batch is a fancy index of microseconds,
read inline: the thread would only compete with the training loop for the
GIL (train_mlp.py on digits trained about 15% slower with it).
``num_workers > 0``: worker processes (see ``worker.py``).

``device`` is "cpu", "gpu" or None (the rank's device from ``dist``): a GPU
rank receives its batches' Tensors on the GPU. ``transform(x, rng)`` (see
``data.transforms``) maps each batch's first field after the upload, with a
generator seeded from the sampler's seed and epoch, the rank and the batch's
position in the epoch: the same batches, augmented the same way, on a rerun,
after a resume and at any worker count.

``state_dict()`` / ``load_state_dict()`` resume mid-epoch exactly (as
torchdata's stateful DataLoader): the state counts the batches delivered to
the training loop, never those read ahead. With a ``DistributedSampler`` it
is the sampler's state advanced past those batches (once a pass has
delivered every batch, the next epoch from its start); with any other
sampler, the sampler's state when the pass began (a ``RandomSampler``: the
seed of its order) and the number of batches the next pass skips.
"""
import queue
import threading
import time

import numpy as np

from ... import backend
from ... import random as sn_random
from ..._tensor import Tensor
from ...distributed import bound_device
from ...random import distributions
from .batched import reads_batches
from .collate import default_collate, default_convert
from .dataset import IterableDataset, Subset
from .options import check_options
from .sampler import BatchSampler, RandomSampler, SequentialSampler
from .transforms import batch_seed
from .worker import Fetcher, WorkerPool, get_worker_info

__all__ = ["DataLoader", "get_worker_info", "default_collate", "default_convert"]  # PyTorch's

_DONE = object()


class _Failure:
    def __init__(self, exc):
        self.exc = exc


def _upload(batch):
    """``batch`` with its Tensors' arrays on the GPU (containers walked)."""
    if isinstance(batch, Tensor):
        return Tensor(backend.upload(batch.array))
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(_upload(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _upload(v) for k, v in batch.items()}
    return batch


def _in_memory(dataset):
    if isinstance(dataset, Subset):
        return _in_memory(dataset.dataset)
    return bool(getattr(dataset, "cached", False))


class DataLoader:
    """Batches of ``dataset`` in the order of ``sampler`` (PyTorch's
    arguments and rules; see the module's notes). spmdnet's keywords:
    ``prefetch`` (batches read ahead by a thread when ``num_workers=0``),
    ``device`` ("cpu", "gpu" or None: the rank's), ``transform(x, rng)``."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 in_order=True, prefetch=2, device=None, transform=None):
        check_options(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
                      drop_last, timeout, prefetch_factor, persistent_workers, prefetch)
        self.dataset, self.num_workers, self.timeout = dataset, int(num_workers), timeout
        self.pin_memory, self.pin_memory_device = pin_memory, pin_memory_device
        self.in_order, self.worker_init_fn = in_order, worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator, self.persistent_workers = generator, persistent_workers
        self.prefetch_factor = 2 if num_workers and prefetch_factor is None else prefetch_factor
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable and transform is not None:
            raise ValueError("DataLoader(transform=...) seeds each batch from its sampler "
                             "position: an IterableDataset has none; transform its samples")
        if batch_sampler is not None:
            batch_size, drop_last = None, False
        elif batch_size is not None:
            BatchSampler(range(0), batch_size, bool(drop_last))  # PyTorch's checks, early
        if sampler is None and not self._iterable:
            sampler = (RandomSampler(dataset, generator=generator) if shuffle
                       else SequentialSampler(dataset))
        self._own_batching = batch_sampler is None and batch_size is not None
        if self._own_batching and not self._iterable:
            batch_sampler = BatchSampler(sampler, batch_size, bool(drop_last))
        self.batch_size, self.drop_last = batch_size, bool(drop_last)
        self.sampler, self.batch_sampler = sampler, batch_sampler
        auto_collation = batch_sampler is not None or (self._iterable and batch_size)
        self.collate_fn = collate_fn or (default_collate if auto_collation else default_convert)
        batched = (collate_fn is None and bool(auto_collation) and not self._iterable
                   and reads_batches(dataset))
        self._fetcher = Fetcher(dataset, self.collate_fn, bool(auto_collation), batched,
                                batch_size, self.drop_last)
        self._read_in_batches = batched
        self.prefetch, self.device, self.transform = int(prefetch), device, transform
        self.wait_s = 0.0
        # the current or last pass: [sampler state at its start, batches, delivered]
        self._pass = None
        self._skip = 0  # batches the next pass skips (a loaded state without a position)
        self._pool, self._base_seed, self._resuming = None, None, False

    # -- the batches of a pass ------------------------------------------------------------
    def _sampler_order(self):
        order = getattr(self.sampler, "indices", None)
        if callable(order):
            return np.asarray(order(), dtype=np.int64)
        return list(iter(self.sampler))

    def batches(self):
        """This pass's indices, one entry per batch (an index array or list;
        a single index without automatic batching). Draws a random order."""
        if not self._own_batching:
            return list(iter(self.batch_sampler if self.batch_sampler is not None
                             else self.sampler))
        idx, size = self._sampler_order(), self.batch_size
        stop = len(idx) - len(idx) % size if self.drop_last else len(idx)
        return [idx[i:i + size] for i in range(0, stop, size)]

    def __len__(self):
        """Batches in the next pass (after a resume: those left)."""
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        else:
            n = len(self.batch_sampler if self.batch_sampler is not None else self.sampler)
        return max(0, n - self._skip)

    def _device(self):
        return self.device if self.device is not None else bound_device()

    def _finish(self, batch, device, seed_key):
        """Upload (a GPU rank) and transform a fetched batch."""
        if device == "gpu":
            batch = _upload(batch)
        if self.transform is None:
            return batch
        rng = batch_seed(*seed_key)
        if isinstance(batch, list) and batch and isinstance(batch[0], Tensor):
            return [Tensor(self.transform(batch[0].array, rng))] + batch[1:]
        if isinstance(batch, Tensor):
            return Tensor(self.transform(batch.array, rng))
        raise TypeError(f"DataLoader(transform=...) maps a batch's first field, a Tensor; "
                        f"this batch is a {type(batch).__name__}")

    def _seed_keys(self, first, count):
        """(seed, epoch, rank, position in the rank's epoch) of batches
        first..first+count-1 of this pass, taken when the pass starts."""
        s, size = self.sampler, self.batch_size or 1
        seed, epoch, rank = (int(getattr(s, k, 0)) for k in ("seed", "epoch", "rank"))
        base = int(getattr(s, "start_index", 0))
        return [(seed, epoch, rank, base + (first + k) * size) for k in range(count)]

    def __iter__(self):
        device = self._device()
        # PyTorch draws the workers' base seed as a pass starts, before the sampler's draws;
        # a resumed pass drew it already (peeked without advancing when none is kept)
        if not self._resuming or self._base_seed is None:
            g = sn_random.resolve(self.generator, "DataLoader")
            g = g.clone_state() if self._resuming else g
            self._base_seed = int(distributions.random_full(g, (), np.int64))
        self._resuming = False
        if self._iterable:
            batches, total = None, None
        else:
            batches = self.batches()
            total = len(batches)
        self._pass = [self._sampler_state(), total, self._skip]
        skip, self._skip = self._skip, 0
        keys = (self._seed_keys(skip, (total or 0) - skip) if self.transform is not None
                and not self._iterable else None)
        items = self._iterate(batches, skip, device, keys)
        try:
            for item in items:
                self._pass[2] += 1  # delivered: the loop holds it from here
                yield item
            if self._iterable:
                self._pass[1] = self._pass[2]  # the stream's end: the pass is complete
        finally:
            items.close()  # a loop that breaks out stops the reader now

    def _iterate(self, batches, skip, device, keys):
        if self._iterable:
            return self._iterate_stream(skip, device)
        batches = batches[skip:]
        keys = keys or [None] * len(batches)
        if self.num_workers:
            return self._iterate_workers(batches, device, keys)
        threaded = device == "gpu" or (self._read_in_batches and not _in_memory(self.dataset))
        if self.prefetch and threaded:
            return self._iterate_prefetched(list(zip(batches, keys)), device)
        return self._iterate_inline(zip(batches, keys), device)

    def _load(self, index, device, seed_key):
        return self._finish(self._fetcher.fetch(index), device, seed_key)

    def _iterate_inline(self, batches, device):
        for index, seed_key in batches:
            t0 = time.perf_counter()
            item = self._load(index, device, seed_key)
            self.wait_s += time.perf_counter() - t0
            yield item

    def _iterate_stream(self, skip, device):
        if self.num_workers:
            batches = (batch for k, batch in enumerate(self._pool_run(None)) if k >= skip)
            yield from (self._finish(batch, device, None) for batch in batches)
            return
        stream, k = iter(self.dataset), 0
        while True:
            t0 = time.perf_counter()
            try:
                batch = self._fetcher.next_batch(stream)
            except StopIteration:
                return
            self.wait_s += time.perf_counter() - t0
            if k >= skip:
                yield self._finish(batch, device, None)
            k += 1

    def _start_pool(self):
        if self._pool is None:
            self._pool = WorkerPool(self._fetcher, self._iterable, self.num_workers,
                                    self._base_seed,
                                    self.worker_init_fn, self.multiprocessing_context,
                                    self.prefetch_factor or 1, self.timeout)
        return self._pool

    def _stop_pool(self, pool, failed=False):
        if failed or not self.persistent_workers:
            pool.shutdown(grace_s=0.5 if failed else 5.0)
            self._pool = None

    def _pool_run(self, batches):
        """The workers' batches of this pass; a loop that stops early keeps
        persistent workers, an error stops them."""
        pool, failed = self._start_pool(), False
        try:
            results = pool.run(batches)
            while True:
                t0 = time.perf_counter()
                batch = next(results, _DONE)
                self.wait_s += time.perf_counter() - t0  # the loop waits for its workers
                if batch is _DONE:
                    return
                yield batch
        except GeneratorExit:
            raise
        except BaseException:
            failed = True
            raise
        finally:
            self._stop_pool(pool, failed)

    def _iterate_workers(self, batches, device, keys):
        for batch, seed_key in zip(self._pool_run(batches), keys):
            yield self._finish(batch, device, seed_key)

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

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            try:
                pool.shutdown()
            except Exception:  # noqa: S110 - at interpreter exit; the workers are daemons
                pass

    # -- resuming -------------------------------------------------------------------------
    def _sampler_state(self):
        s = self.sampler
        has_state = hasattr(s, "state_dict") and hasattr(s, "load_state_dict")
        return s.state_dict() if has_state else None

    def state_dict(self):
        """Where the next pass continues: the batches delivered so far by the
        current (or last) pass count as done, the ones read ahead do not.
        JSON-serialisable; the same on every rank of a DistributedSampler."""
        state = {"batch_size": self.batch_size, "sampler": self._sampler_state(),
                 "batches_done": self._skip}
        if self._pass is None:
            return state
        start, total, done = self._pass
        complete = total is not None and done >= total
        if start is not None and "start_index" in start and "epoch" in start:
            sampler = dict(start)
            if complete:  # the next epoch, from its start
                sampler.update(epoch=start["epoch"] + 1, start_index=0)
            else:  # short of the end: start_index + done * batch_size < num_samples
                sampler["start_index"] = start["start_index"] + done * (self.batch_size or 1)
            return dict(state, sampler=sampler, batches_done=0)
        if complete:  # the next pass is a new one: a new order where the sampler draws one
            return dict(state, sampler=None if start is not None else state["sampler"],
                        batches_done=0)
        return dict(state, sampler=start, batches_done=done)

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
        sampler_state = state.get("sampler")
        position = sampler_state.get("start_index", 0) if isinstance(sampler_state, dict) else 0
        self._resuming = self._skip > 0 or position > 0  # mid-pass: its seed was drawn
