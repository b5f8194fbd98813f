"""einsum(equation, *operands), differentiable: the gradient of each operand
is one more einsum of the output gradient with the other operands."""
from ..autograd import Function
from ..backend import xp_of
from ._util import unbroadcast
from .linalg import _tensor, check_dtypes

_ELL = "#"  # one token for "..." while parsing


def parse(equation, count):
    """(input subscripts, output subscripts) with "..." as one ``#`` each;
    the implicit output is the once-used letters in order, after "..."."""
    eq = equation.replace(" ", "").replace("...", _ELL)
    lhs, arrow, out = eq.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != count:
        raise ValueError(f"einsum: {equation!r} names {len(inputs)} operands, got {count}")
    if not arrow:
        letters = "".join(inputs).replace(_ELL, "")
        out = (_ELL if _ELL in lhs else "") + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1))
    return inputs, out


def _grad_of(i, inputs, output, arrays, g):
    """d(sum(einsum * g))/d(operand i)."""
    sub, shape = inputs[i], arrays[i].shape
    if len(set(sub)) != len(sub):
        raise NotImplementedError(f"einsum: no gradient for a repeated subscript within "
                                  f"one operand ({sub.replace(_ELL, '...')!r})")
    others = [s for j, s in enumerate(inputs) if j != i]
    present = set(output).union(*others)
    if _ELL in sub and _ELL not in present:
        raise NotImplementedError("einsum: no gradient for '...' summed away")
    kept = "".join(c for c in sub if c in present)
    eq = ",".join([output] + others) + "->" + kept
    xp = xp_of(g)
    r = xp.einsum(eq.replace(_ELL, "..."), g, *[a for j, a in enumerate(arrays) if j != i])
    ell = r.ndim - len(kept) + 1 if _ELL in kept else 0  # "..." dims in r
    own_ell = len(shape) - len(sub) + 1 if _ELL in sub else 0
    pos, target = 0, []
    for c in sub:  # r's layout, then the dims summed only in this operand
        if c == _ELL:
            r = r.sum(axis=tuple(range(pos, pos + ell - own_ell))) if ell > own_ell else r
            target += list(r.shape[pos:pos + own_ell])
            pos += own_ell
        elif c in kept:
            target.append(r.shape[pos])
            pos += 1
        else:
            r = xp.expand_dims(r, pos)
            target.append(shape[len(target)])
            pos += 1
    return unbroadcast(xp.broadcast_to(r, target), shape)


class Einsum(Function):
    def forward(self, *arrays, equation):
        self.inputs, self.output = parse(equation, len(arrays))
        self.arrays = arrays
        return xp_of(*arrays).einsum(equation, *arrays)

    def backward(self, g):
        return tuple(_grad_of(i, self.inputs, self.output, self.arrays, g) if need else None
                     for i, need in enumerate(self.needs_input_grad))


def einsum(equation, *operands):
    """Einstein summation as PyTorch's ``torch.einsum`` (operands also as one list)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = operands[0]
    tensors = [_tensor(x) for x in operands]
    for t in tensors[1:]:
        check_dtypes("einsum", tensors[0].array, t.array, ("operand 0", "every operand"))
    return Einsum.apply(*tensors, equation=equation)
