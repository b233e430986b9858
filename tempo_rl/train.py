"""One training run: build the algorithm's program, attach metrics and checkpoints as
sinks, compile it for all iterations, and run it."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import tempo as tp
from tempo.api import checkpoint
from tempo_rl.algorithms import algorithm
from tempo_rl.envs import Env, GymnasiumEnv
from tempo_rl.metrics import MetricLogger


@dataclass
class TrainResult:
    episode_returns: list[float]
    history: list[dict[str, float]]
    compile_seconds: float
    run_seconds: float
    checkpoint: Path | None

    def mean_return(self, last: int = 20) -> float:
        """Mean episodic return over the ``last`` finished episodes."""
        tail = self.episode_returns[-last:]
        return float(np.mean(tail)) if tail else float("nan")


def make_env(cfg: dict[str, Any], seed: int) -> Env:
    kind = cfg.get("kind", "gymnasium")
    if kind == "gymnasium":
        return GymnasiumEnv(cfg["id"], num_envs=int(cfg.get("num_envs", 8)), seed=seed)
    raise ValueError(f"unknown env kind {kind!r}; this build has 'gymnasium'")


def algorithm_config(cls: type, cfg: dict[str, Any], network: dict[str, Any]) -> Any:
    """The algorithm's dataclass from the config's algorithm and network groups; unknown
    keys are an error, not ignored."""
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in {**cfg, **network}.items()
              if k != "name" and (k != "num_steps" or "num_steps" in fields)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{cls.__name__} has no option(s) {unknown}; it has {sorted(fields)}")
    if "hidden" in values:
        values["hidden"] = tuple(values["hidden"])
    return cls(**values)


def train(cfg: dict[str, Any], out_dir: Path, progress: bool = True) -> TrainResult:
    """Run the training ``cfg`` describes (the Hydra config as a plain dict)."""
    out_dir = Path(out_dir)
    seed = int(cfg["seed"])
    env = make_env(cfg["env"], seed)
    algo = cfg["algorithm"]
    cls, build = algorithm(algo["name"])
    program = build(env, algorithm_config(cls, algo, cfg.get("network", {})), seed=seed)
    num_steps = int(algo["num_steps"])
    per_iteration = num_steps * env.num_envs
    iterations = int(cfg["total_timesteps"]) // per_iteration
    if iterations < 1:
        raise ValueError(f"total_timesteps={cfg['total_timesteps']} is less than one iteration "
                         f"({num_steps} steps x {env.num_envs} envs)")
    if cfg.get("resume_from"):
        program.optimizer.load_state(checkpoint.load(cfg["resume_from"]))
    logs = cfg.get("logger", {})
    logger = MetricLogger(out_dir, env, iterations, per_iteration,
                          wandb_cfg=logs.get("wandb") if logs.get("wandb", {}).get("enabled") else None,
                          config=cfg, progress=progress)
    ctx = program.ctx
    i, I = ctx.dims[0], program.bound("i")
    names = list(program.metrics)
    every = int(cfg.get("checkpoint_every") or 0)
    target = out_dir / "checkpoints" / "last.npz"
    with ctx:
        tp.sink([program.metrics[n] for n in names],
                lambda values, point: logger.on_iteration(names, values, point), name="metrics")
        when = i == I - 1 if every <= 0 else ((i + 1) % every == 0) | (i == I - 1)
        checkpoint.save(program.state, target, when=when)
    start = time.perf_counter()
    exe = ctx.compile(program.bounds(iterations, num_steps), backend=cfg.get("backend", "numpy"))
    compiled = time.perf_counter()
    if cfg.get("compile_report"):
        print(exe.report)
    try:
        logger.start()
        exe.run()
    finally:
        logger.close()
    return TrainResult(list(env.episode_returns), logger.history, compiled - start,
                       time.perf_counter() - compiled, target if target.exists() else None)
