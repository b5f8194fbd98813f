"""Tensor-parallel transformer layers against their serial counterparts on
the same seed (float64): ParallelSelfAttention vs nn.MultiheadAttention,
VocabParallelEmbedding vs nn.Embedding, vocab_parallel_cross_entropy vs
F.cross_entropy (ignored targets included), a tiny GPT (forward, gradients,
three AdamW steps; also TP=2 x DP over the rest against the serial GPT on
the global batch), and the QKV-by-heads state dict round trip."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel
from spmdnet.parallel.tensor_parallel import split_shard

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]
B, T, E, H, V = 2, 5, 8, 4, 12  # H and V divisible by tp = 1, 2, 4
TOL = {"rtol": 1e-9, "atol": 1e-11}


@pytest.fixture(params=[1, 2, 4], ids=lambda tp: f"tp{tp}")
def mesh(request):
    if dist.size() % request.param:
        pytest.skip(f"tp={request.param} does not divide {dist.size()} ranks")
    with dist.Mesh(tp=request.param) as m:
        yield m


def values(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape)


def causal_mask(length):
    """MultiheadAttention's convention: True = masked out (the future)."""
    return np.triu(np.ones((length, length), bool), k=1)


def local(full, p, mesh):
    """This rank's shard of the serial array ``full`` for the TP tensor ``p``."""
    axis = getattr(p, "tp_split_axis", None)
    if axis is None:
        return full
    return split_shard(full, axis, mesh.tp_size, mesh.tp_rank, p.tp_split_groups)


def assert_grads_match(serial, model, mesh):
    want = dict(serial.named_parameters())
    for key, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.array, local(want[key].grad.array, p, mesh), **TOL,
                                   err_msg=key)


@pytest.mark.parametrize("mode", ["causal", "mask", "none"])
def test_self_attention_equals_multihead(mesh, mode):
    sn.manual_seed(0)
    serial = nn.MultiheadAttention(E, H, batch_first=True)
    sn.manual_seed(0)
    model = parallel.ParallelSelfAttention(E, H, mesh.tp)
    mask = {"causal": causal_mask(T), "none": None,
            "mask": np.random.default_rng(3).random((T, T)) < 0.3}[mode]
    mask = None if mask is None else mask & ~np.eye(T, dtype=bool)  # every row keeps one key
    x_val, w_out = values(1, (B, T, E)), values(2, (B, T, E))
    outs, grads = [], []
    for net in (serial, model):
        x = sn.tensor(x_val, requires_grad=True)
        if net is serial:
            out = net(x, x, x, attn_mask=mask, need_weights=False)[0]
        else:
            out = net(x, is_causal=True) if mode == "causal" else net(x, attn_mask=mask)
        (out * sn.tensor(w_out)).sum().backward()
        outs.append(out.array)
        grads.append(x.grad.array)
    np.testing.assert_allclose(outs[1], outs[0], **TOL)
    np.testing.assert_allclose(grads[1], grads[0], **TOL)
    assert_grads_match(serial, model, mesh)


def test_vocab_parallel_embedding_equals_embedding(mesh):
    sn.manual_seed(0)
    serial = nn.Embedding(V, E)
    sn.manual_seed(0)
    model = parallel.VocabParallelEmbedding(V, E, mesh.tp)
    idx = np.random.default_rng(1).integers(0, V, (B, T))
    w_out = values(2, (B, T, E))
    outs = []
    for net in (serial, model):
        out = net(sn.tensor(idx))
        (out * sn.tensor(w_out)).sum().backward()
        outs.append(out.array)
    np.testing.assert_allclose(outs[1], outs[0], **TOL)
    assert_grads_match(serial, model, mesh)


def test_vocab_parallel_cross_entropy_equals_cross_entropy(mesh):
    full = values(1, (7, V)) * 3
    target = np.random.default_rng(2).integers(0, V, 7)
    target[[1, 4]] = -100
    logits = sn.tensor(full, requires_grad=True)
    want = F.cross_entropy(logits, target, ignore_index=-100)
    want.backward()
    shard = sn.tensor(split_shard(full, 1, mesh.tp_size, mesh.tp_rank), requires_grad=True)
    loss = parallel.vocab_parallel_cross_entropy(shard, target, mesh.tp)
    (loss * 1.5).backward()
    np.testing.assert_allclose(loss.array, want.array, **TOL)
    np.testing.assert_allclose(shard.grad.array,
                               1.5 * split_shard(logits.grad.array, 1, mesh.tp_size,
                                                 mesh.tp_rank), **TOL)
    assert np.all(shard.grad.array[[1, 4]] == 0)


class Block(nn.Module):
    def __init__(self, comm):
        super().__init__()
        self.comm = comm
        self.ln1, self.ln2 = nn.LayerNorm(E), nn.LayerNorm(E)
        if comm is None:
            self.attn = nn.MultiheadAttention(E, H, batch_first=True)
            self.fc1, self.fc2 = nn.Linear(E, 4 * E), nn.Linear(4 * E, E)
        else:
            self.attn = parallel.ParallelSelfAttention(E, H, comm)
            self.fc1 = parallel.ColumnParallelLinear(E, 4 * E, comm)
            self.fc2 = parallel.RowParallelLinear(4 * E, E, comm)

    def forward(self, h):
        a = self.ln1(h)
        if self.comm is None:
            h = h + self.attn(a, a, a, attn_mask=causal_mask(T), need_weights=False)[0]
        else:
            h = h + self.attn(a, is_causal=True)
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


class GPT(nn.Module):
    """embedding -> blocks -> LayerNorm -> head; serial when ``comm`` is None."""

    def __init__(self, comm=None, layers=2):
        super().__init__()
        self.comm = comm
        self.tok = nn.Embedding(V, E) if comm is None else parallel.VocabParallelEmbedding(
            V, E, comm)
        self.blocks = nn.ModuleList([Block(comm) for _ in range(layers)])
        self.lnf = nn.LayerNorm(E)
        self.head = nn.Linear(E, V, bias=False) if comm is None else \
            parallel.ColumnParallelLinear(E, V, comm, bias=False)

    def forward(self, idx):
        h = self.tok(idx)
        for block in self.blocks:
            h = block(h)
        return self.head(self.lnf(h))  # (B, T, V / tp) logits

    def loss(self, idx, target, logits=None):
        logits = self(sn.tensor(idx)) if logits is None else logits
        logits = logits.reshape(-1, logits.shape[-1])
        if self.comm is None:
            return F.cross_entropy(logits, target.reshape(-1))
        return parallel.vocab_parallel_cross_entropy(logits, target.reshape(-1), self.comm)


def test_gpt_equals_serial(mesh):
    sn.manual_seed(0)
    serial = GPT()
    sn.manual_seed(0)
    model = GPT(mesh.tp)
    rng = np.random.default_rng(1)
    nets = (serial, model)
    opts = [optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1) for net in nets]
    for step in range(3):
        idx, target = rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))
        target[0, step] = -100
        losses = []
        for net, opt in zip(nets, opts):
            opt.zero_grad()
            loss = net.loss(idx, target)
            loss.backward()
            losses.append(float(loss.array))
        np.testing.assert_allclose(losses[1], losses[0], **TOL)
        assert_grads_match(serial, model, mesh)
        for opt in opts:
            opt.step()
    # the k bias's gradient is zero up to rounding (softmax ignores it); Adam's
    # eps turns that ~1e-17 noise into ~lr * 1e-17 / eps ~ 1e-11 updates
    after = {"rtol": 1e-9, "atol": 1e-9}
    want = serial.state_dict()
    for key, p in model.named_parameters():
        np.testing.assert_allclose(p.array, local(want[key], p, mesh), **after, err_msg=key)
    full = parallel.gather_state_dict(model, mesh)
    if full is not None:
        assert full.keys() == want.keys()
        for key, value in want.items():
            np.testing.assert_allclose(full[key], value, **after, err_msg=key)


def test_gpt_tp2_with_data_parallel_equals_serial_on_the_global_batch():
    """tp = 2, dp = size / 2 (2 x 2 at 4 ranks): each dp rank's TP GPT runs
    its rows of the global batch, DataParallel over mesh.dp averages the
    gradients; the serial GPT runs the whole batch."""
    if dist.size() % 2:
        pytest.skip(f"tp=2 does not divide {dist.size()} ranks")
    with dist.Mesh(tp=2) as mesh:
        sn.manual_seed(0)
        serial = GPT()
        sn.manual_seed(0)
        model = GPT(mesh.tp)
        ddp = parallel.DataParallel(model, comm=mesh.dp)
        rows = slice(2 * mesh.dp_rank, 2 * mesh.dp_rank + 2)  # 2 windows per dp rank
        rng = np.random.default_rng(1)
        opts = [optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
                for net in (serial, model)]
        for _ in range(3):
            shape = (2 * mesh.dp_size, T)
            idx, target = rng.integers(0, V, shape), rng.integers(0, V, shape)
            for opt in opts:
                opt.zero_grad()
            want = serial.loss(idx, target)
            want.backward()
            loss = model.loss(idx[rows], target[rows], logits=ddp(sn.tensor(idx[rows])))
            loss.backward()  # returns with the gradients averaged over mesh.dp
            mean = dist.allreduce(float(loss.array), "mean", comm=mesh.dp)
            np.testing.assert_allclose(mean, float(want.array), **TOL)
            assert_grads_match(serial, model, mesh)
            for opt in opts:
                opt.step()
        want = serial.state_dict()
        for key, p in model.named_parameters():
            np.testing.assert_allclose(p.array, local(want[key], p, mesh), rtol=1e-9, atol=1e-9,
                                       err_msg=key)


def test_state_dict_round_trip_by_heads(mesh):
    sn.manual_seed(0)
    model = parallel.ParallelSelfAttention(E, H, mesh.tp)
    sn.manual_seed(0)
    same_seed = nn.MultiheadAttention(E, H, batch_first=True)
    x = sn.tensor(values(1, (B, T, E)))
    full = parallel.gather_state_dict(model, mesh)
    if full is not None:  # the TP checkpoint is the serial model's
        for key, value in same_seed.state_dict().items():
            np.testing.assert_array_equal(full[key], value, err_msg=key)
    sn.manual_seed(5)  # a different serial model: load it into the TP layer and back
    other = nn.MultiheadAttention(E, H, batch_first=True)
    want = other(x, x, x, need_weights=False)[0].array
    parallel.scatter_state_dict(model, other.state_dict(), mesh)
    np.testing.assert_allclose(model(x).array, want, **TOL)
    back = parallel.gather_state_dict(model, mesh)
    if back is not None:
        sn.manual_seed(9)
        fresh = nn.MultiheadAttention(E, H, batch_first=True)
        fresh.load_state_dict(back)
        np.testing.assert_allclose(fresh(x, x, x, need_weights=False)[0].array, want, **TOL)
    sn.manual_seed(0)
    model.load_serial(same_seed)
    np.testing.assert_allclose(model(x).array,
                               same_seed(x, x, x, need_weights=False)[0].array, **TOL)


def test_self_attention_one_allreduce_each_way(mesh, monkeypatch):
    calls = []
    real = dist.allreduce
    monkeypatch.setattr(dist, "allreduce", lambda x, *a, **k: calls.append(1) or real(x, *a, **k))
    model = parallel.ParallelSelfAttention(E, H, mesh.tp)
    x = sn.tensor(values(1, (B, T, E)), requires_grad=True)
    out = model(x, is_causal=True)
    forward = len(calls)
    out.sum().backward()
    expected = 0 if mesh.tp_size == 1 else 1
    assert (forward, len(calls) - forward) == (expected, expected)
