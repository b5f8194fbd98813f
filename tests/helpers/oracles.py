"""Numeric settings and the serial oracle's training step, shared by the
serial and the distributed tests."""
import contextlib

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import optim
from spmdnet.autograd.finite_differences import central_differences

# the optimizers the parallel wrappers are checked with against serial training
OPTIMIZERS = {
    "sgd_momentum": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adam": lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.01),
}


@contextlib.contextmanager
def default_dtype(dtype):
    """``dtype`` as spmdnet's default dtype inside the block, the previous one after."""
    before = sn.get_default_dtype()
    sn.set_default_dtype(dtype)
    try:
        yield
    finally:
        sn.set_default_dtype(before)


def numeric_gradient(f, x, eps=1e-6):
    """d f(x) / dx by central differences, for ``f`` a scalar function of an
    array; ``x`` is left as it was (a copy of it is perturbed)."""
    x = np.array(x)
    return central_differences(lambda: f(x), x, eps)


def train_step(model, opt, x, y):
    """One cross-entropy step of ``model`` on the arrays (x, y); returns the loss."""
    loss = F.cross_entropy(model(sn.tensor(x)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss
