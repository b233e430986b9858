"""Execution and memory schedule of an SDG, found with isl.

Execution: statements ``S<id>`` are the ops' needed points; validity constraints say a
source point runs before every sink point that reads it; proximity constraints pull each
sink point towards the latest point it reads, so isl fuses producers with consumers
(recurrences and windows alike). Memory: each stored point gets a free statement
``F<id>`` placed, by isl, right after its last use in the execution schedule (the lexmax
of its readers' execution times), so memory stays bounded by what the dependences and
the chosen order require. An op whose outputs are last used at different times (a fused
rollout step whose next observation is read one step later and whose flattened
observation is read by the learner after the rollout) gets one free statement per group
of outputs used last alike, ``F<id>_<k>`` after the group's first output ``k``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import islpy as isl

from tempo import cache
from tempo.analysis.polyhedral import (
    ISL,
    Polyhedral,
    check_acyclic_points,
    needed_points,
    union_of,
    union_of_maps,
)
from tempo.errors import UnschedulableError
from tempo.ir.graph import SDG, Edge, Op
from tempo.schedule import ast, bands, tree
from tempo.schedule.tree import schedule_tree
from tempo.symbolic import isl_bridge
from tempo.symbolic.expr import FALSE, TRUE, Expr, Symbol
from tempo.symbolic.isl_bridge import from_isl_ast_expr

ISLPY_VERSION = importlib.metadata.version("islpy")
SCHEDULE_ENTRY = "isl-schedules"
"""The compile cache's kind of entry for isl's schedules (``tempo.cache``)."""
AST_ENTRY = "loop-programs"
"""The compile cache's kind of entry for loop programs generated from isl's schedules."""


@dataclass(frozen=True)
class Statement:
    """What an AST statement does: execute ``op`` or free its ``outputs`` (all of them
    unless given)."""

    kind: str  # "exec" | "free"
    op: Op
    outputs: tuple[int, ...] | None = None

    @property
    def freed(self) -> tuple[int, ...]:
        """The outputs a free statement frees."""
        return tuple(range(len(self.op.outputs))) if self.outputs is None else self.outputs


@dataclass
class Schedule:
    """The scheduled loop program and what its statements mean."""

    root: ast.Node
    statements: dict[str, Statement]
    isl_schedule: isl.Schedule
    needed: dict[int, isl.Set] = field(default_factory=dict)
    last_reads: dict[Edge, Expr] = field(default_factory=dict)
    """For the edges asked about (``build_schedule``'s ``donors``): where, over the sink's
    domain, the edge's read is the last use of the point it reads (nothing reads that point
    later, nor at the same time), so the sink may take the point's memory over."""
    from_cache: bool = False
    """isl's schedule came from the compile cache (``tempo.cache``), not isl's scheduler."""

    def pseudo_code(self) -> str:
        """The loop program, with op names: what the executor runs."""
        def render(stmt: ast.Stmt) -> str:
            s = self.statements[stmt.name]
            index = ", ".join(f"{d.name}={e}" for d, e in zip(s.op.domain, stmt.index))
            return f"{'free ' if s.kind == 'free' else ''}{s.op.name}[{index}]"
        return "\n".join(line[4:] for line in ast.to_python(self.root, render))

    __str__ = pseudo_code


def build_schedule(graph: SDG, bounds: dict[Symbol, int], bound_of: dict[Symbol, Symbol],
                   roots: list[Op], kept: set[tuple[int, int]], needed: isl.UnionSet,
                   donors: Collection[Edge] = (), explain: bool = True) -> Schedule:
    """Schedule every ``needed`` point of a checked program (see ``analyze_points``).

    ``kept`` are the ``(op id, output)`` values whose points are never freed (the
    program's outputs, read at the end).
    ``donors`` are point-reading edges whose last reads the runtime wants to know
    (``Schedule.last_reads``; see ``tempo.schedule.memory.donation_candidates``).
    Where isl finds no schedule, ``UnschedulableError``; with ``explain``, naming a
    point that waits for itself where there is one (a search over the concrete points,
    which a compile that tries another program next skips).
    """
    poly, poly_needed, poly_reads = _parametric_if_exact(graph, bounds, bound_of, roots, needed)
    if poly is None:
        poly = Polyhedral(graph, bounds, bound_of)
        poly_needed, poly_reads = needed, poly.all_reads()
    live_reads = {e: r.intersect_domain(poly_needed) for e, r in poly_reads.items()}
    statements = {name: Statement("exec", op) for name, op in poly.statements.items()}
    schedule, from_cache = _schedule(poly, poly_needed, live_reads)
    if schedule is None:
        if explain:
            concrete = Polyhedral(graph, bounds, bound_of)
            check_acyclic_points(concrete, needed, concrete.all_reads())
        raise UnschedulableError("isl found no schedule satisfying the program's dependences")
    # The schedule holds for any bounds; the loop program is generated for the concrete
    # ones, where conditions on the bounds (a checkpoint at the last iteration or not)
    # are decided instead of becoming branches of the program.
    theta = schedule.get_map().intersect_domain(poly_needed)
    consumers = graph.consumers()
    uses = {(op.id, k): _uses(poly, op, [e for e in consumers[op.id] if e.src_out == k], poly_needed,
                              live_reads, theta)
            for op in graph.ops.values() if op.domain
            for k in range(len(op.outputs)) if (op.id, k) not in kept}
    last_use = _LastUse()
    lasts = {key: last_use(key_uses) for key, key_uses in uses.items() if not key_uses[None].is_empty()}
    frees = _free_statements(graph, lasts)
    statements.update({name: stmt for name, (stmt, _) in frees.items()})
    statements.update({_free_name(op, None): Statement("free", op) for op in poly.statements.values()
                       if not any(st.op is op for st, _ in frees.values())})
    times = poly.fix_params(_with_frees(theta, {name: last for name, (_, last) in frees.items()}))
    root = _loop_program(times, statements)
    last_reads = {edge: _last_read_condition(poly, edge, live_reads[edge], theta, uses[_key(edge)],
                                             lasts[_key(edge)], poly_needed)
                  for edge in donors if _key(edge) in lasts}
    return Schedule(root, statements, schedule, last_reads=last_reads, from_cache=from_cache)


def _loop_program(times: isl.UnionMap, statements: Collection[str]) -> ast.Node:
    """The loop program that runs each statement instance at its time (``times``): from
    the compile cache when an earlier run made it for the same times (isl's AST generation
    and ours from it cost PPO a quarter of a second), else made and kept there."""
    key = f"islpy {ISLPY_VERSION}\n{_generator_digest()}\n{times}"
    text = cache.load(AST_ENTRY, key)
    if text is not None:
        try:
            return ast.from_text(text, statements)
        except ValueError:
            pass  # a damaged entry: made again and rewritten
    build = isl.AstBuild.from_context(isl.Set("{ : }", context=ISL))
    root = ast.from_isl(build.node_from_schedule(schedule_tree(times.domain(), times)), {})
    try:
        cache.store(AST_ENTRY, key, ast.to_text(root))
    except (TypeError, ValueError):  # (a constant JSON cannot hold: the program is not kept)
        pass
    return root


@functools.cache
def _generator_digest() -> str:
    """A digest of the code that turns times into a loop program (part of its cache key:
    a program generated by other code is not reused)."""
    modules = (tree, ast, bands, isl_bridge)
    return hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in modules)).hexdigest()


def _key(edge: Edge) -> tuple[int, int]:
    return edge.src.id, edge.src_out


def _free_statements(graph: SDG, lasts: dict[tuple[int, int], isl.UnionMap]
                     ) -> dict[str, tuple[Statement, isl.UnionMap]]:
    """A free statement per op, or per group of its outputs whose points are last used at
    the same times (``lasts``), with those times.

    Outputs are grouped by their times' text: outputs whose uses total the same relation
    share one lexmax (``_LastUse``), and the other equal pairs of PPO, n-step and
    REINFORCE printed alike too; printing each relation and a dictionary lookup replace
    isl's equality test, 70 us a pair (PPO's update, one op of 46 outputs read at 39
    different last times: 780 unequal pairs, 56 ms). Should two equal relations print
    differently, their outputs get a free statement each, at the same times: one
    statement more, the same frees."""
    groups: dict[int, dict[str, tuple[list[int], isl.UnionMap]]] = {}
    for (op_id, k), last in lasts.items():
        group = groups.setdefault(op_id, {}).setdefault(str(last), ([], last))
        group[0].append(k)
    out = {}
    for op_id, by_text in groups.items():
        op = graph.ops[op_id]
        for outputs, last in by_text.values():
            whole = len(by_text) == 1 and len(outputs) == len(op.outputs)
            stmt = Statement("free", op, None if whole else tuple(outputs))
            out[_free_name(op, None if whole else outputs[0])] = (stmt, last)
    return out


def _schedule(poly: Polyhedral, needed: isl.UnionSet,
              reads: dict[Edge, isl.UnionMap]) -> tuple[isl.Schedule | None, bool]:
    """isl's execution schedule. Validity: every source point before the sink points that
    read it. Proximity: each sink point close to the latest point it reads (proximity to a
    whole window would keep isl from fusing a producer with its window readers), away from
    the bounds (see ``_steady``). Also whether it came from the compile cache."""
    live = [rel for rel in reads.values() if not rel.is_empty()]
    none = poly.union_map("{ }")
    stops = _sinks_before_stops(poly).intersect_domain(needed).intersect_range(needed)
    # Coalesced: the same relations in fewer pieces, which isl's scheduler solves faster.
    validity = union_of_maps([none, *(rel.reverse() for rel in live), stops]).coalesce()
    proximity = union_of_maps([none, *(_steady(rel.lexmax()).reverse() for rel in live)]).coalesce()
    try:
        sc = isl.ScheduleConstraints.on_domain(needed).set_context(poly.context()) \
            .set_validity(validity).set_proximity(proximity)
    except isl.Error:
        return None, False
    return _cached_schedule(sc)


def _sinks_before_stops(poly: Polyhedral) -> isl.UnionMap:
    """Each stop check (``tp.stop_when``) after the other sinks of its point (those over
    its dims, and over inner dims too: every ``t`` of a stop's iteration ``i``): a run that
    stops there still streams that point's token or logs its metrics."""
    ops = poly.statements.values()
    sinks = [op for op in ops if op.kind == "udf" and not op.outputs and not op.params.get("stops")]
    before = poly.union_map("{ }")
    for stop in (op for op in ops if op.params.get("stops")):
        for sink in (s for s in sinks if s.domain[:len(stop.domain)] == stop.domain):
            before = before.union(poly.at_point_of(sink, stop))
    return before


NO_SCHEDULE = "none"
"""The compile cache's entry for constraints isl found no schedule for (a program the
compiler then tries without joined siblings, say: the next compile skips isl's search)."""


def _cached_schedule(sc: isl.ScheduleConstraints) -> tuple[isl.Schedule | None, bool]:
    """isl's schedule for ``sc`` (None where there is none): from the compile cache
    (``tempo.cache``) when an earlier run computed it, else computed and kept there; and
    whether it came from the cache."""
    key = f"islpy {ISLPY_VERSION}\n{sc}"  # another isl may schedule the same constraints otherwise
    text = cache.load(SCHEDULE_ENTRY, key)
    if text == NO_SCHEDULE:
        return None, True
    if text is not None:
        try:
            return isl.Schedule.read_from_str(ISL, text), True
        except isl.Error:
            pass  # a damaged entry: computed again and rewritten
    try:
        schedule = sc.compute_schedule()
    except isl.Error:
        schedule = None
    cache.store(SCHEDULE_ENTRY, key, NO_SCHEDULE if schedule is None else str(schedule))
    return schedule, False


def _steady(latest: isl.UnionMap) -> isl.UnionMap:
    """The pieces of a read's latest points that do not depend on the bounds, where there
    are any: ``r[t:min(t+n, T)]`` reads ``r[t+n-1]`` up to ``t = T-n`` and ``r[T-1]``
    after. isl fuses a producer with a reader only if the distance along the proximity
    edge stays within 2 everywhere; the tail piece alone (distance up to n-1 from the
    shift that fuses the rest) would keep the n-step learner out of the acting loop."""
    pieces: list[isl.BasicMap] = []
    latest.foreach_map(lambda m: m.foreach_basic_map(pieces.append))
    steady = [p for p in pieces if not _involves_bounds(p.gist_domain(p.domain()))]
    if not steady or len(steady) == len(pieces):
        return latest
    out = isl.UnionMap.from_basic_map(steady[0])
    for piece in steady[1:]:
        out = out.union(isl.UnionMap.from_basic_map(piece))
    return out


def _involves_bounds(piece: isl.BasicMap) -> bool:
    return piece.involves_dims(isl.dim_type.param, 0, piece.dim(isl.dim_type.param))


def _uses(poly: Polyhedral, op: Op, readers: list[Edge], needed: isl.UnionSet,
          reads: dict[Edge, isl.UnionMap], theta: isl.UnionMap) -> dict[Edge | None, isl.UnionMap]:
    """``{ op[q] -> time }`` for each edge reading ``op``, and (under None) its production."""
    out: dict[Edge | None, isl.UnionMap] = {None: theta.intersect_domain(needed.intersect(poly.box(op)))}
    for edge in readers:
        out[edge] = reads[edge].reverse().apply_range(theta)
    return out


class _LastUse:
    """``{ op[q] -> time }`` for an output's uses (``_uses``): the time of each point's last
    use (its production, or the latest read of it in schedule order). Outputs whose uses
    total the same relation (a fused op's outputs read by the same ops) share one lexmax,
    found by the relation's text (isl's lexmax took 0.5 ms an output of PPO's 127)."""

    def __init__(self) -> None:
        self._by_text: dict[str, isl.UnionMap] = {}

    def __call__(self, uses: dict[Edge | None, isl.UnionMap]) -> isl.UnionMap:
        total = uses[None]
        for rel in uses.values():
            total = total.union(rel)
        text = str(total)
        last = self._by_text.get(text)
        if last is None:
            last = self._by_text[text] = total.lexmax().coalesce()
        return last


def _with_frees(theta: isl.UnionMap, lasts: dict[str, isl.UnionMap]) -> isl.UnionMap:
    """Execution times of every statement, with each free statement (by name) right after
    the last use of each point it frees (``lasts``; zero-dim and kept ops are not freed
    during the run).

    Times get a trailing 0 for executions and 1 for frees, so a free follows the statement
    it waits for.
    """
    frees = (isl.Map.from_union_map(last).set_tuple_name(isl.dim_type.in_, name)
             for name, last in lasts.items())
    return union_of_maps([_append_dim(theta, 0),
                          *(_append_dim(isl.UnionMap.from_map(free), 1) for free in frees)])


def _last_read_condition(poly: Polyhedral, edge: Edge, reads: isl.UnionMap, theta: isl.UnionMap,
                         uses: dict[Edge | None, isl.UnionMap], last: isl.UnionMap,
                         needed: isl.UnionSet) -> Expr:
    """Where (over ``edge.sink``'s domain) the edge's read is the last use (``last``) of the
    point it reads, and no other use of that point is at the same time (a sink reading it
    twice)."""
    others = uses[None]
    for other, rel in uses.items():
        if other is not None and other is not edge:
            others = others.union(rel)
    shared = others.intersect(last).domain()  # points another use ties for last
    exclusive = last.subtract_domain(shared)
    sink_points = reads.apply_range(exclusive).intersect(theta).domain()
    sink = needed.intersect(poly.box(edge.sink))
    return _condition(poly.fix_params(sink_points), poly.fix_params(sink), edge.sink.domain)


def _condition(points: isl.UnionSet, context: isl.UnionSet, dims: tuple[Symbol, ...]) -> Expr:
    """``points`` (a subset of one statement's ``context``) as a condition over ``dims``."""
    if points.is_empty():
        return FALSE
    if points.is_equal(context):
        return TRUE
    n = len(dims)

    def as_params(s: isl.UnionSet) -> isl.Set:
        one = isl.Set.from_union_set(s)
        for k in range(n):
            one = one.set_dim_name(isl.dim_type.set, k, f"d{k}")
        return one.move_dims(isl.dim_type.param, 0, isl.dim_type.set, 0, n).params()
    build = isl.AstBuild.from_context(as_params(context))
    expr = build.expr_from_set(as_params(points).gist(as_params(context)))
    return from_isl_ast_expr(expr, {f"d{k}": d for k, d in enumerate(dims)})


def _append_dim(times: isl.UnionMap, value: int) -> isl.UnionMap:
    maps = times.get_map_list()
    out = union_of_maps(isl.UnionMap.from_map(_with_dim(maps.get_at(k), value)) for k in range(maps.n_map()))
    return out if out is not None else times


def _with_dim(m: isl.Map, value: int) -> isl.Map:
    """``m`` with one more output dim, fixed to ``value``."""
    n = m.dim(isl.dim_type.out)
    return m.add_dims(isl.dim_type.out, 1).fix_val(isl.dim_type.out, n, isl.Val(value, context=ISL))


def _parametric_if_exact(graph: SDG, bounds: dict[Symbol, int], bound_of: dict[Symbol, Symbol],
                         roots: list[Op], needed: isl.UnionSet):
    """The parametric view, when its needed points agree with the concrete ones."""
    poly = Polyhedral(graph, bounds, bound_of, parametric=True)
    reads = poly.all_reads()
    poly_needed = _bound_relative_boxes(poly, needed)
    if poly_needed is None:
        poly_needed = needed_points(poly, roots, reads)
    if not poly.fix_params(poly_needed).is_equal(needed):
        return None, None, None
    return poly, _simplest_agreeing(poly, poly_needed, needed), reads


def _bound_relative_boxes(poly: Polyhedral, concrete: isl.UnionSet) -> isl.UnionSet | None:
    """Each op's concrete needed points written relative to the bounds (``0 <= i <= I - 2``),
    when that describes every op exactly at the concrete bounds. A chain that the
    parametric fixpoint walks one step per round (``s[I-1] <- s[I-2] <- ...``) would
    otherwise need isl's transitive closure, which is slow for large programs; only the
    concrete bounds are ever run."""
    guesses = [isl.UnionSet("{ }", context=ISL)]
    for op in poly.graph.ops.values():
        points = concrete.intersect(poly.fix_params(poly.box(op)))
        if points.is_empty():
            continue
        guess = _relative_guess(poly, op, points)
        if guess is None:
            return None
        guesses.append(guess)
    return union_of(guesses)


def _relative_guess(poly: Polyhedral, op: Op, points: isl.UnionSet) -> isl.UnionSet | None:
    """``points`` of ``op`` as, in turn: its one point, each coordinate 0 or relative to its
    bound (where it is one point); a box with bound-relative upper ends; that box up to
    its lexicographic maximum (an iteration's last update not needed); either, cut by what
    else bounds the points inside it (``u mod 4 = 0``). None if none agrees."""
    piece = isl.Set.from_union_set(points)
    vars_ = [f"a{k}" for k in range(len(op.domain))]
    top = _lexmax(piece)
    relative = [f"{poly.params[poly.bound_of[d]]} - {poly.bounds[poly.bound_of[d]] - v}"
                for d, v in zip(op.domain, top)]
    box = [f"{piece.dim_min_val(k).to_python()} <= a{k} <= {poly.params[poly.bound_of[d]]} - "
           f"{poly.bounds[poly.bound_of[d]] - piece.dim_max_val(k).to_python()}"
           for k, d in enumerate(op.domain)]
    lex = " or ".join(
        "(" + " and ".join([f"{v} = {m}" for v, m in zip(vars_[:k], relative[:k])]
                           + [f"{vars_[k]} {'<=' if k == len(vars_) - 1 else '<'} {relative[k]}"]) + ")"
        for k in range(len(vars_)))
    whole = poly.box(op)
    # One point (a checkpoint at the last iteration): each coordinate 0 or relative to its
    # bound (``a0 = I - 1``), not a box with a concrete lower end (``399 <= a0 <= I - 1``),
    # so that isl's constraints, the schedule's cache key, are the same for any number of
    # iterations.
    point = [f"{v} = {'0' if m == 0 else r}" for v, m, r in zip(vars_, top, relative)] \
        if piece.is_singleton() else None
    for constraints in (point, box, [*box, f"({lex})"] if vars_ else None):
        if constraints is None:
            continue
        guess = whole.intersect(poly.union_set(
            f"{{ {poly.name(op)}[{', '.join(vars_)}] : {' and '.join(constraints) or 'true'} }}"))
        if poly.fix_params(guess).is_equal(points):
            return guess
        cut = guess.intersect(points.gist(poly.fix_params(guess)))
        if poly.fix_params(cut).is_equal(points):
            return cut
    return None


def _lexmax(piece: isl.Set) -> list[int]:
    point = piece.lexmax().sample_point()
    return [point.get_coordinate_val(isl.dim_type.set, k).to_python()
            for k in range(piece.dim(isl.dim_type.set))]


def _simplest_agreeing(poly: Polyhedral, needed: isl.UnionSet, concrete: isl.UnionSet
                       ) -> isl.UnionSet:
    """Each op's needed set replaced by its convex hull where that agrees with the concrete
    needed points. Closures of reads guarded by modulo conditions come back as unions of
    existentially quantified pieces, which make AST generation very slow; only the
    concrete bounds are ever run, so agreement there is all that matters."""
    out = isl.UnionSet("{ }", context=ISL)
    sets = needed.get_set_list()
    for k in range(sets.n_set()):
        piece = sets.get_at(k)
        hull = isl.Set.from_basic_set(piece.polyhedral_hull())
        same = poly.fix_params(isl.UnionSet.from_set(hull)).is_equal(
            poly.fix_params(isl.UnionSet.from_set(piece)))
        out = out.union(isl.UnionSet.from_set(hull if same else piece))
    return out


def _free_name(op: Op, first: int | None) -> str:
    """``F<id>``: the free of all of the op's outputs; ``F<id>_<k>``: of a group whose
    first output is ``k``."""
    return f"F{op.id}" if first is None else f"F{op.id}_{first}"
