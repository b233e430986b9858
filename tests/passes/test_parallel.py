"""Parallel dims laid out spatially (``tempo.passes.parallel``): every op over the env dim
``b`` runs once for all envs, with the results of the program compiled without passes and
of the reference evaluator (and, for a gradient, of plain NumPy)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import tempo as tp
from tempo.api import nn, optim
from tempo.api.distributions import Categorical
from tempo.errors import DomainError
from tempo.reference import evaluate

B_VALUE, I_VALUE, T_VALUE, H = 3, 2, 5, 4
RNG = np.random.default_rng(5)
XS = RNG.normal(size=(B_VALUE, I_VALUE, T_VALUE, H)).astype(np.float32)
W = RNG.normal(size=(H, H)).astype(np.float32)


def _context(dims=("b", "i", "t")):
    ctx = tp.Context(dims=dims, seed=3, parallel=("b",))
    return ctx, ctx.dims, ctx.bounds


def _bounds(ctx):
    return dict(zip(ctx.bounds, (B_VALUE, I_VALUE, T_VALUE)))


def _laid_out(exe) -> int:
    """How many ops the pass laid out over ``b`` (0 when ``b`` stayed a loop)."""
    note = next(n for n in exe.report.notes if n.startswith("parallel"))
    return 0 if "stays a loop" in note else int(note.split()[1])


def _check(ctx, outputs, backend="numpy", passes=None, rtol=1e-5):
    """The run with ``passes`` and the run without any equal the reference; returns the
    executable with passes."""
    bounds = _bounds(ctx)
    exe = ctx.compile(bounds, outputs, backend=backend, passes=passes)
    got = exe.run()
    plain = ctx.compile(bounds, outputs, backend=backend, passes=()).run()
    ref = evaluate(ctx, bounds, outputs)
    for rt in outputs:
        np.testing.assert_allclose(np.asarray(got[rt]), ref[rt.key], rtol=rtol, atol=1e-5)
        np.testing.assert_allclose(np.asarray(plain[rt]), ref[rt.key], rtol=rtol, atol=1e-5)
    return exe


def _no_op_over_b(exe) -> bool:
    return not any(d.name == "b" for op in exe.graph.ops.values() for d in op.domain)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_an_actor_learner_over_envs_runs_every_env_at_once(backend):
    """A policy acting in ``B`` envs (a recurrence over ``t`` with random draws), returns
    over windows of each env's steps, a loss over every env's steps and an Adam step: no
    op keeps ``b``, and the run equals the per-env one."""
    ctx, (b, i, t), (B, I, T) = _context()
    with ctx:
        policy = nn.MLP((H,), (8,), 2, domain=(i,))
        obs = tp.placeholder(shape=(H,), dtype="float32", domain=(b, i, t))
        obs[b, i, 0] = tp.normal((H,), domain=(b, i))
        dist = Categorical(policy(obs))
        action = dist.sample()
        obs[b, i, t + 1] = obs * 0.9 + action.astype("float32")
        reward = (action == 1).astype("float32")
        returns = reward[b, i, t:T].discounted_sum(0.9)
        loss = -(dist.log_prob(action) * returns)[0:B, i, 0:T].mean()
        loss.backward()
        optim.Adam(policy.parameters(), lr=1e-2).step()
    exe = _check(ctx, [loss, returns], backend, rtol=1e-4)
    assert _laid_out(exe) > 0 and _no_op_over_b(exe)


def test_random_draws_are_the_per_env_draws():
    """A laid-out draw is, row by row, the draw at each env's point."""
    ctx, (b, i, t), _ = _context()
    with ctx:
        u = tp.uniform((2, 3), domain=(b, i, t))
        n = tp.normal((), domain=(b, i))
        k = tp.randint(0, 100, (4,), domain=(b, t))
    exe = _check(ctx, [u, n, k], passes=["parallel"])
    assert _laid_out(exe) == 6  # three draws and their coordinates


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_reads_from_outside_the_env_dim(backend):
    """Ops without ``b`` read a laid-out value whole, in part, at one env, and with windows
    of other dims (the stacked axis moves to where the window over ``b`` was)."""
    ctx, (b, i, t), (B, I, T) = _context()
    with ctx:
        x = tp.const(XS)[b, i, t] @ tp.const(W)
        whole = x[0:B, i, 0:T].sum(0)  # (T, H): envs summed
        part = x[1:B, i, t].sum(0)
        first = x[0, i, t]
        later = x[b, i, t:T].sum(0)  # a window of t within each env
    exe = _check(ctx, [whole, part, first, later], backend, passes=["parallel"])
    assert _laid_out(exe) > 0 and _no_op_over_b(exe)


def test_env_ops_read_values_without_the_env_dim():
    """A value over ``(i, t)`` read by every env (shared statistics) broadcasts, and a
    row of lower rank gains unit dims."""
    ctx, (b, i, t), (B, I, T) = _context()
    with ctx:
        x = tp.const(XS)[b, i, t]
        mean = x[0:B, i, t].mean(0)
        scale = x.sum()  # a scalar per env
        y = (x - mean) * scale
    _check(ctx, [y], passes=["parallel"])


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_traceable_udf_is_vmapped(backend):
    """A JAX function of one env (rows mapped, a shared input not)."""
    ctx, (b, i, t), _ = _context()

    def step(x, w):
        return jnp.tanh(x @ w), x.sum()
    with ctx:
        x = tp.const(XS)[b, i, t]
        y, s = tp.udf(step, [x, tp.const(W)], traceable=True, name="env_step")
    exe = _check(ctx, [y, s], backend, passes=["parallel"])
    assert any(op.kind == "traced_udf" and [d.name for d in op.domain] == ["i", "t"]
               for op in exe.graph.ops.values())


def test_a_host_udf_runs_its_batched_form_once_per_point_of_the_other_dims():
    calls = {"one": 0, "all": 0}

    def one(point, x):
        calls["one"] += 1
        return x * 2.0 + point["b"]

    def every(point, x):
        calls["all"] += 1
        assert "b" not in point and x.shape == (B_VALUE, H)
        return x * 2.0 + np.arange(B_VALUE, dtype=np.float32)[:, None]
    ctx, (b, i, t), _ = _context()
    with ctx:
        (y,) = tp.udf(one, [tp.const(XS)[b, i, t]], [((H,), "float32")], pass_point=True,
                      batched=every)
        out = y + 1.0
    bounds = _bounds(ctx)
    got = ctx.compile(bounds, [out], passes=["parallel"]).run()
    assert calls == {"one": 0, "all": I_VALUE * T_VALUE}
    expected = XS * 2.0 + np.arange(B_VALUE)[:, None, None, None] + 1.0
    np.testing.assert_allclose(got[out], expected, rtol=1e-6)


def test_a_host_udf_without_a_batched_form_keeps_the_env_loop():
    """The dim stays a loop (the report names the op); the program is still correct."""
    ctx, (b, i, t), _ = _context()
    with ctx:
        (y,) = tp.udf(lambda x: x * 2.0, [tp.const(XS)[b, i, t]], [((H,), "float32")],
                      name="log_env")
        out = y + 1.0
    exe = _check(ctx, [out], passes=["parallel"])
    note = next(n for n in exe.report.notes if n.startswith("parallel"))
    assert "b stays a loop" in note and "log_env" in note


def test_a_gradient_over_every_env_is_the_sum_over_envs():
    """``d/dw mean_b (w . x_b)^2 = 2/B sum_b (w . x_b) x_b``, known mathematics."""
    ctx, (b, i), (B, I) = _context(("b", "i"))
    x_value = XS[:, 0, 0]
    w_value = RNG.normal(size=(H,)).astype(np.float32)
    with ctx:
        w = tp.const(w_value, requires_grad=True)
        x = tp.const(x_value)[b]
        loss = ((x * w).sum() ** 2)[0:B].mean()
        loss.backward()
        grad = w.grad
    bounds = {B: B_VALUE, I: 1}
    exe = ctx.compile(bounds, [grad], passes=["parallel"])
    assert _laid_out(exe) > 0
    expected = 2.0 / B_VALUE * ((x_value @ w_value)[:, None] * x_value).sum(0)
    np.testing.assert_allclose(exe.run()[grad], expected, rtol=1e-5)


def test_reading_another_env_is_an_error_naming_the_tensor():
    ctx, (b, i, t), (B, I, T) = _context()
    with ctx:
        x = tp.const(XS)[b, i, t]
        y = x[b - 1, i, t] + 1.0  # noqa: F841 (the read is the error)
        out = y.sum()
    with pytest.raises(DomainError, match=r"b is a parallel dim") as err:
        ctx.compile(_bounds(ctx), [out])
    assert "test_parallel.py" in str(err.value)


def test_a_parallel_dim_must_be_a_dim():
    with pytest.raises(DomainError, match="not dims"):
        tp.Context(dims=("i", "t"), parallel=("b",))


def test_every_env_reading_one_env_through_a_copy():
    """``y[0, t]`` is a copy over ``(t,)``; the copies pass makes ops over ``b`` read ``y``
    at ``b = 0`` directly, which is a read shared by every env, not a row."""
    ctx, (b, t), (B, T) = _context(("b", "t"))
    with ctx:
        y = tp.const(XS[:, 0])[b, t] * 0.5
        z = y + y[0, t]
    exe = _check(ctx, [z])
    assert _laid_out(exe) > 0 and _no_op_over_b(exe)


def test_every_env_starting_from_one_state():
    """A placeholder's branch without ``b`` (a shared initial state) is broadcast."""
    ctx, (b, t), (B, T) = _context(("b", "t"))
    with ctx:
        x = tp.const(XS[:, 0])[b, t]
        h = tp.placeholder(shape=(H,), dtype="float32", domain=(b, t))
        h[b, 0] = tp.const(np.ones(H, np.float32))
        h[b, t + 1] = (h * 0.5 + x).tanh()
    exe = _check(ctx, [h], passes=["parallel"])
    assert _laid_out(exe) > 0 and _no_op_over_b(exe)


def test_backpropagation_through_time_in_every_env():
    """The gradient of a recurrence over ``t`` within each env (a recurrent policy's)."""
    ctx, (b, t), (B, T) = _context(("b", "t"))
    with ctx:
        w = tp.const(np.float32(0.7), requires_grad=True)
        x = tp.const(XS[:, 0, :, 0])[b, t] * w
        h = tp.placeholder(shape=(), dtype="float32", domain=(b, t))
        h[b, 0] = x[b, 0]
        h[b, t + 1] = (h * w + x[b, t + 1]).tanh()
        loss = h[0:B, 0:T].mean((0, 1))
        loss.backward()
        grad = w.grad
    exe = _check(ctx, [grad], passes=["parallel"])
    assert _laid_out(exe) > 0


def test_a_loss_over_one_env_has_a_gradient():
    """Autodiff's transposes read one env (``b = 0``) from ops over ``b``: legal, and the
    same gradient as the reference."""
    ctx, (b, t), (B, T) = _context(("b", "t"))
    with ctx:
        w = tp.const(np.float32(0.5), requires_grad=True)
        v = tp.const(XS[:, 0, :, 0])[b, t] * w
        x = v[b, t:T].sum(0)
        loss = x[0, 0:T].sum()
        loss.backward()
        grad = w.grad
    _check(ctx, [grad])


def test_a_batched_udf_over_two_parallel_dims_keeps_its_loops():
    """``batched`` is written for one parallel dim: over two, the UDF runs per point
    (found by the stress test: it was called over whichever dim was laid out)."""
    calls = []

    def one(point, x):
        return (x + point["b"]).astype(np.float32)

    def every(point, x):
        calls.append(point)
        return (x + np.arange(x.shape[0], dtype=np.float32)).astype(np.float32)
    ctx = tp.Context(dims=("b", "e", "t"), parallel=("b", "e"))
    (b, e, t), (B, E, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.symbol_value(t).astype("float32") + tp.symbol_value(e).astype("float32") * 10.0
        y = tp.placeholder(shape=(), dtype="float32", domain=(b, e, t))
        y[b == 0] = x * 2.0  # a condition on b keeps b a loop
        y[True] = x
        (h,) = tp.udf(one, [y], [((), "float32")], pass_point=True, batched=every)
    bounds = {B: 3, E: 2, T: 2}
    got = ctx.compile(bounds, [h], passes=["parallel"]).run()[h]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [h])[h.key])
    assert not calls


def test_a_shared_weight_gradient_contracts_over_the_envs():
    """Autodiff's per-env outer product ``x^T g`` for a weight every env reads becomes one
    matmul over all envs, ``(H, B) @ (B, H)``, not ``B`` stacked products summed after."""
    ctx, (b, i), (B, I) = _context(("b", "i"))
    with ctx:
        w = tp.const(W, requires_grad=True)
        x = tp.const(XS[:, :, 0])[b, i]
        loss = (x @ w).tanh()[0:B, i].mean((0, 1))
        loss.backward()
        grad = w.grad
    bounds = {B: B_VALUE, I: I_VALUE}
    exe = ctx.compile(bounds, [grad], passes=["parallel"])
    matmuls = [op for op in exe.graph.ops.values() if op.kind == "matmul"]
    assert any(tuple(d.value for d in op.outputs[0].shape) == (H, H)
               and [d.name for d in op.domain] == ["i"] for op in matmuls), matmuls
    xs, expected = XS[:, :, 0], np.zeros((I_VALUE, H, H), np.float32)
    for k in range(I_VALUE):  # d/dW mean_b tanh(x_b W) = 1/(B H) sum_b x_b^T (1 - tanh^2)
        y = np.tanh(xs[:, k] @ W)
        expected[k] = xs[:, k].T @ (1 - y ** 2) / (B_VALUE * H)
    np.testing.assert_allclose(exe.run()[grad], expected, rtol=1e-5, atol=1e-6)
