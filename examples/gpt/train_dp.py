"""Train a small character-level GPT with data parallelism over every MPI rank.

    mpirun -n 4 python examples/gpt/train_dp.py

PyTorch's DDP recipe for minGPT's model (model.py beside this file): every
rank holds the whole model, DataParallel averages the gradients over the
ranks, a DistributedSampler gives each rank its own windows of the text.
AdamW (no weight decay on biases and LayerNorm weights), linear warmup then
cosine decay, gradient clipping by the norm. The siblings train the same
model and print the same loss lines: train_tp.py (tensor parallel),
train_pp.py (pipeline), train_fsdp.py (fully sharded).

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
from spmdnet import data, dist, nn, optim, parallel
from spmdnet.autograd import no_grad
from spmdnet.checkpoint import resume

import common  # examples/gpt/, the script's folder
from model import cross_entropy, param_groups, serial_gpt


def main(argv=None):
    args = common.parser(__doc__).parse_args(argv)
    dist.init()
    if args.checkpoint_dir:  # unusable: fail now, not at the first save
        sn.check_checkpoint_dir(args.checkpoint_dir)
    args.batch_size = args.batch_size or max(1, common.GLOBAL_BATCH // dist.size())
    train_set, val_set, tok, entropy = common.text_data(args)
    model = serial_gpt(tok.vocab_size, args)
    sn.manual_seed(args.seed + 1)  # dropout streams: the same in every trainer
    ddp = parallel.DataParallel(model)  # gradients averaged over all ranks
    opt = optim.AdamW(param_groups(model.parameters(), args.weight_decay), lr=args.lr,
                      betas=(0.9, 0.95))
    sched = optim.lr_scheduler.WarmupCosine(opt, min(args.warmup, args.steps), args.steps,
                                            min_lr=args.lr / 10)
    sampler = data.DistributedSampler(train_set, seed=args.seed, drop_last=True)
    loader = data.DataLoader(train_set, args.batch_size, sampler=sampler, drop_last=True)
    tokens_per_step = args.batch_size * args.block_size * dist.size()
    dist.print0(f"{dist.size()} ranks (dp {dist.size()} x tp 1 x pp 1), "
                f"{sum(p.numel() for p in model.parameters())} parameters, vocabulary "
                f"{tok.vocab_size}, {len(train_set.tokens)} training characters, unigram "
                f"entropy {entropy:.3f} nats, {tokens_per_step} tokens/step")

    def train_step(x, y):
        opt.zero_grad()
        loss = cross_entropy(ddp(sn.Tensor(x)), y)
        loss.backward()  # returns with the gradients averaged over the ranks
        nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        sched.step()
        return loss.item()

    @no_grad()
    def validate():
        model.eval()
        val = common.validate(lambda x, y: cross_entropy(model(sn.Tensor(x)), y,
                                                         reduction="sum").item(), val_set)
        model.train()
        return val

    def save(step, losses):  # with every rank's losses since the last report
        losses = dist.allgather(np.array(losses, np.float64)).tolist()
        sn.save_checkpoint(args.checkpoint_dir + "/", model, opt, step=step, loader=loader,
                           scheduler=sched, options=common.options(args), losses=losses)

    extra = resume(args.checkpoint_dir, model, opt, scheduler=sched, loader=loader,
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
        model.eval()
        with no_grad():
            out = common.generate(lambda x: model(sn.Tensor(x)).numpy(), val_set.tokens[None, :1],
                                  args.sample_tokens, tok.vocab_size, args.block_size, args.seed)
        dist.print0("sample:\n" + tok.decode(out[0]))
    return common.loss_check(val, entropy, args.max_ratio)


if __name__ == "__main__":
    dist.finalize_and_exit(main())
