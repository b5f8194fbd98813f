"""Optimizer step time: parameters in one flat array (one update call per
run, ``optim._flat_runs``) against the same parameters as separate arrays
(one call per parameter).

    python benchmarks/optim_flat_runs.py [--steps 200]

Models: a 24-layer MLP of width 64 (48 small parameters) and the minGPT of
``gpt_step.py`` (2 layers, d=128: 28 parameters). Each model is copied: one
copy's parameters and gradients become views of one flat array each (the
``ParamAndGradBuffer`` with ``flat_params=True``; gradients as a
persistent flat gradient array gives them), the other keeps separate
arrays. Gradients are fixed random arrays; only ``opt.step()`` is timed,
interleaved, median of ``--steps``.
"""
import argparse
import copy
import os

import numpy as np

import spmdnet as sn
from spmdnet import nn, optim
from spmdnet.parallel._common.grad_buffer import ParamAndGradBuffer

from gpt_step import GPT  # benchmarks/ is on the path of a script run
from mlp_step import median_times


def mlp():
    layers = []
    for _ in range(24):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*layers)


def with_grads(model, flat):
    params = list(model.parameters())
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(p.array.shape).astype(p.array.dtype) for p in params]
    if not flat:
        for p, g in zip(params, grads):
            p.grad = sn.Tensor(g)
        return params
    buffer = ParamAndGradBuffer(params, [n for n, _ in model.named_parameters()], None,
                                who="benchmark", flat_params=True)
    grad_flat = np.zeros_like(next(iter(buffer.param_flats.values())))
    offset = 0
    for p, g in zip(params, grads):
        view = grad_flat[offset:offset + g.size].reshape(g.shape)
        view[...] = g
        p.grad = sn.Tensor(view)
        offset += g.size
    return params


OPTIMIZERS = {"SGD(momentum)": lambda ps: optim.SGD(ps, lr=1e-3, momentum=0.9),
              "Adam": lambda ps: optim.Adam(ps, lr=1e-4),
              "AdamW(amsgrad)": lambda ps: optim.AdamW(ps, lr=1e-4, amsgrad=True)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    steps = ap.parse_args().steps
    print(f"optimizer step, median of {steps} interleaved steps (us); "
          f"threads {os.environ.get('NUMBA_NUM_THREADS', '?')}")
    for model_name, make in (("MLP 24x64", mlp), ("minGPT", GPT)):
        sn.manual_seed(0)
        base = make()
        n = len(list(base.parameters()))
        for opt_name, make_opt in OPTIMIZERS.items():
            opts = {kind: make_opt(with_grads(copy.deepcopy(base), kind == "runs"))
                    for kind in ("per-param", "runs")}
            for opt in opts.values():
                opt.step()  # state allocated, kernels compiled
            t = median_times({k: o.step for k, o in opts.items()}, steps)
            print(f"{model_name:10s} ({n} params) {opt_name:15s} per-param "
                  f"{t['per-param'] * 1e6:8.1f}  runs {t['runs'] * 1e6:8.1f}  "
                  f"speedup {t['per-param'] / t['runs']:.2f}x")


if __name__ == "__main__":
    main()
