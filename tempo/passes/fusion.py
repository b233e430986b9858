"""Fusion of pointwise islands.

Ops that run at exactly the same points and read each other at the same point (``x[i, t]``
by ``y[i, t]``) become one ``fused`` op, whose kernel runs the members in order. Values
used only inside the island are never stored; the scheduler sees one statement instead
of many (isl's scheduling and AST generation grow faster than linearly with statements),
and on JAX the island is one jitted XLA computation instead of one dispatch per op.

An island must not be left and re-entered (``a -> sum over t -> b`` with ``a`` and ``b``
fused would make every point wait for itself), so islands grow only while the graph of
islands stays acyclic; reads of strictly earlier points by placeholders (``h[t-1]``), and
of a placeholder's strictly later points (``a[t+1]``), do not count as edges of that graph:
they are the recurrences that fusion must keep. An island may read its own earlier points
(``h[t-1]``, or a slice that ends before the point, ``k[0:t]``, ``tempo.passes.newest``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import islpy as isl
import numpy as np

from tempo.analysis.needed import needed_by_op
from tempo.analysis.polyhedral import statement_name, union_of
from tempo.ir.graph import SDG, Edge, Op, has_static_shapes
from tempo.ir.ops import param_symbols, register, resolve_params
from tempo.symbolic.expr import TRUE, Slice, Symbol, linear_form


@dataclass(frozen=True)
class Member:
    """One op of an island: its kind, its params (bounds resolved), and where each input
    comes from: ``("in", k)`` the fused op's input ``k``, ``("op", m, out)`` output ``out``
    of the island's member ``m``, ``("const", value)`` a constant folded in."""

    kind: str
    params: dict[str, Any]
    args: tuple[tuple, ...]
    multi: bool
    kernel: Callable[..., Any]


def _run_members(xp: Any, p: dict, *inputs: Any) -> tuple:
    values: list[tuple] = []
    for member in p["members"]:
        xs = [inputs[a[1]] if a[0] == "in" else a[1] if a[0] == "const" else values[a[1]][a[2]]
              for a in member.args]
        out = member.kernel(xp, member.params, *xs)
        values.append(out if member.multi else (out,))
    return tuple(values[m][k] for m, k in p["exports"])


def _no_inference(*_: Any, **__: Any) -> tuple:
    raise TypeError("fused ops are made by the fusion pass, not by shape inference")


register("fused", _no_inference, _run_members, multi_output=True)


@dataclass
class FusionResult:
    graph: SDG
    needed: isl.UnionSet
    islands: int
    fused_ops: int
    renamed: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """Outputs of ``keep`` ops fused into a fused op: ``(op, out) -> (fused op, out)``."""
    siblings: int = 0
    """Sibling islands joined (``_merge_siblings``)."""


def fuse_pointwise(graph: SDG, needed: isl.UnionSet, bounds: dict[Symbol, int],
                   keep: set[int], first_id: int, siblings: bool = True) -> FusionResult:
    """``graph`` with its pointwise islands fused, and the needed points of the new graph.

    ``needed`` are the unfused graph's needed points (``statement_name``); ops in
    ``keep`` (outputs, whose stores are read at the end) may join an island, whose fused
    op then exports their values (``FusionResult.renamed``); fused ops get ids from
    ``first_id`` on. ``siblings``: islands at the same points that read a common producer
    are joined too (``_merge_siblings``).
    """
    by_op = {k: points.reset_tuple_id() for k, points in needed_by_op(needed, graph.ops).items()}
    order = _topological_order(graph)
    if order is None:
        return FusionResult(graph, needed, 0, 0)
    eligible = {op.id for op in graph.ops.values()
                if op.id in by_op and fusable(op, graph.in_edges(op), bounds)}
    islands = _Islands(graph, order)
    for op in order:
        for edge in graph.in_edges(op):
            if _same_point(edge) and edge.src.id in eligible and op.id in eligible \
                    and by_op[edge.src.id].is_equal(by_op[op.id]):
                islands.merge_if_acyclic(edge.src.id, op.id)
    joined = _merge_siblings(islands, order, eligible, by_op) if siblings else 0
    groups = [g for g in islands.groups() if len(g) > 1 or (
        g[0] in eligible and any(_is_constant(e.src) for e in graph.in_edges(graph.ops[g[0]])))]
    if not groups:
        return FusionResult(graph, needed, 0, 0)
    fused, new_needed, exports = _rebuild(graph, groups, order, by_op, bounds, first_id, keep)
    renamed = {(op_id, k): exports[(op_id, k)] for op_id in keep if op_id in graph.ops
               for k in range(len(graph.ops[op_id].outputs)) if (op_id, k) in exports}
    return FusionResult(fused, new_needed, len(groups), sum(len(g) for g in groups), renamed, joined)


def _merge_siblings(islands: _Islands, order: list[Op], eligible: set[int], by_op: dict[int, isl.Set]) -> int:
    """Join sibling islands, and say how many joined: islands at the same points that
    read a common producer over some dim (``obs[i, 0:T]`` read by a value head and by a
    statistic) and not each other become one, where the graph of islands stays acyclic.
    Unjoined, each is a kernel of its own: on JAX an XLA program to compile and dispatch.
    Only ``_Islands.plain`` islands join.

    The graph of islands leaves out the reads that close recurrences, which cannot make a
    point wait for itself through same-point reads, but can through a sibling that reads
    a whole rollout. A recurrence's own step never joins (``plain``); should another
    such chain remain, the program has no schedule and the compiler schedules it again
    without joined siblings (``PassState.siblings``)."""
    graph = islands.graph
    readers: dict[int, dict[int, int]] = {}  # producer island -> one op per reader island
    for op in order:
        own = islands.find(op.id)
        if op.id in eligible:
            for edge in graph.in_edges(op):
                src = islands.find(edge.src.id)
                if src != own and edge.src.domain and not _is_constant(edge.src):
                    readers.setdefault(src, {}).setdefault(own, op.id)
    joined = 0
    for by_island in readers.values():
        ops = list(by_island.values())
        for a, b in zip(ops, ops[1:]):
            if graph.ops[a].domain == graph.ops[b].domain and by_op[a].is_equal(by_op[b]) \
                    and islands.plain(a, eligible) and islands.plain(b, eligible) \
                    and not islands.read_between(a, b):
                joined += islands.merge_if_acyclic(a, b)
    return joined


# ---- which ops and edges ------------------------------------------------------------------
def fusable(op: Op, edges: list[Edge], bounds: dict[Symbol, int]) -> bool:
    """Device ops with one shape and one set of params at every point."""
    d = op.definition
    return (not d.host and d.kernel is not None and op.kind != "fused" and op.when is TRUE
            and not (param_symbols(op.params) & set(op.domain))
            and has_static_shapes(op, edges, set(bounds), tiled=True))


def _same_point(edge: Edge) -> bool:
    """The sink at ``p`` reads the source at ``p`` itself."""
    return (edge.cond is TRUE and edge.src.domain == edge.sink.domain
            and all(e is d for e, d in zip(edge.phi, edge.sink.domain)))


def _shift(edge: Edge) -> int:
    """-1 if the sink at ``p`` reads one source point lexicographically before ``p`` (``t-1``,
    or ``[i-1, T-1]``), +1 if one after it (``t+1``), over dims shared in order; else 0."""
    for k, (dim, entry) in enumerate(zip(edge.src.domain, edge.phi)):
        if isinstance(entry, Slice) or k >= len(edge.sink.domain) or edge.sink.domain[k] is not dim:
            return 0
        if entry is not dim:
            form = linear_form(entry - dim)
            if form is None or form[0] or form[1] == 0:
                return 0
            return -1 if form[1] < 0 else 1
    return 0


def _strictly_earlier(edge: Edge) -> bool:
    """The sink at ``p`` reads source points before ``p`` only: one (``h[t-1]``), or a
    slice of the innermost dim that ends before it (``k[0:t]``) at ``p``'s other dims."""
    offset = edge.stop_offset
    return _shift(edge) < 0 or (offset is not None and offset <= 0)


FOLDED_CONSTANT_BYTES = 1 << 16
"""Constants up to this size are folded into the fused kernels reading them. XLA embeds
a folded constant in the compiled program, where a large one costs on every call (a
16 MiB table: 2.9 ms a call instead of 0.06 ms as an input); larger ones come in as
inputs, stored once per run."""


def _is_constant(op: Op) -> bool:
    return (op.kind == "const" and not op.domain
            and np.asarray(op.params["value"]).nbytes <= FOLDED_CONSTANT_BYTES)


def _dag_edges(graph: SDG) -> Iterable[tuple[int, int]]:
    """Producer -> consumer, leaving out the edges that close recurrences: placeholder
    branches that read earlier points (``s[t+1] = s + x``) and reads of a placeholder's
    later points (GAE's ``a[t] = d + c * a[t+1]``). They link different points, so they
    cannot make a point wait for itself."""
    for edge in graph.edges():
        if not _closes_recurrence(edge):
            yield edge.src.id, edge.sink.id


def _closes_recurrence(edge: Edge) -> bool:
    """A placeholder branch that reads an earlier point (``s[t+1] = s + x``), or a read of a
    placeholder's later point (GAE's ``a[t] = d + c * a[t+1]``)."""
    return (edge.sink.kind == "merge" and _shift(edge) < 0) or (edge.src.kind == "merge" and _shift(edge) > 0)


def _topological_order(graph: SDG) -> list[Op] | None:
    """Ops in dependence order (without recurrence edges), or None if that has a cycle."""
    succ: dict[int, set[int]] = {k: set() for k in graph.ops}
    indegree = dict.fromkeys(graph.ops, 0)
    for a, b in _dag_edges(graph):
        if b not in succ[a]:
            succ[a].add(b)
            indegree[b] += 1
    ready = [k for k in graph.ops if indegree[k] == 0]
    order: list[Op] = []
    while ready:
        k = ready.pop()
        order.append(graph.ops[k])
        for b in sorted(succ[k]):
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    return order if len(order) == len(graph.ops) else None


class _Islands:
    """Union-find over ops, with the graph of islands kept acyclic."""

    def __init__(self, graph: SDG, order: list[Op]):
        self.graph = graph
        self.consumers = graph.consumers()
        self.parent = {op.id: op.id for op in order}
        self.members = {op.id: [op.id] for op in order}
        self.succ: dict[int, set[int]] = {op.id: set() for op in order}
        self.pred: dict[int, set[int]] = {op.id: set() for op in order}
        for a, b in _dag_edges(graph):
            if a != b:
                self.succ[a].add(b)
                self.pred[b].add(a)

    def find(self, k: int) -> int:
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def merge_if_acyclic(self, a: int, b: int) -> bool:
        """Join the islands of ``a`` and ``b`` where that keeps the graph acyclic; whether
        they were joined."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb or not self._reads_between_ok(ra, rb) \
                or self._reaches_indirectly(ra, rb) or self._reaches_indirectly(rb, ra):
            return False
        self.parent[rb] = ra
        self.members[ra] += self.members.pop(rb)
        for other in self.succ.pop(rb):
            self.pred[other].discard(rb)
            if other != ra:
                self.succ[ra].add(other)
                self.pred[other].add(ra)
        for other in self.pred.pop(rb):
            self.succ[other].discard(rb)
            if other != ra:
                self.pred[ra].add(other)
                self.succ[other].add(ra)
        self.succ[ra].discard(ra)
        self.pred[ra].discard(ra)
        return True

    def plain(self, op_id: int, eligible: set[int]) -> bool:
        """The island of ``op_id`` holds eligible ops only, reads no padded tiles, reads
        none of its own points but the point itself, and is no recurrence's step (it
        neither feeds a placeholder's later point nor reads a placeholder's later one)."""
        members = set(self.members[self.find(op_id)])
        return all(m in eligible for m in members) and not any(
            edge.tiled or edge.src.id in members and not _same_point(edge) for m in members
            for edge in self.graph.inputs[m]) and not any(
            _closes_recurrence(edge) for m in members for edge in (*self.graph.inputs[m], *self.consumers[m]))

    def read_between(self, a: int, b: int) -> bool:
        """Whether an op of either island reads one of the other."""
        ma, mb = set(self.members[self.find(a)]), set(self.members[self.find(b)])
        return any(edge.src.id in (mb if m in ma else ma) for m in ma | mb for edge in self.graph.inputs[m])

    def _reads_between_ok(self, a: int, b: int) -> bool:
        """Every read between the two islands is of the same point or an earlier one (a
        fused op may read its own earlier points, never its current or later ones)."""
        for x, y in ((a, b), (b, a)):
            ys = set(self.members[y])
            for op_id in self.members[x]:
                for edge in self.graph.inputs[op_id]:
                    if edge.src.id in ys and not (_same_point(edge) or _strictly_earlier(edge)):
                        return False
        return True

    def _reaches_indirectly(self, a: int, b: int) -> bool:
        """A path from island ``a`` to island ``b`` through some other island."""
        stack = [s for s in self.succ[a] if s != b]
        seen = set(stack)
        while stack:
            k = stack.pop()
            if k == b:
                return True
            for s in self.succ[k]:
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return False

    def groups(self) -> list[list[int]]:
        return list(self.members.values())


# ---- building the fused graph -----------------------------------------------------------
def _rebuild(graph: SDG, groups: list[list[int]], order: list[Op], by_op: dict[int, isl.Set],
             bounds: dict[Symbol, int], first_id: int, keep: set[int]
             ) -> tuple[SDG, isl.UnionSet, dict[tuple[int, int], tuple[int, int]]]:
    """The fused graph, its needed points, and where each exported value went: ``(op,
    out) -> (fused op id, fused out)``."""
    position = {op.id: k for k, op in enumerate(order)}
    island_of: dict[int, int] = {}
    for k, group in enumerate(groups):
        for op_id in group:
            island_of[op_id] = k
    consumers = graph.consumers()
    fused_ops: list[Op] = []
    exports: dict[tuple[int, int], tuple[int, int]] = {}  # (op, out) -> (island, fused out)
    in_edges: list[list[tuple]] = []
    for k, group in enumerate(groups):
        members = sorted((graph.ops[i] for i in group), key=lambda op: position[op.id])
        op, inputs, exported = _fuse(graph, members, consumers, island_of, k, bounds, first_id + k, keep)
        fused_ops.append(op)
        in_edges.append(inputs)
        for j, key in enumerate(exported):
            exports[key] = (k, j)

    def source(op: Op, out: int) -> tuple[Op, int]:
        if (op.id, out) in exports:
            k, j = exports[(op.id, out)]
            return fused_ops[k], j
        return op, out

    out = SDG()
    placed: set[int] = set()
    folded = {op.id for op in graph.ops.values()
              if _is_constant(op) and op.id not in keep and consumers[op.id]
              and all(e.sink.id in island_of for e in consumers[op.id])}
    for op in graph.ops.values():
        k = island_of.get(op.id)
        if op.id in folded:
            continue
        if k is None:
            out.add_op(op)
            for edge in graph.in_edges(op):
                src, src_out = source(edge.src, edge.src_out)
                out.add_edge(Edge(op, edge.sink_in, src, src_out, edge.phi, edge.cond))
        elif k not in placed:
            placed.add(k)
            fused = out.add_op(fused_ops[k])
            for n, (src, src_out, phi) in enumerate(in_edges[k]):
                src, src_out = source(src, src_out)
                out.add_edge(Edge(fused, n, src, src_out, phi))
    by_op = {k: points for k, points in by_op.items() if k not in folded}
    renamed = {key: (fused_ops[k].id, j) for key, (k, j) in exports.items()}
    return out, _renamed_needed(by_op, island_of, fused_ops), renamed


def _fuse(graph: SDG, members: list[Op], consumers: dict[int, list[Edge]],
          island_of: dict[int, int], island: int, bounds: dict[Symbol, int], op_id: int,
          keep: set[int]):
    """The fused op of one island, its external inputs ``(src, src_out, phi)``, and the
    ``(op, out)`` values it exports (read outside the island, or a ``keep`` op's), in
    output order."""
    index = {op.id: m for m, op in enumerate(members)}
    inputs: list[tuple] = []
    input_index: dict[tuple, int] = {}
    described = []
    for op in members:
        args = []
        for edge in graph.in_edges(op):
            if edge.src.id in index and _same_point(edge):
                args.append(("op", index[edge.src.id], edge.src_out))
                continue
            if _is_constant(edge.src):
                args.append(("const", edge.src.params["value"]))
                continue
            key = (edge.src.id, edge.src_out, repr(edge.phi))
            if edge.tiled:  # its own input: its reader may want it laid out (tempo.passes.layout)
                key = (*key, op.id, edge.sink_in)
            if key not in input_index:
                input_index[key] = len(inputs)
                inputs.append((edge.src, edge.src_out, edge.phi))
            args.append(("in", input_index[key]))
        described.append(Member(op.kind, resolve_params(op.params, bounds), tuple(args),
                                op.definition.multi_output, op.definition.kernel))
    exported = [(op.id, k) for op in members for k in range(len(op.outputs))
                if op.id in keep or any(not (island_of.get(e.sink.id) == island and _same_point(e))
                                        for e in consumers[op.id] if e.src_out == k)]
    exports = tuple((index[i], k) for i, k in exported)
    outputs = tuple(graph.ops[i].outputs[k] for i, k in exported)
    kinds = [op.label or op.kind for op in members]
    label = "fused(" + ",".join(kinds[:3]) + (",..." if len(kinds) > 3 else "") + ")"
    op = Op(op_id, "fused", {"members": tuple(described), "exports": exports},
            members[0].domain, outputs, members[-1].site, label)
    return op, inputs, exported


def _renamed_needed(by_op: dict[int, isl.Set], island_of: dict[int, int],
                    fused_ops: list[Op]) -> isl.UnionSet:
    pieces = []
    for op_id, points in by_op.items():
        k = island_of.get(op_id)
        name = statement_name(op_id if k is None else fused_ops[k].id)
        pieces.append(isl.UnionSet.from_set(points.set_tuple_name(name)))
    return union_of(pieces).coalesce()

