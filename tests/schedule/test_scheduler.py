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


def test_first_points_are_where_the_program_first_reaches_each_statement():
    """``ast.first_points``: each statement's point at the first iteration of the loops
    around it (a later loop starting from an outer counter, the first text occurrence
    winning), checked against running the program's text and recording the first calls."""
    from tempo.symbolic.expr import Symbol, const
    i, t = Symbol("c0", "loop"), Symbol("c1", "loop")
    root = ast.Seq((
        ast.Stmt("A", ()),
        ast.Loop(i, const(2), i <= 4, 1, ast.Seq((
            ast.Stmt("B", (i,)),
            ast.Loop(t, i + 1, t <= 5, 2, ast.Stmt("C", (i, t - 1))),
            ast.If(i >= 3, ast.Stmt("D", (i,)), ast.Stmt("B", (i + 10,))),
        ))),
    ))
    first: dict[str, tuple] = {}
    def call(stmt: ast.Stmt) -> str:
        return f"call({stmt.name!r}, ({''.join(e.to_python() + ', ' for e in stmt.index)}))"
    lines = ast.to_python(root, call)
    exec("def program(call):\n" + "\n".join(lines), namespace := {})
    namespace["program"](lambda name, point: first.setdefault(name, point))
    assert ast.first_points(root) == {"A": (), "B": (2,), "C": (2, 2), "D": (2,)}
    # D's guard skips its first iteration: first_points does not evaluate guards
    assert first == {"A": (), "B": (2,), "C": (2, 2), "D": (3,)}


def test_outputs_used_last_alike_are_freed_together_and_apart_from_the_others():
    """A host op's three outputs over ``t``: two read only at their own step, one read
    whole at the end. The first two are freed together inside the loop, the third by a
    statement of its own after every step has run; the run equals the reference."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.symbol_value(t).astype("float32")
        a, b, c = tp.udf(lambda v: (v + 1, v * 2, v - 3), [x],
                         [((), "float32"), ((), "float32"), ((), "float32")], name="three")
        both = a + b
        total = c[0:T].sum()
    exe = ctx.compile({T: 6}, [both, total], backend="numpy")
    frees = {s.freed: name for name, s in exe.schedule.statements.items()
             if s.kind == "free" and s.op is a.op}
    assert set(frees) == {(0, 1), (2,)}
    run_a = next(name for name, st in exe.schedule.statements.items() if st.kind == "exec" and st.op is a.op)
    [loop] = [lp for lp in _loops(exe.schedule.root) if run_a in dict(_statements(lp.body))]
    in_loop = dict(_statements(loop.body))
    assert frees[0, 1] in in_loop and frees[2,] not in in_loop
    got = exe.run()
    steps = np.arange(6, dtype=np.float32)
    np.testing.assert_allclose(got[both], (steps + 1) + steps * 2)
    np.testing.assert_allclose(got[total], (steps - 3).sum())
