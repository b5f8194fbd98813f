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

Data, output, checkpoints and the final check are common.py's (--help).
"""

import numpy as np

import spmdnet as sn
from spmdnet import cli, dist, parallel

import common  # examples/gpt/, the script's folder
from model import GPT, cross_entropy, load_part, param_groups, serial_gpt


def main(argv=None):
    p = common.parser(__doc__)
    p.add_argument("--pp", type=cli.positive_int, default=2, help="pipeline stages")
    p.add_argument("--micro-batches", type=cli.positive_int, default=4, help="per step")
    args, mesh, train_set, val_set, tok, entropy = common.setup(p, argv, pp=True)
    if mesh.pp_size > args.n_layer:
        raise SystemExit(f"--pp {mesh.pp_size} exceeds --n-layer {args.n_layer}")
    if args.batch_size % args.micro_batches:
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of "
                         f"--micro-batches {args.micro_batches}")
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
    groups = param_groups(model.parameters(), args.weight_decay)
    opt, sched = common.adamw_with_schedule(groups, args)
    # every stage of a pipeline reads the same windows
    loader = common.loader(train_set, args, comm=mesh.dp)
    tokens_per_step = common.announce(args, mesh, sum(p.numel() for p in serial.parameters()),
                                      tok, train_set, entropy)

    def train_step(x, y):
        opt.zero_grad()
        loss = pipe.train_step(x, y, cross_entropy)  # forward and backward of every stage
        # every stage holds its own parameters, every dp replica the same gradients
        parallel.clip_grad_norm_(model.parameters(), args.grad_clip, copies=mesh.dp_size)
        opt.step()
        sched.step()
        return loss

    def loss_sum(x, y):  # a validation batch's summed loss
        return cross_entropy(sn.Tensor(pipe.infer(x)), y, reduction="sum").item()


    code, val = common.train(args, model, opt, sched, loader, train_step, loss_sum, val_set,
                             tokens_per_step, comm=mesh.dp, mesh=mesh)
    if code is not None:
        return code
    return common.finish(args, model, pipe.infer, val, val_set, tok, entropy)


if __name__ == "__main__":
    dist.finalize_and_exit(main())
