"""The host allocator policy: keep freed array memory for the next step.

A training step allocates and frees the same large arrays (activations,
gradients) every step. glibc's malloc serves blocks above its mmap threshold
(128 KiB at first, raised adaptively only as such blocks are freed) with
fresh ``mmap`` pages and returns them on ``free``, so each step touches
megabytes of new pages: about 4,500 page faults per step of the minGPT
benchmark, a quarter of its time (benchmarks/gpt_step.py). Raising the mmap
threshold to glibc's maximum (32 MiB) and the heap trim threshold keeps that
memory in the process heap, reused without faults, as PyTorch's users get
from jemalloc or tcmalloc. Arrays above 32 MiB still use mmap.

The policy changes the whole process, so ``import spmdnet`` does not apply
it: the first Tensor (``_tensor.py``) or Module (``nn/modules/module.py``) the
process makes does, through ``retain_freed_memory()``, which acts once.
``SPMDNET_HOST_ALLOCATOR=system`` leaves malloc as it was; other C libraries
than glibc are left alone.
"""
import ctypes
import ctypes.util
import platform

from . import config

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 512 * 2**20  # free memory the heap top keeps before returning it

_applied = []


def retain_freed_memory():
    """Apply the policy once (glibc only); True when malloc took it."""
    if _applied:
        return _applied[0]
    ok = False
    if config.get_choice("SPMDNET_HOST_ALLOCATOR", ("retain", "system"), "retain") == "retain" \
            and platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
                bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        except (OSError, AttributeError):
            ok = False
    _applied.append(ok)
    return ok
