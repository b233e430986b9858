"""The main job until the RL library lands: compile and run the design's RT example.

Prints the SDG, the schedule isl found (as the loop program the executor runs), the
compile-time breakdown, and the results, checked against plain NumPy.
"""

from __future__ import annotations

import argparse

import numpy as np

import tempo as tp


def build(ctx: tp.Context) -> dict[str, tp.RecurrentTensor]:
    _, t = ctx.dims
    _, T = ctx.bounds
    with ctx:
        x = tp.const(np.arange(100, dtype=np.float32))[t]
        s = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        s[0] = x[0]
        s[t + 1] = s + x[t + 1]                      # running sum
        g = x[t:T].discounted_sum(0.9)               # anti-causal discounted return
        w = x[tp.max(0, t - 3):t + 1].mean()         # backward window
        c = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        c[t % 5 == 0] = x * 2.0                      # conditional branches
        c[True] = x
    return {"running sum s": s, "discounted g": g, "window mean w": w, "conditional c": c}


def numpy_reference(n: int) -> dict[str, np.ndarray]:
    x = np.arange(100, dtype=np.float64)[:n]
    return {
        "running sum s": np.cumsum(x),
        "discounted g": np.array([sum(0.9 ** j * x[k + j] for j in range(n - k)) for k in range(n)]),
        "window mean w": np.array([x[max(0, k - 3):k + 1].mean() for k in range(n)]),
        "conditional c": np.where(np.arange(n) % 5 == 0, 2 * x, x),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--T", type=int, default=20, help="bound of t (at most 100)")
    parser.add_argument("--backend", default="jax", choices=["jax", "numpy"])
    args = parser.parse_args()
    ctx = tp.Context(dims=("i", "t"))
    I, T = ctx.bounds
    rts = build(ctx)
    print("== symbolic dependence graph ==")
    print(ctx.graph.to_text())
    exe = ctx.compile(bounds={I: 1, T: args.T}, outputs=list(rts.values()), backend=args.backend)
    print("\n== schedule ==")
    print(exe.schedule)
    print("\n== compile time ==")
    print(exe.report)
    res = exe.run()
    print(f"\n== results ({args.backend} backend, T={args.T}) ==")
    expected = numpy_reference(args.T)
    for name, rt in rts.items():
        ok = np.allclose(res[rt], expected[name], rtol=1e-4)
        print(f"{name:<15} {np.array2string(res[rt][:6], precision=2)} ... "
              f"{'matches NumPy' if ok else 'MISMATCH'}")
        if not ok:
            raise SystemExit(1)
    print(f"peak live points: {exe.stats.peak}")


if __name__ == "__main__":
    main()
