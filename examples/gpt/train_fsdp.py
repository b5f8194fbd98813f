"""Train a small character-level GPT, fully sharded over every MPI rank (FSDP).

    mpirun -n 4 python examples/gpt/train_fsdp.py

PyTorch's FSDP recipe for minGPT's model (model.py beside this file):
FullyShardedDataParallel shards the parameters, gradients and AdamW state
over the ranks, every Block its own unit (one flat shard per unit and AdamW
group: ``param_groups=`` keeps biases and LayerNorm weights free of weight
decay), gathered unit by unit in forward and backward. It starts from the
serial model of the seed, so it trains what train_dp.py trains and prints
the same loss lines; gradients are clipped by the whole model's norm
(``FullyShardedDataParallel.clip_grad_norm_``). A checkpoint holds the full
model and the optimizer state gathered by parameter name.

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
from spmdnet import data, dist, optim, parallel
from spmdnet.autograd import no_grad
from spmdnet.checkpoint import resume

import common  # examples/gpt/, the script's folder
from model import Block, cross_entropy, serial_gpt


def main(argv=None):
    args = common.parser(__doc__).parse_args(argv)
    dist.init()
    if args.checkpoint_dir:  # unusable: fail now, not at the first save
        sn.check_checkpoint_dir(args.checkpoint_dir)
    args.batch_size = args.batch_size or max(1, common.GLOBAL_BATCH // dist.size())
    train_set, val_set, tok, entropy = common.text_data(args)
    model = serial_gpt(tok.vocab_size, args)
    n_params = sum(p.numel() for p in model.parameters())
    sn.manual_seed(args.seed + 1)  # dropout streams: the same in every trainer
    def decay(name, p):  # AdamW's options of a parameter: decay on matrices only
        return {"weight_decay": args.weight_decay if p.ndim >= 2 else 0.0}
    fsdp = parallel.FullyShardedDataParallel(model, wrap={Block}, param_groups=decay)
    opt = optim.AdamW(fsdp.param_groups(decay), lr=args.lr, betas=(0.9, 0.95))
    sched = optim.lr_scheduler.WarmupCosine(opt, min(args.warmup, args.steps), args.steps,
                                            min_lr=args.lr / 10)
    sampler = data.DistributedSampler(train_set, seed=args.seed, drop_last=True)
    loader = data.DataLoader(train_set, args.batch_size, sampler=sampler, drop_last=True)
    tokens_per_step = args.batch_size * args.block_size * dist.size()
    dist.print0(f"{dist.size()} ranks (dp {dist.size()} x tp 1 x pp 1 FSDP), "
                f"{n_params} parameters, vocabulary "
                f"{tok.vocab_size}, {len(train_set.tokens)} training characters, unigram "
                f"entropy {entropy:.3f} nats, {tokens_per_step} tokens/step")

    def train_step(x, y):
        opt.zero_grad()
        loss = cross_entropy(fsdp(sn.Tensor(x)), y)
        loss.backward()  # returns with this rank's shard of the averaged gradients
        fsdp.clip_grad_norm_(args.grad_clip)
        opt.step()
        sched.step()
        return loss.item()

    @no_grad()
    def validate():
        fsdp.train(False)
        val = common.validate(lambda x, y: cross_entropy(fsdp(sn.Tensor(x)), y,
                                                         reduction="sum").item(), val_set)
        fsdp.train()
        return val

    def save(step, losses):  # with every rank's losses since the last report
        losses = dist.allgather(np.array(losses, np.float64)).tolist()
        sn.save_checkpoint(args.checkpoint_dir + "/", fsdp, opt, step=step, loader=loader,
                           scheduler=sched, options=common.options(args), losses=losses)

    extra = resume(args.checkpoint_dir, fsdp, opt, scheduler=sched, loader=loader,
                   options=common.options(args))
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
        fsdp.train(False)
        with no_grad():  # collective: every rank takes part in every unit's gathers
            out = common.generate(lambda x: fsdp(sn.Tensor(x)).numpy(), val_set.tokens[None, :1],
                                  args.sample_tokens, tok.vocab_size, args.block_size, args.seed)
        dist.print0("sample:\n" + tok.decode(out[0]))
    return common.loss_check(val, entropy, args.max_ratio)


if __name__ == "__main__":
    dist.finalize_and_exit(main())
