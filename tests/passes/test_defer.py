"""Deferred statistics: a loss that scales per-step terms by statistics of every step
(standardized advantages) gets its per-step backward work split into parts that need no
statistics, with the gradient of the reference evaluator and of the unsplit program, and
stored points that no longer grow with the number of steps."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.options import MemoryPolicy
from tempo.passes import PIPELINE
from tempo.reference import evaluate

RNG = np.random.default_rng(11)
W0 = (RNG.normal(size=(4, 64)) * 0.3).astype(np.float32)
HIDDEN_BYTES = 64 * 4


def _program(steps: int, loss_of):
    """Over ``(i, t)``: a per-step ``(64,)`` hidden value ``h = tanh(x[t] @ w)``, a per-step
    term ``y = h.mean()`` and a per-step score ``a`` that needs no gradient; the loss is
    ``loss_of(y, a, window)``, differentiated for ``w``."""
    xs = RNG.normal(size=(steps, 4)).astype(np.float32)
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        w = tp.const(W0, requires_grad=True)
        x = tp.const(xs)[t] * (1.0 + 0.1 * tp.symbol_value(i).astype("float32"))
        h = (x @ w).tanh()
        y = h.mean()
        a = (x * x).sum() + 0.5 * x.sum()
        loss = loss_of(y, a, (i, slice(0, T)))
        loss.backward()
    return ctx, {I: 2, T: steps}, w.grad


def _standardized(y, a, window):
    """A policy gradient's loss on standardized scores, with a per-step term (an entropy
    bonus's) that joins the same chain without the statistics."""
    scores = a[window]
    centered = scores - scores.mean()
    advantage = centered / ((centered * centered).mean().sqrt() + 1e-8)
    return -(y[window] * advantage).mean() + 0.1 * (y * y)[window].mean()


def _incremental(ctx, bounds, grad, backend="numpy"):
    return ctx.compile(bounds, [grad], backend=backend, memory=MemoryPolicy(schedule="incremental"))


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_gradient_through_standardized_scores_is_split_and_unchanged(backend):
    ctx, bounds, grad = _program(6, _standardized)
    exe = _incremental(ctx, bounds, grad, backend)
    assert "defer: 1 cotangents of whole-window statistics split into parts" in exe.report.notes
    want = evaluate(ctx, bounds, [grad])[grad.key]
    unsplit = ctx.compile(bounds, [grad], backend=backend, passes=())
    assert np.abs(want).max() > 1e-3
    np.testing.assert_allclose(np.asarray(exe.run()[grad]), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(unsplit.run()[grad]), want, rtol=1e-4, atol=1e-6)


def test_split_per_step_work_does_not_wait_for_the_statistics():
    """Unsplit, every step's hidden value waits for the statistics of all steps; split, the
    steps' gradients are summed as they come, and what grows with the steps are the
    scalars the statistics read."""
    growth = {}
    for name, passes in (("split", None), ("unsplit", [p for p, _ in PIPELINE if p != "defer"])):
        peaks = []
        for steps in (8, 40):
            ctx, bounds, grad = _program(steps, _standardized)
            exe = ctx.compile(bounds, [grad], backend="numpy", passes=passes,
                              memory=MemoryPolicy(schedule="incremental"))
            exe.run()
            peaks.append(exe.stats.device.run_peak)
        growth[name] = (peaks[1] - peaks[0]) / 32
    assert growth["unsplit"] >= HIDDEN_BYTES, growth
    assert growth["split"] < 0.25 * HIDDEN_BYTES, growth


def test_the_vectorized_schedule_is_left_as_it_is():
    ctx, bounds, grad = _program(6, _standardized)
    exe = ctx.compile(bounds, [grad], backend="numpy")
    assert "defer: not applied (the schedule keeps each step for the learner)" in exe.report.notes


def test_a_cotangent_not_affine_in_the_scores_is_not_split():
    """Squared standardized scores are not an affine function of the scores: nothing to
    split, and the gradient is still right."""
    def squared(y, a, window):
        scores = a[window]
        z = (scores - scores.mean()) / (scores.max() - scores.min())
        return -(y[window] * z * z).mean()
    ctx, bounds, grad = _program(6, squared)
    exe = _incremental(ctx, bounds, grad)
    assert "defer: 0 cotangents of whole-window statistics split into parts" in exe.report.notes
    np.testing.assert_allclose(exe.run()[grad], evaluate(ctx, bounds, [grad])[grad.key], rtol=1e-4, atol=1e-6)
