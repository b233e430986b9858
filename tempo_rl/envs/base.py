"""What an algorithm needs from an environment."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tempo.api.tensor import RecurrentTensor
from tempo.symbolic.expr import Symbol

Policy = Callable[[RecurrentTensor], tuple[RecurrentTensor, dict[str, RecurrentTensor]]]


@dataclass
class Rollout:
    """The RTs of one rollout, all with domain ``(i, t)`` and a leading env dim."""

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
    """A scalar over ``(i,)`` computed right after the env's state at the end of iteration
    ``i`` was kept (``env.snapshot(i)``); host work that stores it reads this to run after."""


class EpisodeStats:
    """Returns and lengths of finished episodes, accumulated step by step on the host."""

    def __init__(self, num_envs: int):
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.running_return = np.zeros(num_envs)
        self.running_length = np.zeros(num_envs, np.int64)

    def record(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.running_return += reward
        self.running_length += 1
        for k in np.flatnonzero(done):
            self.returns.append(float(self.running_return[k]))
            self.lengths.append(int(self.running_length[k]))
            self.running_return[k], self.running_length[k] = 0.0, 0

    def in_progress(self) -> dict[str, np.ndarray]:
        """The episodes under way (for a snapshot)."""
        return {"running_return": self.running_return.copy(),
                "running_length": self.running_length.copy()}

    def resume(self, saved: dict[str, np.ndarray]) -> None:
        self.running_return = saved["running_return"].copy()
        self.running_length = saved["running_length"].copy()


class Snapshots:
    """An env's pickled state at the end of the last few iterations, for checkpoints."""

    KEPT = 4

    def __init__(self) -> None:
        self._by_iteration: dict[int, bytes] = {}

    def keep(self, iteration: int, state: dict[str, Any]) -> None:
        self._by_iteration[iteration] = pickle.dumps(state)
        for old in [k for k in self._by_iteration if k <= iteration - self.KEPT]:
            del self._by_iteration[old]

    def get(self, iteration: int) -> bytes:
        try:
            return self._by_iteration[iteration]
        except KeyError:
            raise RuntimeError(f"no env snapshot for iteration {iteration}; kept: "
                               f"{sorted(self._by_iteration)}") from None


class EnvBase:
    """What the envs here share: finished episodes counted on the host, and the env's state
    kept at the end of each iteration for checkpoints."""

    num_envs: int
    obs_shape: tuple[int, ...]

    def __init__(self, num_envs: int):
        self.stats = EpisodeStats(num_envs)
        self.snapshots = Snapshots()
        self._iteration_dim = "i"

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

    def _keep_snapshot(self, point: dict[str, int], state: dict[str, Any]) -> int:
        """Keep ``state`` and the episodes in progress as the env after the iteration of
        ``point`` (a UDF's point); returns that iteration."""
        iteration = point[self._iteration_dim]
        self.snapshots.keep(iteration, {**state, **self.stats.in_progress()})
        return iteration

    def _record_rollout(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        """Count the episodes of one iteration's rewards and ends (``(T, num_envs)`` each)."""
        for reward, done in zip(rewards, dones):
            self.stats.record(reward, done)


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

    def rollout(self, policy: Policy, i: Symbol, t: Symbol, T: Symbol) -> Rollout:
        """Acting over ``(i, t)``: ``policy(obs)`` returns the action and any extra RTs."""
        ...

    def snapshot(self, iteration: int) -> bytes:
        """The env's state (episodes in progress, RNG, statistics) at the end of
        ``iteration``, for a checkpoint."""
        ...

    def restore(self, state: bytes) -> None:
        """Continue from a snapshot: the next rollout starts where it was taken."""
        ...
