"""Gymnasium environments on the host, stepped by UDF ops over the env dim.

The program's dims are ``(b, i, t)``: env, iteration and timestep. Env ``b`` is its own
gymnasium env (``gym.make``, reset with ``seed + b``, as a gymnasium vector env seeds its
copies); the compiler steps them all at once (the UDFs' ``batched`` forms loop over them,
as gymnasium's synchronous vector env does). Observations are a placeholder: the reset at
``(b, 0, 0)``, the last observation of the previous iteration at ``(b, i+1, 0)``, and the
step's output at ``(b, i, t+1)``, so the environment's calls are ordered by data
dependences alone. Episodes end inside a rollout: ``terminated`` and ``truncated`` are
kept apart, the final observation of a finished episode is returned for bootstrapping,
and the env is reset in the same step. Between iterations the envs' state is kept
(``snapshot``) so that checkpoints resume exactly (``restore``).

An env is made when first used. Over several hosts (``distributed=data`` with
``num_processes``) each process makes and steps only the envs of its own devices' shard
of ``b`` (the UDFs' ``own_rows``), and its checkpoint holds their state
(``env_indices``): each process resumes from its own.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

import tempo as tp
from tempo.symbolic.expr import Symbol
from tempo_rl.envs import gym_state
from tempo_rl.envs.base import EnvBase, Policy, Rollout, from_json_array, json_array, saved_marker
from tempo_rl.envs.registry import register_env


class GymnasiumEnv(EnvBase):
    """``num_envs`` copies of a registered gymnasium env, reset with ``seed``."""

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0):
        super().__init__(num_envs)
        self.env_id, self.num_envs, self.seed = env_id, num_envs, seed
        self.envs: dict[int, gym.Env] = {}
        """The envs made so far, by index (``env``)."""
        probe = gym.make(env_id)
        self.obs_shape = tuple(probe.observation_space.shape)
        self.action_space = probe.action_space
        probe.close()
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self.num_actions = int(self.action_space.n) if self.discrete else None
        self.action_shape = () if self.discrete else tuple(self.action_space.shape)
        self._restored_obs: dict[int, np.ndarray] | None = None

    def env(self, k: int) -> gym.Env:
        """Env ``k``, made when first asked for."""
        if k not in self.envs:
            if not 0 <= k < self.num_envs:
                raise IndexError(f"env {k} of {self.num_envs}")
            self.envs[k] = gym.make(self.env_id)
        return self.envs[k]

    # ---- host side, one env --------------------------------------------------------
    def _reset(self, point: dict[str, int]) -> tuple[np.ndarray]:
        k = point[self._env_dim]
        if self._restored_obs is not None:
            if k not in self._restored_obs:
                raise ValueError(f"the checkpoint holds the state of envs {sorted(self._restored_obs)}, "
                                 f"not of env {k}: over several hosts resume each process from its own "
                                 f"checkpoint, with the same distributed.num_processes")
            return (self._restored_obs[k],)
        obs, _ = self.env(k).reset(seed=self.seed + k)
        return (obs.astype(np.float32),)

    def _step(self, point: dict[str, int], action: np.ndarray) -> tuple[np.ndarray, ...]:
        k = point[self._env_dim]
        obs, reward, terminated, truncated, final = self._step_env(k, action)
        self.stats.record_env(k, reward, terminated or truncated)
        return (np.asarray(obs, np.float32), np.float32(reward), np.float32(terminated),
                np.float32(truncated), np.asarray(final, np.float32))

    def _step_all(self, point: dict[str, Any], actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """Every env's step, or (``own_rows``) those of ``point[b]``."""
        envs = point.get(self._env_dim)
        indices = range(self.num_envs) if envs is None else np.asarray(envs).tolist()
        # (Python ints for discrete actions: a NumPy scalar's int() per env costs as much)
        steps = [self._step_env(k, action)
                 for k, action in zip(indices, actions.tolist() if self.discrete else actions)]
        obs, reward, terminated, truncated, final = zip(*steps)
        reward, terminated, truncated = (np.asarray(x, np.float32) for x in (reward, terminated, truncated))
        self.stats.record(reward, np.maximum(terminated, truncated), envs)
        return (np.asarray(obs, np.float32), reward, terminated, truncated, np.asarray(final, np.float32))

    def _step_env(self, k: int, action: np.ndarray) -> tuple:
        """Env ``k``'s step, reset in the same step when its episode ends."""
        if self.discrete:
            action = int(action)
        else:  # the policy's Gaussian is unbounded; the env takes actions in its box
            action = np.clip(action, self.action_space.low, self.action_space.high)
        obs, reward, terminated, truncated, _ = self.env(k).step(action)
        final = obs
        if terminated or truncated:
            obs, _ = self.env(k).reset()
        return obs, reward, terminated, truncated, final

    # ---- checkpoints -------------------------------------------------------------------
    def _carry(self, point: dict[str, Any], last_obs: np.ndarray) -> tuple[np.ndarray, np.float32]:
        """Between iterations: keep the state the next iteration starts from (each env's
        as JSON under ``env<k>``, see ``gym_state``; with ``own_rows``, this process's
        envs, whose indices ``env_indices`` lists)."""
        k = point.get(self._env_dim)
        own = isinstance(k, np.ndarray)
        indices = range(self.num_envs) if k is None else k if own else [k]

        def state() -> dict[str, np.ndarray]:
            envs = {f"env{int(n)}": json_array(gym_state.dump(self.env(int(n)))) for n in indices}
            return {"obs": last_obs, **envs, **({"env_indices": np.asarray(k, np.int64)} if own else {})}
        iteration = self._keep_snapshot(point, state)
        return last_obs, np.full(np.shape(last_obs)[:1] if k is None or own else (), iteration, np.float32)

    def restore(self, state: dict[str, np.ndarray]) -> None:
        indices = [int(k) for k in state.get("env_indices", range(self.num_envs))]
        envs = [f"env{k}" for k in indices]
        self._restored_stats(state, ("obs", *envs))
        stored = sorted(name for name in state if name.startswith("env") and name[3:].isdigit())
        if len(stored) != len(indices) or state["obs"].shape != (len(indices), *self.obs_shape) \
                or not all(0 <= k < self.num_envs for k in indices):
            raise ValueError(f"the env state holds {len(stored)} envs with observations of shape "
                             f"{state['obs'].shape}; this env has {self.num_envs} of shape {self.obs_shape}")
        for name, k in zip(envs, indices):
            gym_state.load(self.env(k), from_json_array(state[name], f"the env state's {name}"))
        self._restored_obs = dict(zip(indices, state["obs"].astype(np.float32)))

    # ---- program side ------------------------------------------------------------------
    def rollout(self, policy: Policy, b: Symbol, i: Symbol, t: Symbol, T: Symbol) -> Rollout:
        """Acting over ``(b, i, t)``: ``policy(obs)`` returns the action RT and any extra
        RTs (log-probabilities, values) that the learner reuses."""
        self._dims(b, i)
        obs_type = (self.obs_shape, "float32")
        obs = tp.placeholder(shape=self.obs_shape, dtype="float32", domain=(b, i, t))
        (first,) = self._env_udf(self._reset, [], [obs_type], "env_reset", domain=(b,), own_rows=True)
        action, extras = policy(obs)
        scalar = ((), "float32")
        nxt, reward, terminated, truncated, final = self._env_udf(
            self._step, [action], [obs_type, scalar, scalar, scalar, obs_type], "env_step",
            batched=self._step_all, own_rows=True)
        carried, saved = self._env_udf(self._carry, [nxt[b, i, T - 1]], [obs_type, scalar],
                                       "env_carry", batched=self._carry, own_rows=True)
        obs[b, 0, 0] = first
        obs[b, i + 1, 0] = carried
        obs[b, i, t + 1] = nxt
        return Rollout(obs, action, reward, terminated, truncated, final, extras,
                       saved_marker(saved, b, i))


@register_env("gymnasium", steps_on_host=True)
def _from_config(cfg: dict[str, Any], num_envs: int, seed: int) -> GymnasiumEnv:
    return GymnasiumEnv(cfg["id"], num_envs=num_envs, seed=seed)
