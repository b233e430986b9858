"""Duplicate-code (common-subexpression) elimination.

Two ops of the same kind, with the same params, domain and output types, that read the same
outputs of the same ops at the same points (``phi``) under the same conditions compute the
same value at every point: the later one's readers read the earlier one instead, and it
goes. Merging two ops can make their readers duplicates too, so the search repeats until
nothing changes. Autodiff is the main source: every gradient rule builds its own constants,
reads, transposes and broadcasts.

Not merged: host ops other than symbol values and point coordinates (UDFs and sinks act
on or observe the world at each call), traceable UDFs (their functions are compared by identity
only, so kept apart), and two ops that are both outputs of the program (each has its own
store). Placeholders merge only when their branches are the very same reads, in the same
order; recurrences through two distinct placeholders are not recognised as equal.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from tempo.ir.graph import SDG, Op
from tempo.ir.types import TensorType
from tempo.passes.rewrite import apply_rewrites
from tempo.symbolic.expr import TRUE, Expr, Slice

if TYPE_CHECKING:
    from tempo.passes import PassState

def merge_duplicates(graph: SDG, state: PassState) -> SDG:
    """``graph`` with duplicate ops merged (``state`` is the pipeline's ``PassState``)."""
    rep = _duplicates(graph, state.keep)
    if not rep:
        state.notes.append("dedup: 0 ops merged")
        return graph

    def find(k: int) -> int:
        while k in rep:
            k = rep[k]
        return k
    redirect = {(k, out): (graph.ops[find(k)], out)
                for k in rep for out in range(len(graph.ops[k].outputs))}
    result = apply_rewrites(graph, state.needed, state.keep, redirect)
    state.needed = result.needed
    state.notes.append(f"dedup: {len(rep)} ops merged")
    return result.graph


def _duplicates(graph: SDG, keep: set[int]) -> dict[int, int]:
    """Each merged op's id -> the id of the op that stands for it (possibly merged too)."""
    static = {op.id: _static_key(op) for op in graph.ops.values() if _mergeable(op)}
    rep: dict[int, int] = {}

    def find(k: int) -> int:
        while k in rep:
            k = rep[k]
        return k
    changed = True
    while changed:
        changed = False
        table: dict[tuple, int] = {}
        for op in graph.ops.values():
            if op.id not in static or op.id in rep:
                continue
            key = (static[op.id], tuple((find(e.src.id), e.src_out, _key(e.phi), id(e.cond))
                                        for e in graph.in_edges(op)))
            other = table.get(key)
            if other is None:
                table[key] = op.id
            elif op.id not in keep:
                rep[op.id] = other
                changed = True
            elif other not in keep:  # an output stays: its duplicate merges into it
                rep[other] = table[key] = op.id
                changed = True
    return rep


def _mergeable(op: Op) -> bool:
    d = op.definition  # a host op is merged where it computes its point's values only
    if not d.pure or op.when is not TRUE:
        return False
    return not d.host or d.batched is not None


def _static_key(op: Op) -> tuple:
    """What must be equal besides the inputs."""
    return (op.kind, _key(op.params), tuple(id(d) for d in op.domain), _key(op.requires),
            _key(op.outputs))


def _key(value: Any) -> Any:
    """A hashable key, equal for equal values: symbolic expressions are hash-consed (the same
    object for the same expression), arrays compare by dtype, shape and bytes (so ``-0.0``
    and ``0.0`` differ), floats by their bits; objects that cannot be compared (functions)
    are equal only to themselves."""
    if isinstance(value, Expr):
        return ("expr", id(value))
    if isinstance(value, Slice):
        return ("slice", id(value.start), id(value.stop))
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (np.generic, float)):
        return ("scalar", type(value).__name__, np.asarray(value).tobytes())
    if isinstance(value, (bool, int, str, type(None))):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v)) for k, v in sorted(value.items())))
    if isinstance(value, TensorType):
        return ("type", value.dtype, tuple(id(d) for d in value.shape))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__,
                tuple(_key(getattr(value, f.name)) for f in dataclasses.fields(value)))
    return ("object", id(value))
