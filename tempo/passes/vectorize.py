"""Vectorization: a temporal dim laid out spatially.

An op over ``(i, t)`` that no recurrence over ``t`` runs through (a critic's forward pass
over a rollout's observations, the per-step backward ops of a learner) is computed once
per ``i`` on all ``T`` steps stacked, instead of ``T`` times on one step each: the op
loses ``t`` from its domain and its output gains a leading dim of size ``T``. The dim
vectorized is the program's innermost, the timestep in the RL programs, and only when
there are others (the outermost is the run itself: laying it out would hold every result
back until the run ends; PPO's middle dim, the update, gave isl's scheduler a problem it
did not finish in minutes).

An op is vectorized when

- it is a pure device op with a rule below (no merges, host ops or UDFs), its params,
  requirements and output shapes do not vary with ``t``, it runs unconditionally, and it
  is not an output of the program. A random draw is keyed by its point's coordinates (a
  host op's value at every ``t``): stacked, it draws every step's at once, one per row of
  the stacked coordinates, bit for bit the same draws (``_stacked_draws``; not where one
  step's draw is ``STACK_MIN_BYTES`` or more, or all of them ``STACKED_DRAWS_MAX_BYTES``, or it is
  drawn over a device mesh);
- no cycle within one point of the other dims runs through it (a conservative form of the
  paper's "non-trivial cycle": ``obs[t]`` depends on ``action[t-1]``, so acting stays as
  it is; the learner's cycle through the parameters runs from ``i`` to ``i + 1``);
- each input is read either at ``t`` itself ("row" reads, at least one) or at an index
  that does not use ``t`` ("invariant" reads, kept as they are);
- it is needed at every ``t`` of each point of its other dims (it then computes no
  point the program did not need).

Edges change as in the paper's Fig. 11: a vectorized op reads a vectorized source at the
index without ``t``, and a plain source at ``0:T``; a plain op reads row ``e`` of a
vectorized source through a ``take`` at ``e`` (an ``eval_symbol`` of ``e`` is its index),
a window ``a:b`` of it through a ``slice``; a full window ``0:T`` reads it directly.
Row reads whose rank is below what the op needs for broadcasting (``(B, H) + (H,)`` per
step is ``(T, B, H) + (T, 1, H)`` stacked) gain unit dims by ``unsqueeze`` ops; each
vectorized op's output type is checked against its shape rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tempo.analysis.needed import needed_at_every_step, needed_by_op
from tempo.analysis.polyhedral import Polyhedral
from tempo.errors import ShapeError
from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.ops import kinds_with, normalize_dim, param_symbols
from tempo.ir.types import TensorType
from tempo.passes.contract import (
    contracted_matmuls,
    contraction_steps,
    input_type,
    matrix_source,
    summed_reader_sum,
    sums_every_point,
    whole_window_reads,
)
from tempo.passes.rewrite import (
    add_op,
    add_with_inputs,
    recomputed_needed,
    row_index_op,
    without_unreached,
)
from tempo.symbolic.expr import TRUE, Expr, IndexEntry, Slice, Symbol, const

if TYPE_CHECKING:
    from tempo.passes import PassState

ELEMENTWISE = kinds_with("elementwise")  # ops applied entry by entry (broadcasting)
_ONE_DIM = kinds_with("along_dim")
_REDUCE = kinds_with("reduction")

@dataclass(frozen=True)
class Rule:
    """How an op is vectorized: its params, and the unit dims each row read gains after
    the leading one; ``kind`` and ``inputs`` when it becomes another op reading fewer
    inputs (a row ``t`` of a stacked value is, stacked, that value); ``broadcast``: the
    inputs read the same at every step that are expanded to the stacked shape first (a
    shared value gathered at per-step indices)."""

    params: dict[str, Any]
    pads: tuple[int, ...]
    kind: str | None = None
    inputs: int | None = None
    broadcast: tuple[int, ...] = ()


def vectorize_innermost_dim(graph: SDG, state: PassState) -> SDG:
    """``graph`` with its innermost dim vectorized where the module doc allows (when the
    program has more than one dim); ``state.needed`` is recomputed for the new graph."""
    dims = list(state.bound_of)
    if len(dims) < 2:
        state.notes.append("vectorize: a program of one dim is not vectorized")
        return graph
    dim = dims[-1]
    size = state.bounds.get(state.bound_of[dim])
    if size is None:
        state.notes.append(f"vectorize: the program does not use {dim.name}")
        return graph
    graph, count = _vectorize(graph, state, dim, size)
    state.notes.append(f"vectorize: {count} ops over {dim.name} vectorized")
    return graph


def _vectorize(graph: SDG, state: PassState, dim: Symbol, size: int) -> tuple[SDG, int]:
    chosen = _vectorizable(graph, state, dim)
    if not chosen:
        return graph, 0
    contracted = contracted_matmuls(graph, chosen, dim, size, state.bounds, state.keep,
                                    lambda e: _read_kind(e, dim) == "row")
    summed = {op.id for op in graph.ops.values() if op.kind == "sum_readers"
              and graph.in_edges(op)[0].src.id in chosen
              and sums_every_point(op, graph.in_edges(op)[0], dim, size, state.bounds)}
    out = _Rewriter(graph, dim, size, state.bounds, chosen, state.next_id,
                    contracted=contracted, summed=summed, split_rows=state.sharded is not None).rewrite()
    state.next_id = max(out.ops) + 1
    out = without_unreached(out, state.keep)
    state.needed = recomputed_needed(out, state)
    return out, len(chosen)


# ---- which ops ------------------------------------------------------------------------------
def _vectorizable(graph: SDG, state: PassState, dim: Symbol) -> dict[int, Rule]:
    """The rule of each op to vectorize over ``dim``, by op id."""
    size = state.bounds[state.bound_of[dim]]
    cyclic = _on_cycles_over(graph, dim)
    needed = needed_by_op(state.needed, graph.ops)
    poly = Polyhedral(graph, state.bounds, state.bound_of)
    consumers = graph.consumers()
    chosen: dict[int, Rule] = {}
    for op in graph.ops.values():
        if dim not in op.domain or op.id in cyclic or op.id in state.keep or op.id not in needed:
            continue
        if any(not _adaptable(e, dim) for e in consumers[op.id]):
            continue
        rule = _rule_of(op, graph.in_edges(op), dim, size, state.bounds)
        if rule is not None and needed_at_every_step(poly, op, dim, needed[op.id]):
            chosen[op.id] = rule
    return _without_large_stacks(graph, chosen, dim, size, state)


def _rule_of(op: Op, edges: list[Edge], dim: Symbol, size: int,
             bounds: dict[Symbol, int]) -> Rule | None:
    """How ``op`` is vectorized over ``dim``, if it can be (module doc)."""
    if op.kind == "sum_readers":
        return _reader_sum_rule(op, edges[0], dim, size, bounds)
    if not _pure(op, dim):
        return None
    reads = [_read_kind(e, dim) for e in edges]
    if None in reads or "row" not in reads:
        return None
    if op.kind == "rng":
        return _stacked_draws(op, edges, dim, size, bounds)
    return _row_ofstacked(op, edges, dim, size) or checked_rule(op, edges, [r == "row" for r in reads], size)


def _reader_sum_rule(op: Op, edge: Edge, dim: Symbol, size: int,
                     bounds: dict[Symbol, int]) -> Rule | None:
    """A gradient read at every step through one window of all of them (a loss's mean
    over ``x[0:T]``): stacked, the whole window at once (``whole_window_reads``)."""
    out_type = op.params["out_type"]
    if op.when is not TRUE or any(dim in cond.symbols() for cond, _ in op.requires) \
            or any(dim in d.symbols() for d in out_type.shape):
        return None
    reads = whole_window_reads(op, edge, dim, size, bounds)
    return None if reads is None else Rule({**op.params, "reads": reads,
                                            "out_type": stacked(out_type, size, 0)}, (0,))


STACK_MIN_BYTES = 1 << 16
"""A value made step by step, at least this large per step, is read stacked by vectorized
ops only where a contraction needs its rows (``_without_large_stacks``)."""
STACKED_DRAWS_MAX_BYTES = 1 << 24
"""The most bytes a random draw's steps and their coordinates may hold stacked
(``_stacked_draws``): PPO's acting noise at 512 envs x 250 steps holds 2.4 MiB."""


def _without_large_stacks(graph: SDG, chosen: dict[int, Rule], dim: Symbol, size: int,
                          state: PassState) -> dict[int, Rule]:
    """``chosen`` less the ops that would make a large value computed step by step (an
    observation, read where acting happens) wait for all ``T`` steps while no contraction
    needs its rows: stacked, those values cost ``T`` times their size, while a per-step
    reader (n-step's value of the next observation, ``critic(final_obs)``) can run where
    the value is made and pass on its small output. Repeated, since an op left step by
    step may make another large value."""
    chosen = dict(chosen)
    while True:
        contracted = contracted_matmuls(graph, chosen, dim, size, state.bounds, state.keep,
                                        lambda e: _read_kind(e, dim) == "row")
        sources = [matrix_source(graph, e)[0] for k in contracted for e in graph.in_edges(graph.ops[k])]
        rows_needed = {(read.src.id, read.src_out) for read in sources}
        dropped = {op_id for op_id in chosen for e in graph.in_edges(graph.ops[op_id])
                   if e.src.id not in chosen and _read_kind(e, dim) == "row"
                   and (e.src.id, e.src_out) not in rows_needed
                   and (e.src.outputs[e.src_out].nbytes(state.bounds) or 0) >= STACK_MIN_BYTES}
        if not dropped:
            return chosen
        for op_id in dropped:
            del chosen[op_id]


def _pure(op: Op, dim: Symbol) -> bool:
    """A device op with a rule whose params, shape and requirements do not use ``dim``."""
    return (op.kind in RULE_KINDS and op.when is TRUE
            and dim not in param_symbols(op.params)
            and not any(dim in d.symbols() for t in op.outputs for d in t.shape)
            and not any(dim in cond.symbols() for cond, _ in op.requires))


def _read_kind(edge: Edge, dim: Symbol) -> str | None:
    """``"row"``: read at ``dim`` itself, no other window; ``"invariant"``: the index does
    not use ``dim``; None: neither (a shift ``t-1``, a window ``t:T``, a condition)."""
    if edge.cond is not TRUE:
        return None
    uses = [k for k, e in enumerate(edge.phi) if dim in e.symbols()]
    if not uses:
        return "invariant"
    if dim not in edge.src.domain:
        return None
    at = edge.src.domain.index(dim)
    if uses != [at] or edge.phi[at] is not dim or edge.slices:
        return None
    if any(dim in d.symbols() for d in input_type(edge).shape):
        return None
    return "row"


def _adaptable(edge: Edge, dim: Symbol) -> bool:
    """A read of the op that a vectorized source can serve: no window of a dim after
    ``dim`` (it would come before the stacked dim) and ``dim`` used at its own place only.
    Reader sums read rows at the op's own points, which are always served."""
    if edge.sink.kind == "sum_readers":
        return True
    at = edge.src.domain.index(dim)
    return not any(isinstance(e, Slice) for e in edge.phi[at + 1:]) and not any(
        dim in e.symbols() for k, e in enumerate(edge.phi) if k != at)


def _on_cycles_over(graph: SDG, dim: Symbol) -> set[int]:
    """Ops over ``dim`` on a cycle that stacking ``dim`` could close at one point of the
    other dims: through edges between ops over ``dim``, and through ops without it
    (``e[i] <- v[i, 0]`` read back by ``g[i, t]``) unless an edge reads another dim at an
    earlier or later point (``w[i-1]``: the cycle runs across iterations, not within one)."""
    sub = SDG()
    for op in graph.ops.values():
        sub.add_op(op)
    for k, op in graph.ops.items():
        sub.inputs[k] = [e for e in graph.in_edges(op)
                         if (dim in op.domain and dim in e.src.domain) or _same_outer_point(e, dim)]
    cyclic: set[int] = set()
    for component in sub.components_consumers_first():
        ids = {op.id for op in component}
        if len(ids) > 1 or any(e.src.id in ids for e in sub.inputs[component[0].id]):
            cyclic |= {k for k in ids if dim in graph.ops[k].domain}
    return cyclic


def _same_outer_point(edge: Edge, dim: Symbol) -> bool:
    """The edge reads every dim other than ``dim`` that both ends have at the sink's point."""
    for d, entry in zip(edge.src.domain, edge.phi):
        if d is not dim and d in edge.sink.domain and not isinstance(entry, Slice):
            shift = entry - d
            if shift.is_const and shift.value != 0:
                return False
    return True


# ---- rules ----------------------------------------------------------------------------------
def _row_ofstacked(op: Op, edges: list[Edge], dim: Symbol, size: int) -> Rule | None:
    """``x[t]`` of a stacked ``x`` read the same at every step (a lifted cumsum's rows):
    stacked, it is ``x`` itself."""
    if op.kind != "take" or op.params["dim"] != 0:
        return None
    value, index = edges
    if dim in {s for e in value.phi for s in e.symbols()} or value.slices:
        return None
    if index.src.kind != "eval_symbol" or index.src.params["expr"] is not dim \
            or not index.src.params.get("in_run") or index.phi != (dim,):
        return None
    if input_type(value).shape[:1] != (const(size),):
        return None
    return Rule({}, (0,), kind="identity", inputs=1)


def _stacked_draws(op: Op, edges: list[Edge], dim: Symbol, size: int,
                   bounds: dict[Symbol, int]) -> Rule | None:
    """A draw at every step, from the coordinates of every step (a ``coords`` op's rows):
    one draw per row of them (``tempo.ir.random.sample``'s ``steps``). Coordinates keyed
    before the step's are still the same in every row (``shared``). A draw of
    ``STACK_MIN_BYTES`` or more per step, or whose draws and coordinates hold more than
    ``STACKED_DRAWS_MAX_BYTES`` over the steps, stays step by step: its readers in the loop
    take one step's draw at a time, and stacked it would be held whole. So does a draw
    over a mesh (``tempo.passes.parallel`` puts a ``shard`` of the coordinates between)."""
    (coords,) = edges
    if "steps" in op.params or coords.src.kind != "coords":  # (a shard between: draws over a mesh)
        return None
    draw, keys = op.outputs[0].nbytes(bounds), coords.src.outputs[0].nbytes(bounds)
    if draw is None or keys is None or draw >= STACK_MIN_BYTES \
            or (draw + keys) * size > STACKED_DRAWS_MAX_BYTES:
        return None
    column = coords.src.params["dims"].index(dim)
    params = {**op.params, "steps": size, "shared": min(op.params.get("shared", 0), column)}
    return Rule(params, (0,))


def checked_rule(op: Op, edges: list[Edge], rows: list[bool], size: int) -> Rule | None:
    """The op's rule, if its shape rule gives the stacked output for the stacked inputs."""
    types = [input_type(e) for e in edges]
    rule = _rule(op, types, rows, size)
    if rule is None:
        return None
    params, pads = rule.params, rule.pads
    inputs = [stacked(t, size, pads[k]) if rows[k] or k in rule.broadcast else t
              for k, t in enumerate(types)]
    try:
        outputs = op.definition.infer(*inputs, **params)
    except (ShapeError, TypeError, ValueError):
        return None
    expected = tuple(stacked(t, size, 0) for t in op.outputs)
    if len(outputs) != len(expected) or any(
            a.dtype != b.dtype or a.shape != b.shape for a, b in zip(outputs, expected)):
        return None
    return rule


def stacked(t: TensorType, size: int, pad: int) -> TensorType:
    return TensorType((const(size), *(const(1),) * pad, *t.shape), t.dtype)


def _rule(op: Op, types: list[TensorType], rows: list[bool], size: int) -> Rule | None:
    """Params and unit-dim padding of the op over stacked inputs (None: no rule): the
    op's own entry of ``RULES``, else the rule of its kind of op (``OpDef`` traits)."""
    d = op.definition
    make = RULES.get(op.kind) or (_elementwise if d.elementwise else _reduction if d.reduction
                                  else _along_dim if d.along_dim else None)
    return None if make is None else make(op, types, rows, size)


RuleMaker = Callable[[Op, list[TensorType], list[bool], int], Rule | None]
"""``(op, input types per point, which inputs are stacked rows, size) -> Rule | None``."""


def _elementwise(op: Op, types: list[TensorType], rows: list[bool], size: int) -> Rule:
    """Broadcasting: each row read gains the unit dims that line it up with the output."""
    p = op.params
    if op.kind == "identity" and "out_type" in p:
        p = {**p, "out_type": stacked(p["out_type"], size, 0)}
    out = op.outputs[0].ndim
    return Rule(p, tuple(out - t.ndim if row else 0 for t, row in zip(types, rows)))


def _matmul(op: Op, types: list[TensorType], rows: list[bool], size: int) -> Rule | None:
    ranks = [t.ndim for t in types]
    if rows == [True, False] and ranks == [1, 2]:  # vector @ matrix: (B, n) @ (n, m)
        return Rule(op.params, (0, 0))
    if any(row and r < 2 for r, row in zip(ranks, rows)):
        return None
    top = max(ranks)
    return Rule(op.params, tuple(top - r if row else 0 for r, row in zip(ranks, rows)))


def _on_stacked(params: dict[str, Any] | None, rows: list[bool]) -> Rule | None:
    """A rule whose first input is read stacked and whose other inputs are as they are."""
    return Rule(params, tuple(0 for _ in rows)) if params is not None and rows[0] else None


def _shifted(p: dict[str, Any], types: list[TensorType]) -> dict[str, Any]:
    """``p`` with its axis ``dim`` moved past the stacked one."""
    return {**p, "dim": normalize_dim(p["dim"], types[0].ndim) + 1}


def _reduction(op: Op, types: list[TensorType], rows: list[bool], size: int) -> Rule | None:
    p = op.params
    return _on_stacked({**p, "dims": tuple(normalize_dim(d, types[0].ndim) + 1 for d in p["dims"])}, rows)


def _along_dim(op: Op, types: list[TensorType], rows: list[bool], size: int) -> Rule | None:
    return _on_stacked(_shifted(op.params, types), rows)


def _take(op: Op, types: list[TensorType], rows: list[bool], size: int) -> Rule | None:
    p = op.params
    if op.kind == "take" and rows == [False, True] and types[1].ndim == 0 \
            and normalize_dim(p["dim"], types[0].ndim) == 0:  # rows of a shared table, one per step
        return Rule(p, (0, 0))
    return _on_stacked(_shifted(p, types) if rows == [True, False] else None, rows)


def _gather(op: Op, types: list[TensorType], rows: list[bool], size: int) -> Rule | None:
    """Gathered along the same axes at each step; a shared value gathered at per-step
    indices is expanded to the stacked shape first."""
    if not rows[1]:
        return None
    params = _shifted(op.params, types)
    if op.kind == "scatter_gather":
        params["shape"] = (const(size), *op.params["shape"])
    return Rule(params, (0, 0)) if rows[0] else Rule(params, (0, 0), broadcast=(0,))


def _joined(op: Op, types: list[TensorType], rows: list[bool], size: int) -> Rule | None:
    """``cat`` and ``stack`` of values that are all stacked."""
    if not all(rows):
        return None
    extra = 1 if op.kind == "stack" else 0
    return Rule({**op.params, "dim": normalize_dim(op.params["dim"], types[0].ndim + extra) + 1},
                tuple(0 for _ in rows))


def _expand(op: Op, types: list[TensorType], rows: list[bool], size: int) -> Rule | None:
    p = op.params
    rule = _on_stacked({**p, "shape": (const(size), *p["shape"])}, rows)
    return None if rule is None else Rule(rule.params, (len(p["shape"]) - types[0].ndim,))


def _layout(new_params: Callable[[dict[str, Any], int, int], dict[str, Any]]) -> RuleMaker:
    """The rule of a layout op: ``new_params(params, rank, size)`` over the stacked input."""
    return lambda op, types, rows, size: _on_stacked(new_params(op.params, types[0].ndim, size), rows)


RULES: dict[str, RuleMaker] = {
    "matmul": _matmul,
    "take": _take,
    "scatter_take": _take,
    "gather": _gather,
    "scatter_gather": _gather,
    "cat": _joined,
    "stack": _joined,
    "expand": _expand,
    "unsqueeze": _layout(lambda p, rank, size: {**p, "dim": normalize_dim(p["dim"], rank + 1) + 1}),
    "permute": _layout(lambda p, rank, size: {**p, "dims": (0, *(normalize_dim(d, rank) + 1
                                                                  for d in p["dims"]))}),
    "reshape": _layout(lambda p, rank, size: {**p, "shape": (const(size), *p["shape"])}),
}
"""The ops whose rule is their own; other ops take the rule of their kind (elementwise,
reductions, ops along one axis: ``OpDef`` traits)."""
RULE_KINDS = ELEMENTWISE | _ONE_DIM | _REDUCE | frozenset(RULES) | {"rng"}
"""Every op kind vectorize has a rule for."""


# ---- rewriting ------------------------------------------------------------------------------
@dataclass
class StackingRewriter:
    """Rebuilds a graph with the ops of ``rules`` laid out over ``dim``: every op through
    ``_new_op``, every input edge it keeps (a rule may read fewer) through ``_edge``;
    adapters added on the way get ids from ``next_id``."""

    graph: SDG
    dim: Symbol
    size: int
    bounds: dict[Symbol, int]
    rules: dict[int, Rule]
    next_id: int
    out: SDG = field(default_factory=SDG)
    ops: dict[int, Op] = field(default_factory=dict)
    """The op of each id in the new graph."""
    split_rows: bool = False
    """The values' own rows may be split over devices (``contraction_steps``)."""

    def rewrite(self) -> SDG:
        for op in self.graph.ops.values():
            self.ops[op.id] = self._new_op(op)
        for op in self.graph.ops.values():
            rule = self.rules.get(op.id)
            reads = self.graph.in_edges(op)
            edges = [self._broadcast(self._edge(e), e) for e in reads[:rule.inputs if rule else None]]
            self.out.add_op(self.ops[op.id])
            for edge in edges:
                self.out.add_edge(edge)
        return self.out

    def _new_op(self, op: Op) -> Op:
        raise NotImplementedError

    def _edge(self, edge: Edge) -> Edge:
        raise NotImplementedError

    def _add(self, op: Op, inputs: list[Edge]) -> Op:
        return add_with_inputs(self.out, op, inputs)

    def _broadcast(self, edge: Edge, original: Edge) -> Edge:
        """``edge`` expanded to the stacked shape where the sink's rule says so."""
        rule = self.rules.get(original.sink.id)
        if rule is None or original.sink_in not in rule.broadcast:
            return edge
        return self._through(edge, "expand", {"shape": (const(self.size), *input_type(edge).shape)})

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _through(self, edge: Edge, kind: str, params: dict[str, Any],
                 index: IndexEntry | None = None) -> Edge:
        """``edge`` read through a new ``kind`` op over the sink's domain."""
        sink = edge.sink
        read = Edge(sink, 0, edge.src, edge.src_out, edge.phi)
        inputs = [read]
        if index is not None:
            index_op = self._add(row_index_op(self._new_id(), index.substitute(self.bounds), sink.domain,
                                              sink.site), [])
            inputs.append(Edge(sink, 1, index_op, 0, index_op.domain))
        op = add_op(self.out, self._new_id(), kind, params, sink.domain, inputs, sink.site,
                    f"{edge.src.label or edge.src.kind}_{kind}")
        return Edge(sink, edge.sink_in, op, 0, sink.domain, edge.cond)

    def _contraction_operand(self, original: Edge) -> Edge:
        """The operand ``original`` reads of a contracted matmul, read stacked as the
        matrix whose product sums the products of every point (``tempo.passes.contract``)."""
        read, transposed = matrix_source(self.graph, original)
        edge = self._stacked_read(read)
        for kind, params in contraction_steps(input_type(original), original.sink_in, transposed,
                                              self.size, self.split_rows):
            edge = self._through(edge, kind, params)
        return edge

    def _stacked_read(self, read: Edge) -> Edge:
        """``read`` (of a source at the dim itself, in the old graph) as the new sink's
        read of every row of it, stacked first."""
        raise NotImplementedError


@dataclass
class _Rewriter(StackingRewriter):
    contracted: set[int] = field(default_factory=set)
    """Matmuls that contract over the dim (``tempo.passes.contract``)."""
    summed: set[int] = field(default_factory=set)
    """Reader sums that sum their vectorized input's stacked axis."""
    adapters: dict[tuple, Op] = field(default_factory=dict)

    def _new_op(self, op: Op) -> Op:
        if op.id in self.summed:
            (edge,) = self.graph.in_edges(op)
            return summed_reader_sum(op, self.dim, edge.src.id in self.contracted)
        return self._vectorized(op) if op.id in self.rules else op

    def _vectorized(self, op: Op) -> Op:
        rule = self.rules[op.id]
        outputs = op.outputs if op.id in self.contracted else \
            tuple(stacked(t, self.size, 0) for t in op.outputs)
        return Op(op.id, rule.kind or op.kind, rule.params, tuple(d for d in op.domain if d is not self.dim),
                  outputs, op.site, op.label, requires=op.requires)

    def _edge(self, edge: Edge) -> Edge:
        sink, src = self.ops[edge.sink.id], self.ops[edge.src.id]
        sink_vec, src_vec = edge.sink.id in self.rules, edge.src.id in self.rules
        if not src_vec:
            phi = edge.phi
            if sink_vec and _read_kind(edge, self.dim) == "row":
                at = edge.src.domain.index(self.dim)
                phi = (*phi[:at], Slice(const(0), const(self.size)), *phi[at + 1:])
                return self._stacked_row(Edge(sink, edge.sink_in, src, edge.src_out, phi), edge)
            return Edge(sink, edge.sink_in, src, edge.src_out, phi, edge.cond)
        at = edge.src.domain.index(self.dim)
        entry, rest = edge.phi[at], (*edge.phi[:at], *edge.phi[at + 1:])
        if sink_vec and entry is self.dim:
            return self._stacked_row(Edge(sink, edge.sink_in, src, edge.src_out, rest), edge)
        if edge.sink.id in self.summed:  # the stacked contributions, summed by the reader sum
            return Edge(sink, edge.sink_in, src, edge.src_out, rest, edge.cond)
        if edge.sink.kind == "sum_readers":  # it reads its input at the points its params name
            return Edge(sink, edge.sink_in, self._unstacked(edge, src), 0, edge.phi, edge.cond)
        if self._whole(entry):
            return Edge(sink, edge.sink_in, src, edge.src_out, rest, edge.cond)
        adapter = self._adapter(edge, src, rest, entry, sink.domain)
        return Edge(sink, edge.sink_in, adapter, 0, adapter.domain, edge.cond)

    def _stacked_read(self, read: Edge) -> Edge:
        at = read.src.domain.index(self.dim)
        whole = () if read.src.id in self.rules else (Slice(const(0), const(self.size)),)
        phi = (*read.phi[:at], *whole, *read.phi[at + 1:])
        return Edge(self.ops[read.sink.id], read.sink_in, self.ops[read.src.id], read.src_out, phi)

    def _whole(self, entry: IndexEntry) -> bool:
        """Whether ``entry`` is the window of every step."""
        return isinstance(entry, Slice) and self._concrete(entry.start) is const(0) and \
            self._concrete(entry.stop) is const(self.size)

    def _concrete(self, e: Expr) -> Expr:
        return e.substitute(self.bounds)

    def _stacked_row(self, edge: Edge, original: Edge) -> Edge:
        """``edge``, a row read by a vectorized op now reading every row stacked, as that
        op's rule needs it."""
        if original.sink.id in self.contracted:
            return self._contraction_operand(original)
        return self._padded(edge, original)

    def _padded(self, edge: Edge, original: Edge) -> Edge:
        """``edge`` (a row read by a vectorized op) through the unit dims its rule adds."""
        pads = self.rules[original.sink.id].pads
        t = stacked(input_type(original), self.size, 0)
        sink = edge.sink
        for _ in range(pads[original.sink_in]):
            t = TensorType((t.shape[0], const(1), *t.shape[1:]), t.dtype)
            unsqueeze = self._add(Op(self._new_id(), "unsqueeze", {"dim": 1}, sink.domain, (t,),
                                     sink.site, f"{sink.label or sink.kind}_bcast"), [edge])
            edge = Edge(sink, edge.sink_in, unsqueeze, 0, sink.domain)
        return edge

    def _adapter(self, edge: Edge, src: Op, rest: tuple[IndexEntry, ...], entry: IndexEntry,
                 sink_domain: tuple[Symbol, ...], at: int | None = None) -> Op:
        """An op over the sink's dims that ``entry``, ``rest`` use, holding the part of
        ``src``'s stacked output the sink reads (``at``: where ``dim`` was in its domain)."""
        used = set().union(*(e.symbols() for e in (*rest, entry)))
        domain = tuple(d for d in sink_domain if d in used)
        key = (src.id, edge.src_out, rest, entry, domain)
        if key in self.adapters:
            return self.adapters[key]
        at = edge.src.domain.index(self.dim) if at is None else at
        axis = sum(1 for e in rest[:at] if isinstance(e, Slice))
        read = Edge(edge.sink, 0, src, edge.src_out, rest)
        stacked = input_type(read)
        label = f"{src.label or src.kind}_row"
        if isinstance(entry, Slice):
            shape = (*stacked.shape[:axis], entry.size, *stacked.shape[axis + 1:])
            op = Op(self._new_id(), "slice", {"dim": axis, "start": entry.start, "stop": entry.stop},
                    domain, (TensorType(shape, stacked.dtype),), edge.sink.site, label)
            adapter = self._add(op, [read])
        else:
            index = self._add(row_index_op(self._new_id(), self._concrete(entry), domain,
                                           edge.sink.site), [])
            shape = (*stacked.shape[:axis], *stacked.shape[axis + 1:])
            op = Op(self._new_id(), "take", {"dim": axis}, domain,
                    (TensorType(shape, stacked.dtype),), edge.sink.site, label)
            adapter = self._add(op, [read, Edge(op, 1, index, 0, index.domain)])
        self.adapters[key] = adapter
        return adapter

    def _unstacked(self, edge: Edge, src: Op) -> Op:
        """The source's rows again, one per point of its original domain."""
        domain = edge.src.domain
        rest = tuple(d for d in domain if d is not self.dim)
        read = Edge(edge.sink, edge.sink_in, src, edge.src_out, rest)
        return self._adapter(read, src, rest, self.dim, domain, at=domain.index(self.dim))
