"""Training checkpoints: what a run writes, and what resuming one checks and restores.

A checkpoint (``checkpoints/last.npz``) holds numeric arrays only, loaded without
unpickling (``tempo.api.checkpoint``):

- the program's state: parameters and optimizer state as of the next iteration
  (``param<k>``, ``m<k>``, ``v<k>``, ``count``), and the observation statistics of a run
  with ``env.normalize_obs`` (``obs_norm.*``);
- the env's state under ``__env__.``: observations the next rollout starts from, episodes
  in progress, each gymnasium env's wrappers and physics as JSON, a JAX env's state leaves;
- the run's config as JSON (``__config__``) and the last iteration (``__point__``).

Resuming compares the checkpoint's config with the run's: keys that change the program or
its data must be equal (an error lists each difference; ``resume_override=true`` goes on
with a warning); the keys of ``RESUMABLE`` may change. A state that is not finite is never
written: the last good checkpoint stays.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import tempo as tp
from tempo.api import checkpoint
from tempo.errors import CheckpointError
from tempo_rl.algorithms import TrainProgram
from tempo_rl.envs import Env, NormalizedObservations
from tempo_rl.envs.base import from_json_array
from tempo_rl.envs.normalize import STATE_PREFIX
from tempo_rl.metrics import TrainingDiverged

ENV_PREFIX = "__env__."
"""Prefix of the entries holding the env's state (``env.snapshot``)."""
CONFIG_KEY = "__config__"
"""The entry holding the run's config as JSON (uint8), for resuming and evaluation."""
NORMALIZATION_KEY = STATE_PREFIX + "mean"
"""Present in checkpoints of runs with normalized observations."""
RESUMABLE = ("total_timesteps", "resume_from", "resume_override", "checkpoint_every", "keep_checkpoints",
             "progress", "compile_report", "profile", "logger", "backend", "loops", "late_sinks", "capture",
             "memory", "passes", "distributed", "cpu_async_dispatch")
"""Config keys (and groups) a resumed run may change: how long it runs, what it logs, and
how the same program is compiled and executed (on how many devices too)."""


class ResumeMismatchError(CheckpointError):
    """A checkpoint whose run differs from the resuming one in the program or its data."""


def save_sink(program: TrainProgram, env: Env, cfg: dict[str, Any], target: Path, when: Any,
              keep: bool) -> None:
    """A sink writing the checkpoint at each iteration where ``when`` holds, to ``target``
    (and ``iteration_<i>.npz`` beside it if ``keep``), atomically; a state that is not
    finite raises ``TrainingDiverged`` instead, leaving the last checkpoint as it was."""
    config = np.frombuffer(json.dumps(cfg, default=str).encode(), np.uint8)
    names = list(program.state)
    saved = program.rollout.saved if program.rollout is not None else None
    inputs = [program.state[n] for n in names] + ([saved] if saved is not None else [])

    def write(values: list[np.ndarray], point: dict[str, int]) -> None:
        arrays = dict(zip(names, values))
        for name, value in arrays.items():
            if not np.all(np.isfinite(value)):
                kept = f"the last checkpoint {target} is kept" if target.exists() else "no checkpoint written"
                raise TrainingDiverged(f"iteration {point['i']}: the training state {name!r} is not finite "
                                       f"(the learning diverged); {kept}")
        arrays.update({ENV_PREFIX + name: value for name, value in env.snapshot(point["i"]).items()})
        arrays[CONFIG_KEY] = config
        arrays[checkpoint.POINT_KEY] = np.asarray([point["i"]], np.int64)
        checkpoint.write_atomically(target, arrays)
        if keep:
            checkpoint.write_atomically(target.with_name(f"iteration_{point['i']}.npz"), arrays)
    tp.sink(inputs, write, name="checkpoint", when=when)


def read(path: str | Path) -> dict[str, np.ndarray]:
    """A checkpoint written by ``save_sink`` (an error naming the file if it is not one)."""
    saved = checkpoint.load(path)
    for key in (CONFIG_KEY, checkpoint.POINT_KEY):
        if key not in saved:
            raise CheckpointError(f"{path} holds no {key}; it was not written by tempo_rl.train")
    if not any(name.startswith(ENV_PREFIX) for name in saved):
        raise CheckpointError(f"{path} holds no env state; it was not written by tempo_rl.train")
    return saved


def saved_config(saved: dict[str, np.ndarray], path: str | Path) -> dict[str, Any]:
    """The config of the run that wrote checkpoint ``saved``."""
    try:
        cfg = from_json_array(saved[CONFIG_KEY], f"{path}'s {CONFIG_KEY}")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}'s {CONFIG_KEY} is not a config (a JSON {type(cfg).__name__})")
    return cfg


def check_resumable(saved: dict[str, np.ndarray], cfg: dict[str, Any], path: str | Path) -> None:
    """Refuse to resume from a run whose program or data differ from ``cfg``'s (each
    difference listed); with ``resume_override`` warn instead."""
    differences = config_differences(saved_config(saved, path), cfg)
    if not differences:
        return
    listed = "\n  ".join(differences)
    if cfg.get("resume_override"):
        print(f"warning: resuming {path} despite a different config (resume_override=true):\n  {listed}",
              file=sys.stderr)
        return
    raise ResumeMismatchError(f"{path} was written by a different run; these options differ "
                              f"(checkpoint -> this run):\n  {listed}\nresume with the checkpoint's "
                              "values, or pass resume_override=true to continue anyway")


def config_differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each option outside ``RESUMABLE`` that differs."""
    old, new = dict(_flat(_plain(before))), dict(_flat(_plain(now)))
    changed = [key for key in sorted(old.keys() | new.keys())
               if key.split(".")[0] not in RESUMABLE and old.get(key, "<unset>") != new.get(key, "<unset>")]
    return [f"{key}: {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}" for key in changed]


def _plain(cfg: dict[str, Any]) -> Any:
    """``cfg`` as the checkpoint stores it (JSON: tuples as lists)."""
    return json.loads(json.dumps(cfg, default=str))


def _flat(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flat(value, f"{prefix}{key}.")
    else:
        yield prefix.removesuffix("."), tree


def restore(program: TrainProgram, env: Env, saved: dict[str, np.ndarray], path: str | Path) -> int:
    """Load checkpoint ``saved`` into the program and env; the iteration to continue from."""
    try:
        program.optimizer.load_state(saved)
        if isinstance(env, NormalizedObservations):
            env.load_state(saved)
    except (tp.TempoError, ValueError) as e:
        raise CheckpointError(f"{path} does not fit this program: {e}") from None
    if not isinstance(env, NormalizedObservations) and NORMALIZATION_KEY in saved:
        raise CheckpointError(f"{path} was written by a run with env.normalize_obs=true; resume it "
                              "with the same setting")
    try:
        env.restore({name.removeprefix(ENV_PREFIX): value for name, value in saved.items()
                     if name.startswith(ENV_PREFIX)})
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    point = saved[checkpoint.POINT_KEY]
    if point.shape != (1,) or point.dtype.kind not in "iu":
        raise CheckpointError(f"{path}'s {checkpoint.POINT_KEY} is not one iteration number")
    return int(point[0]) + 1
