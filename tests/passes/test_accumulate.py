"""Accumulation: a gradient summed over the steps of a loop that stays a loop becomes a
running sum, with the results of the unoptimized program and the reference evaluator,
and a number of live points that does not grow with the number of steps."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.passes import PIPELINE

RNG = np.random.default_rng(5)
W0 = (RNG.normal(size=(3, 3)) * 0.5).astype(np.float32)


def _gradient_program(steps: int, per_step):
    """A program over ``(i, t)`` whose loss sums ``per_step(x[t], w, t)`` (a ``(3,)`` value
    per step) over the steps, differentiated for the shared weight ``w``."""
    xs = RNG.normal(size=(steps, 3)).astype(np.float32)
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        w = tp.const(W0, requires_grad=True)
        y = per_step(tp.const(xs)[t], w, t)
        loss = (y * y).sum()[0:T].sum()
        loss.backward()
    return ctx, {I: 1, T: steps}, w.grad


def _recurrent_program(steps: int):
    """``h[t] = tanh(h[t-1] @ w + x[t])``: the per-step products are on a recurrence, so
    ``t`` is not vectorized, and ``w``'s gradient sums one contribution per step."""
    def recurrence(x, w, t):
        h = tp.placeholder(shape=(3,), dtype="float32", domain=(t,))
        h[t == 0] = x.tanh()
        h[True] = (h[t - 1] @ w + x).tanh()
        return h
    return _gradient_program(steps, recurrence)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_stepwise_gradient_sum_runs_as_a_running_sum(backend, check):
    ctx, bounds, grad = _recurrent_program(9)
    exe = check(ctx, bounds, [grad], None, backend)
    assert any(note.startswith("accumulate: 1 gradient sums") for note in exe.report.notes)
    t = ctx.dims[1]
    assert not any(op.kind == "sum_readers" and t not in op.domain for op in exe.graph.ops.values())


def _per_step_program(steps: int):
    """``loss = sum_t |x[t] @ w|^2``: each step's gradient contribution needs that step only."""
    return _gradient_program(steps, lambda x, w, t: x @ w)


STEPWISE = [name for name, _ in PIPELINE if name != "vectorize"]
"""The pipeline with the steps left a loop (the schedule of an incremental learner)."""


def test_the_running_sum_keeps_live_points_bounded(check):
    peaks = {}
    for steps in (8, 32):
        ctx, bounds, grad = _per_step_program(steps)
        exe = check(ctx, bounds, [grad], STEPWISE)
        peaks[steps] = exe.stats.peak
        unaccumulated = ctx.compile(bounds, [grad], backend="numpy",
                                    passes=[name for name in STEPWISE if name != "accumulate"])
        unaccumulated.run()
        peaks[-steps] = unaccumulated.stats.peak
    assert peaks[32] == peaks[8]
    assert peaks[-32] >= peaks[-8] + 24  # without the pass, one contribution per step waits


def test_the_running_sums_points_are_those_the_point_analysis_finds(run_pass):
    """The pass adds the new ops' needed points itself (from the sums they serve); they
    must be exactly what the analysis of the new graph finds."""
    for program in (_recurrent_program, _per_step_program):
        ctx, bounds, grad = program(6)
        result = run_pass(ctx, bounds, [grad], "accumulate")
        assert result.count("sum_readers", "before") > result.count("sum_readers")
        assert result.count("merge") == result.count("merge", "before") + 1
