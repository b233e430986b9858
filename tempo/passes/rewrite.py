"""What the rewriting passes (dedup, fold, simplify) share: redirecting the reads of one op
to another, removing the ops nothing reads any more, and keeping the needed points in step.

A pass decides *what* replaces what: ``redirect`` maps an output ``(op id, out)`` to the
output ``(op, out)`` that its readers read instead, with the same domain and the same value
at every point (so every reading edge keeps its dependence ``phi`` and condition). New ops
(folded constants) are placed where the op they replace was. ``apply_rewrites`` builds the
new graph; ops that no root reaches any more are dropped, and each replaced op's needed
points are united into its replacement's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import islpy as isl
import numpy as np

from tempo.analysis.needed import needed_by_op, needed_of
from tempo.analysis.polyhedral import Polyhedral, needed_points, statement_name
from tempo.errors import SourceSite
from tempo.ir.graph import SDG, Edge, Op, program_roots
from tempo.ir.ops import op_def
from tempo.ir.types import TensorType
from tempo.passes.contract import input_type
from tempo.symbolic.expr import TRUE, Expr, Symbol

if TYPE_CHECKING:
    from tempo.passes import PassState


@dataclass
class Rewritten:
    graph: SDG
    needed: isl.UnionSet
    removed: int
    """Ops of the old graph that are not in the new one."""


def identity_read(edge: Edge) -> bool:
    """The sink at ``p`` reads the source at ``p`` itself, unconditionally, and over the same
    dims: a value of the source can stand for the sink's at every point."""
    return (edge.cond is TRUE and edge.src.domain == edge.sink.domain
            and all(e is d for e, d in zip(edge.phi, edge.sink.domain)))


def same_type(a: Op, a_out: int, b: Op, b_out: int) -> bool:
    """Output ``a_out`` of ``a`` and ``b_out`` of ``b`` have the same type (``same_types``)."""
    return same_types(a.outputs[a_out], b.outputs[b_out])


def same_types(ta: TensorType, tb: TensorType) -> bool:
    """Same dtype and, dim by dim, the same (hash-consed, so structurally equal) shape."""
    return ta.dtype == tb.dtype and len(ta.shape) == len(tb.shape) \
        and all(x is y for x, y in zip(ta.shape, tb.shape))


def apply_rewrites(graph: SDG, needed: isl.UnionSet, keep: set[int],
                   redirect: dict[tuple[int, int], tuple[Op, int]],
                   inserted: dict[int, Op] | None = None) -> Rewritten:
    """``graph`` with every read of a key of ``redirect`` reading its value instead, each op
    of ``inserted`` placed just before the op of its key, and the ops that the program's
    roots (``keep``'s ops and UDFs) do not reach removed; and the needed points of the new
    graph. Ops the roots did not reach before are left alone."""
    inserted = inserted or {}
    new = {op.id for op in inserted.values()}

    def resolve(op: Op, out: int) -> tuple[Op, int]:
        seen = 0
        while (op.id, out) in redirect:
            op, out = redirect[(op.id, out)]
            seen += 1
            if seen > len(redirect):
                raise ValueError(f"internal: redirections of {op.name} form a cycle")
        return op, out

    out = SDG()
    for op in graph.ops.values():
        if op.id in inserted:
            out.add_op(inserted[op.id])
        out.add_op(op)
        for edge in graph.in_edges(op):
            src, src_out = resolve(edge.src, edge.src_out)
            out.add_edge(edge if src is edge.src and src_out == edge.src_out else
                         Edge(op, edge.sink_in, src, src_out, edge.phi, edge.cond))
    before = _reached(graph, keep)
    after = _reached(out, keep)
    dead = {k for k in out.ops if (k in before or k in new) and k not in after}
    if dead:
        out = _without(out, dead)
    return Rewritten(out, _moved_needed(needed, out, redirect, resolve),
                     sum(1 for k in graph.ops if k not in out.ops))


def _reached(graph: SDG, keep: set[int]) -> set[int]:
    roots = program_roots(graph, [graph.ops[k] for k in sorted(keep) if k in graph.ops])
    return set(graph.reachable_from(roots).ops)


def _without(graph: SDG, dead: set[int]) -> SDG:
    """The graph without the ``dead`` ops, in the same order (nothing live reads them)."""
    out = SDG()
    for k, op in graph.ops.items():
        if k not in dead:
            out.ops[k] = op
            out.inputs[k] = list(graph.inputs[k])
    return out


def _moved_needed(needed: isl.UnionSet, graph: SDG, redirect: dict, resolve) -> isl.UnionSet:
    """``needed`` restricted to the ops of ``graph``, with the points of each replaced op
    that is gone added to those of its replacement (same domain, so the same points)."""
    by_op = needed_by_op(needed, {*graph.ops, *(k for k, _ in redirect)})
    for (k, out), _ in sorted(redirect.items(), key=lambda kv: kv[0]):
        if k in graph.ops or k not in by_op:
            continue
        target, _ = resolve(*redirect[(k, out)])
        if target.id not in graph.ops:
            continue
        points = by_op[k].set_tuple_name(statement_name(target.id))
        current = by_op.get(target.id)
        if current is not None and current.dim(isl.dim_type.set) != points.dim(isl.dim_type.set):
            raise ValueError(f"internal: op {k} replaced by {target.name}, whose domain differs")
        by_op[target.id] = points if current is None else current.union(points).coalesce()
    return needed_of(needed, by_op, graph.ops)


def without_unreached(graph: SDG, keep: set[int]) -> SDG:
    """``graph`` without the ops that the program's roots (``keep``'s ops and UDFs) do not
    reach."""
    reached = _reached(graph, keep)
    return _without(graph, {k for k in graph.ops if k not in reached})


def recomputed_needed(graph: SDG, state: PassState) -> isl.UnionSet:
    """The needed points of ``graph``, found again from its roots (for passes that change
    domains and reads too much to update them in place)."""
    roots = program_roots(graph, [graph.ops[k] for k in sorted(state.keep) if k in graph.ops])
    poly = Polyhedral(graph, state.bounds, state.bound_of)
    needed = needed_points(poly, roots, poly.all_reads())
    if needed is None:
        raise ValueError("internal: the rewritten program's needed points have no closed form")
    return needed


def add_with_inputs(graph: SDG, op: Op, inputs: list[Edge]) -> Op:
    """Add ``op`` to ``graph`` reading what ``inputs`` read (their sinks are replaced)."""
    graph.add_op(op)
    for k, edge in enumerate(inputs):
        graph.add_edge(Edge(op, k, edge.src, edge.src_out, edge.phi, edge.cond))
    return op


def add_op(graph: SDG, op_id: int, kind: str, params: dict[str, Any], domain: tuple[Symbol, ...],
           inputs: list[Edge], site: SourceSite, label: str = "") -> Op:
    """Add a new op of ``kind`` to ``graph``, reading what ``inputs`` read, with the output
    types its shape rule gives for what they read (a ``ShapeError`` where it has none)."""
    outputs = op_def(kind).infer(*(input_type(e) for e in inputs), **params)
    return add_with_inputs(graph, Op(op_id, kind, params, domain, tuple(outputs), site, label), inputs)


def row_index_op(op_id: int, entry: Expr, domain: tuple[Symbol, ...], site: SourceSite) -> Op:
    """A scalar int32 holding ``entry`` (the row of a stacked value that a point reads): a
    constant, or its value at each point in the run's own coordinates (a resumed run's
    origin does not move rows of its own values)."""
    if entry.is_const:
        return Op(op_id, "const", {"value": np.asarray(entry.value, dtype=np.int32)}, (),
                  (TensorType((), "int32"),), site, "row_index")
    return Op(op_id, "eval_symbol", {"expr": entry, "dtype": "int32", "in_run": True}, domain,
              (TensorType((), "int32"),), site, "row_index")
