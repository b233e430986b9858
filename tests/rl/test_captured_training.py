"""Training with captured iterations (``capture``, ``tempo.runtime.capture``): on gymnax
(the env in the graph) each steady iteration runs as one program. PPO's program computes
what the interpreted iterations compute bit for bit; n-step's, whose varying-length sums
XLA adds up otherwise than NumPy, up to rounding, so the default leaves it interpreted; a
run resumed from a checkpoint continues the uninterrupted one exactly."""

from __future__ import annotations

import numpy as np
import pytest

from tempo.runtime import capture
from tempo.runtime import executable as executable_module
from tempo_rl.config import load_config as config
from tempo_rl.metrics import is_measurement
from tempo_rl.train import train

SMALL = ("env=gymnax_cartpole", "env.num_envs=4", "algorithm.num_steps=16", "backend=jax",
         "checkpoint_every=0")

pytestmark = pytest.mark.usefixtures("captures_checked_alone")


@pytest.fixture
def reports(monkeypatch) -> list:
    """The iteration reports of the runs in the test, in order."""
    seen: list = []
    run = executable_module.Executable.run

    def reported(self, *args, **kwargs):
        try:
            return run(self, *args, **kwargs)
        finally:
            seen.append(self.iteration_report)
    monkeypatch.setattr(executable_module.Executable, "run", reported)
    return seen


def _train(tmp_path, name: str, *overrides: str):
    return train(config(*SMALL, *overrides), tmp_path / name, progress=False)


def _metrics(result) -> list[dict]:
    return [{k: v for k, v in row.items() if not is_measurement(k)} for row in result.history]


def test_ppo_captured_equals_interpreted_bit_for_bit(tmp_path, reports):
    captured = _train(tmp_path, "captured", "algorithm=ppo", "total_timesteps=1024", "capture=true")
    interpreted = _train(tmp_path, "interpreted", "algorithm=ppo", "total_timesteps=1024", "capture=false")
    assert reports[0].startswith("iterations: 12 as one program each"), reports[0]  # (16 iterations)
    assert _metrics(captured) == _metrics(interpreted)
    assert captured.episode_returns == interpreted.episode_returns


def test_nstep_captured_equals_interpreted_up_to_rounding(tmp_path, reports, monkeypatch):
    captured = _train(tmp_path, "captured", "algorithm=nstep", "total_timesteps=640", "capture=true")
    interpreted = _train(tmp_path, "interpreted", "algorithm=nstep", "total_timesteps=640", "capture=false")
    assert "as one program each" in reports[0] and not reports[0].startswith("iterations: 0 "), reports[0]
    for ours, theirs in zip(_metrics(captured), _metrics(interpreted)):
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            np.testing.assert_allclose(ours[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    # The default runs a program only where it matched the interpreted iteration bit for
    # bit: n-step's does not, and the run is the interpreted one.
    monkeypatch.setattr(capture, "CPU_FRESH_ITERATIONS", 0)  # (a short loop)
    default = _train(tmp_path, "default", "algorithm=nstep", "total_timesteps=640")
    assert "last bits" in reports[-1], reports[-1]
    assert _metrics(default) == _metrics(interpreted)


def test_a_resumed_captured_run_continues_the_uninterrupted_one(tmp_path, reports):
    common = ("algorithm=ppo", "total_timesteps=640", "checkpoint_every=4", "keep_checkpoints=true",
              "capture=true")  # 10 iterations, a checkpoint after the fourth
    full = _train(tmp_path, "full", *common)
    saved = tmp_path / "full" / "checkpoints" / "iteration_3.npz"
    resumed = _train(tmp_path, "resumed", *common, f"resume_from={saved}")
    assert not any(report.startswith("iterations: 0 ") for report in reports), reports
    assert _metrics(resumed) == _metrics(full)[4:]
    assert resumed.episode_returns == full.episode_returns[-len(resumed.episode_returns):]
