"""spmdnet: neural networks trained with plain MPI, NumPy and CuPy.

Importing spmdnet needs neither a GPU nor an MPI launch: ``dist`` imports
mpi4py only when first used.
"""
__version__ = "0.1.0"  # before the imports: checkpoint.py reads it while this file runs

from . import autograd, data, distributed, functional, nn, optim, parallel
from .checkpoint import (check_checkpoint_dir, latest_checkpoint, load_checkpoint,
                         save_checkpoint)
from .errors import CheckpointError, DistributedError
from .ops import REGISTRY as _OPS  # noqa: F401 - binds the Tensor operators
from .random import get_rng_state, initial_seed, manual_seed, set_rng_state
from ._tensor import Tensor, as_tensor, get_default_dtype, set_default_dtype, tensor
from .autograd import (Function, enable_grad, is_grad_enabled, no_grad,
                       queue_callback)

dist = distributed  # the short name: `from spmdnet import dist`

__all__ = ["Tensor", "Function", "tensor", "as_tensor", "no_grad", "enable_grad",
           "is_grad_enabled", "queue_callback", "set_default_dtype", "get_default_dtype",
           "manual_seed", "initial_seed", "get_rng_state", "set_rng_state",
           "DistributedError", "CheckpointError", "save_checkpoint", "load_checkpoint",
           "latest_checkpoint", "check_checkpoint_dir", "functional", "nn", "optim", "dist",
           "distributed", "parallel", "data", "autograd"]
