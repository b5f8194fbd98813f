"""What the GPT trainers beside this file share besides the model: their
options, the text data, validation, sampling and the final check."""
import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from spmdnet import cli, data, dist

GLOBAL_BATCH = 32  # windows per step, by default
NOT_OPTIONS = ("checkpoint_dir", "checkpoint_every", "stop_after", "data_dir", "sample_tokens",
               "max_ratio")  # what a resumed run may change


def parser(description):
    """The options every trainer has."""
    p = argparse.ArgumentParser(description=description.split("\n")[0])
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


def validate(loss_sum, val_set, comm=None):
    """The mean loss over every validation window once, the windows split over
    the ranks of ``comm`` (the data-parallel ranks): exact. ``loss_sum(x, y)``
    is the summed loss of a batch."""
    comm = dist.comm_or_default(comm)
    total = np.zeros(2)  # loss sum, tokens
    index = data.shard_indices(len(val_set), comm.Get_rank(), comm.Get_size())
    for start in range(0, len(index), 64):  # the same number of batches on a TP group
        x, y = val_set[index[start:start + 64]]
        total += (loss_sum(x, y), y.size)
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


def loss_check(val, entropy, max_ratio):
    """The self-check at the end: the exit code is 1 unless the validation loss
    is at most ``max_ratio`` times the unigram entropy of the training text
    (nats per character: the loss of the best model that ignores context)."""
    limit = max_ratio * entropy
    return cli.self_check(val <= limit, f"validation loss {val:.4f} > {max_ratio} x "
                          f"unigram entropy {entropy:.4f} = {limit:.4f}",
                          f"loss check passed: validation loss {val:.4f} <= {limit:.4f} "
                          f"({val / entropy:.3f} x the unigram entropy)")
