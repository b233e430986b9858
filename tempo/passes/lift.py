"""Lifting of recurrent patterns: sums over time written step by step become one op.

Three patterns over the program's innermost dim ``t`` (paper §4.1, Fig. 10):

- a *running sum*, a placeholder ``s[t == 0] = x; s[True] = s[t-1] + x``;
- a *prefix sum*, ``x[0:t+1].sum(0)``, which adds ``t + 1`` steps at every ``t``
  (``T (T + 1) / 2`` additions in all);
- a *linear recurrence*, ``a[t == T-1] = d; a[True] = d + c * a[t+1]`` (GAE's advantages,
  discounted returns with episode ends), or forward, ``a[t == 0] = d; a[True] = d + c *
  a[t-1]``, with ``c`` and ``d`` computed at each step.

The first two are ``cumsum(x[0:T], 0)[t]``, the third ``linear_recurrence(c[0:T],
d[0:T])[t]`` (``c``'s row at the first branch's step unused: ``c[0:T-1]``, forward
``c[1:T]``, where computing it there would read another step): the pass adds one such op
over the op's other dims, reading the steps, and the op becomes a ``take`` of row ``t`` of
it (at an ``eval_symbol`` of ``t`` in the run's own coordinates), so its readers are
untouched. The vectorization pass that follows turns those rows back into reads of the
whole op where its readers are vectorized. The recurrence (``s[t-1] + x``) goes, and with
it a sequential loop over ``t``: on JAX a ``lax.scan`` whose steps an accelerator runs one
by one from the host, where the linear recurrence takes ``log2 T`` array steps
(``tempo.ir.ops._linear_recurrence``).

A pattern is lifted only when the op is needed at every ``t`` of each point of its other
dims, so that every step the new op reads is one the program computes anyway (a
coefficient's unused row aside, computed from points it computes); a forward
linear recurrence not where the schedule keeps memory bounded (``PassState.bounded``: step
by step it holds one step, the new op all of them). A recurrence whose coefficient or term
reads its own value is not linear, and stays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
from tempo.symbolic.expr import FALSE, TRUE, Expr, Slice, Symbol, const, linear_form

if TYPE_CHECKING:
    from tempo.passes import PassState


def lift_recurrences(graph: SDG, state: PassState) -> SDG:
    """``graph`` with each running or prefix sum over the innermost dim computed by one
    ``cumsum`` and each linear recurrence by one ``linear_recurrence`` (a forward one not
    where the schedule keeps memory bounded, ``PassState.bounded``); ``state.needed`` is
    recomputed for the new graph."""
    dim = list(state.bound_of)[-1] if state.bound_of else None
    size = state.bounds.get(state.bound_of[dim]) if dim is not None else None
    if size is None:  # the program does not use the dim
        state.notes.append("lift: nothing lifted")
        return graph
    needed = needed_by_op(state.needed, graph.ops)
    poly = Polyhedral(graph, state.bounds, state.bound_of)
    lifted: dict[int, Lifted] = {}
    last = dim == state.bound_of[dim] - 1
    computed: dict[int, bool] = {}

    def everywhere(op: Op) -> bool:
        """Whether ``op`` is, or can be, computed at every step of ``dim`` reading only
        points the program computes (a device op whose reads of ``dim`` are at its own
        step, of ops computed at every step)."""
        if op.id not in computed:
            computed[op.id] = op.id in needed and needed_at_every_step(poly, op, dim, needed[op.id]) \
                or not op.definition.host and op.kind != "merge" and all(
                    dim not in e.src.domain or e.phi[e.src.domain.index(dim)] is dim and everywhere(e.src)
                    for e in graph.in_edges(op))
        return computed[op.id]
    for op in graph.ops.values():
        if op.id in state.keep or op.id not in needed or dim not in op.domain or op.when is not TRUE:
            continue
        summed = _running_sum(graph, op, dim) or _prefix_sum(graph, op, dim, state.bounds)
        found = Lifted("cumsum", (summed,), {"dim": 0}) if summed is not None else \
            _linear_recurrence(graph, op, dim, last, everywhere)
        if found is not None and found.params.get("forward") and state.bounded:
            continue  # (step by step, a forward recurrence holds one step: the op holds them all)
        if found is not None and needed_at_every_step(poly, op, dim, needed[op.id]):
            lifted[op.id] = found
    if not lifted:
        state.notes.append("lift: nothing lifted")
        return graph
    out = _rebuild(graph, lifted, dim, size, state)
    state.needed = recomputed_needed(out, state)
    sums = sum(found.kind == "cumsum" for found in lifted.values())
    state.notes.append(f"lift: {sums} sums over {dim.name} lifted to cumsums, "
                       f"{len(lifted) - sums} linear recurrences to linear_recurrence")
    return out


@dataclass(frozen=True)
class Lifted:
    """The op a pattern becomes (rows of it): its kind, the reads of its inputs at the
    pattern's point, its params, and per read the steps it reads (all where None)."""

    kind: str
    reads: tuple[Edge, ...]
    params: dict
    steps: tuple[tuple[int, int | None] | None, ...] = ()


def _plain_read(edge: Edge, dim: Symbol, cond: object = TRUE) -> bool:
    """Read at the sink's own point (no window, no shift) under ``cond``."""
    return edge.cond is cond and edge.src.domain == edge.sink.domain and \
        all(e is d for e, d in zip(edge.phi, edge.sink.domain)) and dim in edge.src.domain


def _running_sum(graph: SDG, op: Op, dim: Symbol) -> Edge | None:
    """``s[t == 0] = x; s[True] = s[t-1] + x``: the read of ``x`` (else None)."""
    if op.kind != "merge" or len(graph.in_edges(op)) != 2:
        return None
    first, step = graph.in_edges(op)
    if not _plain_read(first, dim, dim == 0) or not _plain_read(step, dim) \
            or not _one_step(step.src, op, "add"):
        return None
    previous = tuple(d - 1 if d is dim else d for d in op.domain)
    for carried, fresh in _either_order(graph.in_edges(step.src)):
        if _reads_at(carried, op, previous) and _plain_read(fresh, dim) and fresh.src is first.src \
                and fresh.src_out == first.src_out and same_type(op, 0, fresh.src, fresh.src_out) \
                and not _depends_on(graph, [fresh.src], op, dim):
            return fresh
    return None


def _linear_recurrence(graph: SDG, op: Op, dim: Symbol, last: Expr,
                       everywhere: Callable[[Op], bool]) -> Lifted | None:
    """``a[t == T-1] = d; a[True] = d + c * a[t+1]`` (or forward: ``t == 0``, ``a[t-1]``),
    with ``c``, ``d`` and ``a`` of one type and neither ``c`` nor ``d`` depending on ``a``
    (else None). ``c`` is read at the steps the recursive branch runs at only."""
    if op.kind != "merge" or len(graph.in_edges(op)) != 2:
        return None
    first, step = graph.in_edges(op)
    forward = first.cond is (dim == 0)
    if not _plain_read(first, dim, first.cond if forward else last) or not _plain_read(step, dim) \
            or not _one_step(step.src, op, "add"):
        return None
    neighbour = tuple(d + (-1 if forward else 1) if d is dim else d for d in op.domain)
    for term, product in _either_order(graph.in_edges(step.src)):
        same_term = term.src is first.src and term.src_out == first.src_out and _plain_read(term, dim)
        if not same_term or not _plain_read(product, dim) or not _one_step(product.src, op, "mul"):
            continue
        for coefficient, carried in _either_order(graph.in_edges(product.src)):
            if _reads_at(carried, op, neighbour) and _plain_read(coefficient, dim) \
                    and same_type(op, 0, coefficient.src, coefficient.src_out) \
                    and same_type(op, 0, term.src, term.src_out) \
                    and not _depends_on(graph, [coefficient.src, term.src], op, dim):
                # The coefficient at the first branch's step is never used: read there only
                # where it is computed there anyway or can be from computed points.
                boundary = (1, None) if forward else (0, -1)
                steps = None if everywhere(coefficient.src) else boundary
                return Lifted("linear_recurrence", (coefficient, term), {"dim": 0, "forward": forward},
                              (steps, None))
    return None


def _reads_at(edge: Edge, op: Op, index: tuple[Expr, ...]) -> bool:
    """``edge`` reads ``op`` at ``index``, unconditionally."""
    return edge.src is op and edge.cond is TRUE and all(a is b for a, b in zip(edge.phi, index))


def _one_step(op: Op, merge: Op, kind: str) -> bool:
    """An op of ``kind`` and of the merge's type at each of its points, computed wherever
    it is needed."""
    return op.kind == kind and op.when is TRUE and not op.requires and op.domain == merge.domain \
        and same_type(op, 0, merge, 0)


def _depends_on(graph: SDG, ops: list[Op], target: Op, dim: Symbol) -> bool:
    """Whether any of ``ops`` reads ``target`` at a point of the same recurrence, through
    any chain of reads (a recurrence whose coefficient or term reads its own value is not
    linear). A chain that reads a strictly earlier coordinate of the first of ``target``'s
    other dims does not count, and at a placeholder read at fixed coordinates only the
    branches that can be taken there are followed: PPO's advantages at iteration ``i``
    feed the update whose weights at ``(i + 1, 0)``, read by the rollout, come from the
    last update of iteration ``i``."""
    outer = next((d for d in target.domain if d is not dim), None)
    stack: list[tuple[Op, str, tuple]] = [(op, "same", ()) for op in ops]
    seen = set()
    while stack:
        op, where, fixed = stack.pop()
        if op is target and where != "earlier":
            return True
        if (op.id, where, fixed) in seen or op is target:
            continue
        seen.add((op.id, where, fixed))
        known = dict(fixed)
        stack.extend((edge.src, _along(edge, outer, where), _fixed_coordinates(edge, known))
                     for edge in _taken_branches(graph, op, known))
    return False


def _taken_branches(graph: SDG, op: Op, known: dict[Symbol, int]) -> list[Edge]:
    """``op``'s inputs; a placeholder's only up to the first branch certain to be taken
    at the ``known`` coordinates, without those certain not to be."""
    if op.kind != "merge":
        return graph.in_edges(op)
    taken = []
    for edge in graph.in_edges(op):
        cond = edge.cond.substitute(known) if known else edge.cond
        if cond is not FALSE:
            taken.append(edge)
        if cond is TRUE:
            break
    return taken


def _fixed_coordinates(edge: Edge, known: dict[Symbol, int]) -> tuple:
    """The coordinates of ``edge``'s source that its read fixes, given the sink's
    ``known`` ones (``w[i, 0]``: ``u = 0``)."""
    fixed = []
    for d, entry in zip(edge.src.domain, edge.phi):
        if not isinstance(entry, Slice):
            value = entry.substitute(known) if known else entry
            if value.is_const:
                fixed.append((d, value.value))
    return tuple(sorted(fixed, key=lambda item: item[0].name))


def _along(edge: Edge, dim: Symbol | None, where: str) -> str:
    """Where a chain of reads that was ``where`` (``"same"``, ``"earlier"``, ``"unknown"``)
    along ``dim`` is once it reads ``edge``'s source: a strictly earlier coordinate
    (``x[i-1]``) makes it earlier, the same one keeps it, anything else loses track."""
    if where == "unknown" or dim is None or dim not in edge.src.domain or dim not in edge.sink.domain:
        return "unknown"
    entry = edge.phi[edge.src.domain.index(dim)]
    if entry is dim:
        return where
    form = None if isinstance(entry, Slice) else linear_form(entry - dim)
    return "earlier" if form is not None and not form[0] and form[1] < 0 else "unknown"


def _either_order(edges: list[Edge]) -> list[tuple[Edge, Edge]]:
    return [(edges[0], edges[1]), (edges[1], edges[0])] if len(edges) == 2 else []


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


def _rebuild(graph: SDG, lifted: dict[int, Lifted], dim: Symbol, size: int,
             state: PassState) -> SDG:
    """Each lifted op as a ``take`` of row ``dim`` of a new op over the whole dim, placed
    before it."""
    out = SDG()
    for op in graph.ops.values():
        if op.id not in lifted:
            out.add_op(op)
            for edge in graph.in_edges(op):
                out.add_edge(edge)
            continue
        found = lifted[op.id]
        rest = tuple(d for d in op.domain if d is not dim)
        spans = found.steps or (None,) * len(found.reads)
        reads = [Edge(op, k, read.src, read.src_out, _steps(read, dim, *_span(span, size)))
                 for k, (read, span) in enumerate(zip(found.reads, spans))]
        t = found.reads[-1].src.outputs[found.reads[-1].src_out]
        whole = add_with_inputs(out, Op(state.next_id, found.kind, found.params, rest,
                                        (TensorType((const(size), *t.shape), t.dtype),), op.site,
                                        f"{op.label or op.kind}_{found.kind}"), reads)
        index = add_with_inputs(out, row_index_op(state.next_id + 1, dim, (dim,), op.site), [])
        state.next_id += 2
        row = Op(op.id, "take", {"dim": 0}, op.domain, op.outputs, op.site, op.label)
        add_with_inputs(out, row, [Edge(row, 0, whole, 0, rest), Edge(row, 1, index, 0, (dim,))])
    return without_unreached(out, state.keep)


def _span(span: tuple[int, int | None] | None, size: int) -> tuple[int, int]:
    """``(start, stop)`` of ``size`` steps: all of them where ``span`` is None; a ``stop``
    of None is the end, a negative one counts from it."""
    if span is None:
        return 0, size
    start, stop = span
    return start, size if stop is None else stop % size if stop < 0 else stop


def _steps(read: Edge, dim: Symbol, start: int, stop: int) -> tuple:
    """``read``'s index with the steps ``start:stop`` of ``dim``."""
    at = read.src.domain.index(dim)
    return tuple(Slice(const(start), const(stop)) if k == at else e for k, e in enumerate(read.phi))
