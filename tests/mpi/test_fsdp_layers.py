"""FSDP with SyncBatchNorm and attention inside its units equals the serial
model on the global batch (float64, AdamW, several steps), running
statistics included. Units are recomputed in backward (``reshard=True``),
so SyncBatchNorm's collectives run again there, and the buffers it updates
must come out as after one forward.

Runs at any number of ranks (CI: 1 to 4).
"""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]

B, D, H = 3, 6, 7  # batch per rank, width, hidden width


class NormBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, H, bias=False)  # a bias before BatchNorm gets a 0 gradient
        self.norm = nn.BatchNorm1d(H)
        self.down = nn.Linear(H, D)

    def forward(self, x):
        return x + self.down(F.relu(self.norm(self.up(x))))


class NormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, D, bias=False)  # (AdamW would amplify its rounding noise)
        self.norm = nn.BatchNorm1d(D)  # in the root unit
        self.blocks = nn.Sequential(NormBlock(), NormBlock())
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        return self.head(self.blocks(self.norm(self.embed(x))))


class CausalSelfAttention(nn.Module):
    """minGPT's attention: one qkv projection, causal F.scaled_dot_product_attention."""

    def __init__(self, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        n, t, e = x.shape
        q, k, v = (z.reshape(n, t, self.heads, e // self.heads).transpose(1, 2)
                   for z in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(n, t, e))


class TorchAttention(nn.Module):
    """nn.MultiheadAttention with a causal mask (its fused causal path)."""

    def __init__(self, heads=2):
        super().__init__()
        self.attn = nn.MultiheadAttention(D, heads, batch_first=True)

    def forward(self, x):
        t = x.shape[1]
        mask = np.triu(np.ones((t, t), bool), 1)
        return self.attn(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0]


class GPTBlock(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = attention()
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, attention, vocab=5, length=4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, D), nn.Embedding(length, D)
        self.blocks = nn.Sequential(GPTBlock(attention), GPTBlock(attention))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(np.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def norm_batch(step):
    rng = np.random.default_rng(step)
    n = B * dist.size()
    return rng.standard_normal((n, 4)), rng.integers(0, 3, n)


def gpt_batch(step):
    rng = np.random.default_rng(step)
    return rng.integers(0, 5, (B * dist.size(), 4)), rng.integers(0, 5, (B * dist.size(), 4))


def norm_loss(model, x, y):
    return F.cross_entropy(model(sn.tensor(x)), y)


def gpt_loss(model, idx, y):
    logits = model(idx)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def local(batch):
    r = dist.rank()
    return [z[B * r:B * (r + 1)] for z in batch]


def train_against_serial(build, wrap, data, loss, sync_bn=False, reshard=True, steps=3):
    sn.manual_seed(7)
    ref = build()
    sn.manual_seed(7)
    model = build()
    if sync_bn:
        model = parallel.SyncBatchNorm.convert_sync_batchnorm(model)
    fsdp = parallel.FullyShardedDataParallel(model, wrap=wrap, reshard_after_forward=reshard)
    # Attention's key bias has a zero gradient (softmax ignores a shift shared
    # by all keys): Adam turns its rounding noise into steps of lr * noise /
    # eps, so eps is raised above the noise (1e-17) by more than the default.
    kw = {"lr": 0.02, "weight_decay": 0.1, "eps": 1e-6}
    opt, ref_opt = optim.AdamW(fsdp.parameters(), **kw), optim.AdamW(ref.parameters(), **kw)
    for step in range(steps):
        batch = data(step)
        ref_opt.zero_grad()
        loss(ref, *batch).backward()
        ref_opt.step()
        opt.zero_grad()
        loss(fsdp, *local(batch)).backward()
        opt.step()
        state, expected = fsdp.state_dict(), ref.state_dict()
        assert list(state) == list(expected)
        for k in expected:  # parameters and running statistics
            np.testing.assert_allclose(state[k], expected[k], rtol=1e-10, atol=1e-11,
                                       err_msg=f"step {step}: {k}")
    fsdp.eval()
    ref.eval()
    with sn.no_grad():
        batch = data(steps)
        np.testing.assert_allclose(loss(fsdp, *local(batch)).item(),
                                   loss(ref, *local(batch)).item(), rtol=1e-11)
    fsdp.close()


@pytest.mark.parametrize("reshard", [True, False])
def test_sync_batchnorm_in_units_equals_serial_batchnorm(reshard):
    train_against_serial(NormNet, {NormBlock}, norm_batch, norm_loss, sync_bn=True,
                         reshard=reshard)


@pytest.mark.parametrize("attention", [CausalSelfAttention, TorchAttention])
@pytest.mark.parametrize("reshard", [True, False])
def test_gpt_blocks_in_units_equal_serial(attention, reshard):
    train_against_serial(lambda: GPT(attention), {GPTBlock}, gpt_batch, gpt_loss,
                         reshard=reshard)
