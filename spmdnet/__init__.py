"""spmdnet: neural networks trained with plain MPI, NumPy and CuPy.

Importing spmdnet needs neither a GPU nor an MPI launch: ``dist`` imports
mpi4py only when first used. Nor does it touch the process's malloc: the
first tensor or module applies the host allocator policy (host_memory.py).
"""
from .version import __version__  # noqa: F401 - sn.__version__, as torch.__version__
from .distributed.launcher_env import set_torchrun_env as _set_torchrun_env
from .distributed.early_failure import install as _end_job_on_early_failure

from . import autograd, data, distributed, functional, nn, ops, optim, parallel
# modules that nn names without importing (a layer below them); parallel's names load on use
from .nn.parallel import distributed as _ddp  # noqa: F401 - nn.parallel.DistributedDataParallel
from .parallel import sync_batchnorm as _sync_bn  # noqa: F401 - nn.SyncBatchNorm's reductions
from .checkpoint import (check_checkpoint_dir, latest_checkpoint, load_checkpoint,
                         save_checkpoint)
from .errors import CheckpointError, DistributedError
from . import accelerator, amp, backends, cuda  # PyTorch's sub-modules of these names
from . import multiprocessing  # noqa: F401 - torch.multiprocessing.spawn on MPI ranks
from ._compile import compile  # noqa: A004,F401 - returns the model (_compile.py): not in __all__
from ._device import device, get_default_device, set_default_device
from .amp import autocast
from .serialization import load, save  # PyTorch's file format (serialization/)
from .random import get_rng_state, initial_seed, manual_seed, set_rng_state
from .random import Generator, default_generator, seed  # PyTorch's CPU stream (random/)
from ._tensor import Tensor, get_default_dtype, set_default_dtype
from .creation import (arange, as_tensor, empty, empty_like, eye, from_numpy, full, full_like,
                       is_tensor, linspace, ones, ones_like, rand, rand_like, randint, randn,
                       randn_like, randperm, tensor, zeros, zeros_like)
from .dtypes import *  # noqa: F403 - PyTorch's dtype names: sn.float32, sn.long, ... (dtypes.py)
from .ops.index import cat, chunk, concat, concatenate, narrow, split, stack, tril, triu, unbind
from .ops.shape import flatten, permute, reshape, squeeze, transpose, unflatten, unsqueeze
from .ops.compare import (eq, equal, ge, gt, isfinite, isinf, isnan, le, logical_and,
                          logical_not, logical_or, logical_xor, lt, ne)
from .ops.einsum import einsum
from .ops.linalg import bmm, matmul
from .ops.reduce import amax, amin, argmax, argmin, logsumexp, mean, norm, prod, std, var
from .ops.reduce import all, any, max, min, sum  # noqa: A004,F401 - sn.sum...: not in __all__
from .ops.select import clamp, clip, masked_fill, maximum, minimum, where
from .ops.sort import argsort, sort, topk
from .ops.unary import abs  # noqa: A004,F401 - sn.abs: not in __all__
from .ops.unary import cos, exp, log, log1p, relu, rsqrt, sigmoid, sin, sqrt, tanh
from .ops.inplace import relu_
from .ops.gather import diag, gather, index_select, repeat_interleave, scatter, scatter_add
from .ops.methods import clone
from .ops.pointwise import addmm, ceil, floor, lerp, outer, sign, square, trunc
from .ops.pointwise import round  # noqa: A004,F401 - sn.round: not in __all__
from .ops.scan import cumprod, cumsum, flip, roll
from .ops.arith import pow  # noqa: A004,F401 - sn.pow: not in __all__ (it shadows the builtin on a star import)
from .ops.sampling import multinomial
from .ops.sampling import bernoulli, normal  # PyTorch's draws (random/)
from .ops.complex import angle, conj, polar, view_as_complex, view_as_real
from .ops.complex import complex, imag, is_complex, real  # noqa: A004,F401 - not in __all__
from .autograd.grad_mode import inference_mode, is_inference_mode_enabled
from .autograd import (Function, enable_grad, is_grad_enabled, no_grad,
                       queue_callback)

ops.bind_tensor_methods()  # Tensor's operators and methods (+, @, .sum() ...): ops/__init__.py
_set_torchrun_env()  # torchrun's RANK, LOCAL_RANK, ... from mpirun/srun, no MPI
_end_job_on_early_failure()  # a rank raising before MPI starts ends the job, no MPI till then
dist = distributed  # the short name: `from spmdnet import dist`

__all__ = ["Tensor", "Function", "tensor", "as_tensor", "no_grad", "enable_grad",
           "is_grad_enabled", "queue_callback", "set_default_dtype", "get_default_dtype",
           "manual_seed", "initial_seed", "get_rng_state", "set_rng_state",
           "DistributedError", "CheckpointError", "save_checkpoint", "load_checkpoint",
           "latest_checkpoint", "check_checkpoint_dir", "functional", "nn", "optim", "dist",
           "distributed", "parallel", "data", "autograd",
           # creation (creation.py) and shape functions (ops/shape.py, ops/index.py);
           # the dtype names (dtypes.py: sn.float32, sn.long, ...) stay out of __all__,
           # as `from spmdnet import *` would shadow Python's float, int and bool
           "zeros", "ones", "full", "empty", "arange", "linspace", "eye", "rand", "randn",
           "randint", "randperm", "zeros_like", "ones_like", "full_like", "empty_like",
           "rand_like", "randn_like", "from_numpy", "is_tensor", "cat", "concat",
           "concatenate", "stack", "split", "chunk", "unbind", "narrow", "tril", "triu",
           "reshape", "transpose", "permute", "flatten", "unflatten", "squeeze", "unsqueeze",
           # math (ops/): sn.sum, max, min, abs, any, all exist too but stay out of
           # __all__ for the same reason as the dtype names
           "where", "masked_fill", "maximum", "minimum", "clamp", "clip", "matmul", "bmm",
           "einsum", "isfinite", "isnan", "isinf", "eq", "ne", "lt", "le", "gt", "ge", "equal",
           "logical_and", "logical_or", "logical_xor", "logical_not", "exp", "log", "log1p",
           "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "relu_", "mean", "var", "std",
           "prod", "amax", "amin", "argmax", "argmin", "logsumexp", "norm", "sort", "argsort",
           "topk",
           # more tensor functions (ops/gather.py, ops/scan.py, ops/pointwise.py)
           "clone", "cumsum", "cumprod", "flip", "roll", "gather", "scatter", "scatter_add",
           "index_select", "repeat_interleave", "diag", "outer", "addmm", "lerp", "square",
           "sign", "floor", "ceil", "trunc"]
__all__ += ["device", "get_default_device", "set_default_device", "cuda", "amp",
            "autocast", "backends", "accelerator", "save", "load"]
__all__ += ["Generator", "default_generator", "seed", "bernoulli", "normal"]
__all__ += ["multinomial", "polar", "view_as_real", "view_as_complex", "conj", "angle",
            "inference_mode", "is_inference_mode_enabled"]
