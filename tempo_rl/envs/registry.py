"""Environments by ``kind`` (the ``env`` config group's key): each env module registers a
factory that builds its env from the group's options::

    @register_env("gymnax")
    def _from_config(cfg: dict, num_envs: int, seed: int) -> Env: ...

``make_env`` looks the kind up and wraps the env in ``NormalizedObservations`` when the
config asks; an env kind of one's own registers the same way in its module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tempo_rl.envs.base import Env
from tempo_rl.options import EnvOptions

EnvFactory = Callable[[dict[str, Any], int, int], Env]
ENVS: dict[str, EnvFactory] = {}
HOST_KINDS: set[str] = set()
"""The env kinds stepped on the host (a UDF the program waits for at every step)."""


def register_env(kind: str, steps_on_host: bool = False) -> Callable[[EnvFactory], EnvFactory]:
    """Register the decorated ``factory(cfg, num_envs, seed)`` as env kind ``kind``;
    ``steps_on_host``: its envs step on the host, not in the graph (``is_host_env``)."""
    def register(factory: EnvFactory) -> EnvFactory:
        known = ENVS.get(kind)
        if known is not None and known is not factory:
            raise ValueError(f"env kind {kind!r} is already registered (by {known.__module__})")
        ENVS[kind] = factory
        if steps_on_host:
            HOST_KINDS.add(kind)
        else:
            HOST_KINDS.discard(kind)
        return factory
    return register


def is_host_env(cfg: dict[str, Any]) -> bool:
    """Whether the env of the config's ``env`` group steps on the host."""
    return cfg.get("kind", "gymnasium") in HOST_KINDS


def make_env(cfg: dict[str, Any], seed: int) -> Env:
    """The env of the config's ``env`` group, with normalized observations if
    ``normalize_obs``."""
    from tempo_rl.envs.normalize import NormalizedObservations
    kind = cfg.get("kind", "gymnasium")
    if kind not in ENVS:
        raise ValueError(f"unknown env kind {kind!r}; registered: {', '.join(sorted(ENVS))}")
    env = ENVS[kind](cfg, int(cfg.get("num_envs", EnvOptions.num_envs)), seed)
    return NormalizedObservations(env) if cfg.get("normalize_obs") else env  # type: ignore[return-value]
