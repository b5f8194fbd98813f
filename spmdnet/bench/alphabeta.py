"""The alpha-beta (Hockney) model of a message: T(n) = alpha + beta * n.

alpha is the start-up latency (seconds), beta the time per byte (1/beta is
the asymptotic bandwidth), and n_1/2 = alpha / beta the message size at which
the achieved bandwidth n / T(n) reaches half its peak 1/beta. A collective
of p ranks has a model of the same form; for the ring allreduce (each rank
sends and receives 2(p-1) chunks of n/p bytes)::

    T_ring(n, p) = 2(p-1) * alpha_link + 2(p-1)/p * n * beta_link

where alpha_link and beta_link describe one point-to-point transfer.
"""
import numpy as np


def fit(nbytes, seconds):
    """Least-squares fit of T = alpha + beta * n on relative error (weights
    1/T), so small messages fix alpha and large ones beta. Returns
    (alpha_s, beta_s_per_byte)."""
    n = np.asarray(nbytes, float)
    t = np.asarray(seconds, float)
    if len(n) < 2 or len(np.unique(n)) < 2:
        raise ValueError(f"an alpha-beta fit needs at least two message sizes, got {list(n)}")
    beta, alpha = np.polyfit(n, t, 1, w=1 / t)
    return float(alpha), float(beta)


def half_peak_bytes(alpha, beta):
    """n_1/2 of the model: the size where n / T(n) = 1 / (2 beta)."""
    return alpha / beta if beta > 0 else float("inf")


def measured_half_peak_bytes(nbytes, bandwidth):
    """The smallest measured size whose bandwidth reaches half the measured
    peak, interpolated log-linearly between the two sizes around it."""
    n = np.asarray(nbytes, float)
    bw = np.asarray(bandwidth, float)
    order = np.argsort(n)
    n, bw = n[order], bw[order]
    half = bw.max() / 2
    i = int(np.argmax(bw >= half))
    if i == 0:
        return float(n[0])
    lo, hi = np.log(n[i - 1]), np.log(n[i])
    frac = (half - bw[i - 1]) / (bw[i] - bw[i - 1])
    return float(np.exp(lo + frac * (hi - lo)))


def ring_allreduce_s(nbytes, p, alpha, beta):
    """Model time of a ring allreduce of nbytes over p ranks, from the
    point-to-point alpha (s) and beta (s/byte)."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


def link_from_collective(alpha, beta, p):
    """(alpha_link, beta_link) of a ring allreduce whose fit over p ranks
    was T = alpha + beta * n (the inverse of ``ring_allreduce_s``)."""
    if p <= 1:
        raise ValueError("a 1-rank allreduce moves no data: no link parameters")
    return alpha / (2 * (p - 1)), beta / (2 * (p - 1) / p)


def project_step(ranks, t_par, t_seq, grad_bytes, alpha, beta, exposed=1.0, weak=False):
    """Projected step time over ``ranks`` (one per GPU):
    T(N) = T_par / N + T_seq + exposed * T_ring(grad_bytes, N) for strong
    scaling, T_par instead of T_par / N for weak scaling (``weak=True``).

    ``t_par``/``t_seq``: the parallel and sequential parts of one step on
    one rank (measured or assumed); ``alpha``/``beta``: the interconnect's
    point-to-point latency (s) and time per byte (s/B); ``exposed``: the
    fraction of the allreduce not hidden behind backward (1 = no overlap).
    Returns a dict with the three parts and their sum."""
    comm = exposed * ring_allreduce_s(grad_bytes, ranks, alpha, beta)
    parts = {"parallel_s": t_par if weak else t_par / ranks, "sequential_s": t_seq,
             "communication_s": comm}
    parts["step_s"] = sum(parts.values())
    return parts
