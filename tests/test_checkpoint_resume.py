"""spmdnet.checkpoint.resume and save_checkpoint(scheduler=, loader=): a run
stopped after k steps and resumed from its checkpoint ends with the weights
of the run that never stopped (bitwise), a new run gets None, and options
that differ from the saved ones are refused before anything is loaded."""
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import data, nn, optim
from spmdnet.checkpoint import resume

OPTIONS = {"lr": 0.05, "betas": (0.9, 0.99), "hidden": 6}


def run_parts(seed=0):
    """(model, optimizer, scheduler, loader) of a small run with dropout (so
    the RNG state matters) over a shuffled 40-sample set in batches of 8."""
    sn.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Dropout(0.3), nn.Linear(6, 3))
    opt = optim.Adam(model.parameters(), lr=0.05, betas=(0.9, 0.99))
    sched = optim.lr_scheduler.WarmupCosine(opt, 3, 20)
    rng = np.random.default_rng(1)
    dataset = data.ArrayDataset(rng.standard_normal((40, 4)).astype(np.float32),
                                np.arange(40) % 3)
    sampler = data.DistributedSampler(dataset, num_replicas=1, rank=0, seed=3, drop_last=True)
    return model, opt, sched, data.DataLoader(dataset, 8, sampler=sampler, drop_last=True)


def train(model, opt, sched, loader, steps):
    """``steps`` steps, continuing the loader's epoch and position."""
    done = 0
    while done < steps:
        loader.sampler.set_epoch(loader.sampler.epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(sn.tensor(x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            done += 1
            if done == steps:
                return
        loader.sampler.set_epoch(loader.sampler.epoch + 1)


def test_resume_continues_exactly_where_the_saved_run_stopped(tmp_path):
    whole = run_parts()
    train(*whole, 13)  # 5 steps per epoch: stops and ends mid-epoch

    first = run_parts()
    train(*first, 7)
    sn.save_checkpoint(str(tmp_path) + "/", first[0], first[1], step=7, scheduler=first[2],
                       loader=first[3], options=OPTIONS, note="mid-epoch 1")
    sn.manual_seed(99)  # the resumed run's RNG comes from the checkpoint, not from here
    second = run_parts(seed=5)  # other initial weights: all replaced by the checkpoint
    extra = resume(tmp_path, second[0], second[1], scheduler=second[2], loader=second[3],
                   options=OPTIONS)
    assert extra["step"] == 7 and extra["note"] == "mid-epoch 1"
    assert second[2].get_last_lr() == first[2].get_last_lr()
    assert second[3].state_dict() == first[3].state_dict()
    train(*second, 6)
    for name, value in whole[0].state_dict().items():
        assert np.array_equal(second[0].state_dict()[name], value), name
    assert second[2].get_last_lr() == whole[2].get_last_lr()


def test_a_new_run_resumes_from_nothing(tmp_path):
    model, opt, sched, loader = run_parts()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert resume(None, model, opt, scheduler=sched, loader=loader) is None
    assert resume(tmp_path / "empty", model, opt, options=OPTIONS) is None
    assert all(np.array_equal(model.state_dict()[k], v) for k, v in before.items())


def test_other_options_are_refused_naming_them_before_loading(tmp_path):
    model, opt, sched, loader = run_parts()
    sn.save_checkpoint(str(tmp_path) + "/", model, opt, step=1, options=OPTIONS)
    other, other_opt, _, _ = run_parts(seed=4)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    changed = dict(OPTIONS, lr=0.1, hidden=8)
    with pytest.raises(ValueError, match=r"'hidden': \(6, 8\), 'lr': \(0.05, 0.1\)") as info:
        resume(tmp_path, other, other_opt, options=changed)
    assert "ckpt-00000001.h5" in str(info.value) and "betas" not in str(info.value)
    assert all(np.array_equal(other.state_dict()[k], v) for k, v in before.items())
    assert resume(tmp_path, other, other_opt, options=OPTIONS)["step"] == 1  # tuples: as saved


def test_load_checkpoint_restores_scheduler_and_loader_it_is_given(tmp_path):
    model, opt, sched, loader = run_parts()
    train(model, opt, sched, loader, 3)
    path = sn.save_checkpoint(tmp_path / "c.h5", model, opt, scheduler=sched, loader=loader)
    _, opt2, sched2, loader2 = run_parts()
    sn.load_checkpoint(path, model, opt2, scheduler=sched2, loader=loader2)
    assert sched2.get_last_lr() == sched.get_last_lr() and sched2.get_last_lr() != [0.05 / 3]
    assert loader2.state_dict() == loader.state_dict()
