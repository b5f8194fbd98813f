"""``BackwardHook`` (PyTorch's ``torch.utils.hooks.BackwardHook``; that path
names it): it gives a module's full backward hooks their ``grad_input`` and
``grad_output``.

It wraps the module's tensor inputs and its tensor outputs in one identity
operation each (``_Gate``): the engine runs a node's backward once every
gradient of its output is known, so the gate over the outputs sees the whole
``grad_output`` (backward pre-hooks run there and may replace it) and the
gate over the inputs sees the whole ``grad_input`` (backward hooks run there
and may replace it). Several tensors share one gate by being packed into one
flat array whose pieces are views (``_Piece``), so one backward call sees
all their gradients.
"""
import warnings

from ..._tensor import Tensor, _as_array
from ...autograd.function import Function
from ...autograd.grad_mode import is_grad_enabled
from ...backend import xp_of


class _Gate(Function):
    """Identity over one or more tensors; backward hands their gradients,
    as a tuple, to ``on_grads``, which may return replacements. One tensor
    passes through uncopied; several are packed into one flat array."""

    def forward(self, *arrays, on_grads):
        self.on_grads, self.reached = on_grads, set()  # pieces whose gradient arrived
        self.shapes, self.dtypes = [a.shape for a in arrays], [a.dtype for a in arrays]
        if len(arrays) == 1:
            return arrays[0]
        xp = xp_of(arrays[0])
        return xp.concatenate([a.reshape(-1) for a in arrays])  # mixed dtypes: the widest

    def backward(self, grad):
        if len(self.shapes) == 1:
            grads = (grad,)
        else:
            sizes, offsets = [_size(s) for s in self.shapes], [0]
            for n in sizes:
                offsets.append(offsets[-1] + n)
            grads = tuple(grad[o:o + n].reshape(s).astype(d, copy=False)
                          if k in self.reached else None  # an unused tensor: None, as PyTorch
                          for k, (o, n, s, d) in enumerate(zip(offsets, sizes, self.shapes,
                                                               self.dtypes)))
            self.reached.clear()
        new = self.on_grads(grads)
        return tuple(None if g is None else _as_array(g) for g in new)


class _Piece(Function):
    """Tensor ``index`` of a packed ``_Gate`` output: a view of it."""

    def forward(self, packed, *, gate, index, offset, shape, dtype):
        self.gate, self.index, self.offset, self.size = gate, index, offset, _size(shape)
        return packed[offset:offset + self.size].reshape(shape).astype(dtype, copy=False)

    def backward(self, grad):
        xp = xp_of(grad)
        full = xp.zeros(self.parents[0].shape, grad.dtype)
        self.backward_add(full, grad)
        return full

    def backward_add(self, acc, grad):
        self.gate.reached.add(self.index)
        acc[self.offset:self.offset + self.size] += grad.reshape(-1)


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _gate(tensors, on_grads):
    """The tensors, each replaced by its view through one shared ``_Gate``."""
    packed = _Gate.apply(*tensors, on_grads=on_grads)
    if len(tensors) == 1:
        return [packed]
    out, offset = [], 0
    for index, t in enumerate(tensors):
        out.append(_Piece.apply(packed, gate=packed._ctx, index=index, offset=offset,
                                shape=t.shape, dtype=t.array.dtype))
        offset += _size(t.shape)
    return out


class BackwardHook:
    """One module call's full backward hooks (``module, grad_input,
    grad_output``) and backward pre-hooks (``module, grad_output``), with
    PyTorch's rules: ``grad_input`` has one entry per positional argument
    (None for non-tensors and tensors that need no gradient), ``grad_output``
    one per output (the output, or each item of an output tuple); a hook's
    non-None return value replaces them and must have the same length."""

    __module__ = "spmdnet.utils.hooks"  # PyTorch's torch.utils.hooks: the public path

    def __init__(self, module, user_hooks, user_pre_hooks):
        self.module, self.user_hooks, self.user_pre_hooks = module, user_hooks, user_pre_hooks
        self.grad_outputs = None
        self.n_inputs = 0
        self.input_index = None

    def setup_input_hook(self, args):
        self.n_inputs = len(args)
        index = [i for i, a in enumerate(args) if isinstance(a, Tensor) and a.requires_grad]
        if not index or not is_grad_enabled():
            return args
        self.input_index = index
        # as PyTorch: a tensor argument that needs no gradient gets zeros in grad_input
        self.input_zeros = [(i, a) for i, a in enumerate(args)
                            if isinstance(a, Tensor) and not a.requires_grad]
        new = list(args)
        for i, t in zip(index, _gate([args[i] for i in index], self._input_grads)):
            new[i] = t
        return tuple(new)

    def setup_output_hook(self, result):
        is_tuple = isinstance(result, tuple)
        outs = result if is_tuple else (result,)
        index = [i for i, o in enumerate(outs) if isinstance(o, Tensor) and o.requires_grad]
        if not index or not is_grad_enabled():
            return result
        self.n_outputs, self.output_index = len(outs), index
        new = list(outs)
        for i, t in zip(index, _gate([outs[i] for i in index], self._output_grads)):
            new[i] = t
        return tuple(new) if is_tuple else new[0]

    @staticmethod
    def _spread(index, values, n):
        out = [None] * n
        for i, v in zip(index, values):
            out[i] = None if v is None else Tensor(v)
        return tuple(out)

    def _output_grads(self, grads):
        grad_outputs = self._spread(self.output_index, grads, self.n_outputs)
        for hook in self.user_pre_hooks:
            new = hook(self.module, grad_outputs)
            if new is None:
                continue
            new = new if isinstance(new, tuple) else (new,)
            if len(new) != len(grad_outputs):
                raise RuntimeError(f"Backward pre hook returned an invalid number of "
                                   f"grad_output, got {len(new)}, but expected "
                                   f"{len(grad_outputs)}")
            grad_outputs = new
        if self.input_index is None:  # no input needs a gradient: the hooks run now
            if self.user_hooks:
                warnings.warn("Full backward hook is firing when gradients are computed with "
                              "respect to module outputs since no inputs require gradients.",
                              stacklevel=2)
            grad_inputs = (None,) * self.n_inputs
            for hook in self.user_hooks:
                res = hook(self.module, grad_inputs, grad_outputs)
                if res is not None and not (isinstance(res, tuple)
                                            and all(r is None for r in res)):
                    raise RuntimeError("Backward hook for Modules where no input requires "
                                       "gradient should always return None or None for all "
                                       "gradients.")
        else:
            self.grad_outputs = grad_outputs
        return tuple(grad_outputs[i] for i in self.output_index)

    def _input_grads(self, grads):
        grad_inputs = list(self._spread(self.input_index, grads, self.n_inputs))
        for i, a in self.input_zeros:
            grad_inputs[i] = Tensor(xp_of(a.array).zeros(a.shape, a.array.dtype))
        grad_inputs = tuple(grad_inputs)
        if self.grad_outputs is None:
            # the gradient reached the inputs without passing through the outputs
            warnings.warn(f"full backward hook of {type(self.module).__name__} not called: "
                          "the gradient did not pass through the module's output",
                          stacklevel=2)
            return grads
        for hook in self.user_hooks:
            new = hook(self.module, grad_inputs, self.grad_outputs)
            if new is None:
                continue
            new = new if isinstance(new, tuple) else (new,)
            if len(new) != len(grad_inputs):
                raise RuntimeError(f"Backward hook returned an invalid number of grad_input, "
                                   f"got {len(new)}, but expected {len(grad_inputs)}")
            grad_inputs = new
        self.grad_outputs = None
        return tuple(grad_inputs[i] for i in self.input_index)
