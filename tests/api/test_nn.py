"""nn modules: gradients equal jax.grad, initializers have their defining properties, and
an MLP trains end to end through the compiled pipeline."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tempo as tp
from tempo.api import nn, optim
from tempo.reference import evaluate

RNG = np.random.default_rng(3)
X = RNG.normal(size=(5, 4)).astype(np.float32)


def _value(module_param):
    return module_param.initial.op.params["value"]


@pytest.mark.parametrize("act", ["relu", "tanh", "gelu", "silu"])
def test_activations_and_their_gradients_match_jax(act):
    ctx = tp.Context(dims=("t",))
    with ctx:
        x = tp.const(X, requires_grad=True)
        y = nn.get_activation(act)(x)
        (y * y).sum().backward()
    res = ctx.compile(bounds={}, outputs=[y, x.grad], backend="numpy").run()
    fn = {"relu": jax.nn.relu, "tanh": jnp.tanh, "gelu": jax.nn.gelu, "silu": jax.nn.silu}[act]
    np.testing.assert_allclose(res[y], fn(X), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res[x.grad], jax.grad(lambda v: (fn(v) ** 2).sum())(X),
                               rtol=1e-4, atol=1e-5)


def test_layers_gradients_match_jax():
    """Linear → LayerNorm → gelu → RMSNorm, plus an embedding lookup, vs the same in JAX."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    tokens = np.array([3, 1, 4, 1, 5, 0], np.int32)
    with ctx:
        lin = nn.Linear(4, 6, init=nn.xavier_uniform())
        ln, rms = nn.LayerNorm(6), nn.RMSNorm(6)
        emb = nn.Embedding(7, 6)
        h = rms(nn.gelu(ln(lin(tp.const(X)[t % 5]))))
        h = h + emb(tp.const(tokens)[t])
        loss = (h * h).sum()[0:T].sum()
        loss.backward()
    params = {"w": _value(lin._params["weight"]), "b": _value(lin._params["bias"]),
              "ls": _value(ln._params["scale"]), "lb": _value(ln._params["shift"]),
              "rs": _value(rms._params["scale"]), "e": _value(emb._params["weight"])}

    def jax_loss(p):
        total = 0.0
        for k in range(6):
            z = X[k % 5] @ p["w"] + p["b"]
            z = (z - z.mean()) / jnp.sqrt(z.var() + 1e-5) * p["ls"] + p["lb"]
            z = jax.nn.gelu(z)
            z = z / jnp.sqrt((z * z).mean() + 1e-6) * p["rs"]
            z = z + p["e"][tokens[k]]
            total += (z * z).sum()
        return total
    expected = jax.grad(jax_loss)(params)
    grads = {"w": lin.weight.grad, "b": lin.bias.grad, "ls": ln.scale.grad, "lb": ln.shift.grad,
             "rs": rms.scale.grad, "e": emb.weight.grad}
    got = ctx.compile(bounds={T: 6}, outputs=list(grads.values()), backend="jax").run()
    ref = evaluate(ctx, {T: 6}, list(grads.values()))
    for k, g in grads.items():
        np.testing.assert_allclose(got[g], expected[k], rtol=1e-4, atol=1e-5, err_msg=k)
        np.testing.assert_allclose(ref[g.key], expected[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_orthogonal_init_is_orthogonal_with_gain():
    rng = np.random.default_rng(0)
    for shape in ((8, 3), (3, 8), (5, 5)):
        w = nn.orthogonal(gain=2.0)(shape, rng)
        small = min(shape)
        gram = w.T @ w if shape[0] >= shape[1] else w @ w.T
        np.testing.assert_allclose(gram, 4.0 * np.eye(small), atol=1e-10)


def test_xavier_and_uniform_bounds():
    rng = np.random.default_rng(0)
    w = nn.xavier_uniform()((100, 50), rng)
    bound = np.sqrt(6 / 150)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    u = nn.uniform(-0.1, 0.3)((1000,), rng)
    assert u.min() >= -0.1 and u.max() <= 0.3 and abs(u.mean() - 0.1) < 0.01


def test_same_seed_same_initial_parameters():
    def init(seed):
        ctx = tp.Context(dims=("i",), seed=seed)
        with ctx:
            return [_value(p).copy() for _, p in nn.MLP(3, [4], 2).named_parameters()]
    a, b, c = init(0), init(0), init(1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def test_mlp_flattens_inputs_of_its_input_shape():
    """``MLP((2, 2), ...)`` on ``(5, 2, 2)`` inputs: the same as its layers on ``(5, 4)``."""
    ctx = tp.Context(dims=("i",))
    (I,) = ctx.bounds
    with ctx:
        mlp = nn.MLP((2, 2), [3], 2)
        y = mlp(tp.const(X.reshape(5, 2, 2)))
    (w0, b0), (w1, b1) = [(layer.weight.op.params["value"], layer.bias.op.params["value"])
                          for layer in mlp.layers]  # no domain: parameters are constants
    expected = np.tanh(X @ w0 + b0) @ w1 + b1
    np.testing.assert_allclose(ctx.compile({I: 1}, [y], backend="numpy").run()[y], expected,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_mlp_fits_sine(backend):
    """The supervised example: an MLP fits y = sin(x) on 256 points, trained end to end as an
    RT program over the iteration dim (parameters and Adam state are cycles over i)."""
    x = np.linspace(-np.pi, np.pi, 256, dtype=np.float32)[:, None]
    ctx = tp.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        model = nn.MLP(1, [32, 32], 1, activation="tanh", domain=(i,))
        loss = ((model(tp.const(x)) - tp.const(np.sin(x))) ** 2).mean()
        loss.backward()
        optim.Adam(model.parameters(), lr=1e-2).step()
    losses = ctx.compile(bounds={I: 300}, outputs=[loss], backend=backend).run()[loss]
    assert losses[0] > 0.1
    assert losses[-1] < 0.01
