"""Train a small character-level GPT with data parallelism over every MPI rank.

    mpirun -n 4 python examples/gpt/train_dp.py

PyTorch's DDP recipe for minGPT's model (model.py beside this file): every
rank holds the whole model, DataParallel averages the gradients over the
ranks, a DistributedSampler gives each rank its own windows of the text.
AdamW (no weight decay on biases and LayerNorm weights), linear warmup then
cosine decay, gradient clipping by the norm. The siblings train the same
model and print the same loss lines: train_tp.py (tensor parallel),
train_pp.py (pipeline), train_fsdp.py (fully sharded).

Data, output, checkpoints and the final check are common.py's (--help).
"""
import spmdnet as sn
from spmdnet import dist, nn, parallel

import common  # examples/gpt/, the script's folder
from model import cross_entropy, param_groups, serial_gpt


def main(argv=None):
    args, _, train_set, val_set, tok, entropy = common.setup(common.parser(__doc__), argv)
    model = serial_gpt(tok.vocab_size, args)
    sn.manual_seed(args.seed + 1)  # dropout streams: the same in every trainer
    ddp = parallel.DataParallel(model)  # gradients averaged over all ranks
    groups = param_groups(model.parameters(), args.weight_decay)
    opt, sched = common.adamw_with_schedule(groups, args)
    loader = common.loader(train_set, args)
    tokens_per_step = common.announce(args, None, sum(p.numel() for p in model.parameters()),
                                      tok, train_set, entropy)

    def train_step(x, y):
        opt.zero_grad()
        loss = cross_entropy(ddp(sn.Tensor(x)), y)
        loss.backward()  # returns with the gradients averaged over the ranks
        nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        sched.step()
        return loss.item()

    def loss_sum(x, y):  # a validation batch's summed loss
        return cross_entropy(model(sn.Tensor(x)), y, reduction="sum").item()


    code, val = common.train(args, model, opt, sched, loader, train_step, loss_sum, val_set,
                             tokens_per_step)
    if code is not None:
        return code
    return common.finish(args, model, lambda x: model(sn.Tensor(x)).numpy(), val, val_set,
                         tok, entropy)


if __name__ == "__main__":
    dist.finalize_and_exit(main())
