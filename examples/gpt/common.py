"""What the GPT trainers beside this file share besides the model: their
options, the text data, the optimizer and schedule, the training loop with
its checkpoints, validation, sampling and the final check.

With no --data it trains on the text the package ships (public-domain prose,
no download); --data FILE takes any text file. Prints the train and
validation losses and tokens per second every --eval-every steps, then a
sample of generated text, and exits 1 unless the validation loss is at most
--max-ratio times the unigram entropy of the training text.

--checkpoint-dir DIR checkpoints every --checkpoint-every steps and at the
end, and resumes from the newest checkpoint there, exactly; also with another
data-parallel size (the same tp and pp) when the global batch is kept. On SIGTERM or
SIGUSR1 it checkpoints after the current step and exits with code 3
("stopped, resumable").
"""
import argparse
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np

from spmdnet import cli, data, dist, optim
from spmdnet.autograd import no_grad
from spmdnet.checkpoint import check_checkpoint_dir, resume, save_checkpoint

GLOBAL_BATCH = 32  # windows per step, by default
# what a resumed run may change; --batch-size too when the data-parallel size
# changes with it: the global batch is the option then (setup's global_batch)
NOT_OPTIONS = ("checkpoint_dir", "checkpoint_every", "stop_after", "data_dir", "sample_tokens",
               "max_ratio", "batch_size")


def parser(description):
    """The options every trainer has."""
    p = argparse.ArgumentParser(description=description.split("\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a text file (default: the text the package ships)")
    p.add_argument("--data-dir", default="data", help="where the token files are written")
    p.add_argument("--steps", type=cli.positive_int, default=400)
    p.add_argument("--batch-size", type=cli.positive_int, help="windows per data-parallel "
                   f"rank per step (default: a global batch of {GLOBAL_BATCH})")
    p.add_argument("--block-size", type=cli.positive_int, default=64)
    p.add_argument("--n-layer", type=cli.positive_int, default=2)
    p.add_argument("--n-head", type=cli.positive_int, default=4)
    p.add_argument("--n-embd", type=cli.positive_int, default=64)
    p.add_argument("--dropout", type=cli.probability, default=0.0)
    p.add_argument("--lr", type=cli.positive_float, default=3e-3)
    p.add_argument("--weight-decay", type=cli.probability, default=0.1)
    p.add_argument("--warmup", type=cli.non_negative_int, default=30, help="steps")
    p.add_argument("--grad-clip", type=cli.positive_float, default=1.0)
    p.add_argument("--eval-every", type=cli.positive_int, default=100, help="steps")
    p.add_argument("--sample-tokens", type=cli.non_negative_int, default=200)
    p.add_argument("--seed", type=cli.non_negative_int, default=0)
    p.add_argument("--max-ratio", type=cli.positive_float, default=0.75,
                   help="the check: validation loss <= this times the unigram entropy")
    p.add_argument("--checkpoint-dir", help="checkpoint here and resume from here")
    p.add_argument("--checkpoint-every", type=cli.non_negative_int, default=0,
                   help="steps (0: only at the end and on a stop)")
    p.add_argument("--stop-after", type=cli.non_negative_int, default=0,
                   help="checkpoint and stop after this many steps (tests resumption)")
    return p


def setup(p, argv, **sizes):
    """Parse the options, start MPI and read the text: ``(args, mesh, training
    windows, validation windows, tokenizer, unigram entropy)``. ``sizes`` are
    the mesh's (``tp=``, ``pp=``); without them the mesh is None and every
    rank is a data-parallel rank."""
    args = p.parse_args(argv)
    dist.init()
    if args.checkpoint_dir:  # unusable: fail now, not at the first save
        check_checkpoint_dir(args.checkpoint_dir)
    mesh = None
    if sizes:
        try:
            mesh = dist.Mesh(**{k: getattr(args, k) for k in sizes})
        except ValueError as exc:  # a size does not divide the ranks
            raise SystemExit(str(exc)) from None
    dp_size = mesh.dp_size if mesh is not None else dist.size()
    args.batch_size = args.batch_size or max(1, GLOBAL_BATCH // dp_size)
    args.global_batch = args.batch_size * dp_size
    return (args, mesh, *text_data(args))


def announce(args, mesh, n_params, tok, train_set, entropy, strategy=""):
    """Print the run's shape (rank 0); returns the tokens trained per step."""
    dp, tp, pp = (dist.size(), 1, 1) if mesh is None else (mesh.dp_size, mesh.tp_size,
                                                              mesh.pp_size)
    tokens_per_step = args.batch_size * args.block_size * dp
    dist.print0(f"{dist.size()} ranks (dp {dp} x tp {tp} x pp {pp}{strategy}), {n_params} "
                f"parameters, vocabulary {tok.vocab_size}, {len(train_set.tokens)} training "
                f"characters, unigram entropy {entropy:.3f} nats, {tokens_per_step} tokens/step")
    return tokens_per_step


def adamw_with_schedule(param_groups, args):
    """minGPT's AdamW and a linear warmup then cosine decay to lr/10."""
    opt = optim.AdamW(param_groups, lr=args.lr, betas=(0.9, 0.95))
    sched = optim.lr_scheduler.WarmupCosine(opt, min(args.warmup, args.steps), args.steps,
                                            min_lr=args.lr / 10)
    return opt, sched


def loader(train_set, args, comm=None):
    """This rank's windows: a DistributedSampler over ``comm`` (the data-parallel
    group; the ranks of a TP group or of a pipeline read the same windows)."""
    sampler = data.DistributedSampler(train_set, seed=args.seed, drop_last=True, comm=comm)
    loader = data.DataLoader(train_set, args.batch_size, sampler=sampler, drop_last=True)
    # an empty epoch would loop for ever below: stop, naming the numbers
    cli.require_steps(loader, train_set, args.batch_size, sampler.num_replicas)
    return loader


def options(args):
    """What a resumed run must share with the run it continues."""
    return {k: v for k, v in vars(args).items() if k not in NOT_OPTIONS}


def text_data(args):
    """(training windows, validation windows, tokenizer, unigram entropy) of
    --data (default: the text the package ships). The token files are written
    on first use (by rank 0), named by the text's hash so another --data never
    reuses them; training windows start anywhere, validation windows do not
    overlap."""
    text = data.datasets.read_text(args.data)
    name = "text_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    out = Path(args.data_dir)
    paths = tuple(str(out / f"{name}_{part}") for part in ("train.h5", "val.h5", "vocab.json"))
    exists = dist.allreduce(float(all(Path(p).exists() for p in paths)), "min")  # every rank
    if not exists:
        paths = data.datasets.make_text(text, out, name=name)
    tok = data.CharTokenizer.from_state_dict(json.loads(Path(paths[2]).read_text("utf-8")))
    train_set = data.TokenDataset(paths[0], args.block_size, windows="all")
    val_set = data.TokenDataset(paths[1], args.block_size, windows="strided")
    return train_set, val_set, tok, data.unigram_entropy(train_set.tokens, tok.vocab_size)


@no_grad()
def validate(model, loss_sum, val_set, comm=None):
    """The mean loss over every validation window once, the windows split over
    the ranks of ``comm`` (the data-parallel ranks): exact. ``loss_sum(x, y)``
    is the summed loss of a batch, computed with ``model`` in eval mode."""
    comm = dist.comm_or_default(comm)
    model.eval()
    total = np.zeros(2)  # loss sum, tokens
    index = data.shard_indices(len(val_set), comm.Get_rank(), comm.Get_size())
    for start in range(0, len(index), 64):  # the same number of batches on a TP group
        x, y = val_set[index[start:start + 64]]
        total += (loss_sum(x, y), y.size)
    model.train()
    total = dist.allreduce(total, "sum", comm=comm)
    return total[0] / total[1]


def generate(logits, prompt, new_tokens, vocab_size, block_size, seed, temperature=1.0):
    """Sample ``new_tokens`` tokens after ``prompt`` (1, T), one at a time;
    ``logits(x)`` gives the full-vocabulary logits of the whole model on every
    rank, so every rank draws the same tokens."""
    rng = np.random.default_rng(seed)
    idx = np.asarray(prompt, dtype=np.int64)
    for _ in range(new_tokens):
        last = logits(idx[:, -block_size:])[:, -1, :vocab_size].astype(np.float64)
        p = np.exp((last - last.max(axis=-1, keepdims=True)) / temperature)
        nxt = [[rng.choice(p.shape[-1], p=row / row.sum())] for row in p]
        idx = np.concatenate([idx, np.array(nxt, dtype=np.int64)], axis=1)
    return idx


def report(step, losses, val, lr, tokens_per_second):
    """Print the line every trainer prints (rank 0): the training loss of
    ``losses`` (since the last report) averaged over all ranks, the validation
    loss, the learning rate and the speed."""
    train_loss = dist.allreduce(float(np.mean(losses)), "mean")
    dist.print0(f"step {step:5d}  train loss {train_loss:.4f}  val loss {val:.4f}  "
                f"lr {lr:.2e}  {tokens_per_second:.0f} tokens/s")


def finish(args, model, logits, val, val_set, tok, entropy):
    """After training: print --sample-tokens of generated text (``logits(x)``:
    the whole model's logits of a batch of token ids, the same on every rank;
    collective where the model is), then the loss check's exit code."""
    if args.sample_tokens:
        model.train(False)
        with no_grad():
            out = generate(logits, val_set.tokens[None, :1], args.sample_tokens,
                           tok.vocab_size, args.block_size, args.seed)
        dist.print0("sample:\n" + tok.decode(out[0]))
    return loss_check(val, entropy, args.max_ratio)


def loss_check(val, entropy, max_ratio):
    """The self-check at the end: the exit code is 1 unless the validation loss
    is at most ``max_ratio`` times the unigram entropy of the training text
    (nats per character: the loss of the best model that ignores context)."""
    limit = max_ratio * entropy
    return cli.self_check(val <= limit, f"validation loss {val:.4f} > {max_ratio} x "
                          f"unigram entropy {entropy:.4f} = {limit:.4f}",
                          f"loss check passed: validation loss {val:.4f} <= {limit:.4f} "
                          f"({val / entropy:.3f} x the unigram entropy)")


def resumed_losses(saved):
    """This rank's share of the checkpoint's losses since the last report
    (``saved``: one list per saved rank). On as many ranks, its own: the
    report is then the uninterrupted run's. On another number (another
    data-parallel size), every rank takes each saved step's mean over the
    saved ranks, the step's loss as ``report`` averages it."""
    if len(saved) == dist.size():
        return saved[dist.rank()]
    return np.mean(np.array(saved, np.float64), axis=0).tolist()


def train(args, model, opt, sched, loader, train_step, loss_sum, val_set, tokens_per_step,
          comm=None, **where):
    """The training loop every trainer shares: resume from --checkpoint-dir,
    step, report every --eval-every steps (validating with ``loss_sum`` over
    ``val_set`` split over ``comm``, the data-parallel ranks), checkpoint,
    stop on a signal. ``where`` is the checkpoint's layout (``mesh=`` for
    tp/pp). Returns ``(exit_code, val)``: exit code 3 when stopped resumable,
    else None."""
    def validate_all():
        return validate(model, loss_sum, val_set, comm)

    def save(step, losses):  # with every rank's losses since the last report
        losses = dist.allgather(np.array(losses, np.float64)).tolist()
        save_checkpoint(args.checkpoint_dir + "/", model, opt, step=step, loader=loader,
                        scheduler=sched, options=options(args), losses=losses, **where)

    extra = resume(args.checkpoint_dir, model, opt, scheduler=sched, loader=loader,
                   options=options(args), **where)
    step, losses = 0, []
    if extra is not None:
        step, losses = extra["step"], resumed_losses(extra["losses"])
        dist.print0(f"resumed from {args.checkpoint_dir} at step {step}")
    sampler = loader.sampler
    stop = dist.StopSignal() if args.checkpoint_dir else None  # SIGTERM, SIGUSR1
    val, t0, timed = float("nan"), time.perf_counter(), 0
    while step < args.steps:
        sampler.set_epoch(sampler.epoch)  # a resumed run continues its epoch
        for x, y in data.progress(loader, f"epoch {sampler.epoch}"):
            losses.append(train_step(x, y))
            step, timed = step + 1, timed + 1
            if step % args.eval_every == 0 or step == args.steps:
                rate = timed * tokens_per_step / (time.perf_counter() - t0)
                val = validate_all()
                report(step, losses, val, sched.get_last_lr()[0], rate)
                losses, t0, timed = [], time.perf_counter(), 0
            stopping = step == args.stop_after or (stop is not None and stop.should_stop())
            every = args.checkpoint_every and step % args.checkpoint_every == 0
            if args.checkpoint_dir and (stopping or every or step == args.steps):
                save(step, losses)
            if stopping and step < args.steps:
                dist.print0(f"stopped after step {step} with a checkpoint in "
                            f"{args.checkpoint_dir}; run again to resume")
                return 3, val  # "stopped, resumable"
            if step == args.steps:
                break
        else:
            sampler.set_epoch(sampler.epoch + 1)
    if math.isnan(val):  # resumed from the final checkpoint: nothing left to train
        val = validate_all()
    return None, val
