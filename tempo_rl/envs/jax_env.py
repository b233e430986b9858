"""Environments written in JAX, stepped in the graph.

The env's state is a pytree; each leaf is a placeholder over ``(b, i, t)`` like the
observation: env ``b``'s initial state at ``(b, 0, 0)``, its last one of the previous
iteration at ``(b, i+1, 0)``, the step's output at ``(b, i, t+1)``. One step of one env
is a traceable UDF (``tp.udf(..., traceable=True)``): a device op that the compiler vmaps
over the env dim and fuses with the policy around it. Its random keys come from the
program's own draws at each point, so runs are reproducible and resume exactly.
Subclasses (gymnax, Brax) say how to reset and step one env.
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

import tempo as tp
from tempo.symbolic.expr import Symbol
from tempo_rl.envs.base import EnvBase, Policy, Rollout, saved_marker


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
        # One jitted program: run eagerly, each of the reset's operations compiles its own.
        reset = jax.jit(lambda key: jax.vmap(self.reset_env)(jax.random.split(key, num_envs)))
        key = jax.random.PRNGKey(seed)
        _, state = jax.eval_shape(reset, key)  # (traced now: a bad env fails here)
        leaves, self._treedef = jax.tree_util.tree_flatten(state)
        self._leaf_types = [(tuple(leaf.shape[1:]), str(leaf.dtype)) for leaf in leaves]
        # Compiled and run on a thread of its own while the program is built and compiled:
        # XLA releases the GIL (0.2-0.4 s of start-up for gymnax CartPole, 8-512 envs).
        self._initial: Future | tuple = _resetting().submit(lambda: _on_host(*reset(key)))

    @property
    def initial(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """The envs' first observations and state leaves (from ``seed``, or ``restore``)."""
        if isinstance(self._initial, Future):
            self._initial = self._initial.result()
        return self._initial

    # ---- what a subclass defines (pure JAX, one env) ----------------------------------
    def reset_env(self, key: jax.Array) -> tuple[jax.Array, Any]:
        """``(obs, state)`` of a fresh episode."""
        raise NotImplementedError

    def transition(self, key: jax.Array, state: Any, action: jax.Array) -> tuple[Any, ...]:
        """``(obs, reward, terminated, truncated, final_obs, state)``, a finished episode
        already reset (``final_obs`` is the observation before that reset)."""
        raise NotImplementedError

    # ---- shared -----------------------------------------------------------------------
    def step(self, seed: jax.Array, action: jax.Array, *leaves: jax.Array) -> tuple[jax.Array, ...]:
        """Pure JAX, one env: ``(obs, reward, terminated, truncated, final_obs, *next_leaves)``."""
        state = jax.tree_util.tree_unflatten(self._treedef, leaves)
        obs, reward, terminated, truncated, final, state = self.transition(
            jax.random.PRNGKey(seed), state, action)
        return (obs.astype("float32"), reward.astype("float32"), terminated.astype("float32"),
                truncated.astype("float32"), final.astype("float32"),
                *jax.tree_util.tree_leaves(state))

    def _reset(self, point: dict[str, int]) -> tuple[np.ndarray, ...]:
        obs, leaves = self.initial
        k = point.get(self._env_dim)
        if k is None:
            return (obs, *leaves)
        return (obs[k], *(leaf[k] for leaf in leaves))

    def _carry(self, point: dict[str, int], rewards: np.ndarray, dones: np.ndarray,
               obs: np.ndarray, *leaves: np.ndarray) -> tuple:
        """After an iteration (of one env, or all): count its episodes, keep the state the
        next one starts from (for a checkpoint: the next iteration reads it on the device)."""
        self._record_rollout(point, rewards, dones)

        def state() -> dict[str, np.ndarray]:
            return {"obs": obs, **{f"leaf{n}": leaf for n, leaf in enumerate(leaves)}}
        iteration = self._keep_snapshot(point, state)
        return (np.full(rewards.shape[:-1], iteration, np.float32),)

    def restore(self, state: dict[str, np.ndarray]) -> None:
        names = [f"leaf{n}" for n in range(len(self._leaf_types))]
        self._restored_stats(state, ("obs", *names))
        wanted = [(self.obs_shape, "float32"), *self._leaf_types]
        for name, (shape, dtype) in zip(["obs", *names], wanted):
            if state[name].shape != (self.num_envs, *shape) or state[name].dtype != np.dtype(dtype):
                raise ValueError(f"the env state's {name} is {state[name].dtype}{list(state[name].shape)}, "
                                 f"this env's {dtype}{[self.num_envs, *shape]}")
        self._initial = (state["obs"], [state[name] for name in names])

    def rollout(self, policy: Policy, b: Symbol, i: Symbol, t: Symbol, T: Symbol) -> Rollout:
        obs_type = (self.obs_shape, "float32")
        self._dims(b, i)
        obs = tp.placeholder(shape=obs_type[0], dtype="float32", domain=(b, i, t))
        leaves = [tp.placeholder(shape=s, dtype=d, domain=(b, i, t)) for s, d in self._leaf_types]
        types = [obs_type, *self._leaf_types]
        first = self._env_udf(self._reset, [], types, "env_reset", domain=(b,), batched=self._reset)
        action, extras = policy(obs)
        seed = tp.randint(0, 2**31 - 1, domain=(b, i, t))
        nxt, reward, terminated, truncated, final, *after = tp.udf(
            self.step, [seed, action, *leaves], traceable=True, name="env_step")
        done = tp.max(terminated, truncated)
        # The host only records the iteration (episodes, the state for a checkpoint): the
        # next one starts from the last step's state on the device.
        (recorded,) = self._env_udf(self._carry, [reward[b, i, 0:T], done[b, i, 0:T], nxt[b, i, T - 1],
                                                  *(leaf[b, i, T - 1] for leaf in after)],
                                    [((), "float32")], "env_carry", batched=self._carry)
        for var, start, step_out in zip([obs, *leaves], first, [nxt, *after]):
            var[b, 0, 0] = start
            var[b, i + 1, 0] = step_out[b, i, T - 1]
            var[b, i, t + 1] = step_out
        return Rollout(obs, action, reward, terminated, truncated, final, extras,
                       saved_marker(recorded, b, i))


@functools.cache
def _resetting() -> ThreadPoolExecutor:
    """The thread that computes JAX envs' first states (``JaxEnv``)."""
    return ThreadPoolExecutor(1, thread_name_prefix="tempo-env-reset")


def _on_host(obs: jax.Array, state: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    return np.asarray(obs, np.float32), [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state)]
