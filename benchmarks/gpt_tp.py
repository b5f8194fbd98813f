"""The GPT of examples/gpt/ (model.py), tensor parallel over N ranks against the serial step.

    python benchmarks/gpt_tp.py [--ranks 2] [--steps 20] [--n-embd 128] [--batch 16]

GPT with 4 heads, block 64, 2 layers, vocabulary 64 (the example's padded
65), float32, AdamW, global batch --batch, one BLAS thread per rank. The
script launches itself under ``mpiexec -n N`` and interleaves:
  serial  every rank runs the whole dense step on the whole batch alone
  tpN     heads, MLP and vocabulary split over the N ranks (ParallelSelfAttention,
          column -> row MLP, VocabParallelEmbedding, vocab-parallel loss), every
          rank the whole batch: two allreduces of B x T x d per block each way
and prints the median step of the slowest rank, the speed-up over serial
(ideal N; tensor parallelism pays when the products dominate the allreduces
and the per-op overhead, so it grows with --n-embd) and the bytes each rank
hands to allreduce per step.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, launch, optim, parallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "gpt"))
from model import GPT, load_part  # noqa: E402 - the GPT examples' model

from tp_step import Counter, timed_steps  # benchmarks/ is on the path of a script run

T, LAYERS, HEADS, VOCAB = 64, 2, 4, 64


def build(variant, n_embd, mesh):
    """(model, AdamW) for a variant, both from the serial model of seed 0."""
    sn.manual_seed(0)
    serial = GPT(VOCAB, T, LAYERS, HEADS, n_embd)
    serial.init_weights(LAYERS)
    model = serial
    if variant == "tpN":
        model = GPT(VOCAB, T, LAYERS, HEADS, n_embd, tp=mesh.tp)
        load_part(model, serial.state_dict(), mesh, 0)
    return model, optim.AdamW(model.parameters(), lr=1e-3)


def loss_of(variant, model, x, y, mesh):
    logits = model(x)
    if variant == "tpN":
        return parallel.vocab_parallel_cross_entropy(logits.view(-1, logits.size(-1)),
                                                     y.view(-1), mesh.tp)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


def child(args):
    world = dist.init()
    counter = Counter()
    slowest = dist.allreduce  # not counted
    dist.allreduce = counter.wrap(dist.allreduce)
    mesh = dist.Mesh(tp=world.size)
    runs = {v: build(v, args.n_embd, mesh) for v in ("serial", "tpN")}
    rng = np.random.default_rng(0)
    x = sn.tensor(rng.integers(0, VOCAB, (args.batch, T)))
    y = sn.tensor(rng.integers(0, VOCAB, (args.batch, T)))
    result = timed_steps(world, runs, args.steps, counter, slowest,
                         lambda v, model, _: loss_of(v, model, x, y, mesh))
    if world.rank == 0:
        print(json.dumps(result))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if HEADS % args.ranks or VOCAB % args.ranks:
        p.error(f"--ranks {args.ranks} must divide the {HEADS} heads and the vocabulary {VOCAB}")
    r = launch.run_child(args.ranks, __file__, "--n-embd", args.n_embd, "--batch", args.batch,
                         "--steps", args.steps)
    print(f"GPT d={args.n_embd}, {HEADS} heads, T={T}, {LAYERS} layers, vocabulary {VOCAB}, "
          f"batch {args.batch}, float32, AdamW; {args.ranks} ranks, 1 BLAS thread each, "
          f"median of {args.steps} steps (slowest rank)")
    print(f"{'variant':>16} {'step_ms':>8} {'speedup':>8} {'MB/step':>9}")
    names = {"serial": "serial (1 rank)", "tpN": f"tp={args.ranks}"}
    for v, (step, nbytes) in r.items():
        print(f"{names[v]:>16} {step * 1e3:>8.1f} {r['serial'][0] / step:>8.2f} "
              f"{nbytes / 1e6:>9.3f}")


if __name__ == "__main__":
    main()
