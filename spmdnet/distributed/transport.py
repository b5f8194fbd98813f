"""How GPU buffers reach MPI: directly (CUDA-aware MPI) or staged through
pinned host memory. Probed once, never assumed: handing a device pointer to
an MPI that is not CUDA-aware crashes ("invalid permissions").
"""
import ctypes

from .. import config
from ._mpi import mpi
from .runtime import get_logger, world

_decision = {}


def _query(symbol, *args):
    """Call an MPI extension function by name in the loaded MPI library."""
    try:
        fn = getattr(ctypes.CDLL(None), symbol)  # the process's global symbol table
    except AttributeError:
        fn = getattr(ctypes.CDLL(mpi().__file__), symbol, None)
        if fn is None:
            return None
    return fn(*args)


def probe_cuda_aware():
    """(aware, how) for this MPI library, honouring SPMDNET_CUDA_AWARE."""
    forced = config.get("SPMDNET_CUDA_AWARE", "auto").lower()
    if forced in ("0", "1"):
        return forced == "1", f"SPMDNET_CUDA_AWARE={forced}"
    version = mpi().Get_library_version()
    try:
        if "Open MPI" in version:
            ok = _query("MPIX_Query_cuda_support")
            return bool(ok), "Open MPI MPIX_Query_cuda_support()"
        if "MPICH" in version:
            flag = ctypes.c_int(0)
            ret = _query("MPIX_GPU_query_support", ctypes.c_int(0), ctypes.byref(flag))
            if ret is not None:
                return bool(flag.value), "MPICH MPIX_GPU_query_support(CUDA)"
    except OSError as exc:
        return False, f"probe failed ({exc})"
    return False, "no CUDA-awareness query in this MPI library"


def cuda_aware():
    """Whether GPU buffers go to MPI directly; rank 0 logs the choice once."""
    if "aware" not in _decision:
        aware, how = probe_cuda_aware()
        _decision["aware"] = aware
        if world().rank == 0:
            mode = "CUDA-aware MPI (device buffers)" if aware else \
                "host staging through pinned buffers (MPI is not CUDA-aware)"
            get_logger().warning("GPU collectives use %s; decided by %s", mode, how)
    return _decision["aware"]
