"""Memory and speed on large observations: Tempo's n-step A2C and REINFORCE, with each of
its memory policies, against the same algorithms written directly in JAX.

    python benchmarks/memory.py                            # T = 250, 1000, 4000 (long)
    python benchmarks/memory.py --steps 250 1000 --iterations 3
    python benchmarks/memory.py --algorithms nstep-per-step --systems tempo-low --steps 250 4000
    python benchmarks/memory.py --check                    # the baselines' losses are finite

The env is the synthetic contextual bandit (``tempo_rl/envs/synthetic.py``) with 3x64x64
observations (12,288 floats, 48 KiB per env step) and 8 envs, so a rollout of T steps holds
T x 384 KiB of observations (94 MiB at T=250, 1.5 GiB at T=4000) which the learning step
reads. Rows:

- ``tempo memory=default`` / ``tempo memory=low``: ``tempo_rl.train.train`` on
  ``algorithm=<alg> env=synthetic backend=jax memory=<policy>`` (``conf/memory/``);
- ``jax``: ``baselines/jax_nstep.py``: one ``jax.jit`` per iteration (rollout in a
  ``lax.scan`` storing the observations, vectorized returns, one Adam step).

Both read their hyperparameters from Tempo's config (``conf/algorithm/<alg>.yaml``), with
the learning rate set to ``--learning-rate`` (1e-3) for both. ``nstep-per-step`` is n-step
with ``algorithm.normalize_advantages=false`` (for both systems): its loss is a sum of
per-step terms, so ``memory=low``'s incremental schedule learns ``n`` steps behind acting and
its memory does not grow with T. With normalized advantages (``nstep``, the default) the
same schedule splits each step's policy gradient into parts that need no statistics of
the rollout (``tempo.passes.defer``): bounded too, for more work per step.
Each (algorithm, system, T) runs in a fresh subprocess, which reports its peak RSS
(``ru_maxrss``), compile time and each iteration's time; the tables give the median time
per iteration after the warm-up one, and Tempo's RSS and time over the JAX row's at the
same T (below 1x: Tempo is smaller or faster). A cell that fails (out of memory, a
timeout, an error) says so in its row.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run as a script, this folder is on the path: import it as the package it is instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

from benchmarks.common import fmt, ratio, render, report_result, run_worker  # noqa: E402

ALGORITHMS = ("nstep", "nstep-per-step", "reinforce")
VARIANTS = {"nstep-per-step": ("nstep", ("algorithm.normalize_advantages=false",))}
"""Algorithms run with overrides of their config: ``nstep-per-step`` is n-step whose loss
is a sum of per-step terms (advantages not normalized over the rollout), whose learning
trails acting by ``n`` steps under ``memory=low`` without splitting its gradients."""
SYSTEMS = ("tempo-default", "tempo-low", "jax")
"""``tempo-<policy>``: Tempo with ``memory=<policy>`` (``conf/memory/<policy>.yaml``)."""
OBS_SHAPE = (3, 64, 64)
NUM_ENVS = 8
DEFAULT_STEPS = (250, 1000, 4000)
LEARNING_RATE = 1e-3


@dataclass(frozen=True)
class MemoryCell:
    """One measured run: an algorithm on one system at one rollout length."""

    algorithm: str
    system: str
    num_steps: int
    iterations: int
    """All iterations, the warm-up ones included."""
    warmup: int = 1
    learning_rate: float = LEARNING_RATE
    loops: str = "lowered"
    """Tempo's ``loops`` config key (how its JAX backend runs loops)."""
    seed: int = 0

    @property
    def label(self) -> str:
        return "jax" if self.system == "jax" else f"tempo memory={self.system.removeprefix('tempo-')}"

    @property
    def steps_per_iteration(self) -> int:
        return NUM_ENVS * self.num_steps


# ---- one cell, in its own process ------------------------------------------------------
def tempo_config(cell: MemoryCell) -> dict[str, Any]:
    """The training config of the cell, composed as ``scripts/train.py`` would from these
    overrides."""
    from tempo_rl.config import load_config
    memory = cell.system.removeprefix("tempo-") if cell.system != "jax" else "default"
    algorithm, overrides = VARIANTS.get(cell.algorithm, (cell.algorithm, ()))
    return load_config(f"algorithm={algorithm}", *overrides, "env=synthetic", f"memory={memory}",
                       f"env.obs_shape=[{','.join(str(d) for d in OBS_SHAPE)}]",
                       f"env.num_envs={NUM_ENVS}", f"algorithm.num_steps={cell.num_steps}",
                       f"algorithm.learning_rate={cell.learning_rate}", "backend=jax",
                       f"total_timesteps={cell.iterations * cell.steps_per_iteration}",
                       f"seed={cell.seed}", f"loops={cell.loops}", "progress=false", "checkpoint_every=0",
                       "logger.wandb.enabled=false")


def run_tempo(cell: MemoryCell) -> dict[str, Any]:
    """All the cell's iterations in one ``train`` call; an iteration's time is the interval
    between two iterations' metric sinks (``charts/SPS``; the first: since the run began)."""
    from tempo_rl.train import train
    with tempfile.TemporaryDirectory(prefix="tempo-memory-") as out:
        result = train(tempo_config(cell), Path(out), progress=False)
    times = [cell.steps_per_iteration / row["charts/SPS"] for row in result.history]
    losses = [{k.removeprefix("losses/"): float(v) for k, v in row.items() if k.startswith("losses/")}
              for row in result.history]
    chosen = [note.split(",")[0].removeprefix("memory: the ").removesuffix(" schedule")
              for note in result.compile_notes if note.startswith("memory: the ")]
    return {"compile_s": result.compile_seconds, "iteration_s": times, "losses": losses,
            "stores_mb": [result.memory["device_peak_mb"], result.memory["host_peak_mb"]],
            "schedule": chosen[0] if chosen else "vectorized"}


def run_jax(cell: MemoryCell) -> dict[str, Any]:
    """The plain-JAX baseline, with the hyperparameters of Tempo's config."""
    from benchmarks.baselines import jax_nstep
    from benchmarks.common import EnvSettings
    cfg = tempo_config(cell)
    hp = jax_nstep.ActorCriticSettings.from_config(cfg)
    env = EnvSettings("synthetic", NUM_ENVS, OBS_SHAPE, int(cfg["env"]["num_actions"]),
                      int(cfg["env"]["episode_length"]))
    out = jax_nstep.run(hp, env, cell.iterations, cell.seed)
    return {"compile_s": out.compile_s, "iteration_s": out.iteration_s, "losses": out.losses,
            "mean_reward": out.mean_reward}


def worker(spec: str) -> None:
    """The subprocess side: run one cell, print its result as one JSON line."""
    cell = MemoryCell(**json.loads(spec))
    report_result(lambda: run_jax(cell) if cell.system == "jax" else run_tempo(cell))


@dataclass
class Row:
    """A cell's result, summarised."""

    cell: MemoryCell
    compile_s: float | None = None
    first_s: float | None = None
    """The warm-up iterations' time, together."""
    iteration_s: float | None = None
    """The median of the measured iterations."""
    peak_rss_mb: float | None = None
    losses: list[dict[str, float]] | None = None
    error: str = ""
    stores_mb: list[float] | None = None
    """Tempo's stores at their peak: device and host MiB."""
    schedule: str = ""
    """The schedule Tempo compiled."""


def spawn(cell: MemoryCell, timeout: float) -> Row:
    """Run ``cell`` in a fresh Python process and summarise what it reports."""
    out = run_worker(Path(__file__).resolve(), json.dumps(asdict(cell)), timeout, ROOT)
    if out.get("error"):
        return Row(cell, peak_rss_mb=out.get("peak_rss_mb"), error=out["error"])
    times = out["iteration_s"]
    measured = times[cell.warmup:] or times
    first = sum(times[:cell.warmup]) if 0 < cell.warmup < len(times) else None
    return Row(cell, out["compile_s"], first, statistics.median(measured), out["peak_rss_mb"],
               out["losses"], stores_mb=out.get("stores_mb"), schedule=out.get("schedule", ""))


# ---- tables ---------------------------------------------------------------------------------
HEADERS = ["system", "T", "peak RSS MiB", "stores MiB device / host", "schedule", "s/iteration",
           "compile s", "first iter s", "RSS / jax", "s/iter / jax", "value loss first -> last"]


def value_losses(row: Row) -> str:
    """The first and last iterations' value loss: both systems should start alike."""
    if not row.losses or "value_loss" not in row.losses[0]:
        return "—"
    return f"{row.losses[0]['value_loss']:.3g} -> {row.losses[-1]['value_loss']:.3g}"


def table(algorithm: str, rows: list[Row], markdown: bool) -> str:
    """One algorithm's cells, grouped by T, with Tempo's RSS and time over the JAX row's."""
    ref = {r.cell.num_steps: r for r in rows if r.cell.system == "jax" and not r.error}
    body = []
    for r in sorted(rows, key=lambda r: (r.cell.num_steps, SYSTEMS.index(r.cell.system))):
        if r.error:
            rss = f"{fmt(r.peak_rss_mb, 0)} (at failure)" if r.peak_rss_mb else "—"
            body.append([r.cell.label, str(r.cell.num_steps), rss, r.error])
            continue
        jax_row = ref.get(r.cell.num_steps)
        tempo = r.cell.system != "jax"
        stores = f"{r.stores_mb[0]:.1f} / {r.stores_mb[1]:.1f}" if r.stores_mb else ""
        body.append([r.cell.label, str(r.cell.num_steps), fmt(r.peak_rss_mb, 0), stores, r.schedule,
                     fmt(r.iteration_s, 3), fmt(r.compile_s), fmt(r.first_s),
                     ratio(r.peak_rss_mb, jax_row and jax_row.peak_rss_mb) if tempo else "",
                     ratio(r.iteration_s, jax_row and jax_row.iteration_s) if tempo else "",
                     value_losses(r)])
    c = rows[0].cell
    obs_mib = math.prod(OBS_SHAPE) * 4 * NUM_ENVS / 2**20
    title = (f"{algorithm}: synthetic env, obs {'x'.join(map(str, OBS_SHAPE))}, {NUM_ENVS} envs, "
             f"T steps per rollout ({obs_mib:.3f} MiB of observations per step), {c.warmup} warm-up + "
             f"{c.iterations - c.warmup} measured iteration(s)")
    return render(title, HEADERS, body, [], markdown)


FOOTNOTES = [
    "peak RSS: ru_maxrss of the process that ran the cell (one fresh process per cell; "
    "a process that only imports jax and makes one array: about 235 MiB on a 2-core CPU machine).",
    "s/iteration: median of the measured iterations (Tempo: the interval between two iterations' "
    "metric sinks); first iter s: the warm-up iteration (Tempo's JAX backend jit-compiles its "
    "kernels in it).",
    "stores: the peak bytes Tempo's stores held on the device and in host memory (swapped "
    "tensors wait there with memory=low); schedule: the one Tempo compiled (memory=low: the "
    "smaller predicted peak).",
    "compile s: Tempo's compile_seconds; the JAX baseline's jit lower + compile.",
    "ratios: the Tempo row over the JAX row at the same T; below 1x Tempo is smaller / faster.",
    "value loss: mean (V - R)^2 over the rollout at the first and last iteration (random streams "
    "differ between the systems; the values should be alike).",
]


# ---- --check ----------------------------------------------------------------------------------
def check(args: argparse.Namespace) -> int:
    """Each baseline runs a few iterations at a small T (in this process) with finite losses."""
    from benchmarks.baselines import jax_nstep
    from benchmarks.common import EnvSettings
    failures = 0
    for algorithm in args.algorithms:
        cell = MemoryCell(algorithm, "jax", args.check_steps, args.check_iterations)
        cfg = tempo_config(cell)
        hp = jax_nstep.ActorCriticSettings.from_config(cfg)
        env = EnvSettings("synthetic", NUM_ENVS, OBS_SHAPE, int(cfg["env"]["num_actions"]),
                          int(cfg["env"]["episode_length"]))
        out = jax_nstep.run(hp, env, cell.iterations, cell.seed)
        finite = all(math.isfinite(v) for terms in out.losses for v in terms.values())
        ok = finite and len(out.losses) == cell.iterations
        failures += not ok
        first, last = out.losses[0], out.losses[-1]
        print(f"  jax {algorithm:9s} T={cell.num_steps}: {'ok' if ok else 'FAILED (non-finite loss)'}; "
              f"losses first {fmt_terms(first)}, last {fmt_terms(last)}; mean reward per step "
              f"{out.mean_reward[0]:.3f} -> {out.mean_reward[-1]:.3f}; "
              f"{statistics.median(out.iteration_s):.3f} s/iteration", flush=True)
        assert finite, f"{algorithm}: non-finite losses {out.losses}"
    print("check passed" if not failures else f"check FAILED for {failures} baseline(s)")
    return 1 if failures else 0


def fmt_terms(terms: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in terms.items())


# ---- the command ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, nargs="+", default=list(DEFAULT_STEPS),
                   help=f"rollout lengths T (default {' '.join(map(str, DEFAULT_STEPS))})")
    p.add_argument("--iterations", type=int, default=3,
                   help="iterations per cell, the warm-up one included (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up iterations, not measured (default 1)")
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--learning-rate", type=float, default=LEARNING_RATE,
                   help=f"both systems' learning rate (default {LEARNING_RATE})")
    p.add_argument("--loops", default="lowered", choices=["timed", "lowered", "interpreted"],
                   help="Tempo's loops config key (default lowered, as the training config)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per cell (default 900)")
    p.add_argument("--markdown", type=Path, default=None, help="also write the tables as Markdown here")
    p.add_argument("--check", action="store_true",
                   help="only run each baseline for a few iterations at a small T; assert finite losses")
    p.add_argument("--check-steps", type=int, default=64)
    p.add_argument("--check-iterations", type=int, default=4)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.iterations <= args.warmup:
        p.error(f"--iterations ({args.iterations}) must exceed --warmup ({args.warmup})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if args.check:
        return check(args)
    started = time.perf_counter()
    md: list[str] = []
    for algorithm in args.algorithms:
        rows = []
        for steps in args.steps:
            for system in args.systems:
                cell = MemoryCell(algorithm, system, steps, args.iterations, args.warmup,
                                  args.learning_rate, args.loops)
                print(f"... {algorithm}, T={steps}: {cell.label}", file=sys.stderr, flush=True)
                rows.append(spawn(cell, args.timeout))
        print(table(algorithm, rows, False), flush=True)
        md.append(table(algorithm, rows, True))
    total = time.perf_counter() - started
    print("\n".join(FOOTNOTES) + f"\ntotal wall time: {total:.0f} s", flush=True)
    if args.markdown:
        args.markdown.write_text("\n".join(md) + "\n" + "\n".join(f"- {n}" for n in FOOTNOTES)
                                 + f"\n\nTotal wall time: {total:.0f} s\n")
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
