"""Pipeline parallelism with the GPipe schedule over a pipeline communicator.

Rank s of ``comm`` holds stage s. A step splits the batch into m equal
micro-batches, runs all their forwards (stage s receives activations from
s-1 and sends its outputs to s+1), then all their backwards (gradients flow
the other way). The point-to-point transfers are autograd Functions, so
each micro-batch's backward is one ``.backward()`` on the stage's terminal
tensor and can never be disconnected from the sends and receives:

- ``RecvActivation``: forward receives from the previous stage; backward
  sends the input gradient back to it.
- ``SendActivation``: forward sends to the next stage and returns a scalar
  token connected to the output; backward receives the output gradient.

With p stages and m micro-batches a step is m + p - 1 stage-times long, of
which each stage idles p - 1: the bubble fraction is (p - 1) / (m + p - 1).
"""
import contextlib

import numpy as np

from ... import distributed as dist
from ...backend import asnumpy, xp_of
from ..._tensor import Tensor
from ...autograd import Function, no_grad
from ...distributed.p2p_arrays import recv_array, send_array

TAG_FORWARD, TAG_BACKWARD = 11, 12


def bubble_fraction(stages, micro_batches):
    """The idle share of a GPipe step: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def _array_module(stage):
    """The array module (NumPy or CuPy) of the stage's parameters."""
    first = next(iter(stage.parameters()), None)
    return np if first is None else xp_of(first.array)


class RecvActivation(Function):
    """Receive the previous stage's activation; backward sends its gradient
    back. The input is a dummy scalar that requires grad (it anchors the node
    in the graph)."""

    def forward(self, anchor, comm=None, source=0, tag=0):
        self.comm, self.source, self.tag = comm, source, tag
        return xp_of(anchor).asarray(recv_array(comm, source, TAG_FORWARD + 100 * tag))

    def backward(self, g):
        send_array(self.comm, g, self.source, TAG_BACKWARD + 100 * self.tag)
        return xp_of(g).zeros(())


class SendActivation(Function):
    """Send this stage's output to the next stage; returns a scalar token
    whose backward receives the output's gradient from there."""

    def forward(self, x, comm=None, dest=0, tag=0):
        self.comm, self.dest, self.tag, self.like = comm, dest, tag, x
        send_array(comm, x, dest, TAG_FORWARD + 100 * tag)
        return xp_of(x).zeros(())

    def backward(self, g):
        grad = recv_array(self.comm, self.dest, TAG_BACKWARD + 100 * self.tag)
        return xp_of(self.like).asarray(grad)


class Pipeline:
    """GPipe over ``comm``: this rank runs ``stage`` (a Module, or a
    DataParallel over a data-parallel communicator) for ``micro_batches``
    equal slices of each batch."""

    def __init__(self, stage, comm, micro_batches=4):
        if micro_batches < 1:
            raise ValueError(f"micro_batches must be at least 1, got {micro_batches}")
        self.stage, self.comm, self.micro_batches = stage, comm, micro_batches
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.first, self.last = self.rank == 0, self.rank == self.size - 1
        self.xp = _array_module(stage)  # receive anchors live where the stage computes

    def _split(self, a, name):
        n = a.shape[0]
        if n % self.micro_batches:
            raise ValueError(f"pipeline: {name} has {n} samples, not divisible into "
                             f"{self.micro_batches} equal micro-batches")
        k = n // self.micro_batches
        return [a[i * k:(i + 1) * k] for i in range(self.micro_batches)]

    def _forward(self, i, x_mb, y_mb, loss_fn):
        """One micro-batch through this stage; returns the terminal tensor."""
        if self.first:
            inp = Tensor(x_mb)
        else:
            anchor = Tensor(self.xp.zeros(()), requires_grad=True)
            inp = RecvActivation.apply(anchor, comm=self.comm, source=self.rank - 1, tag=i)
        out = self.stage(inp)
        if self.last:
            return loss_fn(out, y_mb)
        return SendActivation.apply(out, comm=self.comm, dest=self.rank + 1, tag=i)

    def train_step(self, x, y, loss_fn):
        """Forward and backward of one batch; every rank passes the same x and
        y. Returns the mean micro-batch loss (a float) on every rank; the
        stage's parameters hold their gradients (accumulated, as usual)."""
        x = x.array if isinstance(x, Tensor) else x
        y = y.array if isinstance(y, Tensor) else y
        xs, ys = self._split(x, "x"), self._split(y, "y")
        terminals = [self._forward(i, xs[i], ys[i], loss_fn) for i in range(self.micro_batches)]
        losses = [t.item() for t in terminals] if self.last else []
        for i in reversed(range(self.micro_batches)):
            last_backward = i == 0
            with self._sync(last_backward):
                t = terminals[i]
                if self.last:
                    t = t * (1.0 / self.micro_batches)  # the loss is the micro-batch mean
                t.backward()
        loss = float(np.mean(losses)) if self.last else None
        with dist.guarded("broadcast(pipeline loss)", self.comm):
            return self.comm.bcast(loss, root=self.size - 1)

    def infer(self, x):
        """Forward of the whole batch through all stages, without gradients;
        returns the last stage's output array on every rank of the group."""
        x = x.array if isinstance(x, Tensor) else x
        with no_grad():
            if self.first:
                out = self.stage(Tensor(x))
            else:
                anchor = Tensor(self.xp.zeros(()))
                out = self.stage(RecvActivation.apply(anchor, comm=self.comm,
                                                      source=self.rank - 1, tag=0))
            if not self.last:
                SendActivation.apply(out, comm=self.comm, dest=self.rank + 1, tag=0)
        result = asnumpy(out.array) if self.last else None
        with dist.guarded("broadcast(pipeline output)", self.comm):
            return self.comm.bcast(result, root=self.size - 1)

    def _sync(self, reduce_now):
        """Data-parallel stages reduce once, on the last backward of the step."""
        if reduce_now or not hasattr(self.stage, "no_sync"):
            return contextlib.nullcontext()
        return self.stage.no_sync()
