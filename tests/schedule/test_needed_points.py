"""The needed points of recurrences: the sweep that extrapolates chains
(``polyhedral._Chains``) finds exactly the points the roots reach, point by point, and
its work does not grow with the chain's length."""

from __future__ import annotations

from collections import defaultdict

import islpy as isl
import numpy as np
import pytest

import tempo as tp
import tempo.analysis.polyhedral as polyhedral
from tempo.analysis.polyhedral import Polyhedral, needed_points
from tempo.ir.graph import program_roots
from tempo.ir.validate import resolve_bounds


def _updates():
    """PPO's parameters in miniature: ``w[i, u]`` is updated ``U`` times an iteration and
    starts each iteration from the last update of the one before."""
    ctx = tp.Context(dims=("i", "u"))
    i, u = ctx.dims
    _, U = ctx.bounds
    with ctx:
        w = tp.placeholder(shape=(3,), dtype="float32", domain=(i, u))
        start = tp.placeholder(shape=(3,), dtype="float32", domain=(i,))
        start[i == 0] = tp.const(np.ones(3, np.float32))
        start[True] = w[i - 1, U - 1]
        w[u == 0] = start[i] * 0.5
        w[True] = (w[i, u - 1] * 0.9).tanh() + 0.1
        out = w[i, U - 1].sum()
    return ctx, out


def _chain(start: int, step: int, last: int, reset=None):
    """``y[u]`` reads ``y[u - step]`` from ``u = start`` on (a constant before, and at
    ``u = reset(U)``), and the output reads the ``last`` last points of ``y``."""
    ctx = tp.Context(dims=("u",))
    u, = ctx.dims
    U, = ctx.bounds
    with ctx:
        y = tp.placeholder(shape=(3,), dtype="float32", domain=(u,))
        y[u < start] = tp.const(np.ones(3, np.float32))
        if reset is not None:
            y[u == reset(U)] = tp.const(np.full(3, 2.0, np.float32))
        y[True] = y[u - step] * 0.5 + 1.0
        out = sum((y[U - 1 - k].sum() for k in range(1, last)), y[U - 1].sum())
    return ctx, out


PROGRAMS = {"updates": (_updates, lambda U: {"I": 3, "U": U}),
            # stops short of its op's box: only y[U-1] is read, y[0:4] are never needed
            "stopping": (lambda: _chain(5, 1, 1), lambda U: {"U": U}),
            # two interleaved chains, from the last two points down
            "strided": (lambda: _chain(2, 2, 2), lambda U: {"U": U}),
            # restarts at the last quarter: nothing before is needed
            "restarted": (lambda: _chain(1, 1, 1, reset=lambda U: U - U // 4 - 1), lambda U: {"U": U})}


def _setup(name: str, length: int, parametric: bool = False):
    build, sizes = PROGRAMS[name]
    ctx, out = build()
    bounds = {b: sizes(length)[b.name] for b in ctx.bounds}
    roots = program_roots(ctx.graph, [out.op])
    graph = ctx.graph.reachable_from(roots)
    values = resolve_bounds(graph, ctx.bound_of, bounds)
    return Polyhedral(graph, values, ctx.bound_of, parametric), roots


def _points(points: isl.UnionSet) -> set[tuple[str, tuple[int, ...]]]:
    found: set[tuple[str, tuple[int, ...]]] = set()
    points.foreach_point(lambda p: found.add((p.get_space().get_tuple_name(isl.dim_type.set),
                                              tuple(polyhedral._coords(p)))))
    return found


def _reached_one_by_one(poly: Polyhedral, roots) -> set[tuple[str, tuple[int, ...]]]:
    """Every point the roots reach, following each read from each point on its own."""
    by_sink = defaultdict(list)
    for edge, rel in poly.all_reads().items():
        by_sink[poly.name(edge.sink)].append(rel)
    work = sorted(set().union(*(_points(poly.box(op)) for op in roots)))
    seen = set(work)
    while work:
        name, coords = work.pop()
        point = isl.UnionSet(f"{{ {name}[{', '.join(map(str, coords))}] }}", context=polyhedral.ISL)
        for rel in by_sink[name]:
            for found in _points(point.apply(rel)):
                if found not in seen:
                    seen.add(found)
                    work.append(found)
    return seen


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("length", [3, 9, 40])
def test_the_needed_points_are_the_points_the_roots_reach(name, length):
    poly, roots = _setup(name, length)
    assert _points(needed_points(poly, roots, poly.all_reads())) == _reached_one_by_one(poly, roots)


def test_a_chain_that_stops_short_of_its_box_is_not_extended_past_its_end():
    poly, roots = _setup("stopping", 40)
    needed = _points(needed_points(poly, roots, poly.all_reads()))
    merges = [op for op in poly.graph.ops.values() if op.kind == "merge"]
    assert len(merges) == 1
    assert sorted(c for n, c in needed if n == poly.name(merges[0])) == [(u,) for u in range(4, 40)]


@pytest.mark.parametrize("name", ["updates", "strided"])
def test_a_chain_of_parametric_length_is_closed_without_isl_closure(name):
    """Extrapolated, a chain over a bound that is an isl parameter ends (the plain sweep
    never does: each sweep adds a step, and the parameter has no value)."""
    concrete, roots = _setup(name, 40)
    parametric, _ = _setup(name, 40, parametric=True)
    got = needed_points(parametric, roots, parametric.all_reads(), closure=False)
    assert got is not None
    assert _points(parametric.fix_params(got)) == _reached_one_by_one(concrete, roots)


def test_a_chain_overshot_far_past_its_restart_is_trimmed_without_the_plain_sweep(monkeypatch):
    """The restart is 100 steps above the box's end, deeper than the 64 sweeps after which
    the plain sweep would ask isl for the transitive closure."""
    plain = []
    sweep = polyhedral._sweep

    def recorded(*args, **kwargs):
        plain.append(len(args) < 7 and "chains" not in kwargs)
        return sweep(*args, **kwargs)
    monkeypatch.setattr(polyhedral, "_sweep", recorded)
    poly, roots = _setup("restarted", 400)
    needed = _points(needed_points(poly, roots, poly.all_reads(), closure=False))
    assert needed == _reached_one_by_one(poly, roots)
    merge, = (op for op in poly.graph.ops.values() if op.kind == "merge")
    assert sorted(c for n, c in needed if n == poly.name(merge)) == [(u,) for u in range(299, 400)]
    assert plain and not any(plain)


@pytest.mark.parametrize("name", ["updates", "strided"])
def test_the_work_does_not_grow_with_the_chain(name, monkeypatch):
    """A chain ``U`` steps long used to cost about ``U`` sweeps (and past 64, isl's
    transitive closure: minutes for PPO with 10 epochs of 32 minibatches)."""
    grows = []
    plain_grow = polyhedral._grow

    def counted(points, more):
        grows[-1] += 1
        return plain_grow(points, more)
    monkeypatch.setattr(polyhedral, "_grow", counted)
    for length in (20, 400):
        grows.append(0)
        poly, roots = _setup(name, length)
        needed_points(poly, roots, poly.all_reads(), closure=False)
    assert grows[1] <= grows[0] + 4, grows


def test_trim_keeps_exactly_the_reached_points_of_any_overshoot():
    """``_Chains.trim`` from the whole boxes of a chain restarted 100 steps below its
    top (each round drops one step of each op, far more rounds than sweeps allowed)."""
    poly, roots = _setup("restarted", 400)
    reads = poly.all_reads()
    exact = _reached_one_by_one(poly, roots)
    merge, = (op for op in poly.graph.ops.values() if op.kind == "merge")
    component = next(c for c in poly.graph.components_consumers_first() if merge in c)
    by_sink = defaultdict(list)
    for edge, rel in reads.items():
        by_sink[edge.sink.id].append((edge.src.id, rel))
    chains = polyhedral._Chains(poly, component, by_sink)
    chains.extended_ops = {op.id for op in component}
    needed = {op.id: poly.box(op) for op in component}
    top = isl.UnionSet(f"{{ {poly.name(merge)}[399] }}", context=polyhedral.ISL)
    assert chains.trim(needed, {merge.id: top}, max_rounds=64)
    got = set().union(*(_points(points) for points in needed.values()))
    assert got == {(name, c) for name, c in exact if name in {poly.name(op) for op in component}}


def test_a_chains_concrete_step_is_the_general_searchs_step():
    """``_step`` over points without parameters rules candidates out by lexicographic
    order before isl's subset test; it finds the step the general search finds (random
    unions of boxes, their translates and their parts)."""
    rng = np.random.default_rng(0)

    def boxes(count: int) -> isl.UnionSet:
        parts = []
        for _ in range(count):
            lo = rng.integers(0, 6, 2)
            hi = lo + rng.integers(0, 4, 2)
            parts.append(f"S[a, b] : {lo[0]} <= a <= {hi[0]} and {lo[1]} <= b <= {hi[1]}")
        return isl.UnionSet("{ " + "; ".join(parts) + " }", context=polyhedral.ISL).coalesce()

    found = 0
    for _ in range(200):
        was = boxes(int(rng.integers(1, 3)))
        shift = [int(v) for v in rng.integers(-3, 4, 2)]
        moved = was.apply(isl.UnionMap(f"{{ S[a, b] -> S[a + {shift[0]}, b + {shift[1]}] }}",
                                       context=polyhedral.ISL))
        for now in (moved, moved.intersect(boxes(2)), boxes(1)):
            if now.is_empty():
                continue
            before, after = isl.Set.from_union_set(was), isl.Set.from_union_set(now)
            general = polyhedral._parametric_step(was, now, before, after)
            assert polyhedral._concrete_step(was, now, before, after) == general, (was, now)
            assert polyhedral._step(was, now) == general
            found += general is not None
    assert found > 100
