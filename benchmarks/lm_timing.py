"""Pieces shared by the language-model step benchmarks (lstm_step.py,
transformer_step.py, gpt_step.py): the matmul floor of an attention model
and the floor/ours/xp timing row."""
import os

import numpy as np

from mlp_step import median_times  # benchmarks/ is on the path of a script run

FLOOR_OURS_XP_COLUMNS = "threads  floor_ms   ours_ms     xp_ms ours/floor xp/floor"


def attention_floor(rng, batch, seq, d_model, heads, ff, layers, vocab, stacked=False):
    """The forward and backward matrix products of a transformer language
    model alone, on random float32 arrays: each Linear (in_proj, out_proj,
    the two feed-forward ones per layer, then the decoder) as 2-D GEMMs over
    all batch*seq rows, or with ``stacked`` on (batch, seq, C) operands
    (NumPy then loops over the batch; weight gradients stay 2-D), and the
    batched attention products q kᵀ, a v and their four gradients."""
    f32 = np.float32
    n = batch * seq
    linears = [(d_model, 3 * d_model), (d_model, d_model), (d_model, ff),
               (ff, d_model)] * layers + [(d_model, vocab)]
    acts = [(rng.standard_normal((n, i), f32), rng.standard_normal((o, i), f32))
            for i, o in linears]
    if stacked:
        acts = [(x.reshape(batch, seq, -1), w) for x, w in acts]
    q, k, v = (rng.standard_normal((batch, heads, seq, d_model // heads), f32)
               for _ in range(3))

    def step():
        outs = [x @ w.T for x, w in acts]
        for _ in range(layers):
            att = q @ k.transpose(0, 1, 3, 2)
            y = att @ v
            _ = y @ v.transpose(0, 1, 3, 2)  # d att
            _ = att.transpose(0, 1, 3, 2) @ y  # d v
            _ = att @ k  # d q
            _ = att.transpose(0, 1, 3, 2) @ q  # d k
        for (x, w), g in zip(acts, outs):
            _ = g.reshape(n, -1).T @ x.reshape(n, -1)  # weight gradient
            _ = g @ w  # input gradient
    return step


def time_floor_ours_xp(steps, vocab, tokens_shape, floor_fn, build_ours):
    """Time the floor (``floor_fn(rng)``), ours (``build_ours(tokens,
    targets)``) and ours with the xp kernels on random tokens of
    ``tokens_shape`` and flat targets, interleaved, and print the row under
    FLOOR_OURS_XP_COLUMNS."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, tokens_shape)
    targets = rng.integers(0, vocab, tokens.size)
    fns = {"floor": floor_fn(rng), "ours": build_ours(tokens, targets),
           "xp": build_ours(tokens, targets, "xp")}
    for fn in fns.values():
        fn()  # warm-up: compiles the kernels this step uses
    t = median_times(fns, steps)
    threads = os.environ["OMP_NUM_THREADS"]
    print(f"{threads:>7} {t['floor'] * 1e3:9.2f} {t['ours'] * 1e3:9.2f} {t['xp'] * 1e3:9.2f} "
          f"{t['ours'] / t['floor']:10.3f} {t['xp'] / t['floor']:8.3f}", flush=True)
