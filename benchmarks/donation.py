"""Buffer donation, side by side: Tempo (JAX backend) with and without donation, against a
plain ``jax.jit`` loop with and without ``donate_argnums``.

    python benchmarks/donation.py                  # sizes 16K .. 1M floats (~1 min)
    python benchmarks/donation.py --sizes 65536 --steps 500

The program is an optimizer's step repeated: parameters ``p`` and Adam-style moments
``m``, ``v`` (each ``size`` float32s) updated in place from a gradient ``0.01 p``:

    m[t+1] = 0.9 m + 0.1 g;   v[t+1] = 0.999 v + 0.001 g^2;   p[t+1] = p - 1e-3 m / (sqrt(v) + 1e-8)

Each (system, size) runs in a fresh subprocess: the median time per step over the measured
runs (after a warm-up run, which compiles) and the subprocess's peak RSS. Ratios are the
non-donating row's over the donating one's: above 1x, donation is faster or smaller.
``MemoryPolicy.donate_min_bytes`` defaults to where the ratio crosses 1 on this machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("tempo", "tempo-no-donation", "jax", "jax-no-donation")
DEFAULT_SIZES = (16384, 65536, 262144, 1048576)


def run_tempo(size: int, steps: int, runs: int, donate: bool) -> list[float]:
    import tempo as tp
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    init = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    with ctx:
        p = tp.placeholder(shape=(size,), dtype="float32", domain=(t,))
        m = tp.placeholder(shape=(size,), dtype="float32", domain=(t,))
        v = tp.placeholder(shape=(size,), dtype="float32", domain=(t,))
        g = p * 0.01
        p[0], m[0], v[0] = tp.const(init), tp.const(np.zeros(size, np.float32)), \
            tp.const(np.zeros(size, np.float32))
        m_next, v_next = m * 0.9 + g * 0.1, v * 0.999 + g * g * 0.001
        m[t + 1], v[t + 1] = m_next, v_next
        p[t + 1] = p - m_next * 1e-3 / (v_next.sqrt() + 1e-8)
        last = p[T - 1]
    memory = tp.MemoryPolicy(donate=donate, donate_min_bytes=0)
    exe = ctx.compile({T: steps}, [last], backend="jax", memory=memory,
                      loops=tp.LoopPolicy("interpreted"))
    times = []
    for _ in range(runs + 1):
        start = time.perf_counter()
        np.asarray(exe.run()[last])
        times.append((time.perf_counter() - start) / steps)
    if donate and exe.stats.donated == 0:
        raise RuntimeError("the donating program donated nothing")
    return times[1:]


def run_jax(size: int, steps: int, runs: int, donate: bool) -> list[float]:
    import jax
    import jax.numpy as jnp

    def step(p: jax.Array, m: jax.Array, v: jax.Array) -> tuple[jax.Array, ...]:
        g = p * 0.01
        m, v = m * 0.9 + g * 0.1, v * 0.999 + g * g * 0.001
        return p - m * 1e-3 / (jnp.sqrt(v) + 1e-8), m, v
    update = jax.jit(step, donate_argnums=(0, 1, 2) if donate else ())
    init = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    times = []
    for _ in range(runs + 1):
        state = (jnp.asarray(init), jnp.zeros(size), jnp.zeros(size))
        start = time.perf_counter()
        for _ in range(steps - 1):
            state = update(*state)
        np.asarray(state[0])
        times.append((time.perf_counter() - start) / steps)
    return times[1:]


def cell(system: str, size: int, steps: int, runs: int) -> dict:
    donate = not system.endswith("-no-donation")
    run = run_tempo if system.startswith("tempo") else run_jax
    times = run(size, steps, runs, donate)
    return {"us_per_step": statistics.median(times) * 1e6,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def in_subprocess(system: str, size: int, steps: int, runs: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--cell", system, str(size), str(steps), str(runs)],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{system} at {size}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results: dict[tuple[str, int], dict], sizes: list[int]) -> str:
    lines = ["| floats per tensor | system | us/step | peak RSS MiB | no-donation / donation time | RSS |",
             "| --- | --- | --- | --- | --- | --- |"]
    for size in sizes:
        for system in SYSTEMS:
            r = results[(system, size)]
            ratio = rss = ""
            if not system.endswith("-no-donation"):
                plain = results[(f"{system}-no-donation", size)]
                ratio = f"{plain['us_per_step'] / r['us_per_step']:.2f}x"
                rss = f"{plain['rss_mib'] / r['rss_mib']:.2f}x"
            lines.append(f"| {size:,} | {system} | {r['us_per_step']:.1f} | {r['rss_mib']:.0f} | "
                         f"{ratio} | {rss} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(DEFAULT_SIZES))
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    parser.add_argument("--runs", type=int, default=5, help="measured runs per cell")
    parser.add_argument("--cell", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        system, size, steps, runs = args.cell
        sys.path.insert(0, str(ROOT))
        print(json.dumps(cell(system, int(size), int(steps), int(runs))))
        return
    results = {(system, size): in_subprocess(system, size, args.steps, args.runs)
               for size in args.sizes for system in SYSTEMS}
    print(table(results, args.sizes))


if __name__ == "__main__":
    main()
