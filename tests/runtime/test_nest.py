"""Loop nests flattened for one scan (tempo.runtime.nest): running every statement where
the flattened iterations say, in text order, is the loop program's own execution order,
compared with the loop program run as Python."""

import numpy as np
import pytest

import tempo as tp
from tempo.runtime import nest
from tempo.schedule import ast
from tempo.symbolic.expr import Symbol, as_expr, compile_vectorized

o, c0, c1, c2 = (Symbol(n, "loop") for n in ("o", "c0", "c1", "c2"))


def _loop(var, start, stop, *body, step=1):
    return ast.Loop(var, as_expr(start), var < as_expr(stop), step, ast.Seq(tuple(body)))


def _s(name, *index):
    return ast.Stmt(name, tuple(as_expr(e) for e in index))


def _if(cond, *body):
    return ast.If(cond, ast.Seq(tuple(body)))


NESTS = {
    "peeled first iteration": _loop(c0, 0, 3, _s("A", c0), _s("B", c0, 0), _s("P", c0),
                                    _loop(c1, 1, 4, _s("B", c0, c1), _s("C", c0, c1)), _s("D", c0)),
    "peeled last iteration": _loop(c0, 0, 3, _loop(c1, 0, 3, _s("B", c0, c1), _s("C", c0, c1)),
                                   _s("B", c0, 3), _s("D", c0)),
    "peeled iterations of loops that can be empty": _loop(
        c0, 0, 4, _s("B", c0, 0), _loop(c1, 1, c0, _s("B", c0, c1)), _s("D", c0),
        _loop(c1, c0, 2, _s("C", c0, c1)), _s("C", c0, 2)),
    "guarded and empty inner loops": _loop(c0, 0, 4, _s("A", c0),
                                           _if(c0 >= 1, _loop(c1, 0, c0 - 1, _s("B", c0, c1))),
                                           _s("D", c0)),
    "sibling loops": _loop(c0, 0, 3, _loop(c1, 0, 2, _s("B", c0, c1)), _s("E", c0),
                           _loop(c1, c0, 3, _s("C", c0, c1)), _s("D", c0)),
    "three levels, triangular": _loop(c0, 0, 3, _s("A", c0),
                                      _loop(c1, 0, c0 + 1, _loop(c2, c1, 3, _s("B", c0, c1, c2)),
                                            _s("F", c0, c1)),
                                      _s("D", c0)),
    "strided, bounds of an outer counter": _loop(c0, o, o + 7, _s("A", c0),
                                                 _loop(c1, 0, 2, _s("B", c0, c1)), step=3),
}


def _interpreted(loop: ast.Loop, outer: dict) -> list[tuple]:
    """The statement instances the loop program runs, in order, run as Python."""
    trace: list[tuple] = []
    source = "\n".join(["def run(ns, o):", *ast.to_python(loop, lambda s: (
        f"ns.append(({s.name!r}, ({''.join(e.to_python() + ', ' for e in s.index)})))"), 1)])
    scope: dict = {"min": min, "max": max}
    exec(source, scope)  # noqa: S102 - the test's own generated code
    scope["run"](trace, outer.get(o, 0))
    return trace


def _flattened(loop: ast.Loop, outer: dict) -> list[tuple]:
    """The statement instances of one pass over the nest's items per flattened iteration,
    each where ``Space.at`` and its guards say."""
    params = (o,)
    flat = nest.Nest(loop, params)
    space = flat.space((outer.get(o, 0),))
    runs = []
    counters = [o, *flat.vars]
    for position, item in enumerate(flat.items):
        at = space.at(item.loop, item.after, flat.innermost(item.loop))
        values = [np.full(len(at), outer.get(o, 0)), *(space.counters[v][at] for v in flat.vars)]
        if item.guard:
            kept = np.logical_and.reduce(compile_vectorized(item.guard, counters)(*values))
            at, values = at[kept], [v[kept] for v in values]
        index = compile_vectorized(item.stmt.index, counters)(*values) if item.stmt.index else ()
        for n in range(len(at)):
            runs.append((int(at[n]), position, item.stmt.name, tuple(int(c[n]) for c in index)))
    return [(name, index) for _, _, name, index in sorted(runs)]


@pytest.mark.parametrize("name", NESTS)
def test_flattened_iterations_run_statements_in_program_order(name):
    loop = NESTS[name]
    for outer in ({o: 0}, {o: 2}):
        expected = _interpreted(loop, outer)
        assert _interpreted(nest.unpeeled(loop), outer) == expected
        assert _flattened(loop, outer) == expected


@pytest.mark.parametrize("name", ["peeled first iteration", "peeled last iteration"])
def test_peeled_iterations_go_back_into_their_loop(name):
    items = nest.levels_and_items(nest.unpeeled(NESTS[name]))[1]
    names = [item.stmt.name for item in items]
    assert len(names) == len(set(names)), names


def _skewed_loop_with_peeled_iterations():
    """A loop whose body runs ``T`` at ``c1`` and ``S``, ``F`` at ``c1 + 1``, with its
    first iteration's ``S``, ``F`` peeled before it and its last iteration's ``T`` after
    it, as isl schedules PPO's acting loop; ``A`` and ``E`` are not the loop's."""
    before = [_s("A"), _s("S", 0), _s("F", 0)]
    loop = _loop(c1, 0, 3, _s("T", c1), _s("S", c1 + 1), _s("F", c1 + 1))
    return before, loop, [_s("T", 3), _s("E")]


def test_a_loop_takes_back_the_iterations_peeled_around_it():
    before, loop, after = _skewed_loop_with_peeled_iterations()
    kept_before, unpeeled, kept_after = nest.with_peeled_iterations(before, loop, after)
    assert [s.name for s in kept_before] == ["A"] and [s.name for s in kept_after] == ["E"]
    expected = _interpreted(_loop(c0, 0, 1, *before, loop, *after), {})
    assert _interpreted(_loop(c0, 0, 1, *kept_before, unpeeled, *kept_after), {}) == expected
    assert sorted(item.stmt.name for item in nest.levels_and_items(unpeeled)[1]) == ["F", "S", "T"]


def test_flattened_iterations_of_the_program_nests():
    """Every nest of a few random programs' schedules (at the top level) flattens to the
    program's own order."""
    from test_differential import make_program
    checked = 0
    for seed in range(1000, 1012):
        prog = make_program(seed)
        exe = prog.ctx.compile(prog.bounds, [rt for rt, _ in prog.outputs], backend="numpy")
        root = ast.substitute(exe.schedule.root, exe.bounds)
        for node, _ in ast.guarded_items(root):
            if isinstance(node, ast.Loop) and nest.is_nest(node) and nest.depth(node) > 1:
                assert _flattened(node, {}) == _interpreted(node, {}), f"seed {seed}"
                checked += 1
    assert checked >= 5


def _recurrence_in_recurrence():
    """Over (i, t): ``s`` restarts at every i from ``g[i]``, a function of ``h[i]``, which
    recurs over i on the last ``s`` of the previous i: statements of the i loop before and
    after the t loop, a peeled first iteration, and values read at many later iterations."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(0)
    with ctx:
        x = tp.const(rng.uniform(-1, 1, (5, 7, 3)).astype(np.float32))[i, t]
        w = tp.const(rng.uniform(-1, 1, (5, 3)).astype(np.float32))[i]
        h = tp.placeholder(shape=(3,), dtype="float32", domain=(i,))
        g = (h * 0.5 + w).tanh()
        s = tp.placeholder(shape=(3,), dtype="float32", domain=(i, t))
        s[t == 0] = x + g
        s[True] = (s[i, t - 1] * 0.5 + x * g).tanh()
        m = s[i, T - 1] * 2.0
        h[0] = w[0]
        h[i + 1] = h[i] + m[i]
    return ctx, {I: 5, T: 7}, [s, m, h]


def test_a_nest_runs_as_one_scan():
    from tempo.reference import evaluate
    ctx, bounds, outputs = _recurrence_in_recurrence()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered"))
    profile = tp.RunProfile()
    res = exe.run(profile=profile)
    ref = evaluate(ctx, bounds, outputs)
    for rt in outputs:
        np.testing.assert_allclose(res[rt], ref[rt.key], rtol=1e-5, atol=1e-6)
    calls = {name: t.calls for (kind, name), t in profile.ops.items() if kind == "loop"}
    whole = [c for c in exe.loop_choices.values() if c.form == "lowered" and not c.fallbacks
             and calls.get(c.name) == 1 and c.depth == 2]
    assert whole and any(calls[c.name] == 0 for c in exe.loop_choices.values()), calls
    assert "a nest 2 loops deep" in str(whole[0])
    inner = [c for c in exe.loop_choices.values() if calls.get(c.name) == 0]
    assert inner and all(str(c).endswith(": not entered") for c in inner)


def test_nests_off_lowers_innermost_loops_only():
    ctx, bounds, outputs = _recurrence_in_recurrence()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered", nests=False))
    profile = tp.RunProfile()
    exe.run(profile=profile)
    calls = [t.calls for (kind, _), t in profile.ops.items() if kind == "loop" and t.calls]
    assert bounds[ctx.bounds[0]] in calls  # the t loop, once per i


def test_timed_policy_decides_a_nest_entered_once_per_run_over_runs():
    """The nest is entered once per run: the launcher keeps its timings across runs, so
    the sixth run's entry decides."""
    ctx, bounds, outputs = _recurrence_in_recurrence()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("timed"))
    nest_choice = next(c for c in exe.loop_choices.values() if c.depth == 2)
    for _ in range(5):
        exe.run()
    assert nest_choice.form is None and nest_choice.interpreted is not None
    exe.run()
    assert nest_choice.form in ("lowered", "interpreted") and nest_choice.lowered is not None
