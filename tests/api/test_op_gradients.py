"""Each op's gradient rule alone: the gradient of a small loss through the op, compiled on
both backends and on the reference evaluator, equals ``jax.grad`` of the same NumPy-style
expression. Every op with a gradient rule has a case here (or a reason not to), so a rule
cannot be added untested."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tempo as tp
from tempo.api.autodiff import VJPS, _no_grad
from tempo.errors import GradientError
from tempo.reference import evaluate

RNG = np.random.default_rng(3)
X = RNG.normal(size=(2, 3)).astype(np.float32)
Y = RNG.normal(size=(3, 2)).astype(np.float32)
P = (np.abs(RNG.normal(size=(2, 3))) + 0.5).astype(np.float32)
IDX = np.array([[2, 0, 1], [1, 1, 0]], np.int32)

# op -> (build(x, y, p) -> RT, the same with jax.numpy); x and y are the leaves differentiated
CASES = {
    "add": (lambda x, y, p: x + y.permute(1, 0), lambda x, y, p: x + y.T),
    "sub": (lambda x, y, p: x - 2.0 * y.permute(1, 0), lambda x, y, p: x - 2.0 * y.T),
    "mul": (lambda x, y, p: x * y.permute(1, 0), lambda x, y, p: x * y.T),
    "div": (lambda x, y, p: x / (y.permute(1, 0).abs() + 0.5), lambda x, y, p: x / (jnp.abs(y.T) + 0.5)),
    "pow": (lambda x, y, p: p ** x + x ** 2, lambda x, y, p: p ** x + x ** 2),
    "maximum": (lambda x, y, p: tp.max(x, y.permute(1, 0)), lambda x, y, p: jnp.maximum(x, y.T)),
    "minimum": (lambda x, y, p: tp.min(x, y.permute(1, 0)), lambda x, y, p: jnp.minimum(x, y.T)),
    "mod": (lambda x, y, p: x % p, lambda x, y, p: jnp.mod(x, p)),
    "neg": (lambda x, y, p: -x, lambda x, y, p: -x),
    "exp": (lambda x, y, p: x.exp(), lambda x, y, p: jnp.exp(x)),
    "log": (lambda x, y, p: (x * x + 0.5).log(), lambda x, y, p: jnp.log(x * x + 0.5)),
    "tanh": (lambda x, y, p: x.tanh(), lambda x, y, p: jnp.tanh(x)),
    "sqrt": (lambda x, y, p: (x * x + 0.5).sqrt(), lambda x, y, p: jnp.sqrt(x * x + 0.5)),
    "abs": (lambda x, y, p: x.abs(), lambda x, y, p: jnp.abs(x)),
    "sin": (lambda x, y, p: x.sin(), lambda x, y, p: jnp.sin(x)),
    "cos": (lambda x, y, p: x.cos(), lambda x, y, p: jnp.cos(x)),
    "where": (lambda x, y, p: tp.where(x > 0, x, 2.0 * y.permute(1, 0)),
              lambda x, y, p: jnp.where(x > 0, x, 2.0 * y.T)),
    "matmul": (lambda x, y, p: x @ y, lambda x, y, p: x @ y),
    "reduce_sum": (lambda x, y, p: x.sum(1), lambda x, y, p: x.sum(1)),
    "reduce_mean": (lambda x, y, p: x.mean(0), lambda x, y, p: x.mean(0)),
    "reduce_max": (lambda x, y, p: x.max(1), lambda x, y, p: x.max(1)),
    "reduce_min": (lambda x, y, p: x.min(0), lambda x, y, p: x.min(0)),
    "cumsum": (lambda x, y, p: x.cumsum(1), lambda x, y, p: jnp.cumsum(x, 1)),
    "discounted_sum": (lambda x, y, p: x.discounted_sum(0.5, dim=1),
                       lambda x, y, p: (x * 0.5 ** jnp.arange(3)).sum(1)),
    "reshape": (lambda x, y, p: x.reshape(3, 2) * y, lambda x, y, p: x.reshape(3, 2) * y),
    "permute": (lambda x, y, p: x.permute(1, 0) * y, lambda x, y, p: x.T * y),
    "expand": (lambda x, y, p: x.sum(0, keepdim=True).expand(4, 3),
               lambda x, y, p: jnp.broadcast_to(x.sum(0, keepdims=True), (4, 3))),
    "squeeze": (lambda x, y, p: x.sum(1, keepdim=True).squeeze(1), lambda x, y, p: x.sum(1)),
    "unsqueeze": (lambda x, y, p: x.unsqueeze(0) * y.permute(1, 0),
                  lambda x, y, p: x[None] * y.T),
    "cat": (lambda x, y, p: tp.cat([x, y.permute(1, 0) * 3.0], dim=0),
            lambda x, y, p: jnp.concatenate([x, y.T * 3.0], 0)),
    "stack": (lambda x, y, p: tp.stack([x, y.permute(1, 0) * 3.0], dim=1),
              lambda x, y, p: jnp.stack([x, y.T * 3.0], 1)),
    "slice": (lambda x, y, p: x[:, 1:], lambda x, y, p: x[:, 1:]),
    "pad": (lambda x, y, p: x.apply("pad", dim=1, before=1, after=2),
            lambda x, y, p: jnp.pad(x, ((0, 0), (1, 2)))),
    "take": (lambda x, y, p: x[1] * 2.0 + x[0, tp.const(IDX[0])], lambda x, y, p: x[1] * 2.0 + x[0, IDX[0]]),
    "gather": (lambda x, y, p: x.gather(tp.const(IDX), dim=1),
               lambda x, y, p: jnp.take_along_axis(x, IDX, 1)),
}
NOT_HERE = {
    "identity": "a temporal read: every case's loss reads its steps through one ([0:T])",
    "astype": "float-to-float casts need float64, off in JAX's default config "
              "(tests/api/test_autodiff.py's finite differences run in float64)",
    "reduce_prod": "its rule refuses, saying what to write instead (the test below)",
}


def test_a_product_refuses_its_gradient_and_says_what_to_write():
    ctx = tp.Context(dims=("t",))
    with ctx:
        x = tp.const(P, requires_grad=True)
        loss = x.prod(1).sum()
        with pytest.raises(GradientError, match=r"exp\(log\(x\).sum\(\)\)"):
            loss.backward()


def test_every_gradient_rule_has_a_case():
    rules = {k for k, rule in VJPS.items() if rule is not _no_grad}
    missing = sorted(rules - set(CASES) - set(NOT_HERE))
    assert not missing, f"gradient rules without a case: {missing}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_rule_equals_jax(name):
    build, reference = CASES[name]
    weights = RNG.normal(size=np.shape(reference(X, Y, P))).astype(np.float32)
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(X, requires_grad=True)
        y = tp.const(Y, requires_grad=True)
        step = tp.symbol_value(t).astype("float32") + 1.0  # each of the T=2 steps weighs in
        loss = ((build(x, y, tp.const(P)) * tp.const(weights)).sum() * step)[0:T].sum()
        loss.backward()
    expected = jax.grad(lambda a, b: 3.0 * (reference(a, b, P) * weights).sum(), argnums=(0, 1))(
        jnp.asarray(X), jnp.asarray(Y))
    grads = [_grad(leaf) for leaf in (x, y)]
    outputs = [g for g in grads if g is not None]
    reference_values = evaluate(ctx, {T: 2}, outputs)
    runs = [ctx.compile({T: 2}, outputs, backend=backend).run() for backend in ("numpy", "jax")]
    for grad, want in zip(grads, expected):
        if grad is None:  # the loss does not read this leaf
            assert not np.any(want), f"{name}: no gradient for a leaf JAX differentiates"
            continue
        for value in (reference_values[grad.key], *(run[grad] for run in runs)):
            np.testing.assert_allclose(np.asarray(value), want, rtol=2e-5, atol=2e-5, err_msg=name)


def _grad(leaf):
    try:
        return leaf.grad
    except tp.TempoError:  # "has no gradient": the loss does not depend on it
        return None
