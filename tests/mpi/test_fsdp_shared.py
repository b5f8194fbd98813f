"""FSDP with a parameter shared by two layers (weight tying, as GPT-2 ties its
token embedding to its head): inside one unit it trains as the serial model;
shared across two units it is a clear error at construction."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]

V, D, T, B = 11, 6, 5, 2  # vocabulary, width, tokens, sequences per rank


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(D), nn.Linear(D, D)

    def forward(self, x):
        return x + F.gelu(self.fc(self.norm(x)))


class TiedLM(nn.Module):
    """Embedding and head share one weight (V, D); the blocks are units."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.wte.weight  # tied: one parameter, two layers

    def forward(self, idx):
        return self.head(self.blocks(self.wte(idx)))


def batch(step):
    rng = np.random.default_rng(step)
    n = B * dist.size()
    return rng.integers(0, V, (n, T)), rng.integers(0, V, (n, T))


def loss_of(model, idx, target):
    logits = model(sn.tensor(idx))
    return F.cross_entropy(logits.view(-1, V), sn.tensor(target).view(-1))


def test_parameter_tied_inside_one_unit_trains_as_serial():
    sn.manual_seed(5)
    ref = TiedLM()
    sn.manual_seed(5)
    net = TiedLM()
    fsdp = parallel.FullyShardedDataParallel(net, wrap={Block})
    assert sum(p.numel() for p in ref.parameters()) == V * D + 2 * (3 * D + D * D)  # tied: once
    opt = optim.AdamW(fsdp.parameters(), lr=0.05, weight_decay=0.1)
    ref_opt = optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.1)
    r = dist.rank()
    for step in range(3):
        idx, target = batch(step)
        ref_opt.zero_grad()
        loss_of(ref, idx, target).backward()  # both uses add into the one gradient
        ref_opt.step()
        opt.zero_grad()
        loss_of(fsdp, idx[B * r:B * (r + 1)], target[B * r:B * (r + 1)]).backward()
        opt.step()
    full, want = fsdp.state_dict(), ref.state_dict()
    assert sorted(full) == sorted(want)
    for key in want:
        np.testing.assert_allclose(full[key], want[key], rtol=1e-11, atol=1e-12, err_msg=key)
    np.testing.assert_array_equal(full["wte.weight"], full["head.weight"])
    fsdp.close()


def test_parameter_shared_by_two_units_is_a_clear_error():
    sn.manual_seed(5)
    net = TiedLM()
    net.blocks[1].fc.weight = net.blocks[0].fc.weight  # tied across two units
    with pytest.raises(ValueError, match="shared by units") as err:
        parallel.FullyShardedDataParallel(net, wrap={Block})
    assert "blocks.0" in str(err.value) and "blocks.1" in str(err.value)
