"""Environments written in JAX, stepped in the graph.

The env's state is a pytree; each leaf, batched over the ``num_envs`` copies, is a
placeholder over ``(i, t)`` like the observation: the initial state at ``(0, 0)``, the
last one of the previous iteration at ``(i+1, 0)``, the step's output at ``(i, t+1)``.
One step is a traceable UDF (``tp.udf(..., traceable=True)``): a device op the compiler
fuses with the policy around it. Its random keys come from the program's own draws at
each point, so runs are reproducible and resume exactly. Subclasses (gymnax, Brax) say
how to reset and step a batch of copies.
"""

from __future__ import annotations

import pickle
from typing import Any

import jax
import numpy as np

import tempo as tp
from tempo.symbolic.expr import Symbol
from tempo_rl.envs.base import EnvBase, Policy, Rollout


class JaxEnv(EnvBase):
    """Base class: ``num_envs`` copies of a JAX env, reset with ``seed``."""

    num_envs: int
    obs_shape: tuple[int, ...]
    discrete: bool
    num_actions: int | None
    action_shape: tuple[int, ...]

    def __init__(self, num_envs: int, seed: int):
        super().__init__(num_envs)
        self.num_envs, self.seed = num_envs, seed
        obs, state = self.reset_batch(jax.random.PRNGKey(seed))
        leaves, self._treedef = jax.tree_util.tree_flatten(state)
        self._leaf_types = [(tuple(leaf.shape), str(leaf.dtype)) for leaf in leaves]
        self._initial = (np.asarray(obs, np.float32), [np.asarray(leaf) for leaf in leaves])

    # ---- what a subclass defines (pure JAX, batched over the copies) -----------------
    def reset_batch(self, key: jax.Array) -> tuple[jax.Array, Any]:
        """``(obs, state)`` of ``num_envs`` fresh episodes."""
        raise NotImplementedError

    def transition(self, key: jax.Array, state: Any, action: jax.Array) -> tuple[Any, ...]:
        """``(obs, reward, terminated, truncated, final_obs, state)``, with finished
        episodes already reset (``final_obs`` is the observation before that reset)."""
        raise NotImplementedError

    # ---- shared -----------------------------------------------------------------------
    def step(self, seed: jax.Array, action: jax.Array, *leaves: jax.Array) -> tuple[jax.Array, ...]:
        """Pure JAX: ``(obs, reward, terminated, truncated, final_obs, *next_leaves)``."""
        state = jax.tree_util.tree_unflatten(self._treedef, leaves)
        obs, reward, terminated, truncated, final, state = self.transition(
            jax.random.PRNGKey(seed), state, action)
        return (obs.astype("float32"), reward.astype("float32"), terminated.astype("float32"),
                truncated.astype("float32"), final.astype("float32"),
                *jax.tree_util.tree_leaves(state))

    def _reset(self) -> tuple[np.ndarray, ...]:
        obs, leaves = self._initial
        return (obs, *leaves)

    def _carry(self, point: dict[str, int], rewards: np.ndarray, dones: np.ndarray,
               obs: np.ndarray, *leaves: np.ndarray) -> tuple:
        """Between iterations: count the iteration's episodes, keep the state the next
        one starts from."""
        self._record_rollout(rewards, dones)
        iteration = self._keep_snapshot(point, {"obs": obs, "leaves": list(leaves)})
        return (obs, *leaves, np.float32(iteration))

    def restore(self, state: bytes) -> None:
        saved = pickle.loads(state)
        if saved["obs"].shape != (self.num_envs, *self.obs_shape):
            raise ValueError(f"the snapshot holds observations of shape {saved['obs'].shape}")
        self._initial = (saved["obs"], saved["leaves"])
        self.stats.resume(saved)

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
