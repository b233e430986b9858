"""RL algorithms, each an RT program builder over dims ``(i, t)`` (PPO: ``(i, u, t)``).

``ALGORITHMS`` maps a config name to the algorithm's config dataclass and builder
``build(env, cfg, seed) -> TrainProgram``; adding an algorithm is adding a module and an
entry here (and a ``conf/algorithm/<name>.yaml``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tempo_rl.algorithms import nstep, ppo, reinforce
from tempo_rl.algorithms.common import TrainProgram

ALGORITHMS: dict[str, tuple[type, Callable[..., TrainProgram]]] = {
    "ppo": (ppo.PPOConfig, ppo.build),
    "reinforce": (reinforce.ReinforceConfig, reinforce.build),
    "nstep": (nstep.NStepConfig, nstep.build),
}


def algorithm(name: str) -> tuple[type, Callable[..., Any]]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}") from None


__all__ = ["ALGORITHMS", "TrainProgram", "algorithm"]
