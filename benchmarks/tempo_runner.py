"""Tempo's PPO (``tempo_rl/algorithms/ppo.py``) as its users run it: ``tempo_rl.train.train``
on a config, timed per iteration by the metrics it logs (``charts/SPS``)."""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Cell, Measurement

ENV_GROUPS = {"synthetic": "synthetic", "gymnasium": "cartpole", "gymnax": "gymnax_cartpole"}
"""The ``conf/env`` group of each env implementation."""


def base_config(impl: str) -> dict[str, Any]:
    """The training config (``conf/``) for env implementation ``impl``, as a plain dict."""
    from tempo_rl.config import load_config
    return load_config(f"env={ENV_GROUPS[impl]}")


def config_for(cell: Cell) -> dict[str, Any]:
    """The cell's config: its envs, rollout length, iterations, backend and passes."""
    cfg = copy.deepcopy(cell.tempo_cfg)
    cfg["env"]["num_envs"] = cell.env.num_envs
    if cell.impl == "synthetic":
        cfg["env"]["obs_shape"] = list(cell.env.obs_shape)
    cfg["algorithm"]["num_steps"] = cell.ppo.num_steps
    cfg["total_timesteps"] = cell.total_iterations * cell.steps_per_iteration
    if cell.system != "tempo":  # "tempo": the config's own backend (auto)
        cfg["backend"] = cell.system.removeprefix("tempo-")
    cfg["passes"] = None if cell.passes is None else list(cell.passes)
    cfg["seed"], cfg["progress"], cfg["checkpoint_every"] = cell.seed, False, 0
    cfg["logger"] = {**cfg.get("logger", {}), "wandb": {"enabled": False}}
    return cfg


def run(cell: Cell) -> Measurement:
    """Compile and run all the cell's iterations in one ``train`` call."""
    from tempo_rl.train import train

    if cell.impl == "gymnax":  # imported before the clock starts, as the JAX PPO's is
        from tempo_rl.envs.gymnax_env import import_gymnax
        import_gymnax()
    with tempfile.TemporaryDirectory(prefix="tempo-bench-") as out:
        start = time.perf_counter()
        result = train(config_for(cell), Path(out), progress=False)
        total = time.perf_counter() - start
    # The logger's SPS is one iteration's steps over the time since the previous iteration's
    # metrics (the first: since the run started). With late sinks (the default on an
    # accelerator, ``tempo.runtime.tail``) an iteration's metrics arrive when the next one
    # reaches the same point: the first interval then also holds the next iteration's work
    # up to there, and the last is only the end of the last one, the others are one
    # iteration each (read the median of three or more; a CPU runs its sinks where the
    # program reaches them).
    times = [cell.steps_per_iteration / row["charts/SPS"] for row in result.history]
    return Measurement(result.compile_seconds, times, list(result.episode_returns),
                       setup_s=total - result.run_seconds,
                       episodes=[int(row["charts/episodes"]) for row in result.history])
