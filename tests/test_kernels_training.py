"""Training with kernels on and off gives the same curve (float64)."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import kernels, nn, optim


def _train(mode, optimizer, steps=6):
    sn.manual_seed(7)
    emb = nn.Embedding(11, 4)
    model = nn.Sequential(nn.LayerNorm(12), nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 16),
                          nn.ReLU(), nn.Linear(16, 8), nn.Sigmoid(), nn.Linear(8, 5))
    params = list(emb.parameters()) + list(model.parameters())
    opt = optim.SGD(params, lr=0.1, momentum=0.9) if optimizer == "sgd" else \
        optim.Adam(params, lr=1e-2)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        with kernels.use(mode):
            losses.append(_step(emb, model, opt, rng))
    return np.array(losses), [p.numpy() for p in params]


def _step(emb, model, opt, rng):
    idx, labels = rng.integers(0, 11, (32, 3)), rng.integers(0, 5, 32)
    h = F.embedding(idx, emb.weight).reshape(32, 12)
    step_loss = F.cross_entropy(model(h), labels)
    opt.zero_grad()
    step_loss.backward()
    opt.step()
    return step_loss.item()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_with_and_without_kernels_gives_the_same_curve(float64, optimizer):
    on, params_on = _train("numba", optimizer)
    off, params_off = _train("xp", optimizer)
    assert on[-1] < on[0]
    np.testing.assert_allclose(on, off, rtol=1e-11)
    for a, b in zip(params_on, params_off):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
