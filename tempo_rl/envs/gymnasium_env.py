"""Gymnasium vector environments on the host, stepped by UDF ops.

The environments form the spatial batch dim of the observations (``(num_envs, *obs)``);
the program's dims are ``(i, t)``: iteration and timestep. Observations are a placeholder:
the reset at ``(0, 0)``, the last observation of the previous iteration at ``(i+1, 0)``,
and the step's output at ``(i, t+1)``, so the environment's calls are ordered by data
dependences alone. Episodes end inside a rollout: ``terminated`` and ``truncated`` are
kept apart, the final observation of a truncated episode is returned for bootstrapping,
and the vector env resets finished episodes in the same step. Between iterations the
env's state is kept (``snapshot``) so that checkpoints resume exactly (``restore``).
"""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np

import tempo as tp
from tempo.symbolic.expr import Symbol
from tempo_rl.envs.base import EnvBase, Policy, Rollout


class GymnasiumEnv(EnvBase):
    """``num_envs`` copies of a registered gymnasium env, reset with ``seed``."""

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0):
        super().__init__(num_envs)
        self.env_id, self.num_envs, self.seed = env_id, num_envs, seed
        self.envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                                 vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
        space = self.envs.single_observation_space
        self.obs_shape = tuple(space.shape)
        action_space = self.envs.single_action_space
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.num_actions = int(action_space.n) if self.discrete else None
        self.action_shape = () if self.discrete else tuple(action_space.shape)
        self._restored_obs: np.ndarray | None = None

    # ---- host side ------------------------------------------------------------------
    def _reset(self) -> np.ndarray:
        if self._restored_obs is not None:
            return self._restored_obs
        obs, _ = self.envs.reset(seed=self.seed)
        return obs.astype(np.float32)

    def _step(self, action: np.ndarray) -> tuple[np.ndarray, ...]:
        if self.discrete:
            action = action.astype(np.int64)
        else:  # the policy's Gaussian is unbounded; the env takes actions in its box
            space = self.envs.single_action_space
            action = np.clip(action, space.low, space.high)
        obs, reward, terminated, truncated, info = self.envs.step(action)
        obs = obs.astype(np.float32)
        final = obs.copy()
        done = terminated | truncated
        if done.any() and "final_obs" in info:
            for k in np.flatnonzero(done):
                final[k] = info["final_obs"][k]
        self.stats.record(reward, done)
        return (obs, reward.astype(np.float32), terminated.astype(np.float32),
                truncated.astype(np.float32), final)

    # ---- checkpoints -------------------------------------------------------------------
    def _carry(self, point: dict[str, int], last_obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Between iterations: keep the state the next iteration starts from."""
        iteration = self._keep_snapshot(point, {"envs": self.envs.envs, "obs": last_obs})
        return last_obs, np.float32(iteration)

    def restore(self, state: bytes) -> None:
        saved = pickle.loads(state)
        if len(saved["envs"]) != self.num_envs:
            raise ValueError(f"the snapshot holds {len(saved['envs'])} envs, this env {self.num_envs}")
        self.envs.envs = saved["envs"]
        self._restored_obs = saved["obs"]
        self.stats.resume(saved)

    # ---- program side ------------------------------------------------------------------
    def rollout(self, policy: Policy, i: Symbol, t: Symbol, T: Symbol) -> Rollout:
        """Acting over ``(i, t)``: ``policy(obs)`` returns the action RT and any extra RTs
        (log-probabilities, values) that the learner reuses."""
        n, obs_shape = self.num_envs, self.obs_shape
        self._iteration_dim = i.name
        obs = tp.placeholder(shape=(n, *obs_shape), dtype="float32", domain=(i, t))
        (first,) = tp.udf(self._reset, [], [((n, *obs_shape), "float32")], name="env_reset")
        action, extras = policy(obs)
        float_out = [((n,), "float32")] * 3
        nxt, reward, terminated, truncated, final = tp.udf(
            self._step, [action], [((n, *obs_shape), "float32"), *float_out,
                                   ((n, *obs_shape), "float32")], name="env_step")
        carried, saved = tp.udf(self._carry, [nxt[i, T - 1]],
                                [((n, *obs_shape), "float32"), ((), "float32")],
                                name="env_carry", pass_point=True)
        obs[0, 0] = first
        obs[i + 1, 0] = carried
        obs[i, t + 1] = nxt
        return Rollout(obs, action, reward, terminated, truncated, final, extras, saved)
