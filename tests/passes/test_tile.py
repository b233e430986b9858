"""Tiling of varying-length reads (``tempo.passes.tile``): attention over ``k[0:t+1]`` and
over a window, padded to tiles and masked, gives the reference evaluator's values and ops
of a few shapes only; what it cannot pad stays as it was."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.ir.graph import has_static_shapes
from tempo.passes import PIPELINE
from tempo.reference import evaluate

T_VALUE, H = 11, 4
RNG = np.random.default_rng(5)
Q = RNG.normal(size=(T_VALUE, 2, H)).astype(np.float32)
K = RNG.normal(size=(T_VALUE, H)).astype(np.float32) * 3.0
V = RNG.normal(size=(T_VALUE, H)).astype(np.float32)


def _attention(window: int | None):
    """``out[t] = softmax(q[t] k[s]^T / 2) v[s]`` over ``s`` in ``0..t`` (or the last
    ``window`` positions), the keys and values made at each step."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        q = tp.const(Q)[t]
        k = tp.const(K)[t] * 1.5
        v = tp.const(V)[t] + 0.25
        span = slice(0, t + 1) if window is None else slice(tp.max(0, t - window + 1), t + 1)
        scores = q @ k[span].permute(1, 0) / 2.0  # (2, n)
        out = scores.softmax(-1) @ v[span]          # (2, H)
    return ctx, {T: T_VALUE}, out


def _tile_note(exe) -> str:
    return next(n for n in exe.report.notes if n.startswith("tile"))


@pytest.mark.parametrize("backend,tile", [("jax", None), ("jax", 4), ("numpy", 4), ("jax", 16)])
@pytest.mark.parametrize("window", [None, 3])
def test_padded_attention_gives_the_reference_values(backend, tile, window):
    ctx, bounds, out = _attention(window)
    exe = ctx.compile(bounds, [out], backend=backend, tile=tile)
    assert "padded to" in _tile_note(exe)
    got = np.asarray(exe.run()[out])
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [out])[out.key], rtol=1e-5, atol=1e-6)


def test_a_window_is_one_static_shape():
    """``k[max(0, t-2):t+1]`` holds 1 to 3 points: padded to 3 rows at every ``t``, every
    op has one shape (it compiles once)."""
    ctx, bounds, out = _attention(3)
    exe = ctx.compile(bounds, [out], backend="jax")
    assert "padded to 3 rows" in _tile_note(exe)
    for op in exe.graph.ops.values():
        assert has_static_shapes(op, exe.graph.in_edges(op), set(exe.bounds)), op


def test_growing_reads_take_one_shape_per_tile():
    """``k[0:t+1]`` with tiles of 4 rows: 11 lengths, 3 shapes (4, 8, 12 rows)."""
    ctx, bounds, out = _attention(None)
    exe = ctx.compile(bounds, [out], backend="jax", tile=4)
    assert "tiles of 4 rows (3 shapes)" in _tile_note(exe)
    varying = [op for op in exe.graph.ops.values()
               if not has_static_shapes(op, exe.graph.in_edges(op), set(exe.bounds))]
    assert varying and all(has_static_shapes(op, exe.graph.in_edges(op), set(exe.bounds), tiled=True)
                           for op in varying)


def test_numpy_runs_varying_shapes_as_they_come():
    ctx, bounds, out = _attention(None)
    exe = ctx.compile(bounds, [out], backend="numpy")
    assert not any(n.startswith("tile") for n in exe.report.notes)


def test_a_mean_over_the_varying_axis_is_left_unpadded():
    """A mean would count the padding: the read is not padded, and the values are right."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        k = tp.const(K)[t] * 2.0
        out = k[0:t + 1].mean(0)
    exe = ctx.compile({T: T_VALUE}, [out], backend="jax")
    assert "left unpadded" in _tile_note(exe) and "reduce_mean" in _tile_note(exe)
    np.testing.assert_allclose(np.asarray(exe.run()[out]),
                               [K[:n + 1].mean(0) * 2.0 for n in range(T_VALUE)], rtol=1e-5)


@pytest.mark.parametrize("tile", [0, -4, 2.5, True])
def test_a_bad_tile_is_an_error(tile):
    ctx, bounds, out = _attention(None)
    with pytest.raises(ValueError, match="tile must be a positive number of rows"):
        ctx.compile(bounds, [out], backend="numpy", tile=tile)


def _stores():
    from tempo.runtime.backends import NumpyBackend
    from tempo.runtime.stores import BlockStore, MemoryStats, PointStore, WindowStore
    stats = MemoryStats()
    return {"point": PointStore(NumpyBackend(), stats, lambda sizes: np.zeros((*sizes, 2), np.float32)),
            "block": BlockStore(stats, 6, (2,), "float32", rows=8),
            "window": WindowStore(stats, 6, (2,), "float32", capacity=3)}


@pytest.mark.parametrize("kind", ["point", "block", "window"])
def test_a_padded_read_delivers_its_points_then_padding(kind):
    """``x[0:t+1]`` padded to 4 rows (``slice(start, stop, rows)``) at ``t = 1``: the two
    points, then two rows the readers mask (zeros in a fresh store)."""
    store = _stores()[kind]
    for k in range(2):
        store.write((k,), np.full(2, k + 1.0, np.float32))
    got = np.asarray(store.read((slice(0, 2, 4),)))
    assert got.shape == (4, 2)
    np.testing.assert_array_equal(got[:2], [[1.0, 1.0], [2.0, 2.0]])
    assert np.isfinite(got).all()


def test_a_padded_read_of_no_points_is_a_slice_of_the_buffer():
    """``x[0:0]`` padded to 4 rows (the first point's read of its earlier rows) is the
    buffer's first 4 rows, which a kernel may slice itself (all masked); an empty slice
    without padding delivers nothing, and is not."""
    store = _stores()["block"]
    store.write((0,), np.ones(2, np.float32))
    block, start, rows = store.block_slice((slice(0, 0, 4),))
    assert block is store.blocks[()] and (start, rows) == (0, 4)
    assert store.block_slice((slice(0, 0),)) is None


def test_mask_rows_keeps_the_first_rows_of_its_axis():
    import jax.numpy as jnp

    from tempo.ir.ops import op_def
    x = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    kernel = op_def("mask_rows").kernel
    for xp in (np, jnp):
        got = np.asarray(kernel(xp, {"axis": -2, "fill": -np.inf}, xp.asarray(x), np.int32(3)))
        expected = x.copy()
        expected[:, 3:, :] = -np.inf
        np.testing.assert_array_equal(got, expected)


R = RNG.normal(size=(T_VALUE,)).astype(np.float32)
DONE = (RNG.random(T_VALUE) < 0.3).astype(np.float32)


def _n_step_returns(n: int = 4, computed: bool = False):
    """n-step's returns (``tempo_rl.algorithms.nstep``) over ``r[t:min(t+n, T)]``, a window
    that shrinks at the end: discounted rewards up to the first episode end, through a
    cumulative sum, and the bootstrap at the last step included, found with an ``arange``
    of the window's length. ``computed``: over iterations ``i`` too, rewards and ends
    computed from ``i`` and ``t`` (the vectorize pass lays them out along ``t``, and the
    windows become slices of them)."""
    from tempo.api.tensor import arange
    ctx = tp.Context(dims=("i", "t") if computed else ("t",))
    t, T = ctx.dims[-1], ctx.bounds[-1]
    with ctx:
        if computed:
            steps = tp.symbol_value(t).astype("float32") + tp.symbol_value(ctx.dims[0]).astype("float32")
            r, done = (steps * 0.37).sin() * 2.0, ((steps % 3.0) == 2.0).astype("float32")
        else:
            r, done = tp.const(R)[t] * 2.0, tp.const(DONE)[t] * 1.0
        stop = tp.min(t + n, T)
        window = (*ctx.dims[:-1], slice(t, stop))
        alive = ((done[window].cumsum(0) - done[window]) == 0).astype("float32")
        is_last = (arange(ctx, stop - t) == stop - t - 1).astype("float32").unsqueeze(-1)
        ends = alive.unsqueeze(-1) * tp.max(done[window].unsqueeze(-1), is_last)
        out = (r[window] * alive).discounted_sum(0.9) + (ends * r[window].unsqueeze(-1)).discounted_sum(0.9)
    return ctx, {T: T_VALUE, **({ctx.bounds[0]: 2} if computed else {})}, out


def _reference_n_step_returns(n: int = 4, i: int | None = None) -> np.ndarray:
    """The returns by hand: of the constants, or of the computed rewards at iteration ``i``."""
    steps = np.arange(T_VALUE, dtype=np.float32) + (i or 0)
    rewards, dones = (np.sin(steps * 0.37) * 2.0, (steps % 3 == 2).astype(np.float32)) if i is not None \
        else (R * 2.0, DONE)
    out = []
    for t in range(T_VALUE):
        r, done = rewards[t:t + n], dones[t:t + n]
        alive = (np.cumsum(done) - done == 0).astype(np.float32)
        is_last = (np.arange(len(r)) == len(r) - 1).astype(np.float32)
        ends = alive * np.maximum(done, is_last)
        weights = 0.9 ** np.arange(len(r))
        out.append([(weights * r * alive).sum() + (weights * ends * r).sum()])
    return np.asarray(out, np.float32).reshape(T_VALUE, 1)


NO_VECTORIZE = [name for name, _ in PIPELINE if name != "vectorize"]


def test_a_shrinking_window_through_cumulative_and_discounted_sums_is_padded():
    """The window's reads, the arange of its length, the cumulative sum (its rows before
    the padding sum no padded row), the inserted dims and the discounted sums (padded rows
    masked with zeros) are padded to one static shape; the values are the reference
    evaluator's and the returns computed by hand."""
    ctx, bounds, out = _n_step_returns()
    exe = ctx.compile(bounds, [out], backend="jax", passes=NO_VECTORIZE)
    assert "padded to 4 rows" in _tile_note(exe)
    for op in exe.graph.ops.values():
        assert has_static_shapes(op, exe.graph.in_edges(op), set(exe.bounds), tiled=True), op
    got = np.asarray(exe.run()[out])
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [out])[out.key], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, _reference_n_step_returns(), rtol=1e-5, atol=1e-6)


def _compiled_as_for(monkeypatch, accelerator: bool) -> None:
    """Compile as for an accelerator or a CPU (``PassState.accelerator``), whatever this
    machine has."""
    from tempo import compiler
    from tempo.passes import PassState
    monkeypatch.setattr(compiler, "PassState",
                        lambda *a, **k: PassState(*a, **{**k, "accelerator": accelerator}))


@pytest.mark.parametrize("accelerator", [True, False])
def test_slices_of_a_vectorized_value_are_padded_on_an_accelerator(monkeypatch, accelerator):
    """Vectorized over ``t``, the rewards are one value and the window a slice of it at
    each step: on an accelerator the slices become ``window`` ops of a static shape with
    their start as an input, padded with zeros; on a CPU they stay slices run on the
    host. The values are the reference's either way."""
    _compiled_as_for(monkeypatch, accelerator)
    ctx, bounds, out = _n_step_returns(computed=True)
    exe = ctx.compile(bounds, [out], backend="jax")
    kinds = {m.kind for op in exe.graph.ops.values()
             for m in (op.params["members"] if op.kind == "fused" else [op])}
    assert ("window" in kinds) == accelerator and ("slice" in kinds) != accelerator, kinds
    assert ("padded to 4 rows" in "\n".join(exe.report.notes)) == accelerator
    got = np.asarray(exe.run()[out])
    want = np.stack([_reference_n_step_returns(i=i) for i in range(2)])
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_a_window_ending_before_its_value_masks_the_rows_after_it(monkeypatch):
    """A backward window ``r[max(0, t-3):t+1]`` of a laid-out value, padded on an
    accelerator: its padded rows are the value's next rows, not zeros, and the sums over
    the window (a discounted one, one after a cumulative sum) mask them."""
    _compiled_as_for(monkeypatch, True)
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        steps = tp.symbol_value(t).astype("float32") + tp.symbol_value(i).astype("float32")
        r = (steps * 0.37).sin() * 2.0 + 3.0
        window = (i, slice(tp.max(0, t - 3), t + 1))
        out = r[window].discounted_sum(0.9) + r[window].cumsum(0).sum(0)
    exe = ctx.compile({I: 2, T: T_VALUE}, [out], backend="jax")
    assert "padded to 4 rows" in "\n".join(exe.report.notes), exe.report.notes
    want = []
    for k in range(2):
        rewards = np.sin((np.arange(T_VALUE) + k) * 0.37) * 2.0 + 3.0
        rows = [rewards[max(0, n - 3):n + 1] for n in range(T_VALUE)]
        want.append([(0.9 ** np.arange(len(w)) * w).sum() + np.cumsum(w).sum() for w in rows])
    np.testing.assert_allclose(np.asarray(exe.run()[out]).reshape(2, T_VALUE), want, rtol=1e-5)


@pytest.mark.parametrize("start", [0, 3, 9, 11])
def test_a_window_op_takes_its_rows_then_zeros(start):
    """``window``: ``size`` rows from ``start`` along ``dim``, zeros past the end, alike on
    NumPy and JAX."""
    import jax.numpy as jnp

    from tempo.ir.ops import OPS
    from tempo.runtime.backends import JaxBackend
    x = RNG.normal(size=(3, 11)).astype(np.float32)
    want = np.concatenate([x, np.zeros((3, 4), np.float32)], 1)[:, start:start + 4]
    params = {"dim": 1, "size": 4}
    np.testing.assert_array_equal(OPS["window"].kernel(np, params, x, np.int32(start)), want)
    got = OPS["window"].kernel(JaxBackend().xp, params, jnp.asarray(x), jnp.int32(start))
    np.testing.assert_array_equal(np.asarray(got), want)
