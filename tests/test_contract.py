"""The user-facing contract (docs/programming-model.md): the example program, as written,
gives the right values.

Expected values are computed here with plain NumPy, and also compared with the reference
evaluator; nothing is copied from the output of the code under test.
"""

import numpy as np
import pytest

import tempo as tp
from tempo.reference import evaluate

BACKENDS = ("numpy", "jax")


def discounted_suffix_sums(x: np.ndarray, gamma: float) -> np.ndarray:
    """``g[t] = sum_k gamma**k * x[t+k]`` for ``k = 0 .. len(x)-1-t``, by a plain loop."""
    n = len(x)
    out = np.zeros(n, np.float64)
    for t in range(n):
        out[t] = sum(gamma ** k * float(x[t + k]) for k in range(n - t))
    return out


def backward_window_means(x: np.ndarray, width: int) -> np.ndarray:
    return np.array([x[max(0, t - width + 1):t + 1].mean() for t in range(len(x))])


@pytest.mark.parametrize("backend", BACKENDS)
def test_contract_example(backend):
    ctx = tp.Context(dims=("i", "t"))      # temporal dims, outermost first
    i, t = ctx.dims                        # index symbols
    I, T = ctx.bounds                      # their upper bounds, also symbols
    with ctx:
        x = tp.const(np.arange(100, dtype=np.float32))[t]   # a spatial index by a symbol
        k = tp.symbol_value(t)                               # int RT, value t at each t

        s = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        s[0] = x[0]                       # base case: s at t=0
        s[t + 1] = s + x[t + 1]           # s[t+1] = s[t] + x[t+1]

        g = x[t:T].discounted_sum(0.9)    # anti-causal
        w = x[tp.max(0, t - 3):t + 1].mean()   # backward window
        c = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        c[t % 5 == 0] = x * 2.0           # conditional branches: first that holds wins
        c[True] = x

        exe = ctx.compile(bounds={I: 1, T: 100}, outputs=[s, g, w, c], backend=backend)
        res = exe.run()
        res[s]

    # what the contract says about the RTs themselves
    assert x.domain == (t,) and x.shape == ()
    assert k.domain == (t,) and k.dtype.startswith("int")
    assert s.domain == (t,) and g.domain == (t,) and w.domain == (t,) and c.domain == (t,)

    xs = np.arange(100, dtype=np.float64)
    expected = {
        s: np.cumsum(xs),
        g: discounted_suffix_sums(xs, 0.9),
        w: backward_window_means(xs, 4),
        c: np.where(np.arange(100) % 5 == 0, 2.0 * xs, xs),
    }
    ref = evaluate(ctx, {I: 1, T: 100}, [s, g, w, c])
    for rt, want in expected.items():
        got = res[rt]
        assert isinstance(got, np.ndarray)
        assert got.shape == (100,)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(ref[rt.key], want, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(got, ref[rt.key], rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_contract_gradient_example(backend):
    """The gradient part of the contract: loss = sum_t |ones(3) @ W|^2, so dloss/dW =
    sum_t 2 * outer(ones(3), ones(3) @ W) = 2 * 100 * outer(ones, [3, 3]) = 600 everywhere."""
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        wgt = tp.const(np.ones((3, 2), np.float32), requires_grad=True)
        h = tp.const(np.ones((100, 3), np.float32))[t] @ wgt      # shape (2,), domain (t,)
        loss = (h * h).sum()[0:T].sum()   # spatial sum, then over all t
        loss.backward()
        res = ctx.compile(bounds={I: 1, T: 100}, outputs=[wgt.grad], backend=backend).run()
        res[wgt.grad]                     # numpy array of shape (3, 2)
    rows = np.ones((100, 3))
    expected = sum(2.0 * np.outer(r, r @ np.ones((3, 2))) for r in rows)
    assert res[wgt.grad].shape == (3, 2)
    np.testing.assert_allclose(res[wgt.grad], expected, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_symbol_value_is_the_index(backend):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        k = tp.symbol_value(t)
        k2 = k * 3 + 1
    res = ctx.compile(bounds={T: 7}, outputs=[k, k2], backend=backend).run()
    np.testing.assert_array_equal(res[k], np.arange(7))
    np.testing.assert_array_equal(res[k2], 3 * np.arange(7) + 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_with_two_dims_has_shape_bounds_then_spatial(backend):
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    n_i, n_t = 3, 5
    data = np.random.default_rng(0).standard_normal((n_i, n_t, 2)).astype(np.float32)
    with ctx:
        x = tp.const(data)[i, t]          # spatial indices by symbols: domain (i, t), shape (2,)
        y = x * 2.0 + tp.symbol_value(i).astype("float32")
        z = (x * x).sum()                 # spatial sum: shape (), domain (i, t)
    assert x.domain == (i, t) and x.shape == (2,)
    bounds = {I: n_i, T: n_t}
    res = ctx.compile(bounds=bounds, outputs=[x, y, z], backend=backend).run()
    ref = evaluate(ctx, bounds, [x, y, z])

    want_y = data * 2.0 + np.arange(n_i, dtype=np.float32)[:, None, None]
    want_z = (data.astype(np.float64) ** 2).sum(-1)
    assert res[x].shape == (n_i, n_t, 2)
    assert res[y].shape == (n_i, n_t, 2)
    assert res[z].shape == (n_i, n_t)
    np.testing.assert_allclose(res[x], data)
    np.testing.assert_allclose(res[y], want_y, rtol=1e-6)
    np.testing.assert_allclose(res[z], want_z, rtol=1e-5)
    for rt in (x, y, z):
        np.testing.assert_allclose(res[rt], ref[rt.key], rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_domain_is_kept_in_context_order(backend):
    """An RT indexed by t then combined with one indexed by i has domain (i, t): output (I, T)."""
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        a = tp.const(np.arange(4, dtype=np.float32))[t]          # domain (t,)
        b = tp.const(np.array([10.0, 20.0], np.float32))[i]      # domain (i,)
        y = a + b
    assert y.domain == (i, t)
    res = ctx.compile(bounds={I: 2, T: 4}, outputs=[y, a, b], backend=backend).run()
    want = np.array([10.0, 20.0])[:, None] + np.arange(4.0)[None, :]
    assert res[y].shape == (2, 4)
    np.testing.assert_allclose(res[y], want)
    assert res[a].shape == (4,) and res[b].shape == (2,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sink_sees_every_point_with_its_value(backend):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    seen = []
    with ctx:
        x = tp.const(np.arange(6, dtype=np.float32) ** 2)[t]
        tp.sink(x + 1.0, lambda value, point: seen.append((point["t"], float(np.asarray(value)))))
    ctx.compile(bounds={T: 6}, outputs=[], backend=backend).run()
    assert sorted(seen) == [(k, float(k * k + 1)) for k in range(6)]
