"""Algebraic simplification: ops that return their operand unchanged are removed.

An op ``y`` is replaced by its operand ``x`` when ``y`` reads ``x`` at the same point,
unconditionally, over the same dims, and has exactly ``x``'s dtype and (symbolic) shape, so
nothing is lost to broadcasting or promotion. Then ``y``'s readers read ``x``. Patterns:

- ``x * 1``, ``1 * x``, ``x / 1``, ``x ** 1``, ``x + 0``, ``0 + x``, ``x - 0`` (the ``1``
  and ``0`` constants with every element equal to it; like XLA, ``x + 0`` is ``x`` also
  for ``x = -0.0``, whose sign the addition would have dropped);
- ``-(-x)``; ``astype`` to ``x``'s dtype; ``expand`` to ``x``'s shape; reductions over
  no dims or over dims of size 1 (keeping them); ``detach`` (gradients are already built);
- reshape-like chains (``reshape``, ``squeeze``, ``unsqueeze``) that end in ``x``'s shape,
  ``x.reshape(x.shape)`` included; permutations that compose to the identity (one that is
  the identity, or a transpose of a transpose);
- ``where(c, x, x)``.

Replacements repeat until nothing changes (``(x * 1).astype(x.dtype)`` is ``x``); ops left
unread go (the ``1`` of ``x * 1``). Outputs of the program are never replaced.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.ops import kinds_with
from tempo.passes.rewrite import apply_rewrites, identity_read, same_type
from tempo.symbolic.expr import TRUE

if TYPE_CHECKING:
    from tempo.passes import PassState

Value = tuple[Op, int]
_RESHAPES = frozenset({"reshape", "squeeze", "unsqueeze"})
_REDUCTIONS = kinds_with("reduction")


def simplify_algebra(graph: SDG, state: PassState) -> SDG:
    """``graph`` with operand-returning ops removed (``state`` is the pipeline's ``PassState``)."""
    redirect, counts = find_simplifications(graph, state.keep)
    if not redirect:
        state.notes.append("simplify: 0 ops removed")
        return graph
    result = apply_rewrites(graph, state.needed, state.keep, redirect)
    state.needed = result.needed
    patterns = ", ".join(f"{n} {name}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    state.notes.append(f"simplify: {len(redirect)} ops replaced by their operand ({patterns}); "
                       f"{result.removed} ops removed")
    return result.graph


def find_simplifications(graph: SDG, keep: set[int]) -> tuple[dict[tuple[int, int], Value], Counter]:
    """``(op id, 0)`` -> the value that replaces it, and how many times each pattern fired."""
    reads = _Reads(graph)
    counts: Counter = Counter()
    changed = True
    while changed:
        changed = False
        for op in graph.ops.values():
            if op.id in keep or (op.id, 0) in reads.redirect or len(op.outputs) != 1 \
                    or op.when is not TRUE:
                continue
            rule = RULES.get(op.kind)
            found = rule(op, reads) if rule else None
            if found is None:
                continue
            name, value = found
            if value[0] is op or value[0].domain != op.domain or not same_type(op, 0, *value):
                continue
            reads.redirect[(op.id, 0)] = value
            counts[name] += 1
            changed = True
    return reads.redirect, counts


class _Reads:
    """The inputs of ops, as the replacements found so far make them."""

    def __init__(self, graph: SDG):
        self.graph = graph
        self.redirect: dict[tuple[int, int], Value] = {}

    def resolve(self, op: Op, out: int) -> Value:
        while (op.id, out) in self.redirect:
            op, out = self.redirect[(op.id, out)]
        return op, out

    def edge(self, op: Op, k: int) -> Edge:
        return self.graph.in_edges(op)[k]

    def operand(self, op: Op, k: int) -> Value | None:
        """What ``op`` reads as input ``k``, when it reads it at the same point over the
        same dims (so the value can stand in for ``op``'s)."""
        edge = self.graph.in_edges(op)[k]
        return self.resolve(edge.src, edge.src_out) if identity_read(edge) else None


Found = tuple[str, Value] | None
Rule = Callable[[Op, _Reads], Found]


# ---- constants ----------------------------------------------------------------------------
def _const_equal(edge: Edge, scalar: float) -> bool:
    """``edge`` reads a constant whose every element is ``scalar``."""
    src = edge.src
    if src.kind != "const" or src.domain or edge.cond is not TRUE:
        return False
    value = src.params["value"]
    return value.size <= 4096 and bool(np.all(value == scalar))


def _binary_identity(left: float | None, right: float | None, name: str) -> Rule:
    """``op(c, x)`` is ``x`` for a constant ``c == left``; ``op(x, c)`` for ``c == right``."""
    def rule(op: Op, reads: _Reads) -> Found:
        if right is not None and _const_equal(reads.edge(op, 1), right):
            x = reads.operand(op, 0)
            if x is not None:
                return name, x
        if left is not None and _const_equal(reads.edge(op, 0), left):
            x = reads.operand(op, 1)
            if x is not None:
                return name, x
        return None
    return rule


# ---- one operand ------------------------------------------------------------------------
def _transparent(name: str) -> Rule:
    """An op whose value is its operand's whenever the types agree (checked by the caller)."""
    def rule(op: Op, reads: _Reads) -> Found:
        x = reads.operand(op, 0)
        return None if x is None else (name, x)
    return rule


def _double_negation(op: Op, reads: _Reads) -> Found:
    inner = reads.operand(op, 0)
    if inner is None or inner[0].kind != "neg":
        return None
    x = reads.operand(inner[0], 0)
    return None if x is None else ("-(-x)", x)


def _reduction(op: Op, reads: _Reads) -> Found:
    """Over no dims, or over dims of size 1 kept (the caller checks the shape)."""
    x = reads.operand(op, 0)
    if x is None or np.dtype(op.outputs[0].dtype).kind not in "iuf":
        return None
    shape = x[0].outputs[x[1]].shape
    dims = [d % len(shape) for d in op.params["dims"]] if shape else list(op.params["dims"])
    if not dims:
        return "reduce over no dims", x
    if all(shape[d].is_const and shape[d].value == 1 for d in dims):
        return "reduce over size-1 dims", x
    return None


def _reshape_chain(op: Op, reads: _Reads) -> Found:
    """The furthest value up a chain of reshape-like ops that has ``op``'s type."""
    best, x = None, reads.operand(op, 0)
    while x is not None:
        if same_type(op, 0, *x):
            best = x
        if x[0].kind not in _RESHAPES:
            break
        x = reads.operand(x[0], 0)
    return None if best is None else ("reshape to the same shape", best)


def _permutation(op: Op, reads: _Reads) -> Found:
    """A chain of permutes whose composition is the identity (one, or a transpose of one)."""
    ndim = len(op.outputs[0].shape)
    perm = [d % ndim for d in op.params["dims"]]
    x = reads.operand(op, 0)
    if perm == list(range(ndim)):
        return None if x is None else ("identity permute", x)
    while x is not None and x[0].kind == "permute":
        inner = [d % ndim for d in x[0].params["dims"]]
        perm = [inner[p] for p in perm]  # out axis j is axis inner[perm[j]] of inner's operand
        x = reads.operand(x[0], 0)
        if perm == list(range(ndim)):
            return None if x is None else ("transpose of a transpose", x)
    return None


def _same_branches(op: Op, reads: _Reads) -> Found:
    x, y = reads.operand(op, 1), reads.operand(op, 2)
    return ("where(c, x, x)", x) if x is not None and x == y else None


RULES: dict[str, Rule] = {
    "mul": _binary_identity(1, 1, "x * 1"),
    "div": _binary_identity(None, 1, "x / 1"),
    "pow": _binary_identity(None, 1, "x ** 1"),
    "add": _binary_identity(0, 0, "x + 0"),
    "sub": _binary_identity(None, 0, "x - 0"),
    "neg": _double_negation,
    "astype": _transparent("astype to the same dtype"),
    "expand": _transparent("expand to the same shape"),
    "detach": _transparent("detach"),
    "identity": _transparent("identity read"),
    **dict.fromkeys(_REDUCTIONS, _reduction),
    **dict.fromkeys(_RESHAPES, _reshape_chain),
    "permute": _permutation,
    "where": _same_branches,
}
