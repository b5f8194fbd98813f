"""``Generator``: PyTorch's CPU generator, a 32-bit Mersenne Twister
(MT19937) seeded with the standard ``init_genrand`` on the low 32 bits of the
64-bit seed. NumPy's ``MT19937`` bit generator produces the raw stream; the
transforms that turn it into PyTorch's samples are in ``distributions``.

PyTorch's 64-bit draws join two 32-bit draws, the first one high. Normals
drawn one at a time (fewer than 16 values) come in Box-Muller pairs and keep
the second for the next call: that cached value is part of the state, as in
``get_state()``'s 5056 bytes, which follow PyTorch's layout (seed, ``left``,
``seeded``, ``next``, the 624 words as uint64, the cached normal, the cached
float normal)."""
import os

import numpy as np

from .._tensor import Tensor
from . import compiled

DEFAULT_SEED = 67280421310721  # PyTorch's default initial seed
STATE_BYTES = 5056
_N = 624
_MAX64 = 2**64 - 1
_MASK32 = 0xFFFFFFFF
# offsets in PyTorch's state bytes
_SEED, _LEFT, _SEEDED, _NEXT, _WORDS = 0, 8, 12, 16, 24
_NORMAL_X, _NORMAL_Y, _NORMAL_RHO, _NORMAL_VALID = 5016, 5024, 5032, 5040
_FLOAT_NORMAL, _FLOAT_NORMAL_VALID = 5048, 5052


def _init_genrand(seed):
    """The 624 words of ``init_genrand(seed mod 2**32)``."""
    key = np.empty(_N, np.uint32)
    s = seed & _MASK32
    key[0] = s
    for j in range(1, _N):
        s = (1812433253 * (s ^ (s >> 30)) + j) & _MASK32
        key[j] = s
    return key


class Generator:
    """PyTorch's ``torch.Generator`` for the CPU: ``manual_seed``, ``seed``,
    ``initial_seed``, ``get_state``/``set_state`` (a 5056-byte uint8
    tensor, PyTorch's format). Pass it as ``generator=`` to the sampling
    functions and samplers."""

    def __init__(self, device="cpu"):
        if str(device) not in ("cpu", "cpu:0"):
            raise ValueError(f"Generator: only the 'cpu' generator is PyTorch's stream, got "
                             f"device={device!r} (GPU draws come from CuPy's generator)")
        self.device = "cpu"
        self._bits = np.random.MT19937()
        # NumPy's full-range uint64 integers: each MT19937 next_uint64, two
        # 32-bit draws with the first high, PyTorch's random64, in C
        self._wide = np.random.Generator(self._bits)
        self.manual_seed(DEFAULT_SEED)

    def __repr__(self):
        return f"<spmdnet.Generator initial_seed={self._seed}>"

    def manual_seed(self, seed):
        """Reseed (a negative seed wraps to its 64-bit two's complement, as
        PyTorch's); returns the generator."""
        seed = int(seed)
        if not -2**63 <= seed < 2**64:
            raise RuntimeError(f"Overflow when unpacking long: seed {seed} does not fit 64 bits")
        self._seed = seed & (2**64 - 1)
        self._set_words(_init_genrand(self._seed), _N)
        self._fresh = True  # PyTorch's ``next`` reads 0 before the first draw, 624 after
        self.next_normal = None
        self.next_float_normal = None
        return self

    def seed(self):
        """Reseed from the operating system's entropy; returns the new seed."""
        seed = int.from_bytes(os.urandom(8), "little")
        self.manual_seed(seed)
        return seed

    def initial_seed(self):
        return self._seed

    def _set_words(self, key, pos):
        self._bits.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": int(pos)}}

    # -- raw draws ---------------------------------------------------------
    def random32(self, n):
        """``n`` raw 32-bit draws (uint64 array)."""
        self._fresh = self._fresh and not n
        return self._bits.random_raw(int(n))

    def random64(self, n):
        """``n`` 64-bit draws, each from two 32-bit ones (the first high)."""
        n = int(n)
        self._fresh = self._fresh and not n
        return self._wide.integers(0, _MAX64, size=n, dtype=np.uint64, endpoint=True)

    def uniform01(self, n, dtype):
        """``n`` uniforms on [0, 1): float32 from 24 bits of one 32-bit draw,
        float64 from 53 bits of one 64-bit draw."""
        if np.dtype(dtype) == np.float64:
            return compiled.uniform_float64(self.random64(n))
        bits = self.random32(n) & np.uint64(2**24 - 1)
        return bits.astype(np.float32) * np.float32(2.0**-24)

    # -- state -------------------------------------------------------------
    def get_state(self):
        """PyTorch's 5056-byte state (a uint8 tensor)."""
        state = self._bits.state["state"]
        out = np.zeros(STATE_BYTES, np.uint8)
        pos = int(state["pos"])
        out[_SEED:_SEED + 8] = np.frombuffer(np.uint64(self._seed).tobytes(), np.uint8)
        out[_LEFT:_NEXT] = np.frombuffer(np.array([_N + 1 - pos, 1], np.int32).tobytes(), np.uint8)
        out[_NEXT:_WORDS] = np.frombuffer(np.uint64(0 if self._fresh else pos).tobytes(), np.uint8)
        words = state["key"].astype(np.uint64)
        out[_WORDS:_WORDS + 8 * _N] = np.frombuffer(words.tobytes(), np.uint8)
        if self.next_normal is not None:
            out[_NORMAL_Y:_NORMAL_Y + 8] = np.frombuffer(np.float64(self.next_normal).tobytes(),
                                                         np.uint8)
            out[_NORMAL_VALID] = 1
        if self.next_float_normal is not None:
            value = np.float32(self.next_float_normal).tobytes()
            out[_FLOAT_NORMAL:_FLOAT_NORMAL + 4] = np.frombuffer(value, np.uint8)
            out[_FLOAT_NORMAL_VALID] = 1
        return Tensor(out)

    def set_state(self, new_state):
        """Restore a state from ``get_state`` (or PyTorch's); returns the generator."""
        raw = np.asarray(new_state.array if isinstance(new_state, Tensor) else new_state)
        if raw.dtype != np.uint8 or raw.shape != (STATE_BYTES,):
            raise RuntimeError(f"set_state: expected a uint8 tensor of {STATE_BYTES} bytes "
                               f"(PyTorch's CPU generator state), got dtype {raw.dtype} and "
                               f"shape {tuple(raw.shape)}")
        raw = np.ascontiguousarray(raw)
        left = int(raw[_LEFT:_SEEDED].view(np.int32)[0])
        words = raw[_WORDS:_WORDS + 8 * _N].view(np.uint64)
        if not 1 <= left <= _N or np.any(words > _MASK32):
            raise RuntimeError(f"set_state: not an MT19937 state (left={left}, or a word "
                               f"over 32 bits)")
        self._seed = int(raw[_SEED:_SEED + 8].view(np.uint64)[0])
        self._set_words(words.astype(np.uint32), _N + 1 - left)
        self._fresh = int(raw[_NEXT:_WORDS].view(np.uint64)[0]) == 0
        valid = raw[_NORMAL_VALID] != 0
        self.next_normal = float(raw[_NORMAL_Y:_NORMAL_Y + 8].view(np.float64)[0]) \
            if valid else None
        valid = raw[_FLOAT_NORMAL_VALID] != 0
        self.next_float_normal = float(raw[_FLOAT_NORMAL:_FLOAT_NORMAL + 4].view(np.float32)[0]) \
            if valid else None
        return self

    def clone_state(self):
        """An independent copy (same stream, same cached normals)."""
        twin = Generator()
        twin.set_state(self.get_state())
        return twin


def check_generator(generator, where):
    """``generator`` itself when it is a ``Generator``; else a TypeError."""
    if not isinstance(generator, Generator):
        raise TypeError(f"{where}: generator must be a spmdnet.Generator (torch.Generator) "
                        f"or None, got {type(generator).__name__}")
    return generator
