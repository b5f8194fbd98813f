"""Gradient norms over ranks: the one cross-rank reduction behind every
sharded ``clip_grad_norm_`` (FSDP's, ZeRO-2's) and ``parallel.clip_grad_norm_``.

The local math is ``nn.utils.clip_grad`` (``norm_power``: the sum of
``|g|^p``, or the largest ``|g|``); here each rank's part is reduced with one
guarded allreduce (sum, or max for the inf-norm), so every rank gets the same
total and scales its own gradients alike.
"""
import math

from ... import distributed as dist
from ...nn.parameter import grad_array
from ...nn.utils.clip_grad import (check_max_norm, check_norm_type, norm_from_power,
                                   norm_power, scale_to_norm_)


def cross_rank_norm(arrays, norm_type, comm, weights=None):
    """The norm of gradient ``arrays`` spread over the ranks of ``comm``
    (collective; the same ``TotalNorm`` on every rank). ``weights``: one per
    array, multiplying its ``sum(|g|^p)`` (not used by the inf-norm)."""
    norm_type = check_norm_type(norm_type)
    local = norm_power(arrays, norm_type, weights)
    op = "max" if norm_type == math.inf else "sum"
    return norm_from_power(dist.allreduce(float(local), op=op, comm=comm), norm_type)


def clip_arrays_(arrays, max_norm, norm_type, comm):
    """Scale gradient shards (``arrays``, each element held by one rank of
    ``comm``) so their global norm is at most ``max_norm``; returns the norm."""
    max_norm = check_max_norm(max_norm)
    total = cross_rank_norm(arrays, norm_type, comm)
    scale_to_norm_(arrays, max_norm, total)
    return total


def _copies_of(copies, size):
    """``copies`` as a function param -> count, checked to be in [1, size]."""
    count = (lambda p: size) if copies is None else (
        copies if callable(copies) else (lambda p: copies))

    def checked(i, p):
        n = count(p)
        if isinstance(n, bool) or int(n) != n or not 1 <= n <= size:
            raise ValueError(f"parallel.clip_grad_norm_: copies of parameter #{i} (shape "
                             f"{tuple(p.shape)}) is {n!r}; it must be an integer in "
                             f"[1, {size}] (the ranks of comm holding that gradient)")
        return int(n)
    return checked


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, comm=None, copies=None):
    """Clip by the norm of the whole model's gradient, spread over the ranks
    of ``comm`` (None: the world); collective, the same norm on every rank.

    Each rank adds ``sum(|g|^p) / copies(p)`` over its parameters with a
    gradient, where ``copies(p)`` (an int, or a function of the parameter)
    counts the ranks of ``comm`` holding an identical copy of that gradient:
    default ``comm.Get_size()`` (data parallelism: every rank holds the same
    gradients); 1 for a gradient only this rank holds (a tensor-parallel
    shard on a tensor-parallel-only communicator). The total is the
    allreduced sum to the power 1/p (inf-norm: the allreduced max). Every
    gradient is then scaled by ``max_norm / (total + 1e-6)`` when that is
    below 1, as ``nn.utils.clip_grad_norm_``. Returns the total norm."""
    comm = dist.comm_or_default(comm)
    max_norm, norm_type = check_max_norm(max_norm), check_norm_type(norm_type)
    if hasattr(parameters, "data") and hasattr(parameters, "grad"):
        parameters = [parameters]
    with_grads = [p for p in parameters if grad_array(p) is not None]
    count = _copies_of(copies, comm.Get_size())
    arrays = [grad_array(p) for p in with_grads]
    weights = [1.0 / count(i, p) for i, p in enumerate(with_grads)]
    total = cross_rank_norm(arrays, norm_type, comm, weights)
    scale_to_norm_(arrays, max_norm, total)
    return total
