"""One tensor-parallel MLP block (column then row), checked against the dense block.

    mpirun -n 2 python examples/tensor_parallel_mlp.py

Megatron's MLP block y = W2 · gelu(W1 · x) splits W1 by rows (output
features, ``ColumnParallelLinear``) and W2 by columns (input features,
``RowParallelLinear``) over the ranks of a tensor-parallel group. Each rank
then computes its own slice of the hidden activation without talking to
anyone, and one allreduce sums the partial outputs: one allreduce of
batch x dim in forward, one in backward. The script trains the block for a
few SGD steps on every rank and compares outputs, input gradients and the
gathered weights with the dense block built from the same seed; it exits
non-zero when they differ. Also runs as plain ``python`` (a group of one).
"""
import argparse

import numpy as np

import spmdnet as sn
from spmdnet import cli, dist, nn, optim, parallel


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tp", type=cli.non_negative_int, default=0,
                   help="TP group size (default: all ranks)")
    p.add_argument("--dim", type=cli.positive_int, default=16, help="input/output features")
    p.add_argument("--hidden", type=cli.positive_int, default=64,
                   help="hidden features (split over tp)")
    p.add_argument("--batch", type=cli.positive_int, default=8)
    p.add_argument("--steps", type=cli.positive_int, default=3)
    p.add_argument("--seed", type=cli.non_negative_int, default=0)
    p.add_argument("--tolerance", type=cli.positive_float, default=1e-10)
    return p.parse_args(argv)


def block(dim, hidden, comm=None):
    """The dense block, or (with a TP communicator) its parallel twin. The
    parallel layers draw the same full weights from the seed and keep their
    slices, so both blocks start from the same function."""
    if comm is None:
        return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
    return nn.Sequential(
        parallel.ColumnParallelLinear(dim, hidden, comm),   # x replicated -> h split
        nn.GELU(),                                          # elementwise: stays split
        parallel.RowParallelLinear(hidden, dim, comm))      # h split -> y replicated


def step(model, opt, x, target):
    """One SGD step on the squared error; returns (output, input gradient)."""
    x = sn.tensor(x, requires_grad=True)
    y = model(x)
    loss = ((y - sn.tensor(target)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return y.numpy(), x.grad.numpy()


def main(argv=None):
    args = parse_args(argv)
    world = dist.init()
    sn.set_default_dtype(np.float64)  # exact comparison with the dense block
    with dist.Mesh(tp=args.tp or world.size) as mesh:
        sn.manual_seed(args.seed)
        dense = block(args.dim, args.hidden)
        sn.manual_seed(args.seed)
        tp_block = block(args.dim, args.hidden, mesh.tp)
        dist.print0(f"{world.size} ranks as tp={mesh.tp_size} x dp={mesh.dp_size}; rank 0 "
                    f"holds W1 {tuple(tp_block[0].weight.shape)} of ({args.hidden}, "
                    f"{args.dim}) and W2 {tuple(tp_block[2].weight.shape)} of "
                    f"({args.dim}, {args.hidden})")
        opts = [optim.SGD(m.parameters(), lr=0.1) for m in (dense, tp_block)]
        rng = np.random.default_rng(args.seed)  # the same data on every rank
        worst = 0.0
        for i in range(args.steps):
            x, target = rng.standard_normal((2, args.batch, args.dim))
            (y_d, gx_d), (y_t, gx_t) = (step(m, o, x, target)
                                        for m, o in zip((dense, tp_block), opts))
            err = max(np.abs(y_t - y_d).max(), np.abs(gx_t - gx_d).max())
            dist.print0(f"step {i}: |y_tp - y_dense| and |dx_tp - dx_dense| <= {err:.2e}")
            worst = max(worst, err)
        # the trained shards, reassembled on rank 0, equal the dense weights
        full = parallel.gather_state_dict(tp_block, mesh)
        if full is not None:
            dense_state = dense.state_dict()
            worst = max([worst] + [np.abs(full[k].numpy() - dense_state[k].numpy()).max()
                                   for k in full])
        worst = dist.allreduce(float(worst), op="max")  # every rank exits alike
    dist.print0(f"largest difference from the dense block: {worst:.2e}")
    return cli.self_check(worst <= args.tolerance, f"difference {worst:.2e} > tolerance "
                          f"{args.tolerance}", "tensor-parallel block matches the dense block")


if __name__ == "__main__":
    dist.finalize_and_exit(main())
