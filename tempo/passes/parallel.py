"""Parallel dims laid out spatially: the env dim ``b`` of a program over ``(b, i, t)``.

A dim declared parallel (``tp.Context(dims=("b", "i", "t"), parallel=("b",))``) promises
that no point of it reads another that depends on it: ops read ``b`` at ``b`` itself, or
at fixed points or windows of it (``loss[i] = x[0:B, i, 0:T].mean()``, ``x[0, i, t]``);
``validate.check_parallel`` rejects anything else (``x[b - 1]``). Every op over the dim is
then computed once for all ``B`` points: it loses the dim and its output gains a leading
axis of size ``B``. It is all or nothing per dim: should one op have no form below (a
host UDF without a ``batched`` function, a condition on the dim, a second parallel dim
in a draw), the dim stays a loop and the compile report names that op.

The forms:

- pure device ops: the rules of ``tempo.passes.vectorize``;
- a placeholder's merge: the same branches read stacked, a branch without the dim (a
  shared initial state) broadcast;
- random draws: the point's coordinates for every ``b`` at once (``coords`` with a
  ``stacked`` axis), one draw per row (``rng`` with a ``batch``): exactly the per-point
  draws, in one encryption (``tempo.ir.random``);
- ``eval_symbol(b)``: ``arange(B)``;
- traceable UDFs: ``jax.vmap`` of the function (rows mapped, other inputs shared);
- host UDFs over one parallel dim: their ``batched`` function, called once with every row
  (with ``own_rows``, ``rows_of`` names the dim and its size and ``row_inputs`` the inputs
  that hold its rows: where the dim is split over several processes, each calls it with
  its own rows);
- reader sums (gradients): the same sums with a leading axis kept whole, or summed where
  every ``b`` read one point; a matmul read only by such sums (a shared weight's
  ``x^T g``) contracts over the dim instead.

Edges: a laid-out op reads a laid-out source at ``b`` without the dim; windows of other
dims come first in what the runtime reads, so a ``permute`` moves the stacked axis to
where the op expects it (first, or where the window over the dim was); a read of one
point or part of the dim goes through ``take`` or ``slice``, and is the same for every
point of a laid-out reader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import islpy as isl

from tempo.analysis.needed import needed_by_op
from tempo.analysis.polyhedral import Polyhedral
from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.ops import param_symbols
from tempo.ir.readers import ReaderSum
from tempo.ir.types import TensorType
from tempo.passes.contract import (
    contracted_matmuls,
    input_type,
    shifted_position,
    summed_reader_sum,
    sums_every_point,
    whole_window_reads,
    without_sink_dim,
)
from tempo.passes.rewrite import recomputed_needed, without_unreached
from tempo.passes.vectorize import RULE_KINDS, Rule, StackingRewriter, checked_rule, stacked
from tempo.symbolic.expr import Slice, Symbol, const

if TYPE_CHECKING:
    from tempo.passes import PassState


def vectorize_parallel_dims(graph: SDG, state: PassState) -> SDG:
    """``graph`` with each parallel dim laid out spatially where every op over it has a
    vectorized form; ``state.needed`` is recomputed for the new graph."""
    for dim in state.parallel:
        size = state.bounds.get(state.bound_of[dim])
        if size is None:
            continue
        rules, blocker = _rules(graph, state, dim, size)
        if blocker is not None:
            state.notes.append(f"parallel: {dim.name} stays a loop: {blocker}")
            continue
        contracted = contracted_matmuls(graph, rules, dim, size, state.bounds, state.keep,
                                        lambda e, d=dim: _is_row(e, d))
        entries = _entry_ops(graph, rules, dim) if dim is state.sharded else set()
        graph = _Rewriter(graph, dim, size, state.bounds, rules, state.next_id,
                          contracted=contracted).rewrite()
        state.next_id = max(graph.ops) + 1
        if entries:
            graph = _placed_on_mesh(graph, entries, state.next_id)
            state.next_id = max(graph.ops) + 1
            state.notes.append(f"parallel: {dim.name} split over devices where it enters laid out "
                               f"({len(entries)} ops)")
        graph = without_unreached(graph, state.keep)
        state.needed = recomputed_needed(graph, state)
        state.notes.append(f"parallel: {len(rules)} ops over {dim.name} vectorized")
    return graph


def _entry_ops(graph: SDG, rules: dict[int, Rule], dim: Symbol) -> set[int]:
    """The ops laid out over ``dim`` where its points enter the program: host ops (their
    values come from NumPy) and ops that read no row of another laid-out op (coordinates,
    the dim's own value). Every laid-out value derives from theirs, so placing theirs on
    the mesh places the rest: XLA propagates a sharding through the ops that read it."""
    return {k for k in rules if graph.ops[k].definition.host
            or not any(_is_row(e, dim) for e in graph.in_edges(graph.ops[k]))}


def _placed_on_mesh(graph: SDG, entries: set[int], next_id: int) -> SDG:
    """``graph`` with every output of the ``entries`` ops read through a ``shard`` op of
    its leading (laid-out) axis, at the same point: their readers keep their reads."""
    out, shards = SDG(), {}
    for op in graph.ops.values():
        out.add_op(op)
        if op.id not in entries:
            continue
        for k, t in enumerate(op.outputs):
            shard = out.add_op(Op(next_id, "shard", {"dim": 0}, op.domain, (t,), op.site,
                                  f"{op.label or op.kind}_shard"))
            out.add_edge(Edge(shard, 0, op, k, op.domain))
            shards[(op.id, k)] = shard
            next_id += 1
    for edges in graph.inputs.values():
        for e in edges:
            src = shards.get((e.src.id, e.src_out))
            out.add_edge(e if src is None else Edge(e.sink, e.sink_in, src, 0, e.phi, e.cond))
    return out


# ---- rules ----------------------------------------------------------------------------------
def _rules(graph: SDG, state: PassState, dim: Symbol, size: int
           ) -> tuple[dict[int, Rule], str | None]:
    """The rule of every op over ``dim``, or what keeps one op from having one."""
    rules: dict[int, Rule] = {}
    poly = Polyhedral(graph, state.bounds, state.bound_of)
    needed = needed_by_op(state.needed, graph.ops)
    for op in graph.ops.values():
        if dim not in op.domain:
            if op.kind == "sum_readers" and not _summable(op, graph.in_edges(op)[0], dim, size, state.bounds):
                return {}, f"{op.name} ({op.site}) sums gradients over part of {dim.name}"
            continue
        if not _requirements_hold(poly, op, needed.get(op.id), dim):
            return {}, f"{op.name} ({op.site}) has a requirement over {dim.name} that fails"
        others = [d for d in state.parallel if d is not dim and d in op.domain]
        rule = _rule(op, graph.in_edges(op), dim, size, state.bounds, others)
        if rule is None:
            return {}, f"{op.name} ({op.kind}, {op.site}) has no vectorized form"
        rules[op.id] = rule
    return rules, None


def _requirements_hold(poly: Polyhedral, op: Op, needed: isl.Set | None, dim: Symbol) -> bool:
    """The op's requirements over ``dim`` (an index within its size) hold at every needed
    point, so the op laid out, which no longer has the points, need not check them."""
    for cond, _ in op.requires:
        if dim in cond.symbols() and needed is not None:
            if not isl.UnionSet.from_set(needed).subtract(poly.condition_set(op, cond)).is_empty():
                return False
    return True


def _rule(op: Op, edges: list[Edge], dim: Symbol, size: int, bounds: dict[Symbol, int],
          other_parallel: list[Symbol]) -> Rule | None:
    """How ``op`` is laid out over ``dim``: point ops and ops that are not pure device ops
    by their entry of ``_POINT_RULES`` or ``_RULES``, the others by vectorize's rules."""
    if dim in op.when.symbols() or any(dim in d.symbols() for t in op.outputs for d in t.shape):
        return None
    rows = [_is_row(e, dim) for e in edges]
    if any(not row and any(dim in x.symbols() for x in (*e.phi, e.cond)) for e, row in zip(edges, rows)):
        return None  # read at an index that uses the dim but is not the dim itself
    at = _Site(op, edges, rows, dim, size, bounds, other_parallel)
    if op.kind in _POINT_RULES:  # their params name the dim by design
        return _POINT_RULES[op.kind](at)
    if dim in param_symbols(op.params):
        return None
    if op.kind in _RULES:
        return _RULES[op.kind](at)
    if op.definition.host or op.kind not in RULE_KINDS:
        return None
    return checked_rule(op, edges, rows, size)


@dataclass(frozen=True)
class _Site:
    """What a rule sees: the op, its input edges and which of them read rows of ``dim``,
    the dim laid out, its size, the bounds, and the program's other parallel dims."""

    op: Op
    edges: list[Edge]
    rows: list[bool]
    dim: Symbol
    size: int
    bounds: dict[Symbol, int]
    other_parallel: list[Symbol]

    def stacked_outputs(self, types: tuple[TensorType, ...]) -> tuple[TensorType, ...]:
        return tuple(stacked(t, self.size, 0) for t in types)

    @property
    def unpadded(self) -> tuple[int, ...]:
        return tuple(0 for _ in self.edges)


def _coords(at: _Site) -> Rule | None:
    """One parallel dim laid out per draw."""
    p = at.op.params
    return Rule({**p, "stacked": (p["dims"].index(at.dim), at.size)}, ()) if "stacked" not in p else None


def _eval_symbol(at: _Site) -> Rule | None:
    """The dim's own value: an ``arange``."""
    p = at.op.params
    if p["expr"] is not at.dim:
        return None
    return Rule({"size": at.size, "dtype": p["dtype"]}, (), kind="arange", inputs=0)


def _rng(at: _Site) -> Rule | None:
    """One draw per row; the coordinates keyed before the dim are the same in every row."""
    p = at.op.params
    shared = at.edges[0].src.params["dims"].index(at.dim)
    return Rule({**p, "batch": at.size, "shared": shared}, (0,)) if "batch" not in p else None


def _merge(at: _Site) -> Rule | None:
    """Branches read the same for every point are broadcast (``_Rewriter._broadcast_into_merge``)."""
    if any(at.dim in e.cond.symbols() for e in at.edges):
        return None
    p = at.op.params
    return Rule({**p, "out_type": stacked(p["out_type"], at.size, 0)}, at.unpadded)


def _traced_udf(at: _Site) -> Rule:
    p = at.op.params
    return Rule({**p, "fn": _vmapped(p["fn"], at.rows), "out_types": at.stacked_outputs(p["out_types"])},
                at.unpadded)


def _udf(at: _Site) -> Rule | None:
    """A host UDF's batched form, which is over the UDF's one parallel dim."""
    p = at.op.params
    if p.get("batched") is None or at.other_parallel:
        return None
    out_types = at.stacked_outputs(p["out_types"])
    own = {"rows_of": (at.dim.name, at.size), "row_inputs": tuple(at.rows)} if p.get("own_rows") else {}
    return Rule({"call": p["batched"](out_types), "out_types": out_types, **own}, at.unpadded)


def _sum_readers(at: _Site) -> Rule | None:
    return _reader_sum_rule(at.op, at.edges[0], at.dim, at.size, at.bounds)


_POINT_RULES: dict[str, Callable[[_Site], Rule | None]] = {"coords": _coords, "eval_symbol": _eval_symbol}
_RULES: dict[str, Callable[[_Site], Rule | None]] = {
    "rng": _rng, "merge": _merge, "traced_udf": _traced_udf, "udf": _udf, "sum_readers": _sum_readers}
"""Ops laid out by rules of their own; pure device ops take vectorize's (``RULES``)."""


def _is_row(edge: Edge, dim: Symbol) -> bool:
    """The edge reads its source (over ``dim``) at ``dim`` itself."""
    return dim in edge.src.domain and edge.phi[edge.src.domain.index(dim)] is dim


def _vmapped(fn: Any, rows: list[bool]) -> Any:
    import jax
    return jax.jit(jax.vmap(fn, in_axes=tuple(0 if row else None for row in rows)))


def _reader_sum_rule(op: Op, edge: Edge, dim: Symbol, size: int,
                     bounds: dict[Symbol, int]) -> Rule | None:
    """A gradient over ``dim``: each reader's slice gains the stacked axis, kept whole."""
    reads: ReaderSum = op.params["reads"]
    at = op.domain.index(dim)
    if dim in edge.cond.symbols() or dim in reads.sink_cond.symbols() or reads.lead:
        return None  # (one parallel dim laid out per gradient)
    if dim in reads.sink_dims:  # the readers are over ``dim`` and read it at ``dim``: g is stacked
        s = reads.sink_dims.index(dim)
        if dim not in edge.src.domain or reads.inverse[s] is not dim:
            return None
        offsets = tuple((shifted_position(k, at), start) for k, start in reads.offsets)
        new = without_sink_dim(reads, s, offsets, ("keep",))
    else:  # readers without ``dim`` read all of it through a window: keep that axis whole
        new = whole_window_reads(op, edge, dim, size, bounds)
        if new is None:
            return None
    return Rule({**op.params, "reads": new, "out_type": stacked(op.params["out_type"], size, 0)}, (0,))


def _summable(op: Op, edge: Edge, dim: Symbol, size: int, bounds: dict[Symbol, int]) -> bool:
    """A gradient without ``dim`` can sum its readers' stacked slices when, if they are
    over ``dim`` and stacked, every point of ``dim`` read it."""
    reads: ReaderSum = op.params["reads"]
    if dim not in edge.src.domain or dim not in reads.sink_dims:
        return True
    return sums_every_point(op, edge, dim, size, bounds)


# ---- rewriting ------------------------------------------------------------------------------
@dataclass
class _Rewriter(StackingRewriter):
    contracted: set[int] = field(default_factory=set)

    def _new_op(self, op: Op) -> Op:
        rule = self.rules.get(op.id)
        if rule is None:
            if op.kind == "sum_readers":
                (edge,) = self.graph.in_edges(op)
                if edge.src.id in self.rules and self.dim in op.params["reads"].sink_dims:
                    return summed_reader_sum(op, self.dim, edge.src.id in self.contracted)
            return op
        requires = tuple((c, what) for c, what in op.requires if self.dim not in c.symbols())
        outputs = op.outputs if op.id in self.contracted else \
            tuple(stacked(t, self.size, 0) for t in op.outputs)
        return Op(op.id, rule.kind or op.kind, rule.params, tuple(d for d in op.domain if d is not self.dim),
                  outputs, op.site, op.label, requires=requires)

    def _edge(self, edge: Edge) -> Edge:
        sink, src = self.ops[edge.sink.id], self.ops[edge.src.id]
        if edge.src.id not in self.rules:
            return self._broadcast_into_merge(Edge(sink, edge.sink_in, src, edge.src_out, edge.phi,
                                                   edge.cond))
        at = edge.src.domain.index(self.dim)
        entry, rest = edge.phi[at], (*edge.phi[:at], *edge.phi[at + 1:])
        direct = Edge(sink, edge.sink_in, src, edge.src_out, rest, edge.cond)
        if sink.kind == "sum_readers":  # it reads its input at the points its params name
            return direct
        if edge.sink.id in self.contracted:
            return self._contraction_operand(edge)
        windows = sum(1 for e in rest if isinstance(e, Slice))  # the read's axes before the stacked one
        if edge.sink.id in self.rules and entry is self.dim:  # a row: the stacked axis goes first
            moved = self._moved(direct, windows, 0)
            return self._padded(moved, edge)
        # A window of the dim or one point of it, the same for every point of the sink.
        if isinstance(entry, Slice) and not self._whole(entry):
            direct = self._through(direct, "slice", {"dim": windows, "start": entry.start,
                                                     "stop": entry.stop})
        elif not isinstance(entry, Slice):
            return self._broadcast_into_merge(
                self._through(direct, "take", {"dim": windows}, index=entry))
        before = sum(1 for e in edge.phi[:at] if isinstance(e, Slice))  # where the window over dim was
        return self._broadcast_into_merge(self._moved(direct, windows, before))

    def _stacked_read(self, read: Edge) -> Edge:
        at = read.src.domain.index(self.dim)
        return Edge(self.ops[read.sink.id], read.sink_in, self.ops[read.src.id], read.src_out,
                    (*read.phi[:at], *read.phi[at + 1:]))

    def _broadcast_into_merge(self, edge: Edge) -> Edge:
        """A laid-out merge's branch read the same for every point of the dim: broadcast
        to the stacked shape (readers of other kinds broadcast by their rules)."""
        if edge.sink.kind != "merge" or edge.sink.id not in self.rules:
            return edge
        shape = (const(self.size), *input_type(edge).shape)
        return self._through(edge, "expand", {"shape": shape})

    def _whole(self, entry: Slice) -> bool:
        return entry.start.substitute(self.bounds) is const(0) and \
            entry.stop.substitute(self.bounds) is const(self.size)

    def _moved(self, edge: Edge, axis: int, to: int) -> Edge:
        """``edge`` with axis ``axis`` of what it reads moved to ``to``."""
        if axis == to:
            return edge
        rank = input_type(edge).ndim
        order = [k for k in range(rank) if k != axis]
        order.insert(to, axis)
        return self._through(edge, "permute", {"dims": tuple(order)})

    def _padded(self, edge: Edge, original: Edge) -> Edge:
        """A row read through the unit dims after the stacked axis that its rule adds."""
        pads = self.rules[original.sink.id].pads
        for _ in range(pads[original.sink_in] if pads else 0):
            edge = self._through(edge, "unsqueeze", {"dim": 1})
        return edge
