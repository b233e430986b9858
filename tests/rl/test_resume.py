"""A run resumed from a checkpoint continues the uninterrupted run exactly: the same losses
at every later iteration, the same episodes, the same final parameters."""

from __future__ import annotations

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tempo.api import checkpoint
from tempo_rl.checkpoints import CONFIG_KEY, ENV_PREFIX
from tempo_rl.config import load_config as config
from tempo_rl.envs.base import Snapshots
from tempo_rl.metrics import is_measurement
from tempo_rl.train import train


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
    assert resumed.mean_return() == full.mean_return()  # the episodes of the whole run
    # the resumed run's TensorBoard stream has each iteration once: the first run's events
    # up to the checkpoint, then its own
    events = EventAccumulator(str(tmp_path / "resumed" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("charts/SPS")] == [(k + 1) * 32 for k in range(8)]
    last_full, last_resumed = checkpoint.load(full.checkpoint), checkpoint.load(resumed.checkpoint)
    assert set(last_full) == set(last_resumed)
    assert any(name.startswith(ENV_PREFIX) for name in last_full)
    for name, value in last_full.items():
        if name != CONFIG_KEY:  # the config differs by resume_from
            # the env's state too: observations, episodes in progress, each gymnasium env's
            # physics and generator (as JSON), each JAX env's state leaves
            np.testing.assert_array_equal(last_resumed[name], value, err_msg=name)


def test_envs_keep_their_state_only_where_a_checkpoint_follows(tmp_path, monkeypatch):
    """An env's state for a checkpoint costs host time to build at every iteration (a
    gymnasium env's is each env's layers as JSON): a run keeps it only after the
    iterations its checkpoint schedule writes one, and after its first (where a state
    that cannot be stored fails early), in the whole run's numbering when resumed."""
    kept = []
    keep = Snapshots.keep
    monkeypatch.setattr(Snapshots, "keep", lambda self, it, state: kept.append(it) or keep(self, it, state))
    common = ("algorithm=ppo", "env=cartpole", "algorithm.num_steps=16", "env.num_envs=2",
              "total_timesteps=256", "backend=numpy")  # 8 iterations
    train(config(*common, "checkpoint_every=3", "keep_checkpoints=true"), tmp_path / "every", progress=False)
    assert kept == [0, 2, 5, 7]
    kept.clear()
    saved = tmp_path / "every" / "checkpoints" / "iteration_2.npz"
    train(config(*common, "checkpoint_every=3", "keep_checkpoints=true", f"resume_from={saved}"),
          tmp_path / "resumed", progress=False)
    assert kept == [3, 5, 7]
    kept.clear()
    train(config(*common), tmp_path / "last", progress=False)
    assert kept == [0, 7]


def test_resuming_past_the_end_is_an_error(tmp_path):
    common = ("algorithm=nstep", "algorithm.num_steps=16", "env.num_envs=2", "total_timesteps=64")
    full = train(config(*common), tmp_path / "full", progress=False)
    with pytest.raises(ValueError, match="none left to run"):
        train(config(*common, f"resume_from={full.checkpoint}"), tmp_path / "again", progress=False)


def test_late_sinks_log_and_save_what_prompt_ones_do(tmp_path):
    """The metrics, episodes and every checkpoint of a JAX run are the same whether its
    sinks run one iteration late (the default on an accelerator) or where the iteration
    reaches them (the default on a CPU)."""
    common = ("env=gymnax_cartpole", "algorithm.num_steps=16", "env.num_envs=2", "total_timesteps=256",
              "checkpoint_every=3", "keep_checkpoints=true", "backend=jax")  # 8 iterations
    late = train(config(*common, "late_sinks=true"), tmp_path / "late", progress=False)
    prompt = train(config(*common, "late_sinks=false"), tmp_path / "prompt", progress=False)
    assert len(late.history) == len(prompt.history) == 8
    for a, b in zip(late.history, prompt.history):
        assert {k: v for k, v in a.items() if not is_measurement(k)} == \
            {k: v for k, v in b.items() if not is_measurement(k)}
    assert late.episode_returns and late.episode_returns == prompt.episode_returns
    saved = sorted(p.name for p in (tmp_path / "late" / "checkpoints").iterdir())
    assert saved == sorted(p.name for p in (tmp_path / "prompt" / "checkpoints").iterdir())
    assert saved == ["iteration_2.npz", "iteration_5.npz", "iteration_7.npz", "last.npz"]
    for name in saved:
        a = checkpoint.load(tmp_path / "late" / "checkpoints" / name)
        b = checkpoint.load(tmp_path / "prompt" / "checkpoints" / name)
        assert set(a) == set(b)
        for key in set(a) - {CONFIG_KEY}:  # (the configs differ by late_sinks)
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name}: {key}")
