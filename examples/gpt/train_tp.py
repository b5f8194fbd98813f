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

Data, output, checkpoints and the final check are common.py's (--help).
"""
import spmdnet as sn
from spmdnet import cli, dist, parallel

import common  # examples/gpt/, the script's folder
from model import GPT, cross_entropy, load_part, padded_vocab, param_groups, serial_gpt


def main(argv=None):
    p = common.parser(__doc__)
    p.add_argument("--tp", type=cli.positive_int, default=2, help="tensor-parallel group size")
    args, mesh, train_set, val_set, tok, entropy = common.setup(p, argv, tp=True)
    serial = serial_gpt(tok.vocab_size, args, mesh.tp_size)
    model = GPT(padded_vocab(tok.vocab_size, mesh.tp_size), args.block_size, args.n_layer,
                args.n_head, args.n_embd, args.dropout, tp=mesh.tp)
    load_part(model, serial.state_dict(), mesh, first_block=0)  # this rank's slices
    sn.manual_seed(args.seed + 1)  # dropout streams: the same in every trainer
    ddp = parallel.DataParallel(model, comm=mesh.dp)  # gradients averaged over mesh.dp
    groups = param_groups(model.parameters(), args.weight_decay)
    opt, sched = common.adamw_with_schedule(groups, args)
    # every rank of a TP group reads the same windows
    loader = common.loader(train_set, args, comm=mesh.dp)
    tokens_per_step = common.announce(args, mesh, sum(p.numel() for p in serial.parameters()),
                                      tok, train_set, entropy)

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

    def loss_sum(x, y):  # a validation batch's summed loss
        return cross_entropy(model(sn.Tensor(x)), y, tp=mesh.tp, reduction="sum").item()


    code, val = common.train(args, model, opt, sched, loader, train_step, loss_sum, val_set,
                             tokens_per_step, comm=mesh.dp, mesh=mesh)
    if code is not None:
        return code

    def logits(x):  # every rank: the whole vocabulary
        return parallel.gather_from_group(model(sn.Tensor(x)), mesh.tp).numpy()
    return common.finish(args, model, logits, val, val_set, tok, entropy)


if __name__ == "__main__":
    dist.finalize_and_exit(main())
