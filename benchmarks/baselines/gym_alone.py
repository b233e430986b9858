"""Gymnasium's own stepping, without any agent: a floor for every row that steps host envs.

The same ``num_envs`` copies of gymnasium's CartPole-v1 that Tempo's gymnasium env steps
(one ``gym.make`` each, reset with ``seed + k``), stepped ``num_steps`` times per iteration
one env after the other with uniformly random actions, each finished episode reset in the
same step, as ``tempo_rl/envs/gymnasium_env.py`` does. No policy, no learning: an iteration
of any PPO that steps these envs one by one takes at least this long, so this row's s/iter
bounds how much faster than another such system (the PyTorch baseline) one can be.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

from benchmarks.common import Cell, Measurement


def run(cell: Cell) -> Measurement:
    """Step the cell's envs for ``cell.total_iterations`` rollouts; time each one."""
    if cell.impl != "gymnasium" or cell.env.name != "cartpole":
        raise ValueError(f"gymnasium alone steps gymnasium CartPole, not {cell.env.name} ({cell.impl})")
    began = time.perf_counter()
    envs = [gym.make("CartPole-v1") for _ in range(cell.env.num_envs)]
    for k, env in enumerate(envs):
        env.reset(seed=cell.seed + k)
    rng = np.random.default_rng(cell.seed)
    returns: list[float] = []
    finished: list[int] = []
    running = np.zeros(len(envs))
    times: list[float] = []
    setup_s = time.perf_counter() - began
    for _ in range(cell.total_iterations):
        ended = len(returns)
        start = time.perf_counter()
        for _ in range(cell.ppo.num_steps):
            actions = rng.integers(0, 2, len(envs))
            for k, (env, action) in enumerate(zip(envs, actions)):
                _, reward, terminated, truncated, _ = env.step(int(action))
                running[k] += reward
                if terminated or truncated:
                    env.reset()
                    returns.append(float(running[k]))
                    running[k] = 0.0
        times.append(time.perf_counter() - start)
        finished.append(len(returns) - ended)
    return Measurement(None, times, returns, note="random actions, no agent: a floor, not a PPO",
                       setup_s=setup_s, episodes=finished)
