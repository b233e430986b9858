"""Brax in the graph: PPO with a Gaussian policy improves clearly on inverted_pendulum."""

from __future__ import annotations

import numpy as np

from tempo_rl.config import load_config as config
from tempo_rl.train import train


def test_ppo_improves_over_random_on_brax_inverted_pendulum(tmp_path):
    """12k env steps (24 iterations x 64 steps x 8 envs); the first episodes are the
    initial, near-random policy's (the pole falls after ~20 steps)."""
    cfg = config("env=brax_inverted_pendulum", "total_timesteps=12288")
    result = train(cfg, tmp_path, progress=False)
    first, last = np.mean(result.episode_returns[:20]), result.mean_return(last=20)
    assert last >= 2 * first, (first, last)
