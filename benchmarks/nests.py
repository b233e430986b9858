"""Loop nests, side by side: a recurrence restarted from an outer recurrence, run by Tempo
(JAX backend) with its loops interpreted, with its innermost loop lowered (one scan per
outer iteration), with the whole nest lowered (one scan), with the default timed policy,
and by plain JAX (a ``lax.scan`` over ``i`` around a ``lax.scan`` over ``t``, one jit).

    python benchmarks/nests.py                     # I x T = 16 x 16 and 64 x 32 (~1 min)
    python benchmarks/nests.py --sizes 32x32 --features 256

The program, over ``(i, t)`` with ``x[i, t]`` and ``w[i]`` given (``features`` floats each):

    h[0] = w[0];  g[i] = tanh(0.5 h[i] + w[i])
    s[i, 0] = x[i, 0] + g[i];  s[i, t] = tanh(0.5 s[i, t-1] + x[i, t] g[i])
    m[i] = 2 s[i, T-1];  h[i+1] = h[i] + m[i]

Each cell is the median time of one whole run (every ``s``, ``m``, ``h``) over the
measured runs, after warm-up runs (which compile; the timed policy decides over its first
six entries of each loop, so it gets eight). Ratios are plain JAX's time over each row's:
below 1x, that row is slower than JAX.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEMPO = {"tempo-interpreted": ("interpreted", True), "tempo-innermost": ("lowered", False),
         "tempo-nest": ("lowered", True), "tempo-timed": ("timed", True)}
SYSTEMS = (*TEMPO, "jax")


def _data(outer: int, steps: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.uniform(-1, 1, (outer, steps, features)).astype(np.float32),
            rng.uniform(-1, 1, (outer, features)).astype(np.float32))


def tempo_runner(system: str, outer: int, steps: int, features: int) -> Callable[[], list]:
    import tempo as tp
    mode, nests = TEMPO[system]
    xs, ws = _data(outer, steps, features)
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x, w = tp.const(xs)[i, t], tp.const(ws)[i]
        h = tp.placeholder(shape=(features,), dtype="float32", domain=(i,))
        g = (h * 0.5 + w).tanh()
        s = tp.placeholder(shape=(features,), dtype="float32", domain=(i, t))
        s[t == 0] = x + g
        s[True] = (s[i, t - 1] * 0.5 + x * g).tanh()
        m = s[i, T - 1] * 2.0
        h[0] = w[0]
        h[i + 1] = h[i] + m[i]
    outputs = [s, m, h]
    exe = ctx.compile({I: outer, T: steps}, outputs, backend="jax", loops=tp.LoopPolicy(mode, nests=nests))

    def run() -> list:
        res = exe.run()
        return [np.asarray(res[rt]) for rt in outputs]
    run.choices = exe.loop_choices  # type: ignore[attr-defined]
    return run


def jax_runner(outer: int, steps: int, features: int) -> Callable[[], list]:
    import jax
    import jax.numpy as jnp
    xs, ws = _data(outer, steps, features)

    @jax.jit
    def program(xs: jax.Array, ws: jax.Array) -> tuple[jax.Array, ...]:
        def outer_step(h: jax.Array, xw: tuple) -> tuple:
            x, w = xw
            g = jnp.tanh(h * 0.5 + w)

            def inner_step(s: jax.Array, xt: jax.Array) -> tuple:
                s = jnp.tanh(s * 0.5 + xt * g)
                return s, s
            s0 = x[0] + g
            last, rest = jax.lax.scan(inner_step, s0, x[1:])
            m = last * 2.0
            return h + m, (jnp.concatenate([s0[None], rest]), m, h)
        _, (s, m, h) = jax.lax.scan(outer_step, ws[0], (xs, ws))
        return s, m, h
    args = (jnp.asarray(xs), jnp.asarray(ws))
    return lambda: [np.asarray(v) for v in program(*args)]


def measure(run: Callable[[], list], warmup: int, runs: int) -> tuple[float, list]:
    for _ in range(warmup):
        out = run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16x16,64x32", help="I x T, comma separated")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5, help="measured runs per cell")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    lines = ["| I x T | system | ms per run | jax / system | loop forms |", "| --- | --- | --- | --- | --- |"]
    for size in args.sizes.split(","):
        outer, steps = (int(v) for v in size.split("x"))
        results = {}
        for system in SYSTEMS:
            run = jax_runner(outer, steps, args.features) if system == "jax" \
                else tempo_runner(system, outer, steps, args.features)
            seconds, out = measure(run, warmup=8 if system == "tempo-timed" else 2, runs=args.runs)
            forms = ", ".join(f"{c.name}: {c.form}" for c in getattr(run, "choices", {}).values()
                              if c.form != "batched")
            results[system] = (seconds, out, forms)
        reference = results["jax"][1]
        for system, (seconds, out, forms) in results.items():
            for got, expected in zip(out, reference):  # every system computes the same values
                np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=system)
            ratio = results["jax"][0] / seconds
            lines.append(f"| {outer} x {steps} | {system} | {seconds * 1e3:.2f} | {ratio:.2f}x | {forms} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
