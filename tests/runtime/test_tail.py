"""Late sinks (``tempo.runtime.tail``): on the JAX backend the host ops that only feed
sinks run one occurrence late. They must see the values, points and order that prompt
ones see (compared with the same program run with ``late_sinks=False`` and on NumPy), and
host ops must keep their order among themselves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

import tempo as tp
from tempo.runtime import executable
from tempo.runtime.tail import Lag, host_tail
from tempo.symbolic.expr import TRUE

I, T = 5, 6


def _program(log: list, fail_at: int | None = None, sink_fails_at: int | None = None,
             watch: Callable[[int], Any] | None = None, host_step: bool = True):
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
        (scale,) = tp.udf(prompt, [], [((), "float32")], domain=(i,), pass_point=True, name="prompt") \
            if host_step else (tp.symbol_value(i).astype("float32") + 1.0,)
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
        def logged(values, point):
            log.append(("sink", point["i"], float(values[0]), float(values[1])))
            if watch is not None:  # (what the run holds when the sink runs)
                log.append(("watched", point["i"], watch(point["i"])))
            if point["i"] == sink_fails_at:
                raise RuntimeError("the sink stops here")
        tp.sink([loss, marker], logged, name="logged")
    return ctx, w, (Ib, Tb)


def _run(backend: str, late: bool = True, fail_at: int | None = None, sink_fails_at: int | None = None,
         watch: Callable[[Any, Any, int], Any] | None = None, host_step: bool = True):
    """Compile and run ``_program``; ``watch(exe, w, i)`` is logged where the sink of
    iteration ``i`` runs."""
    log: list = []
    held: list = []
    seen = None if watch is None else (lambda k: watch(held[0], held[1], k))
    ctx, w, (Ib, Tb) = _program(log, fail_at, sink_fails_at, seen, host_step)
    exe = ctx.compile({Ib: I, Tb: T}, [w], backend=backend, loops=tp.LoopPolicy(late_sinks=late))
    held.extend([exe, w])
    try:
        res = exe.run()
    except RuntimeError:
        return exe, None, log
    return exe, res[w], log


def test_late_sinks_see_what_prompt_ones_see_in_the_same_order():
    exe, weights, log = _run("jax")
    names = {exe.graph.ops[k].name.split("#")[0] for k in exe.tail.host}
    assert names == {"tally", "logged"}  # (not "prompt": the device work it feeds is not the tail's)
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


def test_a_sink_runs_after_the_next_iteration_was_dispatched(monkeypatch):
    """Late, the sink of iteration i finds more of the parameters computed than a prompt
    one (the next iteration's); here no host op outside the tail runs in between (it would
    run the queue first)."""
    made: list[dict] = []
    make_stores = executable._make_stores
    monkeypatch.setattr(executable, "_make_stores", lambda *args: made.append(make_stores(*args)) or made[-1])

    def newest(exe: Any, w: Any, i: int) -> int:
        store = made[-1][exe.stored[w.key]]
        return max(k for k in range(I + 1) if store.holds((k,)))
    logs = [_run("jax", late=late, watch=newest, host_step=False)[2] for late in (True, False)]
    late, prompt = ([e[2] for e in log if e[0] == "watched"] for log in logs)
    assert len(late) == len(prompt) == I
    assert all(a > b for a, b in zip(late[:-1], prompt[:-1])), (late, prompt)


def test_device_work_that_fails_finds_the_late_work_before_it_done(monkeypatch):
    """A failure outside the tail (here the device work reading the parameters at the
    last iteration) runs what was queued before it, as a prompt run had done by then."""
    make_launcher = executable.make_launcher

    def failing(op, edges, *args, **kwargs):
        launch = make_launcher(op, edges, *args, **kwargs)
        if op.definition.host or not any(e.src.kind == "merge" for e in edges):
            return launch

        def launch_or_fail(point: tuple[int, ...]) -> None:
            if point == (I - 1,):
                raise RuntimeError("the update fails here")
            launch(point)
        return launch_or_fail
    monkeypatch.setattr(executable, "make_launcher", failing)
    logs = []
    for late in (True, False):
        log: list = []
        ctx, w, (Ib, Tb) = _program(log, host_step=False)
        exe = ctx.compile({Ib: I, Tb: T}, [w], backend="jax", loops=tp.LoopPolicy(late_sinks=late))
        with pytest.raises(RuntimeError, match="the update fails here"):
            exe.run()
        logs.append(log)
    assert logs[0] == logs[1]
    assert [e[1] for e in logs[0] if e[0] == "sink"] == [0, 1, 2, 3]


def test_a_sink_that_fails_stops_the_run_where_a_prompt_one_does():
    with pytest.raises(RuntimeError, match="the sink stops here"):
        _program_run_raising("jax", True)
    late_log = _program_run_raising.log
    with pytest.raises(RuntimeError, match="the sink stops here"):
        _program_run_raising("jax", False)
    assert late_log == _program_run_raising.log
    assert [e[1] for e in late_log if e[0] == "sink"] == [0, 1, 2]


def _program_run_raising(backend: str, late: bool) -> None:
    log: list = []
    _program_run_raising.log = log
    ctx, w, (Ib, Tb) = _program(log, sink_fails_at=2)
    ctx.compile({Ib: I, Tb: T}, [w], backend=backend, loops=tp.LoopPolicy(late_sinks=late)).run()


def test_late_work_runs_one_occurrence_late_and_frees_behind_it():
    lag, done = Lag(), []
    for k in range(3):
        lag.defer("a", lambda k=k: done.append(("a", k)))
        lag.behind(lambda k=k: done.append(("free a", k)))
        lag.defer("b", lambda k=k: done.append(("b", k)))
        assert ("a", k) not in done and (k == 0 or ("b", k - 1) in done)
    lag.catch_up()
    assert done == [("a", 0), ("free a", 0), ("b", 0), ("a", 1), ("free a", 1), ("b", 1),
                    ("a", 2), ("free a", 2), ("b", 2)]
    lag.behind(lambda: done.append("now"))  # (nothing queued: at once)
    assert done[-1] == "now"


def test_late_work_that_fails_drops_what_was_queued_after_it():
    lag, done = Lag(), []

    def fail() -> None:
        raise ValueError("late")
    lag.defer("a", fail)
    lag.defer("b", lambda: done.append("b"))
    with pytest.raises(ValueError):
        lag.defer("a", lambda: done.append("a again"))
    lag.catch_up()
    assert done == []


def test_no_tail_without_the_option_on_numpy_or_by_default_on_a_cpu():
    assert not _run("jax", late=False)[0].tail
    assert not _run("numpy")[0].tail
    log: list = []
    ctx, w, (Ib, Tb) = _program(log)
    exe = ctx.compile({Ib: I, Tb: T}, [w], backend="jax")
    assert bool(exe.tail) == (not exe.backend.on_cpu)


def test_a_host_op_reading_a_value_a_kernel_donates_stays_in_place():
    ctx, _, _ = _program([])
    graph = ctx.graph
    tally = next(op for op in graph.ops.values() if op.name.startswith("tally"))
    read = graph.in_edges(tally)[0]  # (an edge donating the value it reads: a kernel's last read)
    assert tally.id in host_tail(graph, {}, ()).host
    tail = host_tail(graph, {read: TRUE}, ())
    assert tally.id not in tail and tail.host  # (the sink still lags)


def test_late_host_ops_start_copying_their_early_reads_to_the_host():
    """Where a late host op is queued, the device values it read there start their copy to
    host memory (``Backend.copy_to_host_ahead``; on an accelerator the copy then runs
    behind the work that made them, not behind the next iteration's), once per queued
    occurrence: the sink's loss at every iteration."""
    log: list = []
    ctx, w, (Ib, Tb) = _program(log)
    exe = ctx.compile({Ib: I, Tb: T}, [w], backend="jax", loops=tp.LoopPolicy(late_sinks=True))
    started: list = []
    real = exe.backend.copy_to_host_ahead

    def recording(values: list) -> None:
        started.append([v for v in values if v is not None])
        real(values)
    exe.backend.copy_to_host_ahead = recording
    exe.run()
    losses = [float(v) for values in started for v in values if isinstance(v, jax.Array) and v.shape == ()]
    logged = [entry[2] for entry in log if entry[0] == "sink"]
    assert len(losses) == I and np.allclose(losses, logged)
