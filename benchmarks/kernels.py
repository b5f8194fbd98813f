"""Each Numba kernel against the plain-xp composition it replaces, at training sizes.

    python benchmarks/kernels.py [--repeat 50] [--threads 1] [--only NAME ...]

float32, NumPy arrays. For every kernel the two sides run interleaved (the
machine's noise hits both alike) on the same inputs; a side that works in
place gets a fresh copy before each call, outside the timing. Prints the
median microseconds, the speedup, whether it is at least 2x (the bar a
kernel must clear to be used, DESIGN.md principle 8) and whether the ops use
it (``spmdnet.kernels.lookup``: the table in spmdnet/kernels/dispatch.py).
Compile time (warm-up) is reported apart.
"""
import argparse
import os
import sys
import time

import numpy as np

import spmdnet as sn
from spmdnet import kernels
from spmdnet.kernels import activation, embedding, loss, norm, optim_kernels
from spmdnet.ops import losses, nn_ops, unary


def _cases():
    """(name, size, xp function, kernel function, setup, used) for every
    kernel; setup() returns the arguments both functions take (fresh each
    call); used: whether the ops run this kernel (``kernels.lookup``)."""
    rng = np.random.default_rng(0)
    f32 = np.float32

    def randn(*shape):
        return rng.standard_normal(shape).astype(f32)

    cases = []
    x, b, g = randn(256, 1024), randn(1024), randn(256, 1024)
    for name in activation.BACKWARD:
        # backward gets what the op's forward saved: the kernel's where the op
        # runs the kernel forward (relu's mask), else the xp one
        for fused in (True, False):
            op = f"linear_{name}" if fused else name
            fwd_used, bwd_used = (kernels.lookup(op, x, step=step) is not None
                                  for step in ("forward", "backward"))
            fwd_kernel = name in (activation.FORWARD_INPLACE if fused else activation.FORWARD)
            bias = b if fused else None
            pre = x + b if fused else x
            saved_xp = unary.act_forward(name, pre)[1]
            saved_k = activation.forward(x.copy(), bias, name, inplace=fused)[1] \
                if fwd_used else saved_xp
            label = f"bias+{name}" if fused else f"{name} (no bias)"

            def xp_fwd(h, name=name, fused=fused):
                if fused:
                    h += b
                return unary.act_forward(name, h)

            def k_fwd(h, name=name, bias=bias, fused=fused):
                return activation.forward(h, bias, name, inplace=fused)

            def xp_bwd(name=name, saved=saved_xp, fused=fused):
                gh = unary.act_backward(name, g, saved)
                return gh, (gh.sum(axis=0) if fused else None)

            def k_bwd(name=name, saved=saved_k, fused=fused):
                return activation.backward(g, saved, name, bias_grad=fused)

            if fwd_kernel:  # kernels exist only for these steps (activation.py)
                cases.append((f"{label} fwd", "256x1024", xp_fwd, k_fwd, lambda: (x.copy(),),
                              fwd_used))
            cases.append((f"{label} bwd", "256x1024", xp_bwd, k_bwd, tuple, bwd_used))

    for n, c in ((256, 10), (256, 32), (256, 64), (256, 100), (256, 1000), (256, 32000)):
        logits, labels = randn(n, c), rng.integers(0, c, n)
        op = losses.CrossEntropy()
        op.needs_input_grad = (True, False)

        def xp_ce_fwd(logits=logits, labels=labels):
            logp = nn_ops._log_softmax(logits, axis=1)
            return (-logp[np.arange(len(labels)), labels]).sum() / len(labels)

        def k_ce_fwd(logits=logits, labels=labels):
            return loss.forward(logits, labels, check=False)[0].sum() / len(labels)

        logp = nn_ops._log_softmax(logits, axis=1)
        probs = loss.forward(logits, labels)[1]

        def xp_ce_bwd(logp=logp, labels=labels):
            grad = np.exp(logp)
            grad[np.arange(len(labels)), labels] -= 1
            grad *= f32(1.0 / len(labels))
            return grad

        def k_ce_bwd(probs=probs, labels=labels):
            return loss.backward(probs, labels, np.full(len(labels), 1.0 / len(labels), f32))

        used = kernels.lookup("cross_entropy", logits) is not None
        cases.append(("cross_entropy fwd", f"{n}x{c}", xp_ce_fwd, k_ce_fwd, tuple, used))
        cases.append(("cross_entropy bwd", f"{n}x{c}", xp_ce_bwd, k_ce_bwd, tuple, used))

    for shape in ((256, 1024), (4096, 512)):
        xs, gs, w, bb = randn(*shape), randn(*shape), randn(shape[-1]), randn(shape[-1])
        ref = nn_ops.LayerNorm()
        ref.needs_input_grad = (True, True, True)
        _with_kernels("xp", lambda ref=ref, xs=xs, w=w, bb=bb: ref.forward(xs, w, bb))
        _, mean, rstd = norm.forward(xs, w, bb)
        size = "x".join(map(str, shape))
        cases.append(("layer_norm fwd", size,
                      lambda xs=xs, w=w, bb=bb: _with_kernels(
                          "xp", lambda: nn_ops.LayerNorm().forward(xs, w, bb)),
                      lambda xs=xs, w=w, bb=bb: norm.forward(xs, w, bb), tuple, True))
        cases.append(("layer_norm bwd", size,
                      lambda ref=ref, gs=gs: _with_kernels("xp", lambda: ref.backward(gs)),
                      lambda xs=xs, gs=gs, w=w, m=mean, r=rstd: norm.backward(gs, xs, w, m, r),
                      tuple, True))

    for v, n, d in ((10000, 4096, 256), (50000, 8192, 512)):
        idx, ge = rng.integers(0, v, n), randn(n, d)

        def xp_emb(idx=idx, ge=ge, v=v, d=d):
            out = np.zeros((v, d), f32)
            np.add.at(out, idx, ge)
            return out

        cases.append(("embedding bwd", f"V{v} N{n} D{d}", xp_emb,
                      lambda idx=idx, ge=ge, v=v: embedding.backward(ge, idx, v), tuple, True))

    p, gp = randn(1024, 1024), randn(1024, 1024)

    def optimizer_case(make):
        def run(kernels, state={}):  # noqa: B006 - one optimizer per side
            if kernels not in state:
                param = sn.nn.Parameter(p.copy())
                param.grad = gp
                state[kernels] = make([param])
            _with_kernels(kernels, state[kernels].step)
        return (lambda: run("xp")), (lambda: run("numba"))

    sgd = optimizer_case(lambda ps: sn.optim.SGD(ps, lr=1e-3, momentum=0.9))
    adam = optimizer_case(lambda ps: sn.optim.Adam(ps, lr=1e-3))
    cases.append(("SGD momentum step", "1024x1024", sgd[0], sgd[1], tuple, True))
    cases.append(("Adam step", "1024x1024", adam[0], adam[1], tuple, True))
    assert kernels.lookup("sgd", p, gp, step="update") is optim_kernels.sgd_update
    return cases


def _with_kernels(value, fn):
    with kernels.use(value):
        return fn()


def median_us(pairs, repeat):
    """Interleaved median times (us) of (setup, fn) pairs."""
    times = [[] for _ in pairs]
    for _ in range(repeat):
        for k, (setup, fn) in enumerate(pairs):
            args = setup()
            t0 = time.perf_counter()
            fn(*args)
            times[k].append(time.perf_counter() - t0)
    return [sorted(t)[len(t) // 2] * 1e6 for t in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads")
    parser.add_argument("--only", nargs="*", help="names containing any of these")
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var) != str(args.threads):
            os.environ.update({v: str(args.threads) for v in
                               ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
            os.execv(sys.executable, [sys.executable] + sys.argv)  # BLAS reads it at import
    seconds = kernels.warmup()
    cases = _cases()
    for _, _, xp_fn, k_fn, setup, _ in cases:  # compile what warmup did not (none, normally)
        xp_fn(*setup())
        k_fn(*setup())
    print(f"float32, {args.threads} BLAS thread(s), median of {args.repeat} interleaved calls;"
          f" kernel warm-up (compile) {seconds:.1f} s, "
          f"{kernels.compile_seconds():.1f} s compiling in all")
    print(f"{'kernel':28s} {'size':>18s} {'xp_us':>9s} {'kernel_us':>9s} {'speedup':>7s}  "
          ">=2x  ops use it")
    for name, size, xp_fn, k_fn, setup, used in cases:
        if args.only and not any(s in name for s in args.only):
            continue
        t_xp, t_k = median_us([(setup, xp_fn), (setup, k_fn)], args.repeat)
        speedup = t_xp / t_k
        print(f"{name:28s} {size:>18s} {t_xp:9.1f} {t_k:9.1f} {speedup:7.2f}  "
              f"{'yes' if speedup >= 2 else 'no ':4s} {'yes' if used else 'no'}", flush=True)


if __name__ == "__main__":
    main()
