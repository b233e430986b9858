"""Read layout (``tempo.passes.layout``): a tiled read that its reader permutes at once
is delivered permuted, the permute is gone, and values are the reference evaluator's."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.passes import PIPELINE
from tempo.reference import evaluate

BACKENDS = ["numpy", "jax"]


def _attention(values: bool = True):
    """An attention over ``t``: queries at ``t`` against keys and values ``y[0:t+1]``,
    permuted as matmuls want them (without ``values``: the sum of the scores' exponents)."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(0)
    with ctx:
        x = tp.const(rng.normal(size=(30, 2, 3, 4)).astype(np.float32))[t]
        y = x.tanh() * 1.5  # (B, heads, d), stored point by point
        q = (x * 0.5).reshape(2, 3, 1, 4)
        keys = y[0:t + 1].permute(1, 2, 3, 0)  # (B, heads, d, n)
        scores = q @ keys
        out = scores.softmax(-1) @ y[0:t + 1].permute(1, 2, 0, 3) if values else scores.exp().sum(-1)
    return ctx, {T: 30}, out


def _laid_out(exe) -> dict[int, int]:
    """Axis of each laid-out read's rows, by the read's sink input."""
    return {(e.sink.id, e.sink_in): e.rows_at for e in exe.graph.edges() if e.rows_at}


def _block_axes(exe) -> list[int]:
    """The rows' axis of each block store of a run of ``exe``."""
    from tempo.runtime import executable
    from tempo.runtime.stores import BlockStore, MemoryStats
    stores = executable._make_stores(exe.graph, exe.bounds, exe.ctx.bound_of, exe.backend, MemoryStats(),
                                     exe.swapped, exe.windows)
    return [store.rows_axis for store in stores.values() if isinstance(store, BlockStore)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_permuted_tiled_reads_come_permuted(backend):
    """Keys and values, two reads of ``y`` permuted differently, come permuted and no
    permute is left. The store keeps its rows first (its readers disagree) and each read
    moves them; values are the reference's."""
    ctx, bounds, out = _attention()
    with ctx:
        exe = ctx.compile(bounds, [out], backend=backend, tile=8)
        got = exe.run()[out]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [out])[out.key], rtol=1e-5, atol=1e-5)
    assert sorted(_laid_out(exe).values()) == [2, 3]
    assert not any(op.kind == "permute" or op.kind == "fused" and any(m.kind == "permute" for m in
                   op.params["members"]) for op in exe.graph.ops.values())
    assert any("layout: 2 tiled reads" in note for note in exe.report.notes)
    assert _block_axes(exe) == [0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_keeps_its_rows_where_its_readers_want_them(backend):
    ctx, bounds, out = _attention(values=False)
    with ctx:
        exe = ctx.compile(bounds, [out], backend=backend, tile=8)
        got = exe.run()[out]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [out])[out.key], rtol=1e-5, atol=1e-5)
    assert list(_laid_out(exe).values()) == [3]
    assert _block_axes(exe) == [3]


def test_untiled_reads_keep_their_rows_first():
    """Without tiling (NumPy picks no tile) nothing is laid out and the permutes stay."""
    ctx, bounds, out = _attention()
    with ctx:
        exe = ctx.compile(bounds, [out], backend="numpy")
        got = exe.run()[out]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [out])[out.key], rtol=1e-5, atol=1e-5)
    assert not _laid_out(exe)


def test_without_the_pass_the_permutes_stay():
    ctx, bounds, out = _attention()
    with ctx:
        exe = ctx.compile(bounds, [out], backend="numpy", tile=8,
                          passes=[name for name, _ in PIPELINE if name != "layout"])
    assert not _laid_out(exe)
    fused = [op for op in exe.graph.ops.values() if op.kind == "fused"]
    assert any(m.kind == "permute" for op in fused for m in op.params["members"])


@pytest.mark.parametrize("dims, moved", [((1, 2, 0, 3), 2), ((1, 2, 3, 0), 3), ((1, 0, 2, 3), 1),
                                         ((0, 1, 2, 3), None), ((2, 1, 0, 3), None), ((1, 3, 0, 2), None)])
def test_only_moves_of_the_first_axis_are_absorbed(dims, moved):
    from tempo.passes.layout import _first_axis_move
    assert _first_axis_move(dims) == moved
