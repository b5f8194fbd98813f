"""Transformer layers, PyTorch's arguments, submodule names and mask rules.

``TransformerEncoderLayer``: ``self_attn`` (MultiheadAttention), ``linear1``,
``dropout``, ``linear2``, ``norm1``, ``norm2``, ``dropout1``, ``dropout2``;
``TransformerDecoderLayer`` adds ``multihead_attn``, ``norm3``, ``dropout3``;
``TransformerEncoder``/``TransformerDecoder`` hold ``layers`` (deep copies)
and an optional ``norm``; ``Transformer`` holds ``encoder`` and ``decoder``
with a final LayerNorm each. State dicts load with PyTorch's keys.

Masks follow nn.MultiheadAttention: a boolean mask's True means "masked out",
a float mask is added to the scores; key-padding masks are (N, S).
``is_causal`` is a hint that the given mask is causal (as PyTorch, the mask
must be given). PyTorch's nested-tensor fast path (eval mode with
``src_key_padding_mask``: padded outputs become 0) is not taken: padded
positions hold computed values in every mode.
"""
import copy
from types import FunctionType

from .. import functional as F
from ..._tensor import Tensor, get_default_dtype
from ...backend import xp_of
from ...creation import full
from .. import init
from .activation import MultiheadAttention
from .container import ModuleList
from .dropout import Dropout
from .linear import Linear
from .normalization import LayerNorm
from .utils import _move
from .module import Module

# activations by name; the fused linear layer runs these two in the product's pass
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}
FUSED = {F.relu: "relu", F.gelu: "gelu"}


def _activation(activation):
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise RuntimeError(f"activation should be relu/gelu, not {activation}")
        return ACTIVATIONS[activation]
    if not callable(activation):
        raise TypeError(f"activation must be 'relu', 'gelu' or a callable, got "
                        f"{type(activation).__name__}")
    return activation


def generate_square_subsequent_mask(sz, device=None, dtype=None):
    """(sz, sz) float mask: -inf above the diagonal (future positions), 0 elsewhere."""
    mask = full((sz, sz), float("-inf"), dtype=dtype or get_default_dtype(), device=device)
    return Tensor(xp_of(mask.array).triu(mask.array, k=1))


class _TransformerLayer(Module):
    """What the encoder and decoder layers share: their submodules (built in
    PyTorch's order, which fixes the parameters' initialisation and the
    state_dict's order), the self-attention block and the position-wise
    feed-forward linear2(dropout(act(linear1(x)))) (each layer applies its
    own dropout after it). The decoder layer adds attention to the memory."""

    _cross_attention = False

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        super().__init__()

        def attention():
            return MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                      batch_first=batch_first, dtype=dtype)

        self.self_attn = attention()
        if self._cross_attention:
            self.multihead_attn = attention()
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        sublayers = 3 if self._cross_attention else 2  # one norm and one dropout each
        for i in range(1, sublayers + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias,
                                                dtype=dtype))
        for i in range(1, sublayers + 1):
            setattr(self, f"dropout{i}", Dropout(dropout))
        self.activation = _activation(activation)
        _move(self, device)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _feed_forward(self, x):
        fused = FUSED.get(self.activation) if isinstance(self.activation, FunctionType) else None
        if fused is not None:  # one pass of bias and activation over the product
            h = F.linear(x, self.linear1.weight, self.linear1.bias, activation=fused)
        else:
            h = self.activation(self.linear1(x))
        return self.linear2(self.dropout(h))


class TransformerEncoderLayer(_TransformerLayer):
    """Self-attention and feed-forward, each with a residual and a LayerNorm:
    after the residual (``norm_first=False``, PyTorch's default) or before."""

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _ff_block(self, x):
        return self.dropout2(self._feed_forward(x))


class TransformerDecoderLayer(_TransformerLayer):
    """Self-attention over the target, attention to the encoder's memory,
    feed-forward; each with a residual and a LayerNorm."""

    _cross_attention = True

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask,
                                    memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                           memory_is_causal))
        return self.norm3(x + self._ff_block(x))

    def _mha_block(self, x, memory, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, memory, memory, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, need_weights=False,
                                is_causal=is_causal)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(self._feed_forward(x))


def _clones(layer, count):
    return ModuleList([copy.deepcopy(layer) for _ in range(count)])


def _detect_is_causal(mask, is_causal, size):
    """PyTorch's rule: without a hint, a mask equal to the causal mask is causal."""
    if is_causal is not None or mask is None:
        return bool(is_causal)
    if tuple(mask.shape) != (size, size):
        return False
    m = mask.array if isinstance(mask, Tensor) else mask
    xp = xp_of(m)
    future = xp.triu(xp.ones((size, size), bool), k=1)  # on the mask's device
    if m.dtype.kind == "b":
        return bool((future == m).all())
    return bool((xp.where(future, -xp.inf, 0.0) == m).all())


class TransformerEncoder(Module):
    """``num_layers`` deep copies of ``encoder_layer``, then ``norm`` if given.
    ``enable_nested_tensor`` and ``mask_check`` are accepted (no nested tensors here)."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        first = self.layers[0] if len(self.layers) else None
        seq_dim = 1 if first is not None and first.self_attn.batch_first and src.ndim == 3 else 0
        is_causal = _detect_is_causal(mask, is_causal, src.shape[seq_dim])
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                        is_causal=is_causal)
        return out if self.norm is None else self.norm(out)


class TransformerDecoder(Module):
    """``num_layers`` deep copies of ``decoder_layer``, then ``norm`` if given."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        first = self.layers[0] if len(self.layers) else None
        seq_dim = 1 if first is not None and first.self_attn.batch_first and tgt.ndim == 3 else 0
        tgt_is_causal = _detect_is_causal(tgt_mask, tgt_is_causal, tgt.shape[seq_dim])
        out = tgt
        for layer in self.layers:
            out = layer(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask,
                        memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
        return out if self.norm is None else self.norm(out)


class Transformer(Module):
    """Encoder and decoder stacks, each ending in a LayerNorm; every parameter
    of more than one dim re-initialised xavier_uniform_ (PyTorch's
    ``_reset_parameters``). ``custom_encoder``/``custom_decoder`` replace a stack."""

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=False, norm_first=False,
                 bias=True, device=None, dtype=None):
        super().__init__()
        args = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                    layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                    norm_first=norm_first, bias=bias, dtype=dtype)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(
                TransformerEncoderLayer(d_model, nhead, **args), num_encoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(
                TransformerDecoderLayer(d_model, nhead, **args), num_decoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
        _move(self, device)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        batched = src.ndim == 3
        batch_dim = 0 if self.batch_first else 1
        if batched and src.shape[batch_dim] != tgt.shape[batch_dim]:
            raise RuntimeError(f"Transformer: the batch number of src ({src.shape[batch_dim]}) "
                               f"and tgt ({tgt.shape[batch_dim]}) must be equal")
        if not batched and tgt.ndim == 3:
            raise RuntimeError("Transformer: the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError(f"Transformer: the feature number of src ({src.shape[-1]}) and "
                               f"tgt ({tgt.shape[-1]}) must be equal to d_model "
                               f"({self.d_model})")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    generate_square_subsequent_mask = staticmethod(generate_square_subsequent_mask)
