"""Copy propagation: readers of an ``identity`` op read its source directly.

An identity op only moves values between points (``w.at(i, 0)`` is ``w[i, 0]`` over
``(i,)``). Its readers can read the source at the composed index instead, so the copy
disappears from the graph, and from the scheduling problem: each statement fewer makes
isl's scheduler faster. A copy stays when composing is not exact: a window read of it
whose dim its source index does not use plainly, a window read of a window, a guarded
or conditional copy, or one whose type is not what it reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tempo.analysis.needed import needed_by_op, needed_of
from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.types import TensorType
from tempo.symbolic.expr import TRUE, Expr, IndexEntry, Slice, Symbol, logical_and

if TYPE_CHECKING:
    from tempo.passes import PassState


def propagate_copies(graph: SDG, state: PassState) -> SDG:
    """``graph`` without the identity ops whose every read composes (see the module doc);
    their points leave ``state.needed``."""
    removed: set[int] = set()
    while True:
        found = _removable(graph, state.keep)
        if not found:
            break
        graph = _without(graph, found)
        removed |= found
    state.needed = needed_of(state.needed, needed_by_op(state.needed, graph.ops), graph.ops)
    state.notes.append(f"copies: {len(removed)} identity ops read through")
    return graph


def _removable(graph: SDG, keep: set[int]) -> set[int]:
    """Copies whose every reader can read their source directly. A copy of a copy waits
    for the next round, when its source's readers read through already."""
    consumers = graph.consumers()
    plain = {op.id for op in graph.ops.values() if is_plain_copy(graph, op, keep)}
    return {k for k in plain
            if graph.in_edges(graph.ops[k])[0].src.id not in plain
            and all(_reads_through(e, graph.in_edges(graph.ops[k])[0]) for e in consumers[k])}


def _reads_through(outer: Edge, inner: Edge) -> bool:
    """Whether ``outer``'s sink can read ``inner``'s source directly. Reader sums cannot:
    their launcher reads the points their params name, not the edge's index."""
    return outer.sink.kind != "sum_readers" and read_through(outer, inner) is not None


def _without(graph: SDG, copies: set[int]) -> SDG:
    out = SDG()
    for op in graph.ops.values():
        if op.id not in copies:
            out.add_op(op)
    for op in out.ops.values():
        for edge in graph.in_edges(op):
            if edge.src.id in copies:
                inner = graph.in_edges(edge.src)[0]
                phi, cond = read_through(edge, inner)  # type: ignore[misc]  # checked by _removable
                edge = Edge(edge.sink, edge.sink_in, inner.src, inner.src_out, phi, cond)
            out.add_edge(edge)
    return out


def is_plain_copy(graph: SDG, op: Op, keep: set[int]) -> bool:
    """An unconditional identity whose value is exactly what it reads (its source's
    points, stacked along one leading dim per window). Its ``requires`` were checked on
    the needed points before the passes run."""
    if op.kind != "identity" or op.id in keep or op.when is not TRUE:
        return False
    (edge,) = graph.in_edges(op)
    src = edge.src.outputs[edge.src_out]
    read = TensorType((*(e.size for e in edge.phi if isinstance(e, Slice)), *src.shape), src.dtype)
    return edge.cond is TRUE and op.outputs[0] == read


def read_through(outer: Edge, inner: Edge) -> tuple[tuple[IndexEntry, ...], Expr] | None:
    """The index and condition of reading ``inner``'s source directly where ``outer``
    reads the copy, or None when that is not exact."""
    copy = outer.src
    windows = {d: e for d, e in zip(copy.domain, outer.phi) if isinstance(e, Slice)}
    points: dict[Symbol, Expr] = {d: e for d, e in zip(copy.domain, outer.phi)
                                  if not isinstance(e, Slice)}
    if len(windows) > 1:
        return None
    if windows:
        (dim, window), = windows.items()
        plain = [k for k, e in enumerate(inner.phi) if e is dim]
        others = [e for k, e in enumerate(inner.phi) if k not in plain]
        if (len(plain) != 1 or any(isinstance(e, Slice) or dim in e.symbols() for e in others)):
            return None
        return tuple(window if e is dim else e.substitute(points) for e in inner.phi), outer.cond
    phi = tuple(e.substitute(points) for e in inner.phi)
    return phi, logical_and(outer.cond, inner.cond.substitute(points))
