"""Domain reduction: ops computed once per distinct value, with the same results as the
unoptimized program and the reference evaluator."""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

import tempo as tp
from tempo.analysis.needed import needed_by_op
from tempo.api.tensor import RecurrentTensor

RNG = np.random.default_rng(5)
XS = RNG.normal(size=(3, 8, 6)).astype(np.float32)


def _points(run, kind: str) -> list[tuple[tuple, int]]:
    """(domain, number of needed points) of each op of ``kind`` after the pass."""
    by_op = needed_by_op(run.state.needed, run.after.ops)
    out = []
    for op in run.after.ops.values():
        if op.kind == kind:
            count = by_op[op.id].count_val().to_python() if op.domain else 1
            out.append((tuple(d.name for d in op.domain), count))
    return out


def _epoch_permutation(ctx, minibatches: int):
    (i, u), _ = ctx.dims, ctx.bounds
    keys = tp.uniform((6,), domain=(i, u))
    return keys[i, u - u % minibatches].argsort()


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_permutation_drawn_once_per_epoch_is_sorted_once_per_epoch(run_pass, backend, check):
    """PPO's minibatch order: ``keys[i, u - u % 4].argsort()`` over ``(i, u)`` reads one key
    vector per epoch; the argsort runs at those points only (2 x 2 of 2 x 8)."""
    ctx = tp.Context(dims=("i", "u"))
    (i, u), (I, U) = ctx.dims, ctx.bounds
    with ctx:
        order = _epoch_permutation(ctx, 4)
        out = order[i, u, u % 4].astype("float32") * 2.0
    bounds = {I: 2, U: 8}
    run = run_pass(ctx, bounds, [out], "domains")
    assert _points(run, "argsort") == [(("i", "u"), 4)]
    assert run_pass(ctx, bounds, [out], "copies").count("argsort") == 1
    check(ctx, bounds, [out], ["domains", "copies"], backend)


def test_an_op_whose_reads_skip_a_dim_runs_once_per_remaining_point(run_pass, check):
    """``tanh`` over ``(i, t)`` of ``w[i]``: loop-invariant in ``t``, it moves to ``(i,)``."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(XS[:, 0])[i] * 3.0
        invariant = RecurrentTensor(ctx, ctx.add_op("tanh", [w], {}, domain=(i, t)))
        out = invariant + tp.const(XS)[i, t]
    bounds = {I: 3, T: 8}
    run = run_pass(ctx, bounds, [out], "domains")
    assert _points(run, "tanh") == [(("i",), 3)]
    check(ctx, bounds, [out], ["domains", "copies"])


def test_a_chain_of_ops_on_a_coarse_read_moves_together(run_pass, check):
    """Ops reading a moved op at the point itself read the source coarsely too."""
    ctx = tp.Context(dims=("i", "u"))
    (i, u), (I, U) = ctx.dims, ctx.bounds
    with ctx:
        keys = tp.uniform((6,), domain=(i, u))
        scaled = (keys[i, u - u % 2].exp() * 2.0).sum()
        out = scaled + tp.symbol_value(u).astype("float32")
    bounds = {I: 2, U: 6}
    run = run_pass(ctx, bounds, [out], "domains")
    assert _points(run, "exp") == [(("i", "u"), 6)]
    assert _points(run, "reduce_sum") == [(("i", "u"), 6)]
    check(ctx, bounds, [out], ["domains", "copies"])


def test_one_to_one_reads_leave_the_program_alone(run_pass):
    """Shifted and reversed reads (``x[t - 1]``, ``x[T - 1 - t]``) give each point its own
    source point: nothing to share, nothing moves."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS[0, :, 0])[t] * 2.0
        acc = tp.placeholder((), domain=(t,))
        acc[t == 0] = x
        acc[True] = acc[t - 1] * 0.5 + x
        shifted = acc.exp()
        out = shifted + x[T - 1 - t].tanh()
    run = run_pass(ctx, {T: 8}, [out], "domains")
    assert run.kinds() == run.kinds("before")


def test_random_draws_and_point_dependent_ops_stay(run_pass):
    """A draw at ``t - t % 2`` is still a fresh draw per point of its own domain; an op
    whose params use the point (an index by ``t % 2``) cannot move."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        keys = tp.uniform((4,), domain=(t,))
        out = keys[t - t % 2, t % 2]
    run = run_pass(ctx, {T: 6}, [out], "domains")
    assert run.kinds() == run.kinds("before")


def test_moved_points_form_the_expected_set(run_pass):
    """The argsort's needed points are exactly ``u mod 4 = 0``."""
    ctx = tp.Context(dims=("i", "u"))
    (i, u), (I, U) = ctx.dims, ctx.bounds
    with ctx:
        out = _epoch_permutation(ctx, 4)[i, u, u % 4].astype("float32")
    run = run_pass(ctx, {I: 2, U: 8}, [out], "domains")
    (moved,) = [op for op in run.after.ops.values() if op.kind == "argsort"]
    expected = isl.Set(f"{{ S{moved.id}[a, b] : 0 <= a < 2 and 0 <= b < 8 and b mod 4 = 0 }}",
                       context=needed_by_op(run.state.needed, [moved.id])[moved.id].get_ctx())
    assert needed_by_op(run.state.needed, [moved.id])[moved.id].is_equal(expected)


def test_an_invariant_op_with_coarse_reads_moves_to_its_source_domain(run_pass, check):
    """``exp(keys[i, u - u % 2])`` over ``(i, u, v)``: invariant in ``v``, and then computed
    once per key vector (2 x 3 of 2 x 6 x 4 points)."""
    ctx = tp.Context(dims=("i", "u", "v"))
    (i, u, v), (I, U, V) = ctx.dims, ctx.bounds
    with ctx:
        keys = tp.uniform((3,), domain=(i, u))
        wide = RecurrentTensor(ctx, ctx.add_op("exp", [keys[i, u - u % 2]], {}, domain=(i, u, v)))
        out = wide.sum() + tp.symbol_value(v).astype("float32")
    bounds = {I: 2, U: 6, V: 4}
    run = run_pass(ctx, bounds, [out], "domains")
    assert _points(run, "exp") == [(("i", "u"), 6)]
    check(ctx, bounds, [out], ["domains", "copies"])
