"""Train an MLP with data parallelism over every MPI rank: the main job.

    mpirun -n 8 python examples/train_mlp.py

PyTorch's DDP tutorial, in spmdnet: every rank builds the same model,
DataParallel averages the gradients over the ranks, and a DistributedSampler
gives each rank its own share of the data. With no argument it writes the UCI
handwritten digits (kept in the package) to HDF5 files on first use, trains
with SGD (learning rate scaled with the global batch, one warmup epoch, then
cosine decay), prints the validation accuracy every epoch, writes the epoch
metrics as JSON lines (one per epoch, kept across stop and resume), and exits
1 when the test accuracy is below --min-accuracy. Also runs as plain `python`
(1 rank) and under Slurm's `srun`. Bad option values, an unusable
--checkpoint-dir and a test set of other features fail before the first step.

--checkpoint-dir DIR checkpoints every --checkpoint-every steps and at the end,
and resumes from the newest checkpoint there, exactly: model, optimizer,
scheduler, every rank's RNG and the loader's position. On SIGTERM or SIGUSR1
it checkpoints at the next step and exits with code 3 ("stopped, resumable"),
the code Slurm requeueing relies on. It may resume on another number of ranks
with the same global batch (--batch-size scaled inversely). --profile prints every rank's step time
breakdown at the end. Data x tensor x pipeline parallel: examples/train_3d.py.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import cli, data, dist, nn, optim, parallel
from spmdnet.checkpoint import resume
from spmdnet.profiler import StepProfiler

REFERENCE_BATCH = 256  # --lr is given for this global batch and scaled linearly


def model_options():
    """The model and schedule options (train_3d.py has the same ones: its
    --tp 1 --pp 1 trains what this job trains)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--data-dir", default="data", help="where built-in datasets are written")
    p.add_argument("--epochs", type=cli.positive_int, default=20)
    p.add_argument("--batch-size", type=cli.positive_int, default=16,
                   help="samples per rank per step")
    p.add_argument("--lr", type=cli.positive_float, default=0.4, help=f"for a global batch of "
                   f"{REFERENCE_BATCH}; scaled linearly with the actual global batch")
    p.add_argument("--hidden", type=cli.positive_int, default=128)
    p.add_argument("--dropout", type=cli.probability, default=0.0)
    p.add_argument("--seed", type=cli.non_negative_int, default=0)
    p.add_argument("--min-accuracy", type=cli.probability, default=0.95)
    return p


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], parents=[model_options()])
    p.add_argument("--data", default="digits",
                   help="'digits', 'synthetic', or a training HDF5 file with x and y")
    p.add_argument("--test-data", help="test HDF5 file (with --data PATH)")
    p.add_argument("--metrics", default="metrics.jsonl",
                   help="JSON lines, one per epoch (a resumed run appends)")
    p.add_argument("--plot", help="write loss/accuracy curves to this PNG (needs matplotlib)")
    p.add_argument("--checkpoint-dir", help="checkpoint here and resume from here")
    p.add_argument("--checkpoint-every", type=cli.non_negative_int, default=0,
                   help="steps (0: only at the end)")
    p.add_argument("--stop-after", type=cli.non_negative_int, default=0,
                   help="checkpoint and stop after this many steps (tests resumption)")
    p.add_argument("--profile", action="store_true",
                   help="print every rank's per-step time breakdown at the end")
    return p.parse_args(argv)


def datasets(args):
    """(train, test) HDF5Datasets; the built-in ones are written on first use."""
    out = Path(args.data_dir)
    if args.data == "digits":
        paths = out / "digits_train.h5", out / "digits_test.h5"
        if not all(p.exists() for p in paths):
            paths = data.datasets.make_digits(out)
    elif args.data == "synthetic":
        paths = out / "synthetic_train.h5", out / "synthetic_test.h5"
        if not all(p.exists() for p in paths):
            paths = (data.datasets.make_synthetic(paths[0], 20000, seed=1),
                     data.datasets.make_synthetic(paths[1], 4000, seed=2))
    elif args.test_data:
        paths = args.data, args.test_data
    else:
        raise SystemExit("--data PATH needs --test-data PATH as well")
    train_set, test_set = data.HDF5Dataset(paths[0]), data.HDF5Dataset(paths[1])
    data.check_same_features(train_set, test_set)  # names both files: before the first step
    return train_set, test_set


def options(args):
    """What a resumed run must share with the run it continues. The global
    batch, not --batch-size: a run resumed on another number of ranks keeps
    the global batch (--batch-size times the ranks) and trains on what the
    uninterrupted run would have."""
    return {**{k: getattr(args, k) for k in ("epochs", "lr", "dropout", "seed")},
            "global_batch": args.batch_size * dist.size()}


def resumed_losses(saved):
    """This rank's share of the checkpoint's losses of the epoch so far
    (``saved``: one list per saved rank). On as many ranks, its own: the
    epoch's train_loss is then the uninterrupted run's. On another number,
    every rank takes each saved step's mean over the saved ranks, the step's
    loss as train_loss averages it, so the epoch's mean still counts every
    step once at its global value."""
    if len(saved) == dist.size():
        return saved[dist.rank()]
    return np.mean(np.array(saved, np.float64), axis=0).tolist()


def save(args, step, model, opt, sched, loader, losses):
    """A checkpoint, with every rank's losses of the epoch so far (a resumed
    epoch's train_loss is then the uninterrupted run's)."""
    losses = dist.allgather(np.array(losses, np.float64)).tolist()  # collective
    sn.save_checkpoint(args.checkpoint_dir + "/", model, opt, step=step, loader=loader,
                       scheduler=sched, options=options(args), epoch_losses=losses)


def logged_epochs(args, resumed):
    """The epochs that have their line in --metrics (rank 0 writes it): none
    for a new run, which starts a new file; a resumed run appends."""
    path = Path(args.metrics)
    if not dist.is_root():
        return set()
    if not resumed or not path.exists():
        path.write_text("")
        return set()
    return {json.loads(line)["epoch"] for line in path.read_text().splitlines() if line}


def plot(path, metrics):
    try:
        import matplotlib  # noqa: PLC0415 - optional and slow to import: only for --plot
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - as above
    except ImportError:
        print("--plot needs matplotlib: pip install 'spmdnet[plot]'")
        return
    history = [json.loads(line) for line in Path(metrics).read_text().splitlines()]
    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(epochs, [h["train_loss"] for h in history], label="train")
    a.plot(epochs, [h["val_loss"] for h in history], label="validation")
    a.set_xlabel("epoch"), a.set_ylabel("loss"), a.legend()
    b.plot(epochs, [h["val_accuracy"] for h in history])
    b.set_xlabel("epoch"), b.set_ylabel("validation accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    args = parse_args(argv)
    dist.init()
    if args.checkpoint_dir:  # unusable: fail now, not at the first save
        sn.check_checkpoint_dir(args.checkpoint_dir)
    sn.manual_seed(args.seed)
    train_set, test_set = datasets(args)
    features, classes = int(np.prod(train_set.sample_shape)), int(train_set.targets().max()) + 1
    model = nn.Sequential(
        nn.Linear(features, args.hidden), nn.ReLU(), nn.Dropout(args.dropout),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Dropout(args.dropout),
        nn.Linear(args.hidden, classes))
    ddp = parallel.DataParallel(model)  # rank 0's weights everywhere; gradients averaged
    sampler = data.DistributedSampler(train_set, seed=args.seed, drop_last=True)
    loader = data.DataLoader(train_set, args.batch_size, sampler=sampler, drop_last=True)
    cli.require_steps(loader, train_set, args.batch_size, dist.size())
    global_batch = args.batch_size * dist.size()
    opt = optim.SGD(model.parameters(), lr=args.lr * global_batch / REFERENCE_BATCH,
                    momentum=0.9, weight_decay=1e-4)
    steps = max(1, args.epochs * len(loader))
    sched = optim.lr_scheduler.WarmupCosine(opt, min(len(loader), steps), steps)
    dist.print0(f"{dist.size()} ranks, {len(train_set)} training samples, global batch "
                f"{global_batch}, {len(loader)} steps/epoch")

    # the newest checkpoint in --checkpoint-dir, if any: model, optimizer, RNGs, loader, scheduler
    extra = resume(args.checkpoint_dir, model, opt, scheduler=sched, loader=loader,
                   options=options(args))
    step, losses = 0, []  # losses: of the epoch so far
    if extra is not None:
        step, losses = extra["step"], resumed_losses(extra["epoch_losses"])
        dist.print0(f"resumed from {args.checkpoint_dir} at step {step}, epoch "
                    f"{sampler.epoch}, {sampler.start_index} samples into it")
    logged = logged_epochs(args, resumed=step > 0)
    stop = dist.StopSignal() if args.checkpoint_dir else None  # SIGTERM, SIGUSR1
    prof = StepProfiler(ddp, loader, enabled=args.profile)

    def checkpoint_or_stop(stopping):
        """Save when --checkpoint-every or a stop asks; True to stop."""
        every = args.checkpoint_every
        if args.checkpoint_dir and (stopping or (every and step % every == 0)):
            save(args, step, model, opt, sched, loader, losses)
        if stopping:
            dist.print0(f"stopped after step {step} with a checkpoint in "
                        f"{args.checkpoint_dir}; run again to resume")
        return stopping

    for epoch in range(sampler.epoch, args.epochs):  # a resumed run starts mid-epoch
        sampler.set_epoch(epoch)
        t0, remaining, stopping = time.perf_counter(), len(loader), False
        for i, (x, y) in enumerate(data.progress(loader, f"epoch {epoch}")):
            prof.begin()
            loss = F.cross_entropy(ddp(sn.Tensor(x)), y)
            prof.mark("forward")
            opt.zero_grad()
            loss.backward()  # returns with the gradients averaged over all ranks
            prof.mark("backward")
            opt.step()
            sched.step()
            prof.mark("optimizer")
            losses.append(loss.item())
            prof.end()
            step += 1
            stopping = step == args.stop_after or (stop is not None and stop.should_stop())
            if i + 1 < remaining and checkpoint_or_stop(stopping):  # the last: see below
                return 3  # "stopped, resumable"
        rate = remaining * global_batch / (time.perf_counter() - t0)
        val = data.evaluate(model, test_set)  # exact: every sample counted once
        record = {"epoch": epoch, "train_loss": dist.allreduce(float(np.mean(losses)), "mean"),
                  "val_loss": val["loss"], "val_accuracy": val["accuracy"],
                  "samples_per_s": rate, "lr": sched.get_last_lr()[0]}
        if dist.is_root() and epoch not in logged:  # one line per epoch, across resumes
            with open(args.metrics, "a") as f:
                f.write(json.dumps(record) + "\n")
        dist.print0(f"epoch {epoch:3d}  loss {record['train_loss']:.4f}  val loss "
                    f"{val['loss']:.4f}  val accuracy {val['accuracy']:.4f} "
                    f"({val['count']} samples)  {rate:.0f} samples/s")
        losses = []
        if checkpoint_or_stop(stopping):  # at an epoch's end: after the epoch's line
            return 3

    if args.checkpoint_dir:
        save(args, step, model, opt, sched, loader, losses)
    prof.print_report()  # collective; nothing without --profile
    if args.plot and dist.is_root():
        plot(args.plot, args.metrics)
    return accuracy_check(data.evaluate(model, test_set), args.min_accuracy)


def accuracy_check(final, min_accuracy):
    """The self-check at the end: the exit code is 1 below --min-accuracy."""
    dist.print0(f"test accuracy {final['accuracy']:.4f} on {final['count']} samples")
    return cli.self_check(final["accuracy"] >= min_accuracy, f"test accuracy "
                          f"{final['accuracy']:.4f} < {min_accuracy}", "accuracy check passed")


if __name__ == "__main__":
    dist.finalize_and_exit(main())
