"""Train a small character-level GPT, tensor parallel (Megatron-style) x data parallel.

    mpirun -n 4 python examples/gpt/train_tp.py --tp 2

The ranks form a Mesh of dp x tp (dp = ranks / tp; a tensor-parallel group
is adjacent ranks). The model of model.py beside this file splits the
attention heads, the MLP (column -> row parallel), the token embedding and
the head over ``mesh.tp``: the loss is computed from the vocabulary slices
(vocab_parallel_cross_entropy), the logits are never gathered; LayerNorms
and position embeddings are replicated. Every rank loads its slices of the
serial model of the seed, so this trains what train_dp.py trains and prints
the same loss lines. DataParallel over ``mesh.dp`` averages the gradients;
the ranks of a TP group read the same windows. Gradients are clipped by the
norm of the whole model's gradient (parallel.clip_grad_norm_, counting each
replicated gradient once).

With no --data it trains on the text the package ships (public-domain prose,
no download); --data FILE takes any text file. Prints the train and
validation losses and tokens per second every --eval-every steps, then a
sample of generated text, and exits 1 unless the validation loss is at most
--max-ratio times the unigram entropy of the training text.

--checkpoint-dir DIR checkpoints every --checkpoint-every steps and at the
end, and resumes from the newest checkpoint there, exactly. On SIGTERM or
SIGUSR1 it checkpoints after the current step and exits with code 3
("stopped, resumable").
"""
import math
import time

import numpy as np

import spmdnet as sn
from spmdnet import cli, data, dist, optim, parallel
from spmdnet.autograd import no_grad
from spmdnet.checkpoint import resume

import common  # examples/gpt/, the script's folder
from model import GPT, cross_entropy, load_part, padded_vocab, param_groups, serial_gpt


def main(argv=None):
    p = common.parser(__doc__)
    p.add_argument("--tp", type=cli.positive_int, default=2, help="tensor-parallel group size")
    args = p.parse_args(argv)
    dist.init()
    if args.checkpoint_dir:  # unusable: fail now, not at the first save
        sn.check_checkpoint_dir(args.checkpoint_dir)
    try:
        mesh = dist.Mesh(tp=args.tp)
    except ValueError as exc:  # tp does not divide the ranks
        raise SystemExit(str(exc)) from None
    args.batch_size = args.batch_size or max(1, common.GLOBAL_BATCH // mesh.dp_size)
    train_set, val_set, tok, entropy = common.text_data(args)
    serial = serial_gpt(tok.vocab_size, args, mesh.tp_size)
    model = GPT(padded_vocab(tok.vocab_size, mesh.tp_size), args.block_size, args.n_layer,
                args.n_head, args.n_embd, args.dropout, tp=mesh.tp)
    load_part(model, serial.state_dict(), mesh, first_block=0)  # this rank's slices
    sn.manual_seed(args.seed + 1)  # dropout streams: the same in every trainer
    ddp = parallel.DataParallel(model, comm=mesh.dp)  # gradients averaged over mesh.dp
    opt = optim.AdamW(param_groups(model.parameters(), args.weight_decay), lr=args.lr,
                      betas=(0.9, 0.95))
    sched = optim.lr_scheduler.WarmupCosine(opt, min(args.warmup, args.steps), args.steps,
                                            min_lr=args.lr / 10)
    # every rank of a TP group reads the same windows
    sampler = data.DistributedSampler(train_set, seed=args.seed, drop_last=True, comm=mesh.dp)
    loader = data.DataLoader(train_set, args.batch_size, sampler=sampler, drop_last=True)
    tokens_per_step = args.batch_size * args.block_size * mesh.dp_size
    dist.print0(f"{dist.size()} ranks (dp {mesh.dp_size} x tp {mesh.tp_size} x pp 1), "
                f"{sum(p.numel() for p in serial.parameters())} parameters, vocabulary "
                f"{tok.vocab_size}, {len(train_set.tokens)} training characters, unigram "
                f"entropy {entropy:.3f} nats, {tokens_per_step} tokens/step")

    def copies(p):  # ranks holding the same gradient: dp replicas, and a TP group unless split
        return mesh.dp_size * (1 if hasattr(p, "tp_split_axis") else mesh.tp_size)

    def train_step(x, y):
        opt.zero_grad()
        loss = cross_entropy(ddp(sn.Tensor(x)), y, tp=mesh.tp)
        loss.backward()  # returns with the gradients averaged over mesh.dp
        # clip by the norm of the whole model's gradient, each gradient counted once
        parallel.clip_grad_norm_(model.parameters(), args.grad_clip, copies=copies)
        opt.step()
        sched.step()
        return loss.item()

    @no_grad()
    def validate():
        model.eval()
        val = common.validate(lambda x, y: cross_entropy(model(sn.Tensor(x)), y, tp=mesh.tp,
                                                         reduction="sum").item(), val_set,
                              comm=mesh.dp)
        model.train()
        return val

    def save(step, losses):  # with every rank's losses since the last report
        losses = dist.allgather(np.array(losses, np.float64)).tolist()
        sn.save_checkpoint(args.checkpoint_dir + "/", model, opt, step=step, mesh=mesh,
                           loader=loader, scheduler=sched, options=common.options(args),
                           losses=losses)

    extra = resume(args.checkpoint_dir, model, opt, scheduler=sched, loader=loader,
                   options=common.options(args), mesh=mesh)
    step, losses = 0, []
    if extra is not None:
        step, losses = extra["step"], extra["losses"][dist.rank()]
        dist.print0(f"resumed from {args.checkpoint_dir} at step {step}")
    stop = dist.StopSignal() if args.checkpoint_dir else None  # SIGTERM, SIGUSR1
    val, t0, timed = float("nan"), time.perf_counter(), 0
    while step < args.steps:
        sampler.set_epoch(sampler.epoch)  # a resumed run continues its epoch
        for x, y in data.progress(loader, f"epoch {sampler.epoch}"):
            losses.append(train_step(x, y))
            step, timed = step + 1, timed + 1
            if step % args.eval_every == 0 or step == args.steps:
                rate = timed * tokens_per_step / (time.perf_counter() - t0)
                val = validate()
                common.report(step, losses, val, sched.get_last_lr()[0], rate)
                losses, t0, timed = [], time.perf_counter(), 0
            stopping = step == args.stop_after or (stop is not None and stop.should_stop())
            every = args.checkpoint_every and step % args.checkpoint_every == 0
            if args.checkpoint_dir and (stopping or every or step == args.steps):
                save(step, losses)
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

    if args.sample_tokens:
        model.eval()
        with no_grad():
            def logits(x):  # every rank: the whole vocabulary
                return parallel.gather_from_group(model(sn.Tensor(x)), mesh.tp).numpy()
            out = common.generate(logits, val_set.tokens[None, :1], args.sample_tokens,
                                  tok.vocab_size, args.block_size, args.seed)
        dist.print0("sample:\n" + tok.decode(out[0]))
    return common.loss_check(val, entropy, args.max_ratio)


if __name__ == "__main__":
    dist.finalize_and_exit(main())
