"""Lifting of recurrent patterns: sums over time written step by step become one ``cumsum``.

Two patterns over the program's innermost dim ``t`` (paper §4.1, Fig. 10):

- a *running sum*, a placeholder ``s[t == 0] = x; s[True] = s[t-1] + x``;
- a *prefix sum*, ``x[0:t+1].sum(0)``, which adds ``t + 1`` steps at every ``t``
  (``T (T + 1) / 2`` additions in all).

Both are ``cumsum(x[0:T], 0)[t]``: the pass adds one ``cumsum`` over the op's other dims,
reading all of ``x``'s steps, and the op becomes a ``take`` of row ``t`` of it (at an
``eval_symbol`` of ``t`` in the run's own coordinates), so its readers are untouched.
The vectorization pass that follows turns those rows back into reads of the whole
``cumsum`` where its readers are vectorized. The running sum's recurrence (``s[t-1] + x``)
goes, and with it a sequential loop over ``t``.

A pattern is lifted only when the op is needed at every ``t`` of each point of its other
dims, so that every step of ``x`` the ``cumsum`` reads is one the program computes anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tempo.analysis.needed import needed_at_every_step, needed_by_op
from tempo.analysis.polyhedral import Polyhedral
from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.ops import normalize_dim
from tempo.ir.types import TensorType
from tempo.passes.rewrite import (
    add_with_inputs,
    recomputed_needed,
    row_index_op,
    same_type,
    without_unreached,
)
from tempo.symbolic.expr import TRUE, Slice, Symbol, const

if TYPE_CHECKING:
    from tempo.passes import PassState


def lift_recurrences(graph: SDG, state: PassState) -> SDG:
    """``graph`` with each running or prefix sum over the innermost dim computed by one
    ``cumsum``; ``state.needed`` is recomputed for the new graph."""
    dim = list(state.bound_of)[-1] if state.bound_of else None
    size = state.bounds.get(state.bound_of[dim]) if dim is not None else None
    if size is None:  # the program does not use the dim
        state.notes.append("lift: 0 sums lifted")
        return graph
    needed = needed_by_op(state.needed, graph.ops)
    poly = Polyhedral(graph, state.bounds, state.bound_of)
    lifted: dict[int, Edge] = {}
    for op in graph.ops.values():
        if op.id in state.keep or op.id not in needed or dim not in op.domain or op.when is not TRUE:
            continue
        summed = _running_sum(graph, op, dim) or _prefix_sum(graph, op, dim, state.bounds)
        if summed is not None and needed_at_every_step(poly, op, dim, needed[op.id]):
            lifted[op.id] = summed
    if not lifted:
        state.notes.append("lift: 0 sums lifted")
        return graph
    out = _rebuild(graph, lifted, dim, size, state)
    state.needed = recomputed_needed(out, state)
    state.notes.append(f"lift: {len(lifted)} sums over {dim.name} lifted to cumsums")
    return out


def _plain_read(edge: Edge, dim: Symbol, cond: object = TRUE) -> bool:
    """Read at the sink's own point (no window, no shift) under ``cond``."""
    return edge.cond is cond and edge.src.domain == edge.sink.domain and \
        all(e is d for e, d in zip(edge.phi, edge.sink.domain)) and dim in edge.src.domain


def _running_sum(graph: SDG, op: Op, dim: Symbol) -> Edge | None:
    """``s[t == 0] = x; s[True] = s[t-1] + x``: the read of ``x`` (else None)."""
    if op.kind != "merge":
        return None
    branches = graph.in_edges(op)
    if len(branches) != 2:
        return None
    first, step = branches
    add = step.src
    if not _plain_read(first, dim, dim == 0) or not _plain_read(step, dim) or add.kind != "add" \
            or add.when is not TRUE or add.requires or add.domain != op.domain:
        return None
    previous = tuple(d - 1 if d is dim else d for d in op.domain)
    reads = graph.in_edges(add)
    for carried, fresh in ((reads[0], reads[1]), (reads[1], reads[0])):
        if (carried.src is op and carried.cond is TRUE
                and all(a is b for a, b in zip(carried.phi, previous))
                and _plain_read(fresh, dim) and fresh.src is first.src
                and fresh.src_out == first.src_out
                and same_type(add, 0, op, 0) and same_type(op, 0, fresh.src, fresh.src_out)):
            return fresh
    return None


def _prefix_sum(graph: SDG, op: Op, dim: Symbol, bounds: dict) -> Edge | None:
    """``x[0:t+1].sum(0)``: the read of ``x`` (else None)."""
    if op.kind != "reduce_sum" or op.params["keepdims"] or np.dtype(op.outputs[0].dtype).kind != "f":
        return None
    (edge,) = graph.in_edges(op)
    if edge.cond is not TRUE or dim not in edge.src.domain or len(edge.slices) != 1:
        return None
    rank = len(edge.src.outputs[edge.src_out].shape) + 1
    if tuple(normalize_dim(d, rank) for d in op.params["dims"]) != (0,):
        return None
    at = edge.src.domain.index(dim)
    window = edge.phi[at]
    if not isinstance(window, Slice) or window.start.substitute(bounds) is not const(0) \
            or window.stop is not dim + 1:
        return None
    if any(dim in e.symbols() for k, e in enumerate(edge.phi) if k != at):
        return None
    return edge


def _rebuild(graph: SDG, lifted: dict[int, Edge], dim: Symbol, size: int,
             state: PassState) -> SDG:
    """Each lifted op as a ``take`` of row ``dim`` of a new ``cumsum``, placed before it."""
    out = SDG()
    for op in graph.ops.values():
        if op.id not in lifted:
            out.add_op(op)
            for edge in graph.in_edges(op):
                out.add_edge(edge)
            continue
        read = lifted[op.id]
        at = read.src.domain.index(dim)
        rest = tuple(d for d in op.domain if d is not dim)
        phi = tuple(Slice(const(0), const(size)) if k == at else e for k, e in enumerate(read.phi))
        t = read.src.outputs[read.src_out]
        cumsum = add_with_inputs(out, Op(state.next_id, "cumsum", {"dim": 0}, rest,
                                         (TensorType((const(size), *t.shape), t.dtype),), op.site,
                                         f"{op.label or op.kind}_cumsum"),
                                 [Edge(op, 0, read.src, read.src_out, phi)])
        index = add_with_inputs(out, row_index_op(state.next_id + 1, dim, (dim,), op.site), [])
        state.next_id += 2
        row = Op(op.id, "take", {"dim": 0}, op.domain, op.outputs, op.site, op.label)
        add_with_inputs(out, row, [Edge(row, 0, cumsum, 0, rest), Edge(row, 1, index, 0, (dim,))])
    return without_unreached(out, state.keep)
