"""spmdnet's own random number generator (parameter init, dropout).

NumPy's global generator is never touched, so user code that seeds or draws
from ``np.random`` neither disturbs nor is disturbed by spmdnet. As in
PyTorch, the unseeded default is a fixed seed, so every rank of an SPMD job
builds the same initial model even before ``DataParallel`` broadcasts it.

The generator is ``numpy.random.Generator(PCG64(seed))``: to reproduce an
order outside spmdnet, build the same generator from the same seed.
"""
import numpy as np

DEFAULT_SEED = 67280421310721  # PyTorch's default initial seed
_state = {"seed": DEFAULT_SEED, "rng": np.random.Generator(np.random.PCG64(DEFAULT_SEED)),
          "device_rng": None}


def manual_seed(seed):
    """Reseed spmdnet's generators (host and device); returns the seed."""
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    _state["seed"] = seed
    _state["rng"] = np.random.Generator(np.random.PCG64(seed))
    _state["device_rng"] = None
    return seed


def initial_seed():
    """The seed last given to ``manual_seed`` (or the default)."""
    return _state["seed"]


def generator():
    """The host ``numpy.random.Generator`` all spmdnet sampling draws from."""
    return _state["rng"]


def generator_for(xp):
    """A generator producing arrays of module ``xp`` (numpy or cupy).

    The CuPy generator is seeded from the host one, so a seed fixes both."""
    if xp is np:
        return _state["rng"]
    if _state["device_rng"] is None:
        seed = int(_state["rng"].integers(2**63))
        _state["device_rng"] = xp.random.default_rng(seed)
    return _state["device_rng"]


def get_rng_state():
    """A picklable snapshot of the host generator (for checkpoints)."""
    return {"seed": _state["seed"], "bit_generator": _state["rng"].bit_generator.state}


def set_rng_state(state):
    """Restore a snapshot taken by ``get_rng_state``."""
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = state["bit_generator"]
    _state.update(seed=int(state["seed"]), rng=rng, device_rng=None)
