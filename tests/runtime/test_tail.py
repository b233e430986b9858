"""Late sinks (``tempo.runtime.tail``): on the JAX backend the host ops that only feed
sinks run one occurrence late. They must see the values, points and order that prompt
ones see (compared with the same program run with ``late_sinks=False`` and on NumPy), and
host ops must keep their order among themselves."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.runtime.tail import host_tail
from tempo.symbolic.expr import TRUE

I, T = 5, 6


def _program(log: list, fail_at: int | None = None):
    """Over (i, t): w[i] a recurrence a device op updates from a rollout x[i, 0:T]; a host
    UDF counts the rollout (read only by a reduction that only a sink reads, as an env's
    record of its episodes), a sink logs a loss and that count, and a host UDF whose value
    feeds the device work logs each iteration (it stays in its place)."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (Ib, Tb) = ctx.dims, ctx.bounds
    with ctx:
        def prompt(point):
            log.append(("prompt", point["i"]))
            if point["i"] == fail_at:
                raise RuntimeError("stop here")
            return np.float32(1.0 + point["i"])
        (scale,) = tp.udf(prompt, [], [((), "float32")], domain=(i,), pass_point=True, name="prompt")
        w = tp.placeholder(shape=(3,), dtype="float32", domain=(i,))
        w[0] = tp.const(np.array([0.5, -1.0, 2.0], np.float32))
        x = (w[i] * tp.symbol_value(t).astype("float32") + scale).tanh()
        loss = x[i, 0:Tb].mean()
        w[i + 1] = w - 0.1 * x[i, 0:Tb].mean(dim=0) * loss

        def tally(point, rollout):
            log.append(("tally", point["i"], float(rollout.sum())))
            return np.array([point["i"], -1.0], np.float32)
        (counted,) = tp.udf(tally, [x[i, 0:Tb]], [((2,), "float32")], pass_point=True, name="tally")
        marker = counted.max()
        tp.sink([loss, marker], lambda values, point: log.append(
            ("sink", point["i"], float(values[0]), float(values[1]))), name="logged")
    return ctx, w, (Ib, Tb)


def _run(backend: str, late: bool = True, fail_at: int | None = None):
    log: list = []
    ctx, w, (Ib, Tb) = _program(log, fail_at)
    exe = ctx.compile({Ib: I, Tb: T}, [w], backend=backend, loops=tp.LoopPolicy(late_sinks=late))
    try:
        res = exe.run()
    except RuntimeError:
        return exe, None, log
    return exe, res[w], log


def test_late_sinks_see_what_prompt_ones_see_in_the_same_order():
    exe, weights, log = _run("jax")
    names = {exe.graph.ops[k].name.split("#")[0] for k in exe.tail.host}
    assert names == {"tally", "logged"}  # (not "prompt": the device work reads it)
    assert {exe.graph.ops[k].kind for k in exe.tail.whole} == {"reduce_max"}
    prompt, prompt_weights, prompt_log = _run("jax", late=False)
    _, numpy_weights, numpy_log = _run("numpy")
    assert log == prompt_log
    np.testing.assert_array_equal(weights, prompt_weights)
    assert exe.stats.live == prompt.stats.live  # (the late values were freed too)
    assert [e[:2] for e in log] == [e[:2] for e in numpy_log]
    np.testing.assert_allclose([e[2:] for e in log if e[0] == "sink"],
                               [e[2:] for e in numpy_log if e[0] == "sink"], rtol=1e-5)
    np.testing.assert_allclose(weights, numpy_weights, rtol=1e-5)
    assert [e[1] for e in log if e[0] == "sink"] == list(range(I))  # the last one too


def test_a_host_op_that_fails_finds_the_earlier_ones_done():
    _, _, log = _run("jax", fail_at=3)
    _, _, prompt_log = _run("jax", late=False, fail_at=3)
    assert log == prompt_log
    assert [e[1] for e in log if e[0] == "sink"] == [0, 1, 2]


def test_no_tail_without_the_option_or_on_numpy():
    assert not _run("jax", late=False)[0].tail
    assert not _run("numpy")[0].tail


def test_a_host_op_reading_a_value_a_kernel_donates_stays_in_place():
    ctx, _, _ = _program([])
    graph = ctx.graph
    tally = next(op for op in graph.ops.values() if op.name.startswith("tally"))
    read = graph.in_edges(tally)[0]  # (an edge donating the value it reads: a kernel's last read)
    assert tally.id in host_tail(graph, {}, ()).host
    tail = host_tail(graph, {read: TRUE}, ())
    assert tally.id not in tail and tail.host  # (the sink still lags)


@pytest.mark.parametrize("late", [True, False])
def test_stop_when_ends_the_run_with_late_sinks(late):
    seen: list[int] = []
    ctx = tp.Context(dims=("t",))
    (t,), (Tb,) = ctx.dims, ctx.bounds
    with ctx:
        s = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        s[0] = 0.0
        s[t + 1] = s + tp.symbol_value(t + 1).astype("float32")
        tp.sink(s, lambda v, p: seen.append(p["t"]), name="watch")
        tp.stop_when(s > 20.0)
    res = ctx.compile({Tb: 50}, [s], backend="jax", loops=tp.LoopPolicy(late_sinks=late)).run()
    assert res.stopped_at == {"t": 6} and seen == list(range(7))
