"""Train an MLP on a generated classification problem and check its accuracy.

    python examples/train_mlp.py

Single process for now: the data-parallel issue turns this into
``mpirun -n 8 python examples/train_mlp.py``. The data are two interleaved
spirals (a problem a linear model cannot solve); the script exits non-zero
when the final training accuracy is below ``--min-accuracy``.
"""
import argparse
import sys
import time

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import nn, optim


def two_spirals(n_per_class, noise, seed):
    """Points (2 n, 2) on two interleaved spirals and their labels 0/1."""
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.uniform(0, 1, n_per_class)) * 3 * np.pi
    arm = np.stack([t * np.cos(t), t * np.sin(t)], axis=1) / (3 * np.pi)
    x = np.concatenate([arm, -arm]) + rng.normal(0, noise, (2 * n_per_class, 2))
    y = np.repeat([0, 1], n_per_class)
    return x.astype(np.float32), y


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=500, help="points per class")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-accuracy", type=float, default=0.95)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    sn.manual_seed(args.seed)
    x, y = two_spirals(args.samples, noise=0.02, seed=args.seed)
    model = nn.Sequential(nn.Linear(2, args.hidden), nn.Tanh(),
                          nn.Linear(args.hidden, args.hidden), nn.Tanh(),
                          nn.Linear(args.hidden, 2))
    opt = optim.Adam(model.parameters(), lr=args.lr)
    order = np.random.default_rng(args.seed)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        perm = order.permutation(len(x))
        for i in range(0, len(x), args.batch_size):
            idx = perm[i:i + args.batch_size]
            loss = F.cross_entropy(model(sn.Tensor(x[idx])), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if epoch % 50 == 0 or epoch == args.epochs - 1:
            print(f"epoch {epoch:4d}  loss {loss.item():.4f}")
    with sn.no_grad():
        accuracy = float((model(sn.Tensor(x)).numpy().argmax(1) == y).mean())
    print(f"train accuracy {accuracy:.3f} in {time.perf_counter() - start:.1f} s")
    if accuracy < args.min_accuracy:
        print(f"FAILED: accuracy {accuracy:.3f} < {args.min_accuracy}", file=sys.stderr)
        return 1
    print("accuracy check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
