"""The points a program needs, per op: found from its roots (``analyze_points``, checked
on the way), looked up by op id, and recombined."""

from __future__ import annotations

from collections.abc import Container, Iterable

import islpy as isl

from tempo.analysis.polyhedral import (
    Polyhedral,
    check_branches,
    check_reads,
    check_requirements,
    needed_points,
    statement_name,
    union_of,
)
from tempo.ir.graph import SDG, Op
from tempo.symbolic.expr import Symbol


def analyze_points(graph: SDG, bounds: dict[Symbol, int], bound_of: dict[Symbol, Symbol],
                   roots: list[Op]) -> isl.UnionSet:
    """The points the program needs (every point some root depends on), after checking
    that every needed point is defined (a branch holds), reads inside its sources'
    ranges, and meets its requirements.

    ``roots`` are the ops whose every point must run (outputs, UDFs)."""
    concrete = Polyhedral(graph, bounds, bound_of)
    reads = concrete.all_reads()
    needed = needed_points(concrete, roots, reads)
    check_branches(concrete, needed)
    check_reads(concrete, needed, reads)
    check_requirements(concrete, needed)
    return needed


def needed_by_op(needed: isl.UnionSet, ids: Iterable[int]) -> dict[int, isl.Set]:
    """The needed points of each op of ``ids`` that has some, keyed by its id (each set
    named as its statement, ``statement_name``)."""
    sets = needed.get_set_list()
    by_name = {s.get_tuple_name(): s for s in (sets.get_at(k) for k in range(sets.n_set()))}
    return {k: by_name[statement_name(k)] for k in ids if statement_name(k) in by_name}


def needed_of(needed: isl.UnionSet, by_op: dict[int, isl.Set], ops: Container[int]) -> isl.UnionSet:
    """The needed points of ``by_op``'s ops that are in ``ops``, as one union set in
    ``needed``'s isl context."""
    result = union_of(isl.UnionSet.from_set(points) for k, points in by_op.items() if k in ops)
    return needed.subtract(needed) if result is None else result  # (empty, in needed's isl context)


def needed_at_every_step(poly: Polyhedral, op: Op, dim: Symbol, needed: isl.Set) -> bool:
    """Each point of the op's other dims that is needed is needed at every step of ``dim``."""
    at = op.domain.index(dim)
    others = needed.project_out(isl.dim_type.set, at, 1).insert_dims(isl.dim_type.set, at, 1)
    box = isl.Set.from_union_set(poly.box(op))
    return box.intersect(others.set_tuple_name(needed.get_tuple_name())).is_subset(needed)
