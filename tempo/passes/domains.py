"""Domain reduction: an op computes each distinct value once, over the smallest domain
its inputs allow.

Two cases, both for pure device ops (no UDFs, merges or host ops; a random draw reads its
own point's coordinates, so it never moves) whose params and shape do not vary with the
point:

- *loop-invariant*: the op's reads do not use some of its dims (``tanh(w[i])`` over
  ``(i, t)``); it moves to the dims they use, and runs once per ``i`` instead of once per
  ``(i, t)``;
- *coarse reads*: every input with a domain is read at the same point index, which maps many of
  the op's needed points to one source point (``keys[i, u - u % 4].argsort()`` over
  ``(i, u)``); the op moves to its sources' domain, where it reads them at the point
  itself, and runs once per source point (once per epoch, not once per minibatch).

The op itself becomes an ``identity`` that reads the moved op at the old index, so its
readers are untouched; the copy pass that follows lets them read the moved op directly.
Reads are looked at through plain copies (``x[i, u - u % 4]`` is a copy of ``x``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import islpy as isl

from tempo.analysis.needed import needed_by_op, needed_of
from tempo.analysis.polyhedral import Polyhedral
from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.ops import param_symbols
from tempo.passes.copies import is_plain_copy, read_through
from tempo.passes.rewrite import without_unreached
from tempo.symbolic.expr import TRUE, IndexEntry, Slice, Symbol

if TYPE_CHECKING:
    from tempo.passes import PassState



@dataclass(frozen=True)
class _Move:
    """``op`` is computed as ``moved`` (over a smaller domain) and read at ``index``."""

    moved: Op
    index: tuple[IndexEntry, ...]
    reads: tuple[Edge, ...]
    """``moved``'s input edges (sources as in the input graph or moved ops)."""


def reduce_domains(graph: SDG, state: PassState) -> SDG:
    """``graph`` with every op that can be (see the module doc) computed over a smaller
    domain; ``state.needed`` gains the moved ops' points."""
    poly = Polyhedral(graph, state.bounds, state.bound_of)
    by_op = needed_by_op(state.needed, graph.ops)
    moves: dict[int, _Move] = {}
    invariant = 0
    for op in graph.ops.values():
        if not _movable(op, state.keep) or op.id not in by_op:
            continue
        reads = [_read_through(graph, moves, state.keep, e) for e in graph.in_edges(op)]
        if any(e.cond is not TRUE for e in reads):
            continue
        move = _drop_unused_dims(op, reads, state.next_id)
        if move is not None:
            invariant += 1
            narrowed = _points_read(poly, op, move, by_op[op.id])
            coarse = _to_source_domain(poly, move.moved, list(move.reads), narrowed, state.next_id)
            move = coarse or move  # coarse reads as well: straight to the sources' domain
        else:
            move = _to_source_domain(poly, op, reads, by_op[op.id], state.next_id)
        if move is None:
            continue
        moves[op.id] = move
        state.next_id += 1
        by_op[move.moved.id] = _points_read(poly, op, move, by_op[op.id])
    if not moves:
        state.notes.append("domains: 0 ops moved")
        return graph
    out = _rebuild(graph, moves, state.keep)
    state.needed = needed_of(state.needed, by_op, out.ops)
    state.notes.append(f"domains: {len(moves)} ops moved to smaller domains ({invariant} "
                       f"loop-invariant, {len(moves) - invariant} by coarse reads)")
    return out


def _points_read(poly: Polyhedral, op: Op, move: _Move, needed: isl.Set) -> isl.Set:
    """The moved op's needed points: those the op's needed points read."""
    relation = poly.reads(Edge(op, 0, move.moved, 0, move.index))
    return isl.Set.from_union_set(
        relation.intersect_domain(isl.UnionSet.from_set(needed)).range().coalesce())


def _movable(op: Op, keep: set[int]) -> bool:
    """A pure op whose value depends on the point only through what it reads."""
    d = op.definition  # merges and reader sums read by conditions; an identity reads through its edge
    if op.kind == "identity" or d.conditional_inputs or d.host or d.multi_output:
        return False
    if op.id in keep or op.when is not TRUE or not op.domain:
        return False
    dims = set(op.domain)
    return not param_symbols(op.params) & dims and \
        not any(d.symbols() & dims for t in op.outputs for d in t.shape)


def _read_through(graph: SDG, moves: dict[int, _Move], keep: set[int], edge: Edge) -> Edge:
    """``edge`` as a read of the value behind any chain of copies (moved ops included)."""
    while True:
        src = edge.src
        if src.id in moves:
            inner = Edge(src, 0, moves[src.id].moved, 0, moves[src.id].index)
        elif is_plain_copy(graph, src, keep):
            inner = graph.in_edges(src)[0]
        else:
            return edge
        composed = read_through(edge, inner)
        if composed is None:
            return edge
        edge = Edge(edge.sink, edge.sink_in, inner.src, inner.src_out, *composed)


def _used_dims(op: Op, reads: list[Edge]) -> set[Symbol]:
    used: set[Symbol] = set()
    for edge in reads:
        for entry in edge.phi:
            used |= entry.symbols()
    return used & set(op.domain)


def _drop_unused_dims(op: Op, reads: list[Edge], next_id: int) -> _Move | None:
    """The op over only the dims its reads use, if that is fewer than its own."""
    used = _used_dims(op, reads)
    if len(used) == len(op.domain):
        return None
    domain = tuple(d for d in op.domain if d in used)
    moved = _copy_op(op, next_id, domain)
    return _Move(moved, domain, tuple(_reattached(e, moved) for e in reads))


def _to_source_domain(poly: Polyhedral, op: Op, reads: list[Edge], needed: isl.Set,
                      next_id: int) -> _Move | None:
    """The op over its sources' common domain, if it reads them all (those with a domain)
    at one point index that maps several of its needed points to the same source point."""
    temporal = [e for e in reads if e.phi]
    if not temporal:
        return None
    index, domain = temporal[0].phi, temporal[0].src.domain
    if any(isinstance(e, Slice) for e in index) or any(
            e.src.domain != domain or any(a is not b for a, b in zip(e.phi, index))
            for e in temporal):
        return None
    if _recovers_every_dim(index, op.domain):
        return None
    relation = poly.reads(temporal[0]).intersect_domain(isl.UnionSet.from_set(needed))
    if relation.is_injective():
        return None
    moved = _copy_op(op, next_id, domain)
    return _Move(moved, index, tuple(Edge(moved, e.sink_in, e.src, e.src_out,
                                          domain if e.phi else ()) for e in reads))


def _recovers_every_dim(index: tuple[IndexEntry, ...], domain: tuple[Symbol, ...]) -> bool:
    """Some entry is ``d + c`` for each dim ``d``: the index is one-to-one, without isl."""
    points = [e for e in index if not isinstance(e, Slice)]
    return all(any(not (e - d).symbols() for e in points) for d in domain)


def _copy_op(op: Op, new_id: int, domain: tuple[Symbol, ...]) -> Op:
    """``op``'s computation over ``domain`` (its requirements were checked already)."""
    return Op(new_id, op.kind, op.params, domain, op.outputs, op.site, op.label)


def _reattached(edge: Edge, sink: Op) -> Edge:
    return Edge(sink, edge.sink_in, edge.src, edge.src_out, edge.phi, edge.cond)


def _rebuild(graph: SDG, moves: dict[int, _Move], keep: set[int]) -> SDG:
    """The graph with each moved op placed before the op it replaces, which becomes a
    copy of it; edges point at the new op objects; ops nothing reads any more go."""
    final: dict[int, Op] = {}
    for op in graph.ops.values():
        if op.id in moves:
            final[moves[op.id].moved.id] = moves[op.id].moved
            final[op.id] = Op(op.id, "identity", {}, op.domain, op.outputs, op.site, op.label)
        else:
            final[op.id] = op
    out = SDG()
    for op in final.values():
        out.add_op(op)
    for op in graph.ops.values():
        if op.id in moves:
            move = moves[op.id]
            for edge in move.reads:
                out.add_edge(_repointed(edge, final))
            out.add_edge(Edge(final[op.id], 0, move.moved, 0, move.index))
        else:
            for edge in graph.in_edges(op):
                out.add_edge(_repointed(edge, final))
    return without_unreached(out, keep)


def _repointed(edge: Edge, final: dict[int, Op]) -> Edge:
    return Edge(final[edge.sink.id], edge.sink_in, final[edge.src.id], edge.src_out,
                edge.phi, edge.cond)
