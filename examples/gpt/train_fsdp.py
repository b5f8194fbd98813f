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

Data, output, checkpoints and the final check are common.py's (--help).
"""
import spmdnet as sn
from spmdnet import dist, parallel

import common  # examples/gpt/, the script's folder
from model import Block, cross_entropy, serial_gpt


def main(argv=None):
    args, _, train_set, val_set, tok, entropy = common.setup(common.parser(__doc__), argv)
    model = serial_gpt(tok.vocab_size, args)
    n_params = sum(p.numel() for p in model.parameters())  # before sharding frees them
    sn.manual_seed(args.seed + 1)  # dropout streams: the same in every trainer

    def decay(name, p):  # AdamW's options of a parameter: decay on matrices only
        return {"weight_decay": args.weight_decay if p.ndim >= 2 else 0.0}
    # forward_prefetch: each unit's gather travels while the one before computes
    fsdp = parallel.FullyShardedDataParallel(model, wrap={Block}, forward_prefetch=True,
                                             param_groups=decay)
    opt, sched = common.adamw_with_schedule(fsdp.param_groups(decay), args)
    loader = common.loader(train_set, args)
    tokens_per_step = common.announce(args, None, n_params, tok, train_set, entropy, " FSDP")

    def train_step(x, y):
        opt.zero_grad()
        loss = cross_entropy(fsdp(sn.Tensor(x)), y)
        loss.backward()  # returns with this rank's shard of the averaged gradients
        fsdp.clip_grad_norm_(args.grad_clip)
        opt.step()
        sched.step()
        return loss.item()

    def loss_sum(x, y):  # a validation batch's summed loss
        return cross_entropy(fsdp(sn.Tensor(x)), y, reduction="sum").item()


    code, val = common.train(args, fsdp, opt, sched, loader, train_step, loss_sum, val_set,
                             tokens_per_step)
    if code is not None:
        return code
    # sampling is collective: every rank takes part in every unit's gathers
    return common.finish(args, fsdp, lambda x: fsdp(sn.Tensor(x)).numpy(), val, val_set,
                         tok, entropy)


if __name__ == "__main__":
    dist.finalize_and_exit(main())
