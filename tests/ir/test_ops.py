"""Every op, run through both backends and the reference evaluator, against NumPy."""

import numpy as np
import pytest

import tempo as tp
from tempo.ir.ops import op_def
from tempo.passes import PIPELINE
from tempo.reference import evaluate
from tempo.symbolic.expr import Symbol, minimum

RNG = np.random.default_rng(7)
A = RNG.standard_normal((2, 3)).astype(np.float32)
B = RNG.standard_normal((3, 4)).astype(np.float32)
P = (np.abs(A) + 0.5).astype(np.float32)
I = np.array([[2, 0, 1], [1, 1, 0]], dtype=np.int32)

# name -> (build(a, b, p, idx) -> RT, expected NumPy value)
CASES = {
    "add": (lambda a, b, p, i: a + 1.5, A + 1.5),
    "sub": (lambda a, b, p, i: 2 - a, 2 - A),
    "mul": (lambda a, b, p, i: a * a, A * A),
    "div": (lambda a, b, p, i: a / p, A / P),
    "pow": (lambda a, b, p, i: p ** 2, P ** 2),
    "neg": (lambda a, b, p, i: -a, -A),
    "exp": (lambda a, b, p, i: a.exp(), np.exp(A)),
    "log": (lambda a, b, p, i: p.log(), np.log(P)),
    "tanh": (lambda a, b, p, i: a.tanh(), np.tanh(A)),
    "sqrt": (lambda a, b, p, i: p.sqrt(), np.sqrt(P)),
    "abs": (lambda a, b, p, i: a.abs(), np.abs(A)),
    "sin_cos": (lambda a, b, p, i: a.sin() + a.cos(), np.sin(A) + np.cos(A)),
    "sigmoid": (lambda a, b, p, i: a.sigmoid(), 1 / (1 + np.exp(-A))),
    "relu": (lambda a, b, p, i: a.relu(), np.maximum(A, 0)),
    "floor": (lambda a, b, p, i: a.floor(), np.floor(A)),
    "compare": (lambda a, b, p, i: tp.where((a > 0) & ~(a >= 1) | (a == 0), a, -a),
                np.where((A > 0) & ~(A >= 1) | (A == 0), A, -A)),
    "min_max": (lambda a, b, p, i: tp.max(a, 0.1) + tp.min(a, -0.1),
                np.maximum(A, 0.1) + np.minimum(A, -0.1)),
    "matmul": (lambda a, b, p, i: a @ b, A @ B),
    "sum": (lambda a, b, p, i: a.sum(), A.sum()),
    "sum_dim_keep": (lambda a, b, p, i: a.sum(1, keepdim=True), A.sum(1, keepdims=True)),
    "mean": (lambda a, b, p, i: a.mean(0), A.mean(0)),
    "max_min_prod": (lambda a, b, p, i: a.max(1) + a.min(1) + p.prod(1),
                     A.max(1) + A.min(1) + P.prod(1)),
    "cumsum": (lambda a, b, p, i: a.cumsum(1), np.cumsum(A, 1)),
    "discounted_sum": (lambda a, b, p, i: b.discounted_sum(0.5, dim=1),
                       (B * 0.5 ** np.arange(4)).sum(1).astype(np.float32)),
    "reshape": (lambda a, b, p, i: a.reshape(3, 2), A.reshape(3, 2)),
    "permute": (lambda a, b, p, i: a.permute(1, 0), A.T),
    "expand": (lambda a, b, p, i: a.unsqueeze(0).expand(4, 2, 3), np.broadcast_to(A, (4, 2, 3))),
    "squeeze": (lambda a, b, p, i: a.sum(1, keepdim=True).squeeze(1), A.sum(1)),
    "cat": (lambda a, b, p, i: tp.cat([a, p], dim=0), np.concatenate([A, P], 0)),
    "stack": (lambda a, b, p, i: tp.stack([a, p], dim=1), np.stack([A, P], 1)),
    "index": (lambda a, b, p, i: a[1], A[1]),
    "index_negative": (lambda a, b, p, i: a[-1, 2], A[-1, 2]),
    "slice": (lambda a, b, p, i: a[:, 1:], A[:, 1:]),
    "slice_negative": (lambda a, b, p, i: a[:, -2:], A[:, -2:]),
    "new_axis": (lambda a, b, p, i: a[:, None], A[:, None]),
    "gather": (lambda a, b, p, i: a.gather(i, dim=1), np.take_along_axis(A, I, 1)),
    "take_by_tensor": (lambda a, b, p, i: a[0, i[0]], A[0, I[0]]),
    "astype": (lambda a, b, p, i: (a * 10).astype("int32"), (A * 10).astype(np.int32)),
    "int_float_mix": (lambda a, b, p, i: i * 0.5, (I * 0.5).astype(np.float32)),  # JAX-style promotion
    "mod_floordiv": (lambda a, b, p, i: i % 2 + i // 2, I % 2 + I // 2),
}


@pytest.mark.parametrize("backend", ["numpy", "jax"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_numpy(name, backend):
    build, want = CASES[name]
    ctx = tp.Context(dims=("t",))
    (T,) = ctx.bounds
    with ctx:
        out = build(tp.const(A), tp.const(B), tp.const(P), tp.const(I))
    got = ctx.compile({T: 1}, [out], backend=backend).run()[out]
    ref = evaluate(ctx, {T: 1}, [out])[out.key]
    want = np.asarray(want)
    assert got.dtype == want.dtype == ref.dtype, (got.dtype, want.dtype, ref.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_tensor_indices_out_of_range_are_clamped_on_every_backend(backend):
    ctx = tp.Context(dims=("t",))
    (T,) = ctx.bounds
    with ctx:
        x = tp.const(np.array([10.0, 20.0], np.float32))
        picked = x[tp.const(np.array([0, 5, -3], np.int32))]
    got = ctx.compile({T: 1}, [picked], backend=backend).run()[picked]
    np.testing.assert_array_equal(got, np.take([10.0, 20.0], [0, 5, -3], mode="clip"))
    np.testing.assert_array_equal(evaluate(ctx, {T: 1}, [picked])[picked.key], got)


@pytest.mark.parametrize("kind,params", [
    ("eval_symbol", {"expr": None, "dtype": "int32"}),
    ("coords", {"dims": ("i", "t")}),
    ("coords", {"dims": ("i", "t"), "stacked": (0, 5)}),
])
def test_batched_point_ops_match_their_kernel_point_by_point(kind, params):
    """A point op's batched kernel (a lowered loop computes many points at once) gives,
    row by row, what its kernel gives at each point."""
    i, t, T = Symbol("i"), Symbol("t"), Symbol("T", "bound")
    params = dict(params)
    if kind == "eval_symbol":
        params["expr"] = minimum(i * T + t, 40) % 7
    if "dims" in params:
        params["dims"] = tuple(Symbol(d) for d in params["dims"])
    definition = op_def(kind)
    ts = np.arange(3, 12)
    batched = definition.batched(params, {T: 9, i: 4, t: ts}, len(ts))
    expected = np.stack([definition.kernel(params, {T: 9, i: 4, t: int(v)}) for v in ts])
    assert batched.dtype == expected.dtype
    np.testing.assert_array_equal(batched, expected)


STEP_CASES = {
    "argmax_step": lambda a, i, t: a.argmax(-1),
    "compare_step": lambda a, i, t: tp.where((a < 0.2) | (a <= -0.5) & (a != 1.0), a, -a),
    "mod_floordiv_step": lambda a, i, t: a % 0.7 + a // 0.7,
    "slice_step": lambda a, i, t: a[i, t, :, 1:],
    "take_step": lambda a, i, t: a[i, t, 1] * 2.0,
    "gather_shared_step": lambda a, i, t: tp.const(A).gather((tp.const(I) + (a > 0).astype("int32")) % 3,
                                                             dim=1),  # a shared table, per-step indices
    "draw_step": lambda a, i, t: a + tp.normal(A.shape, domain=(i, t)),  # keyed by (i, t)
}
"""Ops on a per-step value that the cases above cannot show there (their spatial indices
would name the temporal dims of such a value)."""


def _per_step_case(name: str):
    """Case ``name`` on inputs that vary with the point of ``(i, t)``, read over every step:
    the context, the output and its bounds."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I_, T_) = ctx.dims, ctx.bounds
    with ctx:
        scale = 1.0 + 0.25 * tp.symbol_value(t).astype("float32") + 0.5 * tp.symbol_value(i).astype("float32")
        try:
            if name in STEP_CASES:
                out = STEP_CASES[name](tp.const(A) * scale, i, t)
            else:
                a, b, p = (tp.const(x) * scale for x in (A, B, P))
                out = CASES[name][0](a, b, p, tp.const(I))
        except tp.TempoError:  # an index meant for a spatial dim now names a temporal one
            return ctx, None, {}
        read = out[i, 0:T_] if out.domain == (i, t) else None
    return ctx, read, {I_: 2, T_: 3}


PER_STEP = sorted(name for name in [*CASES, *STEP_CASES] if _per_step_case(name)[1] is not None)
"""The cases whose output varies with the step: not those that read only the int table, nor
those that index their input (on a value over ``(i, t)`` the index would name ``i``)."""
UNVECTORIZED = [name for name, _ in PIPELINE if name != "vectorize"]


@pytest.mark.parametrize("name", PER_STEP)
def test_op_vectorized_over_steps_matches_its_looped_form(name):
    """Each op, run once per step and, vectorized, once on all steps stacked: the same
    values, and the reference evaluator's."""
    ctx, read, bounds = _per_step_case(name)
    stacked = ctx.compile(bounds, [read], backend="jax")
    looped = ctx.compile(bounds, [read], backend="numpy", passes=UNVECTORIZED)
    assert any(n.startswith("vectorize:") and not n.startswith("vectorize: 0 ") for n in stacked.report.notes)
    ref = evaluate(ctx, bounds, [read])[read.key]
    np.testing.assert_allclose(np.asarray(stacked.run()[read]), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(looped.run()[read]), ref, rtol=1e-5, atol=1e-5)


NOT_VECTORIZED_HERE = {
    "detach": "simplify removes it before vectorize sees it",
    "scatter_take": "made by autodiff (tests/passes/test_vectorize.py differentiates through take)",
    "scatter_gather": "made by autodiff (tests/passes/test_vectorize.py differentiates through gather)",
    "pad": "made by autodiff as slice's gradient",
    "argsort": "tests/passes/test_domains.py vectorizes an epoch's permutation",
    "shard": "made by the parallel pass under a Distribution: tests/runtime/test_distribution.py "
             "and tests/rl/test_distributed.py vectorize it over the steps (a draw's coordinates)",
}


def test_every_vectorization_rule_runs_in_a_case():
    """Each op kind vectorize has a rule for appears in a per-step case above (or says why
    not), so a rule cannot be added without one."""
    from tempo.passes.vectorize import RULE_KINDS
    kinds = set()
    for name in PER_STEP:
        ctx, _, _ = _per_step_case(name)
        kinds |= {op.kind for op in ctx.graph.ops.values()}
    missing = sorted(set(RULE_KINDS) - kinds - set(NOT_VECTORIZED_HERE))
    assert not missing, f"vectorization rules no case exercises: {missing}"
    stale = sorted(set(NOT_VECTORIZED_HERE) & kinds)
    assert not stale, f"listed as not exercised here, but a case does: {stale}"
