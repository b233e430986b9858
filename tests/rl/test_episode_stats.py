"""Episode accounting: a whole iteration's steps at once against the same steps one by one."""

from __future__ import annotations

import numpy as np
import pytest

from tempo_rl.envs.base import EpisodeStats


def step_by_step(num_envs: int, blocks: list[tuple[np.ndarray, np.ndarray]]) -> tuple[list, list, np.ndarray,
                                                                                     np.ndarray]:
    """The plain loop: each step adds its reward; an end appends the episode and restarts."""
    returns, lengths = [], []
    running, length = np.zeros(num_envs), np.zeros(num_envs, np.int64)
    for rewards, dones in blocks:  # (envs, T) each
        for t in range(rewards.shape[1]):
            for n in range(num_envs):
                running[n] += rewards[n, t]
                length[n] += 1
                if dones[n, t]:
                    returns.append(float(running[n]))
                    lengths.append(int(length[n]))
                    running[n], length[n] = 0.0, 0
    return returns, lengths, running, length


@pytest.mark.parametrize("seed", range(4))
def test_a_block_of_steps_counts_episodes_as_the_steps_one_by_one(seed):
    rng = np.random.default_rng(seed)
    num_envs, steps = 5, 17
    # quarters: float64 adds them exactly in any order, so the sums must agree bit for bit
    blocks = [(rng.integers(-8, 9, (num_envs, steps)).astype(np.float32) / 4,
               (rng.random((num_envs, steps)) < [[0.0], [0.05], [0.3], [0.9], [1.0]]).astype(np.float32))
              for _ in range(3)]
    stats = EpisodeStats(num_envs)
    for rewards, dones in blocks:
        stats.record_steps(rewards, dones)
    returns, lengths, running, length = step_by_step(num_envs, blocks)
    assert stats.returns == returns and stats.lengths == lengths
    np.testing.assert_array_equal(stats.running_return, running)
    np.testing.assert_array_equal(stats.running_length, length)
    assert len(returns) > steps  # (the envs that end at every step, and one that never ends)


def test_a_block_of_some_envs_leaves_the_others_alone():
    stats = EpisodeStats(3)
    stats.record(np.array([1.0, 2.0, 3.0]), np.zeros(3))
    stats.record_steps(np.array([[0.5, 0.5, 0.5]]), np.array([[0, 1, 0]]), envs=np.array([2]))
    assert stats.returns == [4.0] and stats.lengths == [3]
    np.testing.assert_array_equal(stats.running_return, [1.0, 2.0, 0.5])
    np.testing.assert_array_equal(stats.running_length, [1, 1, 1])
    stats.record_env(0, np.array([1.0, 1.0]), np.array([0.0, 1.0]))
    stats.record_env(1, 1.0, True)
    assert stats.returns == [4.0, 3.0, 3.0] and stats.lengths == [3, 3, 2]


def test_a_nan_reward_spoils_its_own_episode_only():
    rewards = np.ones((2, 6), np.float32)
    rewards[0, 1] = np.nan
    dones = np.zeros((2, 6), np.float32)
    dones[:, 2] = 1
    stats = EpisodeStats(2)
    stats.record_steps(rewards, dones)
    stats.record_steps(np.ones((2, 2), np.float32), np.array([[0, 1], [0, 1]], np.float32))
    returns, lengths, running, length = step_by_step(2, [(rewards, dones),
                                                         (np.ones((2, 2)), np.array([[0, 1], [0, 1]]))])
    assert np.isnan(stats.returns[0]) and np.isnan(returns[0])
    assert stats.returns[1:] == returns[1:] == [3.0, 5.0, 5.0] and stats.lengths == lengths
    np.testing.assert_array_equal(stats.running_return, running)
