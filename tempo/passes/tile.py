"""Tiling: reads of slices whose length varies from point to point, padded to whole tiles.

A causal attention reads ``k[0:t+1]``, a window ``k[max(0, t-w+1):t+1]``: slices whose
length changes with ``t``, so every op on them has a shape that changes too, and a
compiler of static shapes (XLA) would compile them once per point. This pass pads such
reads to whole tiles of ``Z`` rows and keeps the ops on them correct with masks, so that
their shapes take a few values only (one, for a window) and they compile, fuse and run as
static programs.

For each group of reads of the same length the pass follows the varying axis through the
ops it flows into (the region): elementwise ops, permutes and inserted dims keep it,
matmuls keep it or contract it, reductions keep it or remove it, and so do discounted
sums; a cumulative sum along it keeps it (its rows before the padding sum no padded row).
The region also takes in values of the same length that no read delivers: an ``arange``
of it (``arange(stop - t)`` beside ``x[t:stop]``: its padded rows count on past the
points) and, on an accelerator, a slice of a value the vectorize pass laid out along the
dim (n-step's ``r[t:min(t+n, T)]`` of rewards computed for every ``t`` at once), which
becomes a ``window`` op: its first row an input, so that one program runs every step,
zeros past the value's end (on a CPU such a slice's ops run on the host in NumPy, which
measured faster there than one jitted kernel per step; on an accelerator each of them
waits for the device). Values are followed through reads at the same point, or at its part over
fewer dims (a value over ``t`` broadcast to ``(i, t)``). The schedule that keeps memory
bounded (``PassState.bounded``) takes none of the ops that depend on the order of the
padded rows (cumulative and discounted sums, ``arange``, slices): there n-step's returns
lie inside the recurrence that interleaves acting and learning, whose needed points the
masks left without a fixpoint in reasonable time (``memory=low`` compiled in more than
150 s, against 12 s unpadded). Every read of the group then delivers
``Z * ceil(length / Z)`` rows (``Slice.pad``): its points, then rows that are not points
(unwritten or stale rows of the store, or zeros). Those rows are masked where the axis is
removed: ``-inf`` before a maximum, zero before a sum or a contraction (the padded rows of
a probability are then exactly zero, whatever the rows they multiply). Values with the
padded axis stay inside the region; a group whose axis reaches anything else (a mean, a
reshape, an output of the program) is left as it was, with a note saying why.

The tile: when the longest read has at most ``STATIC_ROWS`` rows, every read is padded to
that length (one static shape: a window of ``w`` positions). Otherwise ``Z`` is the
smallest power of two, at least ``MIN_TILE``, that gives at most ``MAX_SHAPES`` lengths
(a shape is a program XLA compiles once; more tiles would pad less but compile more);
``tile=`` in ``Context.compile`` sets ``Z``. The compile report says what was chosen. On
NumPy, which runs any shape as it comes, reads are padded only with an explicit ``tile``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.ops import kinds_with, normalize_dim
from tempo.ir.types import TensorType
from tempo.passes.contract import input_type
from tempo.passes.rewrite import recomputed_needed
from tempo.symbolic.expr import TRUE, Expr, Slice, Symbol, compile_function, const

if TYPE_CHECKING:
    from tempo.passes import PassState

STATIC_ROWS = 1024
"""Reads of at most this many rows are padded to their longest length (one shape)."""
MIN_TILE = 128
MAX_SHAPES = 16

_KEEPS_ZERO = kinds_with("keeps_zero")
"""Elementwise ops that map a zero to a zero."""
_FILL = {"reduce_sum": 0.0, "reduce_max": -np.inf, "reduce_min": np.inf, "reduce_prod": 1.0}
"""What the padded rows are masked with before a reduction over them."""


@dataclass(frozen=True)
class _Axis:
    """Where the padded axis is in a value (counted from the end, as broadcasting aligns
    shapes), whether its padded rows are known to be zeros, and whether it is a read of a
    store (padded rows that are stored rows or zeros: finite)."""

    at: int
    zero: bool = False
    read: bool = False


@dataclass
class _Region:
    """What padding one group of reads changes: the padded values and the masks."""

    pad: Expr
    count: Expr
    """The points each read holds (the rows before the padding), over the reads' dims."""
    values: dict[tuple[int, int], _Axis] = field(default_factory=dict)
    masks: list[tuple[int, int, float, int]] = field(default_factory=list)
    """(op id, input, fill, axis): that input is masked before the op reads it."""


def tile_dynamic_slices(graph: SDG, state: PassState) -> SDG:
    """``graph`` with its varying-length slice reads padded to tiles where the module doc
    allows; ``state.needed`` is recomputed when anything changed. On a backend that runs
    any shape as it comes (NumPy) only with an explicit ``tile``."""
    if not state.shapes_compiled and state.tile is None:
        return graph
    groups: dict[Expr, list[Edge]] = {}
    for edge in graph.edges():
        count = _varying_count(edge, state.bounds)
        if count is not None:
            groups.setdefault(count, []).append(edge)
    slicers: dict[Expr, list[Op]] = {}
    ordered = not state.bounded
    for op in graph.ops.values() if state.accelerator and ordered else ():
        if op.kind == "slice":
            count = (op.params["stop"] - op.params["start"]).substitute(state.bounds)
            if not count.is_const:
                slicers.setdefault(count, []).append(op)
    regions: list[tuple[list[Edge], _Region]] = []
    for count in {**groups, **slicers}:
        reads, ops = groups.get(count, []), slicers.get(count, [])
        first = reads[0].sink if reads else ops[0]
        name = f"{reads[0].src.name}[{reads[0].phi[reads[0].slices[0]]}]" if reads else ops[0].name
        dim = _varying_dim(count, first.domain, state.bounds)
        if dim is None:
            state.notes.append(f"tile: {name} left unpadded: its length varies with more than one dim")
            continue
        pad, tile, shapes = _padding(count, dim, state)
        region = _Region(pad, count)
        aranges = _aranges_of(graph, count, dim, state.bounds) if ordered else []
        why = _grow(graph, reads, region, state.keep, aranges, ops, ordered)
        if why is not None and reads and (aranges or ops):  # without them, as before
            region, ops = _Region(pad, count), []
            why = _grow(graph, reads, region, state.keep, ordered=ordered)
        if why is not None:
            state.notes.append(f"tile: {name} left unpadded: {why}")
            continue
        regions.append((reads, region))
        what = f"padded to {pad} rows" if shapes == 1 else f"padded to tiles of {tile} rows ({shapes} shapes)"
        more = len(reads) + len(ops) - 1
        state.notes.append(f"tile: {name} and {more} more read(s) of that length {what}, "
                           f"{len(region.masks)} mask(s)")
    if not regions:
        return graph
    out = _rebuilt(graph, regions, state)
    state.needed = recomputed_needed(out, state)
    return out


# ---- which reads, padded to what ----------------------------------------------------------
def _varying_count(edge: Edge, bounds: dict[Symbol, int]) -> Expr | None:
    """The length of the edge's one slice when it varies from point to point."""
    if len(edge.slices) != 1 or edge.cond.symbols() - set(bounds):
        return None
    entry = edge.phi[edge.slices[0]]
    if entry.pad is not None:
        return None
    count = entry.count.substitute(bounds)
    return None if count.is_const else count


def _varying_dim(count: Expr, domain: tuple[Symbol, ...], bounds: dict[Symbol, int]) -> Symbol | None:
    """The one dim of ``domain`` the length varies with (None: several, or another)."""
    free = count.symbols() - set(bounds)
    dim = next(iter(free)) if len(free) == 1 else None
    return dim if dim in domain else None


def _padding(count: Expr, dim: Symbol, state: PassState) -> tuple[Expr, int, int]:
    """The rows each read delivers, the tile, and how many lengths there are."""
    at = compile_function([count], [dim], state.bounds)
    longest = max(1, *(int(at(v)[0]) for v in range(state.bounds[state.bound_of[dim]])))
    if state.tile is None and longest <= STATIC_ROWS:
        return const(longest), longest, 1
    tile = state.tile or MIN_TILE
    while state.tile is None and -(-longest // tile) > MAX_SHAPES:
        tile *= 2
    return (count + (tile - 1)) // tile * tile, tile, -(-longest // tile)


def _aranges_of(graph: SDG, count: Expr, dim: Symbol, bounds: dict[Symbol, int]) -> list[Op]:
    """The ``arange`` ops over ``dim`` as long as the group's reads (``arange(stop - t)``
    beside a read of ``x[t:stop]``: the positions of the read's points), which the region
    pads with them: their padded rows count on past the points, as a read's are masked."""
    return [op for op in graph.ops.values() if op.kind == "arange" and dim in op.domain
            and op.params["size"].substitute(bounds) == count]


# ---- the region ---------------------------------------------------------------------------
def _grow(graph: SDG, reads: list[Edge], region: _Region, keep: set[int],
          aranges: Sequence[Op] = (), slicers: Sequence[Op] = (), ordered: bool = True) -> str | None:
    """Fill ``region`` with the values the padded axis flows through and the masks it
    needs, from the group's ``reads``, the ``slicers`` of that length (slices of a value
    laid out along the dim, ``tempo.passes.vectorize``: padded with zeros) and the
    ``aranges`` of that length; a reason when the group cannot be padded. ``ordered``:
    through ops that depend on the order of the padded rows (cumulative and discounted
    sums) too."""
    domain = (reads[0].sink if reads else slicers[0]).domain
    inputs: dict[tuple[int, int], _Axis] = {}
    for edge in reads:
        if edge.sink.domain != domain:
            return f"{edge.sink.name} is over other dims than the other readers"
        rank = len(edge.src.outputs[edge.src_out].shape)
        inputs[(edge.sink.id, edge.sink_in)] = _Axis(-1 - rank, read=True)
    consumers = graph.consumers()
    seeds = [(op, _Axis(-1)) for op in aranges]
    for op in slicers:
        if op.domain != domain:
            return f"{op.name} is over other dims than the readers"
        rank = len(op.outputs[0].shape)
        # Its padded rows are the value's next rows (or zeros past its end): finite, not zeros.
        seeds.append((op, _Axis(normalize_dim(op.params["dim"], rank) - rank, read=True)))
    for op, axis in seeds:
        if op.id in keep:
            return f"{op.name}, an output of the program, has the padded axis"
        region.values[(op.id, 0)] = axis
        for edge in consumers[op.id]:
            if not _same_point(edge):
                return f"{edge.sink.name} reads {op.name} other than at its own point"
            inputs[(edge.sink.id, edge.sink_in)] = axis
    starts = {edge.sink.id for edge in reads} | {e.sink.id for op, _ in seeds for e in consumers[op.id]}
    for op in _forward_order(graph, consumers, starts):
        edges = graph.in_edges(op)
        axes = [inputs.get((op.id, k)) for k in range(len(edges))]
        if all(a is None for a in axes):
            continue
        rule = _rule(op, edges, axes, ordered)
        if isinstance(rule, str):
            return f"{op.name} ({op.kind}) {rule}"
        out, masks = rule
        region.masks += [(op.id, k, fill, axes[k].at) for k, fill in masks]
        if out is None:
            continue
        if op.id in keep:
            return f"{op.name}, an output of the program, has the padded axis"
        region.values[(op.id, 0)] = out
        for edge in consumers[op.id]:
            if not _same_point(edge) or edge.sink.kind == "sum_readers":
                return f"{edge.sink.name} reads {op.name} other than at its own point"
            inputs[(edge.sink.id, edge.sink_in)] = out
    return None


def _same_point(edge: Edge) -> bool:
    """The sink at ``p`` reads the source at ``p`` itself (or at the part of ``p`` over
    the source's dims: a value over fewer dims broadcast to the sink's), unconditionally."""
    return edge.cond is TRUE and not edge.slices and tuple(edge.phi) == tuple(edge.src.domain) \
        and set(edge.src.domain) <= set(edge.sink.domain)


def _forward_order(graph: SDG, consumers: dict[int, list[Edge]], sinks: set[int]) -> list[Op]:
    """The ops ``sinks`` reach through reads at the same point, each after the ones it
    reads (reads at other points, which carry recurrences, are not followed)."""
    reached, stack = set(sinks), list(sinks)
    while stack:
        for edge in consumers[stack.pop()]:
            if _same_point(edge) and edge.sink.id not in reached:
                reached.add(edge.sink.id)
                stack.append(edge.sink.id)
    waiting = {k: sum(1 for e in graph.inputs[k] if e.src.id in reached and _same_point(e))
               for k in reached}
    ready = sorted(k for k, n in waiting.items() if n == 0)
    order = []
    while ready:
        k = ready.pop(0)
        order.append(graph.ops[k])
        for edge in consumers[k]:
            if edge.sink.id in reached and _same_point(edge):
                waiting[edge.sink.id] -= 1
                if waiting[edge.sink.id] == 0:
                    ready.append(edge.sink.id)
    return order


Rule = tuple[_Axis | None, list[tuple[int, float]]] | str


def _rule(op: Op, edges: list[Edge], axes: list[_Axis | None], ordered: bool = True) -> Rule:
    """Where the padded axis is in ``op``'s output (None: removed) and which inputs are
    masked with what first; a reason string where the op cannot take a padded input."""
    ranks = [len(e.src.outputs[e.src_out].shape) + len(e.slices) for e in edges]
    if len(op.outputs) != 1:
        return "has several outputs"
    if op.definition.elementwise:
        return _elementwise(op, edges, axes, ranks)
    if op.kind == "permute":
        (axis,), (rank,) = axes, ranks
        dims = [normalize_dim(d, rank) for d in op.params["dims"]]
        return _Axis(dims.index(axis.at + rank) - rank, axis.zero, axis.read), []
    if op.kind == "matmul":
        return _matmul(axes, ranks)
    if op.kind == "unsqueeze" or ordered and op.kind in ("cumsum", "discounted_sum"):
        return _along(op, axes[0], ranks[0])
    if op.kind in _FILL:
        (axis,), (rank,) = axes, ranks
        dims = {normalize_dim(d, rank) for d in op.params["dims"]}
        at = axis.at + rank
        if at in dims:
            masked = [] if op.kind == "reduce_sum" and axis.zero else [(0, _FILL[op.kind])]
            return None, masked
        if op.params["keepdims"]:
            return axis, []
        kept = at - sum(1 for d in dims if d < at)
        return _Axis(kept - (rank - len(dims)), axis.zero), []
    return "cannot take a padded input"


def _along(op: Op, axis: _Axis, rank: int) -> Rule:
    """A cumulative sum (its rows before the padding are the points' own: they sum no
    padded row), a discounted sum (a reduction: padded rows masked with zeros) or an
    inserted dim, along the padded axis or another."""
    at = axis.at + rank
    if op.kind == "unsqueeze":
        dim = normalize_dim(op.params["dim"], rank + 1)
        return _Axis(at + (dim <= at) - (rank + 1), axis.zero, axis.read), []
    dim = normalize_dim(op.params["dim"], rank)
    if op.kind == "cumsum":
        return _Axis(axis.at, axis.zero and dim != at), []
    if dim == at:
        return None, [] if axis.zero else [(0, 0.0)]
    return _Axis(at - (dim < at) - (rank - 1), axis.zero), []


def _elementwise(op: Op, edges: list[Edge], axes: list[_Axis | None], ranks: list[int]) -> Rule:
    padded = [a for a in axes if a is not None]
    at = padded[0].at
    if any(a.at != at for a in padded):
        return "reads padded values with the axis at different places"
    for edge, axis, rank in zip(edges, axes, ranks):
        if axis is None and rank >= -at:
            shape = edge.src.outputs[edge.src_out].shape
            size = ([e.size for e in (edge.phi[k] for k in edge.slices)] + list(shape))[rank + at]
            if size is not const(1):
                return "broadcasts a value of the padded length that is not padded"
    zero = (op.kind == "mul" and any(a.zero for a in padded)) or \
        (op.kind in _KEEPS_ZERO and all(a.zero for a in padded))
    return _Axis(at, zero, read=op.kind in ("identity", "detach") and padded[0].read), []


def _matmul(axes: list[_Axis | None], ranks: list[int]) -> Rule:
    a, b = axes
    if min(ranks) < 2:
        return "multiplies a vector"
    contracted = (a is not None and a.at == -1, b is not None and b.at == -2)
    if any(contracted):
        if not all(contracted):
            return "contracts a padded axis with one that is not"
        # Padded rows must meet a zero: computed ones (maybe not finite) are masked, a
        # store's (finite) are left where the other operand is zero there.
        masked = [k for k, axis in enumerate(axes) if not axis.zero and not axis.read]
        if not masked and not any(axis.zero for axis in axes):
            masked = [0]
        return None, [(k, 0.0) for k in masked]
    if a is not None and b is not None:
        return "has padded axes in both operands"
    return (a if a is not None else b), []  # a's rows, b's columns or a batch axis: the output's


# ---- the new graph ------------------------------------------------------------------------
def _rebuilt(graph: SDG, regions: list[tuple[list[Edge], _Region]], state: PassState) -> SDG:
    """``graph`` with the regions' reads padded, their values retyped, their masks added."""
    padded_reads = {(e.sink.id, e.sink_in): region for reads, region in regions for e in reads}
    new_ops: dict[int, Op] = {}
    for _, region in regions:
        for (op_id, k), axis in region.values.items():
            op = graph.ops[op_id]
            shape = list(op.outputs[k].shape)
            shape[axis.at] = region.pad
            outputs = tuple(TensorType(tuple(shape), t.dtype) if n == k else t
                            for n, t in enumerate(op.outputs))
            kind, params = op.kind, op.params
            if kind == "arange":
                params = {**params, "size": region.pad}
            elif kind == "slice":  # a slicer seed: its start becomes an input (below)
                kind, params = "window", {"dim": params["dim"], "size": region.pad}
            new_ops[op_id] = replace(op, kind=kind, outputs=outputs, params=params)
    masks = {(op_id, k): (fill, at, region) for _, region in regions for op_id, k, fill, at in region.masks}
    counts: dict[tuple, Op] = {}
    out = SDG()
    windows = {op_id for op_id, op in new_ops.items() if op.kind == "window"}
    for op in graph.ops.values():
        out.add_op(new_ops.get(op.id, op))
    starts = {}  # a window's first row: an input, so that every start runs one program
    for op_id in windows:
        op = graph.ops[op_id]
        starts[op_id] = out.add_op(Op(state.next_id, "eval_symbol",
                                      {"expr": op.params["start"], "dtype": "int32", "in_run": True},
                                      op.domain, (TensorType((), "int32"),), op.site, "tile_start"))
        state.next_id += 1
    for op in graph.ops.values():
        for edge in graph.in_edges(op):
            phi = edge.phi
            region = padded_reads.get((op.id, edge.sink_in))
            if region is not None:
                at = edge.slices[0]
                entry = phi[at]
                phi = (*phi[:at], Slice(entry.start, entry.stop, region.pad), *phi[at + 1:])
            read = Edge(out.ops[op.id], edge.sink_in, out.ops[edge.src.id], edge.src_out, phi, edge.cond)
            mask = masks.get((op.id, edge.sink_in))
            if mask is not None:
                read = _masked(out, read, *mask, counts, state)
            out.add_edge(read)
        if op.id in starts:
            out.add_edge(Edge(out.ops[op.id], 1, starts[op.id], 0, op.domain))
    return out


def _masked(out: SDG, read: Edge, fill: float, at: int, region: _Region, counts: dict[tuple, Op],
            state: PassState) -> Edge:
    """``read`` with the padded rows of its axis ``at`` (from the end) set to ``fill``; the
    number of points comes from one op per length and dims (``counts``)."""
    sink = read.sink
    count = counts.get((region.count, sink.domain))
    if count is None:
        count = Op(state.next_id, "eval_symbol", {"expr": region.count, "dtype": "int32", "in_run": True},
                   sink.domain, (TensorType((), "int32"),), sink.site, "tile_count")
        counts[(region.count, sink.domain)] = out.add_op(count)
        state.next_id += 1
    mask = Op(state.next_id, "mask_rows", {"axis": at, "fill": fill}, sink.domain,
              (input_type(read),), sink.site, "tile_mask")
    state.next_id += 1
    out.add_op(mask)
    out.add_edge(Edge(mask, 0, read.src, read.src_out, read.phi, read.cond))
    out.add_edge(Edge(mask, 1, count, 0, count.domain))
    return Edge(sink, read.sink_in, mask, 0, mask.domain)

