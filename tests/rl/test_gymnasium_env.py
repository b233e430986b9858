"""The gymnasium env's direct step (``direct_step``) is gymnasium's own ``env.step``
through its wrappers: the same transitions, episode ends and wrapper state."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from tempo_rl.envs import gym_state
from tempo_rl.envs.gymnasium_env import GymnasiumEnv, direct_step


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_direct_step_is_gymnasiums_step(env_id):
    """Two envs of 300 random steps each (several CartPole episodes; Pendulum truncated at
    200 steps by its time limit), each env reset in the step its episode ends: every
    observation, reward, end flag and final observation equals a ``gym.make`` env stepped
    through its wrappers, and so does each layer's state afterwards."""
    env = GymnasiumEnv(env_id, num_envs=2, seed=5)
    references = [gym.make(env_id) for _ in range(2)]
    for k, reference in enumerate(references):
        env.envs[k].reset(seed=5 + k)
        reference.reset(seed=5 + k)
    rng = np.random.default_rng(0)
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(300):
        for k, reference in enumerate(references):
            if env.discrete:
                action = np.int64(rng.integers(env.num_actions))
                given = int(action)
            else:
                action = rng.normal(size=env.action_shape).astype(np.float32) * 3
                given = np.clip(action, reference.action_space.low, reference.action_space.high)
            obs, reward, terminated, truncated, final = env._step_env(k, action)
            expected = reference.step(given)
            np.testing.assert_array_equal(final, expected[0])
            assert (reward, terminated, truncated) == expected[1:4]
            if terminated or truncated:
                ends["terminated" if terminated else "truncated"] += 1
                expected_obs, _ = reference.reset()
                np.testing.assert_array_equal(obs, expected_obs)
            else:
                np.testing.assert_array_equal(obs, expected[0])
    assert ends["terminated" if env_id == "CartPole-v1" else "truncated"] > 0
    assert all(step is not None and step != envs.step for step, envs in zip(env._steps, env.envs))
    for mine, reference in zip(env.envs, references):
        assert gym_state.dump(mine) == gym_state.dump(reference)


def test_an_env_with_other_wrappers_steps_through_them():
    """An env with a wrapper ``gym.make`` does not add by default is stepped as it is."""
    wrapped = gym.wrappers.ClipReward(gym.make("CartPole-v1"), 0.0, 0.5)
    wrapped.reset(seed=0)
    assert direct_step(wrapped) == wrapped.step
    fresh = gym.make("CartPole-v1")
    assert direct_step(fresh) is None  # not reset yet: the order check and env checker first
