"""After the same ``manual_seed``, spmdnet draws PyTorch's numbers: every
case of torch_rng_cases.py against PyTorch 2.13's draws
(tests/fixtures/torch_rng/, README.md there), bitwise (the few cases in
NOT_BITWISE to the tolerance named there)."""
from pathlib import Path

import numpy as np
import pytest

import spmdnet as sn
from spmdnet.random import STATE_BYTES
from spmdnet.utils.data import dataloader, dataset, sampler

from . import torch_rng_cases as C

FIXTURE = Path(__file__).parent / "fixtures" / "torch_rng" / "draws.npz"


@pytest.fixture(scope="module")
def draws():
    with np.load(FIXTURE) as f:
        return dict(f)


@pytest.mark.parametrize("seed", C.SEEDS)
@pytest.mark.parametrize("name", sorted(C.CASES))
def test_draws_equal_pytorchs(draws, name, seed):
    got = C.CASES[name](sn, seed)
    want = [draws[f"{name}/{seed}/{i}"] for i in range(sum(k.startswith(f"{name}/{seed}/")
                                                           for k in draws))]
    assert len(got) == len(want), f"{name}: {len(got)} arrays, PyTorch's case has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{name}[{i}]: shape {g.shape}, PyTorch's {w.shape}"
        if name in C.NOT_BITWISE and g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=C.NOT_BITWISE[name],
                                       atol=C.NOT_BITWISE[name], err_msg=f"{name}[{i}]")
        else:
            assert g.dtype == w.dtype, f"{name}[{i}]: dtype {g.dtype}, PyTorch's {w.dtype}"
            np.testing.assert_array_equal(g, w, err_msg=f"{name}[{i}] (seed {seed})")


def test_pytorchs_state_bytes_restore_its_stream(draws):
    """A state PyTorch wrote (mid-stream, a normal cached) continues as PyTorch did."""
    state = draws["mixed_sequence/1/9"]
    assert state.shape == (STATE_BYTES,) and state.dtype == np.uint8
    sn.manual_seed(5)
    sn.set_rng_state(sn.tensor(state, dtype=sn.uint8))
    assert sn.initial_seed() == 1
    sn.manual_seed(1)
    C.CASES["mixed_sequence"](sn, 1)
    after = sn.randn(4).numpy()
    sn.set_rng_state(sn.tensor(state, dtype=sn.uint8))
    np.testing.assert_array_equal(sn.randn(4).numpy(), after)
    assert np.array_equal(sn.get_rng_state().numpy(), sn.get_rng_state().numpy())


def test_generator_objects_and_errors():
    g = sn.Generator()
    assert g.initial_seed() == sn.random.DEFAULT_SEED
    assert g.manual_seed(-1).initial_seed() == 2**64 - 1  # PyTorch wraps negative seeds
    fresh = g.seed()
    assert g.initial_seed() == fresh
    with pytest.raises(RuntimeError, match="5056"):
        g.set_state(sn.zeros(10, dtype=sn.uint8))
    with pytest.raises(TypeError, match="spmdnet.Generator"):
        sn.randn(3, generator=np.random.default_rng(0))
    with pytest.raises(ValueError, match="only the 'cpu' generator"):
        sn.Generator("cuda")
    default = sn.manual_seed(3)
    assert default is sn.default_generator and default.initial_seed() == 3


def test_fork_rng_leaves_the_main_stream_and_state_covers_forks():
    sn.manual_seed(4)
    expected = sn.rand(3).numpy()
    sn.manual_seed(4)
    with sn.random.fork_rng(7):
        forked = sn.rand(3).numpy()
    np.testing.assert_array_equal(sn.rand(3).numpy(), expected)
    assert not np.array_equal(forked, expected)
    state = sn.get_rng_state()
    with sn.random.fork_rng(7):
        second = sn.rand(3).numpy()
    sn.set_rng_state(state)  # this very tensor: the fork's position comes back too
    with sn.random.fork_rng(7):
        np.testing.assert_array_equal(sn.rand(3).numpy(), second)
    snap = sn.random.snapshot()
    with sn.random.fork_rng(7):
        third = sn.rand(2).numpy()
    main = sn.rand(2).numpy()
    sn.random.restore(snap)
    with sn.random.fork_rng(7):
        np.testing.assert_array_equal(sn.rand(2).numpy(), third)
    np.testing.assert_array_equal(sn.rand(2).numpy(), main)
    with pytest.raises(ValueError, match="snapshot"):
        sn.random.restore({"seed": 1})


def test_seeded_mnist_example_prints_pytorchs_losses():
    """PyTorch's MNIST example (its Net, dropout, Adadelta, StepLR, a
    shuffling DataLoader) after manual_seed(1): the same losses, step by
    step (float32 arithmetic: to 1e-5 relative)."""
    with np.load(FIXTURE.parent / "mnist.npz") as f:
        want = f["losses"]
    np.testing.assert_allclose(C.mnist_losses(sn), want, rtol=1e-5)


def test_pytorchs_data_submodules_and_their_names():
    """torch.utils.data.dataloader / .sampler / .dataset: PyTorch 2.13's
    ``__all__`` of each, importable from the same paths."""
    names = {dataloader: ["DataLoader", "get_worker_info", "default_collate",
                          "default_convert"],
             sampler: ["BatchSampler", "RandomSampler", "Sampler", "SequentialSampler",
                       "SubsetRandomSampler", "WeightedRandomSampler"],
             dataset: ["Dataset", "IterableDataset", "TensorDataset", "StackDataset",
                       "ConcatDataset", "ChainDataset", "Subset", "random_split"]}
    for module, wanted in names.items():
        assert [n for n in wanted if not hasattr(module, n)] == [], module.__name__
    assert dataloader.DataLoader is sn.utils.data.DataLoader
    stacked = dataset.StackDataset(sn.arange(3), [10, 20, 30])
    assert len(stacked) == 3 and stacked[1][1] == 20 and int(stacked[2][0]) == 2
    assert dataset.StackDataset(a=[1, 2], b="xy")[1] == {"a": 2, "b": "y"}
    with pytest.raises(ValueError, match="Size mismatch"):
        dataset.StackDataset([1], [1, 2])
