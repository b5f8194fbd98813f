"""Recurrent layers, PyTorch's arguments, gate order, parameter names and init.

``nn.RNN`` (tanh or relu), ``nn.LSTM``, ``nn.GRU`` and their one-step cells.
Parameters: ``weight_ih_l{k}`` (G·H, I), ``weight_hh_l{k}`` (G·H, H),
``bias_ih_l{k}``, ``bias_hh_l{k}`` (G·H,), ``_reverse`` for the second
direction, G = 1, 4 (i, f, g, o) or 3 (r, z, n); all initialised
U(-1/sqrt(H), 1/sqrt(H)). Each layer and direction is one input product over
the whole sequence and one recurrence op (``spmdnet.ops.rnn``).
"""
import math
import warnings

from .. import functional as F
from ..._tensor import Tensor
from ...backend import xp_of
from ...ops.index import cat, stack
from ...ops.rnn import ElmanSequence, GRUSequence, LSTMSequence
from .. import init
from .utils import _empty, _move
from .module import Module
from ..parameter import Parameter

GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _run(mode, xw, h0, c0, w_hh, b_ih, b_hh, reverse):
    """One layer and direction: (hs (T, N, H), h_n, c_n or None); xw is the
    input product with ``_input_bias`` added, a fresh array only the op reads."""
    if mode == "LSTM":  # both biases go into the op's step pass; its gates over xw
        bias = () if b_ih is None else (b_ih + b_hh,)
        out = LSTMSequence.apply(xw, h0, c0, w_hh, *bias, reverse=reverse, overwrite_xw=True)
        length = out.shape[0] - 1
        hs = out[:length]
        return hs, out[0 if reverse else length - 1], out[length]
    if mode == "GRU":
        b_hh = b_hh if b_hh is not None else Tensor(xp_of(w_hh.array).zeros(
            w_hh.shape[0], w_hh.dtype))
        hs = GRUSequence.apply(xw, h0, w_hh, b_hh, reverse=reverse)
    else:
        act = "relu" if mode == "RNN_RELU" else "tanh"
        hs = ElmanSequence.apply(xw, h0, w_hh, nonlinearity=act, reverse=reverse)
    return hs, hs[0 if reverse else hs.shape[0] - 1], None


def _input_bias(mode, b_ih, b_hh):
    """The bias added to the input product: both biases, except for GRU,
    whose b_hn must stay inside r * (W_hn h + b_hn), and LSTM, whose op adds
    them in its step pass."""
    if b_ih is None or mode == "GRU":
        return b_ih
    return None if mode == "LSTM" else b_ih + b_hh


class RNNBase(Module):
    """The stack of layers and directions shared by RNN, LSTM and GRU."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0,
                 device=None, dtype=None):
        super().__init__()
        name = type(self).__name__
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"{name}: hidden_size must be a positive int, got {hidden_size!r}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"{name}: num_layers must be a positive int, got {num_layers!r}")
        if isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise ValueError(f"{name}: dropout should be a number in range [0, 1] representing "
                             f"the probability of an element being zeroed, got {dropout!r}")
        if proj_size:
            raise NotImplementedError(f"{name}: proj_size={proj_size} (LSTM with projections) "
                                      "is not provided; use proj_size=0")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"{name}: dropout={dropout} and num_layers=1: dropout acts between "
                          "layers, so it does nothing here (as PyTorch)", stacklevel=3)
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional, self.proj_size = float(dropout), bidirectional, 0
        gates = GATES[mode] * hidden_size
        self._flat_weights_names = []
        for layer in range(num_layers):
            for suffix in self._suffixes():
                width = input_size if layer == 0 else hidden_size * self._directions()
                shapes = {"weight_ih": (gates, width), "weight_hh": (gates, hidden_size)}
                if bias:
                    shapes.update(bias_ih=(gates,), bias_hh=(gates,))
                for kind, shape in shapes.items():
                    attr = f"{kind}_l{layer}{suffix}"
                    setattr(self, attr, Parameter(_empty(shape, dtype, device)))
                    self._flat_weights_names.append(attr)
        self.reset_parameters()
        _move(self, device)

    def _directions(self):
        return 2 if self.bidirectional else 1

    def _suffixes(self):
        return ("", "_reverse") if self.bidirectional else ("",)

    def reset_parameters(self):
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            init.uniform_(weight, -bound, bound)

    def flatten_parameters(self):
        """A no-op: PyTorch's packs the weights for cuDNN; here each layer
        reads its parameters directly."""

    @property
    def all_weights(self):
        per = 4 if self.bias else 2
        names = self._flat_weights_names
        return [[getattr(self, n) for n in names[i:i + per]] for i in range(0, len(names), per)]

    def _weights(self, layer, suffix):
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        return [getattr(self, f"{n}_l{layer}{suffix}", None) for n in names]

    def _initial(self, hx, x, batched, what):
        """hx as (D·layers, N, H), checked; zeros when None."""
        name = type(self).__name__
        expected = (self.num_layers * self._directions(), x.shape[1], self.hidden_size)
        if hx is None:
            xp = xp_of(x.array)
            return Tensor(xp.zeros(expected, x.dtype))
        if not isinstance(hx, Tensor):
            raise TypeError(f"{name}: {what} must be a Tensor, got {type(hx).__name__}")
        if hx.ndim != (3 if batched else 2):
            raise RuntimeError(f"{name}: for {'batched 3-D' if batched else 'unbatched 2-D'} "
                               f"input, {what} should also be {3 if batched else 2}-D but got "
                               f"{hx.ndim}-D tensor")
        hx = hx if batched else hx.unsqueeze(1)
        if tuple(hx.shape) != expected:
            raise RuntimeError(f"{name}: Expected hidden size {expected}, got "
                               f"{list(hx.shape) if batched else [hx.shape[0], hx.shape[2]]}")
        return hx

    def _check_input(self, input):  # noqa: A002 - PyTorch's name
        name = type(self).__name__
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}: input must be a Tensor, got {type(input).__name__}")
        if input.ndim not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.ndim}D "
                             f"tensor of shape {tuple(input.shape)}")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"{name}: input.size(-1) must be equal to input_size. "
                               f"Expected {self.input_size}, got {input.shape[-1]}")

    def _stack(self, x, h0, c0):
        """Every layer and direction over time-major x (T, N, I)."""
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for direction, suffix in enumerate(self._suffixes()):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, suffix)
                k = layer * self._directions() + direction
                xw = F.linear(x, w_ih, _input_bias(self.mode, b_ih, b_hh))
                hs, h, c = _run(self.mode, xw, h0[k], None if c0 is None else c0[k], w_hh,
                                b_ih, b_hh, reverse=direction == 1)
                outs.append(hs)
                h_n.append(h)
                c_n.append(c)
            x = outs[0] if len(outs) == 1 else cat(outs, dim=-1)
            if self.dropout and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, self.training)
        return x, stack(h_n), None if c0 is None else stack(c_n)

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's name
        """(output, h_n) (LSTM: (output, (h_n, c_n))); output (T, N, D·H)
        ((N, T, D·H) when batch_first; (T, D·H) unbatched)."""
        self._check_input(input)
        batched = input.ndim == 3
        x = input if batched else input.unsqueeze(1)
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        if self.mode == "LSTM":
            if hx is not None and (not isinstance(hx, tuple) or len(hx) != 2):
                raise TypeError(f"LSTM: hx must be a tuple (h_0, c_0), got {type(hx).__name__}")
            h0, c0 = (None, None) if hx is None else hx
            h0, c0 = self._initial(h0, x, batched, "h_0"), self._initial(c0, x, batched, "c_0")
        else:
            h0, c0 = self._initial(hx, x, batched, "hx"), None
        out, h_n, c_n = self._stack(x, h0, c0)
        if not batched:
            out, h_n = out.squeeze(1), h_n.squeeze(1)
            c_n = None if c_n is None else c_n.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, (h_n if c_n is None else (h_n, c_n))

    def extra_repr(self):
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if not self.bias:
            text += ", bias=False"
        if self.batch_first:
            text += ", batch_first=True"
        if self.dropout:
            text += f", dropout={self.dropout}"
        if self.bidirectional:
            text += ", bidirectional=True"
        return text


class RNN(RNNBase):
    """Elman RNN: h_t = act(x_t W_ihᵀ + b_ih + h_{t-1} W_hhᵀ + b_hh), act
    ``nonlinearity`` ("tanh" or "relu")."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' "
                             "or 'relu'.")
        super().__init__(f"RNN_{nonlinearity.upper()}", input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, 0, device, dtype)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """Gates (i, f, g, o) = (σ, σ, tanh, σ)(x W_ihᵀ + b_ih + h W_hhᵀ + b_hh);
    c' = f c + i g, h' = o tanh(c'). ``proj_size`` > 0 is not provided."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)


class GRU(RNNBase):
    """r, z = σ(x W_i{r,z}ᵀ + b_i{r,z} + h W_h{r,z}ᵀ + b_h{r,z}),
    n = tanh(x W_inᵀ + b_in + r (h W_hnᵀ + b_hn)), h' = (1 - z) n + z h."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, 0, device, dtype)


class RNNCellBase(Module):
    """One step: ``weight_ih`` (G·H, I), ``weight_hh`` (G·H, H), ``bias_ih``,
    ``bias_hh``, initialised U(-1/sqrt(H), 1/sqrt(H)); the step runs as a
    one-step recurrence op."""

    def __init__(self, mode, input_size, hidden_size, bias, device, dtype):
        super().__init__()
        self.mode, self.input_size, self.hidden_size, self.bias = mode, input_size, \
            hidden_size, bias
        gates = GATES[mode] * hidden_size
        self.weight_ih = Parameter(_empty((gates, input_size), dtype, device))
        self.weight_hh = Parameter(_empty((gates, hidden_size), dtype, device))
        self.bias_ih = Parameter(_empty((gates,), dtype, device)) if bias else None
        self.bias_hh = Parameter(_empty((gates,), dtype, device)) if bias else None
        self.reset_parameters()
        _move(self, device)

    reset_parameters = RNNBase.reset_parameters

    def _state(self, hx, x, batched, what):
        """A state as (N, H), checked; zeros when None."""
        if hx is None:
            return Tensor(xp_of(x.array).zeros((x.shape[0], self.hidden_size), x.dtype))
        expected = (x.shape[0], self.hidden_size) if batched else (self.hidden_size,)
        if tuple(hx.shape) != expected:
            raise RuntimeError(f"{type(self).__name__}: {what} has shape {tuple(hx.shape)}, "
                               f"expected {expected}")
        return hx if batched else hx.unsqueeze(0)

    def _step(self, input, hx):  # noqa: A002 - PyTorch's name
        name = type(self).__name__
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            raise ValueError(f"{name}: Expected input of shape (N, {self.input_size}) or "
                             f"({self.input_size},), got {tuple(input.shape)}")
        batched = input.ndim == 2
        x = input if batched else input.unsqueeze(0)
        if self.mode == "LSTM":
            if hx is not None and (not isinstance(hx, tuple) or len(hx) != 2):
                raise TypeError(f"{name}: hx must be a tuple (h_0, c_0), got "
                                f"{type(hx).__name__}")
            given = (None, None) if hx is None else hx
            h0, c0 = (self._state(s, x, batched, what) for s, what in zip(given, ("h_0", "c_0")))
        else:
            h0, c0 = self._state(hx, x, batched, "hx"), None
        xw = F.linear(x.unsqueeze(0), self.weight_ih,
                      _input_bias(self.mode, self.bias_ih, self.bias_hh))
        _, h, c = _run(self.mode, xw, h0, c0, self.weight_hh, self.bias_ih, self.bias_hh,
                       reverse=False)
        if not batched:
            h, c = h.squeeze(0), (None if c is None else c.squeeze(0))
        return h if c is None else (h, c)

    def extra_repr(self):
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(RNNCellBase):
    """h' = act(x W_ihᵀ + b_ih + h W_hhᵀ + b_hh), act tanh or relu."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None,
                 dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: Unknown nonlinearity: {nonlinearity}")
        super().__init__(f"RNN_{nonlinearity.upper()}", input_size, hidden_size, bias, device,
                         dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's name
        return self._step(input, hx)


class LSTMCell(RNNCellBase):
    """(h', c') from (x, (h, c)), LSTM's gate equations."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, bias, device, dtype)

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's name
        return self._step(input, hx)


class GRUCell(RNNCellBase):
    """h' from (x, h), GRU's gate equations."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, bias, device, dtype)

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's name
        return self._step(input, hx)
