"""``bench step``: the training-step breakdown of one MLP, per rank.

The model (784-1024-1024-10 by default, float32, SGD with momentum,
cross-entropy) trains with DataParallel on synthetic data served by
DataLoader/DistributedSampler, exactly like a real job, and a StepProfiler
splits every step into data wait, forward, backward, exposed communication,
optimizer and the rest. With ``--ceiling`` a second copy of the model
trains without any communication, its steps interleaved with the real ones
(same batches): the no-communication ceiling. A barrier before every timed
step (outside the timing) keeps the two variants from disturbing each other.
"""
import json
import os

import numpy as np

import spmdnet as sn
import spmdnet.functional as F

from .. import data, distributed as dist, nn, optim, parallel
from ..data import ArrayDataset
from . import report
from ..profiler import PHASES, StepProfiler

FORMAT = "spmdnet-bench-step/1"
LAYERS = (784, 1024, 1024, 10)  # the MLP of every step benchmark: MNIST-sized, 1.9 M parameters
COLUMNS = ("rank",) + tuple(f"{p}_s" for p in PHASES) + ("step_s", "ceiling_s")


def build_model(layers=LAYERS, seed=0):
    """The benchmarks' MLP: Linear layers of widths ``layers`` with ReLU
    between, initialised from ``seed``."""
    sn.manual_seed(seed)
    modules = []
    for i, o in zip(layers[:-1], layers[1:]):
        modules += [nn.Linear(i, o), nn.ReLU()]
    return nn.Sequential(*modules[:-1])


def batch_sizes(size, global_batch=None, local_batch=None):
    """(global, local) batch: strong scaling fixes the global batch, weak
    scaling the per-rank one."""
    if local_batch is not None:
        return local_batch * size, local_batch
    if global_batch % size:
        raise ValueError(f"global batch {global_batch} does not divide over {size} ranks")
    return global_batch, global_batch // size


def endless(loader):
    """Batches of ``loader`` over epoch after epoch."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def train_step(model, opt, prof, x, y):
    prof.begin()
    loss = F.cross_entropy(model(sn.Tensor(x)), y)
    prof.mark("forward")
    opt.zero_grad()
    loss.backward()
    prof.mark("backward")
    opt.step()
    prof.mark("optimizer")
    prof.end()


def measure(args):
    """Run the steps; returns (Breakdown, ceiling Breakdown or None, info) on
    rank 0 and (None, None, info) elsewhere."""
    world = dist.init()
    global_batch, local_batch = batch_sizes(world.size, args.global_batch, args.local_batch)
    layers = [args.inputs, *args.hidden, args.classes]
    x, y = data.datasets.synthetic(max(2 * global_batch, 512), args.inputs, args.classes)
    ds = ArrayDataset(x.astype(np.float32), y.astype(np.int64))
    sampler = data.DistributedSampler(len(ds), seed=0, drop_last=True)
    loader = data.DataLoader(ds, local_batch, sampler=sampler, drop_last=True)
    model = build_model(layers).to(world.device)  # SPMDNET_DEVICE=gpu: on the GPU
    ddp = parallel.DataParallel(model, overlap=args.overlap, bucket_mb=args.bucket_mb)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    prof = StepProfiler(ddp, loader, warmup=args.warmup)
    runs = [(ddp, opt, prof)]
    if args.ceiling:
        alone = build_model(layers).to(world.device)
        runs.append((alone, optim.SGD(alone.parameters(), lr=0.01, momentum=0.9),
                     StepProfiler(warmup=args.warmup)))
    batches = endless(loader)
    for _ in range(args.warmup + args.steps):
        xb, yb = next(batches)
        for model_, opt_, prof_ in runs:
            world.comm.Barrier()
            train_step(model_, opt_, prof_, xb, yb)
    batches.close()
    info = {"ranks": world.size, "global_batch": global_batch, "local_batch": local_batch,
            "layers": layers, "steps": args.steps, "overlap": ddp.overlap,
            "bucket_mb": args.bucket_mb, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    ddp.close()
    breakdown = prof.gather()
    ceiling = runs[1][2].gather() if args.ceiling else None
    return breakdown, ceiling, info


def rows_of(breakdown, ceiling):
    """CSV rows: one per rank, then the mean over ranks and max/min."""
    rows = []
    for r, s in enumerate(breakdown.ranks):
        row = {"rank": r, "step_s": s["step"], **{f"{p}_s": s[p] for p in PHASES}}
        row["ceiling_s"] = ceiling.ranks[r]["step"] if ceiling else ""
        rows.append(row)
    mean = breakdown.mean()
    rows.append({"rank": "mean", "step_s": sum(mean.values()),
                 **{f"{p}_s": mean[p] for p in PHASES},
                 "ceiling_s": float(np.mean([c["step"] for c in ceiling.ranks])) if ceiling
                 else ""})
    imb = breakdown.imbalance()
    rows.append({"rank": "max/min", "step_s": imb["step"], **{f"{p}_s": imb[p] for p in PHASES},
                 "ceiling_s": ceiling.imbalance()["step"] if ceiling else ""})
    return rows


def summary(breakdown, ceiling, info, experiment=None):
    """The JSON record that ``bench scaling --from`` reads (see scaling.py)."""
    parts = breakdown.parts()
    return {"format": FORMAT, "experiment": experiment, **info, **parts,
            "phases": {f"{p}_s": v for p, v in breakdown.mean().items()},
            "imbalance": breakdown.imbalance(),
            "ceiling_s": max(c["step"] for c in ceiling.ranks) if ceiling else None}


def draw(rows):
    def plot(fig):
        ax = fig.subplots()
        labels = [str(r["rank"]) for r in rows[:-1]]
        left = np.zeros(len(labels))
        for p in PHASES:
            width = np.array([1e3 * r[f"{p}_s"] for r in rows[:-1]])
            ax.barh(labels, width, left=left, label=p)
            left += width
        ceil = [r["ceiling_s"] for r in rows[:-1]]
        if all(c != "" for c in ceil):
            ax.scatter([1e3 * c for c in ceil], labels, marker="|", s=300, color="k",
                       label="no-comm ceiling", zorder=3)
        ax.set(xlabel="ms per step", ylabel="rank",
               title=f"training-step breakdown ({len(rows) - 2} ranks)")
        ax.invert_yaxis()
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=7)
    return plot


def run(args):
    breakdown, ceiling, info = measure(args)
    if breakdown is None:
        return 0
    print(f"MLP {'-'.join(map(str, info['layers']))}, global batch {info['global_batch']} "
          f"({info['local_batch']} per rank), overlap {info['overlap']}, "
          f"OMP_NUM_THREADS={info['omp_num_threads']}")
    print(breakdown.table())
    if ceiling is not None:
        c = max(s["step"] for s in ceiling.ranks)
        print(f"no-communication ceiling: {1e3 * c:.2f} ms per step (slowest rank)")
    rows = rows_of(breakdown, ceiling)
    report.save(args, "step", COLUMNS, rows, draw(rows), figsize=(8, 2.2 + 0.4 * len(rows)))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(summary(breakdown, ceiling, info, args.experiment), f, indent=1)
        print("wrote", args.json)
    return 0
