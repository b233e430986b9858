"""Inversion of dependence expressions: which sink points read a given source point.

A sink with domain dims ``d`` reads a source at ``phi(d)`` (a point or a slice per source
dim). The inverse gives, for a source point ``s``, the sink points that read it, one
entry per sink dim, written over the source dims' symbols: ``[t+3]`` → ``[t-3]``,
``[max(0,t-3):t+1]`` → ``[t:min(t+4,T)]``, ``[t:T]`` → ``[0:t+1]``. isl does the algebra.
"""

from __future__ import annotations

from collections.abc import Sequence

import islpy as isl

from tempo.errors import UnsupportedExpressionError
from tempo.symbolic.expr import TRUE, Expr, IndexEntry, Slice, Symbol, as_expr, const
from tempo.symbolic.isl_bridge import from_isl_ast_expr, pw_aff_to_expr, to_isl


def invert_dependence(
    phi: Sequence[IndexEntry],
    sink_dims: Sequence[Symbol],
    source_dims: Sequence[Symbol],
    bounds: dict[Symbol, Symbol],
    cond: Expr = TRUE,
) -> tuple[IndexEntry, ...]:
    """The inverse of ``phi`` (one entry per source dim) as one entry per sink dim.

    ``bounds`` maps each dim symbol to its bound symbol; ``cond`` (over the sink dims)
    restricts the reading sink points. The result is exact at every source point that some
    sink point reads; at source points nobody reads (``[T-1]`` read at ``t = 0``) it is
    unspecified, so a caller summing over the inverse must also restrict to
    ``read_condition``. The set of reading sink points must be a box of ranges (true for
    the per-dim patterns of RT programs); strided or diagonal reader sets raise
    ``UnsupportedExpressionError``. A dependence that reads nothing inverts to empty slices.
    """
    readers, context, symbols = _readers(phi, sink_dims, source_dims, bounds, cond)
    if readers.is_empty():  # no sink point reads any source point
        return tuple(Slice(0, 0) for _ in sink_dims)
    _require_box(readers)
    return tuple(_dim_inverse(readers, k, context, symbols) for k in range(len(sink_dims)))


def read_condition(
    phi: Sequence[IndexEntry],
    sink_dims: Sequence[Symbol],
    source_dims: Sequence[Symbol],
    bounds: dict[Symbol, Symbol],
    cond: Expr = TRUE,
) -> Expr:
    """A condition over the source dims: whether some sink point (where ``cond`` holds)
    reads the source point. ``[t+3]`` gives ``t >= 3``; ``[0:t+1]`` gives ``true``."""
    readers, context, symbols = _readers(phi, sink_dims, source_dims, bounds, cond)
    region = readers.params().gist_params(context)
    if region.plain_is_universe():
        return TRUE
    if region.is_empty():
        return const(False)
    build = isl.AstBuild.from_context(context)
    return from_isl_ast_expr(build.expr_from_set(region), symbols)


def _readers(phi: Sequence[IndexEntry], sink_dims: Sequence[Symbol],
             source_dims: Sequence[Symbol], bounds: dict[Symbol, Symbol],
             cond: Expr) -> tuple[isl.Set, isl.Set, dict[str, Expr]]:
    """The set of sink points reading the source point given as parameters, the context
    of valid parameters, and the isl names of the source dims and bounds."""
    if len(phi) != len(source_dims):
        raise ValueError("phi needs one entry per source dim")
    sink_vars = {d: f"k{n}" for n, d in enumerate(sink_dims)}
    params = {s: f"p_{s.name}" for s in source_dims}
    all_bounds = sorted({bounds[d] for d in (*sink_dims, *source_dims)}, key=lambda b: b.name)
    params.update({b: f"p_{b.name}" for b in all_bounds})
    names = {**{b: params[b] for b in all_bounds}, **sink_vars}  # phi is over sink dims
    ranges = [f"0 <= {sink_vars[d]} < {names[bounds[d]]}" for d in sink_dims]
    if cond is not TRUE:
        ranges.append(to_isl(cond, names))
    reads = []
    for src_dim, entry in zip(source_dims, phi):
        entry = entry if isinstance(entry, Slice) else as_expr(entry)
        s = params[src_dim]
        if isinstance(entry, Slice):
            reads.append(f"{to_isl(entry.start, names)} <= {s} < {to_isl(entry.stop, names)}")
        else:
            reads.append(f"{s} = {to_isl(entry, names)}")
    header = f"[{', '.join(params.values())}] -> "
    readers = isl.Set(f"{header}{{ [{', '.join(sink_vars.values())}] : "
                      f"{' and '.join(ranges + reads) or 'true'} }}")
    context = isl.Set(f"{header}{{ : {' and '.join(_source_ranges(source_dims, bounds, params))} "
                      f"and {' and '.join(f'{names[b]} > 0' for b in all_bounds)} }}")
    readers = readers.intersect_params(context).coalesce()
    return readers, context, {name: sym for sym, name in params.items()}


def _source_ranges(source_dims: Sequence[Symbol], bounds: dict[Symbol, Symbol],
                   names: dict[Symbol, str]) -> list[str]:
    return [f"0 <= {names[d]} < {names[bounds[d]]}" for d in source_dims] or ["true"]


def _require_box(readers: isl.Set) -> None:
    n = readers.dim(isl.dim_type.set)
    box = isl.Set.universe(readers.get_space())
    for k in range(n):
        box = box.intersect(_project_keep(readers, k))
    if not box.intersect_params(readers.params()).is_equal(readers):
        raise UnsupportedExpressionError(
            f"the sink points reading a source point do not form a box: {readers}")
    if not isl.Set.from_basic_set(readers.polyhedral_hull()).is_equal(readers):
        raise UnsupportedExpressionError(
            f"the sink points reading a source point are not one range (strided or "
            f"piecewise): {readers}")


def _project_keep(s: isl.Set, k: int) -> isl.Set:
    """The constraints of ``s`` on dim ``k`` alone, as a set in ``s``'s space."""
    n = s.dim(isl.dim_type.set)
    proj = s.project_out(isl.dim_type.set, k + 1, n - k - 1).project_out(isl.dim_type.set, 0, k)
    return proj.insert_dims(isl.dim_type.set, 0, k).add_dims(isl.dim_type.set, n - k - 1)


def _dim_inverse(readers: isl.Set, k: int, context: isl.Set,
                 symbols: dict[str, Expr]) -> IndexEntry:
    lo = pw_aff_to_expr(readers.dim_min(k), context, symbols)
    hi = pw_aff_to_expr(readers.dim_max(k), context, symbols)
    return lo if lo is hi else Slice(lo, hi + 1)
