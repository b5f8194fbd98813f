"""Exact evaluation across ranks: every sample counted exactly once.

Rank r evaluates samples r, r+P, r+2P, ... with no padding (padding would
count some samples twice), and the ranks reduce ``(loss_sum, correct,
count)`` with one allreduce. Never a mean of per-rank means: ranks may hold
different numbers of samples.
"""
import numpy as np

from ... import distributed as dist
from ... import functional as F
from ...backend import asnumpy, upload
from ..._tensor import Tensor
from ...autograd import no_grad


def shard_indices(n, rank, size):
    """Rank ``rank``'s samples of ``range(n)``, strided and unpadded."""
    return np.arange(rank, n, size, dtype=np.int64)


@no_grad()
def evaluate(model, dataset, batch_size=1024, comm=None, to_device=None):
    """Mean loss, accuracy and count of a classifier over ``dataset``.

    ``comm`` is the data-parallel communicator (default: the world); ranks
    that share a data-parallel rank (a tensor-parallel group) evaluate the
    same samples. ``to_device`` maps a host batch to the model's device
    (default: the rank's device, as the DataLoader does)."""
    comm = dist.comm_or_default(comm)
    if to_device is None and dist.bound_device() == "gpu":
        to_device = upload
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    totals = np.zeros(3, dtype=np.float64)  # loss_sum, correct, count
    index = shard_indices(len(dataset), comm.Get_rank(), comm.Get_size())
    try:
        for start in range(0, len(index), batch_size):
            x, y = dataset[index[start:start + batch_size]]
            if to_device is not None:
                x, y = to_device(x), to_device(y)
            logits = model(Tensor(x))
            totals[0] += float(F.cross_entropy(logits, y, reduction="sum").item())
            totals[1] += int((asnumpy(logits.array).argmax(axis=1) == asnumpy(y)).sum())
            totals[2] += len(y)
    finally:
        if was_training:
            model.train()
    dist.allreduce(totals, op="sum", comm=comm)
    count = int(totals[2])
    return {"loss": totals[0] / max(count, 1), "accuracy": totals[1] / max(count, 1),
            "count": count}
