"""Every collective spmdnet's training uses, on fixed data, results to JSON.

    mpiexec -n N python tests/helpers/multinode_collectives.py OUT.json [NBYTES]

Run once across two hosts and once on one host: the two files must hold the
same numbers (bit for bit), and each equals the closed form the test computes
from the rank count. Rank 0 writes {"hosts": [host of each rank], "results":
{name: [every rank's result, as a list]}}. Float64 sums of small integers are
exact in any reduction order, so the comparison is exact. NBYTES (default 4 MB)
sizes the large allreduce, so that the link carries a known volume.
"""
import json
import socket
import sys

import numpy as np

import spmdnet as sn
from spmdnet import dist


def per_rank(r, n=12):
    return np.arange(n, dtype=np.float64) * (r + 1) + r


def main(path, nbytes):
    dist.init_process_group()
    r, p = dist.get_rank(), dist.get_world_size()
    out = {}
    # spmdnet.distributed on arrays and Tensors
    for op in ("sum", "mean", "max", "min"):
        out[f"allreduce_{op}"] = dist.allreduce(per_rank(r), op)
    out["allreduce_tensor"] = dist.allreduce(sn.Tensor(per_rank(r)), "sum").array
    out["allreduce_scalar"] = [dist.allreduce(float(r + 1), "sum")]
    big = np.full(nbytes // 8, float(r + 1))
    out["allreduce_large_first_last"] = dist.allreduce(big, "sum")[[0, -1]]
    out["broadcast"] = dist.bcast(per_rank(r), root=p - 1)
    out["broadcast_object"] = [dist.bcast({"from": r}, root=p - 1)["from"]]
    out["allgather"] = dist.allgather(per_rank(r, 3)).ravel()
    out["reduce_scatter"] = dist.reduce_scatter_block(np.stack([per_rank(r, 3)] * p),
                                                  "sum").ravel()
    # torch.distributed's spelling, on Tensors
    t = sn.tensor(per_rank(r))
    dist.all_reduce(t)
    out["c10d_all_reduce"] = t.numpy()
    t = sn.tensor(per_rank(r))
    dist.broadcast(t, src=p - 1)
    out["c10d_broadcast"] = t.numpy()
    gathered = [sn.zeros(3, dtype=sn.float64) for _ in range(p)]
    dist.all_gather(gathered, sn.tensor(per_rank(r, 3)))
    out["c10d_all_gather"] = np.concatenate([g.numpy() for g in gathered])
    res = sn.zeros(3, dtype=sn.float64)
    dist.reduce_scatter(res, [sn.tensor(per_rank(r, 3) + k) for k in range(p)])
    out["c10d_reduce_scatter"] = res.numpy()
    # a ring of send/recv: every rank sends to the next, receives from the previous
    got = sn.zeros(12, dtype=sn.float64)
    if r % 2 == 0:
        dist.send(sn.tensor(per_rank(r)), dst=(r + 1) % p)
        dist.recv(got, src=(r - 1) % p)
    else:
        dist.recv(got, src=(r - 1) % p)
        dist.send(sn.tensor(per_rank(r)), dst=(r + 1) % p)
    out["c10d_send_recv"] = got.numpy()
    dist.barrier()
    results = {k: np.asarray(v, np.float64).tolist() for k, v in out.items()}
    every = _gather_objects(results)
    hosts = _gather_objects(socket.gethostname())
    if r == 0:
        merged = {k: [e[k] for e in every] for k in results}
        with open(path, "w") as f:
            json.dump({"hosts": hosts, "results": merged}, f)
    dist.destroy_process_group()


def _gather_objects(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4 * 2**20)
