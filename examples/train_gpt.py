"""Train a small character-level GPT over MPI: data, tensor, pipeline or fully sharded.

    mpirun -n 4 python examples/train_gpt.py              # data parallel over 4 ranks
    mpirun -n 4 python examples/train_gpt.py --tp 2       # heads and vocabulary over 2
    mpirun -n 4 python examples/train_gpt.py --pp 2       # blocks in 2 pipeline stages
    mpirun -n 4 python examples/train_gpt.py --fsdp       # FullyShardedDataParallel

The model is written as minGPT writes it for PyTorch: token and position
embeddings, Blocks of LayerNorm -> causal self-attention (one qkv Linear,
heads split with view/transpose, F.scaled_dot_product_attention) and
LayerNorm -> MLP with GELU, each with a residual connection, a final
LayerNorm and an (untied) Linear head; the vocabulary is padded to a multiple
of 8 (and of --tp) in every mode. AdamW (no weight decay on biases and
LayerNorm weights), linear warmup then cosine decay, gradient clipping by the
global norm.

The ranks form a Mesh of dp x tp x pp (dp = ranks / (tp * pp)). --tp N splits
the attention heads (parallel.ParallelSelfAttention), the MLP (column ->
row parallel), the token embedding (VocabParallelEmbedding) and the head
(column parallel, loss by vocab_parallel_cross_entropy: the logits are never
gathered) over ``mesh.tp``; LayerNorms and position embeddings are
replicated. --pp N cuts the blocks into N stages (the first also embeds, the
last holds the head) run as a GPipe Pipeline of --micro-batches over
``mesh.pp``. DataParallel over ``mesh.dp`` averages each part's gradients;
--fsdp (with --tp 1 --pp 1) shards parameters, gradients and AdamW state
instead, every Block its own unit (one flat shard per unit and AdamW group,
``param_groups=``). Every mode starts from the weights of the
serial model of the same seed (the parallel parts load their slices of it),
so all modes train the same model.

With no --data it trains on the text the package ships (public-domain prose,
identical on every machine, no download); --data FILE takes any text file.
The text is split 90/10 into training and validation token files (HDF5,
written by rank 0 on first use); training windows start anywhere and are
shuffled per epoch by the DistributedSampler (over ``mesh.dp``), validation
windows do not overlap and every loss is reduced exactly. Prints the train
and validation losses and tokens per second, and at the end a sample that
all ranks generate together (rank 0 prints it); exits 1 unless the
validation loss is at most --max-ratio times the unigram entropy of the
training text (nats per character: the loss of the best model that ignores
context).

--checkpoint-dir DIR checkpoints every --checkpoint-every steps and at the
end, and resumes from the newest checkpoint there, exactly (model, AdamW,
scheduler, RNGs, the loader's position, the losses since the last report).
On SIGTERM or SIGUSR1 it checkpoints after the current step and exits with
code 3 ("stopped, resumable").
"""
import argparse
import hashlib
import json
import math
import re
import time
from pathlib import Path

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import cli, data, dist, nn, optim, parallel
from spmdnet.autograd import no_grad
from spmdnet.parallel.tensor_parallel import split_shard


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


class TPSelfAttention(nn.Module):
    """CausalSelfAttention with the heads split over ``tp`` (its c_attn is
    ``attn.in_proj_weight``/``in_proj_bias``, its c_proj ``attn.out_proj``)."""

    def __init__(self, n_embd, n_head, dropout, tp):
        super().__init__()
        if n_head % tp.Get_size():
            raise SystemExit(f"--n-head {n_head} is not a multiple of --tp {tp.Get_size()}")
        self.attn = parallel.ParallelSelfAttention(n_embd, n_head, tp, dropout=dropout)
        self.resid_drop = nn.Dropout(dropout)  # outside the TP region: the same mask

    def forward(self, x):
        return self.resid_drop(self.attn(x, is_causal=True))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout, tp=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        if tp is None:
            self.attn = CausalSelfAttention(n_embd, n_head, dropout)
            self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                     nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout))
        else:  # Megatron: column -> row parallel, one allreduce each way
            self.attn = TPSelfAttention(n_embd, n_head, dropout, tp)
            self.mlp = nn.Sequential(parallel.ColumnParallelLinear(n_embd, 4 * n_embd, tp),
                                     nn.GELU(), parallel.RowParallelLinear(4 * n_embd, n_embd, tp),
                                     nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The GPT, or a part of it: ``blocks`` (default all ``n_layer``), with the
    embeddings when ``first`` and the final LayerNorm and head when ``last``
    (a pipeline stage); tensor parallel over ``tp`` when given. Returns the
    logits (the vocabulary slice of this TP rank) when ``last``, else the
    activations."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0, tp=None,
                 blocks=None, first=True, last=True):
        super().__init__()
        self.block_size, self.tp, self.first, self.last = block_size, tp, first, last
        if first:
            self.wte = nn.Embedding(vocab_size, n_embd) if tp is None else \
                parallel.VocabParallelEmbedding(vocab_size, n_embd, tp)
            self.wpe = nn.Embedding(block_size, n_embd)
            self.drop = nn.Dropout(dropout)
        n = n_layer if blocks is None else blocks
        self.h = nn.ModuleList([Block(n_embd, n_head, dropout, tp) for _ in range(n)])
        if last:
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False) if tp is None else \
                parallel.ColumnParallelLinear(n_embd, vocab_size, tp, bias=False)

    def init_weights(self, n_layer):  # GPT-2's initialisation (of the serial model)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, x):
        if self.first:
            x = self.drop(self.wte(x) + self.wpe(sn.arange(x.shape[1])))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x  # (B, T, vocab) logits


SERIAL_NAMES = [(r"attn\.attn\.in_proj_(weight|bias)$", r"attn.c_attn.\1"),
                (r"attn\.attn\.out_proj\.", "attn.c_proj.")]


def load_part(part, serial_state, mesh, first_block):
    """Load this rank's part (blocks from ``first_block``, TP slices) of the
    serial model's state into ``part``."""
    local = {}
    for key, p in part.named_parameters():
        name = re.sub(r"^h\.(\d+)\.", lambda m: f"h.{int(m[1]) + first_block}.", key)
        for pattern, repl in SERIAL_NAMES:
            name = re.sub(pattern, repl, name)
        full = serial_state[name]
        axis = getattr(p, "tp_split_axis", None)
        local[key] = full if axis is None else split_shard(
            full, axis, mesh.tp_size, mesh.tp_rank, getattr(p, "tp_split_groups", 1))
    part.load_state_dict(local)


def decay_options(weight_decay):
    """AdamW's options for a parameter: decay on matrices, none on biases and LayerNorm."""
    return lambda name, p: {"weight_decay": weight_decay if p.ndim >= 2 else 0.0}


def padded_vocab(vocab_size, tp):
    multiple = 8 * tp // math.gcd(8, tp)
    return -(-vocab_size // multiple) * multiple


class Trainer:
    """This rank's part of the GPT, its data parallelism (DataParallel or
    FSDP over ``mesh.dp``) and, with pp > 1, its pipeline over ``mesh.pp``."""

    def __init__(self, args, mesh, vocab_size):
        if args.fsdp and (mesh.tp_size > 1 or mesh.pp_size > 1):
            raise SystemExit("--fsdp runs with --tp 1 --pp 1 (FSDP over a pipeline, or global "
                             "gradient clipping over FSDP shards of TP slices, is not supported)")
        if mesh.pp_size > args.n_layer:
            raise SystemExit(f"--pp {mesh.pp_size} exceeds --n-layer {args.n_layer}")
        if mesh.pp_size > 1 and args.batch_size % args.micro_batches:
            raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of "
                             f"--micro-batches {args.micro_batches}")
        self.mesh, self.args = mesh, args
        shape = (padded_vocab(vocab_size, mesh.tp_size), args.block_size, args.n_layer,
                 args.n_head, args.n_embd, args.dropout)
        sn.manual_seed(args.seed)  # the same on every rank
        serial = GPT(*shape)
        serial.init_weights(args.n_layer)
        self.n_params = sum(p.numel() for p in serial.parameters())
        if mesh.tp_size == 1 and mesh.pp_size == 1:
            self.module = serial
        else:
            bounds = np.linspace(0, args.n_layer, mesh.pp_size + 1).round().astype(int)
            lo, hi = bounds[mesh.pp_rank], bounds[mesh.pp_rank + 1]
            self.module = GPT(*shape, tp=mesh.tp if mesh.tp_size > 1 else None, blocks=hi - lo,
                              first=mesh.pp_rank == 0, last=mesh.pp_rank == mesh.pp_size - 1)
            load_part(self.module, serial.state_dict(), mesh, lo)
        sn.manual_seed(args.seed + 1)  # dropout streams: the same in every mode
        self.vocab_size, self.padded = vocab_size, shape[0]
        if args.fsdp:  # a flat shard per Block and optimizer group (see param_groups)
            self.ddp = parallel.FullyShardedDataParallel(
                self.module, comm=mesh.dp, wrap={Block},
                param_groups=decay_options(args.weight_decay))
        else:
            self.ddp = parallel.DataParallel(self.module, comm=mesh.dp)
        self.pipe = parallel.Pipeline(self.ddp, mesh.pp, args.micro_batches) \
            if mesh.pp_size > 1 else None

    def param_groups(self, weight_decay):
        """Weight decay on the matrices (Linear weights, embeddings) only, never
        on biases and LayerNorm weights."""
        if self.args.fsdp:
            return self.ddp.param_groups(decay_options(weight_decay))
        params = list(self.module.parameters())
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]

    def loss_fn(self, logits, y, reduction="mean"):
        logits = logits.reshape(-1, logits.shape[-1])
        y = np.asarray(y.data if isinstance(y, sn.Tensor) else y).reshape(-1)
        if self.mesh.tp_size == 1:
            return F.cross_entropy(logits, y, reduction=reduction)
        loss = parallel.vocab_parallel_cross_entropy(logits, y, self.mesh.tp)
        return loss * y.size if reduction == "sum" else loss

    def train_step(self, x, y, opt, grad_clip):
        """One optimisation step; returns the loss (the same on a TP group and a pipeline)."""
        opt.zero_grad()
        if self.pipe is not None:
            loss = self.pipe.train_step(x, y, self.loss_fn)
        else:
            out = self.loss_fn(self.ddp(sn.Tensor(x)), y)
            out.backward()  # returns with the gradients averaged over mesh.dp
            loss = out.item()
        self.clip(grad_clip)
        opt.step()
        return loss

    def clip(self, max_norm):
        """Clip by the norm of the whole model's gradient, as the serial model would."""
        if self.args.fsdp:
            return self.ddp.clip_grad_norm_(max_norm)
        params = [p for p in self.module.parameters() if p.grad is not None]
        if self.mesh.tp_size == 1 and self.mesh.pp_size == 1:
            return nn.utils.clip_grad_norm_(params, max_norm)
        local = sum(float((p.grad.data.astype(np.float64) ** 2).sum()) /
                    (1 if hasattr(p, "tp_split_axis") else self.mesh.tp_size) for p in params)
        # dp replicas hold the same gradients; TP-replicated ones count once
        total = math.sqrt(dist.allreduce(np.array(local), "sum").item() / self.mesh.dp_size)
        scale = max_norm / (total + 1e-6)
        if scale < 1.0:
            for p in params:
                p.grad.data *= scale
        return total

    def _forward(self, x):
        """The whole model's logits (this rank's vocabulary slice with tp > 1)."""
        if self.pipe is not None:
            return sn.Tensor(self.pipe.infer(x))
        return self.ddp(sn.Tensor(x)) if self.args.fsdp else self.module(sn.Tensor(x))

    @no_grad()
    def logits(self, x):
        """The full-vocabulary logits (an array) of the whole model, on every rank (collective)."""
        out = self._forward(x)
        if self.mesh.tp_size > 1:
            out = parallel.gather_from_group(out, self.mesh.tp)
        return out.numpy()

    def eval_loss_sum(self, x, y):
        """(sum of the losses, tokens) of the batch, on every rank of the TP group and pipeline."""
        with no_grad():
            return self.loss_fn(self._forward(x), y, reduction="sum").item(), y.size

    def train(self, mode=True):
        (self.ddp if self.args.fsdp else self.module).train(mode)

    def generate(self, idx, new_tokens, rng, temperature=1.0):
        """Sample ``new_tokens`` more tokens after ``idx`` (1, T), one at a
        time; collective: every rank draws the same tokens."""
        self.train(False)
        idx = np.asarray(idx, dtype=np.int64)
        for _ in range(new_tokens):
            logits = self.logits(idx[:, -self.args.block_size:])
            logits = logits[:, -1, :self.vocab_size].astype(np.float64)  # not the padding
            p = np.exp((logits - logits.max(axis=-1, keepdims=True)) / temperature)
            nxt = [[rng.choice(p.shape[-1], p=row / row.sum())] for row in p]
            idx = np.concatenate([idx, np.array(nxt, dtype=np.int64)], axis=1)
        self.train(True)
        return idx

    @property
    def checkpointed(self):
        """What sn.save_checkpoint saves: FSDP (its full state), else this rank's part."""
        return self.ddp if self.args.fsdp else self.module


GLOBAL_BATCH = 32  # windows per step, by default


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="a text file (default: the text the package ships)")
    p.add_argument("--data-dir", default="data", help="where the token files are written")
    p.add_argument("--steps", type=cli.positive_int, default=400)
    p.add_argument("--batch-size", type=cli.positive_int, help="windows per data-parallel "
                   f"rank per step (default: a global batch of {GLOBAL_BATCH} in every mode)")
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
    for flag, default, what in (("--tp", 1, "tensor-parallel group size"),
                                ("--pp", 1, "pipeline stages"),
                                ("--micro-batches", 4, "per step, with --pp > 1")):
        p.add_argument(flag, type=cli.positive_int, default=default, help=what)
    p.add_argument("--fsdp", action="store_true",
                   help="FullyShardedDataParallel instead of DataParallel (--tp 1 --pp 1)")
    p.add_argument("--checkpoint-dir", help="checkpoint here and resume from here")
    p.add_argument("--checkpoint-every", type=cli.non_negative_int, default=0,
                   help="steps (0: only at the end and on a stop)")
    p.add_argument("--stop-after", type=cli.non_negative_int, default=0,
                   help="checkpoint and stop after this many steps (tests resumption)")
    return p.parse_args(argv)


def options(args):
    """What a resumed run must share with the run it continues."""
    return {k: getattr(args, k) for k in (
        "steps", "batch_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "lr",
        "weight_decay", "warmup", "grad_clip", "eval_every", "seed", "tp", "pp",
        "micro_batches", "fsdp")}


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


def save(args, step, trainer, opt, sched, loader, losses):
    """A checkpoint (collective), with every rank's losses since the last report."""
    losses = dist.allgather(np.array(losses, np.float64)).tolist()
    sn.save_checkpoint(args.checkpoint_dir + "/", trainer.checkpointed, opt, step=step,
                       mesh=trainer.mesh, loader=loader.state_dict(),
                       scheduler=sched.state_dict(), options=options(args), losses=losses)


def resume(args, trainer, opt, sched, loader):
    """Continue from the newest checkpoint in --checkpoint-dir, if any;
    returns (steps done, this rank's losses since the last report)."""
    found = sn.latest_checkpoint(args.checkpoint_dir) if args.checkpoint_dir else None
    if dist.check_same(dist.comm_or_default(), found, "newest checkpoint") is None:
        return 0, []
    extra = sn.load_checkpoint(found, trainer.checkpointed, opt, mesh=trainer.mesh)
    differ = {k: (v, getattr(args, k)) for k, v in extra["options"].items()
              if v != getattr(args, k)}
    if differ:
        raise SystemExit(f"{found}: options (saved, now) {differ} differ: resume with the "
                         "saved ones or use another --checkpoint-dir")
    sched.load_state_dict(extra["scheduler"])
    loader.load_state_dict(extra["loader"])
    dist.print0(f"resumed from {found} at step {extra['step']}")
    return extra["step"], extra["losses"][dist.rank()]


def main(argv=None):
    args = parse_args(argv)
    dist.init()
    if args.checkpoint_dir:  # unusable: fail now, not at the first save
        sn.check_checkpoint_dir(args.checkpoint_dir)
    try:
        mesh = dist.Mesh(tp=args.tp, pp=args.pp)
    except ValueError as exc:  # tp * pp does not divide the ranks
        raise SystemExit(str(exc)) from None
    args.batch_size = args.batch_size or max(1, GLOBAL_BATCH // mesh.dp_size)
    train_path, val_path, vocab_path = token_files(args)
    tok = data.CharTokenizer.from_state_dict(json.loads(Path(vocab_path).read_text("utf-8")))
    train_set = data.TokenDataset(train_path, args.block_size, windows="all")
    val_set = data.TokenDataset(val_path, args.block_size, windows="strided")
    entropy = data.unigram_entropy(train_set.tokens, tok.vocab_size)

    trainer = Trainer(args, mesh, tok.vocab_size)
    opt = optim.AdamW(trainer.param_groups(args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    sched = optim.lr_scheduler.WarmupCosine(opt, min(args.warmup, args.steps), args.steps,
                                            min_lr=args.lr / 10)
    # every rank of a TP group and of a pipeline reads the same windows
    sampler = data.DistributedSampler(train_set, seed=args.seed, drop_last=True, comm=mesh.dp)
    loader = data.DataLoader(train_set, args.batch_size, sampler=sampler, drop_last=True)
    tokens_per_step = args.batch_size * args.block_size * mesh.dp_size
    mode = " FSDP" if args.fsdp else ""
    dist.print0(f"{dist.size()} ranks (dp {mesh.dp_size} x tp {mesh.tp_size} x pp "
                f"{mesh.pp_size}{mode}), {trainer.n_params} parameters, vocabulary "
                f"{tok.vocab_size} (padded to {trainer.padded}), {len(train_set.tokens)} "
                f"training and {len(val_set.tokens)} validation characters, unigram entropy "
                f"{entropy:.3f} nats, {tokens_per_step} tokens/step")

    def validate():  # exact: every non-overlapping validation window once, over mesh.dp
        trainer.train(False)
        total = np.zeros(2)  # loss sum, tokens
        index = data.shard_indices(len(val_set), mesh.dp_rank, mesh.dp_size)
        for start in range(0, len(index), 64):  # the same number of batches on a TP group
            total += trainer.eval_loss_sum(*val_set[index[start:start + 64]])
        trainer.train(True)
        total = dist.allreduce(total, "sum", comm=mesh.dp)
        return total[0] / total[1]

    step, losses = resume(args, trainer, opt, sched, loader)
    stop = dist.StopSignal() if args.checkpoint_dir else None  # SIGTERM, SIGUSR1
    t0, val, done = time.perf_counter(), float("nan"), len(losses)
    while step < args.steps:
        sampler.set_epoch(sampler.epoch)  # a resumed run continues its epoch
        for x, y in data.progress(loader, f"epoch {sampler.epoch}"):
            losses.append(trainer.train_step(x, y, opt, args.grad_clip))
            sched.step()
            step += 1
            if step % args.eval_every == 0 or step == args.steps:
                rate = (len(losses) - done) * tokens_per_step / (time.perf_counter() - t0)
                train_loss = dist.allreduce(float(np.mean(losses)), "mean")
                val = validate()
                dist.print0(f"step {step:5d}  train loss {train_loss:.4f}  val loss "
                            f"{val:.4f}  lr {sched.get_last_lr()[0]:.2e}  {rate:.0f} tokens/s")
                losses, t0, done = [], time.perf_counter(), 0
            stopping = step == args.stop_after or (stop is not None and stop.should_stop())
            every = args.checkpoint_every and step % args.checkpoint_every == 0
            if args.checkpoint_dir and (stopping or every or step == args.steps):
                save(args, step, trainer, opt, sched, loader, losses)
            if stopping and step < args.steps:
                dist.print0(f"stopped after step {step} with a checkpoint in "
                            f"{args.checkpoint_dir}; run again to resume")
                return 3  # "stopped, resumable"
            if step == args.steps:
                break
        else:
            sampler.set_epoch(sampler.epoch + 1)
    if math.isnan(val):  # resumed from the final checkpoint: nothing left to train
        val = validate()

    if args.sample_tokens:  # every rank takes part; rank 0 prints
        prompt = val_set.tokens[None, :1]  # the first validation token
        out = trainer.generate(prompt, args.sample_tokens, np.random.default_rng(args.seed))
        dist.print0("sample:\n" + tok.decode(out[0]))
    limit = args.max_ratio * entropy
    return cli.self_check(val <= limit, f"validation loss {val:.4f} > {args.max_ratio} x "
                          f"unigram entropy {entropy:.4f} = {limit:.4f}",
                          f"loss check passed: validation loss {val:.4f} <= {limit:.4f} "
                          f"({val / entropy:.3f} x the unigram entropy)")


if __name__ == "__main__":
    dist.finalize_and_exit(main())
