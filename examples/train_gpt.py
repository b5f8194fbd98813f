"""Train a small character-level GPT with data parallelism over every MPI rank.

    mpirun -n 4 python examples/train_gpt.py

The model is written as minGPT writes it for PyTorch: token and position
embeddings, Blocks of LayerNorm -> causal self-attention (one qkv Linear,
heads split with view/transpose, F.scaled_dot_product_attention) and
LayerNorm -> MLP with GELU, each with a residual connection, a final
LayerNorm and an (untied) Linear head. DataParallel averages the gradients
over the ranks; AdamW (no weight decay on biases and LayerNorm weights: two
parameter groups), linear warmup then cosine decay, gradient clipping.

With no --data it trains on the text the package ships (public-domain prose,
identical on every machine, no download); --data FILE takes any text file.
The text is split 90/10 into training and validation token files (HDF5,
written by rank 0 on first use); training windows start anywhere and are
shuffled per epoch by the DistributedSampler, validation windows do not
overlap and every rank's loss is reduced exactly. Prints the train and
validation losses and tokens per second, and at the end a sample generated
on rank 0; exits 1 unless the validation loss is at most --max-ratio times
the unigram entropy of the training text (nats per character: the loss of
the best model that ignores context).
"""
import argparse
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import cli, data, dist, nn, optim, parallel
from spmdnet.autograd import no_grad


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        if n_embd % n_head:
            raise SystemExit(f"--n-embd {n_embd} is not a multiple of --n-head {n_head}")
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)  # q, k, v of every head at once
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_drop(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        B, T = idx.shape
        pos = sn.arange(T)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab) logits

    @no_grad()
    def generate(self, idx, new_tokens, rng, temperature=1.0):
        """Sample ``new_tokens`` more tokens after ``idx`` (1, T), one at a time."""
        was_training = self.training
        self.eval()
        idx = np.asarray(idx, dtype=np.int64)
        for _ in range(new_tokens):
            logits = self(idx[:, -self.block_size:]).numpy()[:, -1, :].astype(np.float64)
            p = np.exp((logits - logits.max(axis=-1, keepdims=True)) / temperature)
            nxt = [[rng.choice(p.shape[-1], p=row / row.sum())] for row in p]
            idx = np.concatenate([idx, np.array(nxt, dtype=np.int64)], axis=1)
        self.train(was_training)
        return idx


def param_groups(model, weight_decay):
    """Weight decay on the matrices (Linear weights, embeddings) only, never
    on biases and LayerNorm weights."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="a text file (default: the text the package ships)")
    p.add_argument("--data-dir", default="data", help="where the token files are written")
    p.add_argument("--steps", type=cli.positive_int, default=400)
    p.add_argument("--batch-size", type=cli.positive_int, default=8,
                   help="windows per rank per step")
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
    return p.parse_args(argv)


def token_files(args):
    """(train, validation, vocabulary) paths; written on first use, named by
    the text's hash so another --data never reuses them."""
    text = data.datasets.read_text(args.data)
    name = "text_" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    out = Path(args.data_dir)
    paths = tuple(str(out / f"{name}_{part}") for part in ("train.h5", "val.h5", "vocab.json"))
    exists = dist.allreduce(float(all(Path(p).exists() for p in paths)), "min")  # every rank
    if not exists:
        paths = data.datasets.make_text(text, out, name=name)
    return paths


def main(argv=None):
    args = parse_args(argv)
    dist.init()
    sn.manual_seed(args.seed)
    train_path, val_path, vocab_path = token_files(args)
    tok = data.CharTokenizer.from_state_dict(json.loads(Path(vocab_path).read_text("utf-8")))
    train_set = data.TokenDataset(train_path, args.block_size, windows="all")
    val_set = data.TokenDataset(val_path, args.block_size, windows="strided")
    entropy = data.unigram_entropy(train_set.tokens, tok.vocab_size)

    model = GPT(tok.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd,
                args.dropout)
    ddp = parallel.DataParallel(model)  # rank 0's weights everywhere; gradients averaged
    opt = optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    sched = optim.lr_scheduler.WarmupCosine(opt, min(args.warmup, args.steps), args.steps,
                                            min_lr=args.lr / 10)
    sampler = data.DistributedSampler(train_set, seed=args.seed, drop_last=True)
    loader = data.DataLoader(train_set, args.batch_size, sampler=sampler, drop_last=True)
    tokens_per_step = args.batch_size * args.block_size * dist.size()
    dist.print0(f"{dist.size()} ranks, {sum(p.numel() for p in model.parameters())} "
                f"parameters, vocabulary {tok.vocab_size}, {len(train_set.tokens)} training "
                f"and {len(val_set.tokens)} validation characters, unigram entropy "
                f"{entropy:.3f} nats, {tokens_per_step} tokens/step")

    def validate():  # exact: every non-overlapping validation window once, over the ranks
        model.eval()
        total = np.zeros(2)  # loss sum, tokens
        index = data.shard_indices(len(val_set), dist.rank(), dist.size())
        with no_grad():
            for start in range(0, len(index), 64):
                x, y = val_set[index[start:start + 64]]
                logits = model(sn.Tensor(x))
                total += (F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1),
                                          reduction="sum").item(), y.size)
        model.train()
        total = dist.allreduce(total, "sum")
        return total[0] / total[1]

    step, losses, t0, val = 0, [], time.perf_counter(), float("nan")
    while step < args.steps:
        sampler.set_epoch(sampler.epoch + (step > 0))
        for x, y in data.progress(loader, f"epoch {sampler.epoch}"):
            logits = ddp(sn.Tensor(x))
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
            opt.zero_grad()
            loss.backward()  # returns with the gradients averaged over all ranks
            nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            opt.step()
            sched.step()
            losses.append(loss.item())
            step += 1
            if step % args.eval_every == 0 or step == args.steps:
                rate = len(losses) * tokens_per_step / (time.perf_counter() - t0)
                train_loss = dist.allreduce(float(np.mean(losses)), "mean")
                val = validate()
                dist.print0(f"step {step:5d}  train loss {train_loss:.4f}  val loss "
                            f"{val:.4f}  lr {sched.get_last_lr()[0]:.2e}  {rate:.0f} tokens/s")
                losses, t0 = [], time.perf_counter()
            if step == args.steps:
                break

    if dist.is_root() and args.sample_tokens:
        prompt = tok.encode(tok.decode(val_set.tokens[:1]))[None]
        out = model.generate(prompt, args.sample_tokens, np.random.default_rng(args.seed))
        print("sample:\n" + tok.decode(out[0]))
    limit = args.max_ratio * entropy
    return cli.self_check(val <= limit, f"validation loss {val:.4f} > {args.max_ratio} x "
                          f"unigram entropy {entropy:.4f} = {limit:.4f}",
                          f"loss check passed: validation loss {val:.4f} <= {limit:.4f} "
                          f"({val / entropy:.3f} x the unigram entropy)")


if __name__ == "__main__":
    dist.finalize_and_exit(main())
