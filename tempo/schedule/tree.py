"""A flat schedule map as an isl schedule tree, for fast AST generation.

The scheduler's execution times (``S[p] -> [c0, c1, ...]``, frees included) order every
statement instance lexicographically. isl generates code for such a flat map by
discovering, dim by dim, which statements separate; on programs with hundreds of
statements that is most of compile time. The same order as a tree is explicit: a dim on
which every instance has a constant time becomes a sequence node (one filter per
constant, in order), any other dim a one-dimensional band. AST generation from the tree
(``AstBuild.node_from_schedule``) only has to scan each band. A dim on which several loops
run one after another becomes a sequence of bands first (``tempo.schedule.bands``).
"""

from __future__ import annotations

import islpy as isl

from tempo.analysis.polyhedral import union_of_maps
from tempo.schedule.bands import Interval, partition, values_of


def schedule_tree(domain: isl.UnionSet, times: isl.UnionMap) -> isl.Schedule:
    """The schedule tree that orders ``domain``'s instances as ``times`` does."""
    ndims = _out_dims(times)
    root = isl.Schedule.from_domain(domain).get_root().child(0)
    return _order(root, times.detect_equalities(), 0, ndims).get_schedule()


def _order(node: isl.ScheduleNode, times: isl.UnionMap, dim: int, ndims: int) -> isl.ScheduleNode:
    """Below leaf ``node``, the tree for ``times`` from output dim ``dim`` on; returns the
    node at ``node``'s position."""
    if dim == ndims:
        return node
    groups = _constant_groups(times, dim)
    if groups is not None:
        if len(groups) == 1:
            return _order(node, times, dim + 1, ndims)
        return _sequence(node, times, groups, dim + 1, ndims)
    maps = times.get_map_list()
    intervals = partition([values_of(m, dim, nests=not _is_free(m))
                           for m in (maps.get_at(k) for k in range(maps.n_map()))])
    if len(intervals) == 1:
        return _band(node, times, intervals[0], dim, ndims)
    pieces = [(part.detect_equalities(), i) for i in intervals
              if not (part := times.intersect_range(_between(i, dim, ndims, times.get_ctx()))).is_empty()]
    filters = isl.UnionSetList.alloc(node.get_ctx(), len(pieces))
    for part, _ in pieces:
        filters = filters.add(part.domain().coalesce())
    node = node.insert_sequence(filters)
    for k, (part, interval) in enumerate(pieces):
        leaf = node.child(k).child(0)
        below = _band(leaf, part, interval, dim, ndims) if interval.period else \
            _order(leaf, part, dim + 1, ndims)
        node = below.parent().parent()
    return node


def _sequence(node: isl.ScheduleNode, times: isl.UnionMap, groups: list[isl.UnionSet], dim: int,
              ndims: int) -> isl.ScheduleNode:
    """A sequence node below ``node`` running the instances ``groups`` in order, each
    ordered from ``dim`` on."""
    filters = isl.UnionSetList.alloc(node.get_ctx(), len(groups))
    for instances in groups:
        filters = filters.add(instances)
    node = node.insert_sequence(filters)
    for k, instances in enumerate(groups):
        leaf = node.child(k).child(0)
        node = _order(leaf, times.intersect_domain(instances), dim, ndims).parent().parent()
    return node


def _band(node: isl.ScheduleNode, times: isl.UnionMap, interval: Interval, dim: int,
          ndims: int) -> isl.ScheduleNode:
    """A loop over ``dim`` below ``node``; with a period above 1, over the iteration
    ``(v - first) // period``, the body ordered by ``(v - first) mod period``."""
    if interval.period > 1:
        times = _strip_mined(times, interval, dim, ndims)
        ndims += 1
    node = node.insert_partial_schedule(_dim_schedule(times, dim, ndims))
    return _order(node.child(0), times, dim + 1, ndims).parent()


def _is_free(m: isl.Map) -> bool:
    """A free statement (``F<id>``, see ``tempo.schedule.scheduler``)."""
    return m.get_tuple_name(isl.dim_type.in_).startswith("F")


def _between(interval: Interval, dim: int, ndims: int, ctx: isl.Context) -> isl.Set:
    """Times whose ``dim`` lies in ``interval``."""
    names = ", ".join(f"x{k}" for k in range(ndims))
    return isl.Set(f"{{ [{names}] : {interval.first} <= x{dim} <= {interval.last} }}", context=ctx)


def _strip_mined(times: isl.UnionMap, interval: Interval, dim: int, ndims: int) -> isl.UnionMap:
    """``times`` with output ``dim`` (every value ``first + period * q + r``, ``r`` fixed
    per statement) replaced by ``q, r``."""
    pieces = []
    maps = times.get_map_list()
    names = [f"x{k}" for k in range(ndims)]
    for k in range(maps.n_map()):
        m = maps.get_at(k)
        r = (values_of(m, dim).lo - interval.first) % interval.period
        q = f"floor(({names[dim]} - {interval.first + r}) / {interval.period})"
        image = [*names[:dim], q, str(r), *names[dim + 1:]]
        split = isl.Map(f"{{ [{', '.join(names)}] -> [{', '.join(image)}] }}", context=m.get_ctx())
        pieces.append(isl.UnionMap.from_map(m.apply_range(split)))
    return union_of_maps(pieces).detect_equalities()


def _constant_groups(times: isl.UnionMap, dim: int) -> list[isl.UnionSet] | None:
    """The instances at each constant value of output ``dim``, in increasing value; None
    when some instance's time there is not a constant."""
    by_value: dict[int, isl.UnionSet] = {}
    maps = times.get_map_list()
    for k in range(maps.n_map()):
        m = maps.get_at(k)
        pieces = [m] if not m.plain_get_val_if_fixed(isl.dim_type.out, dim).is_nan() else \
            [isl.Map.from_basic_map(b) for b in m.get_basic_maps()]
        for piece in pieces:
            value = piece.plain_get_val_if_fixed(isl.dim_type.out, dim)
            if value.is_nan():
                return None
            key = value.to_python()
            instances = isl.UnionSet.from_set(piece.domain())
            by_value[key] = by_value[key].union(instances) if key in by_value else instances
    return [by_value[v].coalesce() for v in sorted(by_value)]


def _dim_schedule(times: isl.UnionMap, dim: int, ndims: int) -> isl.MultiUnionPwAff:
    """Output ``dim`` of ``times`` as a one-dimensional partial schedule."""
    maps = times.get_map_list()
    projected = union_of_maps(
        isl.UnionMap.from_map(maps.get_at(k).project_out(isl.dim_type.out, dim + 1, ndims - dim - 1)
                              .project_out(isl.dim_type.out, 0, dim)) for k in range(maps.n_map()))
    return isl.MultiUnionPwAff.from_union_map(projected)


def _out_dims(times: isl.UnionMap) -> int:
    maps = times.get_map_list()
    return maps.get_at(0).dim(isl.dim_type.out) if maps.n_map() else 0
