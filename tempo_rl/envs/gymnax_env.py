"""gymnax environments (JAX classic control and more) stepped in the graph.

The env's state is a pytree; each leaf, batched over the ``num_envs`` copies, is a
placeholder over ``(i, t)`` like the observation. One step is a traceable UDF: gymnax's
``step`` vmapped over the copies (it resets finished episodes and reports
``terminated``, ``truncated`` and the final observation apart, for bootstrapping). Keys
come from the program's random draws at each point, so runs are reproducible and resume
exactly.
"""

from __future__ import annotations

import pickle
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import tempo as tp
from tempo.symbolic.expr import Symbol
from tempo_rl.envs.base import EpisodeStats, Policy, Rollout, Snapshots


class GymnaxEnv:
    """``num_envs`` copies of gymnax env ``env_id`` (``"CartPole-v1"``), reset with ``seed``."""

    def __init__(self, env_id: str, num_envs: int = 8, seed: int = 0):
        try:
            import gymnax
        except ImportError as err:
            raise ImportError("gymnax envs need gymnax: pip install -e .[jaxenvs]") from err
        self.env_id, self.num_envs, self.seed = env_id, num_envs, seed
        self.env, self.params = gymnax.make(env_id)
        space = self.env.action_space(self.params)
        self.discrete = hasattr(space, "n")
        if not self.discrete:
            raise ValueError(f"gymnax env {env_id} has continuous actions; the builders' "
                             f"policies are categorical")
        self.num_actions, self.action_shape = int(space.n), ()
        self.obs_shape = tuple(self.env.observation_space(self.params).shape)
        obs, state = self._reset_batch(jax.random.PRNGKey(seed))
        leaves, self._treedef = jax.tree_util.tree_flatten(state)
        self._leaf_types = [(tuple(leaf.shape), str(leaf.dtype)) for leaf in leaves]
        self._initial = (np.asarray(obs, np.float32), [np.asarray(leaf) for leaf in leaves])
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

    # ---- in the graph ---------------------------------------------------------------
    def _reset_batch(self, key: jax.Array) -> tuple[jax.Array, Any]:
        keys = jax.random.split(key, self.num_envs)
        return jax.vmap(self.env.reset_env, in_axes=(0, None))(keys, self.params)

    def step(self, seed: jax.Array, action: jax.Array, *leaves: jax.Array) -> tuple[jax.Array, ...]:
        """Pure JAX: ``(obs, reward, terminated, truncated, final_obs, *next_leaves)``."""
        state = jax.tree_util.tree_unflatten(self._treedef, leaves)
        keys = jax.random.split(jax.random.PRNGKey(seed), self.num_envs)
        obs, state, reward, terminated, truncated, info = jax.vmap(
            self.env.step, in_axes=(0, 0, 0, None))(keys, state, action.astype(jnp.int32), self.params)
        return (obs.astype(jnp.float32), reward.astype(jnp.float32), terminated.astype(jnp.float32),
                truncated.astype(jnp.float32), info["final_observation"].astype(jnp.float32),
                *jax.tree_util.tree_leaves(state))

    # ---- on the host ------------------------------------------------------------------
    def _reset(self) -> tuple[np.ndarray, ...]:
        obs, leaves = self._initial
        return (obs, *leaves)

    def _carry(self, point: dict[str, int], rewards: np.ndarray, dones: np.ndarray,
               obs: np.ndarray, *leaves: np.ndarray) -> tuple:
        """Between iterations: count the iteration's episodes, keep the state the next
        one starts from."""
        for reward, done in zip(rewards, dones):
            self.stats.record(reward, done)
        iteration = point[self._iteration_dim]
        self.snapshots.keep(iteration, {"obs": obs, "leaves": list(leaves), **self.stats.in_progress()})
        return (obs, *leaves, np.float32(iteration))

    def snapshot(self, iteration: int) -> bytes:
        return self.snapshots.get(iteration)

    def restore(self, state: bytes) -> None:
        saved = pickle.loads(state)
        if saved["obs"].shape != (self.num_envs, *self.obs_shape):
            raise ValueError(f"the snapshot holds observations of shape {saved['obs'].shape}")
        self._initial = (saved["obs"], saved["leaves"])
        self.stats.resume(saved)

    # ---- program side -----------------------------------------------------------------
    def rollout(self, policy: Policy, i: Symbol, t: Symbol, T: Symbol) -> Rollout:
        obs_type = ((self.num_envs, *self.obs_shape), "float32")
        self._iteration_dim = i.name
        obs = tp.placeholder(shape=obs_type[0], dtype="float32", domain=(i, t))
        leaves = [tp.placeholder(shape=s, dtype=d, domain=(i, t)) for s, d in self._leaf_types]
        first = tp.udf(self._reset, [], [obs_type, *self._leaf_types], name="env_reset")
        action, extras = policy(obs)
        seed = tp.randint(0, 2**31 - 1, domain=(i, t))
        nxt, reward, terminated, truncated, final, *after = tp.udf(
            self.step, [seed, action, *leaves], traceable=True, name="env_step")
        done = tp.max(terminated, truncated)
        carried = tp.udf(self._carry, [reward[i, 0:T], done[i, 0:T], nxt[i, T - 1],
                                       *(leaf[i, T - 1] for leaf in after)],
                         [obs_type, *self._leaf_types, ((), "float32")], name="env_carry",
                         pass_point=True)
        for var, start, carry, step_out in zip([obs, *leaves], first, carried, [nxt, *after]):
            var[0, 0] = start
            var[i + 1, 0] = carry
            var[i, t + 1] = step_out
        return Rollout(obs, action, reward, terminated, truncated, final, extras, carried[-1])
