"""gymnax environments (JAX classic control and more) stepped in the graph: gymnax's
``step`` of one env, which the compiler vmaps over the env dim (it resets finished
episodes and reports ``terminated``, ``truncated`` and the final observation apart, for
bootstrapping)."""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from tempo_rl.envs.jax_env import JaxEnv
from tempo_rl.envs.registry import register_env


class GymnaxEnv(JaxEnv):
    """``num_envs`` copies of gymnax env ``env_id`` (``"CartPole-v1"``), reset with ``seed``."""

    def __init__(self, env_id: str, num_envs: int = 8, seed: int = 0):
        gymnax = import_gymnax()
        self.env_id = env_id
        self.env, self.params = gymnax.make(env_id)
        space = self.env.action_space(self.params)
        self.discrete = hasattr(space, "n")
        if not self.discrete:
            raise ValueError(f"gymnax env {env_id} has continuous actions; this wrapper takes "
                             f"discrete ones")
        self.num_actions, self.action_shape = int(space.n), ()
        self.obs_shape = tuple(self.env.observation_space(self.params).shape)
        super().__init__(num_envs, seed)

    def reset_env(self, key: jax.Array) -> tuple[jax.Array, Any]:
        return self.env.reset_env(key, self.params)

    def transition(self, key: jax.Array, state: Any, action: jax.Array) -> tuple[Any, ...]:
        obs, state, reward, terminated, truncated, info = self.env.step(
            key, state, action.astype(jnp.int32), self.params)
        return obs, reward, terminated, truncated, info["final_observation"], state


def import_gymnax() -> types.ModuleType:
    """gymnax, imported with its plotting modules deferred (``DEFERRED``) the first time."""
    try:
        with _plotting_deferred():
            import gymnax
    except ImportError as err:
        raise ImportError("gymnax envs need gymnax: pip install -e .[jaxenvs]") from err
    return gymnax


DEFERRED = ("seaborn", "matplotlib.pyplot")
"""Modules gymnax imports for rendering only (its Pong, Catch and maze envs): 0.6-0.8 s of
its 1.1 s import on a 2-core CPU (seaborn brings pandas and scipy.stats)."""


class _Deferred(types.ModuleType):
    """Stands in for a module until an attribute of it is used, then imports it (taking
    itself out of ``sys.modules`` first, should that be while gymnax is imported)."""

    def __getattr__(self, attr: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


@contextlib.contextmanager
def _plotting_deferred() -> Iterator[None]:
    """While gymnax is imported, its plotting modules (``DEFERRED``) are stand-ins that
    import the real ones when its rendering code uses them; afterwards anyone importing
    them gets the real modules."""
    standing_in = {name: _Deferred(name) for name in DEFERRED if name not in sys.modules}
    sys.modules.update(standing_in)
    try:
        yield
    finally:
        for name, module in standing_in.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


@register_env("gymnax")
def _from_config(cfg: dict[str, Any], num_envs: int, seed: int) -> GymnaxEnv:
    return GymnaxEnv(cfg["id"], num_envs=num_envs, seed=seed)
