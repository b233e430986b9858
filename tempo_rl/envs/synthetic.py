"""A synthetic env stepped in the graph by a traceable JAX function.

Its step is trivially cheap, so a run on it measures the framework's own overhead (the
paper's §7.3 uses one), and its observation shape is configurable. It is a contextual
bandit: observations are standard normal draws, the reward is 1 when the action equals
the bucket of the observation's first entry (``0`` below the median, ``1`` above, for
two actions), episodes are truncated after ``episode_length`` steps. A random policy
earns ``episode_length / num_actions`` per episode, a perfect one ``episode_length``.

The step is a ``traceable`` UDF: a device op the compiler fuses with the policy around
it. Its state (the observation and the step count within the episode) is a pair of
placeholders over ``(b, i, t)``; the fresh observation comes from the program's own random
draws (``tp.normal`` keyed by the point), so runs are reproducible and resume exactly.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import tempo as tp
from tempo.symbolic.expr import Symbol
from tempo_rl.envs.base import EnvBase, Policy, Rollout, saved_marker
from tempo_rl.envs.registry import register_env


class SyntheticEnv(EnvBase):
    """``num_envs`` copies of the bandit; ``seed`` draws the first observations."""

    discrete = True
    action_shape: tuple[int, ...] = ()

    def __init__(self, num_envs: int = 8, obs_shape: tuple[int, ...] = (4,), num_actions: int = 2,
                 episode_length: int = 32, seed: int = 0):
        if num_actions < 2 or episode_length < 1:
            raise ValueError("the synthetic env needs num_actions >= 2 and episode_length >= 1")
        super().__init__(num_envs)
        self.num_envs, self.obs_shape = num_envs, tuple(obs_shape)
        self.num_actions, self.episode_length, self.seed = num_actions, episode_length, seed
        self._restored: dict[str, np.ndarray] | None = None

    # ---- in the graph ---------------------------------------------------------------
    def step(self, obs: jax.Array, count: jax.Array, action: jax.Array,
             fresh: jax.Array) -> tuple[jax.Array, ...]:
        """Pure JAX, one env: ``(next_obs, reward, truncated, next_count)``."""
        probability = jax.scipy.stats.norm.cdf(obs.reshape(-1)[0])  # uniform on (0, 1)
        target = jnp.minimum((probability * self.num_actions).astype(jnp.int32), self.num_actions - 1)
        reward = (action.astype(jnp.int32) == target).astype(jnp.float32)
        count = count + 1.0
        truncated = (count >= self.episode_length).astype(jnp.float32)
        return fresh, reward, truncated, count * (1.0 - truncated)

    # ---- on the host ------------------------------------------------------------------
    def _reset(self, point: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
        if self._restored is not None:
            obs, count = self._restored["obs"], self._restored["count"]
        else:
            rng = np.random.default_rng(self.seed)
            obs = rng.standard_normal((self.num_envs, *self.obs_shape)).astype(np.float32)
            count = np.zeros(self.num_envs, np.float32)
        k = point.get(self._env_dim)
        return (obs, count) if k is None else (obs[k], count[k])

    def _carry(self, point: dict[str, int], obs: np.ndarray, count: np.ndarray,
               rewards: np.ndarray, truncated: np.ndarray) -> tuple:
        """Between iterations (of one env, or all): count the iteration's episodes, keep
        the state the next one starts from."""
        self._record_rollout(point, rewards, truncated)
        iteration = self._keep_snapshot(point, lambda: {"obs": obs, "count": count})
        return obs, count, np.full(np.shape(count), iteration, np.float32)

    def restore(self, state: dict[str, np.ndarray]) -> None:
        self._restored_stats(state, ("obs", "count"))
        if state["obs"].shape != (self.num_envs, *self.obs_shape) or state["count"].shape != (self.num_envs,):
            raise ValueError(f"the env state holds observations of shape {state['obs'].shape}; this env "
                             f"has {(self.num_envs, *self.obs_shape)}")
        self._restored = {"obs": state["obs"].astype(np.float32), "count": state["count"].astype(np.float32)}

    # ---- program side -----------------------------------------------------------------
    def rollout(self, policy: Policy, b: Symbol, i: Symbol, t: Symbol, T: Symbol) -> Rollout:
        self._dims(b, i)
        obs_type, count_type = (self.obs_shape, "float32"), ((), "float32")
        obs = tp.placeholder(shape=self.obs_shape, dtype="float32", domain=(b, i, t))
        count = tp.placeholder(shape=(), dtype="float32", domain=(b, i, t))
        first_obs, first_count = self._env_udf(self._reset, [], [obs_type, count_type], "env_reset",
                                               domain=(b,), batched=self._reset)
        action, extras = policy(obs)
        fresh = tp.normal(self.obs_shape, domain=(b, i, t))
        nxt, reward, truncated, next_count = tp.udf(self.step, [obs, count, action, fresh],
                                                    traceable=True, name="env_step")
        carried_obs, carried_count, saved = self._env_udf(
            self._carry, [nxt[b, i, T - 1], next_count[b, i, T - 1], reward[b, i, 0:T],
                          truncated[b, i, 0:T]],
            [obs_type, count_type, count_type], "env_carry", batched=self._carry)
        obs[b, 0, 0] = first_obs
        obs[b, i + 1, 0] = carried_obs
        obs[b, i, t + 1] = nxt
        count[b, 0, 0] = first_count
        count[b, i + 1, 0] = carried_count
        count[b, i, t + 1] = next_count
        return Rollout(obs, action, reward, reward * 0.0, truncated, nxt, extras,
                       saved_marker(saved, b, i))


@register_env("synthetic")
def _from_config(cfg: dict[str, Any], num_envs: int, seed: int) -> SyntheticEnv:
    return SyntheticEnv(num_envs, tuple(cfg.get("obs_shape", (4,))), int(cfg.get("num_actions", 2)),
                        int(cfg.get("episode_length", 32)), seed=seed)
