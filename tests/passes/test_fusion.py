"""Fusion of pointwise islands: fewer ops, the same values as the unfused program and the
reference evaluator, and no island that would wait for itself."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.api import nn, optim
from tempo.passes import PIPELINE
from tempo.reference import evaluate

RNG = np.random.default_rng(0)
W = RNG.normal(size=(4, 4)).astype(np.float32) * 0.5
XS = RNG.normal(size=(6, 4)).astype(np.float32)


def _kinds(exe) -> list[str]:
    return [op.kind for op in exe.graph.ops.values()]


def _state():
    """A context over ``t``, the input ``x[t]`` and a state ``h`` that starts at zeros."""
    ctx = tp.Context(dims=("t",))
    (t,), _ = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[t]
        h = tp.placeholder((4,))
        h[0] = tp.const(np.zeros(4, np.float32))
    return ctx, t, x, h


def _rnn():
    """h[t] = tanh(h[t-1] @ W + x[t]) * 0.9 + 0.1, read back through a running mean."""
    ctx, t, x, h = _state()
    (T,) = ctx.bounds
    with ctx:
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


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_outputs_join_the_fused_op_that_computes_them(backend):
    """An output of the program is fused with the ops around it (its fused op exports its
    points, none of which is freed), while the fused op's other values are still freed
    after their last read; values equal the reference evaluator's."""
    ctx, t, x, h = _state()
    (T,) = ctx.bounds
    with ctx:
        y = (h @ tp.const(W) + x).tanh()  # read at t + 1 only: freed as the run goes
        h[t + 1] = y[t] * 0.9
        out = (y * 2.0).sum()  # the output, from y at the same point
        first = y.exp()  # a second output, of the same island
    bounds = {T: 6}
    exe = ctx.compile(bounds, [out, first], backend=backend)
    fused = [op for op in exe.graph.ops.values() if op.kind == "fused"]
    assert out.op.id not in exe.graph.ops and first.op.id not in exe.graph.ops
    assert {exe.stored[out.key][0], exe.stored[first.key][0]} <= {op.id for op in fused}
    got = exe.run()
    ref = evaluate(ctx, bounds, [out, first])
    for rt in (out, first):
        np.testing.assert_allclose(got[rt], ref[rt.key], rtol=1e-5, atol=1e-6)
    stored = set(exe.stored.values())
    freed = {(st.op.id, k) for st in exe.schedule.statements.values() if st.kind == "free"
             for k in st.freed}
    assert not stored & freed  # the outputs' points stay to the end
    assert any(key[0] in {op.id for op in fused} for key in freed)  # y's are freed


ROLLOUTS = RNG.normal(size=(3, 5)).astype(np.float32)


def _recurrence():
    """Over (i, t): ``s[i, t+1] = tanh(s * 0.5 + x[i, t+1])``, restarted every ``i``: a
    value whose rollout ``s[i, 0:T]`` only statistics at ``i`` can read."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(ROLLOUTS)[i, t]
        s = tp.placeholder(shape=(), dtype="float32", domain=(i, t))
        s[i, 0] = x[i, 0]
        s[i, t + 1] = (s * 0.5 + x[i, t + 1]).tanh()
    return ctx, i, I, T, s


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_siblings_at_the_same_points_share_one_kernel(backend):
    """Two statistics of the same rollout ``s[i, 0:T]`` (a value head and a maximum, say)
    run at the same points and read a common producer: one fused op computes both, and a
    third at other points (only at the last ``i``) stays apart."""
    ctx, i, I, T, s = _recurrence()
    with ctx:
        mean = s[i, 0:T].mean(0) * 2.0
        peak = s[i, 0:T].max(0) + 1.0
        last = tp.placeholder(shape=(), dtype="float32", domain=(i,))
        last[i == I - 1] = s[i, 0:T].min(0) - 1.0
        last[True] = mean * 0.0
    bounds = {I: 3, T: 5}
    exe = ctx.compile(bounds, [mean, peak, last], backend=backend)
    assert exe.stored[mean.key][0] == exe.stored[peak.key][0]
    members = [{m.kind for m in op.params["members"]} for op in exe.graph.ops.values() if op.kind == "fused"]
    assert any("reduce_min" in kinds for kinds in members)
    assert not any("reduce_min" in kinds and "reduce_max" in kinds for kinds in members)
    got, ref = exe.run(), evaluate(ctx, bounds, [mean, peak, last])
    for rt in (mean, peak, last):
        np.testing.assert_allclose(got[rt], ref[rt.key], rtol=1e-5, atol=1e-6)


def test_a_program_without_a_schedule_is_compiled_again_without_joined_siblings(first_schedule_fails):
    """Should isl find no schedule for the program with joined siblings, it is compiled
    again with them apart, every pass kept, before any pass is undone."""
    calls = first_schedule_fails
    ctx, i, I, T, s = _recurrence()
    with ctx:
        mean = s[i, 0:T].mean(0) * 2.0
        peak = s[i, 0:T].max(0) + 1.0
    bounds = {I: 3, T: 5}
    exe = ctx.compile(bounds, [mean, peak], backend="numpy")
    undone = [n for n in exe.report.notes if "undone" in n]
    assert len(undone) == 1 and undone[0].startswith("siblings joined by fusion undone"), undone
    assert exe.graph is calls[1] and len(calls[1]) == len(calls[0]) + 1  # the two statistics apart
    assert exe.stored[mean.key][0] != exe.stored[peak.key][0]
    got, ref = exe.run(), evaluate(ctx, bounds, [mean, peak])
    for rt in (mean, peak):
        np.testing.assert_allclose(got[rt], ref[rt.key], rtol=1e-5, atol=1e-6)


def test_siblings_linked_through_another_op_stay_apart():
    """``a`` and ``b`` both read ``s[i, 0:T]``, but ``b`` also reads ``c``, which reads
    ``a``: one op for both would wait for itself. They stay two ops and compute what the
    reference evaluator computes."""
    ctx, i, I, T, s = _recurrence()
    with ctx:
        a = s[i, 0:T].sum(0) * 2.0
        c = s * a
        b = s[i, 0:T].max(0) + c[i, 0:T].sum(0)
    bounds = {I: 3, T: 5}
    unvectorized = [name for name, _ in PIPELINE if name != "vectorize"]
    exe = ctx.compile(bounds, [a, b], backend="numpy", passes=unvectorized)
    assert not any("undone" in n for n in exe.report.notes)
    assert exe.stored[a.key][0] != exe.stored[b.key][0]
    got, ref = exe.run(), evaluate(ctx, bounds, [a, b])
    for rt in (a, b):
        np.testing.assert_allclose(got[rt], ref[rt.key], rtol=1e-5)


def test_a_recurrences_step_joins_no_sibling():
    """The forward step ``x[t+1] @ w`` of a recurrence and the backward pass's read of
    ``x[t+1]`` are siblings at every ``t``, but the backward pass reads the whole forward
    rollout: one op for both would wait for the recurrence's later points, which wait for
    it, and fusion's graph of islands leaves the recurrence out. A recurrence's step joins
    no sibling, so the program keeps its schedule with every pass (without that rule isl
    found none, and the compile started over without joined siblings)."""
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(5, 3)).astype(np.float32)
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(W[:3, :3], requires_grad=True)
        x = tp.const(xs)[t]
        s = tp.placeholder(shape=(3,), dtype="float32", domain=(t,))
        s[0] = x @ w
        s[t + 1] = 0.5 * s + x[t + 1] @ w
        loss = (s * s).sum()[0:T].sum()
        loss.backward()
    bounds = {T: 5}
    exe = ctx.compile(bounds, [s, w.grad], backend="numpy")
    assert not any("undone" in n for n in exe.report.notes), exe.report.notes
    assert "fused" in _kinds(exe)
    got, ref = exe.run(), evaluate(ctx, bounds, [s, w.grad])
    for rt in (s, w.grad):
        np.testing.assert_allclose(got[rt], ref[rt.key], rtol=1e-5, atol=1e-6)
