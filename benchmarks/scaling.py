"""Data parallelism: PPO (gymnax CartPole) and n-step (synthetic env) trained with the env
dim split over 1, 2 and 4 devices (``distributed=data``), side by side.

    python benchmarks/scaling.py                          # 1, 2, 4 devices, both algorithms
    python benchmarks/scaling.py --devices 1 4 --algorithms ppo --iterations 3
    python benchmarks/scaling.py --num-envs 64                # a small run: fixed costs dominate

On a machine without an accelerator the devices are forced CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``): they share the machine's cores,
so the table shows only that the split program is correct and not pathological (its time
per iteration against one device's), not a speed-up. With accelerators, the devices are
JAX's own (``--platform gpu``), and efficiency is speed-up / devices.

Each (algorithm, devices) runs in a fresh process (JAX reads ``XLA_FLAGS`` once, at import),
which trains with ``tempo_rl.train.train`` and reports its compile time, its iterations'
times and its peak RSS; the table gives the median time per iteration after the warm-up
ones, env steps/s, and the ratios to the one-device row of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

from benchmarks.common import fmt, render, report_result, run_worker  # noqa: E402

ALGORITHMS: dict[str, list[str]] = {
    "ppo": ["algorithm=ppo", "env=gymnax_cartpole"],
    "nstep": ["algorithm=nstep", "env=synthetic"],
}
"""The config overrides of each algorithm's run (``conf/``)."""


def worker(spec: str) -> None:
    """One run, in this process: ``spec`` is the JSON of (algorithm, devices, sizes)."""
    args = json.loads(spec)

    def run() -> dict[str, Any]:
        import jax

        from tempo_rl.config import load_config
        from tempo_rl.train import train
        steps = args["num_envs"] * args["num_steps"]
        iterations = args["warmup"] + args["iterations"]
        cfg = load_config(*ALGORITHMS[args["algorithm"]],
                          f"distributed={'data' if args['devices'] > 1 else 'none'}")
        cfg["env"]["num_envs"], cfg["algorithm"]["num_steps"] = args["num_envs"], args["num_steps"]
        cfg["total_timesteps"] = iterations * steps
        cfg["seed"], cfg["progress"], cfg["checkpoint_every"] = 0, False, 0
        cfg["cache_dir"] = "off"
        cfg["logger"] = {**cfg.get("logger", {}), "wandb": {"enabled": False}}
        # Sinks where the program reaches them in every row: a mesh runs none late, and the
        # warm-up's metrics (``_per_iteration``) must end where its iterations do.
        cfg["late_sinks"] = False
        if args["devices"] > 1:
            cfg["distributed"]["devices"] = args["devices"]
        with tempfile.TemporaryDirectory(prefix="tempo-scaling-") as out:
            start = time.perf_counter()
            result = train(cfg, Path(out), progress=False)
            total = time.perf_counter() - start
        times = [steps / row["charts/SPS"] for row in result.history]
        return {"compile_s": result.compile_seconds, "setup_s": total - result.run_seconds,
                "run_s": result.run_seconds, "iteration_s": times, "platform": jax.devices()[0].platform,
                "split_mb": result.memory.get("split_peak_mb", 0.0),
                "device_mb": result.memory["device_peak_mb"]}
    report_result(run)


def spawn(args: argparse.Namespace, algorithm: str, devices: int) -> dict[str, Any]:
    spec = json.dumps({"algorithm": algorithm, "devices": devices, "num_envs": args.num_envs,
                       "num_steps": args.num_steps, "warmup": args.warmup, "iterations": args.iterations})
    env = dict(os.environ)
    if args.platform == "cpu":
        # Every row sees the same devices (the largest count), and uses the first ``devices``.
        kept = [f for f in env.get("XLA_FLAGS", "").split()
                if not f.startswith("--xla_force_host_platform_device_count")]
        env["XLA_FLAGS"] = " ".join([*kept, f"--xla_force_host_platform_device_count={max(args.devices)}"])
        env["JAX_PLATFORMS"] = "cpu"
    return run_worker(Path(__file__), spec, args.timeout, ROOT, env=env)


def table(algorithm: str, rows: dict[int, dict[str, Any]], args: argparse.Namespace) -> str:
    steps = args.num_envs * args.num_steps
    base = rows.get(1, {})
    base_s = _per_iteration(base, args.warmup)
    lines = []
    for devices, out in rows.items():
        if "error" in out:
            lines.append([str(devices), out["error"]])
            continue
        s = _per_iteration(out, args.warmup)
        speedup = base_s / s if base_s and s else None
        lines.append([str(devices), fmt(out["compile_s"]), fmt(s, 3), fmt(steps / s, 0),
                      "—" if speedup is None else f"{speedup:.2f}x",
                      "—" if speedup is None else f"{speedup / devices:.0%}",
                      f"{out['split_mb']:.2f} / {out['device_mb']:.2f}", f"{out['peak_rss_mb']:.0f}"])
    platform = next((o["platform"] for o in rows.values() if "platform" in o), args.platform)
    notes = [f"{args.num_envs} envs x {args.num_steps} steps per iteration; s/iter: mean of "
             f"{args.iterations} iterations after {args.warmup} warm-up ones",
             "speed-up: against the 1-device row",
             "split MiB: peak stored bytes split over devices / all stored bytes (MemoryStats)"]
    if platform == "cpu":
        notes.append("forced CPU devices share this machine's cores: the rows show the split program's "
                     "overhead, not a speed-up (1.00x: as fast as one device)")
    return render(f"{algorithm}: env dim split over devices ({platform})",
                  ["devices", "compile s", "s/iter", "env-steps/s", "speed-up", "efficiency",
                   "split MiB", "peak RSS MiB"], lines, notes, args.markdown)


def _per_iteration(out: dict[str, Any], warmup: int) -> float | None:
    """Seconds per iteration after the warm-up ones: the run's time from the warm-up's last
    metrics to its end, over the iterations measured. (Not the median of the metrics'
    intervals: a metric sink runs once its own inputs are computed, while the rest of its
    iteration may still run, dispatched asynchronously.)"""
    times = out.get("iteration_s", [])
    if len(times) <= warmup:
        return None
    return (out["run_s"] - sum(times[:warmup])) / (len(times) - warmup)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), default=list(ALGORITHMS))
    p.add_argument("--num-envs", type=int, default=512,
                   help="envs per iteration (the paper's 512; at 64, fixed costs per launch dominate)")
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--iterations", type=int, default=5, help="measured iterations (after the warm-up)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--platform", choices=("cpu", "gpu"), default="cpu",
                   help="cpu: forced host devices; gpu: the machine's accelerators")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--markdown", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    for algorithm in args.algorithms:
        rows = {devices: spawn(args, algorithm, devices) for devices in args.devices}
        print(table(algorithm, rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
