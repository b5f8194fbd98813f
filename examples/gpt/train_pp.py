"""Train a small character-level GPT as a GPipe pipeline x data parallel.

    mpirun -n 4 python examples/gpt/train_pp.py --pp 2

The ranks form a Mesh of dp x pp (dp = ranks / pp). The Blocks of model.py's
GPT (beside this file) are cut into --pp stages: the first also embeds, the
last holds the final LayerNorm and the head. Each step runs --micro-batches
micro-batches through the stages over ``mesh.pp`` (parallel.Pipeline);
DataParallel over ``mesh.dp`` averages each stage's gradients, and the ranks
of a pipeline read the same windows. Every stage loads its Blocks of the
serial model of the seed, so this trains what train_dp.py trains and prints
the same loss lines. Gradients are clipped by the norm of the whole model's
gradient (parallel.clip_grad_norm_ over all ranks: each stage holds its own
parameters, each dp replica the same gradients).

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
from model import GPT, cross_entropy, load_part, param_groups, serial_gpt


def main(argv=None):
    p = common.parser(__doc__)
    p.add_argument("--pp", type=cli.positive_int, default=2, help="pipeline stages")
    p.add_argument("--micro-batches", type=cli.positive_int, default=4, help="per step")
    args = p.parse_args(argv)
    dist.init()
    if args.checkpoint_dir:  # unusable: fail now, not at the first save
        sn.check_checkpoint_dir(args.checkpoint_dir)
    try:
        mesh = dist.Mesh(pp=args.pp)
    except ValueError as exc:  # pp does not divide the ranks
        raise SystemExit(str(exc)) from None
    args.batch_size = args.batch_size or max(1, common.GLOBAL_BATCH // mesh.dp_size)
    if mesh.pp_size > args.n_layer:
        raise SystemExit(f"--pp {mesh.pp_size} exceeds --n-layer {args.n_layer}")
    if args.batch_size % args.micro_batches:
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of "
                         f"--micro-batches {args.micro_batches}")
    train_set, val_set, tok, entropy = common.text_data(args)
    serial = serial_gpt(tok.vocab_size, args)
    bounds = np.linspace(0, args.n_layer, mesh.pp_size + 1).round().astype(int)
    lo, hi = bounds[mesh.pp_rank], bounds[mesh.pp_rank + 1]  # this stage's Blocks
    model = GPT(serial.lm_head.weight.shape[0], args.block_size, args.n_layer, args.n_head,
                args.n_embd, args.dropout, blocks=hi - lo, first=mesh.pp_rank == 0,
                last=mesh.pp_rank == mesh.pp_size - 1)
    load_part(model, serial.state_dict(), mesh, first_block=lo)
    sn.manual_seed(args.seed + 1)  # dropout streams: the same in every trainer
    ddp = parallel.DataParallel(model, comm=mesh.dp)  # gradients averaged over mesh.dp
    pipe = parallel.Pipeline(ddp, mesh.pp, args.micro_batches)
    opt = optim.AdamW(param_groups(model.parameters(), args.weight_decay), lr=args.lr,
                      betas=(0.9, 0.95))
    sched = optim.lr_scheduler.WarmupCosine(opt, min(args.warmup, args.steps), args.steps,
                                            min_lr=args.lr / 10)
    # every stage of a pipeline reads the same windows
    sampler = data.DistributedSampler(train_set, seed=args.seed, drop_last=True, comm=mesh.dp)
    loader = data.DataLoader(train_set, args.batch_size, sampler=sampler, drop_last=True)
    tokens_per_step = args.batch_size * args.block_size * mesh.dp_size
    dist.print0(f"{dist.size()} ranks (dp {mesh.dp_size} x tp 1 x pp {mesh.pp_size}), "
                f"{sum(p.numel() for p in serial.parameters())} parameters, vocabulary "
                f"{tok.vocab_size}, {len(train_set.tokens)} training characters, unigram "
                f"entropy {entropy:.3f} nats, {tokens_per_step} tokens/step")

    def train_step(x, y):
        opt.zero_grad()
        loss = pipe.train_step(x, y, cross_entropy)  # forward and backward of every stage
        # every stage holds its own parameters, every dp replica the same gradients
        parallel.clip_grad_norm_(model.parameters(), args.grad_clip, copies=mesh.dp_size)
        opt.step()
        sched.step()
        return loss

    @no_grad()
    def validate():
        model.eval()
        val = common.validate(lambda x, y: cross_entropy(sn.Tensor(pipe.infer(x)), y,
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
            out = common.generate(pipe.infer, val_set.tokens[None, :1], args.sample_tokens,
                                  tok.vocab_size, args.block_size, args.seed)
        dist.print0("sample:\n" + tok.decode(out[0]))
    return common.loss_check(val, entropy, args.max_ratio)


if __name__ == "__main__":
    dist.finalize_and_exit(main())
