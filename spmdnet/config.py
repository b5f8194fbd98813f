"""Every SPMDNET_* environment knob, read in one place.

Read at call time (not import time) so tests and launchers can set them late;
``check_environment()`` (run when this module is first imported, by any
``import spmdnet``) validates every knob that
is set up front, so a bad value fails at once, naming the variable, the value
and what is accepted, on serial runs too, never halfway through a job.
"""
import math
import os
import warnings

KNOBS = {
    "SPMDNET_DEVICE": "cpu | gpu | auto (default auto: gpu when CuPy sees one)",
    "SPMDNET_KERNELS": "numba | xp (default numba when Numba imports): "
                       "whether ops take the Numba kernels on NumPy arrays; read once, "
                       "at the first op (kernels.use() changes it for a block)",
    "SPMDNET_KERNEL_CACHE": "1 | 0 (default 1): keep compiled kernels on disk between runs "
                            "(kernels.warmup(comm=...) compiles in rank order)",
    "SPMDNET_CACHE_DIR": "spmdnet's per-user cache directory (default "
                         "$XDG_CACHE_HOME/spmdnet, else ~/.cache/spmdnet); compiled "
                         "kernels go to its kernels-<sources hash>/",
    "SPMDNET_ABORT_ON_ERROR": "1 | 0 (default 1: an uncaught exception aborts "
                              "the whole MPI job)",
    "SPMDNET_CUDA_AWARE": "1 | 0 | auto (default auto: probe the MPI library)",
    "SPMDNET_LOG_LEVEL": "DEBUG | INFO | WARNING | ERROR (default WARNING)",
    "SPMDNET_DEBUG_COLLECTIVES": "1 | 0 (default 0): ranks compare every collective "
                                 "(op, shape, dtype, sequence) before calling it",
    "SPMDNET_WATCHDOG_S": "seconds a collective may wait before every waiting rank "
                          "reports it (default 300; 0 turns the watchdog off)",
    "SPMDNET_WATCHDOG_ABORT_S": "seconds after which a stalled job is aborted (default "
                                "2 x SPMDNET_WATCHDOG_S = 600, PyTorch's collective "
                                "timeout; 0: report, never abort)",
    "SPMDNET_HOST_ALLOCATOR": "retain | system (default retain): keep freed array memory "
                              "in the heap for the next step (glibc mallopt at the first "
                              "tensor or module; spmdnet/host_memory.py), or leave malloc "
                              "as it is",
    "SPMDNET_EXIT_TIMEOUT_S": "seconds a rank that left the program waits for the others "
                              "to leave too before aborting the job (default 30; 0: no wait)",
    "SPMDNET_LOAD_MAX_BYTES": "bytes one spmdnet.load may read into memory, counted from the "
                              "sizes its records declare before any is read (default: the "
                              "machine's physical memory; load(..., max_bytes=N) per call)",
}


def get(name, default=None):
    """The raw value of a knob, or ``default``; unknown names are a bug."""
    assert name in KNOBS, f"unknown spmdnet knob {name}"
    value = os.environ.get(name)
    return default if value in (None, "") else value


def get_bool(name, default):
    """A 0/1 knob; anything else raises with the accepted values."""
    value = get(name)
    if value is None:
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r}: expected 1 or 0")


def get_choice(name, choices, default):
    """A knob restricted to ``choices``; anything else raises listing them."""
    value = get(name, default).lower()
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {sorted(choices)}")
    return value


def get_seconds(name, default):
    """A non-negative number of seconds (0: off); anything else raises
    ValueError naming the variable, the value and the range."""
    value = get(name)
    return default if value is None else _seconds(name, value)


def _seconds(name, value):
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name}={value!r}: expected a number of seconds >= 0 "
                         "(0 turns it off)")
    return number


def get_bytes(name, default):
    """A whole number of bytes >= 0; anything else raises ValueError naming
    the variable and the value."""
    value = get(name)
    return default if value is None else _bytes(name, value)


def _bytes(name, value):
    if not value.strip().isdigit():
        raise ValueError(f"{name}={value!r}: expected a whole number of bytes >= 0")
    return int(value)


_BOOL = ("1", "0", "true", "false", "yes", "no", "on", "off")
# How each knob is checked up front: accepted values (lower case), "seconds",
# "bytes", or None (free text, such as a path).
CHECKS = {
    "SPMDNET_DEVICE": ("auto", "cpu", "gpu"),
    "SPMDNET_KERNELS": ("numba", "xp"),
    "SPMDNET_KERNEL_CACHE": _BOOL,
    "SPMDNET_CACHE_DIR": None,
    "SPMDNET_ABORT_ON_ERROR": _BOOL,
    "SPMDNET_CUDA_AWARE": ("1", "0", "auto"),
    "SPMDNET_LOG_LEVEL": ("debug", "info", "warning", "error"),
    "SPMDNET_DEBUG_COLLECTIVES": _BOOL,
    "SPMDNET_WATCHDOG_S": "seconds",
    "SPMDNET_WATCHDOG_ABORT_S": "seconds",
    "SPMDNET_EXIT_TIMEOUT_S": "seconds",
    "SPMDNET_HOST_ALLOCATOR": ("retain", "system"),
    "SPMDNET_LOAD_MAX_BYTES": "bytes",
}
assert set(CHECKS) == set(KNOBS), "every knob needs a check"


def check_environment(environ=None):
    """Validate every SPMDNET_* variable that is set: ValueError naming the
    variable, the value and the accepted values; a warning for an unknown
    SPMDNET_* name (a typo would otherwise be ignored silently)."""
    environ = os.environ if environ is None else environ
    for name, value in environ.items():
        if not name.startswith("SPMDNET_") or value == "":
            continue
        if name not in CHECKS:
            warnings.warn(f"{name} is not an spmdnet knob (known: {', '.join(sorted(KNOBS))})",
                          stacklevel=2)
        elif CHECKS[name] == "seconds":
            _seconds(name, value)
        elif CHECKS[name] == "bytes":
            _bytes(name, value)
        elif CHECKS[name] is not None and value.lower() not in CHECKS[name]:
            raise ValueError(f"{name}={value!r}: expected one of {', '.join(CHECKS[name])}")


check_environment()  # a bad SPMDNET_* value fails at import, naming it, never mid-job
