"""Execution and memory schedule of an SDG, found by isl's scheduler.

Statements are the ops (``S<id>``) and one deallocation statement per stored op
(``F<id>``: free the op's outputs at a point). Validity constraints: a source point runs
before every sink point that reads it; a point is freed after it was produced and after
its last reader ran. Proximity constraints are the same relations, so the scheduler keeps
producers, consumers and frees close, and memory stays bounded by what the dependences
require.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from tempo.errors import UnschedulableError
from tempo.ir.graph import SDG, Edge, Op
from tempo.schedule import ast
from tempo.schedule.polyhedral import (
    Polyhedral,
    check_acyclic_points,
    check_branches,
    check_reads,
    check_requirements,
    needed_points,
)
from tempo.symbolic.expr import Symbol


@dataclass(frozen=True)
class Statement:
    """What an AST statement does: execute ``op`` or free its outputs."""

    kind: str  # "exec" | "free"
    op: Op


@dataclass
class Schedule:
    """The scheduled loop program and what its statements mean."""

    root: ast.Node
    statements: dict[str, Statement]
    isl_schedule: isl.Schedule
    needed: dict[int, isl.Set] = field(default_factory=dict)

    def pseudo_code(self) -> str:
        """The loop program, with op names: what the executor runs."""
        def render(stmt: ast.Stmt) -> str:
            s = self.statements[stmt.name]
            index = ", ".join(f"{d.name}={e}" for d, e in zip(s.op.domain, stmt.index))
            return f"{'free ' if s.kind == 'free' else ''}{s.op.name}[{index}]"
        return "\n".join(line[4:] for line in ast.to_python(self.root, render))

    __str__ = pseudo_code


def build_schedule(graph: SDG, bounds: dict[Symbol, int], bound_of: dict[Symbol, Symbol],
                   roots: list[Op], kept: set[int]) -> Schedule:
    """Check the program and schedule every needed point of it.

    ``roots`` are the ops whose every point must run (outputs, UDFs); ``kept`` the ids of
    ops whose points are never freed (outputs, read at the end).
    """
    concrete = Polyhedral(graph, bounds, bound_of)
    reads = concrete.all_reads()
    needed = needed_points(concrete, roots, reads)
    check_branches(concrete, needed)
    check_reads(concrete, needed, reads)
    check_requirements(concrete, needed)
    poly, poly_needed, poly_reads = _parametric_if_exact(graph, bounds, bound_of, roots, needed)
    if poly is None:
        poly, poly_needed, poly_reads = concrete, needed, reads
    live_reads = {e: r.intersect_domain(poly_needed) for e, r in poly_reads.items()}
    domain, validity = _constraints(poly, poly_needed, live_reads, kept)
    statements = {name: Statement("exec", op) for name, op in poly.statements.items()}
    statements.update({_free_name(op): Statement("free", op) for op in poly.statements.values()})
    schedule = _schedule(poly, domain, validity, statements)
    if schedule is None:
        check_acyclic_points(concrete, needed, reads)
        raise UnschedulableError("isl found no schedule satisfying the program's dependences")
    return schedule


def _schedule(poly: Polyhedral, domain: isl.UnionSet, validity: isl.UnionMap,
              statements: dict[str, Statement]) -> Schedule | None:
    try:
        sc = isl.ScheduleConstraints.on_domain(domain).set_context(poly.context()) \
            .set_validity(validity).set_proximity(validity)
        schedule = sc.compute_schedule()
    except isl.Error:
        return None
    if schedule is None:
        return None
    build = isl.AstBuild.from_context(poly.context())
    symbols = {name: b for b, name in poly.params.items()}
    root = ast.from_isl(build.node_from_schedule(schedule), symbols)
    return Schedule(root, statements, schedule)


def _parametric_if_exact(graph: SDG, bounds: dict[Symbol, int], bound_of: dict[Symbol, Symbol],
                         roots: list[Op], needed: isl.UnionSet):
    """The parametric view, when its needed points agree with the concrete ones."""
    poly = Polyhedral(graph, bounds, bound_of, parametric=True)
    reads = poly.all_reads()
    poly_needed = needed_points(poly, roots, reads)
    if not poly.fix_params(poly_needed).is_equal(needed):
        return None, None, None
    return poly, poly_needed, reads


def _free_name(op: Op) -> str:
    return f"F{op.id}"


def _constraints(poly: Polyhedral, needed: isl.UnionSet, reads: dict[Edge, isl.UnionMap],
                 kept: set[int]) -> tuple[isl.UnionSet, isl.UnionMap]:
    domain = needed
    validity = poly.union_map("{ }")
    for rel in reads.values():
        validity = validity.union(rel.reverse())
    for op in poly.graph.ops.values():
        points = needed.intersect(poly.box(op))
        if op.id in kept or not op.domain or points.is_empty():
            continue  # a zero-dim op holds one point: it lives until the end of the run
        free = _rename(points, _free_name(op))
        domain = domain.union(free)
        validity = validity.union(isl.UnionMap.from_domain_and_range(points, free)
                                  .intersect(_same_point(poly, op)))
        for edge in poly.graph.out_edges(op):
            validity = validity.union(_to_free(reads[edge], op))
    return domain, validity


def _rename(points: isl.UnionSet, name: str) -> isl.UnionSet:
    s = isl.Set.from_union_set(points).set_tuple_name(name)
    return isl.UnionSet.from_set(s)


def _to_free(rel: isl.UnionMap, op: Op) -> isl.UnionMap:
    """``{ sink[p] -> F<op>[q] }`` from a read relation ``{ sink[p] -> S<op>[q] }``."""
    if rel.is_empty():
        return rel
    m = isl.Map.from_union_map(rel).set_tuple_name(isl.dim_type.out, _free_name(op))
    return isl.UnionMap.from_map(m)


def _same_point(poly: Polyhedral, op: Op) -> isl.UnionMap:
    vars_ = ", ".join(f"a{k}" for k in range(len(op.domain)))
    return poly.union_map(f"{{ {poly.name(op)}[{vars_}] -> {_free_name(op)}[{vars_}] }}")
