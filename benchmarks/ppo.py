"""PPO, side by side: Tempo (NumPy and JAX backends) against a CleanRL-style PyTorch PPO
and a PureJaxRL-style fully-jitted JAX PPO, same hyperparameters, same env dynamics.

    python benchmarks/ppo.py                       # every env and config (~20 min on 2 cores)
    python benchmarks/ppo.py --config small --env synthetic --iterations 1
    python benchmarks/ppo.py --check               # do the baselines learn? (a few iterations)
    python benchmarks/ppo.py --time-to 475         # wall time to a mean return of 475 (gymnax)

Each (system, env, config) runs in a fresh subprocess, which reports its compile time, the
time of each iteration and its peak RSS; the tables give the median time per iteration after
the warm-up ones, env steps/s, and ratios to the Tempo rows (a ratio above 1: Tempo is
faster / smaller). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run as a script, this folder is on the path: import it as the package it is instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    Cell,
    EnvSettings,
    Measurement,
    PPOSettings,
    fmt,
    ratio,
    render,
    report_result,
    run_worker,
    score,
)

CONFIGS: dict[str, dict[str, int]] = {
    "small": {"num_envs": 32, "num_steps": 250},
    "paper": {"num_envs": 512, "num_steps": 250},
}
"""Envs x rollout length of each config (250 x 32 = 8,000 steps split into 4 minibatches);
the rest of PPO's hyperparameters are Tempo's config's (PPOConfig)."""
DEFAULT_ITERATIONS = {"small": 3, "paper": 2}
"""Measured iterations per config (after the warm-up ones) when --iterations is not given."""
SYNTHETIC_OBS_SHAPE = (3, 4, 4)
SYSTEMS = ("tempo-numpy", "tempo-jax", "torch", "jax", "gym-alone")
TEMPO = ("tempo-numpy", "tempo-jax", "tempo")
"""Tempo's rows: a backend forced, or (``tempo``) the default config's own (``auto``)."""
TIME_TO_SYSTEMS = ("tempo", "jax")
TIME_TO_SEEDS = (0, 1, 2)
TIME_TO_WINDOW = 20
"""``--time-to``: the mean return of the last this many episodes must reach the target."""
ENV_IMPLS = {
    "synthetic": {"tempo-numpy": ["synthetic"], "tempo-jax": ["synthetic"], "torch": ["synthetic"],
                  "jax": ["synthetic"]},
    "cartpole": {"tempo-numpy": ["gymnasium", "gymnax"], "tempo-jax": ["gymnasium", "gymnax"],
                 "torch": ["gymnasium"], "jax": ["gymnax"], "gym-alone": ["gymnasium"]},
}
"""How each system steps each env: Tempo runs CartPole both on the host (gymnasium) and in
the graph (gymnax); the PyTorch baseline uses gymnasium, the JAX one gymnax. ``gym-alone``
is no PPO: gymnasium stepping the same envs with random actions, the floor of every
gymnasium row (``benchmarks/baselines/gym_alone.py``)."""
TORCH_MISSING = "not installed (pip install torch==2.13.0)"


# ---- one cell, in its own process ------------------------------------------------------
def run_cell(cell: Cell) -> Measurement:
    """Run ``cell`` in this process, with the system's own runner."""
    if cell.system in TEMPO:
        from benchmarks import tempo_runner
        return tempo_runner.run(cell)
    if cell.system == "torch":
        from benchmarks.baselines import torch_ppo
        return torch_ppo.run(cell)
    if cell.system == "jax":
        from benchmarks.baselines import jax_ppo
        return jax_ppo.run(cell)
    if cell.system == "gym-alone":
        from benchmarks.baselines import gym_alone
        return gym_alone.run(cell)
    raise ValueError(f"unknown system {cell.system!r}; the systems are {SYSTEMS}")


def worker(spec: str) -> None:
    """The subprocess side: run one cell, print its result as one JSON line."""
    cell = Cell.from_json(json.loads(spec))

    def run() -> dict[str, Any]:
        try:
            m = run_cell(cell)
        except ImportError as err:
            if getattr(err, "name", "") == "torch":
                return {"error": TORCH_MISSING}
            raise
        return {"compile_s": m.compile_s, "iteration_s": m.iteration_s, "note": m.note,
                "score_first": score(cell.env, cell.steps_per_iteration, m.episode_returns, last=False),
                "score_last": score(cell.env, cell.steps_per_iteration, m.episode_returns),
                "setup_s": m.setup_s, "episodes": m.episodes, "returns": m.episode_returns,
                "init_compile_s": m.init_compile_s}
    report_result(run)


@dataclass
class Row:
    """A cell's result, summarised."""

    cell: Cell
    compile_s: float | None = None
    first_s: float | None = None
    """The warm-up iterations' time, together."""
    ready_s: float | None = None
    """Compile plus the first iteration: how long until the first iteration's results are in
    (issue 22 asks Tempo's to be at most the JAX PPO's compile)."""
    iteration_s: float | None = None
    peak_rss_mb: float | None = None
    score_first: float | None = None
    score_last: float | None = None
    note: str = ""
    error: str = ""
    init_compile_s: float | None = None
    """The JAX PPO's initialization program's compile (``Measurement.init_compile_s``)."""

    @property
    def steps_per_s(self) -> float | None:
        return self.cell.steps_per_iteration / self.iteration_s if self.iteration_s else None


def spawn(cell: Cell, timeout: float) -> Row:
    """Run ``cell`` in a fresh Python process and summarise what it reports."""
    if cell.system == "torch" and importlib.util.find_spec("torch") is None:
        return Row(cell, error=TORCH_MISSING)
    out = run_worker(Path(__file__).resolve(), json.dumps(cell.to_json()), timeout, ROOT)
    if out.get("error"):
        return Row(cell, peak_rss_mb=out.get("peak_rss_mb"), error=out["error"])
    times = out["iteration_s"]
    median = statistics.median(times[cell.warmup:] or times)
    first = sum(times[:cell.warmup]) if cell.warmup and len(times) > cell.warmup else None
    ready = out["compile_s"] + times[0] if out["compile_s"] is not None and times else None
    return Row(cell, out["compile_s"], first, ready, median, out["peak_rss_mb"], out["score_first"],
               out["score_last"], out.get("note", ""), init_compile_s=out.get("init_compile_s"))


# ---- what to run --------------------------------------------------------------------------
def make_cells(system: str, env_name: str, config: str, iterations: int, warmup: int,
               passes: tuple[str, ...] | None = None, label: str = "") -> list[Cell]:
    """The cells of ``system`` on ``env_name`` at ``config``: one per env implementation."""
    from benchmarks.tempo_runner import base_config
    sizes = CONFIGS[config]
    cells = []
    for impl in ENV_IMPLS[env_name].get(system, []):
        cfg = base_config(impl)
        cfg["algorithm"]["num_steps"] = sizes["num_steps"]
        ppo = PPOSettings.from_config(cfg)
        if env_name == "synthetic":
            env = EnvSettings("synthetic", sizes["num_envs"], SYNTHETIC_OBS_SHAPE,
                              int(cfg["env"]["num_actions"]), int(cfg["env"]["episode_length"]))
        else:
            env = EnvSettings("cartpole", sizes["num_envs"], (4,), 2, 500)
        if (env.num_envs * ppo.num_steps) % ppo.num_minibatches:
            raise ValueError(f"{config}: {env.num_envs} x {ppo.num_steps} steps do not split into "
                             f"{ppo.num_minibatches} minibatches")
        cells.append(Cell(system, impl, config, env, ppo, warmup, iterations, passes=passes,
                          label=label or system, tempo_cfg=cfg))
    return cells


def pipeline_passes() -> list[str]:
    """The names of Tempo's optimization passes, in order (read now: the list grows)."""
    from tempo.passes import PIPELINE
    return [name for name, _ in PIPELINE]


# ---- tables ---------------------------------------------------------------------------------
def score_text(row: Row) -> str:
    if row.score_last is None:
        return "—"
    return f"{fmt(row.score_first)} -> {fmt(row.score_last)}"


def measured(row: Row) -> list[str]:
    """The columns every table has: compile, first iterations, per iteration, RSS, score."""
    return [fmt(row.compile_s), fmt(row.first_s), fmt(row.ready_s), fmt(row.iteration_s, 3),
            fmt(row.steps_per_s), fmt(row.peak_rss_mb, 0), score_text(row)]


MEASURED = ["compile s", "first iter s", "ready s", "s/iter", "env steps/s", "peak RSS MiB",
            "score first -> last"]


def main_table(env_name: str, config: str, rows: list[Row], markdown: bool) -> str:
    """The systems side by side, with ratios to the Tempo rows on the same env implementation."""
    headers = ["system", "env", *MEASURED, "s/iter / tempo-numpy", "s/iter / tempo-jax",
               "RSS / tempo-numpy", "RSS / tempo-jax", "jax compile / ready", "jax compiles / ready"]
    ref = {(r.cell.system, r.cell.impl): r for r in rows if r.cell.system in TEMPO and not r.error}
    jax_rows = {r.cell.impl: r for r in rows if r.cell.system == "jax" and not r.error}
    impls = list(dict.fromkeys(r.cell.impl for r in rows))
    body = []
    for r in sorted(rows, key=lambda r: (impls.index(r.cell.impl), SYSTEMS.index(r.cell.system))):
        if r.error:
            body.append([r.cell.label, r.cell.impl, r.error] + [""] * (len(headers) - 3))
            continue
        np_ref, jax_ref = ref.get(("tempo-numpy", r.cell.impl)), ref.get(("tempo-jax", r.cell.impl))
        body.append([r.cell.label, r.cell.impl, *measured(r),
                     ratio(r.iteration_s, np_ref and np_ref.iteration_s),
                     ratio(r.iteration_s, jax_ref and jax_ref.iteration_s),
                     ratio(r.peak_rss_mb, np_ref and np_ref.peak_rss_mb),
                     ratio(r.peak_rss_mb, jax_ref and jax_ref.peak_rss_mb),
                     *((ratio(jax_rows[r.cell.impl].compile_s, r.ready_s),
                        ratio(_all_compiles(jax_rows[r.cell.impl]), r.ready_s))
                       if r.cell.system in TEMPO and r.cell.impl in jax_rows else ("—", "—"))])
    c = rows[0].cell
    title = (f"PPO on {env_name}, config {config}: {c.env.num_envs} envs x {c.ppo.num_steps} steps = "
             f"{c.steps_per_iteration:,} env steps/iteration, {c.warmup} warm-up + {c.iterations} "
             f"measured iterations")
    notes = sorted({f"{r.cell.label}: {r.note}" for r in rows if r.note})
    return render(title, headers, body, notes, markdown, text_columns=2)


def _all_compiles(row: Row) -> float | None:
    """The JAX PPO's programs compiled, its initialization's and its iteration's."""
    if row.compile_s is None or row.init_compile_s is None:
        return None
    return row.compile_s + row.init_compile_s


def ablation_table(env_name: str, config: str, rows: list[Row], markdown: bool) -> str:
    """Tempo (NumPy backend) with each optimization pass turned off, and with none."""
    headers = ["passes", *MEASURED, "s/iter / all passes", "compile / all passes", "RSS / all passes"]
    base = rows[0]
    body = []
    for r in rows:
        if r.error:
            body.append([r.cell.label, r.error] + [""] * (len(headers) - 2))
            continue
        body.append([r.cell.label, *measured(r), ratio(r.iteration_s, base.iteration_s),
                     ratio(r.compile_s, base.compile_s), ratio(r.peak_rss_mb, base.peak_rss_mb)])
    title = f"Ablation: Tempo (numpy backend) without its passes, PPO on {env_name}, config {config}"
    return render(title, headers, body, [], markdown, text_columns=2)


FOOTNOTES = [
    "s/iter: median over the measured iterations; env steps/s = env steps per iteration / s/iter; "
    "a ratio above 1x means Tempo is faster (or smaller).",
    "compile s: Tempo's compile_seconds; the JAX baseline's jit lower + compile; torch has none. "
    "Tempo's JAX backend jit-compiles its kernels during the first iteration (first iter s: the "
    "warm-up iterations together). ready s: compile plus the first iteration; jax compile / ready: "
    "the JAX PPO's compile over a Tempo row's ready s (1x or more: Tempo's first iteration is done "
    "no later than the JAX PPO has compiled); jax compiles / ready: the same with the JAX PPO's "
    "initialization program's compile added (parameters, optimizer state, first env states: "
    "PureJaxRL compiles them inside its one program, and Tempo's ready s includes its own).",
    "peak RSS: ru_maxrss of the process that ran the cell (one fresh process per cell).",
    "score: on the synthetic env the mean reward per step over about one iteration's episodes, the "
    "first ones -> the last ones (random policy 1/num_actions = 0.5, perfect 1.0); on CartPole the "
    "mean return of the first / last 20 episodes.",
]


# ---- the command ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="all", choices=[*CONFIGS, "all"])
    p.add_argument("--env", default="all", choices=[*ENV_IMPLS, "all"])
    p.add_argument("--iterations", type=int, default=None,
                   help=f"measured iterations per cell (default per config: {DEFAULT_ITERATIONS})")
    p.add_argument("--warmup", type=int, default=3,
                   help="warm-up iterations before them (default 3: Tempo's JAX backend compiles its "
                        "kernels and scans in the first, and makes some loops' plans in the second)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of " + ", ".join(SYSTEMS))
    p.add_argument("--ablation", default="default", choices=["default", "all", "none"],
                   help="where to run the pass ablation: default: the synthetic env at the first "
                        "config run, when tempo-numpy runs; all: every env and config run; none")
    p.add_argument("--markdown", type=Path, default=None, help="also write the tables as Markdown here")
    p.add_argument("--check", action="store_true",
                   help="only check that every system learns the synthetic env (small config)")
    p.add_argument("--check-iterations", type=int, default=6)
    p.add_argument("--time-to", type=float, default=None, metavar="RETURN",
                   help="only measure the wall time to this mean return on gymnax CartPole (e.g. 475), "
                        "Tempo's default config against the JAX PPO, seeds 0-2")
    p.add_argument("--baseline-cache", action="store_true",
                   help="give the JAX baseline JAX's persistent compilation cache, as Tempo's runs have "
                        "theirs (jax-baseline/ in Tempo's cache directory; JAX's default is none), so "
                        "that runs after the first compare warm with warm")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per cell (default 1200)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    return args


def check(args: argparse.Namespace) -> int:
    """Each system learns the synthetic bandit at the small config: the last iteration's
    reward per step is above random (1/num_actions) by a margin and above the first's."""
    failures = 0
    print(f"check: PPO on the synthetic env, config small, {args.check_iterations} iterations each")
    for system in args.systems:
        for cell in make_cells(system, "synthetic", "small", args.check_iterations, 0):
            row = spawn(cell, args.timeout)
            chance = 1.0 / cell.env.num_actions
            if row.error:
                ok, verdict = row.error == TORCH_MISSING, row.error
            else:
                ok = row.score_last is not None and row.score_last > chance + 0.1 \
                    and row.score_last > (row.score_first or 0.0)
                verdict = (f"reward/step {score_text(row)} (random {chance:.2f}), "
                           f"{fmt(row.iteration_s, 3)} s/iter: {'learns' if ok else 'DOES NOT LEARN'}")
            failures += not ok
            print(f"  {system:12s} {cell.impl:10s} {verdict}", flush=True)
    print("check passed" if not failures else f"check FAILED for {failures} system(s)")
    return 1 if failures else 0


def baseline_cache_dir() -> str | None:
    """Where ``--baseline-cache`` keeps the JAX baseline's compiled programs: in Tempo's
    cache directory (``tempo.cache``; none where Tempo's cache is off), next to Tempo's own
    (``jax/``), so that neither system finds the other's programs."""
    from tempo.cache import cache_dir
    root = cache_dir()
    return None if root is None else str(root / "jax-baseline")


def baseline_cache_note(on: bool) -> str:
    """What the tables' notes say about the two systems' compile caches."""
    tempo = "Tempo's compile cache (isl's schedules, loop programs, XLA's programs) is on, as by default"
    where = baseline_cache_dir()
    if where is None:
        return "caches: none for either system (TEMPO_CACHE_DIR=off)."
    if on:
        return f"caches: {tempo}; the JAX baseline keeps its XLA programs in {where} (--baseline-cache)."
    return (f"caches: {tempo}; the JAX baseline has none, as JAX by default (--baseline-cache gives it "
            "one): a second run compares a warm Tempo with a cold baseline.")


def with_baseline_cache(cell: Cell, on: bool) -> Cell:
    """``cell``, whose JAX baseline keeps its compiled programs (``baseline_cache_dir``)
    where ``on``."""
    if not on or cell.system != "jax":
        return cell
    return dataclasses.replace(cell, jax_cache_dir=baseline_cache_dir())


def default_gymnax_cell(system: str, seed: int) -> Cell:
    """PPO with the default training config (``python scripts/train.py``: 8 envs x 64 steps,
    256k env steps) on gymnax's CartPole-v1, run whole."""
    from benchmarks.tempo_runner import base_config
    cfg = base_config("gymnax")
    ppo = PPOSettings.from_config(cfg)
    env = EnvSettings("cartpole", int(cfg["env"]["num_envs"]), (4,), 2, 500)
    iterations = int(cfg["total_timesteps"]) // (env.num_envs * ppo.num_steps)
    return Cell(system, "gymnax", "default", env, ppo, 0, iterations, seed=seed, label=system, tempo_cfg=cfg)


def seconds_to(target: float, out: dict[str, Any]) -> tuple[float, int] | None:
    """Wall time from the start of training (setup and compile included) to the end of the
    first iteration after which the last ``TIME_TO_WINDOW`` episodes average ``target`` or
    more, and that iteration; None if the run never got there."""
    elapsed, seen = out["setup_s"], 0
    returns = out["returns"]
    for k, (seconds, finished) in enumerate(zip(out["iteration_s"], out["episodes"])):
        elapsed += seconds
        seen += finished
        last = returns[max(0, seen - TIME_TO_WINDOW):seen]
        if len(last) == TIME_TO_WINDOW and sum(last) / TIME_TO_WINDOW >= target:
            return elapsed, k
    return None


def time_to(args: argparse.Namespace) -> int:
    """Wall time to a mean return of ``args.time_to`` on gymnax CartPole, Tempo (default
    config) against the jitted JAX PPO, same hyperparameters, seeds 0-2."""
    headers = ["system", "seed", "setup + compile s", "s to target", "iteration", "env steps",
               "jax / tempo"]
    body, reached = [], {}
    for seed in TIME_TO_SEEDS:
        for system in TIME_TO_SYSTEMS:
            cell = with_baseline_cache(default_gymnax_cell(system, seed), args.baseline_cache)
            print(f"... time to {args.time_to:g}: {system}, seed {seed}", file=sys.stderr, flush=True)
            out = run_worker(Path(__file__).resolve(), json.dumps(cell.to_json()), args.timeout, ROOT)
            if out.get("error"):
                body.append([system, str(seed), out["error"]] + [""] * (len(headers) - 3))
                continue
            hit = seconds_to(args.time_to, out)
            reached[system, seed] = hit[0] if hit else None
            body.append([system, str(seed), fmt(out["setup_s"]), fmt(hit[0]) if hit else "not reached",
                         str(hit[1]) if hit else "—",
                         f"{(hit[1] + 1) * cell.steps_per_iteration:,}" if hit else "—",
                         ratio(reached.get(("jax", seed)), reached.get(("tempo", seed)))
                         if system == "jax" else ""])
    cell = default_gymnax_cell("tempo", 0)
    title = (f"Time to a mean return of {args.time_to:g} (last {TIME_TO_WINDOW} episodes), PPO on gymnax "
             f"CartPole-v1, default config: {cell.env.num_envs} envs x {cell.ppo.num_steps} steps, "
             f"{cell.iterations} iterations at most")
    notes = ["s to target: from the start of the system's training function (env, parameters, "
             "tracing, compiling) to the end of the iteration that reached the target; process "
             "start-up and the imports of JAX and gymnax excluded for both (Tempo's TensorBoard writer "
             "still imports inside its clock). jax / tempo above 1x: Tempo got there first.",
             "tempo: the default config (backend auto: JAX on this machine); jax: "
             "benchmarks/baselines/jax_ppo.py, one jitted program for the initialization and one for "
             "an iteration.", baseline_cache_note(args.baseline_cache)]
    table = render(title, headers, body, notes, False, text_columns=1)
    print(table)
    if args.markdown:
        args.markdown.write_text(render(title, headers, body, notes, True, text_columns=1))
        print(f"wrote {args.markdown}")
    return 0


def ablation_variants() -> list[tuple[str, tuple[str, ...]]]:
    """``(label, passes)``: each pass of the pipeline turned off, then none; runs that would
    be the same (one pass: "all but it" is "none") are merged."""
    names = pipeline_passes()
    labels: dict[tuple[str, ...], list[str]] = {}
    for name in names:
        labels.setdefault(tuple(x for x in names if x != name), []).append(f"all but {name}")
    labels.setdefault((), []).append("none")
    return [(" = ".join(reversed(v)), passes) for passes, v in labels.items()]


def run_ablation(env_name: str, config: str, iterations: int, warmup: int, rows: list[Row],
                 timeout: float) -> list[Row]:
    """Tempo (NumPy) with all passes (from ``rows`` when it ran there), then each variant."""
    impl = ENV_IMPLS[env_name]["tempo-numpy"][0]
    label = f"all ({', '.join(pipeline_passes())})"
    full = next((r for r in rows if r.cell.system == "tempo-numpy" and r.cell.impl == impl), None)
    if full is None:
        full = spawn(make_cells("tempo-numpy", env_name, config, iterations, warmup)[0], timeout)
    result = [dataclasses.replace(full, cell=dataclasses.replace(full.cell, label=label))]
    for label, passes in ablation_variants():
        cell = make_cells("tempo-numpy", env_name, config, iterations, warmup, passes=passes, label=label)[0]
        print(f"... {config} / {env_name}: tempo-numpy, passes {label}", file=sys.stderr, flush=True)
        result.append(spawn(cell, timeout))
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if args.check:
        return check(args)
    if args.time_to is not None:
        return time_to(args)
    started = time.perf_counter()
    configs = list(CONFIGS) if args.config == "all" else [args.config]
    envs = list(ENV_IMPLS) if args.env == "all" else [args.env]
    ablate: set[tuple[str, str]] = set()
    if args.ablation == "all":
        ablate = {(e, c) for e in envs for c in configs}
    elif args.ablation == "default" and "tempo-numpy" in args.systems:
        ablate = {("synthetic" if "synthetic" in envs else envs[0], configs[0])}
    text: list[str] = []
    md: list[str] = []

    def emit(table: str, markdown: str) -> None:
        print(table, flush=True)
        text.append(table)
        md.append(markdown)

    for config in configs:
        iterations = args.iterations or DEFAULT_ITERATIONS[config]
        for env_name in envs:
            rows: list[Row] = []
            for system in args.systems:
                for cell in make_cells(system, env_name, config, iterations, args.warmup):
                    cell = with_baseline_cache(cell, args.baseline_cache)
                    print(f"... {config} / {env_name}: {cell.label} [{cell.impl}]", file=sys.stderr,
                          flush=True)
                    rows.append(spawn(cell, args.timeout))
            if not rows:  # (no system asked for runs on this env: gym-alone is CartPole's only)
                continue
            emit(main_table(env_name, config, rows, False), main_table(env_name, config, rows, True))
            if (env_name, config) in ablate:
                ablation = run_ablation(env_name, config, iterations, args.warmup, rows, args.timeout)
                emit(ablation_table(env_name, config, ablation, False),
                     ablation_table(env_name, config, ablation, True))
    total = time.perf_counter() - started
    notes = [*FOOTNOTES, baseline_cache_note(args.baseline_cache)]
    emit("\n".join(notes) + f"\ntotal wall time: {total:.0f} s\n",
         "\n".join(f"- {n}" for n in notes) + f"\n\nTotal wall time: {total:.0f} s\n")
    if args.markdown:
        args.markdown.write_text("\n".join(md))
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
