"""Round 3 of the fault cases (issue 26): errors that name what went wrong,
and no noise where PyTorch is silent. Each test failed before its fix."""
import os
import subprocess
import sys
import textwrap
import warnings

import h5py
import numpy as np
import pytest

import spmdnet as sn
import spmdnet.nn.functional as F
from spmdnet import nn
from spmdnet.utils.data.hdf5 import HDF5Dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, env=None, timeout=120):
    """A fresh interpreter running ``code``: (returncode, stdout, stderr)."""
    full = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, **(env or {}))
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=timeout, env=full, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


# -- scaled_dot_product_attention names the shapes (item 16) --------------------

@pytest.mark.parametrize("shapes, words", [
    (((2, 3, 4, 8), (2, 3, 5, 6), (2, 3, 5, 8)), "embedding size 8 differs from key's 6"),
    (((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 6, 8)), "sequence length 5 differs from value's 6"),
    (((2, 3, 4, 8), (4, 3, 5, 8), (4, 3, 5, 8)), "batch dimensions do not broadcast"),
])
def test_attention_with_mismatched_shapes_names_them(shapes, words):
    q, k, v = (sn.randn(*s) for s in shapes)
    with pytest.raises(RuntimeError) as info:
        F.scaled_dot_product_attention(q, k, v)
    message = str(info.value)
    assert words in message
    for s in shapes:  # every input's shape, as PyTorch's message gives them
        assert str(s) in message


# -- an empty batch: NaN, silently, as PyTorch (item 19) ------------------------

LOSSES = {
    "cross_entropy": lambda x: F.cross_entropy(x, sn.zeros(0, dtype=sn.long)),
    "cross_entropy_probs": lambda x: F.cross_entropy(x, sn.zeros(0, 5)),
    "nll_loss": lambda x: F.nll_loss(x, sn.zeros(0, dtype=sn.long)),
    "mse_loss": lambda x: F.mse_loss(x, sn.zeros(0, 5)),
    "l1_loss": lambda x: F.l1_loss(x, sn.zeros(0, 5)),
    "smooth_l1_loss": lambda x: F.smooth_l1_loss(x, sn.zeros(0, 5)),
    "bce_with_logits": lambda x: F.binary_cross_entropy_with_logits(x, sn.zeros(0, 5)),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_mean_loss_of_an_empty_batch_is_nan_without_warnings(name):
    x = sn.zeros(0, 5, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy's RuntimeWarning would raise here
        loss = LOSSES[name](x)
        loss.backward()
    assert np.isnan(loss.item())
    assert x.grad.shape == (0, 5)


def test_every_target_ignored_gives_nan_loss_and_zero_gradient():
    """PyTorch: the mean over no counted targets is NaN, the gradient zeros."""
    x = sn.randn(3, 5, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = F.cross_entropy(x, sn.full((3,), -100, dtype=sn.long))
        loss.backward()
    assert np.isnan(loss.item())
    np.testing.assert_array_equal(x.grad.array, np.zeros((3, 5), np.float32))


# -- a fatal signal shows the Python traceback (item 13) --------------------------

def test_a_fatal_signal_after_dist_init_prints_the_python_traceback():
    code = """
        import ctypes
        from spmdnet import dist
        dist.init()
        def read_the_mapped_file():
            ctypes.string_at(0)  # SIGSEGV, as a read of a truncated mapping gives SIGBUS
        read_the_mapped_file()
    """
    rc, _, err = run_python(code, env={"SPMDNET_ABORT_ON_ERROR": "0"})
    assert rc != 0
    assert "Fatal Python error" in err
    assert "read_the_mapped_file" in err  # the line that crashed, named


# -- a damaged kernel-cache file is removed and recompiled (item 11) --------------

KERNEL_USER = """
    import numpy as np
    import spmdnet as sn, spmdnet.nn.functional as F
    from spmdnet.kernels import _cache
    g = np.random.default_rng(0)
    x = sn.tensor(g.standard_normal((8, 5)).astype(np.float32), requires_grad=True)
    loss = F.cross_entropy(F.relu(x), sn.tensor(g.integers(0, 5, 8)))
    loss.backward()
    print(_cache.cache_dir())
    print(repr(loss.item()), float(x.grad.array.sum()))
"""


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_kernel_cache_file_is_removed_and_recompiled(tmp_path, damage):
    env = {"SPMDNET_CACHE_DIR": str(tmp_path)}
    rc, out, err = run_python(KERNEL_USER, env=env)
    assert rc == 0, err
    cache, first = out.splitlines()[0], out.splitlines()[1]
    files = sorted(os.path.join(folder, f) for folder, _, names in os.walk(cache)
                   for f in names if f.endswith((".nbi", ".nbc")))
    assert files, "the first run cached no kernel"
    for path in files:  # every file damaged: the index and the machine code
        blob = open(path, "rb").read()
        with open(path, "wb") as f:
            f.write(blob[: len(blob) // 2] if damage == "truncate" else b"\x80\x05garbage")
    rc, out, err = run_python(KERNEL_USER, env=env)
    assert rc == 0, err
    assert out.splitlines()[1] == first  # the same answer, from recompiled kernels
    assert "damaged kernel-cache file" in err and files[0] in err
    rc, out, err = run_python(KERNEL_USER, env=env)  # the cache healed: no more warnings
    assert rc == 0 and "damaged" not in err


# -- HDF5 data: corrupt chunks and non-finite values name the file (items 12, 14) --

def _chunked_file(path, x, y):
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(4,) + x.shape[1:], compression="gzip")
        f.create_dataset("y", data=y)
    return str(path)


def test_a_corrupt_chunk_under_the_default_cache_names_the_file_and_rank(tmp_path):
    rng = np.random.default_rng(0)
    path = _chunked_file(tmp_path / "d.h5", rng.standard_normal((64, 32)).astype(np.float32),
                         np.arange(64))
    with h5py.File(path, "r") as f:  # the file offset of one compressed chunk
        offset, size = f["x"].id.get_chunk_info(3).byte_offset, f["x"].id.get_chunk_info(3).size
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * size)  # garbage where gzip data was
    with pytest.raises(OSError) as info:
        HDF5Dataset(path)  # cache="auto": the whole file is read at open
    assert path in str(info.value) and "rank" in str(info.value) and "'x'" in str(info.value)


@pytest.mark.parametrize("cache", [True, False])
def test_nan_in_a_float_dataset_names_file_key_and_first_bad_row(tmp_path, cache):
    x = np.ones((40, 3), np.float32)
    x[23, 1], x[31, 0] = np.nan, np.inf
    path = _chunked_file(tmp_path / "nan.h5", x, np.arange(40))
    if cache:  # checked whole at open
        with pytest.raises(ValueError, match=r"nan.h5: 'x' holds NaN or infinity, first in "
                                             r"row 23"):
            HDF5Dataset(path, cache=True)
    else:  # checked as rows are first read: clean rows read fine
        ds = HDF5Dataset(path, cache=False)
        xb, _ = ds[np.arange(0, 20)]
        assert xb.shape == (20, 3)
        with pytest.raises(ValueError, match=r"first in row 31"):
            ds[np.array([35, 31, 2])]
    ok = HDF5Dataset(path, cache=cache, allow_nonfinite=True)  # the opt-out
    assert np.isnan(ok[np.array([23])][0][0, 1])


# -- an epoch with no step is an error, not a NaN loss and exit 0 (item 15) --------

@pytest.mark.parametrize("script, args", [
    ("examples/train_mlp.py", ["--batch-size", "100000", "--epochs", "1"]),
    ("examples/gpt/train_dp.py", ["--batch-size", "10000000", "--steps", "2"]),
])
def test_a_dataset_smaller_than_one_batch_stops_naming_the_numbers(tmp_path, script, args):
    p = subprocess.run([sys.executable, os.path.join(ROOT, script), "--data-dir",
                        str(tmp_path)] + args, capture_output=True, text=True, timeout=240,
                       cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1",
                                              PYTHONPATH=ROOT))
    assert p.returncode not in (0, None), p.stdout
    assert "no training step in an epoch" in p.stderr
    assert "fewer than the batch size" in p.stderr


# -- Sequential never fuses a Linear a wrapper manages (item 9) -----------------------

def test_sequential_runs_a_managed_linear_itself():
    seq = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    calls = []
    linear_forward = seq[0].forward
    seq[0].forward = lambda x: calls.append(1) or linear_forward(x)
    x = sn.randn(5, 4)
    unfused = seq(x)
    assert calls == [1]  # a forward assigned onto the module is never fused away
    del seq[0].forward
    assert seq.fused_pairs() == [(0, "relu")]
    fused = seq(x)
    handle = seq[0].register_forward_pre_hook(lambda module, args: None)
    assert seq.fused_pairs() == []  # a Linear a wrapper hooks (FSDP's unit) runs itself
    handle.remove()
    np.testing.assert_allclose(seq(x).array, fused.array, rtol=1e-6)
    np.testing.assert_allclose(unfused.array, fused.array, rtol=1e-6)


def test_log_and_sqrt_give_ieee_values_silently_as_pytorch():
    """The word-language model builds its mask as log(tril(ones)): -inf, no warning."""
    x = sn.tensor([0.0, 1.0, -1.0], dtype=sn.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = sn.log(x)
        y.sum().backward()
        root = sn.sqrt(sn.tensor([-1.0, 4.0]))
    np.testing.assert_array_equal(y.array, [-np.inf, 0.0, np.nan])
    np.testing.assert_array_equal(x.grad.array, [np.inf, 1.0, -1.0])  # 1/x
    np.testing.assert_array_equal(root.array, [np.nan, 2.0])
