"""Newest rows (``tempo.passes.newest``): a tiled read of ``k[s:t+1]`` by the point that
makes ``k[t]`` is read as ``k[s:t]`` with ``put_row`` placing ``k[t]``, so that fusion puts
the producer and the reader in one kernel; the values stay the reference evaluator's."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.reference import evaluate

T_VALUE, H = 13, 4
RNG = np.random.default_rng(11)
Q = RNG.normal(size=(T_VALUE, 2, H)).astype(np.float32)
X = RNG.normal(size=(T_VALUE, H)).astype(np.float32)


def _attention(window: int | None, readers: int = 1, counted: bool = False):
    """``out[t] = softmax(q[t] k[s]^T) v[s]`` over ``s`` in ``0..t`` (or a window), with
    ``k[t]`` and ``v[t]`` made at ``t``; ``readers=2`` reads ``k``'s slice a second time
    (a sum of its rows); ``counted`` divides by a ``symbol_value(t + 1)`` the user wrote,
    the same expression as the tile pass's count of points."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        q = tp.const(Q)[t]
        k = tp.const(X)[t].tanh()
        v = tp.const(X)[t] * 0.5 + 0.25
        span = slice(0, t + 1) if window is None else slice(tp.max(0, t - window + 1), t + 1)
        out = (q @ k[span].permute(1, 0)).softmax(-1) @ v[span]    # (2, H)
        if readers == 2:
            out = out + k[span].sum(0)
        if counted:
            out = out / tp.symbol_value(t + 1)
    return ctx, {T: T_VALUE}, out


def _note(exe) -> str | None:
    return next((n for n in exe.report.notes if n.startswith("newest")), None)


def _put_rows(exe) -> list:
    """The ``put_row`` members of the fused ops, and ``put_row`` ops left on their own."""
    out = [op for op in exe.graph.ops.values() if op.kind == "put_row"]
    for op in exe.graph.ops.values():
        if op.kind == "fused":
            out += [m for m in op.params["members"] if m.kind == "put_row"]
    return out


@pytest.mark.parametrize("backend,tile,window", [("numpy", 4, None), ("jax", 4, None),
                                                  ("jax", None, 5), ("numpy", 4, 5)])
def test_the_reader_and_the_producer_share_a_kernel(backend, tile, window):
    """The read ends at the reader's point: it is split, the fused op reads its own
    earlier rows (a slice ending at ``t``, a window's starting after 0 too), and the
    values equal the reference evaluator's."""
    ctx, bounds, out = _attention(window)
    with ctx:
        exe = ctx.compile(bounds, [out], backend=backend, tile=tile)
        got = exe.run()[out]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [out])[out.key], rtol=1e-5, atol=1e-5)
    assert _note(exe) == "newest: 2 tiled read(s) take their newest row from the point itself"
    (fused,) = [op for op in exe.graph.ops.values() if op.kind == "fused"]
    own = [e for e in exe.graph.in_edges(fused) if e.src is fused]
    assert len(own) == 2 and all(str(e.phi[-1].stop) == "t" for e in own)  # k[..:t], twice
    assert len(_put_rows(exe)) == 2


def test_a_slice_read_twice_is_not_split():
    """Where a value is read through its slice by more than one edge, only one reader
    could share the producer's kernel: that value's reads are not split (the other's
    are); the values are right."""
    ctx, bounds, out = _attention(None, readers=2)
    with ctx:
        exe = ctx.compile(bounds, [out], backend="jax", tile=4)
        got = exe.run()[out]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [out])[out.key], rtol=1e-5, atol=1e-5)
    assert _note(exe) == "newest: 1 tiled read(s) take their newest row from the point itself"
    assert len(_put_rows(exe)) == 1


def test_the_row_goes_where_the_run_counts_its_points():
    """``put_row`` takes its row from the tile pass's count of points, evaluated at the
    run's own coordinates (``in_run``), never from a user's ``symbol_value`` of the same
    expression, which a run resumed from a later origin sees shifted."""
    ctx, bounds, out = _attention(None, counted=True)
    with ctx:
        exe = ctx.compile(bounds, [out], backend="numpy", tile=4)
        got = exe.run()[out]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [out])[out.key], rtol=1e-5, atol=1e-5)
    (fused,) = [op for op in exe.graph.ops.values() if op.kind == "fused"]
    inputs = exe.graph.in_edges(fused)
    counts = [inputs[m.args[2][1]].src for m in fused.params["members"] if m.kind == "put_row"]
    assert len(counts) == 2 and all(c.kind == "eval_symbol" and c.params.get("in_run") for c in counts)
    users = [e.src for e in inputs if e.src.kind == "eval_symbol" and not e.src.params.get("in_run")]
    assert users  # the user's symbol_value is still read, apart
