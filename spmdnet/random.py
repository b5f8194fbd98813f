"""spmdnet's own random number generator (parameter init, dropout).

NumPy's global generator is never touched, so user code that seeds or draws
from ``np.random`` neither disturbs nor is disturbed by spmdnet. As in
PyTorch, the unseeded default is a fixed seed, so every rank of an SPMD job
builds the same initial model even before ``DataParallel`` broadcasts it.

The generator is ``numpy.random.Generator(PCG64(seed))``: to reproduce an
order outside spmdnet, build the same generator from the same seed.

``fork_rng(key)`` runs a block on a second, persistent stream derived from
(initial seed, key): tensor parallelism draws its dropout masks inside
``fork_rng(tp_rank)`` so TP ranks differ there, while the main stream, which
the block leaves untouched, stays identical on every rank.
"""
import contextlib

import numpy as np

DEFAULT_SEED = 67280421310721  # PyTorch's default initial seed
FORK_TAG = 0x5E4D  # spawn-key prefix: forked streams never collide with user ones
_state = {"seed": DEFAULT_SEED, "rng": np.random.Generator(np.random.PCG64(DEFAULT_SEED)),
          "device_rng": None, "forks": {}}


def manual_seed(seed):
    """Reseed spmdnet's generators (host and device); returns the seed."""
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    _state["seed"] = seed
    _state["rng"] = np.random.Generator(np.random.PCG64(seed))
    _state["device_rng"] = None
    _state["forks"] = {}
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


def _fork_key(key):
    key = (key,) if isinstance(key, int) else tuple(key)
    if not key or any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in key):
        raise ValueError(f"fork_rng: key must be a non-negative int or a tuple of them, "
                         f"got {key!r}")
    return key


@contextlib.contextmanager
def fork_rng(key):
    """Draw from the forked stream ``key`` inside the block.

    The stream is seeded from ``(initial_seed(), key)`` on first use and
    continues where it stopped on the next entry; ``manual_seed`` resets
    it. The main stream neither advances nor changes inside the block.
    Nesting forks is allowed (the inner one wins until it exits); a reseed
    inside the block (``manual_seed``, ``set_rng_state``) outlives it."""
    key = _fork_key(key)
    forks = _state["forks"]
    if key not in forks:
        seq = np.random.SeedSequence(_state["seed"], spawn_key=(FORK_TAG,) + key)
        forks[key] = {"rng": np.random.Generator(np.random.PCG64(seq)), "device_rng": None}
    fork = forks[key]
    saved = _state["rng"], _state["device_rng"]
    _state["rng"], _state["device_rng"] = fork["rng"], fork["device_rng"]
    try:
        yield fork["rng"]
    finally:
        if _state["forks"] is forks:  # else manual_seed/set_rng_state ran inside: it wins
            fork["device_rng"] = _state["device_rng"]  # created lazily inside, keep it
            _state["rng"], _state["device_rng"] = saved


def get_rng_state():
    """A picklable snapshot of the host generator and of every forked stream
    (for checkpoints)."""
    forks = [[list(key), fork["rng"].bit_generator.state]
             for key, fork in _state["forks"].items()]
    return {"seed": _state["seed"], "bit_generator": _state["rng"].bit_generator.state,
            "forks": forks}


def _generator(bit_state):
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = bit_state
    return rng


def set_rng_state(state):
    """Restore a snapshot taken by ``get_rng_state`` (one without "forks",
    from before forking existed, restores no forked stream)."""
    forks = {tuple(key): {"rng": _generator(bits), "device_rng": None}
             for key, bits in state.get("forks", ())}
    _state.update(seed=int(state["seed"]), rng=_generator(state["bit_generator"]),
                  device_rng=None, forks=forks)
