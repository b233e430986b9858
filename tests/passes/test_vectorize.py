"""Vectorization of the innermost dim: ops off every recurrence over ``t`` run once per
``i`` on all steps stacked, with the results of the unoptimized program and the reference
evaluator (and, for gradients, of ``jax.grad``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tempo as tp
from tempo.passes import PIPELINE
from tempo.reference import evaluate

I_VALUE, T_VALUE, B, H = 2, 6, 3, 4
RNG = np.random.default_rng(11)
XS = RNG.normal(size=(I_VALUE, T_VALUE, B, H)).astype(np.float32)
W = RNG.normal(size=(H, 5)).astype(np.float32)
V = RNG.normal(size=(H,)).astype(np.float32)
IDX = np.array([2, 0, 3], dtype=np.int32)
UNVECTORIZED = [name for name, _ in PIPELINE if name != "vectorize"]


def _context():
    ctx = tp.Context(dims=("i", "t"))
    return ctx, ctx.dims, ctx.bounds


def _rollout(ctx):
    """A recurrence over t, as an env's state: ``s[t] = 0.5 s[t-1] + x[t]``."""
    (i, t), _ = ctx.dims, ctx.bounds
    x = tp.const(XS)[i, t]
    s = tp.placeholder(shape=(B, H), dtype="float32", domain=(i, t))
    s[t == 0] = x
    s[True] = s[i, t - 1] * 0.5 + x
    return s


def _compiled(ctx, bounds, outputs, backend="numpy", passes=None):
    exe = ctx.compile(bounds, outputs, backend=backend, passes=passes)
    return exe, exe.run()


def _vectorized_count(exe) -> int:
    note = next(n for n in exe.report.notes if n.startswith("vectorize"))
    return int(note.split()[1])


def _check(ctx, bounds, outputs, backend="numpy"):
    """Vectorized and unvectorized runs equal the reference; returns the vectorized
    executable."""
    exe, got = _compiled(ctx, bounds, outputs, backend)
    _, plain = _compiled(ctx, bounds, outputs, backend, UNVECTORIZED)
    ref = evaluate(ctx, bounds, outputs)
    for rt in outputs:
        np.testing.assert_allclose(np.asarray(got[rt]), ref[rt.key], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(plain[rt]), ref[rt.key], rtol=1e-5, atol=1e-5)
    return exe


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_critic_over_a_rollout_runs_once_per_iteration(backend):
    """The value MLP reads the rollout's states at ``t``; it is on no recurrence, so it
    runs over ``(i,)`` on all steps, while the recurrence keeps its ``t``."""
    ctx, (i, t), (I, T) = _context()
    with ctx:
        s = _rollout(ctx)
        value = ((s @ tp.const(W)).tanh() @ tp.const(W.T)).sum(-1)
        out = value[i, 0:T].sum(0)
    exe = _check(ctx, {I: I_VALUE, T: T_VALUE}, [out], backend)
    by_kind = {op.kind: op.domain for op in exe.graph.ops.values()
               if op.kind in ("matmul", "tanh", "merge")}
    assert [d.name for d in by_kind["merge"]] == ["i", "t"]
    if backend == "numpy":  # on JAX these are inside fused ops
        assert [d.name for d in by_kind["matmul"]] == ["i"]
        assert [d.name for d in by_kind["tanh"]] == ["i"]


def _layouts(x, name: str):
    """One rule of the pass on the per-step value ``x`` of shape ``(B, H)``."""
    (i, t), _ = x.ctx.dims, x.ctx.bounds
    v, w = tp.const(V), tp.const(W)
    row = tp.const(XS)[i, t, 0]  # (H,) per step: broadcast against (B, H)
    return {
        "broadcast a lower-rank row": lambda: x * row + row,
        "where": lambda: tp.where(x > 0, x, row),
        "reduce negative dim": lambda: x.sum(-1, keepdim=True) + x.max(0).mean(),
        "cumsum": lambda: x.cumsum(-1),
        "matmul matrix": lambda: x @ w,
        "matmul vector": lambda: x @ v,
        "matmul row on the right": lambda: tp.const(W.T) @ x.permute(1, 0),
        "permute": lambda: x.permute(1, 0),
        "reshape": lambda: x.reshape(H, B),
        "expand": lambda: row.expand(B, H) * 2.0,
        "cat": lambda: tp.cat([x, x * 2.0], dim=-1),
        "stack": lambda: tp.stack([x, x.exp()], dim=1),
        "take": lambda: x[i, t, :, tp.const(IDX)],
        "gather": lambda: x.gather(x.argsort(-1), -1),
        "slice": lambda: x[i, t, :, 1:3],
        "squeeze": lambda: x[i, t, 0:1].squeeze(0) + x.unsqueeze(0)[i, t, 0],
        "argmax": lambda: x.argmax(-1).astype("float32"),
    }[name]()


RULES = ["broadcast a lower-rank row", "where", "reduce negative dim", "cumsum", "matmul matrix",
         "matmul vector", "matmul row on the right", "permute", "reshape", "expand", "cat",
         "stack", "take", "gather", "slice", "squeeze", "argmax"]


@pytest.mark.parametrize("name", RULES)
def test_each_rule_gives_the_reference_values(name, run_pass):
    ctx, (i, t), (I, T) = _context()
    bounds = {I: I_VALUE, T: T_VALUE}
    with ctx:
        x = tp.const(XS)[i, t] * 1.5
        y = _layouts(x, name)
        out = y[i, 0:T]
    run = run_pass(ctx, bounds, [out], "vectorize")
    assert run.after.ops[y.op.id].domain == (i,)
    assert _vectorized_count(_check(ctx, bounds, [out])) >= 1


def test_a_recurrence_reads_rows_of_vectorized_values():
    """A placeholder over ``t`` (not vectorized) reading a vectorized value at ``t``, at
    ``T-1`` and over a window ``t:T``: rows, a constant row and slices of the stack."""
    ctx, (i, t), (I, T) = _context()
    with ctx:
        x = tp.const(XS)[i, t]
        h = (x * 2.0).tanh()
        acc = tp.placeholder(shape=(B, H), dtype="float32", domain=(i, t))
        acc[t == 0] = h + h[i, T - 1]
        acc[True] = acc[i, t - 1] * 0.9 + h + h[i, t:T].sum(0)
        out = acc[i, 0:T]
    exe = _check(ctx, {I: I_VALUE, T: T_VALUE}, [out])
    assert any(op.kind == "tanh" and [d.name for d in op.domain] == ["i"]
               for op in exe.graph.ops.values())


def test_a_sink_per_step_sees_each_step_of_a_vectorized_value():
    ctx, (i, t), (I, T) = _context()
    seen = {}
    with ctx:
        y = (tp.const(XS)[i, t] * 3.0).sum(-1)
        tp.sink(y, lambda value, point: seen.__setitem__((point["i"], point["t"]), value))
        out = y[i, 0:T]
    exe, _ = _compiled(ctx, {I: I_VALUE, T: T_VALUE}, [out])
    assert _vectorized_count(exe) >= 1
    for (a, b), value in seen.items():
        np.testing.assert_allclose(value, XS[a, b].sum(-1) * 3.0, rtol=1e-6)
    assert len(seen) == I_VALUE * T_VALUE


def test_an_op_needed_at_some_steps_only_keeps_its_dim():
    """``y`` is read at ``T-1`` only: stacking it would compute steps nobody needs."""
    ctx, (i, t), (I, T) = _context()
    with ctx:
        y = (tp.const(XS)[i, t] * 2.0).exp()
        out = y[i, T - 1]
    exe = _check(ctx, {I: I_VALUE, T: T_VALUE}, [out])
    assert all(t in op.domain for op in exe.graph.ops.values() if op.kind == "exp")


def test_gradients_through_vectorized_steps_equal_jax():
    """A per-step loss of a shared weight, summed over the rollout: the backward ops of
    every step run stacked, the weight's gradient is ``jax.grad``'s."""
    ctx, (i, t), (I, T) = _context()
    with ctx:
        w = tp.const(W, requires_grad=True)
        s = _rollout(ctx)
        h = (s @ w).tanh()
        loss = (h * h).mean()[i, 0:T].sum()[0:I].sum()
        loss.backward()
    exe = _check(ctx, {I: I_VALUE, T: T_VALUE}, [w.grad])
    assert _vectorized_count(exe) >= 4

    def reference(w):
        total = 0.0
        for a in range(I_VALUE):
            s = XS[a, 0]
            for b in range(T_VALUE):
                s = XS[a, b] if b == 0 else 0.5 * s + XS[a, b]
                total = total + (jnp.tanh(s @ w) ** 2).mean()
        return total
    np.testing.assert_allclose(np.asarray(exe.run()[w.grad]), jax.grad(reference)(jnp.asarray(W)),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_gradient_read_through_a_window_of_every_step_is_summed_once(backend):
    """A mean over ``y[i, 0:T]`` (REINFORCE's value loss): the gradient of every step's
    ``y`` comes from one reader sum per ``i`` (the mean's gradient, stacked), not one per
    step, and the weight's gradient is ``jax.grad``'s."""
    ctx, (i, t), (I, T) = _context()
    with ctx:
        w = tp.const(W, requires_grad=True)
        s = _rollout(ctx)
        target = s[i, t:T].sum(0).sum(-1)  # a window from t: per step, not vectorized
        y = ((s @ w).tanh().sum(-1) - target) ** 2
        loss = y[i, 0:T].mean()[0:I].sum()
        loss.backward()
    exe = _check(ctx, {I: I_VALUE, T: T_VALUE}, [w.grad], backend)
    sums = [op for op in exe.graph.ops.values() if op.kind == "sum_readers"]
    assert sums and all(t not in op.domain for op in sums)

    def reference(w):
        total = 0.0
        for a in range(I_VALUE):
            states = [XS[a, 0]]
            for b in range(1, T_VALUE):
                states.append(0.5 * states[-1] + XS[a, b])
            ys = [(jnp.tanh(states[b] @ w).sum(-1) - sum(states[b:]).sum(-1)) ** 2 for b in range(T_VALUE)]
            total = total + jnp.stack(ys).mean()
        return total
    np.testing.assert_allclose(np.asarray(exe.run()[w.grad]), jax.grad(reference)(jnp.asarray(W)),
                               rtol=2e-5, atol=2e-5)


def test_a_resumed_run_reads_its_own_rows():
    """Under an origin that shifts ``t`` (what host ops see), rows of a vectorized value
    are still read at the run's own steps: both forms give the same result."""
    ctx, (i, t), (I, T) = _context()
    with ctx:
        h = (tp.const(XS)[i, t] * 2.0).tanh() + tp.symbol_value(t).astype("float32")
        acc = tp.placeholder(shape=(B, H), dtype="float32", domain=(i, t))
        acc[t == 0] = h
        acc[True] = acc[i, t - 1] * 0.9 + h
        out = acc[i, 0:T]
    bounds = {I: I_VALUE, T: T_VALUE - 2}
    runs = [ctx.compile(bounds, [out], backend="numpy", passes=p).run(origin={t: 2})
            for p in (None, UNVECTORIZED)]
    np.testing.assert_array_equal(np.asarray(runs[0][out]), np.asarray(runs[1][out]))


def _draws_over_steps(ctx, large: bool = False):
    """Three draws at every ``(i, t)`` (``STACK_MIN_BYTES`` per step when ``large``),
    read by a recurrence over ``t`` and by an op on every step."""
    dims = ctx.dims
    outer, t = dims[:-1], dims[-1]
    T = ctx.bounds[-1]
    shape = (128, 128) if large else (B, H)
    u = tp.uniform(shape, domain=dims)
    n = tp.normal(shape, loc=1.0, domain=dims)
    k = tp.randint(0, 7, shape, domain=dims).astype("float32")
    s = tp.placeholder(shape=shape, dtype="float32", domain=dims)
    s[t == 0] = u
    s[True] = s[(*outer, t - 1)] * 0.5 + u
    return [s[(*outer, slice(0, T))], (n * 2.0 + k)[(*outer, slice(0, T))]]


def _rng_domains(exe) -> list[list[str]]:
    return [[d.name for d in op.domain] for op in exe.graph.ops.values() if op.kind == "rng"]


@pytest.mark.parametrize("backend", ["numpy", "jax"])
@pytest.mark.parametrize("parallel", [False, True])
def test_draws_at_every_step_are_drawn_at_once_bit_for_bit(backend, parallel):
    """A draw keyed by ``(i, t)`` (and by a laid-out parallel dim) is made for all steps
    at once, from every step's coordinates: the values are the per-step draws'."""
    ctx = tp.Context(dims=("b", "i", "t"), seed=5, parallel=("b",)) if parallel else \
        tp.Context(dims=("i", "t"), seed=5)
    with ctx:
        outputs = _draws_over_steps(ctx)
    bounds = dict(zip(ctx.bounds, (2, I_VALUE, T_VALUE) if parallel else (I_VALUE, T_VALUE)))
    exe = ctx.compile(bounds, outputs, backend=backend)
    got = exe.run()
    plain = ctx.compile(bounds, outputs, backend=backend, passes=UNVECTORIZED).run()
    ref = evaluate(ctx, bounds, outputs)
    for rt in outputs:
        np.testing.assert_allclose(np.asarray(got[rt]), ref[rt.key], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(got[rt]), np.asarray(plain[rt]))
    if backend == "numpy":  # (on JAX inside fused ops)
        assert _rng_domains(exe) == [["i"]] * 3


def test_large_draws_stay_step_by_step(monkeypatch):
    """A draw of ``STACK_MIN_BYTES`` per step, or of more than ``STACKED_DRAWS_MAX_BYTES``
    over the steps, would be held whole: it keeps its ``t``."""
    from tempo.passes import vectorize
    ctx, (i, t), (I, T) = _context()
    with ctx:
        large = _draws_over_steps(ctx, large=True)
    exe = ctx.compile({I: I_VALUE, T: 3}, large, backend="numpy")
    assert _rng_domains(exe) == [["i", "t"]] * 3
    ctx, (i, t), (I, T) = _context()
    with ctx:
        small = _draws_over_steps(ctx)
    monkeypatch.setattr(vectorize, "STACKED_DRAWS_MAX_BYTES", B * H * 4 * T_VALUE - 1)
    exe = ctx.compile({I: I_VALUE, T: T_VALUE}, small, backend="numpy")
    assert _rng_domains(exe) == [["i", "t"]] * 3


def test_a_resumed_run_draws_what_the_longer_run_drew():
    """Stacked draws are keyed by the coordinates host ops see: under an origin, the
    steps a resumed run draws are the longer run's."""
    ctx, (i, t), (I, T) = _context()
    with ctx:
        outputs = _draws_over_steps(ctx)
    whole = ctx.compile({I: I_VALUE, T: T_VALUE}, outputs, backend="numpy").run()
    tail = ctx.compile({I: I_VALUE, T: T_VALUE - 2}, outputs, backend="numpy").run(origin={t: 2})
    steps = outputs[1]
    np.testing.assert_array_equal(np.asarray(tail[steps]), np.asarray(whole[steps])[:, 2:])


def test_a_program_of_one_dim_is_not_vectorized():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        out = (tp.const(XS[0])[t] * 2.0).tanh()[0:T]
    exe = ctx.compile({T: T_VALUE}, [out], backend="numpy")
    assert any("one dim is not vectorized" in n for n in exe.report.notes)


@pytest.mark.parametrize("window", [False, True])
def test_a_cycle_through_an_op_without_t_is_not_stacked(window):
    """``v[i, t]`` reads ``g[i, t]``, which reads ``e[i]``, which reads ``v[i, 0]`` (or
    ``v[i, 0:2]``): fine step by step, a cycle at one point if ``v`` were stacked. The
    program must schedule with every pass (no fallback to the unoptimized one)."""
    ctx, (i, t), (I, T) = _context()
    with ctx:
        x = tp.const(XS)[i, t, 0]
        g = tp.placeholder(shape=(H,), dtype="float32", domain=(i, t))
        v = g + x
        e = v[i, 0:2].sum(0) if window else v[i, 0] * 2.0
        g[t < 2 if window else t == 0] = x * 0.0
        g[True] = e
        out = (v * 1.5 - 0.25)[i, 0:T]
    exe = _check(ctx, {I: I_VALUE, T: T_VALUE}, [out])
    assert not any("passes undone" in n for n in exe.report.notes)


def test_a_program_that_does_not_schedule_vectorized_is_compiled_without_it(first_schedule_fails):
    """Should isl find no schedule for the vectorized program, compilation retries without
    vectorization (keeping the other passes) before giving up every pass."""
    calls = first_schedule_fails
    ctx, (i, t), (I, T) = _context()
    with ctx:
        s = _rollout(ctx)
        out = (s @ tp.const(W)).tanh()[i, 0:T]
    exe = _check(ctx, {I: I_VALUE, T: T_VALUE}, [out])
    undone = [n for n in exe.report.notes if n.startswith("passes undone")]
    assert len(undone) == 1 and "vectorize" in undone[0] and "simulated" in undone[0]
    # (fusion joined no siblings here: the same program is not scheduled again without them)
    assert not any(n.startswith("siblings") for n in exe.report.notes)
    assert exe.graph is calls[1] and len(calls[1]) < len(ctx.graph.ops)  # other passes kept
    assert any(t in op.domain for op in exe.graph.ops.values() if op.kind in ("fused", "matmul"))


@pytest.mark.parametrize("split_rows", [False, True])
@pytest.mark.parametrize("transposed", [(False, False), (True, False), (False, True), (True, True)])
def test_contraction_steps_make_the_matrices_whose_product_sums_the_products(transposed, split_rows):
    """``contraction_steps`` turns N stacked values of each matmul operand (held as it is
    or transposed) into the matrices whose product is the sum of the N products, with the
    stacked axis inside the contracted one (``split_rows``: kept split over devices) or
    outside it."""
    from tempo.ir.types import TensorType
    from tempo.passes.contract import contraction_steps
    rng = np.random.default_rng(2 * transposed[0] + transposed[1])
    count, m, k, n = 5, 3, 4, 2
    operands = [rng.normal(size=(count, m, k)), rng.normal(size=(count, k, n))]
    expected = np.einsum("tmk,tkn->mn", *operands)

    def laid_out(index: int) -> np.ndarray:
        values, flipped = operands[index], transposed[index]
        stored = np.swapaxes(values, 1, 2) if flipped else values  # what each point holds
        for kind, params in contraction_steps(TensorType(values.shape[1:], "float64"), index, flipped,
                                              count, split_rows):
            stored = np.transpose(stored, params["dims"]) if kind == "permute" else \
                stored.reshape(tuple(int(d.value) for d in params["shape"]))
        return stored
    np.testing.assert_allclose(laid_out(0) @ laid_out(1), expected, rtol=1e-12)
