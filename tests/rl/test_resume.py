"""A run resumed from a checkpoint continues the uninterrupted run exactly: the same losses
at every later iteration, the same episodes, the same final parameters."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tempo.api import checkpoint
from tempo_rl.config import load_config as config
from tempo_rl.metrics import is_measurement
from tempo_rl.train import CONFIG_KEY, ENV_KEY, train


@pytest.mark.parametrize("algorithm,env,backend", [
    ("ppo", "cartpole", "numpy"), ("nstep", "cartpole", "numpy"), ("ppo", "synthetic", "numpy"),
    ("ppo", "gymnax_cartpole", "numpy"),
    # Lowered loops compute the coordinates random draws are keyed by in batches, shifted
    # by the resumed run's origin as the point-by-point launches are.
    ("ppo", "synthetic", "jax")])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, algorithm, env, backend):
    common = (f"algorithm={algorithm}", f"env={env}", "algorithm.num_steps=16", "env.num_envs=2",
              "total_timesteps=256", "checkpoint_every=4", "keep_checkpoints=true",  # 8 iterations
              f"backend={backend}", "loops=lowered")
    full = train(config(*common), tmp_path / "full", progress=False)
    saved = tmp_path / "full" / "checkpoints" / "iteration_3.npz"
    resumed = train(config(*common, f"resume_from={saved}"), tmp_path / "resumed", progress=False)

    assert [row["iteration"] for row in resumed.history] == [4, 5, 6, 7]
    for before, after in zip(full.history[4:], resumed.history):
        for name, value in before.items():
            if not is_measurement(name):
                assert after[name] == value, (name, before["iteration"])
    assert resumed.episode_returns, "no episode finished after the checkpoint"
    assert resumed.episode_returns == full.episode_returns[-len(resumed.episode_returns):]
    last_full, last_resumed = checkpoint.load(full.checkpoint), checkpoint.load(resumed.checkpoint)
    for name, value in last_full.items():
        if name not in (ENV_KEY, CONFIG_KEY):  # equal states pickle to unequal bytes; the
            # config differs by resume_from
            np.testing.assert_array_equal(last_resumed[name], value, err_msg=name)
    env_full, env_resumed = (pickle.loads(c[ENV_KEY].tobytes()) for c in (last_full, last_resumed))
    np.testing.assert_array_equal(env_resumed["obs"], env_full["obs"])
    for a, b in zip(env_full.get("leaves", []), env_resumed.get("leaves", [])):
        np.testing.assert_array_equal(b, a)
    np.testing.assert_array_equal(env_resumed["running_return"], env_full["running_return"])
    for a, b in zip(env_full.get("envs", []), env_resumed.get("envs", [])):
        np.testing.assert_array_equal(b.unwrapped.state, a.unwrapped.state)
        assert b.unwrapped.np_random.bit_generator.state == a.unwrapped.np_random.bit_generator.state


def test_resuming_past_the_end_is_an_error(tmp_path):
    common = ("algorithm=nstep", "algorithm.num_steps=16", "env.num_envs=2", "total_timesteps=64")
    full = train(config(*common), tmp_path / "full", progress=False)
    with pytest.raises(ValueError, match="none left to run"):
        train(config(*common, f"resume_from={full.checkpoint}"), tmp_path / "again", progress=False)
