"""``parallel.clip_grad_norm_``: the norm of the whole model's gradient spread
over the ranks, against the closed form on the gathered (serial) gradient.

Every rank builds the same global gradients from one seed and keeps its part:
replicated gradients (every rank the same, ``copies`` = size, the default),
sharded ones (row block r on rank r, ``copies=1``) or both (tensor parallel:
``copies`` a function of the parameter). The expected norm is numpy's on the
serial model's gradient (each distinct value counted once), and the clipped
gradients are the serial ones times ``max_norm / (norm + 1e-6)``.
"""
import math

import numpy as np
import pytest

from spmdnet import dist, nn, parallel

pytestmark = pytest.mark.mpi


def grad_param(values, sharded_axis=None):
    """A parameter with gradient ``values`` (a ShardedParameter when split)."""
    if sharded_axis is None:
        p = nn.Parameter(np.zeros_like(values))
    else:
        p = parallel.ShardedParameter(np.zeros_like(values), sharded_axis)
    p.grad = nn.Parameter(values.copy())  # any Tensor: clipping reads .grad.array
    return p


def global_grads(seed=0):
    """(replicated [arrays], sharded [arrays with rows divisible into blocks])."""
    rng = np.random.default_rng(seed)
    size = dist.size()
    replicated = [rng.standard_normal((3, 4)), rng.standard_normal(5)]
    sharded = [rng.standard_normal((2 * size, 3)), rng.standard_normal(size)]
    return replicated, sharded


def my_block(full):
    rows = full.shape[0] // dist.size()
    return full[dist.rank() * rows:(dist.rank() + 1) * rows]


def serial_norm(arrays, norm_type):
    flat = np.concatenate([a.ravel() for a in arrays])
    if norm_type == math.inf:
        return float(np.abs(flat).max())
    return float((np.abs(flat) ** norm_type).sum() ** (1.0 / norm_type))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
def test_replicated_gradients_clip_as_the_serial_model(norm_type):
    dist.init()
    replicated, _ = global_grads()
    params = [grad_param(g) for g in replicated]
    want = serial_norm(replicated, norm_type)
    total = parallel.clip_grad_norm_(params, want / 4, norm_type)
    assert total == pytest.approx(want, rel=1e-12) and total.item() == float(total)
    for p, g in zip(params, replicated):
        np.testing.assert_allclose(p.grad.array, g * (want / 4) / (want + 1e-6), rtol=1e-12)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_sharded_gradients_clip_as_the_gathered_gradient(norm_type):
    dist.init()
    _, sharded = global_grads(1)
    params = [grad_param(my_block(g)) for g in sharded]
    want = serial_norm(sharded, norm_type)
    total = parallel.clip_grad_norm_(params, want / 3, norm_type, copies=1)
    assert total == pytest.approx(want, rel=1e-12)
    for p, g in zip(params, sharded):
        np.testing.assert_allclose(p.grad.array, my_block(g) * (want / 3) / (want + 1e-6),
                                   rtol=1e-12)


def test_tensor_parallel_copies_count_each_value_once():
    """Replicated and sharded parameters together, ``copies`` a function (as
    ``examples/gpt/train_tp.py``'s tensor parallelism: ``tp_split_axis`` marks a shard)."""
    dist.init()
    replicated, sharded = global_grads(2)
    params = [grad_param(g) for g in replicated]
    params += [grad_param(my_block(g), sharded_axis=0) for g in sharded]
    params.append(nn.Parameter(np.ones(3)))  # no gradient: contributes nothing
    want = serial_norm(replicated + sharded, 2.0)
    size = dist.size()
    total = parallel.clip_grad_norm_(
        params, want / 2, copies=lambda p: 1 if hasattr(p, "tp_split_axis") else size)
    assert total == pytest.approx(want, rel=1e-12)
    coef = (want / 2) / (want + 1e-6)
    for p, g in zip(params, replicated + [my_block(g) for g in sharded]):
        np.testing.assert_allclose(p.grad.array, g * coef, rtol=1e-12)
    assert params[-1].grad is None


def test_no_clipping_below_max_norm_and_the_same_norm_everywhere():
    dist.init()
    replicated, _ = global_grads(3)
    params = [grad_param(g) for g in replicated]
    want = serial_norm(replicated, 2.0)
    total = parallel.clip_grad_norm_(params, want * 2)
    everyone = dist.world().comm.allgather(float(total))
    assert everyone == [everyone[0]] * dist.size()
    assert total == pytest.approx(want, rel=1e-12)
    for p, g in zip(params, replicated):
        np.testing.assert_array_equal(p.grad.array, g)


@pytest.mark.parametrize("copies", [0, -1, "size+1", 1.5])
def test_copies_outside_one_to_size_raise_on_every_rank(copies):
    dist.init()
    copies = dist.size() + 1 if copies == "size+1" else copies
    with pytest.raises(ValueError, match="copies of parameter #0"):
        parallel.clip_grad_norm_([grad_param(np.ones(2))], 1.0, copies=copies)
