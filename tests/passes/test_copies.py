"""Copy propagation: readers of identity ops read the source directly when that is exact,
with the same values as the unoptimized program and the reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.reference import evaluate

RNG = np.random.default_rng(3)
XS = RNG.normal(size=(4, 5, 3)).astype(np.float32)


def _copies(exe) -> int:
    return sum(op.kind == "identity" for op in exe.graph.ops.values())


def _check(ctx, bounds, outputs, backend="numpy"):
    """Compile with copies propagated and without any pass; both equal the reference.
    Returns the number of identity ops left in each."""
    exe = ctx.compile(bounds, outputs, backend=backend, passes=["copies"])
    plain = ctx.compile(bounds, outputs, backend=backend, passes=())
    ref = evaluate(ctx, bounds, outputs)
    for run in (exe.run(), plain.run()):
        for rt in outputs:
            np.testing.assert_allclose(run[rt], ref[rt.key], rtol=1e-5, atol=1e-6)
    return _copies(exe), _copies(plain)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_value_read_at_the_iteration_start_is_read_through(backend):
    """``w[i, 0]`` over ``(i,)`` read at every ``(i, t)``: the copy goes, reads compose."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(XS)[i, t]
        first = w[i, 0]
        out = (first * 2.0 + w) * 0.5
    left, before = _check(ctx, {I: 4, T: 5}, [out], backend)
    assert before >= 1 and left == 0


def test_a_window_of_a_copy_becomes_a_window_of_its_source():
    """``y[i] = w[i, T - 1]`` read as ``y[0:i+1]``: the same blocks as ``w[0:i+1, T - 1]``;
    the window (a copy too) is then read through by the sum."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(XS)[i, t] * 1.5
        last = w[i, T - 1]
        out = last[0:i + 1].sum(0)
    left, before = _check(ctx, {I: 4, T: 5}, [out])
    assert before >= 2 and left == 0


def test_a_window_over_a_reversed_index_keeps_the_copy():
    """``r[t] = x[T - 1 - t]`` read as ``r[0:t+1]``: no single window of ``x`` is that."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS[0])[t] + 1.0
        reversed_ = x[T - 1 - t]
        out = reversed_[0:t + 1].sum(0) + reversed_
    left, before = _check(ctx, {T: 5}, [out])
    assert left == before >= 2


def test_a_copy_that_is_an_output_stays():
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(XS)[i, t] - 1.0
        first = w[i, 0]
        out = first + w
    left, _ = _check(ctx, {I: 4, T: 5}, [first, out])
    assert left == 1


def test_a_guarded_read_of_a_copy_composes_its_condition():
    """A placeholder branch reading a copy under ``t > 0``: the branch condition survives."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(XS)[i, t]
        first = w[i, 0]
        acc = tp.placeholder((3,), domain=(i, t))
        acc[t == 0] = first
        acc[True] = acc[i, t - 1] * 0.5 + first
    left, _ = _check(ctx, {I: 4, T: 5}, [acc])
    assert left == 0
