"""Loader worker processes: parallel loading inside one MPI rank.

``DataLoader(num_workers=N)`` starts N processes (the multiprocessing
start method of ``multiprocessing_context``; default: the platform's, fork
on Linux, so an unguarded script works as with PyTorch). A worker never
starts MPI: it only reads the dataset and collates. On entry it drops what
it inherited from the rank's process that would act on MPI (the abort hook
that calls ``MPI_Abort``, the stop-signal handlers that finalize MPI), and a
forked worker leaves through ``os._exit``, so mpi4py's finalizer never runs
in it. Under the spawn or forkserver methods the dataset, ``collate_fn`` and
``worker_init_fn`` must be picklable, and importing spmdnet in the worker
does not start MPI (spmdnet imports mpi4py on first use only).

The rank sends each worker tasks round-robin (at most ``prefetch_factor``
per worker outstanding) and yields results in task order. Each worker is
seeded, before ``worker_init_fn(worker_id)`` runs, with ``base_seed +
worker_id`` (Python's ``random`` and spmdnet's generator; NumPy's global
generator from ``SeedSequence([worker_id, base_seed])``), ``base_seed``
being drawn from the loader's generator when the workers start.
``get_worker_info()`` answers in a worker (None in the rank's process).
An exception in a worker is raised again in the loop, its type kept where
possible, with the worker id and the worker's traceback in the message; a
worker that dies is a RuntimeError naming it and its exit code. A worker
whose rank dies (even by SIGKILL) ends at once, wherever it is blocked.
"""
import itertools
import os
import queue
import random
import signal
import sys
import threading
import time
import traceback

import numpy as np

from ... import random as sn_random
from ...multiprocessing import lifeline
from ..._tensor import Tensor
from .batched import read_batch

_info = None
_STATUS_INTERVAL_S = 0.5  # how often a waiting loader checks its workers are alive


class WorkerInfo:
    """``id``, ``num_workers``, ``seed`` and ``dataset`` (this worker's copy)."""

    def __init__(self, id, num_workers, seed, dataset):  # noqa: A002 - PyTorch's name
        self.id, self.num_workers, self.seed, self.dataset = id, num_workers, seed, dataset

    def __repr__(self):
        return f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed})"


def get_worker_info():
    """This worker's ``WorkerInfo`` inside a loader worker, else None."""
    return _info


class Fetcher:
    """Batches of one dataset: ``fetch(indices)`` for a map-style dataset,
    ``next_batch(stream)`` for an iterable one (StopIteration at its end)."""

    def __init__(self, dataset, collate_fn, auto_collation, batched_read, batch_size,
                 drop_last):
        self.dataset, self.collate_fn, self.auto_collation = dataset, collate_fn, auto_collation
        self.batched_read, self.batch_size, self.drop_last = batched_read, batch_size, drop_last

    def fetch(self, index):
        if self.batched_read:  # what default_collate of the samples gives, read at once
            columns = read_batch(self.dataset, np.asarray(index, dtype=np.int64))
            return [None if c is None else Tensor(c) for c in columns]
        if not self.auto_collation:
            return self.collate_fn(self.dataset[index])
        index = index.tolist() if isinstance(index, np.ndarray) else list(index)
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.collate_fn(self.dataset.__getitems__(index))
        return self.collate_fn([self.dataset[i] for i in index])

    def next_batch(self, stream):
        if not self.auto_collation:
            return self.collate_fn(next(stream))
        items = list(itertools.islice(stream, self.batch_size))
        if not items or (self.drop_last and len(items) < self.batch_size):
            raise StopIteration
        return self.collate_fn(items)


class _Exhausted:
    """A worker's iterable dataset has ended."""


class _Failure:
    """An exception raised in worker ``worker_id``, carried to the rank."""

    def __init__(self, worker_id, exc):
        self.worker_id, self.exc_type = worker_id, type(exc)
        self.text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))

    def reraise(self):
        message = (f"Caught {self.exc_type.__name__} in DataLoader worker process "
                   f"{self.worker_id}.\nOriginal {self.text}")
        try:
            exc = self.exc_type(message)
        except Exception:  # an exception type that takes other arguments
            exc = RuntimeError(message)
        raise exc


def _forget_rank_process_hooks():
    """Undo what the worker inherited from an MPI rank's process: its hooks
    call MPI (abort, finalize), which a worker must never do."""
    sys.excepthook, threading.excepthook = sys.__excepthook__, threading.__excepthook__
    for name in ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGCONT"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle


def _seed(worker_id, base_seed):
    seed = base_seed + worker_id
    random.seed(seed)
    sn_random.manual_seed(seed % 2**63)
    np.random.seed(np.random.SeedSequence([worker_id, base_seed]).generate_state(4))
    return seed


def _orphaned(results):
    """End this worker now: its rank is gone, so nobody reads ``results``."""
    results.cancel_join_thread()
    os._exit(0)


def _worker_loop(worker_id, num_workers, fetcher, iterable, tasks, results, base_seed,
                 init_fn, parent_pid):
    global _info
    _forget_rank_process_hooks()
    # The rank may die by SIGKILL while this worker is blocked anywhere (a
    # full result pipe that the other workers keep open, the dataset): end
    # at once then, without waiting for the queue's feeder thread.
    lifeline.watch(parent_pid, lambda: _orphaned(results), name="spmdnet-loader-lifeline")
    _info = WorkerInfo(worker_id, num_workers, _seed(worker_id, base_seed), fetcher.dataset)
    init_failure = None
    try:
        if init_fn is not None:
            init_fn(worker_id)
    except BaseException as exc:  # reported with the first task
        init_failure = _Failure(worker_id, exc)
    stream, stream_pass = None, None
    while True:
        try:
            task = tasks.get(timeout=5.0)
        except queue.Empty:
            if os.getppid() != parent_pid:  # the rank is gone: nobody reads our results
                _orphaned(results)
            continue
        if task is None:
            return
        pass_id, send_idx, index = task
        try:
            if init_failure is not None:
                result = init_failure
            elif iterable:
                if stream_pass != pass_id:  # a new pass (persistent workers): a new stream
                    stream, stream_pass = iter(fetcher.dataset), pass_id
                result = fetcher.next_batch(stream)
            else:
                result = fetcher.fetch(index)
        except StopIteration:
            result = _Exhausted()
        except BaseException as exc:
            result = _Failure(worker_id, exc)
        results.put((pass_id, send_idx, result))


class WorkerPool:
    """``num_workers`` processes fetching batches for one rank; ``run``
    yields one pass's batches in order."""

    def __init__(self, fetcher, iterable, num_workers, base_seed, init_fn, context,
                 prefetch_factor, timeout):
        import multiprocessing  # noqa: PLC0415 - only loaders with workers need it
        if context is None or isinstance(context, str):
            context = multiprocessing.get_context(context)
        self.iterable, self.timeout = iterable, float(timeout)
        self.outstanding_max = num_workers * prefetch_factor
        self.results = context.Queue()
        self.tasks = [context.Queue() for _ in range(num_workers)]
        self.workers = []
        for wid in range(num_workers):
            w = context.Process(target=_worker_loop, name=f"spmdnet-loader-worker-{wid}",
                                args=(wid, num_workers, fetcher, iterable, self.tasks[wid],
                                      self.results, base_seed, init_fn, os.getpid()),
                                daemon=True)
            w.start()
            self.workers.append(w)
        self.pass_id = 0

    def run(self, batches):
        """Yield the results of ``batches`` (index lists; ignored for an
        iterable dataset, whose workers run until exhausted) in order."""
        self.pass_id += 1
        pass_id, batches = self.pass_id, iter(batches) if batches is not None else None
        active, cycle = set(range(len(self.workers))), itertools.cycle(range(len(self.workers)))
        outstanding, ready, sent, next_out = {}, {}, 0, 0
        more = True
        while True:
            while more and len(outstanding) < self.outstanding_max and active:
                wid = next(w for w in cycle if w in active)
                index = None if batches is None else next(batches, _Exhausted)
                if index is _Exhausted:
                    more = False
                    break
                self.tasks[wid].put((pass_id, sent, index))
                outstanding[sent], sent = wid, sent + 1
            if next_out in ready:
                result = ready.pop(next_out)
                next_out += 1
                if not isinstance(result, _Exhausted):
                    yield result
                continue
            if not outstanding:
                return
            got_pass, send_idx, result = self._get(outstanding)
            if got_pass != pass_id:  # left over from a pass that stopped early
                continue
            wid = outstanding.pop(send_idx)
            if isinstance(result, _Failure):
                result.reraise()
            if isinstance(result, _Exhausted):
                active.discard(wid)
            ready[send_idx] = result

    def _get(self, outstanding):
        start = time.perf_counter()
        while True:
            waited = time.perf_counter() - start
            if self.timeout and waited >= self.timeout:
                raise RuntimeError(f"DataLoader timed out after {self.timeout:g} seconds "
                                   "waiting for a batch from its workers")
            step = _STATUS_INTERVAL_S
            if self.timeout:
                step = min(step, self.timeout - waited)
            try:
                return self.results.get(timeout=step)
            except queue.Empty:
                self._check_alive(outstanding)

    def _check_alive(self, outstanding):
        for wid in sorted(set(outstanding.values())):
            w = self.workers[wid]
            if not w.is_alive():
                raise RuntimeError(f"DataLoader worker {wid} (pid {w.pid}) exited "
                                   f"unexpectedly with exit code {w.exitcode}")

    def shutdown(self, grace_s=5.0):
        """Stop every worker (those that do not stop in ``grace_s`` are
        terminated: after an error, a worker may be stuck in the dataset)."""
        for q in self.tasks:
            try:
                q.put(None)
            except (OSError, ValueError):  # a queue already closed
                pass
        deadline = time.monotonic() + grace_s
        while any(w.is_alive() for w in self.workers) and time.monotonic() < deadline:
            try:  # a worker exits only once its results are read off the pipe
                self.results.get(timeout=0.05)
            except queue.Empty:
                pass
        for w in self.workers:
            if w.is_alive():
                w.terminate()
            w.join(1.0)
        for q in self.tasks + [self.results]:
            q.cancel_join_thread()
            q.close()
        self.workers = []
