"""Constant folding.

A pure device op whose inputs are all constants (``const`` ops, which have no domain), and
whose params do not vary with the point, has one value at every point of its domain. It is
computed once, at compile time, with its NumPy kernel (the reference evaluator's), and a
``const`` op holding the value takes its place, over the same domain (so its readers keep
their dependences; over no dims, it is an ordinary constant that fusion folds into kernels).
Folding repeats until nothing changes, so chains of constant arithmetic fold whole (autodiff
writes ``b ** (b - 1)``, ``1.0 - 0.0``, ``gamma ** arange(n)`` and broadcast zeros).

Only small results are folded (at most ``MAX_ELEMENTS``), so that a broadcast or an outer
product of constants does not become a large array held for the whole run. Host ops (point
coordinates, symbol values, UDFs), placeholders, reader sums, outputs of the program and ops whose
kernel disagrees with their declared type are left alone.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from tempo.ir.graph import SDG, Op, has_static_shapes
from tempo.ir.ops import param_symbols, resolve_params
from tempo.passes.rewrite import apply_rewrites
from tempo.symbolic.expr import TRUE

if TYPE_CHECKING:
    from tempo.passes import PassState

MAX_ELEMENTS = 4096


def fold_constants(graph: SDG, state: PassState) -> SDG:
    """``graph`` with its constant ops computed (``state`` is the pipeline's ``PassState``)."""
    values: dict[int, np.ndarray] = {op.id: op.params["value"] for op in graph.ops.values()
                                      if _is_constant(op)}
    folded: dict[int, Op] = {}
    changed = True
    while changed:
        changed = False
        for op in graph.ops.values():
            if op.id in values or not _foldable(op, graph, state):
                continue
            value = _evaluate(op, graph, values, state.bounds)
            if value is None:
                continue
            values[op.id] = value
            folded[op.id] = Op(state.next_id, "const", {"value": value}, op.domain, op.outputs,
                               op.site, "const")
            state.next_id += 1
            changed = True
    if not folded:
        state.notes.append("fold: 0 ops folded")
        return graph
    redirect = {(k, 0): (new, 0) for k, new in folded.items()}
    # A folded op that reads another folded op goes with it: only the outermost folded ops
    # of a constant expression are read by the rest of the program.
    result = apply_rewrites(graph, state.needed, state.keep, redirect, folded)
    state.needed = result.needed
    kept = sum(1 for new in folded.values() if new.id in result.graph.ops)
    state.notes.append(f"fold: {len(folded)} ops folded into {kept} constants"
                       + f" ({result.removed} ops removed)")
    return result.graph


def _is_constant(op: Op) -> bool:
    return op.kind == "const" and not op.domain


def _foldable(op: Op, graph: SDG, state: PassState) -> bool:
    d = op.definition
    if (op.kind == "const" or not d.pure or d.conditional_inputs or d.host or d.multi_output
            or d.kernel is None or op.id in state.keep or op.when is not TRUE or len(op.outputs) != 1):
        return False
    edges = graph.in_edges(op)
    if any(e.cond is not TRUE or e.phi for e in edges):
        return False  # every input a constant: no domain, so no dependence
    if param_symbols(op.params) & set(op.domain) or not has_static_shapes(op, edges, set(state.bounds)):
        return False
    size = 1
    for dim in op.outputs[0].shape:
        size *= int(dim.evaluate(state.bounds))
    return size <= MAX_ELEMENTS


def _evaluate(op: Op, graph: SDG, values: dict[int, np.ndarray], bounds: dict) -> np.ndarray | None:
    """The op's value, or None when an input is not a (known) constant or the kernel fails
    or disagrees with the op's type."""
    inputs = []
    for edge in graph.in_edges(op):
        value = values.get(edge.src.id)
        if value is None:
            return None
        inputs.append(value)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            value = np.asarray(op.definition.kernel(np, resolve_params(op.params, bounds), *inputs))
    except Exception:  # noqa: BLE001 - a kernel error at run time is the program's, not ours
        return None
    t = op.outputs[0]
    shape = tuple(int(d.evaluate(bounds)) for d in t.shape)
    if value.shape != shape or value.dtype != np.dtype(t.dtype):
        return None
    return np.array(value, copy=True)  # not a view of another constant
