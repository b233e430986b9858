"""Lifting: running sums and prefix sums over ``t`` become one ``cumsum``, with the results
of the unoptimized program and the reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.passes import PIPELINE

T_VALUE = 7
RNG = np.random.default_rng(3)
XS = RNG.normal(size=(2, T_VALUE, 3)).astype(np.float32)
UNLIFTED = [name for name, _ in PIPELINE if name != "lift"]


def _running_sum(x, t, first=None, scale=None):
    s = tp.placeholder(shape=(3,), dtype="float32", domain=x.domain)
    s[t == 0] = x if first is None else first
    s[True] = (s[(*x.domain[:-1], t - 1)] if scale is None else s[(*x.domain[:-1], t - 1)] * scale) + x
    return s


def _program(dims, build):
    ctx = tp.Context(dims=dims)
    t, T = ctx.dims[-1], ctx.bounds[-1]
    with ctx:
        x = (tp.const(XS[0])[t] if len(dims) == 1 else tp.const(XS)[ctx.dims[0], t]) * 2.0
        y = build(x, t, T)
        out = y[(*ctx.dims[:-1], slice(0, T))]
    bounds = {T: T_VALUE, **{b: 2 for b in ctx.bounds[:-1]}}
    return ctx, bounds, y, out


def _optimized(ctx, bounds, out):
    """The program after every pass but fusion (which would hide ops inside fused ones)."""
    passes = [name for name, _ in PIPELINE if name != "fusion"]
    return ctx.compile(bounds, [out], backend="numpy", passes=passes).graph


@pytest.mark.parametrize("dims", [("t",), ("i", "t")])
@pytest.mark.parametrize("pattern", ["running sum", "prefix sum"])
def test_a_sum_over_time_becomes_one_cumsum(pattern, dims, check):
    def build(x, t, T):
        return _running_sum(x, t) if pattern == "running sum" else x[(*x.domain[:-1], slice(0, t + 1))].sum(0)
    ctx, bounds, y, out = _program(dims, build)
    graph = _optimized(ctx, bounds, out)
    assert [op.kind for op in graph.ops.values()].count("cumsum") == 1
    assert not any(op.kind in ("merge", "reduce_sum") for op in graph.ops.values())
    for backend in ("numpy", "jax"):
        check(ctx, bounds, [out], None, backend)


def test_lifted_rows_are_read_whole_by_vectorized_readers():
    """After lifting, vectorization reads the cumsum itself: nothing runs per step but the
    input's gather."""
    ctx, bounds, y, out = _program(("i", "t"), lambda x, t, T: (_running_sum(x, t) * x).tanh())
    exe = ctx.compile(bounds, [out], backend="numpy")
    per_step = [op.kind for op in exe.graph.ops.values() if ctx.dims[1] in op.domain]
    assert "merge" not in per_step and "add" not in per_step
    assert any(n.startswith("lift: 1 ") for n in exe.report.notes)


@pytest.mark.parametrize("variant", ["scaled", "other first value", "needed at one step"])
def test_other_recurrences_are_left_alone(variant, check):
    def build(x, t, T):
        if variant == "scaled":
            return _running_sum(x, t, scale=0.9)
        if variant == "other first value":
            return _running_sum(x, t, first=x * 3.0)
        return x[i, 0:t + 1].sum(0)
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        y = build(tp.const(XS)[i, t] * 2.0, t, T)
        out = y[i, 2] if variant == "needed at one step" else y[i, 0:T]
    bounds = {I: 2, T: T_VALUE}
    assert not any(op.kind == "cumsum" for op in _optimized(ctx, bounds, out).ops.values())
    check(ctx, bounds, [out], None)


def test_a_resumed_run_lifts_the_same_values():
    """Rows of the cumsum are the run's own steps, whatever origin host ops see."""
    ctx, bounds, y, out = _program(("i", "t"), lambda x, t, T: _running_sum(
        x + tp.symbol_value(t).astype("float32"), t))
    t = ctx.dims[1]
    runs = [ctx.compile(bounds, [out], backend="numpy", passes=p).run(origin={t: 1})
            for p in (None, UNLIFTED)]
    np.testing.assert_allclose(np.asarray(runs[0][out]), np.asarray(runs[1][out]), rtol=1e-6)


def _linear(x, t, T, forward: bool, first=None):
    """``a[t] = d[t] + c[t] * a[t+1]`` from ``a[T-1] = d[T-1]`` (GAE's form; ``forward``:
    ``a[t-1]`` from ``a[0]``), with ``c`` and ``d`` computed at each step."""
    c, d = (x * 0.5).sigmoid(), x * 2.0 - 1.0
    a = tp.placeholder(shape=(3,), dtype="float32", domain=x.domain)
    a[t == 0 if forward else t == T - 1] = d if first is None else first
    a[True] = d + c * a[(*x.domain[:-1], t - 1 if forward else t + 1)]
    return a


@pytest.mark.parametrize("dims", [("t",), ("i", "t")])
@pytest.mark.parametrize("forward", [False, True])
def test_a_linear_recurrence_becomes_one_op(forward, dims, check):
    """GAE's recurrence (and its forward form) becomes one ``linear_recurrence`` over the
    steps: no merge, no step loop, the reference evaluator's values on both backends."""
    ctx, bounds, y, out = _program(dims, lambda x, t, T: _linear(x, t, T, forward))
    graph = _optimized(ctx, bounds, out)
    assert [op.kind for op in graph.ops.values()].count("linear_recurrence") == 1
    assert not any(op.kind == "merge" for op in graph.ops.values())
    for backend in ("numpy", "jax"):
        check(ctx, bounds, [out], None, backend)


@pytest.mark.parametrize("variant", ["constant coefficient", "other last value", "needed at one step"])
def test_other_linear_recurrences_are_left_alone(variant, check):
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[i, t] * 2.0
        if variant == "constant coefficient":
            y = tp.placeholder(shape=(3,), dtype="float32", domain=(i, t))
            y[t == T - 1] = x
            y[True] = x + 0.9 * y[i, t + 1]
        else:
            y = _linear(x, t, T, False, first=x * 3.0 if variant == "other last value" else None)
        out = y[i, 2] if variant == "needed at one step" else y[i, 0:T]
    bounds = {I: 2, T: T_VALUE}
    assert not any(op.kind == "linear_recurrence" for op in _optimized(ctx, bounds, out).ops.values())
    check(ctx, bounds, [out], None)


def test_a_coefficient_read_ahead_is_read_where_the_recursion_runs(check):
    """``c`` at ``t`` may read ``x[t+1]`` (an episode end one step on): the recursive
    branch runs below ``T-1`` only, so the lifted op reads ``c[0:T-1]``, the steps the
    program computes, and no step past the end."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[i, t] * 2.0
        c = (x[i, t + 1] * 0.5).sigmoid()
        a = tp.placeholder(shape=(3,), dtype="float32", domain=(i, t))
        a[t == T - 1] = x
        a[True] = x + c * a[i, t + 1]
        out = a[i, 0:T]
    bounds = {I: 2, T: T_VALUE}
    names = [name for name, _ in PIPELINE]
    graph = ctx.compile(bounds, [out], backend="numpy", passes=names[:names.index("lift") + 1]).graph
    (lifted,) = [op for op in graph.ops.values() if op.kind == "linear_recurrence"]
    coefficients, terms = graph.in_edges(lifted)
    assert (coefficients.phi[-1].start.value, coefficients.phi[-1].stop.value) == (0, T_VALUE - 1)
    assert (terms.phi[-1].start.value, terms.phi[-1].stop.value) == (0, T_VALUE)
    for backend in ("numpy", "jax"):
        check(ctx, bounds, [out], None, backend)


@pytest.mark.parametrize("variant", ["a product of the terms", "a coefficient of the value"])
def test_recurrences_that_are_not_linear_stay(variant, check):
    """``a = d * (c * a[t+1])`` and ``a = d + tanh(a[t+1]) * a[t+1]`` have the pattern's
    ops but are not linear recurrences: they stay, with their values."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[i, t] * 0.5
        a = tp.placeholder(shape=(3,), dtype="float32", domain=(i, t))
        a[t == T - 1] = x
        if variant == "a product of the terms":
            a[True] = x * ((x * 0.5).sigmoid() * a[i, t + 1])
        else:
            a[True] = x + a[i, t + 1].tanh() * a[i, t + 1]
        out = a[i, 0:T]
    bounds = {I: 2, T: T_VALUE}
    exe = ctx.compile(bounds, [out], backend="numpy")
    assert not any("undone" in n for n in exe.report.notes)
    assert not any(op.kind == "linear_recurrence" for op in _optimized(ctx, bounds, out).ops.values())
    check(ctx, bounds, [out], None)


def test_a_forward_recurrence_stays_where_the_schedule_keeps_memory_bounded():
    """Step by step a forward recurrence holds one step; lifted, all of them: the
    incremental schedule (``PassState.bounded``) keeps it, GAE's backward form (which
    needs the whole rollout anyway) is lifted there too."""
    for forward in (True, False):
        ctx, bounds, y, out = _program(("i", "t"), lambda x, t, T, f=forward: _linear(x, t, T, f))
        exe = ctx.compile(bounds, [out], backend="numpy", memory=tp.MemoryPolicy(schedule="incremental"))
        kinds = {m.kind for op in exe.graph.ops.values()
                 for m in (op.params["members"] if op.kind == "fused" else [op])}
        assert ("linear_recurrence" in kinds) is not forward
