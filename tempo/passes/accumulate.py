"""Gradient sums over the innermost dim, accumulated step by step.

Autodiff sums the contributions of every reading point into a ``sum_readers`` op: a
weight read at each step ``t`` of an iteration gets ``sum_t g[t]``. Where ``t`` was
vectorized (``tempo.passes.vectorize``) that sum is one op over the stacked steps. Where it
was not (a schedule that learns while it acts, or ops on a recurrence), the reader sum
would run once all ``T`` contributions exist, and each contribution, as large as the
weight, would wait for it: memory linear in ``T``. This pass makes each such sum a running
sum over ``t``,

    acc[t == a] = g[a];    acc[t] = acc[t-1] + g[t];    sum = acc[b-1]   (steps a..b-1),

so a contribution is added as soon as it is made and freed after, and the schedule keeps
one accumulator whatever ``T`` is. The additions are the ones the reader sum made.

A reader sum qualifies when it sums one range of steps of ``t`` (every step its
condition allows) at the op's own point of its other dims, reads no window
(``offsets``), and its stacked leading axes (dims laid out by ``tempo.passes.parallel``)
are all summed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import islpy as isl

from tempo.analysis.needed import needed_by_op
from tempo.analysis.polyhedral import statement_name
from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.readers import ReaderSum
from tempo.ir.types import TensorType
from tempo.passes.rewrite import add_with_inputs
from tempo.symbolic.expr import TRUE, Slice, Symbol

if TYPE_CHECKING:
    from tempo.passes import PassState


def accumulate_sums(graph: SDG, state: PassState) -> SDG:
    """``graph`` with each qualifying reader sum over the innermost dim made a running
    sum (module doc); ``state.needed`` gains the new ops' points."""
    dim = list(state.bound_of)[-1] if state.bound_of else None
    size = state.bounds.get(state.bound_of[dim]) if dim is not None else None
    # An output keeps its id, points and type: the result is an identity op in its place.
    chosen = [] if size is None else [op for op in graph.ops.values()
                                      if _accumulable(graph, op, dim, size, state.bounds)]
    if not chosen:
        state.notes.append("accumulate: 0 gradient sums accumulated")
        return graph
    served: dict[int, tuple[Op, str]] = {}
    out = _rebuild(graph, {op.id for op in chosen}, dim, state, served)
    state.needed = _with_running_sums(state.needed, served, dim, state.bounds)
    state.notes.append(f"accumulate: {len(chosen)} gradient sums over {dim.name} accumulated "
                       f"step by step")
    return out


def _accumulable(graph: SDG, op: Op, dim: Symbol, size: int, bounds: dict[Symbol, int]) -> bool:
    if op.kind != "sum_readers" or op.when is not TRUE:
        return False
    reads: ReaderSum = op.params["reads"]
    (edge,) = graph.in_edges(op)
    if dim not in reads.sink_dims or dim in op.domain or reads.offsets \
            or any(lead != "sum" for lead in reads.lead):
        return False
    if reads.sink_dims != (*op.domain, dim):  # dim is the innermost
        return False
    steps = _steps(reads, dim, bounds)
    if steps is None or not steps or edge.cond.substitute(bounds) is not TRUE:
        return False
    if any(entry is not d for d, entry in zip(reads.sink_dims, reads.inverse) if d is not dim):
        return False
    g = edge.src
    if g.domain != tuple(reads.sink_dims[k] for k in reads.g_dims) or dim not in g.domain:
        return False
    summed = _summed_type(g.outputs[edge.src_out], len(reads.lead))
    out = op.outputs[0]
    return summed.dtype == out.dtype and len(summed.shape) == len(out.shape) \
        and all(a is b for a, b in zip(summed.shape, out.shape))


def _steps(reads: ReaderSum, dim: Symbol, bounds: dict[Symbol, int]) -> range | None:
    """The steps of ``dim`` summed, when they are one range of constants at which the
    readers' condition always holds (it may restate the range: ``t >= 1``); else None."""
    entry = reads.inverse[reads.sink_dims.index(dim)]
    if not isinstance(entry, Slice) or reads.sink_cond.symbols() - {dim} - set(bounds):
        return None
    start, stop = entry.start.substitute(bounds), entry.stop.substitute(bounds)
    if not (start.is_const and stop.is_const):
        return None
    steps = range(int(start.value), int(stop.value))
    if reads.sink_cond is not TRUE and not all(reads.sink_cond.evaluate({**bounds, dim: k}) for k in steps):
        return None
    return steps


def _with_running_sums(needed: isl.UnionSet, served: dict[int, tuple[Op, str]], dim: Symbol,
                       bounds: dict[Symbol, int]) -> isl.UnionSet:
    """``needed`` with the points of each new op (``served``: the reader sum it serves,
    whose own points are unchanged, and the op's kind): that sum's points at each step it
    sums, up to the one before the last for the addition (it adds the next step). Found
    directly: finding them again from the roots would sweep each new recurrence one step
    at a time (146 s on n-step's program)."""
    by_op = needed_by_op(needed, [op.id for op, _ in served.values()])
    for k, (op, kind) in served.items():
        points = by_op.get(op.id)
        if points is None:
            continue
        steps = _steps(op.params["reads"], dim, bounds)
        last = steps.stop - (2 if kind == "add" else 1)  # the addition adds the next step
        if last < steps.start:
            continue
        n, ctx = points.dim(isl.dim_type.set), points.get_ctx()
        new = points.insert_dims(isl.dim_type.set, n, 1) \
            .lower_bound_val(isl.dim_type.set, n, isl.Val.int_from_si(ctx, steps.start)) \
            .upper_bound_val(isl.dim_type.set, n, isl.Val.int_from_si(ctx, last))
        needed = needed.union(isl.UnionSet.from_set(new.set_tuple_name(statement_name(k))))
    return needed


def _summed_type(t: TensorType, lead: int) -> TensorType:
    return TensorType(t.shape[lead:], t.dtype)


def _rebuild(graph: SDG, chosen: set[int], dim: Symbol, state: PassState,
             served: dict[int, tuple[Op, str]]) -> SDG:
    """Each chosen reader sum as a read of the last step of a running sum placed before it;
    ``served`` gets each new op's reader sum and kind."""
    out = SDG()
    for op in graph.ops.values():
        if op.id in chosen:
            first = state.next_id
            _running_sum(out, op, graph.in_edges(op)[0], dim, state)
            served.update({k: (op, out.ops[k].kind) for k in range(first, state.next_id)})
            continue
        out.add_op(op)
        for edge in graph.in_edges(op):
            out.add_edge(edge)
    return out


def _running_sum(out: SDG, op: Op, edge: Edge, dim: Symbol, state: PassState) -> None:
    reads: ReaderSum = op.params["reads"]
    domain, g = reads.sink_dims, edge.src
    value, site, name = op.outputs[0], op.site, op.label or op.kind

    def new_id() -> int:
        state.next_id += 1
        return state.next_id - 1

    step = Edge(op, 0, g, edge.src_out, g.domain)  # the contribution of one step, read there
    if reads.lead:
        total = Op(new_id(), "reduce_sum", {"dims": tuple(range(len(reads.lead))), "keepdims": False},
                   domain, (value,), site, f"{name}_step")
        add_with_inputs(out, total, [step])
        step = Edge(op, 0, total, 0, domain)
    # acc[t] = step[a] at t == a, else added[t-1]; added[t] = acc[t] + step[t+1]: the shift
    # is on the placeholder's branch, the form fusion keeps a recurrence in.
    acc = Op(new_id(), "merge", {"out_type": value}, domain, (value,), site, f"{name}_acc")
    added = Op(new_id(), "add", {}, domain, (value,), site, f"{name}_add")
    previous = tuple(d - 1 if d is dim else d for d in domain)
    following = tuple(d + 1 if d is dim else d for d in domain)
    out.add_op(acc)
    add_with_inputs(out, added, [Edge(op, 0, acc, 0, domain),
                                 Edge(op, 1, step.src, step.src_out, following)])
    window = reads.inverse[domain.index(dim)]
    out.add_edge(Edge(acc, 0, step.src, step.src_out, step.phi, dim == window.start))
    out.add_edge(Edge(acc, 1, added, 0, previous))
    last = tuple(window.stop - 1 if d is dim else d for d in domain)
    result = Op(op.id, "identity", {}, op.domain, op.outputs, site, op.label)
    add_with_inputs(out, result, [Edge(result, 0, acc, 0, last)])
