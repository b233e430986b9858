"""Fusion of pointwise islands: fewer ops, the same values as the unfused program and the
reference evaluator, and no island that would wait for itself."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.api import nn, optim
from tempo.reference import evaluate

RNG = np.random.default_rng(0)
W = RNG.normal(size=(4, 4)).astype(np.float32) * 0.5
XS = RNG.normal(size=(6, 4)).astype(np.float32)


def _kinds(exe) -> list[str]:
    return [op.kind for op in exe.graph.ops.values()]


def _rnn():
    """h[t] = tanh(h[t-1] @ W + x[t]) * 0.9 + 0.1, read back through a running mean."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[t]
        h = tp.placeholder((4,))
        h[0] = tp.const(np.zeros(4, np.float32))
        h[t + 1] = (h @ tp.const(W) + x[t + 1]).tanh() * 0.9 + 0.1
        out = (h * 2.0 + 1.0).exp().log()
    return ctx, T, [h, out]


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_recurrence_fuses_and_matches_the_reference(backend):
    ctx, T, outputs = _rnn()
    exe = ctx.compile({T: 6}, outputs, backend=backend)
    plain = ctx.compile({T: 6}, outputs, backend=backend, passes=())
    assert "fused" in _kinds(exe) and "fused" not in _kinds(plain)
    assert len(exe.graph) < len(plain.graph)
    fused, unfused = exe.run(), plain.run()
    ref = evaluate(ctx, {T: 6}, outputs)
    for rt in outputs:
        np.testing.assert_allclose(fused[rt], ref[rt.key], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(unfused[rt], ref[rt.key], rtol=1e-5, atol=1e-6)


def test_an_island_is_never_left_and_reentered():
    """``a -> mean over t -> b`` with ``a`` and ``b`` also connected point by point: fusing
    both would make every point wait for the whole of itself."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        a = tp.const(XS)[t] * 2.0
        mean = a[0:T].mean(0)
        b = (a - mean) * a
    exe = ctx.compile({T: 6}, [b], backend="numpy")
    assert not any("passes undone" in n for n in exe.report.notes)
    a_np = XS * 2.0
    np.testing.assert_allclose(exe.run()[b], (a_np - a_np.mean(0)) * a_np, rtol=1e-5)


def test_reads_of_other_points_inside_an_island_stay_correct():
    """y[t] = x[t] * x[t-1]-style reads between ops that are otherwise fusable."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        a = tp.const(XS)[t] + 1.0
        b = a * 3.0
        c = b + a[tp.max(t - 1, 0)] - a[tp.min(t + 1, T - 1)]
    res = ctx.compile({T: 6}, [c], backend="numpy").run()
    a_np = XS + 1.0
    prev = a_np[[max(k - 1, 0) for k in range(6)]]
    nxt = a_np[[min(k + 1, 5) for k in range(6)]]
    np.testing.assert_allclose(res[c], a_np * 3.0 + prev - nxt, rtol=1e-6)


def test_training_program_fuses_to_a_fraction_and_keeps_its_trajectory():
    ctx = tp.Context(dims=("i",), seed=1)
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        model = nn.MLP(4, [8], 1, domain=(i,))
        loss = ((model(tp.const(XS)) - 1.0) ** 2).mean()
        loss.backward()
        optim.Adam(model.parameters(), lr=0.01).step()
    outputs = [loss, *model.parameters()]
    plain = ctx.compile({I: 5}, outputs, backend="numpy", passes=())
    unfused = plain.run()
    for backend in ("numpy", "jax"):
        exe = ctx.compile({I: 5}, outputs, backend=backend)
        assert len(exe.graph) * 2 < len(plain.graph)
        assert exe.report.sizes["fusion"] == len(exe.graph)
        fused = exe.run()
        for rt in outputs:
            np.testing.assert_allclose(fused[rt], unfused[rt], rtol=1e-5, atol=1e-6)
    assert fused[loss][-1] < fused[loss][0]


def test_unknown_pass_names_are_rejected():
    ctx, T, outputs = _rnn()
    with pytest.raises(ValueError, match="unknown passes"):
        ctx.compile({T: 3}, outputs, backend="numpy", passes=("vectorize-everything",))
