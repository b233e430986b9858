"""One training run: build the algorithm's program, attach metrics and checkpoints as
sinks, compile it for all iterations, and run it."""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import tempo as tp
from tempo import cache
from tempo.runtime.backends import resolve_backend
from tempo_rl import checkpoints, distributed, run_dir
from tempo_rl.algorithms import algorithm, import_algorithm_module
from tempo_rl.envs import NormalizedObservations, is_host_env, make_env
from tempo_rl.metrics import MIB, MetricLogger, peak_rss_bytes
from tempo_rl.options import AT_LEAST_ONE, ConfigError, EnvOptions, RunOptions, check_options, check_value


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


def _run_dir_of(checkpoint_path: str) -> Path | None:
    """The run dir that wrote a checkpoint at ``<run>/checkpoints/<name>.npz``."""
    path = Path(checkpoint_path).resolve()
    return path.parent.parent if path.parent.name == "checkpoints" else None


def algorithm_config(cls: type, cfg: dict[str, Any], network: dict[str, Any]) -> Any:
    """The algorithm's dataclass from the config's algorithm and network groups; unknown
    keys are an error, not ignored."""
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in {**cfg, **network}.items() if k not in ("name", "module")}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{cls.__name__} has no option(s) {unknown}; it has {sorted(fields)}")
    if "hidden" in values:
        values["hidden"] = tuple(values["hidden"])
    return cls(**values)


def train(cfg: dict[str, Any], out_dir: Path, progress: bool = True) -> TrainResult:
    """Run the training ``cfg`` describes (the Hydra config as a plain dict).

    Options are checked first (``tempo_rl.options``), then the checkpoint to resume from
    (``tempo_rl.checkpoints``) and the run dir, which the run holds while it trains. With
    ``resume_from``, the run continues the checkpointed one exactly: parameters, optimizer
    state, the env's episodes in progress, and (through the program's origin) the random
    draws and iteration-dependent values such as the annealed learning rate. With
    ``distributed=data`` the env dim is split over devices (``tempo_rl.distributed``)."""
    out_dir = Path(out_dir)
    check_config(cfg)
    dispatch = configure_cpu_dispatch(cfg)  # before JAX makes its CPU client
    if dispatch is not None and dispatch.kept:
        warnings.warn(str(dispatch), stacklevel=2)
    split = distributed.distribution(cfg)  # first: several hosts join before JAX computes
    saved = None
    if cfg.get("resume_from"):
        saved = checkpoints.read(cfg["resume_from"])
        checkpoints.check_resumable(saved, cfg, cfg["resume_from"])
    with run_dir.claimed(out_dir):
        return _train(cfg, out_dir, saved, progress, split)


def check_config(cfg: dict[str, Any]) -> None:
    """Every option's type and range (``tempo_rl.options``), and that the run is a whole
    number of iterations."""
    check_options(RunOptions, cfg)
    check_options(EnvOptions, cfg["env"], "env.")
    algo = cfg["algorithm"]
    check_value("algorithm.num_steps", algo.get("num_steps"), int, AT_LEAST_ONE)
    if algo.get("module"):  # the user's own algorithm: its module registers it
        import_algorithm_module(str(algo["module"]))
    cls, _ = algorithm(algo["name"])
    check_options(cls, algo, "algorithm.")
    check_options(cls, cfg.get("network", {}), "network.")
    num_envs = cfg["env"].get("num_envs", EnvOptions.num_envs)
    per_iteration = algo["num_steps"] * num_envs
    total = cfg["total_timesteps"]
    if total % per_iteration:
        fewer, more = total // per_iteration * per_iteration, (total // per_iteration + 1) * per_iteration
        raise ConfigError(f"total_timesteps={total} is not a whole number of iterations of {per_iteration} "
                          f"steps (algorithm.num_steps={algo['num_steps']} x env.num_envs={num_envs}); "
                          f"use {fewer or more}" + (f" or {more}" if fewer else ""))


ASYNC_DISPATCH = "jax_cpu_enable_async_dispatch"
"""JAX's setting: whether a CPU's programs are dispatched asynchronously (read once per
process, when JAX makes its CPU client; JAX 0.4.32 on: before, always synchronously)."""
ASYNC_DISPATCH_VARIABLE = "JAX_CPU_ENABLE_ASYNC_DISPATCH"


def cpu_async_dispatch(cfg: dict[str, Any]) -> bool | None:
    """Whether JAX should dispatch a CPU's programs asynchronously for this run: the
    config's ``cpu_async_dispatch`` when set; else None where the run does not use JAX or
    the environment sets ``JAX_CPU_ENABLE_ASYNC_DISPATCH`` (the user's own), else false
    where the env steps on the host: each step then waits for the policy's action, and a
    program dispatched asynchronously costs a wake-up of JAX's worker thread on top (PPO
    on gymnasium's CartPole at 8 envs x 64 steps: 14.6-14.9 ms an iteration
    asynchronous, 12.0-12.7 synchronous). In-graph envs keep asynchronous dispatch, the
    host planning the next loop while the device runs (gymnax at 512 x 250: 287-304 ms
    asynchronous, 314-320 synchronous)."""
    if resolve_backend(cfg.get("backend", "auto")) != "jax":
        return None
    chosen = cfg.get("cpu_async_dispatch")
    if chosen is not None:
        return bool(chosen)
    return None if ASYNC_DISPATCH_VARIABLE in os.environ else not is_host_env(cfg["env"])


@dataclass(frozen=True)
class CpuDispatch:
    """How JAX dispatches a CPU's programs in this process, and why not as the run asked
    (``note``; ``kept``: the run's choice was not applied, or may not have been)."""

    asynchronous: bool
    note: str = ""
    kept: bool = False

    def __str__(self) -> str:
        mode = "asynchronous" if self.asynchronous else "synchronous"
        return f"CPU dispatch: {mode}" + (f" ({self.note})" if self.note else "")


def configure_cpu_dispatch(cfg: dict[str, Any]) -> CpuDispatch | None:
    """Set JAX's CPU dispatch for the run (``cpu_async_dispatch``) unless JAX has made its
    backends already: JAX reads the setting once, for the rest of the process (the user's
    later JAX work included). What the process uses, or None where the run does not use
    JAX or this JAX has no such setting."""
    if resolve_backend(cfg.get("backend", "auto")) != "jax":
        return None
    import jax
    wanted = cpu_async_dispatch(cfg)
    started = _jax_started()
    try:
        if wanted is not None and not started:
            jax.config.update(ASYNC_DISPATCH, wanted)
        used = bool(jax.config.read(ASYNC_DISPATCH))
    except (AttributeError, KeyError):  # (a JAX without the setting)
        return None
    if wanted is None:
        return CpuDispatch(used, f"as {ASYNC_DISPATCH_VARIABLE} sets it")
    if started is None:
        return CpuDispatch(used, "this JAX cannot tell whether it had started: if it had, its own "
                                 "setting stays", kept=True)
    if used != wanted:
        return CpuDispatch(used, "JAX had started in this process before the run asked for "
                                 f"{'asynchronous' if wanted else 'synchronous'}", kept=True)
    return CpuDispatch(used)


def _jax_started() -> bool | None:
    """Whether JAX has made its backends in this process (after which the CPU dispatch
    setting no longer applies); None where this JAX cannot tell."""
    try:
        from jax._src import xla_bridge
    except ImportError:
        return None
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return None if started is None else bool(started())


def _cache_programs(cfg: dict[str, Any]) -> None:
    """Use the config's cache dir, and on the JAX backend point JAX's persistent cache
    there before the env and the parameters are made: their programs are cached too (on
    gymnax CartPole six programs, 0.24 s of compiling in every run otherwise)."""
    if cfg.get("cache_dir") is not None:
        cache.set_cache_dir(cfg["cache_dir"])
    if resolve_backend(cfg.get("backend", "auto")) == "jax":
        cache.enable_jax_cache()


def _train(cfg: dict[str, Any], out_dir: Path, saved: dict[str, np.ndarray] | None,
           progress: bool, split: tp.Distribution | None) -> TrainResult:
    seed = int(cfg["seed"])
    _cache_programs(cfg)
    env = make_env(cfg["env"], seed)
    algo = cfg["algorithm"]
    cls, build = algorithm(algo["name"])
    program = build(env, algorithm_config(cls, algo, cfg.get("network", {})), seed=seed)
    if isinstance(env, NormalizedObservations):
        program.state.update(env.state)
    num_steps = int(algo["num_steps"])
    per_iteration = num_steps * env.num_envs
    total = int(cfg["total_timesteps"]) // per_iteration
    first = checkpoints.restore(program, env, saved, cfg["resume_from"]) if saved is not None else 0
    if first >= total:
        raise ValueError(f"the checkpoint is at iteration {first - 1}; total_timesteps="
                         f"{cfg['total_timesteps']} has {total} iterations, none left to run")
    logs = cfg.get("logger", {})
    logger = MetricLogger(out_dir, env, total, per_iteration,
                          wandb_cfg=logs.get("wandb") if logs.get("wandb", {}).get("enabled") else None,
                          config=cfg, progress=progress, start_iteration=first,
                          continues=_run_dir_of(cfg["resume_from"]) if first else None,
                          devices=distributed.devices_of(split))
    ctx = program.ctx
    i, I = program.dim("i"), program.bound("i")
    names = list(program.metrics)
    every = int(cfg.get("checkpoint_every") or 0)

    def kept(it: int) -> bool:
        """Whether the env keeps its state after iteration ``it`` (the whole run's
        numbering): where a checkpoint follows (the schedule of ``when`` below, over the
        program's ``i``), and at the run's first, so that a state a checkpoint cannot
        store fails there rather than at the end of the run."""
        return it in (first, total - 1) or (every > 0 and (it + 1) % every == 0)
    if hasattr(env, "snapshots_at"):  # (an env of another kind keeps every iteration's)
        env.snapshots_at(kept)
    target = out_dir / "checkpoints" / "last.npz"
    with ctx:
        # The sink also reads what the env keeps between iterations, so it runs after the
        # env has recorded the iteration's episodes, in every schedule.
        after_env = [program.rollout.saved] if program.rollout and program.rollout.saved is not None else []
        tp.sink([program.metrics[n] for n in names] + after_env,
                lambda values, point: logger.on_iteration(names, values[:len(names)], point),
                name="metrics")
        # Sinks see the whole run's iteration numbers (the origin): i + first here. (The
        # env keeps its state after these iterations: ``kept`` above.)
        when = i == I - 1 if every <= 0 else ((i + first + 1) % every == 0) | (i == I - 1)
        checkpoints.save_sink(program, env, cfg, target, when, keep=bool(cfg.get("keep_checkpoints")))
    start = time.perf_counter()
    passes = cfg.get("passes")
    exe = ctx.compile(program.bounds(total - first, num_steps), backend=cfg.get("backend", "auto"),
                      passes=None if passes is None else list(passes),
                      memory=tp.MemoryPolicy(**cfg.get("memory", {})),
                      loops=tp.LoopPolicy(str(cfg.get("loops") or "lowered"),
                                          late_sinks=cfg.get("late_sinks"), capture=cfg.get("capture")),
                      distribution=split)
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
        if exe.backend.name == "jax":
            print(exe.xla)
        if exe.iteration_report:
            print(exe.iteration_report)
    memory = {"device_peak_mb": exe.stats.peak_device_bytes / MIB,
              "host_peak_mb": exe.stats.peak_host_bytes / MIB, "rss_peak_mb": peak_rss_bytes() / MIB,
              "split_peak_mb": exe.stats.split.run_peak / MIB}
    return TrainResult(list(env.episode_returns), logger.history, compiled - start,
                       time.perf_counter() - compiled, target if target.exists() else None,
                       exe.report.notes, memory)
