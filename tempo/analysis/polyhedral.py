"""The SDG as polyhedra: statement domains and read relations as isl objects.

Each op becomes an isl statement ``S<id>`` (``statement_name``) whose instances are the
op's points; each edge becomes a read relation ``{ S<sink>[p] -> S<src>[q] : q in phi(p),
cond(p) }``. The mapping from statement names to ops is kept in a dict, never parsed back
from names.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache

import islpy as isl

from tempo.errors import (
    OutOfRangeError,
    UndefinedPointError,
    UnschedulableError,
    UnsupportedExpressionError,
)
from tempo.ir.graph import SDG, Edge, Op
from tempo.symbolic.expr import TRUE, Expr, Slice, Symbol, logical_and, logical_not
from tempo.symbolic.isl_bridge import to_isl


def statement_name(op_id: int) -> str:
    """The isl statement of op ``op_id``: its points are the statement's instances."""
    return f"S{op_id}"


def _scheduler_context() -> isl.Context:
    """An isl context of our own, so that scheduler options never touch islpy's default."""
    return isl.Context()


ISL = _scheduler_context()


# Parsed once per text: a compile builds the same relations several times (demand on
# concrete bounds and parametric, checks, the schedule), about 100 us a parse, and isl
# objects are values (islpy copies what isl's operations consume).
@lru_cache(maxsize=16384)
def union_set(text: str) -> isl.UnionSet:
    return isl.UnionSet(text, context=ISL)


@lru_cache(maxsize=16384)
def union_map(text: str) -> isl.UnionMap:
    return isl.UnionMap(text, context=ISL)


_READ_TEXTS: dict[tuple, str] = {}
READ_TEXTS_MAX = 16384
"""Read relations' texts by what they are made from (``Polyhedral._reads``): the passes
build the same relations again on new graphs (PPO on gymnax: 3,993 in a compile, of 70
texts), and making a text takes tens of microseconds of expression printing."""

# Statements that read alike, or have the same box, share a parse: the text names
# placeholder tuples, which are renamed (about 3 us against 120 for a parse). The passes
# renumber ops, so without this most of a compile's relations were new texts (PPO: 2,134
# parses of read relations, 0.24 s).
SINK, SOURCE, STATEMENT = "sink", "source", "statement"
"""Placeholder tuple names in the texts ``named_map`` and ``named_set`` parse."""


def named_map(text: str, sink: str, source: str) -> isl.UnionMap:
    """``union_map(text)`` with tuples ``SINK`` and ``SOURCE`` renamed ``sink`` and
    ``source``."""
    relation = union_map(text)
    if relation.n_map() == 0:  # (isl found it empty when parsing: no tuples to rename)
        return relation
    renamed = isl.Map.from_union_map(relation).set_tuple_name(isl.dim_type.in_, sink) \
        .set_tuple_name(isl.dim_type.out, source)
    return isl.UnionMap.from_map(renamed)


def named_set(text: str, name: str) -> isl.UnionSet:
    """``union_set(text)`` with tuple ``STATEMENT`` renamed ``name``."""
    points = union_set(text)
    if points.n_set() == 0:
        return points
    return isl.UnionSet.from_set(isl.Set.from_union_set(points).set_tuple_name(name))


@dataclass
class Polyhedral:
    """Isl views of an SDG: with the concrete ``bounds`` folded in, or, when
    ``parametric``, with every bound an isl parameter ``p_<name>`` (a schedule found this
    way does not depend on the bounds' magnitude, and holds for any bounds)."""

    graph: SDG
    bounds: dict[Symbol, int]
    bound_of: dict[Symbol, Symbol]
    parametric: bool = False

    @property
    def params(self) -> dict[Symbol, str]:
        """isl parameter name of each bound (empty when concrete)."""
        if not self.parametric:
            return {}
        return {b: f"p_{b.name}" for b in sorted(set(self.bound_of.values()), key=lambda b: b.name)}

    def _text(self, body: str) -> str:
        params = self.params
        return f"[{', '.join(params.values())}] -> {body}" if params else body

    def context(self) -> isl.Set:
        """Constraints on the parameters: every bound is at least 1."""
        cond = " and ".join(f"{p} >= 1" for p in self.params.values()) or "true"
        return isl.Set(self._text(f"{{ : {cond} }}"), context=ISL)

    def fix_params(self, s: isl.UnionSet | isl.UnionMap) -> isl.UnionSet | isl.UnionMap:
        """``s`` with every parameter set to its concrete bound (and then dropped)."""
        if not self.parametric:
            return s
        return s.intersect_params(self._concrete_params).project_out_all_params()

    @cached_property
    def _concrete_params(self) -> isl.Set:
        """The parameters at their concrete bounds."""
        values = " and ".join(f"{p} = {self.bounds[b]}" for b, p in self.params.items()
                              if b in self.bounds)
        return isl.Set(self._text(f"{{ : {values or 'true'} }}"), context=ISL)

    def _bound(self, b: Symbol) -> str:
        return self.params[b] if self.parametric else str(self.bounds[b])

    @property
    def statements(self) -> dict[str, Op]:
        """isl statement name of every op."""
        return {self.name(op): op for op in self.graph.ops.values()}

    @staticmethod
    def name(op: Op) -> str:
        return statement_name(op.id)

    def _vars(self, op: Op, prefix: str) -> dict[Symbol, str]:
        return {d: f"{prefix}{k}" for k, d in enumerate(op.domain)}

    def _names(self, op: Op, prefix: str) -> dict[Symbol, str]:
        bounds = {b: self._bound(b) for b in set(self.bound_of.values())
                  if self.parametric or b in self.bounds}
        return {**bounds, **self._vars(op, prefix)}

    def _box_text(self, op: Op, prefix: str) -> list[str]:
        """The op's points: the box of its dims, where its ``when`` condition holds."""
        box = [f"0 <= {v} < {self._bound(self.bound_of[d])}"
               for d, v in self._vars(op, prefix).items()]
        if op.when is not TRUE:
            box.append(to_isl(op.when, self._names(op, prefix)))
        return box

    def union_set(self, body: str) -> isl.UnionSet:
        return union_set(self._text(body))

    def union_map(self, body: str) -> isl.UnionMap:
        return union_map(self._text(body))

    def box(self, op: Op) -> isl.UnionSet:
        """Every point of ``op``'s domain."""
        vars_ = ", ".join(self._vars(op, "a").values())
        return named_set(self._text(f"{{ {STATEMENT}[{vars_}] : "
                                    f"{' and '.join(self._box_text(op, 'a')) or 'true'} }}"), self.name(op))

    def reads(self, edge: Edge, cond: Expr = TRUE) -> isl.UnionMap:
        """``{ sink[p] -> src[q] }``: the source points the sink reads at each of its points.

        Read points outside the source's range are kept (``check_reads`` reports them).
        """
        try:
            return self._reads(edge, cond)
        except UnsupportedExpressionError as err:
            raise UnsupportedExpressionError(
                f"{edge.sink.name} reads {edge.src.name} at [{', '.join(map(str, edge.phi))}]: "
                f"{err.args[0]}", edge.sink.site) from None

    def _reads(self, edge: Edge, cond: Expr) -> isl.UnionMap:
        full_cond = logical_and(edge.cond, cond)
        key = (self._sizes, edge.sink.domain, edge.sink.when, edge.src.domain, edge.phi, full_cond)
        text = _READ_TEXTS.get(key)
        if text is None:
            if len(_READ_TEXTS) >= READ_TEXTS_MAX:
                _READ_TEXTS.clear()
            text = _READ_TEXTS[key] = self._read_text(edge, full_cond)
        return named_map(text, self.name(edge.sink), self.name(edge.src))

    @cached_property
    def _sizes(self) -> tuple:
        """What a read relation's text takes from this view besides the edge: the bounds
        (or that they are parameters) and which bound each dim has."""
        return (self.parametric, tuple(sorted(self.bounds.items(), key=lambda kv: kv[0].name)),
                tuple(sorted(self.bound_of.items(), key=lambda kv: kv[0].name)))

    def _read_text(self, edge: Edge, full_cond: Expr) -> str:
        """The text of ``edge``'s read relation where ``full_cond`` holds, with placeholder
        tuples (``named_map``)."""
        sink_names = self._names(edge.sink, "a")
        src_vars = self._vars(edge.src, "b")
        constraints = self._box_text(edge.sink, "a")
        if full_cond is not TRUE:
            constraints.append(to_isl(full_cond, sink_names))
        for dim, entry in zip(edge.src.domain, edge.phi):
            b = src_vars[dim]
            if isinstance(entry, Slice):
                constraints.append(f"{to_isl(entry.start, sink_names)} <= {b} < "
                                   f"{to_isl(entry.stop, sink_names)}")
            else:
                constraints.append(f"{b} = {to_isl(entry, sink_names)}")
        sink_vars = ", ".join(self._vars(edge.sink, "a").values())
        return self._text(f"{{ {SINK}[{sink_vars}] -> {SOURCE}[{', '.join(src_vars.values())}] : "
                          f"{' and '.join(constraints) or 'true'} }}")

    def at_point_of(self, before: Op, after: Op) -> isl.UnionMap:
        """``{ before[p] -> after[q] }`` where ``q`` is ``p`` on ``after``'s dims (each of
        which ``before`` has), at the points of both."""
        mine, theirs = self._vars(before, "a"), self._vars(after, "c")
        cond = [*self._box_text(before, "a"), *self._box_text(after, "c"),
                *(f"{theirs[d]} = {mine[d]}" for d in after.domain)]
        sink, source = ", ".join(mine.values()), ", ".join(theirs.values())
        text = self._text(f"{{ {SINK}[{sink}] -> {SOURCE}[{source}] : {' and '.join(cond) or 'true'} }}")
        return named_map(text, self.name(before), self.name(after))

    def condition_set(self, op: Op, cond: Expr) -> isl.UnionSet:
        vars_ = ", ".join(self._vars(op, "a").values())
        return self.union_set(f"{{ {self.name(op)}[{vars_}] : "
                              f"{to_isl(cond, self._names(op, 'a'))} }}")

    def all_reads(self) -> dict[Edge, isl.UnionMap]:
        """Read relations of every edge; a merge branch is taken only where no earlier one is."""
        out: dict[Edge, isl.UnionMap] = {}
        for op in self.graph.ops.values():
            earlier: Expr = TRUE
            for edge in self.graph.in_edges(op):
                out[edge] = self.reads(edge, earlier if op.kind == "merge" else TRUE)
                if op.kind == "merge":
                    earlier = logical_and(earlier, logical_not(edge.cond))
        return out


def needed_points(poly: Polyhedral, roots: list[Op], reads: dict[Edge, isl.UnionMap],
                  max_rounds: int = 64, closure: bool = True) -> isl.UnionSet | None:
    """Points of every op that the roots depend on, transitively (roots included).

    Walks the graph's strongly connected components, consumers first: an op's needed
    points are complete once every op that reads it is done, so the acyclic part costs
    one application of each read relation. Inside a recurrence the reads are swept in
    consumers-first order until nothing grows, chains that grow by a constant step
    extrapolated (``_Chains``); where that fails, swept plainly, and a chain that grows one
    point per sweep (``y[T-1] <- y[T-2] <- ...``) falls back to isl's transitive closure
    of the recurrence's reads after ``max_rounds`` sweeps, or, without ``closure``, gives
    None.
    """
    by_sink: dict[int, list[tuple[int, isl.UnionMap]]] = defaultdict(list)
    for edge, rel in reads.items():
        by_sink[edge.sink.id].append((edge.src.id, rel))
    needed: dict[int, isl.UnionSet] = {op.id: poly.box(op) for op in roots}
    for component in poly.graph.components_consumers_first():
        members = [op.id for op in component]
        inside = set(members)
        if any(src in inside for k in members for src, _ in by_sink[k]):
            if not _close_recurrence(poly, component, by_sink, needed, max_rounds, closure):
                return None
        for k in members:
            if k in needed:
                for src, rel in by_sink[k]:
                    if src not in inside:
                        needed[src] = _grow(needed.get(src), needed[k].apply(rel))
    return _union_sets(needed.values()).coalesce()


def _close_recurrence(poly: Polyhedral, component: list[Op],
                      by_sink: dict[int, list[tuple[int, isl.UnionMap]]],
                      needed: dict[int, isl.UnionSet], max_rounds: int, closure: bool) -> bool:
    """Grow ``needed`` inside one recurrence to its fixpoint (see ``needed_points``): with
    chains extrapolated and trimmed, else (the sweep or the trim did not end) plainly."""
    inside = {op.id for op in component}
    order = _consumers_first(component, by_sink)
    start = {k: needed[k] for k in order if k in needed}
    chains = _Chains(poly, component, by_sink)
    if _sweep(order, inside, by_sink, needed, dict(start), max_rounds, chains) \
            and chains.trim(needed, start, max_rounds):
        return True
    for k in order:  # the extrapolated chains did not settle: sweep plainly
        needed.pop(k, None)
    needed.update(start)
    if _sweep(order, inside, by_sink, needed, dict(start), max_rounds):
        return True
    if not closure:
        return False
    relation = _union_maps(rel for k in order for src, rel in by_sink[k] if src in inside)
    reach, _exact = relation.transitive_closure()
    begin = _union_sets(needed[k] for k in order if k in needed)
    reached = begin.union(begin.apply(reach))
    for op in component:
        points = reached.intersect(poly.box(op))
        if not points.is_empty():
            needed[op.id] = points.coalesce()
    return True


def _sweep(order: list[int], inside: set[int], by_sink: dict[int, list[tuple[int, isl.UnionMap]]],
           needed: dict[int, isl.UnionSet], pending: dict[int, isl.UnionSet], max_rounds: int,
           chains: _Chains | None = None) -> bool:
    """Apply the recurrence's reads to the ``pending`` points, consumers first, adding
    what they reach to ``needed`` (and, extrapolated by ``chains``, what the chain it
    continues reaches), until nothing grows (True) or ``max_rounds`` sweeps (False)."""
    for _ in range(max_rounds):
        if not pending:
            return True
        for k in order:
            points = pending.pop(k, None)
            if points is None:
                continue
            for src, rel in by_sink[k]:
                if src in inside:
                    new = points.apply(rel)
                    if src in needed:
                        new = new.subtract(needed[src])
                    if not new.is_empty():
                        if chains is not None:
                            new = chains.extended(src, new, needed.get(src))
                        needed[src] = _grow(needed.get(src), new)
                        pending[src] = _grow(pending.get(src), new)
    return not pending


class _Chains:
    """Extrapolates chains in a recurrence's needed points. A recurrence over a dim with
    ``U`` steps (PPO's parameters over its minibatch updates, ``p[u] <- p[u-1]``) grows
    its ops' needed points by a step or a few per sweep, so a plain sweep costs ``U``
    sweeps (and isl's transitive closure where ``U`` is large, which took minutes for PPO
    with 10 epochs of 32 minibatches). Where an op grows by points that are the last points
    it grew by, moved by a constant step ``v``, the step is taken to repeat: the points
    moved by ``2v``, ``3v``, ... that a read in the recurrence can reach are added at once.

    The line stops before the first of its points that no read in the recurrence reaches,
    but may still overshoot where the chain ends (a branch that stops reading the step
    before). When the sweep ends, the points found hold every point the roots reach and
    are closed under the reads; ``trim`` then keeps the points that are read by a point
    kept (or are where the recurrence started), until nothing more goes. What is left is
    exactly the points the roots reach where the points it overshot into have acyclic
    dependences: a point kept but not reached would be read only by such points, without
    end among finitely many. (Points that depend on themselves with no temporal distance,
    ``a = b + 1; b = a + 1``, can never be ordered; reached this way they are kept, and the
    program is rejected as unschedulable, ``check_acyclic_points``, though it never needs
    them.)"""

    def __init__(self, poly: Polyhedral, component: list[Op],
                 by_sink: dict[int, list[tuple[int, isl.UnionMap]]]):
        self.poly = poly
        self.ops = {op.id: op for op in component}
        self.sources = {k: {src for src, _ in by_sink[k] if src in self.ops} for k in self.ops}
        self.readers: dict[int, list[tuple[int, isl.UnionMap]]] = defaultdict(list)
        for k in self.ops:
            for src, rel in by_sink[k]:
                if src in self.ops:
                    self.readers[src].append((k, rel))
        self.last: dict[int, isl.UnionSet] = {}
        self.readable: dict[int, isl.UnionSet | None] = {}
        self.extended_ops: set[int] = set()

    def extended(self, k: int, new: isl.UnionSet, known: isl.UnionSet | None) -> isl.UnionSet:
        """``new`` points of op ``k`` (not in ``known``), with their chain's continuation."""
        last, self.last[k] = self.last.get(k), new
        step = None if last is None else _step(last, new)
        if step is None:
            return new
        readable = self._readable(k)
        if readable is None:
            return new
        ray = _ray(statement_name(k), step)
        line = new.apply(ray).intersect(self.poly.box(self.ops[k]))
        gaps = line.subtract(readable)  # the chain stops at the first point nothing reads
        ahead = line.subtract(gaps).subtract(gaps.apply(ray))
        if known is not None:
            ahead = ahead.subtract(known)
        if ahead.is_empty():
            return new
        self.extended_ops.add(k)
        return new.union(ahead).coalesce()

    def _readable(self, k: int) -> isl.UnionSet | None:
        """The points of op ``k`` that a read in the recurrence reaches from anywhere."""
        if k not in self.readable:
            self.readable[k] = union_of(self.poly.box(self.ops[sink]).apply(rel)
                                        for sink, rel in self.readers[k])
        return self.readable[k]

    def trim(self, needed: dict[int, isl.UnionSet], start: dict[int, isl.UnionSet],
             max_rounds: int) -> bool:
        """Drop the points that nothing kept reads (see the class), from the extended ops
        on to the ops whose readers lost points. An overshot chain goes a step a round, and
        a round looks at those ops only: with concrete bounds (finitely many points) until
        nothing goes; with parametric ones, False after ``max_rounds`` rounds."""
        check = set(self.extended_ops)
        rounds = itertools.count() if not self.poly.parametric else range(max_rounds)
        for _ in rounds:
            if not check:
                return True
            lost = {k for k in check if k in needed and not self._kept_reached(k, needed, start)}
            check = {src for k in lost for src in self.sources[k]}
        return not check

    def _kept_reached(self, k: int, needed: dict[int, isl.UnionSet], start: dict[int, isl.UnionSet]) -> bool:
        """Keep only the points of op ``k`` where the recurrence started or that a needed
        point reads; whether all of them were."""
        reached = union_of([*([start[k]] if k in start else []),
                            *(needed[sink].apply(rel) for sink, rel in self.readers[k] if sink in needed)])
        if reached is not None and needed[k].is_subset(reached):
            return True
        kept = None if reached is None else needed[k].intersect(reached)
        if kept is None or kept.is_empty():
            del needed[k]
        else:
            needed[k] = kept.coalesce()
        return False


def _step(was: isl.UnionSet, now: isl.UnionSet) -> tuple[int, ...] | None:
    """The constant nonzero step that moves points ``was`` onto (a superset of) points
    ``now`` (one op's: one space, of one or more pieces), if there is one: the step between
    their first points or between their last ones (where the bounds are parameters, one of
    them may have several pieces, and the moved points may hold for fewer of the bounds'
    values)."""
    if was.n_set() != 1 or now.n_set() != 1:
        return None
    before, after = isl.Set.from_union_set(was), isl.Set.from_union_set(now)
    if before.dim(isl.dim_type.param) == 0 and after.dim(isl.dim_type.param) == 0:
        return _concrete_step(was, now, before, after)
    return _parametric_step(was, now, before, after)


def _parametric_step(was: isl.UnionSet, now: isl.UnionSet, before: isl.Set, after: isl.Set
                     ) -> tuple[int, ...] | None:
    """``_step`` where the points may depend on parameters: the deltas between the first
    (last) points, where they are one constant."""
    for first_was, first_now in ((before.lexmin(), after.lexmin()), (before.lexmax(), after.lexmax())):
        deltas = isl.Map.from_domain_and_range(first_was, first_now).deltas()
        point = deltas.sample_point()
        if point.is_void():
            continue
        step = tuple(_coords(point))
        name = deltas.get_tuple_name()
        if any(step) and isl.UnionSet.from_set(deltas).is_subset(
                union_set(f"{{ {name}[{', '.join(map(str, step))}] }}")) \
                and now.is_subset(was.apply(_ray(name, step, once=True))):
            return step
    return None


def _concrete_step(was: isl.UnionSet, now: isl.UnionSet, before: isl.Set, after: isl.Set
                   ) -> tuple[int, ...] | None:
    """``_step`` for points without parameters: a candidate step (first to first, last to
    last) is tried only where it keeps ``now`` between the moved first and last points of
    ``was`` (a translate keeps lexicographic order), which rules out most candidates of a
    sweep (a growing chain's new slab, larger than the last one) without isl's subset test."""
    if before.is_empty() or after.is_empty():
        return None
    first_was, first_now = _coords(before.lexmin().sample_point()), _coords(after.lexmin().sample_point())
    last_was, last_now = _coords(before.lexmax().sample_point()), _coords(after.lexmax().sample_point())
    name = before.get_tuple_name()
    tried: set[tuple[int, ...]] = set()
    for step in (tuple(b - a for a, b in zip(first_was, first_now, strict=True)),
                 tuple(b - a for a, b in zip(last_was, last_now, strict=True))):
        if not any(step) or step in tried:
            continue
        tried.add(step)
        if first_now < [a + d for a, d in zip(first_was, step)] or \
                last_now > [a + d for a, d in zip(last_was, step)]:
            continue  # (lists compare lexicographically)
        if now.is_subset(was.apply(_ray(name, step, once=True))):
            return step
    return None


def _ray(name: str, step: tuple[int, ...], once: bool = False) -> isl.UnionMap:
    """``{ name[x] -> name[x + k * step] : k >= 1 }`` (``once``: ``k = 1``)."""
    at = [f"a{d}" for d in range(len(step))]
    if once:
        moved = ", ".join(f"{a} + {v}" for a, v in zip(at, step))
        return named_map(f"{{ {SINK}[{', '.join(at)}] -> {SOURCE}[{moved}] }}", name, name)
    to = [f"b{d}" for d in range(len(step))]
    cond = " and ".join(f"{b} = {a} + k * {v}" for a, b, v in zip(at, to, step))
    return named_map(f"{{ {SINK}[{', '.join(at)}] -> {SOURCE}[{', '.join(to)}] : "
                     f"exists (k : k >= 1 and {cond}) }}", name, name)


def _consumers_first(component: list[Op], by_sink: dict[int, list[tuple[int, isl.UnionMap]]]
                     ) -> list[int]:
    """The component's ops, each before the ops it reads except along the edges that close
    its cycles (reverse postorder of a depth-first walk along reads)."""
    inside = {op.id for op in component}
    seen: set[int] = set()
    post: list[int] = []
    for op in component:
        if op.id in seen:
            continue
        seen.add(op.id)
        work = [(op.id, iter(by_sink[op.id]))]
        while work:
            k, sources = work[-1]
            step = next(sources, None)
            if step is None:
                work.pop()
                post.append(k)
            elif step[0] in inside and step[0] not in seen:
                seen.add(step[0])
                work.append((step[0], iter(by_sink[step[0]])))
    return post[::-1]


def _grow(points: isl.UnionSet | None, more: isl.UnionSet) -> isl.UnionSet:
    return more if points is None else points.union(more).coalesce()


def check_reads(poly: Polyhedral, needed: isl.UnionSet, reads: dict[Edge, isl.UnionMap]) -> None:
    """Every read from a needed point stays inside the source's range."""
    for edge, rel in reads.items():
        live = rel.intersect_domain(needed)
        outside = live.subtract_range(poly.box(edge.src))
        if not outside.is_empty():
            sink_pt = outside.domain().sample_point()
            src_pt = outside.intersect_domain(isl.UnionSet(isl.Set.from_point(sink_pt))) \
                .range().sample_point()
            sink_point, src_point = _coords(sink_pt), _coords(src_pt)
            raise OutOfRangeError(
                f"{edge.sink.name} at {_fmt(edge.sink, sink_point)} reads {edge.src.name} at "
                f"{_fmt(edge.src, src_point)}, outside its domain "
                f"({_ranges(poly, edge.src)}); add a branch for those points or narrow the index",
                edge.sink.site)


def check_branches(poly: Polyhedral, needed: isl.UnionSet) -> None:
    """Every needed point of a placeholder has a branch whose condition holds."""
    for op in poly.graph.ops.values():
        if op.kind != "merge":
            continue
        covered = _union_sets(poly.condition_set(op, e.cond) for e in poly.graph.in_edges(op))
        missing = needed.intersect(poly.box(op)).subtract(covered)
        if not missing.is_empty():
            fix = op.params.get("undefined", "add a branch (e.g. a base case)")
            raise UndefinedPointError(
                f"{op.name} is needed at {_fmt(op, _sample(missing))} but no branch defines "
                f"it there; {fix}", op.site)


def check_requirements(poly: Polyhedral, needed: isl.UnionSet) -> None:
    """Every op's ``requires`` conditions hold at each of its needed points."""
    for op in poly.graph.ops.values():
        for cond, what in op.requires:
            bad = needed.intersect(poly.box(op)).subtract(poly.condition_set(op, cond))
            if not bad.is_empty():
                raise OutOfRangeError(f"{op.name} at {_fmt(op, _sample(bad))}: {what}", op.site)


def check_acyclic_points(poly: Polyhedral, needed: isl.UnionSet,
                         reads: dict[Edge, isl.UnionMap]) -> None:
    """No point depends on itself (a cycle with zero temporal distance)."""
    relation = _union_maps(reads.values()).intersect_domain(needed)
    closure, _exact = relation.transitive_closure()
    for op in poly.graph.ops.values():
        vars_ = ", ".join(poly._vars(op, "a").values())
        name = poly.name(op)
        identity = poly.union_map(f"{{ {name}[{vars_}] -> {name}[{vars_}] }}")
        loops = closure.intersect(identity)
        if not loops.is_empty():
            raise UnschedulableError(
                f"{op.name} at {_fmt(op, _sample(loops.domain()))} depends on itself: a cycle "
                f"with no temporal distance cannot be ordered (e.g. a = b + 1; b = a + 1); "
                f"read an earlier point such as x[t-1] somewhere in the cycle", op.site)


def union_of(sets: Iterable[isl.UnionSet]) -> isl.UnionSet | None:
    """The union of ``sets`` in one isl call (None when there are none): a union per set
    from Python copies the growing result each time (600 ops' points: 9 ms against 2)."""
    pieces = isl.UnionSetList.alloc(ISL, 0)
    for s in sets:
        pieces = pieces.add(s)
    return pieces.union() if pieces.n_union_set() else None


def _union_sets(sets: Iterable[isl.UnionSet]) -> isl.UnionSet:
    out = union_of(sets)
    return union_set("{ }") if out is None else out


def union_of_maps(maps: Iterable[isl.UnionMap]) -> isl.UnionMap | None:
    """The union of ``maps`` (None when there are none), in pairs: a union per map from
    Python copies the growing result each time (PPO's 1,500 read relations: 105 ms against
    7)."""
    level = list(maps)
    while len(level) > 1:
        level = [level[k].union(level[k + 1]) if k + 1 < len(level) else level[k]
                 for k in range(0, len(level), 2)]
    return level[0] if level else None


def _union_maps(maps: Iterable[isl.UnionMap]) -> isl.UnionMap:
    out = union_of_maps(maps)
    return union_map("{ }") if out is None else out


def _sample(s: isl.UnionSet) -> list[int]:
    return _coords(s.sample_point())


def _coords(point: isl.Point) -> list[int]:
    n = point.get_space().dim(isl.dim_type.set)
    return [point.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(n)]


def _fmt(op: Op, values: list[int]) -> str:
    return "(" + ", ".join(f"{d.name}={v}" for d, v in zip(op.domain, values)) + ")"


def _ranges(poly: Polyhedral, op: Op) -> str:
    return ", ".join(f"0 <= {d.name} < {poly.bounds[poly.bound_of[d]]}" for d in op.domain) \
        or "a single point"
