"""The memory policy's schedules on n-step A2C: the incremental schedule (no vectorization
of the steps, gradients accumulated per step) trains as the vectorized one does and is
predicted to need less memory, and a memory budget picks the fastest schedule that fits
or says that none does."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.errors import MemoryBudgetError
from tempo.schedule.memory import MemoryPolicy
from tempo_rl.algorithms import algorithm
from tempo_rl.config import load_config as config
from tempo_rl.metrics import is_measurement
from tempo_rl.train import algorithm_config, make_env, train

PER_STEP = ("algorithm=nstep", "algorithm.normalize_advantages=false", "algorithm.n=4", "env=synthetic",
            "env.num_envs=2")
"""n-step whose loss is a sum of per-step terms (no statistics over the whole rollout)."""


def test_the_incremental_schedule_trains_as_the_vectorized_one(tmp_path):
    common = (*PER_STEP, "algorithm.num_steps=16", "total_timesteps=96", "backend=numpy")
    runs = [train(config(*common, f"memory.schedule={schedule}"), tmp_path / schedule, progress=False)
            for schedule in ("vectorized", "incremental")]
    vectorized, incremental = runs
    assert any(n.startswith("accumulate: ") and not n.startswith("accumulate: 0 ")
               for n in incremental.compile_notes), incremental.compile_notes
    assert any(n.startswith("vectorize: ") and not n.startswith("vectorize: 0 ")
               for n in vectorized.compile_notes)
    assert len(vectorized.history) == len(incremental.history) == 3
    for a, b in zip(vectorized.history, incremental.history):
        for name in a:
            if not is_measurement(name):
                np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-6, err_msg=name)
    final = [np.load(run.checkpoint) for run in runs]
    params = [k for k in final[0].files if k.startswith("param")]
    assert params
    for name in params:
        np.testing.assert_allclose(final[0][name], final[1][name], rtol=1e-4, atol=1e-6, err_msg=name)


def _compiled(steps: int, policy: MemoryPolicy) -> tp.Executable:
    """n-step (per-step loss) on 1 KiB observations, compiled for two iterations."""
    cfg = config(*PER_STEP, "env.obs_shape=[256]", f"algorithm.num_steps={steps}")
    env = make_env(cfg["env"], 0)
    cls, build = algorithm("nstep")
    program = build(env, algorithm_config(cls, cfg["algorithm"], cfg["network"]), seed=0)
    return program.ctx.compile(program.bounds(2, steps), backend="numpy", memory=policy,
                               outputs=[program.metrics["losses/policy_loss"]])


def _peak(exe: tp.Executable) -> int:
    footprint = exe.predicted_footprint()
    return footprint.device.peak + footprint.host.peak


@pytest.fixture(scope="module")
def peaks() -> dict[tuple[str, int], int]:
    return {(schedule, steps): _peak(_compiled(steps, MemoryPolicy(schedule=schedule)))
            for schedule in ("vectorized", "incremental") for steps in (100, 1000)}


def test_the_predicted_peaks_of_both_schedules(peaks):
    """The vectorized schedule keeps every step's observation for the learner; the
    incremental one stacks nothing and accumulates the weight gradients, so it needs less.
    (It still grows with the rollout: isl orders the learning after the acting loop, so
    each step's observation waits for it; see docs/training.md.)"""
    assert peaks["vectorized", 1000] > 3 * peaks["vectorized", 100]
    assert peaks["incremental", 1000] < peaks["vectorized", 1000] * 0.75


def test_a_budget_picks_the_fastest_schedule_that_fits(peaks):
    roomy = _compiled(1000, MemoryPolicy(budget_mb=1024))
    assert any("the vectorized schedule" in n for n in roomy.report.notes), roomy.report.notes
    tight_mb = (peaks["incremental", 1000] + peaks["vectorized", 1000]) / 2 / 2**20
    tight = _compiled(1000, MemoryPolicy(budget_mb=tight_mb))
    assert any("the incremental schedule" in n for n in tight.report.notes), tight.report.notes


def test_a_budget_no_schedule_meets_is_an_error_naming_the_smallest_peak(peaks):
    with pytest.raises(MemoryBudgetError, match=r"memory.budget_mb=0.01: .* the smallest is incremental"):
        _compiled(1000, MemoryPolicy(budget_mb=0.01))


def test_bad_memory_options_are_rejected():
    with pytest.raises(ValueError, match="schedule must be one of vectorized, incremental"):
        MemoryPolicy(schedule="lazy")
    with pytest.raises(ValueError, match="budget_mb must be a positive"):
        MemoryPolicy(budget_mb=0)
