"""gymnax environments (JAX classic control and more) stepped in the graph: gymnax's
``step`` of one env, which the compiler vmaps over the env dim (it resets finished
episodes and reports ``terminated``, ``truncated`` and the final observation apart, for
bootstrapping)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from tempo_rl.envs.jax_env import JaxEnv
from tempo_rl.envs.registry import register_env


class GymnaxEnv(JaxEnv):
    """``num_envs`` copies of gymnax env ``env_id`` (``"CartPole-v1"``), reset with ``seed``."""

    def __init__(self, env_id: str, num_envs: int = 8, seed: int = 0):
        try:
            import gymnax
        except ImportError as err:
            raise ImportError("gymnax envs need gymnax: pip install -e .[jaxenvs]") from err
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


@register_env("gymnax")
def _from_config(cfg: dict[str, Any], num_envs: int, seed: int) -> GymnaxEnv:
    return GymnaxEnv(cfg["id"], num_envs=num_envs, seed=seed)
