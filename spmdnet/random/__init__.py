"""spmdnet's random streams: PyTorch's CPU generator (``engine.Generator``,
MT19937) and its sampling transforms (``distributions``), so that after the
same ``manual_seed`` spmdnet draws exactly what PyTorch draws.

NumPy's global generator is never touched, so user code that seeds or draws
from ``np.random`` neither disturbs nor is disturbed by spmdnet. As in
PyTorch, the unseeded default is a fixed seed, so every rank of an SPMD job
builds the same initial model even before ``DataParallel`` broadcasts it.
Arrays on a GPU are drawn by CuPy's generator, seeded from the host stream
(PyTorch's CUDA streams are not reproduced).

``fork_rng(key)`` runs a block on a second, persistent stream derived from
(initial seed, key): tensor parallelism draws its dropout masks inside
``fork_rng(tp_rank)`` so TP ranks differ there, while the main stream, which
the block leaves untouched, stays identical on every rank.

``get_rng_state`` returns PyTorch's 5056-byte state of the main stream; the
forked streams' positions travel with that very tensor object (restoring it
in the same process restores them too). ``snapshot``/``restore`` give the
whole state as JSON-able data, for checkpoints.
"""
import base64
import contextlib
import weakref

import numpy as np

from .engine import DEFAULT_SEED, STATE_BYTES, Generator, check_generator

FORK_TAG = 0x5E4D  # spawn-key prefix: forked streams never collide with user ones
default_generator = Generator()
_state = {"rng": default_generator, "device_rng": None, "forks": {}}
# id(get_rng_state tensor) -> (a weak reference to it, its fork snapshot); by
# id, as a Tensor's == is elementwise
_forks_of_state = {}


def manual_seed(seed):
    """Reseed spmdnet's generators (host and device); returns the default
    generator, as PyTorch's ``manual_seed``."""
    default_generator.manual_seed(seed)
    _state.update(rng=default_generator, device_rng=None, forks={})
    return default_generator


def seed():
    """Reseed from the operating system's entropy; returns the seed."""
    value = default_generator.seed()
    _state.update(rng=default_generator, device_rng=None, forks={})
    return value


def initial_seed():
    """The seed last given to ``manual_seed`` (or the default)."""
    return default_generator.initial_seed()


def generator():
    """The ``Generator`` spmdnet's host sampling draws from now (the default
    one, or a forked stream inside ``fork_rng``)."""
    return _state["rng"]


def resolve(generator, where):
    """``generator`` checked, or the current stream when None."""
    return _state["rng"] if generator is None else check_generator(generator, where)


def generator_for(xp):
    """For NumPy arrays, the current ``Generator``; for CuPy ones, a CuPy
    generator seeded from it (so a seed fixes both)."""
    if xp is np:
        return _state["rng"]
    if _state["device_rng"] is None:
        seed_value = int(_state["rng"].random64(1)[0] >> np.uint64(1))
        _state["device_rng"] = xp.random.default_rng(seed_value)
    return _state["device_rng"]


def _fork_key(key):
    key = (key,) if isinstance(key, int) else tuple(key)
    if not key or any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in key):
        raise ValueError(f"fork_rng: key must be a non-negative int or a tuple of them, "
                         f"got {key!r}")
    return key


def _fork_seed(key):
    seq = np.random.SeedSequence(default_generator.initial_seed(),
                                 spawn_key=(FORK_TAG,) + key)
    return int(seq.generate_state(1, np.uint64)[0])


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
        forks[key] = {"rng": Generator().manual_seed(_fork_seed(key)), "device_rng": None}
    fork = forks[key]
    saved = _state["rng"], _state["device_rng"]
    _state["rng"], _state["device_rng"] = fork["rng"], fork["device_rng"]
    try:
        yield fork["rng"]
    finally:
        if _state["forks"] is forks:  # else manual_seed/set_rng_state ran inside: it wins
            fork["device_rng"] = _state["device_rng"]  # created lazily inside, keep it
            _state["rng"], _state["device_rng"] = saved


def _fork_snapshot():
    return [[list(key), fork["rng"].get_state().array.tolist()]
            for key, fork in _state["forks"].items()]


def _restore_forks(forks):
    _state["forks"] = {tuple(key): {"rng": Generator().set_state(np.asarray(bytes_, np.uint8)),
                                    "device_rng": None}
                       for key, bytes_ in forks}


def get_rng_state():
    """PyTorch's state of the default generator: a uint8 tensor of 5056 bytes
    (``torch.get_rng_state``)."""
    state = default_generator.get_state()
    _forks_of_state[id(state)] = (weakref.ref(state), _fork_snapshot())
    weakref.finalize(state, _forks_of_state.pop, id(state), None)
    return state


def set_rng_state(new_state):
    """Restore a state from ``get_rng_state`` (or PyTorch's). The forked
    streams come back too when ``new_state`` is the tensor ``get_rng_state``
    returned in this process; otherwise they restart from the seed."""
    default_generator.set_state(new_state)
    _state.update(rng=default_generator, device_rng=None)
    ref, forks = _forks_of_state.get(id(new_state), (None, []))
    _restore_forks(forks if ref is not None and ref() is new_state else [])


def snapshot():
    """The whole state (main stream and every forked stream) as JSON-able
    data, for checkpoints."""
    # base64 of PyTorch's 5056 state bytes: a JSON list of them would be ~3x larger in
    # every checkpoint (one state per rank)
    raw = default_generator.get_state().array.tobytes()
    return {"torch_state": base64.b64encode(raw).decode("ascii"), "forks": _fork_snapshot()}


def restore(state):
    """Restore a ``snapshot``."""
    if not isinstance(state, dict) or "torch_state" not in state:
        raise ValueError(f"restore: not a spmdnet.random snapshot (a checkpoint written "
                         f"before spmdnet drew PyTorch's streams?): keys "
                         f"{sorted(state) if isinstance(state, dict) else type(state).__name__}")
    saved = state["torch_state"]
    raw = (np.frombuffer(base64.b64decode(saved), np.uint8) if isinstance(saved, str)
           else np.asarray(saved, np.uint8))
    default_generator.set_state(raw)
    _state.update(rng=default_generator, device_rng=None)
    _restore_forks(state.get("forks", []))


__all__ = ["DEFAULT_SEED", "STATE_BYTES", "Generator", "default_generator", "manual_seed", "seed",
           "initial_seed", "generator", "generator_for", "fork_rng", "get_rng_state",
           "set_rng_state", "snapshot", "restore"]
