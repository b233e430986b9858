"""``tp.stop_when`` ends a run where its condition first holds: the loop does not run on,
and the outputs hold their points up to the stop (compared with the same program run to
the end)."""

import numpy as np
import pytest

import tempo as tp


def _counting(backend: str, limit: float, T: int = 50, loops: tp.LoopPolicy | None = None):
    """s[t] = s[t-1] + t; stop once s exceeds ``limit``; count the points a UDF saw."""
    seen: list[int] = []
    ctx = tp.Context(dims=("t",))
    (t,), (Tb,) = ctx.dims, ctx.bounds
    with ctx:
        s = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        s[0] = 0.0
        s[t + 1] = s + tp.symbol_value(t + 1).astype("float32")
        tp.sink(s, lambda v, p: seen.append(p["t"]), name="watch")
        tp.stop_when(s > limit)
    exe = ctx.compile({Tb: T}, [s], backend=backend, loops=loops)
    res = exe.run()
    return res, s, seen


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_the_run_ends_where_the_condition_first_holds(backend):
    res, s, seen = _counting(backend, limit=20.0)
    full = np.cumsum(np.arange(50, dtype=np.float32))
    stop = int(np.argmax(full > 20.0))  # s = 0, 1, 3, 6, 10, 15, 21: t = 6
    assert res.stopped_at == {"t": stop}
    np.testing.assert_array_equal(res[s], full[:stop + 1])
    assert seen == list(range(stop + 1))  # the stop point's own sink ran; the loop did not run on


@pytest.mark.parametrize("late", [True, False])
def test_a_stop_runs_the_late_sinks_before_it(late):
    """With late sinks (``tempo.runtime.tail``) the stop point's own sink still runs."""
    res, _, seen = _counting("jax", limit=20.0, loops=tp.LoopPolicy(late_sinks=late))
    assert res.stopped_at == {"t": 6} and seen == list(range(7))


def test_a_stop_points_sinks_run_whatever_the_order_they_were_written_in():
    """A stop check runs after the other sinks of its point, even one written after it."""
    for first in ("stop", "sink"):
        seen: list[int] = []
        ctx = tp.Context(dims=("t",))
        (t,), (Tb,) = ctx.dims, ctx.bounds
        with ctx:
            x = tp.symbol_value(t).astype("float32")
            if first == "stop":
                tp.stop_when(x >= 4.0)
            tp.sink(x, lambda v, p: seen.append(int(v)))
            if first == "sink":
                tp.stop_when(x >= 4.0)
        res = ctx.compile({Tb: 10}, [x], backend="numpy").run()
        assert res.stopped_at == {"t": 4} and seen == [0, 1, 2, 3, 4], first


def test_a_condition_that_never_holds_runs_to_the_end():
    res, s, seen = _counting("numpy", limit=1e9, T=12)
    assert res.stopped_at is None and len(res[s]) == 12 and len(seen) == 12


def test_stop_when_needs_a_boolean_over_a_dim():
    ctx = tp.Context(dims=("t",))
    (t,), _ = ctx.dims, ctx.bounds
    with ctx:
        x = tp.symbol_value(t).astype("float32")
        with pytest.raises(tp.DomainError, match="boolean"):
            tp.stop_when(x)


def test_a_run_resumed_at_an_origin_stops_at_the_same_point():
    """Host ops see coordinates moved by the origin; the stop is reported in this run's."""
    ctx = tp.Context(dims=("t",))
    (t,), (Tb,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.symbol_value(t).astype("float32")
        tp.stop_when(x >= 5.0)  # symbol_value sees t + 2
    res = ctx.compile({Tb: 10}, [x], backend="numpy").run(origin={t: 2})
    assert res.stopped_at == {"t": 3}
    np.testing.assert_array_equal(res[x], [2.0, 3.0, 4.0, 5.0])


def test_stop_when_needs_a_scalar():
    ctx = tp.Context(dims=("t",))
    (t,), _ = ctx.dims, ctx.bounds
    with ctx:
        x = tp.symbol_value(t).astype("float32").unsqueeze(0).expand(2)
        with pytest.raises(tp.DomainError, match="scalar"):
            tp.stop_when(x > 1.0)


def test_a_stop_over_an_outer_dim_runs_after_its_iterations_inner_sinks():
    """A stop over ``i`` (written first) checks iteration ``i`` once the sinks over
    ``(i, t)`` of that iteration ran: all of them, for the iterations up to the stop."""
    seen: list[tuple[int, int]] = []
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        tp.stop_when(tp.symbol_value(i).astype("float32") >= 2.0)
        y = tp.symbol_value(i).astype("float32") * 10.0 + tp.symbol_value(t).astype("float32")
        tp.sink(y, lambda v, p: seen.append((p["i"], p["t"])))
    res = ctx.compile({I: 6, T: 3}, [y], backend="numpy").run()
    assert res.stopped_at == {"i": 2}
    assert seen == [(a, b) for a in range(3) for b in range(3)]
