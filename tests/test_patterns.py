"""Recurrence patterns, each compiled on both backends and checked against the reference
evaluator and against a plain-NumPy computation written here."""

import numpy as np
import pytest

import tempo as tp
from tempo.reference import evaluate

BACKENDS = ("numpy", "jax")


def check(ctx, bounds, expected, backend, rtol=1e-5, atol=1e-5):
    """Compile ``[rt for rt, _ in expected]``, run it, and compare each output with its
    NumPy value and with the reference evaluator."""
    outputs = [rt for rt, _ in expected]
    exe = ctx.compile(bounds=bounds, outputs=outputs, backend=backend)
    res = exe.run()
    ref = evaluate(ctx, bounds, outputs)
    for rt, want in expected:
        want = np.asarray(want)
        got = res[rt]
        assert isinstance(got, np.ndarray)
        assert got.shape == want.shape, (rt, got.shape, want.shape)
        assert ref[rt.key].shape == want.shape
        np.testing.assert_allclose(ref[rt.key], want, rtol=rtol, atol=atol, err_msg=f"reference {rt!r}")
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"compiled {rt!r}")
        np.testing.assert_allclose(got, ref[rt.key], rtol=rtol, atol=atol)
    return res


def data(n, *shape, seed=0):
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def ctx_t():
    ctx = tp.Context(dims=("t",))
    return ctx, ctx.dims[0], ctx.bounds[0]


# ---- recurrences ----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_running_sum(backend):
    n = 10
    xs = data(n)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        s = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        s[0] = x[0]
        s[t + 1] = s + x[t + 1]
    check(ctx, {T: n}, [(s, np.cumsum(xs.astype(np.float64)))], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_running_sum_of_vectors_with_decay(backend):
    n = 8
    xs = data(n, 3)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        s = tp.placeholder(shape=(3,), domain=(t,))
        s[0] = tp.const(np.zeros(3, np.float32))
        s[t + 1] = s * 0.5 + x
    want = np.zeros((n, 3))
    for k in range(1, n):
        want[k] = want[k - 1] * 0.5 + xs[k - 1]
    check(ctx, {T: n}, [(s, want)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["branch_true", "shift_two"])
def test_two_step_recurrence(backend, form):
    """f[t] = 0.5 f[t-1] + f[t-2] + x[t] with two base cases (a Fibonacci-like float recurrence)."""
    n = 10
    xs = data(n, seed=1)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        f = tp.placeholder(domain=(t,))
        f[0] = 1.0
        f[1] = 2.0
        if form == "branch_true":
            f[True] = f[t - 1] * 0.5 + f[t - 2] + x
        else:
            f[t + 2] = f[t + 1] * 0.5 + f + x[t + 2]
    want = np.zeros(n)
    want[0], want[1] = 1.0, 2.0
    for k in range(2, n):
        want[k] = 0.5 * want[k - 1] + want[k - 2] + xs[k]
    check(ctx, {T: n}, [(f, want)], backend, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fibonacci(backend):
    n = 12
    ctx, t, T = ctx_t()
    with ctx:
        f = tp.placeholder(domain=(t,))
        f[0] = 0.0
        f[1] = 1.0
        f[True] = f[t - 1] + f[t - 2]
    want = [0.0, 1.0]
    while len(want) < n:
        want.append(want[-1] + want[-2])
    check(ctx, {T: n}, [(f, np.array(want))], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 9])
def test_reverse_recursion(backend, n):
    """a[T-1] = x[T-1]; a[t] = 0.5 a[t+1] + x[t]: computed from the end backwards."""
    xs = data(n, seed=2)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        a = tp.placeholder(domain=(t,))
        a[T - 1] = x
        a[True] = a[t + 1] * 0.5 + x
    want = np.zeros(n)
    want[-1] = xs[-1]
    for k in range(n - 2, -1, -1):
        want[k] = 0.5 * want[k + 1] + xs[k]
    check(ctx, {T: n}, [(a, want)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_and_backward_recurrences_together(backend):
    """A prefix sum and a suffix sum of the same input in one program, combined per point."""
    n = 8
    xs = data(n, seed=3)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        fwd = tp.placeholder(domain=(t,))
        fwd[0] = x
        fwd[True] = fwd[t - 1] + x
        bwd = tp.placeholder(domain=(t,))
        bwd[T - 1] = x
        bwd[True] = bwd[t + 1] + x
        total = fwd + bwd - x            # = sum of all x at every t
    x64 = xs.astype(np.float64)
    check(ctx, {T: n}, [(fwd, np.cumsum(x64)), (bwd, np.cumsum(x64[::-1])[::-1]),
                        (total, np.full(n, x64.sum()))], backend)


# ---- windows and slices -------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_window(backend):
    n = 10
    xs = data(n, seed=4)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        win = x[tp.max(0, t - 3):t + 1]
        s, m, mx = win.sum(), win.mean(), win.max()
    windows = [xs[max(0, k - 3):k + 1].astype(np.float64) for k in range(n)]
    check(ctx, {T: n}, [(s, [w.sum() for w in windows]), (m, [w.mean() for w in windows]),
                        (mx, [w.max() for w in windows])], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_window(backend):
    n = 10
    xs = data(n, seed=5)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        win = x[t:tp.min(t + 3, T)]
        s, mn = win.sum(), win.min()
    windows = [xs[k:min(k + 3, n)].astype(np.float64) for k in range(n)]
    check(ctx, {T: n}, [(s, [w.sum() for w in windows]), (mn, [w.min() for w in windows])], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_prefix(backend):
    n = 10
    xs = data(n, seed=6)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        c = x[0:t + 1].sum()
        cm = x[0:t + 1].max()
    x64 = xs.astype(np.float64)
    check(ctx, {T: n}, [(c, np.cumsum(x64)), (cm, np.maximum.accumulate(x64))], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_vector_prefix_cumsum(backend):
    """x[0:t+1] of a vector RT has shape (t+1, 2); cumsum along the time axis, then its last row."""
    n = 6
    xs = data(n, 2, seed=7)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        prefix = x[0:t + 1]
        last = prefix.cumsum(0)[t, t]   # at basis point t, spatial row t (the last) of the cumsum
        total = prefix.sum(0)
    want = np.cumsum(xs.astype(np.float64), axis=0)
    check(ctx, {T: n}, [(last, want), (total, want)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gamma", [0.9, 0.5])
def test_anti_causal_discounted_sum(backend, gamma):
    n = 9
    xs = data(n, seed=8)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        g = x[t:T].discounted_sum(gamma)
    want = [sum(gamma ** k * float(xs[s + k]) for k in range(n - s)) for s in range(n)]
    check(ctx, {T: n}, [(g, want)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_discounted_sum_equals_its_reverse_recursion(backend):
    """g = x[t:T].discounted_sum(gamma) satisfies g[t] = x[t] + gamma g[t+1]."""
    n, gamma = 8, 0.8
    xs = data(n, seed=9)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        g = x[t:T].discounted_sum(gamma)
        r = tp.placeholder(domain=(t,))
        r[T - 1] = x
        r[True] = x + r[t + 1] * gamma
        diff = g - r
    want = np.zeros(n)
    want[-1] = xs[-1]
    for k in range(n - 2, -1, -1):
        want[k] = xs[k] + gamma * want[k + 1]
    check(ctx, {T: n}, [(g, want), (r, want), (diff, np.zeros(n))], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [3, 8])
def test_exclusive_prefix_is_empty_at_the_start(backend, n):
    """x[0:t] is empty at t = 0: its sum there is 0."""
    xs = data(n, seed=10)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        before = x[0:t].sum()
    want = np.concatenate([[0.0], np.cumsum(xs.astype(np.float64))[:-1]])
    check(ctx, {T: n}, [(before, want)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [3, 8])
def test_exclusive_suffix_is_empty_at_the_end(backend, n):
    """x[t+1:T] is empty at t = T-1: its sum there is 0 (e.g. returns after the current step)."""
    xs = data(n, seed=11)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        after = x[t + 1:T].sum()
    want = np.array([xs[k + 1:].astype(np.float64).sum() for k in range(n)])
    check(ctx, {T: n}, [(after, want)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slices_over_the_outer_dim(backend):
    """Causal reads along i (x[0:i+1, t]), along both dims, and a 2-d backward window."""
    n_i, n_t = 3, 4
    xs = np.random.default_rng(22).standard_normal((n_i, n_t)).astype(np.float32)
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        x = tp.const(xs)[i, t]
        over_i = x[0:i + 1, t].sum()
        over_both = x[0:i + 1, 0:t + 1].sum()
        window = x[tp.max(0, i - 1):i + 1, tp.max(0, t - 1):t + 1].mean()
    x64 = xs.astype(np.float64)
    want_window = np.array([[x64[max(0, a - 1):a + 1, max(0, b - 1):b + 1].mean() for b in range(n_t)]
                            for a in range(n_i)])
    check(ctx, {I: n_i, T: n_t}, [(over_i, np.cumsum(x64, 0)),
                                  (over_both, np.cumsum(np.cumsum(x64, 0), 1)),
                                  (window, want_window)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reversed_and_shifted_point_reads(backend):
    n = 7
    xs = data(n, seed=23)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        rev = x[T - 1 - t]
        nxt = x[tp.min(t + 1, T - 1)]
        prv = x[tp.max(t - 2, 0)]
    k = np.arange(n)
    check(ctx, {T: n}, [(rev, xs[::-1]), (nxt, xs[np.minimum(k + 1, n - 1)]),
                        (prv, xs[np.maximum(k - 2, 0)])], backend)


# ---- branches -----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_conditional_branches(backend):
    n = 12
    xs = data(n, seed=12)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        c = tp.placeholder(domain=(t,))
        c[t % 5 == 0] = x * 2.0
        c[True] = x
    want = np.where(np.arange(n) % 5 == 0, 2.0 * xs, xs)
    check(ctx, {T: n}, [(c, want)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_first_branch_that_holds_wins(backend):
    """Overlapping conditions: t % 2 == 0 is listed before t % 3 == 0, so t = 0, 6 take it."""
    n = 8
    ctx, t, T = ctx_t()
    with ctx:
        c = tp.placeholder(domain=(t,))
        c[t % 2 == 0] = 1.0
        c[t % 3 == 0] = 2.0
        c[t == T - 1] = 3.0
        c[True] = 4.0
    k = np.arange(n)
    want = np.select([k % 2 == 0, k % 3 == 0, k == n - 1], [1.0, 2.0, 3.0], 4.0)
    check(ctx, {T: n}, [(c, want)], backend)


# ---- nested dims --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_dims_with_reset(backend):
    """y restarts at every i: y[i, 0] = x[i, 0]; y[i, t+1] = y[i, t] + x[i, t]."""
    n_i, n_t = 3, 5
    xs = np.random.default_rng(13).standard_normal((n_i, n_t)).astype(np.float32)
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        x = tp.const(xs)[i, t]
        y = tp.placeholder(domain=(i, t))
        y[i, 0] = x
        y[i, t + 1] = y + x
    want = np.zeros((n_i, n_t))
    for a in range(n_i):
        want[a, 0] = xs[a, 0]
        for b in range(1, n_t):
            want[a, b] = want[a, b - 1] + xs[a, b - 1]
    check(ctx, {I: n_i, T: n_t}, [(y, want)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_dims_carry_across_iterations(backend):
    """The state at (i, 0) continues from (i-1, T-1)."""
    n_i, n_t = 3, 4
    xs = np.random.default_rng(14).standard_normal((n_i, n_t)).astype(np.float32)
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        x = tp.const(xs)[i, t]
        y = tp.placeholder(domain=(i, t))
        y[0, 0] = 0.0
        y[i, 0] = y[i - 1, T - 1]
        y[i, t + 1] = y + x
    flat = np.zeros(n_i * n_t)
    for k in range(1, n_i * n_t):
        a, b = divmod(k, n_t)
        prev_a, prev_b = divmod(k - 1, n_t)
        flat[k] = flat[k - 1] + (xs[prev_a, prev_b] if b > 0 else 0.0)
    check(ctx, {I: n_i, T: n_t}, [(y, flat.reshape(n_i, n_t))], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_parameter_update_over_iterations(backend):
    """p[i+1] = p[i] - lr * sum_t x[i, t] * p[i]: an outer recurrence reading a whole inner range."""
    n_i, n_t, lr = 4, 5, 0.01
    xs = np.random.default_rng(15).standard_normal((n_i, n_t)).astype(np.float32)
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        x = tp.const(xs)[i, t]
        p = tp.placeholder(domain=(i,))
        p[0] = 1.0
        grad = x * p
        p[i + 1] = p - lr * grad[i, 0:T].sum()
    want_p = np.zeros(n_i)
    want_p[0] = 1.0
    for a in range(1, n_i):
        want_p[a] = want_p[a - 1] - lr * (xs[a - 1] * want_p[a - 1]).sum()
    check(ctx, {I: n_i, T: n_t}, [(p, want_p), (grad, xs * want_p[:, None])], backend)


# ---- whole-range reductions, matmul ---------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_whole_range_reduction_broadcast_back(backend):
    n = 10
    xs = data(n, seed=16)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        mean = x[0:T].mean()
        z = x - mean
        zz = (z * z)[0:T].sum()
    assert mean.domain == () and z.domain == (t,)
    x64 = xs.astype(np.float64)
    check(ctx, {T: n}, [(z, x64 - x64.mean()), (mean, x64.mean()),
                        (zz, ((x64 - x64.mean()) ** 2).sum())], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_matmul_per_step(backend):
    n = 6
    vs = data(n, 3, seed=17)
    m = np.random.default_rng(18).standard_normal((3, 2)).astype(np.float32)
    ctx, t, T = ctx_t()
    with ctx:
        v = tp.const(vs)[t]
        h = v @ tp.const(m)
        act = h.tanh()
    assert h.shape == (2,) and h.domain == (t,)
    want = vs.astype(np.float64) @ m.astype(np.float64)
    check(ctx, {T: n}, [(h, want), (act, np.tanh(want))], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rnn_like_recurrence_with_matmul(backend):
    n = 6
    xs = data(n, 3, seed=19)
    w = (np.random.default_rng(20).standard_normal((3, 3)) * 0.5).astype(np.float32)
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        h = tp.placeholder(shape=(3,), domain=(t,))
        h[0] = tp.const(np.zeros(3, np.float32))
        h[t + 1] = (h @ tp.const(w) + x).tanh()
    want = np.zeros((n, 3))
    for k in range(1, n):
        want[k] = np.tanh(want[k - 1] @ w + xs[k - 1])
    check(ctx, {T: n}, [(h, want)], backend, rtol=1e-4, atol=1e-5)


# ---- UDFs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_udf_runs_once_per_point(backend):
    n_i, n_t = 2, 4
    calls = []

    def counter(point):
        calls.append((point["i"], point["t"]))
        return np.float32(len(calls))

    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        (u,) = tp.udf(counter, outputs=[((), "float32")], domain=(i, t), pass_point=True)
    all_points = sorted((a, b) for a in range(n_i) for b in range(n_t))

    res = ctx.compile(bounds={I: n_i, T: n_t}, outputs=[u], backend=backend).run()
    assert sorted(calls) == all_points       # every point, exactly once
    # each point's value is the number of calls made when it ran
    for k, (a, b) in enumerate(calls):
        assert res[u][a, b] == k + 1

    calls.clear()
    evaluate(ctx, {I: n_i, T: n_t}, [u])
    assert sorted(calls) == all_points


@pytest.mark.parametrize("backend", BACKENDS)
def test_udf_not_an_output_still_runs_once_per_point(backend):
    n = 5
    seen = []
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(np.arange(n, dtype=np.float32))[t]
        tp.udf(lambda point, v: seen.append((point["t"], float(v))), inputs=[x * 3.0],
               pass_point=True)
    ctx.compile(bounds={T: n}, outputs=[], backend=backend).run()
    assert sorted(seen) == [(k, 3.0 * k) for k in range(n)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_stateful_udf_sees_points_in_schedule_order(backend):
    """A UDF reading its own previous output runs at t = 0, 1, 2, ... in that order."""
    n = 7
    xs = data(n, seed=21)
    log = []

    def step(point, prev, x):
        log.append((point["t"], float(prev)))
        return prev + x

    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(xs)[t]
        p = tp.placeholder(domain=(t,))
        p[0] = 0.0
        (v,) = tp.udf(step, inputs=[p, x], outputs=[((), "float32")], pass_point=True)
        p[t + 1] = v
    want_v = np.cumsum(xs.astype(np.float64))
    want_prev = np.concatenate([[0.0], want_v[:-1]])

    res = ctx.compile(bounds={T: n}, outputs=[v, p], backend=backend).run()
    assert [k for k, _ in log] == list(range(n))
    np.testing.assert_allclose([prev for _, prev in log], want_prev, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res[v], want_v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res[p], want_prev, rtol=1e-5, atol=1e-6)

    log.clear()
    ref = evaluate(ctx, {T: n}, [v])
    assert [k for k, _ in log] == list(range(n))
    np.testing.assert_allclose(ref[v.key], want_v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_udf_with_external_state_object(backend):
    """An object with a counter (an environment stand-in): each step sees the state it left."""

    class Env:
        def __init__(self):
            self.steps = 0
            self.points = []

        def step(self, point, action):
            self.points.append(point["t"])
            self.steps += 1
            return np.float32(self.steps * 10 + action)

    n = 6
    env = Env()
    ctx, t, T = ctx_t()
    with ctx:
        action = tp.symbol_value(t % 2)
        (obs,) = tp.udf(env.step, inputs=[action], outputs=[((), "float32")], pass_point=True)
    res = ctx.compile(bounds={T: n}, outputs=[obs], backend=backend).run()
    assert env.steps == n and sorted(env.points) == list(range(n))
    want = [10.0 * (env.points.index(k) + 1) + k % 2 for k in range(n)]
    np.testing.assert_allclose(res[obs], want)


# ---- random tensors -------------------------------------------------------------------------
def _random_program(seed):
    ctx = tp.Context(dims=("i", "t"), seed=seed)
    i, t = ctx.dims
    with ctx:
        nrm = tp.normal(shape=(3,), domain=(t,))
        uni = tp.uniform(shape=(2,), low=-1.0, high=2.0, domain=(i, t))
        ints = tp.randint(0, 5, shape=(4,), domain=(t,))
        shifted = nrm * 2.0 + 1.0
    return ctx, [nrm, uni, ints, shifted]


def test_random_same_on_both_backends_and_reference():
    ctx, outs = _random_program(seed=7)
    I, T = ctx.bounds
    bounds = {I: 2, T: 6}
    ref = evaluate(ctx, bounds, outs)
    results = [ctx.compile(bounds=bounds, outputs=outs, backend=b).run() for b in BACKENDS]
    nrm, uni, ints, shifted = outs
    for res in results:
        for rt in outs:
            np.testing.assert_allclose(res[rt], ref[rt.key], rtol=1e-6)
        assert res[nrm].shape == (6, 3) and res[uni].shape == (2, 6, 2) and res[ints].shape == (6, 4)
        np.testing.assert_allclose(res[shifted], res[nrm] * 2.0 + 1.0, rtol=1e-6)
        assert ((res[uni] >= -1.0) & (res[uni] < 2.0)).all()
        assert ((res[ints] >= 0) & (res[ints] < 5)).all()
        assert np.issubdtype(res[ints].dtype, np.integer)
    # different points get different numbers
    rows = results[0][nrm]
    assert len({tuple(r) for r in rows}) == len(rows)
    cells = results[0][uni].reshape(-1, 2)
    assert len({tuple(c) for c in cells}) == len(cells)
    # and the same program run twice gives the same numbers
    again = ctx.compile(bounds=bounds, outputs=outs, backend="numpy").run()
    np.testing.assert_array_equal(again[nrm], results[0][nrm])


def test_random_normal_statistics():
    ctx = tp.Context(dims=("t",), seed=1)
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        z = tp.normal(shape=(500,), loc=3.0, scale=2.0, domain=(t,))
    res = ctx.compile(bounds={T: 8}, outputs=[z], backend="numpy").run()[z]
    assert res.shape == (8, 500)
    assert abs(res.mean() - 3.0) < 0.15
    assert abs(res.std() - 2.0) < 0.15


def test_random_reproducible_from_the_context_seed():
    """Building the same program in a fresh context with the same seed gives the same samples;
    a different seed gives different samples."""
    ctx_a, outs_a = _random_program(seed=11)
    ctx_b, outs_b = _random_program(seed=11)
    ctx_c, outs_c = _random_program(seed=12)

    def values(ctx, outs):
        I, T = ctx.bounds
        res = ctx.compile(bounds={I: 2, T: 4}, outputs=outs, backend="numpy").run()
        return [res[rt] for rt in outs]

    a, b, c = values(ctx_a, outs_a), values(ctx_b, outs_b), values(ctx_c, outs_c)
    for va, vb in zip(a, b):
        np.testing.assert_array_equal(va, vb)
    assert not np.array_equal(a[0], c[0])
