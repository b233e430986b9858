"""A flat schedule map as an isl schedule tree, for fast AST generation.

The scheduler's execution times (``S[p] -> [c0, c1, ...]``, frees included) order every
statement instance lexicographically. isl generates code for such a flat map by
discovering, dim by dim, which statements separate; on programs with hundreds of
statements that is most of compile time. The same order as a tree is explicit: a dim on
which every instance has a constant time becomes a sequence node (one filter per
constant, in order), any other dim a one-dimensional band. AST generation from the tree
(``AstBuild.node_from_schedule``) only has to scan each band.
"""

from __future__ import annotations

import islpy as isl


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
    if groups is None:
        node = node.insert_partial_schedule(_dim_schedule(times, dim, ndims))
        return _order(node.child(0), times, dim + 1, ndims).parent()
    if len(groups) == 1:
        return _order(node, times, dim + 1, ndims)
    filters = isl.UnionSetList.alloc(node.get_ctx(), len(groups))
    for instances in groups:
        filters = filters.add(instances)
    node = node.insert_sequence(filters)
    for k, instances in enumerate(groups):
        leaf = node.child(k).child(0)
        node = _order(leaf, times.intersect_domain(instances), dim + 1, ndims).parent().parent()
    return node


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
    projected = None
    maps = times.get_map_list()
    for k in range(maps.n_map()):
        m = maps.get_at(k).project_out(isl.dim_type.out, dim + 1, ndims - dim - 1) \
            .project_out(isl.dim_type.out, 0, dim)
        um = isl.UnionMap.from_map(m)
        projected = um if projected is None else projected.union(um)
    return isl.MultiUnionPwAff.from_union_map(projected)


def _out_dims(times: isl.UnionMap) -> int:
    maps = times.get_map_list()
    return maps.get_at(0).dim(isl.dim_type.out) if maps.n_map() else 0
