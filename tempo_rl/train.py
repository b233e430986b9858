"""One training run: build the algorithm's program, attach metrics and checkpoints as
sinks, compile it for all iterations, and run it."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import tempo as tp
from tempo.api import checkpoint
from tempo_rl.algorithms import TrainProgram, algorithm
from tempo_rl.envs import BraxEnv, Env, GymnasiumEnv, GymnaxEnv, NormalizedObservations, SyntheticEnv
from tempo_rl.envs.normalize import STATE_PREFIX
from tempo_rl.metrics import MIB, MetricLogger, peak_rss_bytes


@dataclass
class TrainResult:
    episode_returns: list[float]
    history: list[dict[str, float]]
    compile_seconds: float
    run_seconds: float
    checkpoint: Path | None
    compile_notes: list[str] = field(default_factory=list)
    """What the compiler's passes did (``exe.report.notes``)."""
    memory: dict[str, float] = field(default_factory=dict)
    """Peak MiB over the run: the stores' device and host bytes, the process's RSS."""

    def mean_return(self, last: int = 20) -> float:
        """Mean episodic return over the ``last`` finished episodes."""
        tail = self.episode_returns[-last:]
        return float(np.mean(tail)) if tail else float("nan")


def make_env(cfg: dict[str, Any], seed: int) -> Env:
    """The env of the config's ``env`` group (``kind``: gymnasium, gymnax, brax or synthetic),
    with normalized observations if ``normalize_obs``."""
    env = _base_env(cfg, seed)
    return NormalizedObservations(env) if cfg.get("normalize_obs") else env  # type: ignore[return-value]


def _base_env(cfg: dict[str, Any], seed: int) -> Env:
    kind = cfg.get("kind", "gymnasium")
    num_envs = int(cfg.get("num_envs", 8))
    if kind == "gymnasium":
        return GymnasiumEnv(cfg["id"], num_envs=num_envs, seed=seed)
    if kind == "brax":
        return BraxEnv(cfg["id"], num_envs=num_envs, seed=seed, backend=cfg.get("backend", "spring"),
                       episode_length=int(cfg.get("episode_length", 1000)))
    if kind == "gymnax":
        return GymnaxEnv(cfg["id"], num_envs=num_envs, seed=seed)
    if kind == "synthetic":
        return SyntheticEnv(num_envs, tuple(cfg.get("obs_shape", (4,))), int(cfg.get("num_actions", 2)),
                            int(cfg.get("episode_length", 32)), seed=seed)
    raise ValueError(f"unknown env kind {kind!r}; this build has 'gymnasium', 'gymnax', "
                     f"'brax' and 'synthetic'")


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


ENV_KEY = "__env__"
"""Checkpoint entry holding the env's pickled state (bytes as uint8)."""
NORMALIZATION_KEY = STATE_PREFIX + "mean"
"""Present in checkpoints of runs with normalized observations."""
CONFIG_KEY = "__config__"
"""Checkpoint entry holding the run's config as JSON (bytes as uint8), for evaluation."""


def train(cfg: dict[str, Any], out_dir: Path, progress: bool = True) -> TrainResult:
    """Run the training ``cfg`` describes (the Hydra config as a plain dict).

    With ``resume_from``, the run continues the checkpointed one exactly: parameters,
    optimizer state, the env's episodes in progress, and (through the program's origin)
    the random draws and iteration-dependent values such as the annealed learning rate."""
    out_dir = Path(out_dir)
    seed = int(cfg["seed"])
    env = make_env(cfg["env"], seed)
    algo = cfg["algorithm"]
    cls, build = algorithm(algo["name"])
    program = build(env, algorithm_config(cls, algo, cfg.get("network", {})), seed=seed)
    if isinstance(env, NormalizedObservations):
        program.state.update(env.state)
    num_steps = int(algo["num_steps"])
    per_iteration = num_steps * env.num_envs
    total = int(cfg["total_timesteps"]) // per_iteration
    if total < 1:
        raise ValueError(f"total_timesteps={cfg['total_timesteps']} is less than one iteration "
                         f"({num_steps} steps x {env.num_envs} envs)")
    first = _resume(program, env, cfg["resume_from"]) if cfg.get("resume_from") else 0
    if first >= total:
        raise ValueError(f"the checkpoint is at iteration {first - 1}; total_timesteps="
                         f"{cfg['total_timesteps']} has {total} iterations, none left to run")
    logs = cfg.get("logger", {})
    logger = MetricLogger(out_dir, env, total, per_iteration,
                          wandb_cfg=logs.get("wandb") if logs.get("wandb", {}).get("enabled") else None,
                          config=cfg, progress=progress, start_iteration=first)
    ctx = program.ctx
    i, I = program.dim("i"), program.bound("i")
    names = list(program.metrics)
    every = int(cfg.get("checkpoint_every") or 0)
    target = out_dir / "checkpoints" / "last.npz"
    with ctx:
        # The sink also reads what the env keeps between iterations, so it runs after the
        # env has recorded the iteration's episodes, in every schedule.
        after_env = [program.rollout.saved] if program.rollout and program.rollout.saved is not None else []
        tp.sink([program.metrics[n] for n in names] + after_env,
                lambda values, point: logger.on_iteration(names, values[:len(names)], point),
                name="metrics")
        # Sinks see the whole run's iteration numbers (the origin): i + first here.
        when = i == I - 1 if every <= 0 else ((i + first + 1) % every == 0) | (i == I - 1)
        _save_checkpoints(program, env, cfg, target, when, keep=bool(cfg.get("keep_checkpoints")))
    start = time.perf_counter()
    passes = cfg.get("passes")
    exe = ctx.compile(program.bounds(total - first, num_steps), backend=cfg.get("backend", "numpy"),
                      passes=None if passes is None else list(passes),
                      memory=tp.MemoryPolicy(**cfg.get("memory", {})),
                      loops=tp.LoopPolicy(str(cfg.get("loops") or "timed")))
    compiled = time.perf_counter()
    logger.memory = lambda: exe.stats
    if cfg.get("compile_report"):
        print(exe.report)
        print(exe.predicted_footprint())
    profile = tp.RunProfile() if cfg.get("profile") else None
    try:
        logger.start()
        exe.run(origin={i: first}, profile=profile)
    finally:
        logger.close()
    if profile is not None:
        print(profile.table(top=25))
    if cfg.get("compile_report") or profile is not None:
        for choice in exe.loop_choices.values():
            print(choice)
    memory = {"device_peak_mb": exe.stats.peak_device_bytes / MIB,
              "host_peak_mb": exe.stats.peak_host_bytes / MIB, "rss_peak_mb": peak_rss_bytes() / MIB}
    return TrainResult(list(env.episode_returns), logger.history, compiled - start,
                       time.perf_counter() - compiled, target if target.exists() else None,
                       exe.report.notes, memory)


def _save_checkpoints(program: TrainProgram, env: Env, cfg: dict[str, Any], target: Path,
                      when: Any, keep: bool) -> None:
    """A sink writing parameters, optimizer state, the env's state and the run's config at
    each iteration where ``when`` holds, to ``target`` (and ``iteration_<i>.npz`` beside it
    if ``keep``), atomically."""
    config = np.frombuffer(json.dumps(cfg, default=str).encode(), np.uint8)
    names = list(program.state)
    saved = program.rollout.saved if program.rollout is not None else None
    inputs = [program.state[n] for n in names] + ([saved] if saved is not None else [])

    def write(values: list[np.ndarray], point: dict[str, int]) -> None:
        arrays = dict(zip(names, values))
        arrays[ENV_KEY] = np.frombuffer(env.snapshot(point["i"]), np.uint8)
        arrays[CONFIG_KEY] = config
        arrays[checkpoint.POINT_KEY] = np.asarray([point["i"]], np.int64)
        checkpoint.write_atomically(target, arrays)
        if keep:
            checkpoint.write_atomically(target.with_name(f"iteration_{point['i']}.npz"), arrays)
    tp.sink(inputs, write, name="checkpoint", when=when)


def _resume(program: TrainProgram, env: Env, path: str) -> int:
    """Load a checkpoint into the program and env; the iteration to continue from."""
    saved = checkpoint.load(path)
    if ENV_KEY not in saved:
        raise ValueError(f"{path} holds no env state; it was not written by tempo_rl.train")
    program.optimizer.load_state(saved)
    if isinstance(env, NormalizedObservations):
        env.load_state(saved)
    elif NORMALIZATION_KEY in saved:
        raise ValueError(f"{path} was written by a run with env.normalize_obs=true; resume it "
                         f"with the same setting")
    env.restore(saved[ENV_KEY].tobytes())
    return int(saved[checkpoint.POINT_KEY][0]) + 1
