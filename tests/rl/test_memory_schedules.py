"""The memory policy's schedules on n-step A2C: the incremental schedule (no vectorization
of the steps, learning trailing acting by n steps, gradients accumulated per step) computes
what the reference evaluator computes, as the vectorized one does, and is predicted to need
memory that does not grow with the rollout; a memory budget picks the fastest schedule
that fits or says that none does."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.errors import MemoryBudgetError
from tempo.options import SCHEDULES, MemoryPolicy
from tempo.reference import evaluate
from tempo_rl.algorithms import algorithm
from tempo_rl.algorithms.common import TrainProgram
from tempo_rl.config import load_config as config
from tempo_rl.metrics import is_measurement
from tempo_rl.train import algorithm_config, make_env, train

PER_STEP = ("algorithm=nstep", "algorithm.normalize_advantages=false", "algorithm.n=4", "env=synthetic",
            "env.num_envs=2")
"""n-step whose loss is a sum of per-step terms (no statistics over the whole rollout)."""


@pytest.mark.parametrize("normalized", [False, True], ids=["per-step", "normalized"])
def test_the_incremental_schedule_trains_as_the_vectorized_one(tmp_path, normalized):
    """Three iterations through ``train``: the same metrics and parameters from both
    schedules (with standardized advantages, the incremental one splits the policy's
    gradient: ``tempo.passes.defer``)."""
    common = (*PER_STEP, "algorithm.num_steps=16", "total_timesteps=96", "backend=numpy",
              f"algorithm.normalize_advantages={str(normalized).lower()}")
    runs = [train(config(*common, f"memory.schedule={schedule}"), tmp_path / schedule, progress=False)
            for schedule in ("vectorized", "incremental")]
    vectorized, incremental = runs
    assert any(n.startswith("accumulate: ") and not n.startswith("accumulate: 0 ")
               for n in incremental.compile_notes), incremental.compile_notes
    assert any(n.startswith("defer: 1 ") for n in incremental.compile_notes) == normalized
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


def _program(steps: int, obs_size: int, normalized: bool = False) -> TrainProgram:
    """n-step (per-step loss, or advantages standardized over the rollout) on observations
    of ``obs_size`` floats."""
    cfg = config(*PER_STEP, f"env.obs_shape=[{obs_size}]", f"algorithm.num_steps={steps}",
                 f"algorithm.normalize_advantages={str(normalized).lower()}")
    env = make_env(cfg["env"], 0)
    cls, build = algorithm("nstep")
    return build(env, algorithm_config(cls, cfg["algorithm"], cfg["network"]), seed=0)


def _compiled(steps: int, policy: MemoryPolicy, normalized: bool = False) -> tp.Executable:
    """n-step on 1 KiB observations, compiled for two iterations."""
    program = _program(steps, 256, normalized)
    return program.ctx.compile(program.bounds(2, steps), backend="numpy", memory=policy,
                               outputs=[program.metrics["losses/policy_loss"]])


@pytest.mark.parametrize("normalized", [False, True], ids=["per-step", "normalized"])
@pytest.mark.parametrize("schedule", ["vectorized", "incremental"])
def test_each_schedule_updates_the_parameters_as_the_reference_evaluator(schedule, normalized):
    """Parameters and optimizer state after two iterations of 6 steps (windows cut by the
    rollout's end included), from the compiled schedule and from the reference evaluator;
    with standardized advantages, the incremental schedule splits the policy's per-step
    gradient (``tempo.passes.defer``)."""
    outputs = {}
    for who in ("reference", schedule):
        program = _program(6, 8, normalized)
        state = list(program.state.values())
        bounds = program.bounds(2, 6)
        if who == "reference":
            values = evaluate(program.ctx, bounds, state)
            outputs[who] = [values[rt.key] for rt in state]
        else:
            exe = program.ctx.compile(bounds, state, backend="numpy", memory=MemoryPolicy(schedule=schedule))
            values = exe.run()
            outputs[who] = [values[rt] for rt in state]
    assert len(outputs["reference"]) > 10
    for name, want, got in zip(program.state, outputs["reference"], outputs[schedule]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=name)


def _peak(exe: tp.Executable) -> int:
    footprint = exe.predicted_footprint()
    return footprint.device.peak + footprint.host.peak


@pytest.fixture(scope="module")
def peaks() -> dict[tuple[str, int], int]:
    return {(schedule, steps): _peak(_compiled(steps, MemoryPolicy(schedule=schedule)))
            for schedule in ("vectorized", "incremental") for steps in (100, 1000)}


def test_with_standardized_advantages_too(peaks):
    """Standardized advantages need every step before any policy gradient; split into
    parts that need no statistics (``tempo.passes.defer``), the incremental schedule still
    learns n steps behind acting, and its predicted peak is that of the per-step loss up to
    the few floats per step the statistics read."""
    normalized = {steps: _peak(_compiled(steps, MemoryPolicy(schedule="incremental"), normalized=True))
                  for steps in (100, 1000)}
    growth = (normalized[1000] - normalized[100]) / 900
    assert growth < 0.05 * 2 * 1024, growth
    assert normalized[1000] < 1.2 * peaks["incremental", 1000]


def test_the_incremental_schedules_predicted_peak_does_not_grow_with_the_rollout(peaks):
    """The vectorized schedule keeps every step's observations (2 envs x 1 KiB) for the
    learner. The incremental one learns n steps behind acting and accumulates the weight
    gradients, so only n steps' observations wait. What still grows with T are a few floats
    per env and step that whole-rollout reductions read (rewards and truncations for the
    episode statistics, the per-step loss terms and entropies averaged into the metrics):
    under 5% of a step's observations."""
    step_observations = 2 * 1024
    per_step = {schedule: (peaks[schedule, 1000] - peaks[schedule, 100]) / 900 for schedule in SCHEDULES}
    assert per_step["vectorized"] > step_observations
    assert per_step["incremental"] < 0.05 * step_observations, per_step
    assert peaks["incremental", 1000] < 0.6 * peaks["vectorized", 1000]


def test_a_budget_picks_the_fastest_schedule_that_fits(peaks):
    roomy = _compiled(1000, MemoryPolicy(budget_mb=1024))
    assert any("the vectorized schedule" in n for n in roomy.report.notes), roomy.report.notes
    tight_mb = (peaks["incremental", 1000] + peaks["vectorized", 1000]) / 2 / 2**20
    tight = _compiled(1000, MemoryPolicy(budget_mb=tight_mb))
    assert any("the incremental schedule" in n for n in tight.report.notes), tight.report.notes


def test_the_smallest_schedule_is_the_incremental_one_for_a_per_step_loss(peaks):
    exe = _compiled(1000, MemoryPolicy(schedule="smallest"))
    assert any("the incremental schedule, memory.schedule=smallest" in n for n in exe.report.notes), \
        exe.report.notes
    assert _peak(exe) == peaks["incremental", 1000]


def test_a_budget_no_schedule_meets_is_an_error_naming_the_smallest_peak(peaks):
    with pytest.raises(MemoryBudgetError, match=r"memory.budget_mb=0.01: .* the smallest is incremental"):
        _compiled(1000, MemoryPolicy(budget_mb=0.01))


def test_bad_memory_options_are_rejected():
    with pytest.raises(ValueError, match="schedule must be one of vectorized, incremental, smallest"):
        MemoryPolicy(schedule="lazy")
    with pytest.raises(ValueError, match="budget_mb must be a positive"):
        MemoryPolicy(budget_mb=0)
