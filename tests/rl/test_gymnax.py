"""gymnax envs in the graph: the step equals gymnax's own, and PPO learns CartPole on it."""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np

from tempo_rl.config import load_config as config
from tempo_rl.envs import GymnaxEnv
from tempo_rl.train import train


def test_step_is_gymnax_step_per_copy():
    env = GymnaxEnv("CartPole-v1", num_envs=3, seed=0)
    reference, params = gymnax.make("CartPole-v1")
    _, *leaves = env._reset()
    state = jax.tree_util.tree_unflatten(env._treedef, [jnp.asarray(x) for x in leaves])
    action = jnp.array([0, 1, 1])
    obs, reward, terminated, truncated, final, *after = env.step(jnp.int32(7), action, *leaves)
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    for k in range(3):
        one = jax.tree_util.tree_map(lambda x: x[k], state)
        o, s, r, term, trunc, info = reference.step(keys[k], one, action[k], params)
        np.testing.assert_allclose(obs[k], o, rtol=1e-6)
        np.testing.assert_allclose(final[k], info["final_observation"], rtol=1e-6)
        assert (reward[k], terminated[k], truncated[k]) == (r, term, trunc)
        for ours, theirs in zip(after, jax.tree_util.tree_leaves(s)):
            np.testing.assert_allclose(ours[k], theirs, rtol=1e-6)


def test_ppo_learns_gymnax_cartpole(tmp_path):
    """61k env steps; a random policy scores ~22."""
    result = train(config("env=gymnax_cartpole", "total_timesteps=61440"), tmp_path, progress=False)
    assert result.mean_return(last=20) >= 100, result.episode_returns[-20:]
    assert max(result.episode_returns) <= 500  # truncated at gymnax's 500 steps
