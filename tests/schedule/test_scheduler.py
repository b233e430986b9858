"""The isl schedule: demand, memory statements placed by dependences, readable output."""

import re

import numpy as np

import tempo as tp
from tempo.schedule import ast


def _loops(node):
    if isinstance(node, ast.Loop):
        return [node, *_loops(node.body)]
    if isinstance(node, ast.Seq):
        return [loop for child in node.body for loop in _loops(child)]
    if isinstance(node, ast.If):
        return _loops(node.then) + (_loops(node.orelse) if node.orelse else [])
    return []


def _statements(node, inside=False):
    """(statement name, inside-a-loop) pairs."""
    if isinstance(node, ast.Stmt):
        return [(node.name, inside)]
    if isinstance(node, ast.Loop):
        return _statements(node.body, True)
    if isinstance(node, ast.Seq):
        return [s for child in node.body for s in _statements(child, inside)]
    return _statements(node.then, inside) + (_statements(node.orelse, inside) if node.orelse else [])


def _recurrence():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        y = tp.placeholder(shape=(), domain=(t,))
        y[0] = tp.const(1.0)
        y[t + 1] = y * 0.5
        last = y[T - 1]
    return ctx, T, y, last


def test_recurrence_frees_each_point_inside_the_loop():
    ctx, T, y, last = _recurrence()
    exe = ctx.compile({T: 50}, [last], backend="numpy")
    free_y = next(name for name, s in exe.schedule.statements.items()
                  if s.kind == "free" and s.op is y.op)
    placed = [inside for name, inside in _statements(exe.schedule.root) if name == free_y]
    assert any(placed), "y's points must be freed inside the time loop, not after it"
    assert len(_loops(exe.schedule.root)) == 1


def test_shift_does_not_compute_points_nobody_needs():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    calls = []
    with ctx:
        x = tp.const(np.arange(5, dtype=np.float32))[t]
        s = tp.placeholder(shape=(), domain=(t,))
        s[0] = x[0]
        s[t + 1] = s + x[t + 1]          # x[t+1] at t = T-1 is never needed
        tp.sink(s, lambda v, p: calls.append(p["t"]))
    res = ctx.compile({T: 5}, [s], backend="numpy").run()
    np.testing.assert_allclose(res[s], np.cumsum(np.arange(5)))
    assert calls == list(range(5))


def test_pseudo_code_names_ops_and_loops():
    ctx, T, y, last = _recurrence()
    text = str(ctx.compile({T: 8}, [last], backend="numpy").schedule)
    assert re.search(r"for c\d+ in range\(", text)
    assert y.op.name in text and f"free {y.op.name}" in text


def test_whole_range_reduction_runs_after_the_loop_that_produces_it():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.symbol_value(t).astype("float32")
        z = x - x[0:T].mean()
    exe = ctx.compile({T: 6}, [z], backend="numpy")
    np.testing.assert_allclose(exe.run()[z], np.arange(6) - 2.5)
    assert len(_loops(exe.schedule.root)) == 2
