"""Checkpoints that never lose work (issue 18): the directory probe, per-array
checksums, refusing NaN/Inf, resuming past a bad newest file, the pinned
clean checkpoint, stale temporaries and a full disk (single process; the
collective versions are in tests/mpi/test_checkpoint_mpi.py)."""
import errno
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections import namedtuple

import h5py
import numpy as np
import pytest

import spmdnet as sn
from spmdnet import checkpoint, nn
from spmdnet.checkpoint import files, integrity
from tests.helpers.launch import run_mpi
from tests.test_checkpoint import trained

Usage = namedtuple("Usage", "total used free")


@pytest.fixture(autouse=True)
def fresh_pins(monkeypatch):
    monkeypatch.setattr(checkpoint.directory, "loaded_cleanly", {})


def names(directory):
    return sorted(p.name for p in directory.iterdir())


def save_steps(directory, steps, keep=3):
    model, opt = trained()
    for step in steps:
        sn.save_checkpoint(str(directory) + "/", model, opt, step=step, keep=keep)
    return model, opt


# -- 4: a bad checkpoint directory fails before the first step -----------------------
def test_check_checkpoint_dir_creates_probes_and_leaves_nothing(tmp_path):
    target = tmp_path / "a" / "b"
    assert sn.check_checkpoint_dir(target) == str(target)
    assert target.is_dir() and names(target) == []


def test_check_checkpoint_dir_file_in_its_place(tmp_path):
    (tmp_path / "ck").write_text("not a directory")
    with pytest.raises(sn.CheckpointError, match=f"{tmp_path / 'ck'}.*a file is in its place"):
        sn.check_checkpoint_dir(tmp_path / "ck")


def test_check_checkpoint_dir_that_cannot_be_created(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(sn.CheckpointError, match="f/sub.*cannot create it"):
        sn.check_checkpoint_dir(tmp_path / "f" / "sub")


def test_check_checkpoint_dir_read_only(tmp_path, monkeypatch):
    def read_only(path, data):
        raise OSError(errno.EROFS, "Read-only file system", str(path))
    monkeypatch.setattr(files, "write_bytes", read_only)
    with pytest.raises(sn.CheckpointError, match="ck.*cannot write in it.*Read-only"):
        sn.check_checkpoint_dir(tmp_path / "ck")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_check_checkpoint_dir_without_write_permission(tmp_path):
    target = tmp_path / "ro"
    target.mkdir(mode=0o555)
    with pytest.raises(sn.CheckpointError, match="ro.*cannot write in it.*Permission"):
        sn.check_checkpoint_dir(target)


# -- 5: checksums, no NaN saved, the clean checkpoint is never rotated out -----------
def test_nan_written_into_the_file_is_caught_by_the_checksum(tmp_path):
    model, opt = trained()
    path = sn.save_checkpoint(tmp_path / "c.h5", model, opt, step=3)
    with h5py.File(path, "r+") as f:
        f["model/0.weight"][0, 0] = np.nan
    with pytest.raises(sn.CheckpointError, match=r"c.h5 is corrupt: array /model/0.weight"):
        sn.load_checkpoint(path, model, opt)


def test_flipped_bytes_are_caught_by_the_checksum(tmp_path):
    model, opt = trained()
    path = sn.save_checkpoint(tmp_path / "c.h5", model, opt, step=3)
    with h5py.File(path, "r") as f:
        offset = f["optimizer/0/exp_avg"].id.get_offset()
    with open(path, "r+b") as fh:
        fh.seek(offset + 5)
        byte = fh.read(1)
        fh.seek(offset + 5)
        fh.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(sn.CheckpointError, match="corrupt: array /optimizer/0/exp_avg"):
        sn.load_checkpoint(path, model, opt)


def test_checksum_sees_values_positions_and_length():
    a = np.arange(1000, dtype=np.float32)
    swapped = a.copy()
    swapped[[3, 700]] = swapped[[700, 3]]
    digests = {integrity.checksum(x) for x in (a, swapped, a[:-1], a.astype(np.float64))}
    assert len(digests) == 4 and integrity.checksum(a.copy()) == integrity.checksum(a)


def test_non_finite_parameters_are_not_saved_by_default(tmp_path):
    model, opt = trained()
    model[0].weight.data[1, 2] = np.nan
    with pytest.raises(sn.CheckpointError, match=r"parameter '0.weight' holds 1 NaN/Inf"):
        sn.save_checkpoint(str(tmp_path) + "/", model, opt, step=1)
    assert names(tmp_path) == []
    sn.save_checkpoint(str(tmp_path) + "/", model, opt, step=1, allow_nonfinite=True)
    with pytest.raises(sn.CheckpointError, match="0.weight holds 1 NaN/Inf"):
        sn.load_checkpoint(tmp_path, model, opt)
    assert sn.load_checkpoint(tmp_path, model, opt, allow_nonfinite=True)["step"] == 1


def test_non_finite_optimizer_state_names_the_parameter(tmp_path):
    model, opt = trained()
    next(iter(opt.state.values()))["exp_avg_sq"][...] = np.inf
    with pytest.raises(sn.CheckpointError,
                       match=r"optimizer state 'exp_avg_sq' of parameter '0.weight' holds 24"):
        sn.save_checkpoint(tmp_path / "c.h5", model, opt, step=1)


def test_the_checkpoint_that_loaded_cleanly_is_never_rotated_out(tmp_path):
    model, opt = save_steps(tmp_path, [1, 2, 3], keep=2)
    sn.load_checkpoint(tmp_path / "ckpt-00000002.h5", model, opt)
    for step in (4, 5, 6):
        sn.save_checkpoint(str(tmp_path) + "/", model, opt, step=step, keep=2)
    assert names(tmp_path) == ["ckpt-00000002.h5", "ckpt-00000005.h5", "ckpt-00000006.h5",
                               "latest"]


# -- 6: a bad newest checkpoint does not block the resume ----------------------------
@pytest.fixture
def warnings_seen(caplog):
    logger = sn.dist.get_logger()
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="spmdnet")
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.mark.parametrize("damage", ["truncate", "nan"])
def test_resume_falls_back_past_a_bad_newest_checkpoint(tmp_path, damage, warnings_seen):
    model, opt = save_steps(tmp_path, [1, 2, 3])
    newest = tmp_path / "ckpt-00000003.h5"
    if damage == "truncate":
        newest.write_bytes(newest.read_bytes()[:5000])
    else:
        with h5py.File(newest, "r+") as f:
            f["model/3.bias"][0] = np.nan
    assert sn.latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-00000002.h5")
    assert sn.load_checkpoint(tmp_path, model, opt)["step"] == 2
    skipped = [r.getMessage() for r in warnings_seen.records]
    assert skipped and all(f"skipping checkpoint {newest}" in m for m in skipped)
    assert ("unreadable or corrupt" if damage == "truncate" else "3.bias") in skipped[0]
    assert sn.latest_checkpoint(tmp_path, verify=False) == str(newest)


def test_no_checkpoint_verifies(tmp_path, warnings_seen):
    save_steps(tmp_path, [1])
    (tmp_path / "ckpt-00000001.h5").write_bytes(b"garbage")
    assert sn.latest_checkpoint(tmp_path) is None
    with pytest.raises(sn.CheckpointError, match="ckpt-00000001.h5 is unreadable"):
        sn.load_checkpoint(tmp_path, nn.Linear(4, 6))


# -- 8: stale temporaries of interrupted saves ---------------------------------------
def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_are_removed_at_the_next_save(tmp_path):
    host, old = socket.gethostname(), time.time() - files.STALE_TEMP_S - 60
    temps = {"dead": f".ckpt-00000001.h5.tmp-{host}-{dead_pid()}",
             "live": f".ckpt-00000001.h5.tmp-{host}-{os.getpid()}",
             "other_old": ".ckpt-00000001.h5.tmp-node17-4242",
             "other_new": ".ckpt-00000001.h5.tmp-node17-4243",
             "pre_host_old": ".latest.tmp-99",
             "not_ours": ".notes.tmp-node17-1"}
    for key, name in temps.items():
        (tmp_path / name).write_bytes(b"x" * 100)
        if key in ("other_old", "pre_host_old", "not_ours"):
            os.utime(tmp_path / name, (old, old))
    save_steps(tmp_path, [2])
    left = set(names(tmp_path))
    assert {temps[k] for k in ("live", "other_new", "not_ours")} <= left
    assert not {temps[k] for k in ("dead", "other_old", "pre_host_old")} & left


def test_temporaries_name_their_writer(tmp_path):
    name = files.temp_name(tmp_path / "ckpt-00000001.h5").name
    assert files.writer_of(name) == (socket.gethostname(), os.getpid())
    assert files.writer_of(".c.h5.tmp-123") == (None, 123)


# -- disk full -----------------------------------------------------------------------
def assert_previous_intact(directory):
    assert names(directory) == ["ckpt-00000001.h5", "latest"]  # no temporary left
    assert sn.latest_checkpoint(directory).endswith("ckpt-00000001.h5")


def test_disk_full_found_before_writing_names_the_bytes(tmp_path, monkeypatch):
    model, opt = save_steps(tmp_path, [1])
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(sn.CheckpointError) as info:
        sn.save_checkpoint(str(tmp_path) + "/", model, opt, step=2)
    msg = str(info.value)
    needed = int(msg.split("needs ")[1].split(" bytes")[0])
    assert "ckpt-00000002.h5 failed on rank 0" in msg and f"no space left in {tmp_path}" in msg
    assert "1000 bytes (0.0 MiB) free" in msg
    arrays = sum(v.nbytes for v in model.state_dict().values())
    assert needed > 3 * arrays  # parameters and Adam's two moments
    assert_previous_intact(tmp_path)


def test_disk_full_part_way_through_the_write(tmp_path, monkeypatch):
    model, opt = save_steps(tmp_path, [1])
    real_write, calls = os.write, []

    def filling_write(fd, data):
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data[: len(data) // 2])
    monkeypatch.setattr(files.os, "write", filling_write)
    with pytest.raises(sn.CheckpointError, match=r"ckpt-00000002.h5 failed on rank 0: .*needs \d+"):
        sn.save_checkpoint(str(tmp_path) + "/", model, opt, step=2)
    monkeypatch.undo()
    assert_previous_intact(tmp_path)


def test_a_failure_after_the_write_is_a_checkpoint_error(tmp_path, monkeypatch):
    model, opt = save_steps(tmp_path, [1])

    def full(directory, name):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoint.directory, "point_latest", full)
    with pytest.raises(sn.CheckpointError, match="'latest' could not be updated.*No space"):
        sn.save_checkpoint(str(tmp_path) + "/", model, opt, step=2)
    assert_previous_intact(tmp_path)


DISK_FULL = textwrap.dedent("""
    import errno, os, sys
    import spmdnet as sn
    from spmdnet import dist, nn
    from spmdnet.checkpoint import files
    dist.init()
    model = nn.Linear(300, 300)
    sn.save_checkpoint(sys.argv[1], model, step=1)
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    files.os.write = full
    sn.save_checkpoint(sys.argv[1], model, step=2)
""")


def test_disk_full_under_mpi_without_abort_is_one_error_per_rank(tmp_path):
    script = tmp_path / "full.py"
    script.write_text(DISK_FULL)
    target = tmp_path / "ck"
    code, _, err, _ = run_mpi(2, script, str(target) + "/", timeout=90,
                              env={"SPMDNET_ABORT_ON_ERROR": "0"})
    assert code == 1, err  # no segfault (139/-11), no hang
    # both ranks raise it; their stderr lines may interleave, so count the name alone
    assert err.count("Traceback (most recent call last)") == 2
    assert err.count("CheckpointError") >= 2 and "saving checkpoint" in err
    # a 300x300 float32 Linear is 361,200 bytes; the rest is metadata (each rank's RNG state)
    needed = int(re.search(r"the checkpoint needs (\d+) bytes", err).group(1))
    assert 361_200 < needed < 400_000, needed
    assert "Segmentation" not in err and "h5py" not in err
    assert_previous_intact(target)
