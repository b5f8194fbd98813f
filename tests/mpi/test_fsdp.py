"""FullyShardedDataParallel against serial training on the global batch (float64).

Runs at any number of ranks (CI: 1 to 4). The parameter counts of the units
(5*7+7, 7*5+5, 5+5 ...) do not divide by 2, 3 or 4, so shards are padded.
"""
import gc
import math
import weakref

import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel
from spmdnet.autograd.grad_placement import has_placement
from spmdnet.distributed.fsdp import _flat_param as fsdp_flat

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("world_float64")]

D, H, B = 5, 7, 3  # model width, hidden width, batch per rank


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x):
        return F.tanh(self.fc(x))


class Block(nn.Module):
    """A residual MLP unit with a nested unit and a parameter that gets no gradient."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.up = nn.Linear(D, H)
        self.inner = Inner()
        self.down = nn.Linear(H, D)
        self.unused = nn.Linear(2, 3)

    def forward(self, x):
        return x + self.down(self.inner(F.gelu(self.up(self.norm(x)))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, D)
        self.blocks = nn.Sequential(Block(), Block())
        self.spare = Block()  # a unit that never runs: its shard gets a zero gradient
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))


def make(wrap=(Block, Inner), reshard=True, prefetch=True):
    sn.manual_seed(3)
    net = Net()
    return net, parallel.FullyShardedDataParallel(net, wrap=wrap, reshard_after_forward=reshard,
                                                  prefetch=prefetch)


def serial():
    sn.manual_seed(3)
    return Net()


def global_batch(step):
    rng = np.random.default_rng(step)
    n = B * dist.size()
    return rng.standard_normal((n, 4)), rng.integers(0, 3, n)


def local(arrays):
    r = dist.rank()
    return [a[B * r:B * (r + 1)] for a in arrays]


def serial_step(model, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(model(sn.tensor(x)), y).backward()
    for p in model.parameters():  # DataParallel's rule: no gradient counts as zero
        if p.grad is None:
            p.grad = np.zeros_like(p.array)
    opt.step()


def fsdp_step(fsdp, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(fsdp(sn.tensor(x)), y).backward()
    opt.step()


def assert_same_state(fsdp, ref, tol=1e-12):
    full, expected = fsdp.state_dict(), ref.state_dict()
    assert list(full) == list(expected)
    for k in expected:
        np.testing.assert_allclose(full[k], expected[k], rtol=tol, atol=tol, err_msg=k)


def train_against_serial(fsdp, cls, kw, steps):
    """``steps`` steps of FSDP on local batches and of the serial model on the
    global batch; the full states must agree after each."""
    ref = serial()
    opt, ref_opt = cls(fsdp.parameters(), **kw), cls(ref.parameters(), **kw)
    for step in range(steps):
        x, y = global_batch(step)
        serial_step(ref, ref_opt, x, y)
        fsdp_step(fsdp, opt, *local((x, y)))
        assert_same_state(fsdp, ref)
    fsdp.close()


@pytest.mark.parametrize("cls,kw", [(optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                                    (optim.AdamW, {"lr": 0.02, "weight_decay": 0.1})])
@pytest.mark.parametrize("reshard", [True, False])
def test_equals_serial_training(cls, kw, reshard):
    train_against_serial(make(reshard=reshard)[1], cls, kw, steps=4)


@pytest.mark.parametrize("reshard", [True, False])
def test_prefetch_changes_nothing_but_timing(reshard):
    runs = []
    for prefetch in (True, False):
        _, fsdp = make(reshard=reshard, prefetch=prefetch)
        opt = optim.AdamW(fsdp.parameters(), lr=0.02)
        for step in range(3):
            fsdp_step(fsdp, opt, *local(global_batch(step)))
        runs.append((fsdp.state_dict(), fsdp.prefetcher.hits))
        fsdp.close()
    (with_prefetch, hits), (without, no_hits) = runs
    for k in without:
        np.testing.assert_array_equal(with_prefetch[k], without[k], err_msg=k)
    assert no_hits == 0 and (hits > 0) == (dist.size() > 1)


def test_predicate_wrap_and_no_wrap():
    for wrap in (None, lambda m: isinstance(m, nn.Linear)):
        train_against_serial(make(wrap=wrap)[1], optim.SGD, {"lr": 0.1}, steps=2)


def test_shard_sizes_are_ceil_numel_over_n():
    net, fsdp = make()
    n = dist.size()
    expected = {"": 4 * D + D + D * 3 + 3, "blocks.0": 2 * D + D * H + H + H * D + D + 2 * 3 + 3,
                "blocks.0.inner": H * H + H}
    sizes = {u.name: (sum(f.numel for f in u.flats), sum(f.shard.array.size for f in u.flats))
             for u in fsdp.units}
    for name, numel in expected.items():
        assert sizes[name] == (numel, math.ceil(numel / n)), name
    assert len(fsdp.units) == 1 + 3 * 2  # root, 3 blocks, 3 inner units
    assert sum(p.array.size for p in fsdp.parameters()) == sum(math.ceil(s[0] / n)
                                                              for s in sizes.values())
    assert all(p.array.size == 0 for p in net.parameters())  # no full data between steps
    fsdp.close()


def test_full_state_round_trip_and_identical_on_ranks():
    _, fsdp = make()
    opt = optim.AdamW(fsdp.parameters(), lr=0.05)
    x, y = global_batch(0)
    fsdp_step(fsdp, opt, *local((x, y)))  # ranks' local batches differ: shards must agree
    state = fsdp.state_dict()
    everyone = fsdp.comm.allgather(state)
    for other in everyone:
        for k in state:
            np.testing.assert_array_equal(other[k], state[k], err_msg=k)
    only0 = fsdp.state_dict(rank0_only=True)
    assert (list(only0) == list(state)) if dist.rank() == 0 else only0 == {}
    changed = {k: v + 0.5 for k, v in state.items()}
    fsdp.load_state_dict(changed)
    back = fsdp.state_dict()
    for k in state:
        np.testing.assert_array_equal(back[k], changed[k], err_msg=k)
    ref = serial()
    ref.load_state_dict(changed)
    assert_same_state(fsdp, ref, tol=0)
    fsdp.close()


def test_sharded_state_round_trip():
    _, fsdp = make()
    saved = fsdp.sharded_state_dict()
    full = fsdp.state_dict()
    for p in fsdp.parameters():
        p.data[...] = 7.0
    fsdp.load_sharded_state_dict(saved)
    after = fsdp.state_dict()
    for k in full:
        np.testing.assert_array_equal(after[k], full[k], err_msg=k)
    bad = dict(saved, world_size=saved["world_size"] + 1)
    with pytest.raises(ValueError, match="saved by"):
        fsdp.load_sharded_state_dict(bad)
    fsdp.close()


def test_no_full_parameters_or_gradients_alive_between_steps(monkeypatch):
    alive = []
    take = fsdp_flat.Pool.take

    def tracked_take(self, xp, n, dtype):  # gathered parameters and gradient buckets
        buf = take(self, xp, n, dtype)
        alive.append(weakref.ref(buf))
        return buf

    monkeypatch.setattr(fsdp_flat.Pool, "take", tracked_take)
    for reshard in (True, False):
        net, fsdp = make(reshard=reshard)
        opt = optim.AdamW(fsdp.parameters(), lr=0.01)
        x, y = global_batch(1)
        alive.clear()
        fsdp_step(fsdp, opt, *local((x, y)))
        assert fsdp.pool.nbytes() > 0  # the reusable buffers, and nothing else, hold them
        assert fsdp.buffer.staged_bytes() == 0  # every gradient bucket's storage went back
        fsdp.pool.clear()
        gc.collect()
        assert alive and not [ref() for ref in alive if ref() is not None]
        assert all(p.array.size == 0 and p.grad is None and not has_placement(p)
                   for p in net.parameters())
        assert all(p.grad is not None and p.grad.array.shape == p.array.shape
                   for p in fsdp.parameters())
        fsdp.close()


def test_no_sync_accumulates_then_reduces():
    _, fsdp = make()
    ref = serial()
    opt, ref_opt = optim.SGD(fsdp.parameters(), lr=0.1), optim.SGD(ref.parameters(), lr=0.1)
    (x0, y0), (x1, y1) = global_batch(5), global_batch(6)
    ref_opt.zero_grad()
    for x, y in ((x0, y0), (x1, y1)):
        F.cross_entropy(ref(sn.tensor(x)), y).backward()
    for p in ref.parameters():
        if p.grad is None:
            p.grad = np.zeros_like(p.array)
    ref_opt.step()
    opt.zero_grad()
    with fsdp.no_sync():
        F.cross_entropy(fsdp(sn.tensor(local((x0, y0))[0])), local((x0, y0))[1]).backward()
    assert all(p.grad is None for p in fsdp.parameters())
    F.cross_entropy(fsdp(sn.tensor(local((x1, y1))[0])), local((x1, y1))[1]).backward()
    opt.step()
    assert_same_state(fsdp, ref)
    fsdp.close()


def test_clip_grad_norm_is_global():
    _, fsdp = make()
    ref = serial()
    x, y = global_batch(2)
    F.cross_entropy(ref(sn.tensor(x)), y).backward()
    F.cross_entropy(fsdp(sn.tensor(local((x, y))[0])), local((x, y))[1]).backward()
    expected = math.sqrt(sum(float((p.grad.array ** 2).sum())
                             for p in ref.parameters() if p.grad is not None))
    assert fsdp.clip_grad_norm_(expected / 2) == pytest.approx(expected, rel=1e-12)
    optim.clip_grad_norm_([p for p in ref.parameters() if p.grad is not None], expected / 2)
    for p in ref.parameters():
        p.grad = np.zeros_like(p.array) if p.grad is None else p.grad
    optim.SGD(ref.parameters(), lr=1.0).step()
    optim.SGD(fsdp.parameters(), lr=1.0).step()
    assert_same_state(fsdp, ref)
    fsdp.close()


def test_param_groups_never_decay_silently():
    _, fsdp = make()

    def no_decay_for_vectors(name, p):
        return {"weight_decay": 0.0} if p.ndim < 2 else {}

    with pytest.raises(ValueError, match="different options.*param_groups=fn"):
        fsdp.param_groups(no_decay_for_vectors)
    groups = fsdp.param_groups(lambda name, p: {"lr": 0.5})
    assert len(groups) == 1 and groups[0]["lr"] == 0.5
    assert len(groups[0]["params"]) == len(list(fsdp.parameters()))
    fsdp.close()


@pytest.mark.mpi(min_size=2)
def test_ranks_with_different_models_raise():
    sn.manual_seed(0)
    model = nn.Linear(3, 2 + (dist.rank() == 1))
    with pytest.raises(sn.DistributedError, match="different models"):
        parallel.FullyShardedDataParallel(model)


def test_eval_under_no_grad_matches_serial():
    _, fsdp = make()
    ref = serial()
    x, _ = global_batch(3)
    with sn.no_grad():
        out = fsdp(sn.tensor(x))
    np.testing.assert_allclose(out.array, ref(sn.tensor(x)).array, rtol=1e-12)
    assert all(p.array.size == 0 for p in fsdp.module.parameters())
    fsdp.close()


def test_optimizer_state_has_original_names_and_resumes():
    _, fsdp = make()
    ref = serial()
    kw = {"lr": 0.02, "weight_decay": 0.1}
    opt, ref_opt = optim.AdamW(fsdp.parameters(), **kw), optim.AdamW(ref.parameters(), **kw)
    for step in range(2):
        x, y = global_batch(step)
        serial_step(ref, ref_opt, x, y)
        fsdp_step(fsdp, opt, *local((x, y)))
    full = fsdp.optim_state_dict(opt)
    names = [n for n, _ in ref.named_parameters()]
    assert sorted(full["state"]) == sorted(names)
    assert sorted(full["param_groups"][0]["params"]) == sorted(names)
    expected = ref_opt.state_dict()["state"]
    for i, name in enumerate(names):
        for key, value in expected[i].items():
            np.testing.assert_allclose(full["state"][name][key], value, rtol=1e-12,
                                       atol=1e-14, err_msg=f"{name} {key}")
    # resume: a new model and optimizer from the full states, then one more step each
    model_state = fsdp.state_dict()
    _, fsdp2 = make()
    opt2 = optim.AdamW(fsdp2.parameters(), **kw)
    fsdp2.load_state_dict(model_state)
    fsdp2.load_optim_state_dict(opt2, full)
    x, y = global_batch(7)
    serial_step(ref, ref_opt, x, y)
    fsdp_step(fsdp, opt, *local((x, y)))
    fsdp_step(fsdp2, opt2, *local((x, y)))
    assert_same_state(fsdp, ref)
    resumed, uninterrupted = fsdp2.state_dict(), fsdp.state_dict()
    for k in resumed:
        np.testing.assert_array_equal(resumed[k], uninterrupted[k], err_msg=k)
    fsdp.close()
    fsdp2.close()


def test_wrapped_model_state_dict_is_the_full_state_and_close_restores_it():
    net, fsdp = make()
    full = fsdp.state_dict()
    from_model = net.state_dict()
    assert all(from_model[k].shape == full[k].shape and (from_model[k] == full[k]).all()
               for k in full)
    fsdp.close()
    ref = serial()
    x, _ = global_batch(4)
    np.testing.assert_allclose(net(sn.tensor(x)).array, ref(sn.tensor(x)).array, rtol=1e-12)


class DropBlock(nn.Module):
    """Dropout, and a buffer that counts training forwards (as BatchNorm's
    num_batches_tracked): recomputation must neither redraw nor recount."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.drop = nn.Dropout(0.5)
        self.register_buffer("calls", sn.zeros(()))

    def forward(self, x):
        self.calls.data += 1
        return x + self.drop(F.gelu(self.fc(x)))


def test_recomputation_replays_dropout_masks():
    """Recomputing a unit in backward draws the same dropout mask as its forward:
    the same steps with and without recomputation give the same model."""
    states = []
    for reshard in (True, False):
        sn.manual_seed(11)
        net = nn.Sequential(nn.Linear(4, D), DropBlock(), DropBlock(), nn.Linear(D, 3))
        fsdp = parallel.FullyShardedDataParallel(net, wrap={DropBlock},
                                                 reshard_after_forward=reshard)
        opt = optim.SGD(fsdp.parameters(), lr=0.1)
        for step in range(3):
            fsdp_step(fsdp, opt, *local(global_batch(step)))
        states.append(fsdp.state_dict())
        fsdp.close()
    assert states[0]["1.calls"] == states[1]["1.calls"] == 3
    for k in states[0]:
        np.testing.assert_allclose(states[0][k], states[1][k], rtol=1e-13, atol=1e-15, err_msg=k)


def test_save_and_load_checkpoint_hold_the_full_model(tmp_path):
    _, fsdp = make()
    opt = optim.SGD(fsdp.parameters(), lr=0.1)
    fsdp_step(fsdp, opt, *local(global_batch(0)))
    path = dist.bcast(str(tmp_path) if dist.rank() == 0 else None)
    saved = sn.save_checkpoint(path + "/", fsdp, step=3)
    before = fsdp.state_dict()
    for p in fsdp.parameters():
        p.data[...] = 0.0
    assert sn.load_checkpoint(saved, fsdp)["step"] == 3
    after = fsdp.state_dict()
    for k in before:
        assert before[k].numel() > 0
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    fsdp.close()


@pytest.mark.parametrize("cls,kw", [(optim.AdamW, {"lr": 0.02, "weight_decay": 0.1}),
                                    (optim.SGD, {"lr": 0.1, "momentum": 0.9})])
def test_checkpoint_resume_equals_uninterrupted_bit_for_bit(tmp_path, cls, kw):
    """Every rank's optimizer shard is saved (gathered by name) and restored."""
    _, fsdp = make()
    opt = cls(fsdp.parameters(), **kw)
    for step in range(2):
        fsdp_step(fsdp, opt, *local(global_batch(step)))
    path = dist.bcast(str(tmp_path) if dist.rank() == 0 else None)
    saved = sn.save_checkpoint(path + "/", fsdp, opt, step=2)
    for step in range(2, 4):
        fsdp_step(fsdp, opt, *local(global_batch(step)))
    _, fsdp2 = make()
    opt2 = cls(fsdp2.parameters(), **kw)
    assert sn.load_checkpoint(saved, fsdp2, opt2)["step"] == 2
    for step in range(2, 4):
        fsdp_step(fsdp2, opt2, *local(global_batch(step)))
    resumed, uninterrupted = fsdp2.state_dict(), fsdp.state_dict()
    for k in uninterrupted:
        np.testing.assert_array_equal(resumed[k], uninterrupted[k], err_msg=k)
    ours, theirs = fsdp2.optim_state_dict(opt2)["state"], fsdp.optim_state_dict(opt)["state"]
    for name in theirs:
        for key in theirs[name]:
            np.testing.assert_array_equal(ours[name][key], theirs[name][key], err_msg=name)
    fsdp.close()
    fsdp2.close()


def nan_backward(nonfinite):
    """One loss in which only the last rank's batch holds a NaN (and the state before)."""
    sn.manual_seed(3)
    fsdp = parallel.FullyShardedDataParallel(Net(), wrap=(Block, Inner), nonfinite=nonfinite)
    before = fsdp.state_dict()
    x, y = local(global_batch(0))
    if dist.rank() == dist.size() - 1:
        x = x.copy()
        x[0, 0] = np.nan
    return fsdp, F.cross_entropy(fsdp(sn.tensor(x)), y), before


def test_nonfinite_raise_names_rank_and_parameter_on_every_rank():
    fsdp, loss, _ = nan_backward("raise")
    with pytest.raises(sn.errors.NonFiniteError) as info:
        loss.backward()
    assert f"rank {dist.size() - 1} parameter 'embed.weight'" in str(info.value)
    assert "step 0" in str(info.value)
    fsdp.close()


def test_nonfinite_skip_skips_the_step_everywhere():
    fsdp, loss, before = nan_backward("skip")
    opt = optim.SGD(fsdp.parameters(), lr=0.1)
    loss.backward()
    assert all(p.grad is None for p in fsdp.parameters()) and fsdp.skipped_steps == 1
    opt.step()
    after = fsdp.state_dict()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    fsdp_step(fsdp, opt, *local(global_batch(1)))  # the next, healthy step goes through
    assert all(p.grad is not None and np.isfinite(p.grad.array).all() for p in fsdp.parameters())
    assert fsdp.skipped_steps == 1 and fsdp.steps == 2
    fsdp.close()


def test_nonfinite_mode_is_checked():
    with pytest.raises(ValueError, match="nonfinite"):
        parallel.FullyShardedDataParallel(Net(), nonfinite="warn")


def test_checkpoint_of_a_plain_optimizer_is_refused_by_fsdp(tmp_path):
    """Optimizer state keyed by index (not saved from FSDP) never loads silently."""
    ref = serial()
    ref_opt = optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    serial_step(ref, ref_opt, *global_batch(0))
    path = dist.bcast(str(tmp_path) if dist.rank() == 0 else None)
    saved = sn.save_checkpoint(path + "/", ref, ref_opt, step=1)
    _, fsdp = make()
    opt = optim.SGD(fsdp.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(sn.errors.CheckpointError, match="not saved from an FSDP model"):
        sn.load_checkpoint(saved, fsdp, opt)
    fsdp.close()
