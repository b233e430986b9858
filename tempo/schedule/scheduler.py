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
    poly = Polyhedral(graph, bounds, bound_of)
    reads = poly.all_reads()
    needed = needed_points(poly, roots, reads)
    check_branches(poly, needed)
    check_reads(poly, needed, reads)
    live_reads = {e: r.intersect_domain(needed) for e, r in reads.items()}
    domain, validity = _constraints(poly, needed, live_reads, kept)
    try:
        sc = isl.ScheduleConstraints.on_domain(domain).set_validity(validity) \
            .set_proximity(validity)
        schedule = sc.compute_schedule()
    except isl.Error:
        schedule = None
    if schedule is None:
        check_acyclic_points(poly, needed, reads)
        raise UnschedulableError("isl found no schedule satisfying the program's dependences")
    statements = {name: Statement("exec", op) for name, op in poly.statements.items()}
    statements.update({_free_name(op): Statement("free", op) for op in poly.statements.values()})
    build = isl.AstBuild.from_context(isl.Set("{ : }"))
    root = ast.from_isl(build.node_from_schedule(schedule))
    return Schedule(root, statements, schedule)


def _free_name(op: Op) -> str:
    return f"F{op.id}"


def _constraints(poly: Polyhedral, needed: isl.UnionSet, reads: dict[Edge, isl.UnionMap],
                 kept: set[int]) -> tuple[isl.UnionSet, isl.UnionMap]:
    domain = needed
    validity = isl.UnionMap("{ }")
    for rel in reads.values():
        validity = validity.union(rel.reverse())
    for op in poly.graph.ops.values():
        points = needed.intersect(poly.box(op))
        if op.id in kept or points.is_empty():
            continue
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
    return isl.UnionMap(f"{{ {poly.name(op)}[{vars_}] -> {_free_name(op)}[{vars_}] }}")
