"""XLA compile time program by program: Tempo's PPO against the jitted JAX PPO.

    python benchmarks/compile_split.py                   # the paper's size (512 envs x 250 steps)
    python benchmarks/compile_split.py --config small    # 32 envs x 250 steps

Issue 22 asks a fresh Tempo run to be ready (compile and first iteration) no later than
the JAX PPO has compiled. This says how much XLA compiling each side holds: a fresh process
per system runs one iteration on gymnax CartPole (Tempo: ``tempo_rl.train``, a fresh
compile cache; JAX: ``baselines/jax_ppo.py``, its initialization too), records the MLIR of
every program it compiles, then compiles each alone again, with nothing else running, on one device (the
least of ``--repeats``). A run's own compile times are longer: Tempo compiles on two
background threads while its iteration runs, and on two cores they slow each other.
Counts are the instructions of each program after XLA's optimizations. Tempo's own
compile (its passes and isl's schedule) is not in these figures: ``compile_report=true``
splits it.

Compiling an MLIR module outside ``jax.jit`` uses JAX's compiler directly
(``jax._src.compiler.get_compile_options``, the backend's ``compile_and_load``), checked
with the JAX this project pins."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import fmt, render, report_result, run_worker  # noqa: E402

SYSTEMS = ("tempo-jax", "jax")


def capture_programs(run: Any) -> list[tuple[str, str]]:
    """``run()``, and the (name, MLIR text) of every program JAX compiled while it ran, in
    order (JAX's ``jax_dump_ir_to``: jitted calls and compiles ahead alike)."""
    import jax

    with tempfile.TemporaryDirectory(prefix="compile-split-ir-") as dump:
        jax.config.update("jax_dump_ir_to", dump)
        try:
            run()
        finally:
            jax.config.update("jax_dump_ir_to", "")
        files = sorted(Path(dump).glob("*_compile.mlir"))
        return [(_module_name(f), f.read_text()) for f in files]


def _module_name(path: Path) -> str:
    """A dumped module's program name (``jax_ir0012_jit_<function>_compile.mlir``)."""
    return path.name.split("_", 2)[2].removesuffix("_compile.mlir")


def compile_alone(text: str, repeats: int) -> tuple[float, int]:
    """The least time of ``repeats`` compiles of an MLIR module on the first device, and
    its instructions after XLA's optimizations."""
    import jax
    from jax._src import compiler
    from jax._src.lib import xla_client
    from jax.extend.backend import get_backend

    backend = get_backend()
    devices = xla_client.DeviceList(tuple(jax.devices()[:1]))
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    best, executable = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        executable = backend.compile_and_load(text, devices, options)
        best = min(best, time.perf_counter() - start)
    hlo = "\n".join(m.to_string() for m in executable.hlo_modules())
    return best, sum(" = " in line for line in hlo.splitlines())


def run_system(system: str, config: str) -> list[tuple[str, str]]:
    """One iteration of ``system`` at ``config``: the programs it compiled."""
    from benchmarks.ppo import make_cells

    [cell] = [c for c in make_cells(system, "cartpole", config, 1, 0) if c.impl == "gymnax"]
    if system == "jax":
        from benchmarks.baselines import jax_ppo
        return capture_programs(lambda: jax_ppo.run(cell))
    from benchmarks import tempo_runner
    return capture_programs(lambda: tempo_runner.run(cell))  # (a fresh cache: ``main``)


def worker(spec: str) -> None:
    """The worker side: capture one system's programs, then compile each alone."""
    job = json.loads(spec)

    def measure() -> dict[str, Any]:
        programs = run_system(job["system"], job["config"])
        rows = []
        for name, text in programs:
            seconds, instructions = compile_alone(text, job["repeats"])
            rows.append({"name": name, "seconds": seconds, "instructions": instructions})
        return {"programs": rows}
    report_result(measure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=["small", "paper"], default="paper")
    parser.add_argument("--repeats", type=int, default=2, help="compiles of each program (the least counts)")
    parser.add_argument("--top", type=int, default=8, help="programs listed per system (the longest)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return
    rows, totals = [], {}
    for system in SYSTEMS:
        print(f"... {system}: one iteration at {args.config}, then each program compiled alone", flush=True)
        spec = json.dumps({"system": system, "config": args.config, "repeats": args.repeats})
        with tempfile.TemporaryDirectory(prefix="tempo-compile-split-") as fresh:  # every program compiled
            out = run_worker(Path(__file__).resolve(), spec, args.timeout, ROOT,
                             {**os.environ, "TEMPO_CACHE_DIR": fresh})
        if out.get("error"):
            rows.append([system, out["error"]])
            continue
        programs = sorted(out["programs"], key=lambda p: -p["seconds"])
        totals[system] = sum(p["seconds"] for p in programs)
        instructions = sum(p["instructions"] for p in programs)
        rows.append([system, f"all {len(programs)}", fmt(totals[system]), f"{instructions:,}"])
        rows += [[system, p["name"], fmt(p["seconds"], 3), f"{p['instructions']:,}"]
                 for p in programs[:args.top]]
    notes = ["seconds: each program compiled alone on one device, nothing else running (the least of "
             f"{args.repeats}); instructions: after XLA's optimizations",
             "Tempo's own compile (passes, isl's schedule) comes before its programs and is not counted"]
    if len(totals) == 2:
        share = totals["tempo-jax"] / totals["jax"]
        notes.append(f"Tempo's programs take {share:.2f}x the JAX PPO's compile time")
    print(render(f"XLA programs of one PPO iteration, gymnax CartPole, config {args.config}",
                 ["system", "program", "compile s", "instructions"], rows, notes, args.markdown,
                 text_columns=2))


if __name__ == "__main__":
    main()
