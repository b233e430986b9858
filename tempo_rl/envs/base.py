"""What an algorithm needs from an environment."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

import tempo as tp
from tempo.api.tensor import RecurrentTensor
from tempo.symbolic.expr import Symbol

Policy = Callable[[RecurrentTensor], tuple[RecurrentTensor, dict[str, RecurrentTensor]]]


@dataclass
class Rollout:
    """The RTs of one rollout, all with domain ``(b, i, t)``: env, iteration, step."""

    obs: RecurrentTensor
    action: RecurrentTensor
    reward: RecurrentTensor
    terminated: RecurrentTensor
    truncated: RecurrentTensor
    final_obs: RecurrentTensor
    """The observation the step led to, before any reset (for bootstrapping)."""
    extras: dict[str, RecurrentTensor] = field(default_factory=dict)
    """What the policy returned beside the action (log-probabilities, entropies)."""
    saved: RecurrentTensor | None = None
    """A scalar over ``(i,)`` computed right after the envs' states at the end of iteration
    ``i`` were kept (``env.snapshot(i)``); host work that stores it reads this to run after."""


class EpisodeStats:
    """Returns and lengths of finished episodes, accumulated step by step on the host."""

    def __init__(self, num_envs: int):
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.running_return = np.zeros(num_envs)
        self.running_length = np.zeros(num_envs, np.int64)

    def record(self, reward: np.ndarray, done: np.ndarray) -> None:
        """One step of every env."""
        self.running_return += reward
        self.running_length += 1
        for k in np.flatnonzero(done):
            self._finish(k)

    def record_env(self, k: int, reward: np.ndarray, done: np.ndarray) -> None:
        """Steps of env ``k`` (scalars, or one iteration's ``(T,)`` arrays)."""
        for r, d in zip(np.atleast_1d(reward), np.atleast_1d(done)):
            self.running_return[k] += r
            self.running_length[k] += 1
            if d:
                self._finish(k)

    def _finish(self, k: int) -> None:
        self.returns.append(float(self.running_return[k]))
        self.lengths.append(int(self.running_length[k]))
        self.running_return[k], self.running_length[k] = 0.0, 0

    def in_progress(self, k: int | None = None) -> dict[str, np.ndarray]:
        """The episodes under way (of env ``k``, or all), for a snapshot."""
        pick = slice(None) if k is None else k
        return {"running_return": np.array(self.running_return[pick]),
                "running_length": np.array(self.running_length[pick])}

    def resume(self, saved: dict[str, np.ndarray]) -> None:
        self.running_return = saved["running_return"].copy()
        self.running_length = saved["running_length"].copy()


class Snapshots:
    """An env's pickled state at the end of the last few iterations, for checkpoints."""

    KEPT = 4

    def __init__(self) -> None:
        self._by_iteration: dict[int, bytes] = {}
        self._parts: dict[int, dict[int, dict[str, Any]]] = {}

    def keep(self, iteration: int, state: dict[str, Any]) -> None:
        self._by_iteration[iteration] = pickle.dumps(state)
        for old in [k for k in self._by_iteration if k <= iteration - self.KEPT]:
            del self._by_iteration[old]

    def keep_env(self, iteration: int, k: int, num_envs: int, state: dict[str, Any]) -> None:
        """Env ``k``'s part of the state after ``iteration`` (when the env dim was not laid
        out, each env keeps its own); kept as a whole once every env has."""
        parts = self._parts.setdefault(iteration, {})
        parts[k] = state
        if len(parts) == num_envs:
            del self._parts[iteration]
            self.keep(iteration, _stacked_parts([parts[n] for n in range(num_envs)]))

    def get(self, iteration: int) -> bytes:
        try:
            return self._by_iteration[iteration]
        except KeyError:
            raise RuntimeError(f"no env snapshot for iteration {iteration}; kept: "
                               f"{sorted(self._by_iteration)}") from None


def _stacked_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-env states as one: arrays stacked, lists of arrays stacked item by item, other
    objects listed."""
    out: dict[str, Any] = {}
    for key, first in parts[0].items():
        values = [p[key] for p in parts]
        if isinstance(first, list):
            out[key] = [np.stack(column) for column in zip(*values)]
        elif isinstance(first, (np.ndarray, np.generic, float, int)):
            out[key] = np.stack(values)
        else:
            out[key] = values
    return out


class EnvBase:
    """What the envs here share: finished episodes counted on the host, and the env's state
    kept at the end of each iteration for checkpoints."""

    num_envs: int
    obs_shape: tuple[int, ...]

    def __init__(self, num_envs: int):
        self.stats = EpisodeStats(num_envs)
        self.snapshots = Snapshots()
        self._env_dim, self._iteration_dim = "b", "i"

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.obs_shape))

    @property
    def episode_returns(self) -> list[float]:
        return self.stats.returns

    @property
    def episode_lengths(self) -> list[int]:
        return self.stats.lengths

    def snapshot(self, iteration: int) -> bytes:
        return self.snapshots.get(iteration)

    def _dims(self, b: Symbol, i: Symbol) -> None:
        self._env_dim, self._iteration_dim = b.name, i.name

    def _keep_snapshot(self, point: dict[str, int], state: dict[str, Any]) -> int:
        """Keep ``state`` and the episodes in progress as the envs after the iteration of
        ``point`` (a UDF's point: of one env when it has the env dim, else of all)."""
        iteration = point[self._iteration_dim]
        k = point.get(self._env_dim)
        if k is None:
            self.snapshots.keep(iteration, {**state, **self.stats.in_progress()})
        else:
            self.snapshots.keep_env(iteration, k, self.num_envs, {**state, **self.stats.in_progress(k)})
        return iteration

    def _record_rollout(self, point: dict[str, int], rewards: np.ndarray, dones: np.ndarray) -> None:
        """Count the episodes of one iteration's rewards and ends: ``(T,)`` each of env
        ``point[b]``, or ``(num_envs, T)`` of all."""
        k = point.get(self._env_dim)
        if k is not None:
            self.stats.record_env(k, rewards, dones)
            return
        for reward, done in zip(rewards.T, dones.T):
            self.stats.record(reward, done)

    def _env_udf(self, fn: Callable[..., tuple], inputs: list[RecurrentTensor],
                 outputs: list[tuple[tuple[int, ...], str]], name: str, domain: tuple = (),
                 batched: Callable[..., tuple] | None = None) -> tuple[RecurrentTensor, ...]:
        """A host UDF over the env dim: ``fn(point, *inputs)`` for one env (``point[b]``),
        and for all at once ``batched`` (by default ``fn`` env by env, stacked)."""
        def every(point: dict[str, int], *xs: np.ndarray) -> tuple:
            outs = [fn({**point, self._env_dim: k}, *(x[k] for x in xs)) for k in range(self.num_envs)]
            return tuple(np.stack(column) for column in zip(*outs))
        return tp.udf(_unwrapped(fn, len(outputs)), inputs, outputs, domain=domain, name=name,
                      pass_point=True, batched=_unwrapped(batched or every, len(outputs)))


class Env(Protocol):
    num_envs: int
    obs_shape: tuple[int, ...]
    discrete: bool
    num_actions: int | None
    """The number of discrete actions (None for continuous ones)."""
    action_shape: tuple[int, ...]
    """The shape of one continuous action (``()`` for discrete ones)."""
    stats: EpisodeStats

    @property
    def episode_returns(self) -> list[float]: ...

    @property
    def episode_lengths(self) -> list[int]: ...

    @property
    def obs_dim(self) -> int: ...

    def rollout(self, policy: Policy, b: Symbol, i: Symbol, t: Symbol, T: Symbol) -> Rollout:
        """Acting over ``(b, i, t)``: ``policy(obs)`` returns the action (of one env) and
        any extra RTs."""
        ...

    def snapshot(self, iteration: int) -> bytes:
        """The env's state (episodes in progress, RNG, statistics) at the end of
        ``iteration``, for a checkpoint."""
        ...

    def restore(self, state: bytes) -> None:
        """Continue from a snapshot: the next rollout starts where it was taken."""
        ...


def _unwrapped(fn: Callable[..., tuple], outputs: int) -> Callable[..., Any]:
    """``fn`` returning its single output bare, as ``tp.udf`` takes it."""
    if outputs != 1:
        return fn
    return lambda *args: fn(*args)[0]


def saved_marker(saved: RecurrentTensor, b: Symbol, i: Symbol) -> RecurrentTensor:
    """Over ``(i,)``: computed after every env's ``saved`` at ``(b, i)``."""
    B = saved.ctx.bound_of[b]
    return saved[0:B, i].max()
