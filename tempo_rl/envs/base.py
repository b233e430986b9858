"""What an algorithm needs from an environment."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

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


class Env(Protocol):
    num_envs: int
    obs_shape: tuple[int, ...]
    discrete: bool
    num_actions: int | None
    episode_returns: list[float]
    episode_lengths: list[int]

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
