"""Splitting a schedule dim into consecutive loops (tempo.schedule.bands): the intervals
cover every value in order, each loop's period divides the strides of the statements in
it, and loops run one after another come apart."""

import islpy as isl
import numpy as np

import tempo as tp
from tempo.schedule.bands import Interval, Values, partition, values_of


def _covers(intervals: list[Interval], statements: list[Values]) -> None:
    """Consecutive, ordered, and every value of every statement inside one of them."""
    for a, b in zip(intervals, intervals[1:]):
        assert a.last < b.first
    for s in statements:
        for v in range(s.lo, s.hi + 1, max(s.stride, 1)):
            inside = [i for i in intervals if i.first <= v <= i.last]
            assert len(inside) == 1, (v, s)
            loop = inside[0]
            if loop.period > 1 and s.stride and s.lo >= loop.first and s.hi <= loop.last:
                assert s.stride % loop.period == 0


def test_a_strided_loop_and_the_loop_after_it_come_apart():
    """PPO's shape: env-state merges at 2t, the acting step at 2t + 1 (t < 250), parameter
    merges at 505u and the update at 505u + 504 (u < 16), and statements between them."""
    statements = [Values(0, 498, 2), Values(1, 499, 2), Values(0, 7575, 505), Values(504, 8079, 505),
                  Values(499, 499, 0), Values(500, 500, 0), Values(502, 502, 0)]
    intervals = partition(statements)
    _covers(intervals, statements)
    loops = [i for i in intervals if i.period]
    # the acting loop (its first iteration, where the first parameter merge runs, and its
    # last, where a statement runs only then, peeled), then the update loop
    assert loops == [Interval(2, 497, 2), Interval(504, 8079, 505)]
    assert [i.first for i in intervals if not i.period] == [0, 1, 498, 499, 500, 502]


def test_one_dense_loop_stays_one_loop():
    statements = [Values(0, 99, 1), Values(1, 99, 1), Values(0, 0, 0), Values(99, 99, 0)]
    assert partition(statements) == [Interval(0, 99, 1)]


def test_a_nested_loop_in_the_first_iteration_is_peeled():
    """isl may nest a loop in the first iteration of another: that iteration runs alone."""
    statements = [Values(0, 15, 1), Values(0, 0, 0, nested=True), Values(3, 3, 0)]
    assert partition(statements) == [Interval(0, 0, 0), Interval(1, 15, 1)]


def test_values_of_a_statement():
    m = isl.Map("{ S[a, b] -> [1, a, 505b + 504, 2] : 0 <= a < 6 and 0 <= b < 16 }")
    assert values_of(m, 2) == Values(504, 8079, 505)
    assert values_of(m, 0) == Values(1, 1, 0, nested=True)
    assert values_of(m, 0, nests=False) == Values(1, 1, 0)
    holes = isl.Map("{ S[a] -> [a] : 0 <= a <= 10 and a != 3 }")
    assert values_of(holes, 0) == Values(0, 10, 1)


def test_random_value_sets_are_covered_in_order():
    rng = np.random.default_rng(0)
    for _ in range(200):
        statements = []
        for _ in range(rng.integers(1, 8)):
            lo, n = int(rng.integers(0, 60)), int(rng.integers(1, 12))
            stride = int(rng.choice([0, 1, 2, 3, 5, 7]))
            if stride == 0 or n == 1:
                statements.append(Values(lo, lo, 0, bool(rng.integers(0, 2))))
            else:
                statements.append(Values(lo, lo + stride * (n - 1), stride))
        _covers(partition(statements), statements)


def test_a_split_schedule_runs_every_statement_once_in_order():
    """Two loops of a program that isl may place on one dim: the reference evaluator's
    values, on both backends."""
    ctx = tp.Context(dims=("i", "t", "u"))
    (i, t, u), (I, T, U) = ctx.dims, ctx.bounds
    data = np.random.default_rng(1).standard_normal((3, 9)).astype(np.float32)
    with ctx:
        x = tp.const(data)[i, t]
        s = tp.placeholder(shape=(), dtype="float32", domain=(i, t))
        s[i, 0] = x[i, 0]
        s[i, t + 1] = (s * 0.5 + x[i, t + 1]).tanh()
        total = s[i, 0:T].sum()
        w = tp.placeholder(shape=(), dtype="float32", domain=(i, u))
        w[i, 0] = total
        w[i, u + 1] = w * 0.9 + total * 0.1
        out = w[i, U - 1]
    bounds = {I: 3, T: 9, U: 5}
    expected = []
    for k in range(3):
        ys = [data[k, 0]]
        for j in range(1, 9):
            ys.append(np.tanh(ys[-1] * 0.5 + data[k, j]))
        w_ = tot = float(np.sum(ys))
        for _ in range(4):
            w_ = w_ * 0.9 + tot * 0.1
        expected.append(w_)
    for backend in ("numpy", "jax"):
        exe = ctx.compile(bounds, [out], backend=backend)
        np.testing.assert_allclose(exe.run()[out], expected, rtol=1e-5)
