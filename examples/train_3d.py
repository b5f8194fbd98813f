"""Data x tensor x pipeline parallelism: the main job's MLP on a 3D mesh.

    mpirun -n 8 python examples/train_3d.py --tp 2 --pp 2
    mpirun -n 4 python examples/train_3d.py --tp 2 --pp 1 --fsdp

The ranks form a Mesh of dp x tp x pp (dp = ranks / (tp * pp); the ranks of a
tensor-parallel group are adjacent). With tp > 1 the first two layers are a
column-then-row tensor-parallel pair over ``mesh.tp`` (one allreduce forward,
one backward); the layers are cut into pp pipeline stages, run as a GPipe
pipeline over ``mesh.pp`` in --micro-batches micro-batches; DataParallel over
``mesh.dp`` averages the gradients of each stage's replicas. Every rank of a
tensor-parallel group and of a pipeline reads the same samples (the sampler
runs over ``mesh.dp``), and evaluation runs the pipeline's inference forward.
The same seed gives the weights of the serial model, so --tp 1 --pp 1 trains
exactly what examples/train_mlp.py trains. Exits 1 when the test accuracy is
below --min-accuracy. Also runs as plain `python` with --tp 1 --pp 1.

--fsdp (with --pp 1): FullyShardedDataParallel over ``mesh.dp`` instead of
DataParallel, every Linear (tensor-parallel ones too) its own shard unit:
parameters, gradients and optimizer state 1/dp per rank, TP slices staying
TP slices.
"""
import argparse
import time
from pathlib import Path

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import cli, data, dist, nn, optim, parallel

REFERENCE_BATCH = 256  # --lr is given for this global batch and scaled linearly


def parse_args(argv=None):
    """train_mlp.py's model options (--batch-size: per dp rank), and the mesh's."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default="data", help="where the digits files are written")
    p.add_argument("--epochs", type=cli.positive_int, default=10)
    p.add_argument("--batch-size", type=cli.positive_int, default=16,
                   help="samples per data-parallel rank per step")
    p.add_argument("--lr", type=cli.positive_float, default=0.4, help=f"for a global batch of "
                   f"{REFERENCE_BATCH}; scaled linearly with the actual global batch")
    p.add_argument("--hidden", type=cli.positive_int, default=128)
    p.add_argument("--dropout", type=cli.probability, default=0.0)
    p.add_argument("--seed", type=cli.non_negative_int, default=0)
    p.add_argument("--min-accuracy", type=cli.probability, default=0.95)
    p.add_argument("--tp", type=cli.positive_int, default=2, help="tensor-parallel group size")
    p.add_argument("--pp", type=cli.positive_int, default=2, help="pipeline stages")
    p.add_argument("--micro-batches", type=cli.positive_int, default=4,
                   help="per step, with --pp > 1")
    p.add_argument("--fsdp", action="store_true",
                   help="data parallelism by FullyShardedDataParallel (with --pp 1)")
    return p.parse_args(argv)


def digits(data_dir):
    """(train, test) HDF5Datasets of the UCI digits, written on first use."""
    paths = Path(data_dir) / "digits_train.h5", Path(data_dir) / "digits_test.h5"
    if not all(p.exists() for p in paths):
        paths = data.datasets.make_digits(Path(data_dir))
    return data.HDF5Dataset(paths[0]), data.HDF5Dataset(paths[1])


def build_blocks(in_features, hidden, classes, dropout, mesh):
    """The MLP as blocks (lists of modules). With tp > 1 the first two layers
    are a column-then-row tensor-parallel pair (one block: they must share a
    pipeline stage); the same seed gives the serial model's weights."""
    if mesh.tp_size == 1:
        return [[nn.Linear(in_features, hidden), nn.ReLU(), nn.Dropout(dropout)],
                [nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout)],
                [nn.Linear(hidden, classes)]]
    tp = mesh.tp
    return [[parallel.ColumnParallelLinear(in_features, hidden, tp), nn.ReLU(),
             parallel.ParallelDropout(dropout, tp),  # inside the TP region: own masks
             parallel.RowParallelLinear(hidden, hidden, tp), nn.ReLU(),
             nn.Dropout(dropout)],  # outside it: the same mask on every TP rank
            [nn.Linear(hidden, classes)]]


def _is_linear(module):
    """FSDP's wrap policy: every Linear layer, tensor-parallel or not, is a unit."""
    return isinstance(module, (nn.Linear, parallel.ColumnParallelLinear,
                               parallel.RowParallelLinear))


class Net:
    """This rank's part of the model: its pipeline stage, data parallel over
    ``mesh.dp``, run through a GPipe pipeline over ``mesh.pp`` when pp > 1."""

    def __init__(self, args, mesh, in_features, classes):
        blocks = build_blocks(in_features, args.hidden, classes, args.dropout, mesh)
        if mesh.pp_size > len(blocks):
            raise SystemExit(f"--pp {mesh.pp_size} exceeds the model's {len(blocks)} blocks "
                             "(with --tp > 1 the first two layers form one block)")
        bounds = np.linspace(0, len(blocks), mesh.pp_size + 1).round().astype(int)
        mine = blocks[bounds[mesh.pp_rank]:bounds[mesh.pp_rank + 1]]
        self.module = nn.Sequential(*[m for block in mine for m in block])
        self.fsdp = args.fsdp
        if self.fsdp and mesh.pp_size > 1:
            raise SystemExit("--fsdp runs with --pp 1 (no pipeline of FSDP stages)")
        self.ddp = parallel.FullyShardedDataParallel(self.module, comm=mesh.dp, wrap=_is_linear) \
            if self.fsdp else parallel.DataParallel(self.module, comm=mesh.dp)
        self.pipe = parallel.Pipeline(self.ddp, mesh.pp, args.micro_batches) \
            if mesh.pp_size > 1 else None

    def train_step(self, x, y, opt):
        """One optimisation step; returns the loss (the same on a pipeline's ranks)."""
        opt.zero_grad()
        if self.pipe is not None:
            loss = self.pipe.train_step(x, y, F.cross_entropy)
        else:
            out = F.cross_entropy(self.ddp(sn.Tensor(x)), y)
            out.backward()
            loss = out.item()
        opt.step()
        return loss

    def __call__(self, x):  # evaluation: the logits of the whole model
        if self.pipe is not None:
            return sn.Tensor(self.pipe.infer(x))
        return self.ddp(x) if self.fsdp else self.module(x)  # FSDP: gathered unit by unit

    def parameters(self):
        """What the optimizer updates: the model's parameters, or FSDP's flat shards."""
        return self.ddp.parameters() if self.fsdp else self.module.parameters()

    @property
    def training(self):
        return self.module.training

    def train(self, mode=True):
        self.module.train(mode)

    def eval(self):
        self.module.train(False)


def main(argv=None):
    args = parse_args(argv)
    world = dist.init()
    mesh = dist.Mesh(tp=args.tp, pp=args.pp)
    sn.manual_seed(args.seed)  # the same on every rank: TP layers slice one full draw
    train_set, test_set = digits(args.data_dir)
    features, classes = int(np.prod(train_set.sample_shape)), int(train_set.targets().max()) + 1
    net = Net(args, mesh, features, classes)
    # every rank of a TP group and of a pipeline reads the same samples
    sampler = data.DistributedSampler(train_set, seed=args.seed, drop_last=True, comm=mesh.dp)
    loader = data.DataLoader(train_set, args.batch_size, sampler=sampler, drop_last=True)
    cli.require_steps(loader, train_set, args.batch_size, mesh.dp_size)
    global_batch = args.batch_size * mesh.dp_size
    opt = optim.SGD(net.parameters(), lr=args.lr * global_batch / REFERENCE_BATCH,
                    momentum=0.9, weight_decay=1e-4)
    steps = max(1, args.epochs * len(loader))
    sched = optim.lr_scheduler.WarmupCosine(opt, min(len(loader), steps), steps)
    dist.print0(f"{world.size} ranks (dp {mesh.dp_size} x tp {mesh.tp_size} x pp "
                f"{mesh.pp_size}){', FSDP' if args.fsdp else ''}, {len(train_set)} training "
                f"samples, global batch {global_batch}, {len(loader)} steps/epoch")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        losses, t0 = [], time.perf_counter()
        for x, y in data.progress(loader, f"epoch {epoch}"):
            losses.append(net.train_step(x, y, opt))
            sched.step()
        rate = len(losses) * global_batch / (time.perf_counter() - t0)
        loss = dist.allreduce(float(np.mean(losses)), "mean")
        val = data.evaluate(net, test_set, comm=mesh.dp)  # ranks of a dp rank: same samples
        dist.print0(f"epoch {epoch:3d}  loss {loss:.4f}  val loss {val['loss']:.4f}  val "
                    f"accuracy {val['accuracy']:.4f} ({val['count']} samples)  "
                    f"{rate:.0f} samples/s")
    final = data.evaluate(net, test_set, comm=mesh.dp)
    dist.print0(f"test accuracy {final['accuracy']:.4f} on {final['count']} samples")
    return cli.self_check(final["accuracy"] >= args.min_accuracy, f"test accuracy "
                          f"{final['accuracy']:.4f} < {args.min_accuracy}", "accuracy check passed")


if __name__ == "__main__":
    dist.finalize_and_exit(main())
