"""gymnax envs in the graph: the step equals gymnax's own, and PPO learns CartPole on it."""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np

from tempo_rl.config import load_config as config
from tempo_rl.envs import GymnaxEnv
from tempo_rl.train import train


def test_step_is_gymnax_step_per_env():
    env = GymnaxEnv("CartPole-v1", num_envs=3, seed=0)
    reference, params = gymnax.make("CartPole-v1")
    for k, action in enumerate([0, 1, 1]):
        _, *leaves = env._reset({"b": k})
        state = jax.tree_util.tree_unflatten(env._treedef, [jnp.asarray(x) for x in leaves])
        seed = jnp.int32(7 + k)
        obs, reward, terminated, truncated, final, *after = env.step(seed, jnp.int32(action), *leaves)
        o, s, r, term, trunc, info = reference.step(jax.random.PRNGKey(seed), state, action, params)
        np.testing.assert_allclose(obs, o, rtol=1e-6)
        np.testing.assert_allclose(final, info["final_observation"], rtol=1e-6)
        assert (reward, terminated, truncated) == (r, term, trunc)
        for ours, theirs in zip(after, jax.tree_util.tree_leaves(s)):
            np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_ppo_learns_gymnax_cartpole(tmp_path):
    """61k env steps; a random policy scores ~22."""
    result = train(config("env=gymnax_cartpole", "total_timesteps=61440"), tmp_path, progress=False)
    assert result.mean_return(last=20) >= 100, result.episode_returns[-20:]
    assert max(result.episode_returns) <= 500  # truncated at gymnax's 500 steps
