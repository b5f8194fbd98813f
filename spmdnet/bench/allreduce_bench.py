"""``bench allreduce``: latency and bus bandwidth of ``dist.allreduce``
against raw mpi4py ``Allreduce``, on the world and on split communicators,
with the alpha-beta fit of each.

Calls are interleaved (ours, raw, ours, raw, ...) so machine noise hits both
alike; each time is the median over repetitions of the slowest rank. Bus
bandwidth = bytes / time * 2(p-1)/p (the NCCL convention: what each link
carries in a ring, comparable across rank counts); for a 1-rank group,
where nothing moves between ranks, it is bytes / time.
"""
import time

import numpy as np

from .. import distributed as dist
from . import alphabeta, report

GB = 1e9
MB = 2**20
COLUMNS = ("group", "ranks", "impl", "bytes", "time_s", "algbw_GBps", "busbw_GBps", "reps")
FIT_COLUMNS = ("group", "ranks", "impl", "alpha_s", "beta_s_per_byte", "peak_busbw_GBps",
               "n_half_model_bytes", "n_half_measured_bytes", "ours_over_raw_min_from_1MB")


def message_sizes(min_bytes=4, max_bytes=256 * MB, factor=4):
    """min_bytes, min_bytes*factor, ... up to max_bytes (float32 multiples)."""
    if min_bytes < 4 or max_bytes < min_bytes:
        raise ValueError(f"need 4 <= min_bytes <= max_bytes, got {min_bytes}, {max_bytes}")
    out, n = [], int(min_bytes)
    while n <= max_bytes:
        out.append(n - n % 4)
        n *= factor
    return out


def bus_factor(p):
    return 2 * (p - 1) / p if p > 1 else 1.0


def time_interleaved(fns, reps, comm, barrier=None):
    """Median seconds of each fn over ``reps`` rounds that alternate them,
    max over ``comm`` (the slowest rank defines a collective's time).
    ``barrier``: the communicator aligned before each call (default comm)."""
    barrier = barrier or comm
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            barrier.Barrier()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    from mpi4py import MPI  # noqa: PLC0415 - optional: `bench project` runs without MPI
    return [comm.allreduce(float(np.median(ts)), op=MPI.MAX) for ts in times]


def reps_for(nbytes, reps):
    """Fewer repetitions for large messages (at least 3)."""
    return max(3, min(reps, int(reps * 4 * MB / max(nbytes, 1))))


def groups(world_comm):
    """(name, communicator) pairs to measure: the world; adjacent pairs (the
    tensor-parallel groups of ``dist.Mesh(tp=2)``); and, from 4 ranks, the
    strided data-parallel groups of that mesh. Returns (groups, mesh)."""
    out, mesh = [("world", world_comm)], None
    size = world_comm.Get_size()
    if size >= 2 and size % 2 == 0:
        mesh = dist.Mesh(tp=2, comm=world_comm)
        out.append(("pairs", mesh.tp))
        if mesh.dp_size > 1:
            out.append(("strided", mesh.dp))
    return out, mesh


def measure(group, comm, world_comm, sizes, reps):
    """Rows of COLUMNS for one group: ours and raw, interleaved, per size."""
    from mpi4py import MPI  # noqa: PLC0415 - optional: `bench project` runs without MPI
    p, rows = comm.Get_size(), []
    for nbytes in sizes:
        a, b = np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
        ours = lambda a=a: dist.allreduce(a, comm=comm)
        raw = lambda b=b: comm.Allreduce(MPI.IN_PLACE, b, MPI.SUM)
        n = reps_for(nbytes, reps)
        time_interleaved([ours, raw], 1, world_comm)  # warm-up
        for impl, t in zip(("ours", "raw"), time_interleaved([ours, raw], n, world_comm)):
            rows.append({"group": group, "ranks": p, "impl": impl, "bytes": nbytes,
                         "time_s": t, "algbw_GBps": nbytes / t / GB,
                         "busbw_GBps": nbytes * bus_factor(p) / t / GB, "reps": n})
    return rows


def fits(rows):
    """One row of FIT_COLUMNS per (group, impl)."""
    out = []
    for group in dict.fromkeys(r["group"] for r in rows):
        mine = [r for r in rows if r["group"] == group]
        # rows alternate ours, raw per size: raw time / our time = our share of raw bandwidth
        ratio = [r["time_s"] / o["time_s"] for o, r in zip(mine[0::2], mine[1::2])
                 if o["bytes"] >= MB]
        for impl in ("ours", "raw"):
            sel = [r for r in mine if r["impl"] == impl]
            n, t = [r["bytes"] for r in sel], [r["time_s"] for r in sel]
            p = sel[0]["ranks"]
            try:
                alpha, beta = alphabeta.fit(n, t)
            except ValueError:
                alpha = beta = float("nan")
            out.append({"group": group, "ranks": p, "impl": impl, "alpha_s": alpha,
                        "beta_s_per_byte": beta,
                        "peak_busbw_GBps": bus_factor(p) / beta / GB if beta > 0 else np.nan,
                        "n_half_model_bytes": alphabeta.half_peak_bytes(alpha, beta),
                        "n_half_measured_bytes": alphabeta.measured_half_peak_bytes(
                            n, [r["busbw_GBps"] for r in sel]),
                        "ours_over_raw_min_from_1MB": min(ratio) if ratio else np.nan})
    return out


def describe(fit_rows):
    """Text lines for the fits."""
    lines = []
    for f in fit_rows:
        lines.append(f"{f['group']:>8} ({f['ranks']} ranks) {f['impl']:>4}: "
                     f"alpha {f['alpha_s'] * 1e6:8.2f} us, beta {f['beta_s_per_byte'] * 1e9:7.4f} "
                     f"ns/B (peak bus bandwidth {f['peak_busbw_GBps']:6.2f} GB/s), n_1/2 "
                     f"{f['n_half_model_bytes'] / 1e3:8.1f} KB (model), "
                     f"{f['n_half_measured_bytes'] / 1e3:8.1f} KB (measured)")
    for f in fit_rows[::2]:
        if not np.isnan(f["ours_over_raw_min_from_1MB"]):
            lines.append(f"{f['group']:>8}: ours/raw bandwidth from 1 MB up, minimum "
                         f"{f['ours_over_raw_min_from_1MB']:.3f} (goal >= 0.95)")
    return lines


def draw(rows, fit_rows):
    def plot(fig):
        lat, bw = fig.subplots(1, 2)
        for f in fit_rows:
            sel = [r for r in rows if r["group"] == f["group"] and r["impl"] == f["impl"]]
            n = np.array([r["bytes"] for r in sel], float)
            label = f"{f['group']} ({f['ranks']}) {f['impl']}"
            line, = lat.loglog(n, [r["time_s"] * 1e6 for r in sel], "o-", ms=3, label=label)
            if np.isfinite(f["alpha_s"]):
                lat.loglog(n, (f["alpha_s"] + f["beta_s_per_byte"] * n) * 1e6, ":",
                           color=line.get_color())
            bw.semilogx(n, [r["busbw_GBps"] for r in sel], "o-", ms=3, label=label,
                        color=line.get_color())
            if f["impl"] == "ours" and np.isfinite(f["n_half_model_bytes"]):
                bw.axvline(f["n_half_model_bytes"], ls=":", lw=0.8, color=line.get_color())
        lat.set(xlabel="message bytes", ylabel="time (us)",
                title="allreduce latency (dotted: alpha-beta fit)")
        bw.set(xlabel="message bytes", ylabel="bus bandwidth (GB/s)",
               title="bus bandwidth (dotted: n_1/2 of the fit)")
        lat.legend(fontsize=7)
        bw.legend(fontsize=7)
    return plot


def run(args):
    world = dist.init()
    sizes = message_sizes(args.min_bytes, args.max_bytes, args.factor)
    group_list, mesh = groups(world.comm)
    rows = []
    for name, comm in group_list:
        dist.print0(f"allreduce on {name} ({comm.Get_size()} ranks): {len(sizes)} sizes "
                    f"{sizes[0]} B .. {sizes[-1]} B", flush=True)
        rows += measure(name, comm, world.comm, sizes, args.reps)
    if mesh is not None:
        mesh.free()
    if world.rank != 0:
        return 0
    fit_rows = fits(rows)
    print("\n".join(describe(fit_rows)))
    report.save(args, "allreduce_fit", FIT_COLUMNS, fit_rows)
    report.save(args, "allreduce", COLUMNS, rows, draw(rows, fit_rows), figsize=(11, 4.5))
    return 0
