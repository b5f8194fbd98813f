"""FullyShardedDataParallel with optimizer parameter groups inside a unit
(minGPT's "weight decay on the matrices, none on biases and LayerNorm"):
``param_groups=fn`` splits each GPT-like Block unit into one flat shard per
group; training equals serial AdamW with the same groups on the global
batch (float64), at any number of ranks (CI: 1 to 4).
"""
import math

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]

V, T, D, B = 11, 4, 6, 2  # vocabulary, sequence, width, sequences per rank
KW = {"lr": 0.05, "betas": (0.9, 0.95)}


class Block(nn.Module):
    """Pre-norm residual block: LayerNorms, a token-wise mixing Linear and an MLP."""

    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.Linear(D, D)
        self.fc, self.proj = nn.Linear(D, 3 * D), nn.Linear(3 * D, D)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.h = nn.Sequential(Block(), Block(), Block())
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx):
        pos = np.arange(idx.shape[1])
        return self.head(self.ln_f(self.h(self.wte(idx) + self.wpe(pos))))


def decay(name, p):
    return {"weight_decay": 0.1 if p.ndim >= 2 else 0.0}


def make(**kw):
    sn.manual_seed(5)
    net = GPT()
    return parallel.FullyShardedDataParallel(net, wrap={Block}, param_groups=decay, **kw)


def serial():
    sn.manual_seed(5)
    return GPT()


def serial_groups(model, fn=decay):
    groups = {}
    for name, p in model.named_parameters():
        groups.setdefault(fn(name, p)["weight_decay"], []).append(p)
    return [{"params": ps, "weight_decay": wd} for wd, ps in groups.items()]


def global_batch(step):
    rng = np.random.default_rng(step)
    n = B * dist.size()
    return rng.integers(0, V, (n, T)), rng.integers(0, V, (n, T))


def local(arrays):
    r = dist.rank()
    return [a[B * r:B * (r + 1)] for a in arrays]


def loss_of(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))


def serial_step(model, opt, x, y, clip=None):
    opt.zero_grad()
    loss_of(model, x, y).backward()
    if clip is not None:
        nn.utils.clip_grad_norm_(list(model.parameters()), clip)
    opt.step()


def fsdp_step(fsdp, opt, x, y, clip=None):
    opt.zero_grad()
    loss_of(fsdp, *local((x, y))).backward()
    if clip is not None:
        fsdp.clip_grad_norm_(clip)
    opt.step()


def assert_same(got, expected, tol=1e-12, exact=False):
    assert list(got) == list(expected)
    for k in expected:
        if exact:
            np.testing.assert_array_equal(got[k], expected[k], err_msg=k)
        else:
            np.testing.assert_allclose(got[k], expected[k], rtol=tol, atol=tol, err_msg=k)


def test_blocks_hold_one_flat_per_group_of_ceil_size():
    fsdp = make()
    n = dist.size()
    for unit in fsdp.units:
        if unit.name:  # a Block: matrices and vectors in separate flats
            assert [f.options for f in unit.flats] == [{"weight_decay": 0.0},
                                                       {"weight_decay": 0.1}]
        for f in unit.flats:
            assert all((len(s) >= 2) == (f.options["weight_decay"] == 0.1) for s in f.shapes)
            assert f.shard.shape == (math.ceil(f.numel / n),)
    groups = fsdp.param_groups()
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.1]
    assert sum(len(g["params"]) for g in groups) == len(list(fsdp.parameters()))
    assert fsdp.param_groups(decay) == groups  # the same function: the same groups
    with pytest.raises(ValueError, match="param_groups=fn"):  # a split it does not have
        fsdp.param_groups(lambda name, p: {"lr": 0.1 if name.endswith("bias") else 0.2})
    fsdp.close()


def test_adamw_groups_equal_serial_training():
    fsdp, ref, plain = make(), serial(), serial()
    opt = optim.AdamW(fsdp.param_groups(), **KW)
    ref_opt = optim.AdamW(serial_groups(ref), **KW)
    plain_opt = optim.AdamW(plain.parameters(), weight_decay=0.1, **KW)  # decays everything
    for step in range(4):
        x, y = global_batch(step)
        serial_step(ref, ref_opt, x, y, clip=0.5)
        serial_step(plain, plain_opt, x, y, clip=0.5)
        fsdp_step(fsdp, opt, x, y, clip=0.5)
        assert_same(fsdp.state_dict(), ref.state_dict())
    ln = fsdp.state_dict()["ln_f.weight"]
    assert np.abs(ln - plain.state_dict()["ln_f.weight"]).max() > 1e-6  # groups mattered
    assert all(p.array.size == 0 for p in fsdp.module.parameters())
    fsdp.close()


def test_no_sync_accumulates_every_group():
    fsdp, ref = make(), serial()
    opt, ref_opt = optim.AdamW(fsdp.param_groups(), **KW), optim.AdamW(serial_groups(ref), **KW)
    (x0, y0), (x1, y1) = global_batch(5), global_batch(6)
    ref_opt.zero_grad()
    for x, y in ((x0, y0), (x1, y1)):
        loss_of(ref, x, y).backward()
    ref_opt.step()
    opt.zero_grad()
    with fsdp.no_sync():
        loss_of(fsdp, *local((x0, y0))).backward()
    assert all(p.grad is None for p in fsdp.parameters())
    loss_of(fsdp, *local((x1, y1))).backward()
    opt.step()
    assert_same(fsdp.state_dict(), ref.state_dict())
    fsdp.close()


def test_state_and_optimizer_state_round_trips():
    fsdp, ref = make(), serial()
    opt, ref_opt = optim.AdamW(fsdp.param_groups(), **KW), optim.AdamW(serial_groups(ref), **KW)
    for step in range(2):
        serial_step(ref, ref_opt, *global_batch(step))
        fsdp_step(fsdp, opt, *global_batch(step))
    full = fsdp.optim_state_dict(opt)
    names = [n for n, _ in ref.named_parameters()]
    assert sorted(full["state"]) == sorted(names)
    by_decay = {g["weight_decay"]: sorted(g["params"]) for g in full["param_groups"]}
    assert by_decay == {0.1: sorted(n for n, p in ref.named_parameters() if p.ndim >= 2),
                        0.0: sorted(n for n, p in ref.named_parameters() if p.ndim < 2)}
    index = {id(p): i for i, p in enumerate(p for g in ref_opt.param_groups for p in g["params"])}
    expected = ref_opt.state_dict()["state"]
    for name, p in ref.named_parameters():
        for key, value in expected[index[id(p)]].items():
            np.testing.assert_allclose(full["state"][name][key], value, rtol=1e-12,
                                       atol=1e-14, err_msg=f"{name} {key}")
    # full states into a fresh model and optimizer; the sharded state into a third
    fsdp2, fsdp3 = make(), make()
    opt2, opt3 = optim.AdamW(fsdp2.param_groups(), **KW), optim.AdamW(fsdp3.param_groups(), **KW)
    fsdp2.load_state_dict(fsdp.state_dict())
    fsdp2.load_optim_state_dict(opt2, full)
    fsdp3.load_sharded_state_dict(fsdp.sharded_state_dict())
    fsdp3.load_optim_state_dict(opt3, full)
    assert_same(fsdp2.state_dict(), fsdp.state_dict(), exact=True)
    assert_same(fsdp3.state_dict(), fsdp.state_dict(), exact=True)
    x, y = global_batch(7)
    serial_step(ref, ref_opt, x, y)
    for model, o in ((fsdp, opt), (fsdp2, opt2), (fsdp3, opt3)):
        fsdp_step(model, o, x, y)
    assert_same(fsdp.state_dict(), ref.state_dict())
    assert_same(fsdp2.state_dict(), fsdp.state_dict(), exact=True)
    assert_same(fsdp3.state_dict(), fsdp.state_dict(), exact=True)
    for model in (fsdp, fsdp2, fsdp3):
        model.close()


def test_checkpoint_resume_equals_uninterrupted(tmp_path):
    fsdp = make()
    opt = optim.AdamW(fsdp.param_groups(), **KW)
    for step in range(2):
        fsdp_step(fsdp, opt, *global_batch(step), clip=0.5)
    path = dist.bcast(str(tmp_path) if dist.rank() == 0 else None)
    saved = sn.save_checkpoint(path + "/", fsdp, opt, step=2)
    for step in range(2, 4):
        fsdp_step(fsdp, opt, *global_batch(step), clip=0.5)
    fsdp2 = make()
    opt2 = optim.AdamW(fsdp2.param_groups(), **KW)
    assert sn.load_checkpoint(saved, fsdp2, opt2)["step"] == 2
    for step in range(2, 4):
        fsdp_step(fsdp2, opt2, *global_batch(step), clip=0.5)
    assert_same(fsdp2.state_dict(), fsdp.state_dict(), exact=True)
    ours, theirs = fsdp2.optim_state_dict(opt2), fsdp.optim_state_dict(opt)
    assert ours["param_groups"] == theirs["param_groups"]
    for name in theirs["state"]:
        for key in theirs["state"][name]:
            np.testing.assert_array_equal(ours["state"][name][key], theirs["state"][name][key],
                                          err_msg=f"{name} {key}")
    fsdp.close()
    fsdp2.close()


def test_nonfinite_skip_drops_every_groups_gradient():
    fsdp = make(nonfinite="skip")
    opt = optim.AdamW(fsdp.param_groups(), **KW)
    before = fsdp.state_dict()
    loss = loss_of(fsdp, *local(global_batch(0)))
    if dist.rank() == dist.size() - 1:
        loss = loss * float("nan")
    loss.backward()
    assert all(p.grad is None for p in fsdp.parameters()) and fsdp.skipped_steps == 1
    opt.step()
    assert_same(fsdp.state_dict(), before, exact=True)
    fsdp_step(fsdp, opt, *global_batch(1))  # the next, healthy step goes through
    assert all(p.grad is not None and np.isfinite(p.grad.array).all() for p in fsdp.parameters())
    fsdp.close()
