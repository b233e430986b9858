"""Constant folding: pure ops of constants become constants computed at compile time, small
ones only; ops that vary with the point, draw random numbers or are outputs stay."""

from __future__ import annotations

import numpy as np

import tempo as tp
from tempo.api.tensor import arange
from tempo.passes.fold import MAX_ELEMENTS

RNG = np.random.default_rng(5)
XS = RNG.normal(size=(6, 4)).astype(np.float32)


def test_constant_expressions_fold_whole(run_pass, backend, check):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[t]
        scale = ((tp.const(2.0) * 3.0 + 1.0).exp() / tp.const(np.arange(4, dtype=np.float32) + 1.0))
        weights = tp.const(0.5) ** arange(ctx, T).astype("float32")    # symbolic size: T
        out = (x * scale).sum() + (x[0:T].sum(1) * weights).sum()
    run = run_pass(ctx, {T: 6}, [out], "fold")
    for kind in ("exp", "div", "pow", "arange", "astype", "add"):
        assert run.count(kind, "before") >= 1 and run.count(kind) == (kind == "add"), kind
    assert run.count("mul") == 2  # x * scale and the product with the weights; 2.0 * 3.0 folded
    folded = [op for op in run.after.ops.values() if op.id not in run.before.ops]
    assert sorted(op.params["value"].shape for op in folded) == [(4,), (6,)]
    np.testing.assert_allclose(next(op.params["value"] for op in folded if op.params["value"].shape == (6,)),
                               0.5 ** np.arange(6))
    assert run.state.notes[0].startswith("fold: 7 ops folded into 2 constants")
    check(ctx, {T: 6}, [out], ("fold",), backend)


def test_large_results_ops_over_points_and_draws_over_points_are_not_folded(run_pass, check):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    n = int(np.sqrt(MAX_ELEMENTS)) + 1
    with ctx:
        outer = tp.const(np.ones((n, 1), np.float32)) * tp.const(np.ones(n, np.float32))
        step = tp.symbol_value(t).astype("float32") * 2.0     # varies with t
        noise = tp.uniform((4,), domain=(t,)) * 2.0            # a draw at each point
        out = outer.sum() + step + noise.sum()
    run = run_pass(ctx, {T: 4}, [out], "fold")
    assert len(run.after) == len(run.before)
    assert run.state.notes == ["fold: 0 ops folded"]
    check(ctx, {T: 4}, [out], ("fold",))


def test_a_draw_without_a_domain_is_a_constant_and_folds(run_pass, check):
    """A draw is a function of (seed, key, point); with no dims it is one fixed value."""
    ctx = tp.Context(dims=("t",), seed=9)
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        noise = tp.normal((4,), domain=()) * 2.0
        out = tp.symbol_value(t).astype("float32") + noise.sum()
    run = run_pass(ctx, {T: 3}, [out], "fold")
    assert run.count("rng") == 0 and run.count("rng", "before") == 1
    check(ctx, {T: 3}, [out], ("fold",))


def test_outputs_stay_and_their_inputs_fold(run_pass, check):
    ctx = tp.Context(dims=("t",))
    (T,) = ctx.bounds
    with ctx:
        half = tp.const(1.0) / 2.0
        out = half * 3.0           # an output: its store is read at the end
    run = run_pass(ctx, {T: 2}, [out], "fold")
    assert out.op.id in run.after.ops and run.count("div") == 0 and run.count("mul") == 1
    assert check(ctx, {T: 2}, [out], ("fold",)).run()[out] == 1.5
