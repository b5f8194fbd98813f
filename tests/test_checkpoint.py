"""Checkpoints: exact round trips, rotation, atomic commits that survive a
crash at any moment, and clear errors for bad files (single process)."""
import json
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import data, nn, optim
from tests.helpers.launch import ROOT


def trained(seed=0):
    sn.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Dropout(0.2), nn.Linear(6, 3))
    opt = optim.Adam(model.parameters(), lr=0.01)
    x, y = np.random.default_rng(seed).standard_normal((8, 4), np.float32), np.arange(8) % 3
    for _ in range(3):
        loss = F.cross_entropy(model(sn.tensor(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def states_equal(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a) and a.keys() == b.keys()


def test_round_trip_restores_everything(tmp_path):
    model, opt = trained()
    sampler = data.DistributedSampler(100, num_replicas=1, rank=0)
    sampler.set_epoch(4)
    sampler.set_start_index(30)
    path = sn.save_checkpoint(tmp_path / "c.h5", model, opt, sampler=sampler, step=17,
                              note="hello", sched={"last_epoch": 5})
    draws_after_save = sn.rand(3).numpy()
    model2, opt2 = trained(seed=1)
    sampler2 = data.DistributedSampler(100, num_replicas=1, rank=0)
    extra = sn.load_checkpoint(path, model2, opt2, sampler=sampler2)
    assert extra == {"note": "hello", "sched": {"last_epoch": 5}, "step": 17}
    assert states_equal(model.state_dict(), model2.state_dict())
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for i in s1["state"]:
        for k, v in s1["state"][i].items():
            np.testing.assert_array_equal(v, s2["state"][i][k])
    assert sampler2.epoch == 4 and sampler2.start_index == 30
    np.testing.assert_array_equal(sn.rand(3).numpy(), draws_after_save)


def test_directory_rotation_and_latest_pointer(tmp_path):
    model, opt = trained()
    for step in range(1, 6):
        sn.save_checkpoint(str(tmp_path) + "/", model, opt, step=step, keep=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-00000004.h5", "ckpt-00000005.h5", "latest"]
    assert sn.latest_checkpoint(tmp_path).endswith("ckpt-00000005.h5")
    assert sn.load_checkpoint(tmp_path, model)["step"] == 5


CRASH = textwrap.dedent("""
    import os, sys
    import numpy as np
    import spmdnet as sn
    from spmdnet import nn, optim
    from spmdnet.checkpoint import files, h5format
    sn.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sn.save_checkpoint(sys.argv[1], model, opt, step=1)           # the good one
    model.weight.data[...] = 42.0
    where = sys.argv[2]
    if where == "datasets":   # die while the optimizer datasets are being written
        h5format.write_optimizer = lambda group, state: os._exit(9)
    else:                     # die after writing, before the rename
        files.fsync = lambda path: os._exit(9)
    sn.save_checkpoint(sys.argv[1], model, opt, step=2)
""")


@pytest.mark.parametrize("where", ["datasets", "before_rename"])
def test_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, where):
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    target = tmp_path / "model.h5"
    proc = subprocess.run([sys.executable, str(script), str(target), where], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    sn.manual_seed(5)
    model = nn.Linear(3, 2)
    assert sn.load_checkpoint(target, model)["step"] == 1  # the previous one, intact
    assert not np.any(model.weight.array == 42.0)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("crash.py", "model.h5")]
    assert all(name.startswith(".model.h5.tmp-") for name in leftovers)


def test_truncated_file_raises_with_path(tmp_path):
    model, opt = trained()
    path = sn.save_checkpoint(tmp_path / "c.h5", model, opt, step=3)
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[: len(raw) // 2])
    with pytest.raises(sn.CheckpointError, match="c.h5.*(unreadable|corrupt)"):
        sn.load_checkpoint(path, model)


def test_incomplete_file_raises(tmp_path):
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("model/weight", data=np.zeros(3))
    with pytest.raises(sn.CheckpointError, match="incomplete"):
        sn.load_checkpoint(path, nn.Linear(3, 1))


def test_missing_file_raises(tmp_path):
    with pytest.raises(sn.CheckpointError, match="does not exist"):
        sn.load_checkpoint(tmp_path / "nope.h5", nn.Linear(3, 1))


def test_incompatible_model_names_what_differs(tmp_path):
    model, opt = trained()
    path = sn.save_checkpoint(tmp_path / "c.h5", model, opt, step=8)
    other = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3), nn.Linear(3, 3))
    with pytest.raises(sn.CheckpointError) as info:
        sn.load_checkpoint(path, other)
    msg = str(info.value)
    assert "step 8" in msg and "0.weight: checkpoint (6, 4) vs model (5, 4)" in msg
    assert "missing ['2.bias', '2.weight'], unexpected []" in msg
    assert "3.weight: checkpoint (3, 6) vs model (3, 3)" in msg


def test_other_world_layout_is_rejected(tmp_path):
    model, opt = trained()
    path = sn.save_checkpoint(tmp_path / "c.h5", model, opt, step=2)
    with h5py.File(path, "r+") as f:
        meta = json.loads(f.attrs["meta"])
        meta["layout"] = {"size": 4, "tp": 2, "pp": 1}
        f.attrs["meta"] = json.dumps(meta)
    with pytest.raises(sn.CheckpointError, match="'size': 4, 'tp': 2.*this job is"):
        sn.load_checkpoint(path, model)


def test_extra_must_be_json(tmp_path):
    model, _ = trained()
    with pytest.raises(sn.CheckpointError, match="JSON"):
        sn.save_checkpoint(tmp_path / "c.h5", model, step=1, bad=np.zeros(2))
    assert not (tmp_path / "c.h5").exists()
