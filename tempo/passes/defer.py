"""Deferred statistics: per-step backward work that does not wait for a whole rollout.

A loss that scales per-step terms by statistics of the whole rollout, such as advantages
standardized over every env and step, ``(A - mean(A)) / std(A)``, gives each step's term
(a log-probability) the cotangent

    g[b, t] = alpha * A[b, t] + beta        (alpha, beta: scalars of the whole rollout)

so the backward work of every step, and the observations it reads, would wait for the
rollout's end: memory linear in T whatever the schedule. That work is linear in the
cotangent and its results are summed over the steps, so

    sum_t L_t(alpha A[t] + beta + e[t]) = alpha sum_t L_t(A[t]) + beta sum_t L_t(1) + sum_t L_t(e[t])

where ``e`` gathers what joins the chain on the way without depending on the statistics
(an entropy bonus's cotangent). The pass rewrites the program that way: each op of the
linear chain from the cotangent to the sums over the steps is computed once per *part*
(``A``, ones, the rest), each part needs its own step only, and the statistics scale the
parts' sums where those are made. The incremental schedule can then learn ``n`` steps
behind acting with memory bounded in T, for running that chain up to three times; the
vectorized schedule keeps every step for the learner anyway, so the pass acts only where
the schedule asks for bounded memory (``PassState.bounded``).

A cotangent qualifies when it is a ``sum_readers`` op that hands each point its entry of a
value ``g`` over fewer dims (the statistics' dims, ``(i,)``) read through a window of
every point of the others, and ``g`` is, by elementwise ops, an affine function of one
per-point value ``A`` read through that same window, with scalar coefficients that vary
per point of the statistics' dims. Every op reading the chain must be linear in it
(``OpDef.linear``), and reads along it must stay at the same point of the statistics' dims;
where anything else reads it, the program is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.ops import op_def
from tempo.ir.readers import ReaderSum
from tempo.ir.types import TensorType
from tempo.passes.contract import input_type
from tempo.passes.rewrite import add_op, recomputed_needed, same_types, without_unreached
from tempo.symbolic.expr import TRUE, IndexEntry, Slice, Symbol

if TYPE_CHECKING:
    from tempo.passes import PassState

PARTS = ("value", "ones", "rest")
"""The parts of a split cotangent: the per-point value ``A`` (scaled by ``alpha`` at the
end), ones (scaled by ``beta``) and what joined the chain without the statistics."""

Term = tuple
"""A scalar of the statistics' dims: ``("const", x)``, ``("ref", op, out)`` (a value of
shape ``()``), ``("neg", t)``, ``("astype", t, dtype)`` or ``(binary kind, t, u)``."""
ZERO: Term = ("const", 0.0)
ONE: Term = ("const", 1.0)


@dataclass(frozen=True)
class Affine:
    """A value equal to ``a * X + c``, ``X`` the per-point value ``x`` read through the
    window (``x`` None: the value is the scalar ``c``, broadcast)."""

    x: tuple[Op, int] | None
    a: Term
    c: Term


@dataclass(frozen=True)
class _Candidate:
    cotangent: Op
    """The ``sum_readers`` op handing each point its entry of ``g``."""
    statistics: tuple[Symbol, ...]
    """``g``'s dims, over which the coefficients vary."""
    form: Affine


class _NotLinear(Exception):
    """The chain from a cotangent has a reader that is not linear in it."""


def defer_statistics(graph: SDG, state: PassState) -> SDG:
    """``graph`` with every qualifying cotangent split into parts (module doc), when the
    schedule asks for bounded memory; ``state.needed`` is recomputed if anything changed."""
    if not state.bounded:
        state.notes.append("defer: not applied (the schedule keeps each step for the learner)")
        return graph
    split, tried = 0, set()
    while True:
        candidate = next((c for c in _candidates(graph, state) if c.cotangent.id not in tried), None)
        if candidate is None:
            break
        tried.add(candidate.cotangent.id)
        rewritten = _Split(graph, state, candidate).rewrite()
        if rewritten is not None:  # the replaced chain goes before the next one is looked for
            graph, split = without_unreached(rewritten, state.keep), split + 1
    if split:
        state.needed = recomputed_needed(graph, state)
    state.notes.append(f"defer: {split} cotangents of whole-window statistics split into parts")
    return graph


# ---- which cotangents ----------------------------------------------------------------------
def _candidates(graph: SDG, state: PassState):
    for op in list(graph.ops.values()):
        if op.kind == "sum_readers" and op.id not in state.keep and op.when is TRUE:
            candidate = _candidate(graph, op, state)
            if candidate is not None:
                yield candidate


def _candidate(graph: SDG, op: Op, state: PassState) -> _Candidate | None:
    (edge,) = graph.in_edges(op)
    reads: ReaderSum = op.params["reads"]
    statistics = edge.src.domain
    if edge.cond is not TRUE or not set(statistics) < set(op.domain) \
            or not _same_entries(edge.phi, statistics) or reads.lead or reads.sink_cond is not TRUE \
            or reads.sink_dims != statistics or not _same_entries(reads.inverse, statistics):
        return None
    window = _window(op, reads, statistics, state)
    if window is None:
        return None
    form = _affine(graph, edge, window, op, set(statistics))
    if form is None or not _varies(form.a) and not _varies(form.c):
        return None  # no statistics to wait for (or not an affine form)
    return _Candidate(op, statistics, form)


def _window(op: Op, reads: ReaderSum, statistics: tuple[Symbol, ...], state: PassState
            ) -> tuple[IndexEntry, ...] | None:
    """The read through which the forward program read the per-point values whose
    cotangent ``op`` hands out: every point of each dim but the statistics' (each
    starting at 0), in the order of ``op``'s domain; None where ``op`` reads otherwise."""
    positions = [k for k, _ in reads.offsets]
    others = [k for k, d in enumerate(op.domain) if d not in statistics]
    if positions != others or any(not start.is_const or start.value != 0 for _, start in reads.offsets):
        return None
    return tuple(Slice(0, state.bound_of[d]) if d not in statistics else d for d in op.domain)


def _same_entries(a: tuple[IndexEntry, ...], b: tuple[IndexEntry, ...]) -> bool:
    """Entry by entry the same (hash-consed expressions; slices by their bounds)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, Slice) or isinstance(y, Slice):
            if not (isinstance(x, Slice) and isinstance(y, Slice) and x.start is y.start
                    and x.stop is y.stop and x.pad is None and y.pad is None):
                return False
        elif x is not y:
            return False
    return True


# ---- the affine form of g ------------------------------------------------------------------
def _affine(graph: SDG, edge: Edge, window: tuple[IndexEntry, ...], cotangent: Op,
            statistics: set[Symbol]) -> Affine | None:
    """``edge``'s value as an ``Affine`` of the per-point value read through ``window``;
    None where it is not one."""
    src = edge.src
    if src.domain == cotangent.domain and edge.cond is TRUE and _same_entries(edge.phi, window):
        value = src.outputs[edge.src_out]
        if not same_types(value, cotangent.outputs[0]):
            return None
        return Affine((src, edge.src_out), ONE, ZERO)
    if edge.cond is not TRUE or not set(src.domain) <= statistics or not _same_entries(edge.phi, src.domain):
        return None
    out = src.outputs[edge.src_out]
    if not _is_float(out) or edge.src_out != 0:
        return None
    if out.shape == ():
        return Affine(None, ZERO, ("ref", src, edge.src_out))
    if src.kind == "const":
        value = np.asarray(src.params["value"])
        uniform = value.size and np.all(value == value.flat[0])
        return Affine(None, ZERO, ("const", float(value.flat[0]))) if uniform else None
    inputs = [_affine(graph, e, window, cotangent, statistics) for e in graph.in_edges(src)]
    if any(f is None for f in inputs):
        return None
    return _combine(src.kind, inputs, out)


def _combine(kind: str, inputs: list[Affine], out: TensorType) -> Affine | None:
    """The affine form of an op of ``kind`` over affine inputs, when it is one."""
    if kind in ("identity", "detach") or kind in ("expand", "unsqueeze", "reshape", "squeeze") \
            and inputs[0].x is None:
        return inputs[0]
    if kind == "astype":
        f = inputs[0]
        return Affine(None, ZERO, ("astype", f.c, out.dtype)) if f.x is None else None
    if kind == "neg":
        f = inputs[0]
        return Affine(f.x, _term("neg", f.a), _term("neg", f.c))
    if kind in ("add", "sub"):
        f, g = inputs
        if f.x is not None and g.x is not None and f.x != g.x:
            return None
        return Affine(f.x or g.x, _term(kind, f.a, g.a), _term(kind, f.c, g.c))
    if kind == "mul":
        f, g = inputs
        if f.x is not None and g.x is not None:
            return None
        scale, f = (g.c, f) if g.x is None else (f.c, g)
        return Affine(f.x, _term("mul", f.a, scale), _term("mul", f.c, scale))
    if kind == "div":
        f, g = inputs
        if g.x is not None:
            return None
        return Affine(f.x, _term("div", f.a, g.c), _term("div", f.c, g.c))
    return None


def _term(kind: str, *args: Term) -> Term:
    """A term, simplified where an argument is 0 or 1 (constants are folded)."""
    if all(a[0] == "const" for a in args):
        values = [a[1] for a in args]
        fn = {"neg": lambda x: -x, "add": lambda x, y: x + y, "sub": lambda x, y: x - y,
              "mul": lambda x, y: x * y, "div": lambda x, y: x / y if y else None}[kind]
        value = fn(*values)
        if value is not None:
            return ("const", value)
    if kind == "neg":
        return (kind, *args)
    a, b = args
    if kind == "add" and a == ZERO or kind == "mul" and a == ONE:
        return b
    if kind in ("add", "sub") and b == ZERO or kind in ("mul", "div") and b == ONE:
        return a
    if kind == "mul" and (a == ZERO or b == ZERO) or kind == "div" and a == ZERO:
        return ZERO
    if kind == "sub" and a == ZERO:
        return ("neg", b)
    return (kind, a, b)


def _varies(term: Term) -> bool:
    """Whether ``term`` reads a value computed per point (not only constants)."""
    if term[0] == "const":
        return False
    if term[0] == "ref":
        return bool(term[1].domain)
    return any(_varies(t) for t in term[1:] if isinstance(t, tuple))


# ---- the rewrite ---------------------------------------------------------------------------
class _Split:
    """Splits one cotangent's chain into parts (module doc)."""

    def __init__(self, graph: SDG, state: PassState, candidate: _Candidate):
        self.graph, self.state, self.candidate = graph, state, candidate
        self.statistics = set(candidate.statistics)
        self.out = SDG(dict(graph.ops), {k: list(v) for k, v in graph.inputs.items()})
        self.parts: dict[int, dict[str, Op]] = {}
        self.terms: dict[Term, Op] = {}

    def rewrite(self) -> SDG | None:
        """The new graph, or None where the chain has a reader that is not linear in it."""
        found = self._chain()
        if found is None:
            return None
        chain, ends = found
        try:
            cotangent = self.candidate.cotangent
            self.parts[cotangent.id] = self._cotangent_parts()
            for op in chain:
                if op is not cotangent:
                    self.parts[op.id] = self._copies(op)
            replaced = {op.id: self._combined(op, self._copies(op)) for op in ends}
        except _NotLinear:
            return None
        for k, edges in self.out.inputs.items():  # the ends' readers read their combinations
            self.out.inputs[k] = [Edge(e.sink, e.sink_in, replaced[e.src.id], 0, e.phi, e.cond)
                                  if e.src.id in replaced else e for e in edges]
        for end in ends:  # an output keeps its id, points and type: an identity in its place
            if end.id in self.state.keep:
                kept = replace(end, kind="identity", params={})
                self.out.ops[end.id] = kept
                self.out.inputs[end.id] = [Edge(kept, 0, replaced[end.id], 0, end.domain, TRUE)]
        return self.out

    def _chain(self) -> tuple[list[Op], list[Op]] | None:
        """The ops the cotangent's chain runs through (sources first) and the ops over the
        statistics' dims that end it; None where a reader leaves those dims."""
        consumers = self.graph.consumers()
        start = self.candidate.cotangent
        chain, ends, seen, stack = {start.id: start}, {}, {start.id}, [start]
        while stack:
            op = stack.pop()
            for e in consumers[op.id]:
                sink = e.sink
                if not self._keeps_point(e):
                    return None
                if sink.id in seen:
                    continue
                seen.add(sink.id)
                if sink.domain == self.candidate.statistics:
                    ends[sink.id] = sink
                elif self.statistics < set(sink.domain) and sink.id not in self.state.keep:
                    chain[sink.id] = sink
                    stack.append(sink)
                else:
                    return None
        return _sources_first(self.graph, chain), list(ends.values())

    def _keeps_point(self, edge: Edge) -> bool:
        """``edge`` reads at the sink's own point of the statistics' dims."""
        entries = [(d, edge.phi[k]) for k, d in enumerate(edge.src.domain) if d in self.statistics]
        if edge.sink.kind == "sum_readers":
            reads: ReaderSum = edge.sink.params["reads"]
            entries += [(d, reads.inverse[k]) for k, d in enumerate(reads.sink_dims) if d in self.statistics]
        return all(entry is d for d, entry in entries)

    def _cotangent_parts(self) -> dict[str, Op]:
        """The cotangent's parts: the per-point value itself, and ones."""
        cotangent, form = self.candidate.cotangent, self.candidate.form
        out = cotangent.outputs[0]
        if not all(d.is_const for d in out.shape):
            raise _NotLinear
        parts = {"ones": self._const(np.ones([d.value for d in out.shape], out.dtype), cotangent)}
        if form.x is not None:
            x, x_out = form.x
            if x_out != 0:
                raise _NotLinear
            parts["value"] = x
        return parts

    def _copies(self, op: Op) -> dict[str, Op]:
        """``op`` once per part its chain inputs have (and for the rest where an input
        that the op adds comes from outside the chain)."""
        edges = self.graph.in_edges(op)
        roles = _roles(op, edges, self.parts)
        if roles is None:
            raise _NotLinear
        copies = {}
        for part in PARTS:
            has = any(part in self.parts.get(e.src.id, {}) for e in edges)
            if not has and not (part == "rest" and any(r == "sum" and e.src.id not in self.parts
                                                       for e, r in zip(edges, roles))):
                continue
            inputs = [self._input(e, role, part) for e, role in zip(edges, roles)]
            copies[part] = self._add(replace(op, id=self._next_id()), inputs, op.outputs[0])
        return copies

    def _input(self, edge: Edge, role: str, part: str) -> Edge:
        """What the copy of ``edge``'s sink for ``part`` reads in its place."""
        parts = self.parts.get(edge.src.id)
        if parts is None:
            return edge if role == "fixed" or part == "rest" else self._zeros(edge)
        if part not in parts:
            return self._zeros(edge)
        source = parts[part]
        return Edge(edge.sink, edge.sink_in, source, 0, edge.phi if source.domain else (), edge.cond)

    def _zeros(self, edge: Edge) -> Edge:
        read = input_type(edge)
        if not all(d.is_const for d in read.shape):
            raise _NotLinear
        zeros = self._const(np.zeros([d.value for d in read.shape], read.dtype), edge.sink)
        return Edge(edge.sink, edge.sink_in, zeros, 0, (), TRUE)

    def _combined(self, end: Op, copies: dict[str, Op]) -> Op:
        """``alpha * end(value part) + beta * end(ones part) + end(rest)``, over ``end``'s
        domain (the statistics')."""
        form = self.candidate.form
        terms = []
        for part, scale in (("value", form.a), ("ones", form.c)):
            if part in copies and scale != ZERO:
                terms.append(self._op("mul", {}, [copies[part], self._scalar(scale, end)], end))
        if "rest" in copies:
            terms.append(copies["rest"])
        if not terms:
            raise _NotLinear
        total = terms[0]
        for term in terms[1:]:
            total = self._op("add", {}, [total, term], end)
        if not same_types(total.outputs[0], end.outputs[0]):
            raise _NotLinear
        return total

    def _scalar(self, term: Term, at: Op) -> Op:
        """An op computing ``term`` over ``at``'s domain (the statistics')."""
        if term in self.terms:
            return self.terms[term]
        kind = term[0]
        if kind == "const":
            op = self._const(np.asarray(term[1], at.outputs[0].dtype), at)
        elif kind == "ref":
            op = term[1]
        elif kind == "astype":
            inner = self._scalar(term[1], at)
            op = self._op("astype", {"dtype": term[2]}, [inner], at)
        else:
            op = self._op(kind, {}, [self._scalar(t, at) for t in term[1:]], at)
        self.terms[term] = op
        return op

    def _op(self, kind: str, params: dict, inputs: list[Op], at: Op) -> Op:
        """A new op over ``at``'s domain reading ``inputs`` at its points."""
        edges = [Edge(at, k, i, 0, i.domain, TRUE) for k, i in enumerate(inputs)]
        return add_op(self.out, self._next_id(), kind, params, at.domain, edges, at.site, "deferred")

    def _const(self, value: np.ndarray, at: Op) -> Op:
        op = Op(self._next_id(), "const", {"value": value}, (), (TensorType(value.shape, value.dtype.name),),
                at.site, "deferred")
        self.out.add_op(op)
        return op

    def _add(self, op: Op, inputs: list[Edge], expected: TensorType) -> Op:
        """Add ``op`` reading ``inputs`` (sinks replaced), checking its type against ``expected``."""
        (inferred,) = op_def(op.kind).infer(*(input_type(e) for e in inputs), **op.params)
        if not same_types(inferred, expected):
            raise _NotLinear
        self.out.add_op(op)
        for k, e in enumerate(inputs):
            self.out.add_edge(Edge(op, k, e.src, e.src_out, e.phi, e.cond))
        return op

    def _next_id(self) -> int:
        self.state.next_id += 1
        return self.state.next_id - 1


def _is_float(t: TensorType) -> bool:
    return np.dtype(t.dtype).kind == "f"


def _roles(op: Op, edges: list[Edge], parts: dict[int, dict]) -> list[str] | None:
    """How ``op`` is linear in its chain inputs (``OpDef.linear``, ``additive``): per
    input, ``"linear"`` (from the chain), ``"sum"`` (a term of a sum: from the chain, or
    from outside into the rest only) or ``"fixed"`` (from outside, the same in every part);
    None where it is not linear in them."""
    d = op.definition
    chain = {k for k, e in enumerate(edges) if e.src.id in parts}
    if any(e.src_out != 0 for e in edges if e.src.id in parts) or not chain <= set(d.linear) \
            or not _is_float(op.outputs[0]):
        return None
    if d.additive:
        return ["sum" if k in d.linear else "fixed" for k in range(len(edges))]
    return ["linear" if k in chain else "fixed" for k in range(len(edges))] if len(chain) == 1 else None


def _sources_first(graph: SDG, ops: dict[int, Op]) -> list[Op]:
    """``ops`` ordered so that each comes after the ones among them it reads."""
    order: list[Op] = []
    placed: set[int] = set()
    pending = sorted(ops)
    while pending:
        ready = [k for k in pending if all(e.src.id in placed or e.src.id not in ops
                                           for e in graph.in_edges(ops[k]))]
        if not ready:
            raise ValueError("internal: the cotangent's chain has a cycle")
        order += [ops[k] for k in ready]
        placed.update(ready)
        pending = [k for k in pending if k not in placed]
    return order
