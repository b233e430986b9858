"""The synthetic env: its JAX step against the bandit's definition, PPO learning it in the
graph, and the same program on the JAX backend."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import norm

from tempo_rl.config import load_config as config
from tempo_rl.envs import SyntheticEnv
from tempo_rl.train import train


def test_step_rewards_the_bucket_of_the_first_entry_and_truncates():
    env = SyntheticEnv(num_envs=6, obs_shape=(2, 3), num_actions=3, episode_length=4)
    obs = np.random.default_rng(0).standard_normal((6, 2, 3)).astype(np.float32)
    action = np.array([0, 1, 2, 0, 1, 2])
    count = np.array([0, 1, 2, 3, 3, 0], np.float32)
    fresh = np.ones_like(obs)
    step = jax.vmap(env.step)  # the step is one env's; the compiler vmaps it over the env dim
    nxt, reward, truncated, next_count = step(jnp.asarray(obs), jnp.asarray(count),
                                              jnp.asarray(action), jnp.asarray(fresh))
    bucket = np.minimum((norm.cdf(obs[:, 0, 0]) * 3).astype(int), 2)
    np.testing.assert_array_equal(np.asarray(reward), (action == bucket).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(truncated), [0, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(np.asarray(next_count), [1, 2, 3, 0, 0, 1])
    np.testing.assert_array_equal(np.asarray(nxt), fresh)


def test_ppo_learns_the_synthetic_env(tmp_path):
    """51k env steps; a random policy earns 16 of 32 per episode."""
    result = train(config("env=synthetic", "total_timesteps=51200"), tmp_path, progress=False)
    assert result.mean_return(last=100) >= 28, result.episode_returns[-20:]


def test_the_jax_backend_runs_the_in_graph_env(tmp_path):
    """With the paper's 3x4x4 observations (the networks flatten them)."""
    cfg = config("env=synthetic", "total_timesteps=2048", "backend=jax", "env.obs_shape=[3,4,4]")
    result = train(cfg, tmp_path, progress=False)
    assert len(result.episode_returns) == 2048 // 32  # every episode is 32 steps
    assert all(0 <= r <= 32 for r in result.episode_returns)
