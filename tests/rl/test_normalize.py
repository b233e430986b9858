"""Observation normalization: the running statistics equal a NumPy running mean/variance
over every step's batch, carried across iterations, and a resumed run continues them."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.api import checkpoint
from tempo_rl.config import load_config as config
from tempo_rl.envs import GymnasiumEnv, NormalizedObservations
from tempo_rl.metrics import is_measurement
from tempo_rl.train import train


def _numpy_normalized(raw: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """gymnasium's RunningMeanStd, step by step over ``raw`` (iterations x steps x envs x obs)."""
    mean, var, count = np.zeros(raw.shape[-1]), np.ones(raw.shape[-1]), 1e-4
    out = np.empty_like(raw)
    for i in range(raw.shape[0]):
        for t in range(raw.shape[1]):
            batch = raw[i, t].astype(np.float64)
            b_mean, b_var, b_count = batch.mean(0), batch.var(0), batch.shape[0]
            delta, total = b_mean - mean, count + b_count
            mean = mean + delta * b_count / total
            var = (var * count + b_var * b_count + delta ** 2 * count * b_count / total) / total
            count = total
            out[i, t] = np.clip((raw[i, t] - mean) / np.sqrt(var + 1e-8), -10, 10)
    return out, {"mean": mean, "var": var, "count": np.asarray(count)}


def test_statistics_follow_a_numpy_running_mean_and_variance():
    env = NormalizedObservations(GymnasiumEnv("CartPole-v1", num_envs=3, seed=0))
    ctx = tp.Context(dims=("b", "i", "t"), parallel=("b",))
    (b, i, t), (B, I, T) = ctx.dims, ctx.bounds
    with ctx:
        ro = env.rollout(lambda obs: ((obs[b, i, t, 2] > 0).astype("int64"), {}), b, i, t, T)
        state = env.state
    outputs = [env.raw_obs, ro.obs, *state.values()]
    res = ctx.compile({B: 3, I: 3, T: 6}, outputs, backend="numpy").run()

    def step_major(x: np.ndarray) -> np.ndarray:  # (env, i, t, obs) -> (i, t, env, obs)
        return np.moveaxis(x, 0, 2)
    expected, final = _numpy_normalized(step_major(res[env.raw_obs]))
    np.testing.assert_allclose(step_major(res[ro.obs]), expected, rtol=1e-4, atol=1e-4)
    for name, value in final.items():
        np.testing.assert_allclose(res[state[f"obs_norm.{name}"]][-1], value, rtol=1e-4, atol=1e-4)
    assert np.abs(res[ro.obs][:, -1].mean(axis=(0, 1))).max() < 1.0  # roughly centred by then


def test_a_resumed_run_continues_the_statistics(tmp_path):
    common = ("env.normalize_obs=true", "algorithm.num_steps=16", "env.num_envs=2",
              "total_timesteps=192", "checkpoint_every=3", "keep_checkpoints=true")  # 6 iterations
    full = train(config(*common), tmp_path / "full", progress=False)
    saved = tmp_path / "full" / "checkpoints" / "iteration_2.npz"
    resumed = train(config(*common, f"resume_from={saved}"), tmp_path / "resumed", progress=False)
    for before, after in zip(full.history[3:], resumed.history):
        for name, value in before.items():
            if not is_measurement(name):
                assert after[name] == value, (name, before["iteration"])
    last_full, last_resumed = checkpoint.load(full.checkpoint), checkpoint.load(resumed.checkpoint)
    for name in ("obs_norm.mean", "obs_norm.var", "obs_norm.count", "param0"):
        np.testing.assert_array_equal(last_resumed[name], last_full[name], err_msg=name)
    assert last_full["obs_norm.count"] > 2 * 16 * 6  # every step's batch, all iterations


def test_resuming_with_another_normalization_setting_is_an_error(tmp_path):
    common = ("algorithm.num_steps=16", "env.num_envs=2", "total_timesteps=64")
    plain = train(config(*common), tmp_path / "plain", progress=False).checkpoint
    normalized = train(config(*common, "env.normalize_obs=true"), tmp_path / "norm",
                       progress=False).checkpoint
    for saved, setting in [(plain, "true"), (normalized, "false")]:
        with pytest.raises(tp.TempoError, match=r"env\.normalize_obs: "):  # the configs differ
            train(config(*common, "total_timesteps=128", f"env.normalize_obs={setting}",
                         f"resume_from={saved}"), tmp_path / "a", progress=False)
    # forced past the config check, the checkpoint's state does not fit either way
    with pytest.raises(tp.TempoError, match="no observation statistics"):
        train(config(*common, "total_timesteps=128", "env.normalize_obs=true", "resume_override=true",
                     f"resume_from={plain}"), tmp_path / "b", progress=False)
    with pytest.raises(tp.TempoError, match="normalize_obs=true"):
        train(config(*common, "total_timesteps=128", "resume_override=true", f"resume_from={normalized}"),
              tmp_path / "c", progress=False)
