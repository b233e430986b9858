"""Newest rows: a tiled read that ends at its reader's own point takes that row from the
point itself.

A decoder's attention at position ``t`` reads ``k[0:t+1]``, whose last row ``k[t]`` the
same position computes. Read as one slice, the row must be in the store before the
attention starts, so the op computing it and the attention cannot share a kernel (fusion
never lets a kernel read a value it has not written yet): a layer costs two launches per
position. This pass reads such a slice as the earlier rows ``k[0:t]``, delivered padded
to the same rows as before, and ``put_row`` places ``k[t]`` at its row: every read of
the slice now is of strictly earlier points or of the same point, so fusion can put the
producer of ``k[t]``, the attention and the layers around them in one kernel. On JAX the
kernel that reads the earlier rows from a device buffer writes ``k[t]`` into that buffer
first and reads the row from there (``JaxBackend.block_kernel``): no copy of the rows.

Only reads padded to tiles (``tempo.passes.tile``), whose rows past the points are
masked or met by zeros anyway, of a device op by a device op over the same dims and the
same needed points, the only slice read of that value: those are the reads fusion can
then take in (a ``put_row`` left outside the producer's kernel would copy the rows at
every point).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tempo.analysis.needed import needed_by_op
from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.types import TensorType
from tempo.passes.contract import input_type
from tempo.passes.fusion import fusable
from tempo.passes.rewrite import recomputed_needed
from tempo.symbolic.expr import Expr, Slice, Symbol

if TYPE_CHECKING:
    from tempo.passes import PassState


def split_newest_rows(graph: SDG, state: PassState) -> SDG:
    """``graph`` with each tiled read that ends at its reader's point (see the module
    doc) read as its earlier rows and the newest row; ``state.needed`` recomputed."""
    known = set(state.bounds)
    needed = {k: points.reset_tuple_id() for k, points in needed_by_op(state.needed, graph.ops).items()}
    consumers = graph.consumers()
    reads = [e for e in graph.edges() if _ends_at_reader(e)
             and fusable(e.src, graph.in_edges(e.src), state.bounds)
             and fusable(e.sink, graph.in_edges(e.sink), state.bounds)
             and all(d.symbols() <= known for d in e.src.outputs[e.src_out].shape)
             and _only_slice_read(e, consumers[e.src.id])
             and e.src.id in needed and e.sink.id in needed and needed[e.src.id].is_equal(needed[e.sink.id])]
    if not reads:
        return graph
    split = {(e.sink.id, e.sink_in) for e in reads}
    out = SDG()
    for op in graph.ops.values():
        out.add_op(op)
    counts = {(op.params["expr"], op.domain): op for op in graph.ops.values()  # the tile pass's
              if op.kind == "eval_symbol" and op.params["dtype"] == "int32" and op.params.get("in_run")}
    for op in graph.ops.values():
        for edge in graph.in_edges(op):
            if (op.id, edge.sink_in) in split:
                edge = _read_through_put_row(out, edge, counts, state)
            out.add_edge(Edge(out.ops[op.id], edge.sink_in, out.ops[edge.src.id], edge.src_out,
                              edge.phi, edge.cond, edge.rows_at))
    state.needed = recomputed_needed(out, state)
    state.notes.append(f"newest: {len(reads)} tiled read(s) take their newest row from the point itself")
    return out


def _ends_at_reader(edge: Edge) -> bool:
    """A read of ``src[p..., s:t+1]`` (padded) by a reader at ``p..., t`` over the same dims."""
    return edge.tiled and not edge.rows_at and edge.stop_offset == 1


def _only_slice_read(edge: Edge, readers: list[Edge]) -> bool:
    """Whether ``edge`` is the only read of its source's value through a slice: fusion can
    put the source in one island only, and a ``put_row`` outside it would cost a copy of
    the rows at every point."""
    return all(e is edge or not e.slices for e in readers if e.src_out == edge.src_out)


def _read_through_put_row(out: SDG, edge: Edge, counts: dict[tuple[Expr, tuple[Symbol, ...]], Op],
                          state: PassState) -> Edge:
    """A ``put_row`` op (added to ``out``) standing for ``edge``'s read, and the edge by
    which the reader reads it."""
    sink, last = edge.sink, edge.phi[-1]
    count = last.count.substitute(state.bounds)
    counter = counts.get((count, sink.domain))
    if counter is None:
        counter = counts[(count, sink.domain)] = out.add_op(Op(
            state.next_id, "eval_symbol", {"expr": count, "dtype": "int32", "in_run": True},
            sink.domain, (TensorType((), "int32"),), sink.site, "tile_count"))
        state.next_id += 1
    put = out.add_op(Op(state.next_id, "put_row", {"axis": 0}, sink.domain, (input_type(edge),),
                        sink.site, "newest_row"))
    state.next_id += 1
    earlier = Slice(last.start, last.stop - 1, last.pad)
    src = out.ops[edge.src.id]
    out.add_edge(Edge(put, 0, src, edge.src_out, (*edge.phi[:-1], earlier)))
    out.add_edge(Edge(put, 1, src, edge.src_out, sink.domain))
    out.add_edge(Edge(put, 2, counter, 0, sink.domain))
    return Edge(sink, edge.sink_in, put, 0, sink.domain)
