"""Gradients through temporal dependences equal ``jax.grad`` of the same maths unrolled.

Each case builds an RT program whose leaves are constants with ``requires_grad``, and
the same computation as a plain JAX function of the leaves (loops over time written
out); the compiled gradient (both backends) and the reference evaluator's must equal
``jax.grad`` of the JAX function.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tempo as tp
from tempo.reference import evaluate

T_VALUE = 9
RNG = np.random.default_rng(0)
X0 = RNG.normal(size=T_VALUE).astype(np.float32)
W0 = RNG.normal(size=(3, 2)).astype(np.float32)
F0 = RNG.normal(size=(T_VALUE, 3)).astype(np.float32)


def running_sum(x, t, T):
    s = tp.placeholder(shape=(), dtype=x.dtype, domain=(t,))
    s[0] = x[0]
    s[t + 1] = s + x[t + 1]
    return (s * s)[0:T].sum()


def running_sum_jax(x):
    return (jnp.cumsum(x) ** 2).sum()


def two_step(x, t, T):
    f = tp.placeholder(shape=(), dtype=x.dtype, domain=(t,))
    f[0] = x[0]
    f[1] = x[1]
    f[True] = 0.6 * f[t - 1] + 0.3 * f[t - 2] * x
    return f[0:T].sum() + (f * f)[T - 1]


def two_step_jax(x):
    f = [x[0], x[1]]
    for k in range(2, T_VALUE):
        f.append(0.6 * f[k - 1] + 0.3 * f[k - 2] * x[k])
    f = jnp.stack(f)
    return f.sum() + f[-1] ** 2


def reverse(x, t, T):
    a = tp.placeholder(shape=(), dtype=x.dtype, domain=(t,))
    a[T - 1] = x[T - 1]
    a[True] = 0.9 * a[t + 1].tanh() + x
    return (a * x)[0:T].sum()


def reverse_jax(x):
    a = [None] * T_VALUE
    a[-1] = x[-1]
    for k in range(T_VALUE - 2, -1, -1):
        a[k] = 0.9 * jnp.tanh(a[k + 1]) + x[k]
    return (jnp.stack(a) * x).sum()


def backward_window(x, t, T):
    w = x[tp.max(0, t - 3):t + 1]
    return (w * w).mean()[0:T].sum()


def backward_window_jax(x):
    return sum((x[max(0, k - 3):k + 1] ** 2).mean() for k in range(T_VALUE))


def forward_window(x, t, T):
    return (x[t:tp.min(t + 3, T)].sum() ** 2)[0:T].sum()


def forward_window_jax(x):
    return sum(x[k:min(k + 3, T_VALUE)].sum() ** 2 for k in range(T_VALUE))


def causal(x, t, T):
    return (x[0:t + 1] * x).sum().sin()[0:T].sum()


def causal_jax(x):
    return sum(jnp.sin((x[:k + 1] * x[k]).sum()) for k in range(T_VALUE))


def anti_causal(x, t, T):
    g = x[t:T].discounted_sum(0.9)
    return (g * g)[0:T].sum()


def anti_causal_jax(x):
    return sum((x[k:] * 0.9 ** jnp.arange(T_VALUE - k)).sum() ** 2 for k in range(T_VALUE))


def conditional(x, t, T):
    c = tp.placeholder(shape=(), dtype=x.dtype, domain=(t,))
    c[t % 4 == 0] = x * 2.0
    c[True] = x.sin()
    return (c * c)[0:T].sum()


def conditional_jax(x):
    c = jnp.where(jnp.arange(T_VALUE) % 4 == 0, 2 * x, jnp.sin(x))
    return (c * c).sum()


def whole_range(x, t, T):
    m = x[0:T].mean()
    return ((x - m) ** 2)[0:T].sum()


def whole_range_jax(x):
    return ((x - x.mean()) ** 2).sum()


def causal_spatial(x, t, T):
    """A spatial slice of symbolic size: the first t+1 entries of the whole vector."""
    whole = x[0:T]
    return (whole[0:t + 1] ** 2).sum().sqrt()[0:T].sum()


def causal_spatial_jax(x):
    return sum(jnp.sqrt((x[:k + 1] ** 2).sum()) for k in range(T_VALUE))


PATTERNS = {
    "running sum": (running_sum, running_sum_jax),
    "two-step recurrence": (two_step, two_step_jax),
    "reverse recursion": (reverse, reverse_jax),
    "backward window": (backward_window, backward_window_jax),
    "forward window": (forward_window, forward_window_jax),
    "causal": (causal, causal_jax),
    "anti-causal discounted": (anti_causal, anti_causal_jax),
    "conditional branches": (conditional, conditional_jax),
    "whole-range reduction": (whole_range, whole_range_jax),
    "spatial slice of symbolic size": (causal_spatial, causal_spatial_jax),
}


def _compiled_and_reference(ctx, bounds, outputs):
    results = [ctx.compile(bounds=bounds, outputs=outputs, backend=b).run() for b in ("numpy", "jax")]
    reference = evaluate(ctx, bounds, outputs)
    return [{rt.key: r[rt] for rt in outputs} for r in results] + [reference]


@pytest.mark.parametrize("dims", [("t",), ("i", "t")])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_gradient_of_pattern_equals_jax(name, dims):
    """Also inside a context of two dims, where the passes vectorize ``t``."""
    build, jax_fn = PATTERNS[name]
    ctx = tp.Context(dims=dims)
    t, T = ctx.dims[-1], ctx.bounds[-1]
    with ctx:
        leaf = tp.const(X0, requires_grad=True)
        loss = build(leaf[t], t, T)
        loss.backward()
    expected = np.asarray(jax.grad(jax_fn)(jnp.asarray(X0)))
    bounds = {T: T_VALUE, **{b: 2 for b in ctx.bounds[:-1]}}
    for got in _compiled_and_reference(ctx, bounds, [leaf.grad]):
        np.testing.assert_allclose(got[leaf.grad.key], expected, rtol=2e-5, atol=2e-5)


def test_matmul_per_step():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(W0, requires_grad=True)
        feats = tp.const(F0, requires_grad=True)
        h = (feats[t] @ w).tanh()
        loss = (h * h).sum()[0:T].sum()
        loss.backward()

    def jax_loss(w, f):
        return (jnp.tanh(f @ w) ** 2).sum()
    gw, gf = jax.grad(jax_loss, argnums=(0, 1))(jnp.asarray(W0), jnp.asarray(F0))
    for got in _compiled_and_reference(ctx, {T: T_VALUE}, [w.grad, feats.grad]):
        np.testing.assert_allclose(got[w.grad.key], gw, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(got[feats.grad.key], gf, rtol=2e-5, atol=2e-5)


X_IT = RNG.normal(size=(3, T_VALUE)).astype(np.float32)


def _nested(ctx):
    i, t = ctx.dims
    I, T = ctx.bounds
    x = tp.const(X_IT, requires_grad=True)
    v = x[i, t]
    y = tp.placeholder(shape=(), domain=(i, t))
    y[i, 0] = v
    y[i, t + 1] = 0.5 * y.tanh() + v[i, t + 1]
    return x, y


def _nested_jax(x):
    ys = []
    for row in x:
        y = [row[0]]
        for k in range(1, T_VALUE):
            y.append(0.5 * jnp.tanh(y[-1]) + row[k])
        ys.append(jnp.stack(y))
    return jnp.stack(ys)


def test_nested_dims_with_reset_total_loss():
    ctx = tp.Context(dims=("i", "t"))
    I, T = ctx.bounds
    with ctx:
        x, y = _nested(ctx)
        loss = (y * y)[0:I, 0:T].sum()
        loss.backward()
    expected = jax.grad(lambda x: (_nested_jax(x) ** 2).sum())(jnp.asarray(X_IT))
    for got in _compiled_and_reference(ctx, {I: 3, T: T_VALUE}, [x.grad]):
        np.testing.assert_allclose(got[x.grad.key], expected, rtol=2e-5, atol=2e-5)


def test_loss_with_a_domain_is_one_objective_per_point():
    """loss[i] gives grad[i] = d loss[i] / d x: the gradient gains the loss's dims."""
    ctx = tp.Context(dims=("i", "t"))
    i, _ = ctx.dims
    I, T = ctx.bounds
    with ctx:
        x, y = _nested(ctx)
        loss = (y * y)[i, 0:T].sum() * (1.0 + tp.symbol_value(i).astype("float32"))
        loss.backward()
        assert x.grad.domain == (i,)
    expected = np.stack([
        jax.grad(lambda x, k=k: (_nested_jax(x)[k] ** 2).sum() * (1.0 + k))(jnp.asarray(X_IT))
        for k in range(3)])
    for got in _compiled_and_reference(ctx, {I: 3, T: T_VALUE}, [x.grad]):
        np.testing.assert_allclose(got[x.grad.key], expected, rtol=2e-5, atol=2e-5)


def test_gradient_through_gather_and_reductions():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    idx = np.array([[2, 0], [1, 1], [0, 2]], np.int32)
    with ctx:
        w = tp.const(W0.T.copy(), requires_grad=True)  # (2, 3)
        logits = w * tp.symbol_value(t).astype("float32")
        picked = logits.log_softmax(-1).gather(tp.const(idx.T.copy()), dim=-1)
        loss = (picked.sum() + logits.max() - logits.min(0).sum())[0:T].sum()
        loss.backward()

    def jax_loss(w):
        total = 0.0
        for k in range(T_VALUE):
            lg = w * k
            picked = jnp.take_along_axis(jax.nn.log_softmax(lg, -1), jnp.asarray(idx.T), -1)
            total += picked.sum() + lg.max() - lg.min(0).sum()
        return total
    expected = jax.grad(jax_loss)(jnp.asarray(W0.T))
    for got in _compiled_and_reference(ctx, {T: T_VALUE}, [w.grad]):
        np.testing.assert_allclose(got[w.grad.key], expected, rtol=1e-4, atol=1e-4)


def test_finite_differences_agree():
    """Central differences in float64 on the reference evaluator, for two patterns."""
    for build in (anti_causal, reverse):
        ctx = tp.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            leaf = tp.const(X0.astype(np.float64), dtype="float64", requires_grad=True)
            loss = build(leaf[t], t, T)
            loss.backward()
        grad = evaluate(ctx, {T: T_VALUE}, [leaf.grad])[leaf.grad.key]
        eps = 1e-6
        for k in (0, 4, T_VALUE - 1):
            values = []
            for sign in (1, -1):
                x = X0.astype(np.float64).copy()
                x[k] += sign * eps
                c2 = tp.Context(dims=("t",))
                (t2,), (T2,) = c2.dims, c2.bounds
                with c2:
                    out = build(tp.const(x, dtype="float64")[t2], t2, T2)
                values.append(float(evaluate(c2, {T2: T_VALUE}, [out])[out.key]))
            assert grad[k] == pytest.approx((values[0] - values[1]) / (2 * eps), rel=1e-5, abs=1e-7)


def test_detach_stops_the_gradient():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(X0, requires_grad=True)
        v = x[t]
        loss = (v * v.detach())[0:T].sum()
        loss.backward()
    got = ctx.compile(bounds={T: T_VALUE}, outputs=[x.grad], backend="numpy").run()[x.grad]
    np.testing.assert_allclose(got, X0, rtol=1e-6)


def test_gradient_through_a_udf_is_a_clear_error():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(X0, requires_grad=True)
        (y,) = tp.udf(lambda v: v * 2, [x[t]], [((), "float32")], name="double")
        loss = y[0:T].sum()
        with pytest.raises(tp.TempoError, match="UDF double"):
            loss.backward()


def test_grad_before_backward_is_a_clear_error():
    ctx = tp.Context(dims=("t",))
    with ctx:
        x = tp.const(X0, requires_grad=True)
        y = tp.const(X0)
        with pytest.raises(tp.TempoError, match="call backward"):
            _ = x.grad
        with pytest.raises(tp.TempoError, match="does not require grad"):
            _ = y.grad
        with pytest.raises(tp.TempoError, match="scalar loss"):
            x.backward()


def test_sampled_actions_end_the_gradient_path_into_a_udf():
    """logits -> argmax -> UDF -> back into the loss: argmax has no gradient, so the UDF is
    not on a differentiable path and backward() works (the policy-gradient shape)."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(W0, requires_grad=True)                      # (3, 2)
        logits = tp.const(F0)[t] @ w                             # (2,)
        action = logits.argmax(-1)
        (reward,) = tp.udf(lambda a: np.float32(a + 1), [action], [((), "float32")], name="env")
        loss = (logits.log_softmax(-1).max() * reward)[0:T].sum()
        loss.backward()
    got = ctx.compile(bounds={T: T_VALUE}, outputs=[w.grad], backend="numpy").run()[w.grad]

    def jax_loss(w):
        lg = jnp.asarray(F0) @ w
        r = jnp.argmax(lg, -1).astype(jnp.float32) + 1
        return (jax.nn.log_softmax(lg, -1).max(-1) * r).sum()
    np.testing.assert_allclose(got, jax.grad(jax_loss)(jnp.asarray(W0)), rtol=1e-5, atol=1e-6)
