"""Brax environments stepped in the graph (continuous actions): Brax's ``EpisodeWrapper``
counts steps and marks truncation; episodes that end are reset here, keeping the final
observation for bootstrapping."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from tempo_rl.envs.jax_env import JaxEnv
from tempo_rl.envs.registry import register_env


class BraxEnv(JaxEnv):
    """``num_envs`` copies of ``brax.envs`` env ``name`` (``"inverted_pendulum"``) on physics
    ``backend``, episodes truncated after ``episode_length`` steps, reset with ``seed``."""

    discrete = False
    num_actions = None

    def __init__(self, name: str, num_envs: int = 8, seed: int = 0, backend: str = "spring",
                 episode_length: int = 1000):
        try:
            from brax import envs
            from brax.envs.wrappers.training import EpisodeWrapper
        except ImportError as err:
            raise ImportError("Brax envs need brax: pip install -e .[brax]") from err
        self.name = name
        self.env = EpisodeWrapper(envs.get_environment(name, backend=backend), episode_length, 1)
        self.action_shape = (self.env.action_size,)
        self.obs_shape = (self.env.observation_size,)
        super().__init__(num_envs, seed)

    def reset_env(self, key: jax.Array) -> tuple[jax.Array, Any]:
        state = self.env.reset(key)
        return state.obs, state

    def transition(self, key: jax.Array, state: Any, action: jax.Array) -> tuple[Any, ...]:
        after = self.env.step(state, jnp.clip(action, -1.0, 1.0))
        truncated = after.info["truncation"]
        done = after.done
        _, fresh = self.reset_env(key)
        state = jax.tree_util.tree_map(lambda new, old: jnp.where(done > 0, new, old), fresh, after)
        return state.obs, after.reward, done * (1 - truncated), truncated, after.obs, state


@register_env("brax")
def _from_config(cfg: dict[str, Any], num_envs: int, seed: int) -> BraxEnv:
    return BraxEnv(cfg["id"], num_envs=num_envs, seed=seed, backend=cfg.get("backend", "spring"),
                   episode_length=int(cfg.get("episode_length", 1000)))
