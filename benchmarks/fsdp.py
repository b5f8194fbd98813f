"""FullyShardedDataParallel against DataParallel: bytes per rank and step time.

    mpiexec -n 2 python benchmarks/fsdp.py [--units 8] [--width 512] [--batch 64] [--steps 5]

The model: ``--units`` residual units LayerNorm → Linear(w→4w) → GELU →
Linear(4w→w) (w=512, 8 units: about 17 M parameters), float32, AdamW, batch
``--batch`` per rank. Per rank, for each strategy:
- persistent: parameters + gradients + optimizer state held between steps
  (for FSDP the flat shards, their gradients and AdamW's moments);
- peak: the most bytes NumPy allocated during a step and held at once
  (tracemalloc: gathered parameters, flat gradients in flight, activations;
  gradients are zeroed in place, so they are persistent, not peak);
- buf: the most bytes of FSDP's own transient buffers (array accounting:
  gathered and prefetched full parameters, flat gradients open or in flight;
  they come from a pool of reusable buffers, kept between steps);
- step: the median step time and its ratio to DataParallel's (the
  strategies' steps interleaved, so a loaded machine slows them alike);
- exposed all-gather / reduce-scatter seconds per step: time the rank waits
  for them (blocking calls plus ``Wait()`` of the non-blocking ones), and
  how many gathers were prefetched.
Variants: "fsdp" (units recomputed in backward, prefetched all-gathers,
non-blocking reduce-scatters), "fsdp-blocking" (``prefetch=False,
overlap=False``: every collective blocking, so its exposed time is the
whole communication time), "fsdp-keep" (``reshard_after_forward=False``:
full parameters kept from forward to the end of backward, no recomputation).
"hidden" = 1 - exposed(fsdp) / exposed(fsdp-blocking), per collective. On
one shared-memory node with no idle core (e.g. 2 ranks on 2 cores) MPI's
copies are CPU work either way: time no longer spent waiting is spent
copying inside the polls, so "fsdp" need not beat "fsdp-blocking" there;
the overlap pays where a network moves the bytes (several nodes).
Goals (issue 17): persistent(FSDP) <= persistent(DP) / N + 5%; peak (gather
buffers, flat gradients; activations included here) <= the two largest
units' full parameters and gradients; step time at 2 ranks <= 1.5x
DataParallel's.
"""
import argparse
import time
import tracemalloc

import numpy as np

import spmdnet as sn
import spmdnet.functional as F
from spmdnet import dist, nn, optim, parallel


class Unit(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def build(strategy, args):
    sn.manual_seed(0)
    model = nn.Sequential(*[Unit(args.width) for _ in range(args.units)])
    if strategy == "dp":
        wrapped = parallel.DataParallel(model)
        params = list(model.parameters())
    else:
        wrapped = parallel.FullyShardedDataParallel(
            model, wrap={Unit}, prefetch=strategy != "fsdp-blocking",
            overlap=strategy != "fsdp-blocking", reshard_after_forward=strategy != "fsdp-keep")
        params = list(wrapped.parameters())
    return wrapped, params, optim.AdamW(params, lr=1e-4)


def persistent_bytes(params, opt):
    state = sum(v.nbytes for s in opt.state.values() for k, v in s.items()
                if hasattr(v, "nbytes") and not k.startswith("_"))
    grads = sum(p.grad.array.nbytes for p in params if p.grad is not None)
    return sum(p.array.nbytes for p in params) + grads + state


def fsdp_buffer_bytes(fsdp):
    """Bytes of FSDP's own transient buffers now (array accounting): gathered
    full parameters, gathers in flight, gradient buckets open or in flight."""
    full = sum(f.numel * f.shard.array.itemsize for f in fsdp.flats() if f.live)
    ahead = sum(buf.nbytes for _, buf in fsdp.prefetcher.pending.values())
    return full + ahead + fsdp.buffer.staged_bytes()


def track_buffers(fsdp, result):
    """Note the largest ``fsdp_buffer_bytes`` whenever FSDP polls MPI (every
    gradient accumulated into a unit parameter, every unit run)."""
    poke = fsdp.poke

    def tracked():
        result["buffers"] = max(result["buffers"], fsdp_buffer_bytes(fsdp))
        poke()
    fsdp.poke = tracked


class Runner:
    """One strategy's model, optimizer and input; ``step()`` times one step."""

    def __init__(self, strategy, args):
        self.strategy, self.fsdp = strategy, strategy != "dp"
        self.wrapped, self.params, self.opt = build(strategy, args)
        self.tracked = {"buffers": 0}
        if self.fsdp:
            track_buffers(self.wrapped, self.tracked)
        rng = np.random.default_rng(dist.rank())
        self.x = sn.tensor(rng.standard_normal((args.batch, args.width)).astype(np.float32))
        self.times, self.peak, self.comm_steps = [], 0, 0

    def step(self, traced=False):
        dist.barrier()
        if traced:
            tracemalloc.start()
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=False)  # gradients persistent, as DataParallel's buckets
        (self.wrapped(self.x) ** 2).mean().backward()
        self.opt.step()
        if traced:
            self.peak = max(self.peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        else:
            self.times.append(time.perf_counter() - t0)
        self.comm_steps += 1

    def result(self):
        w, fsdp = self.wrapped, self.fsdp
        unit_bytes = max((f.numel * f.shard.array.itemsize for f in w.flats()), default=0) \
            if fsdp else 0
        result = {"persistent": persistent_bytes(self.params, self.opt), "peak": self.peak,
                  "step": float(np.median(self.times[1:])), "unit": unit_bytes,
                  # blocking gathers + Wait() of prefetches; blocking or waited reduce-scatters
                  "ag": w.prefetcher.wait_s / self.comm_steps if fsdp else 0.0,
                  "rs": w.buffer.wait_s / self.comm_steps if fsdp else 0.0,
                  "hits": w.prefetcher.hits if fsdp else 0, "buffers": self.tracked["buffers"],
                  "pool": w.pool.nbytes() if fsdp else 0}
        w.close()
        return result


def run_all(strategies, args):
    """Steps of the strategies interleaved (a loaded machine slows them alike),
    untraced for the times; then two traced steps each for the peak bytes."""
    runners = [Runner(s, args) for s in strategies]
    for _ in range(args.steps + 1):  # the first step also allocates the optimizer state
        for r in runners:
            r.step()
    for r in runners:
        r.step(traced=True)
        r.step(traced=True)
    return {r.strategy: r.result() for r in runners}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    dist.init()
    n = dist.size()
    results = run_all(("dp", "fsdp", "fsdp-blocking", "fsdp-keep"), args)
    if dist.rank() == 0:
        report(results, n, args)


def report(results, n, args):
    mb = 1 / 2**20
    dp, fsdp, block = results["dp"], results["fsdp"], results["fsdp-blocking"]
    print(f"{n} ranks, {args.units} units of width {args.width}, batch {args.batch}/rank")
    print(f"{'strategy':14s} {'persistent MB':>14s} {'/DP':>6s} {'peak MB':>8s} {'buf MB':>7s}"
          f" {'step s':>7s} {'/DP':>5s} {'exposed ag s':>12s} {'exposed rs s':>12s}"
          f" {'prefetched':>10s}")
    for name, r in results.items():
        print(f"{name:14s} {r['persistent'] * mb:14.1f} {r['persistent'] / dp['persistent']:6.3f}"
              f" {r['peak'] * mb:8.1f} {r['buffers'] * mb:7.1f} {r['step']:7.3f}"
              f" {r['step'] / dp['step']:5.2f} {r['ag']:12.4f} {r['rs']:12.4f} {r['hits']:10d}")
    hidden = {k: 1 - fsdp[k] / block[k] if block[k] > 0 else 0.0 for k in ("ag", "rs")}
    bound = 4 * fsdp["unit"]  # two units' full parameters and gradients
    print(f"hidden by overlap: all-gather {hidden['ag']:.0%}, reduce-scatter {hidden['rs']:.0%}"
          f" (exposed comm {fsdp['ag'] + fsdp['rs']:.4f} s/step vs "
          f"{block['ag'] + block['rs']:.4f} s blocking)")
    print(f"goals: persistent/DP {fsdp['persistent'] / dp['persistent']:.3f} <= "
          f"{1 / n * 1.05:.3f}; FSDP buffers {fsdp['buffers'] * mb:.1f} MB (peak with "
          f"activations {fsdp['peak'] * mb:.1f} MB; reusable buffers kept between steps "
          f"{fsdp['pool'] * mb:.1f} MB) <= {bound * mb:.1f} MB "
          f"(two units' parameters + gradients); step/DP {fsdp['step'] / dp['step']:.2f}"
          f" <= 1.5 at 2 ranks")


if __name__ == "__main__":
    main()
