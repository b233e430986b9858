"""Checks of a whole program before it is evaluated or scheduled."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from tempo.errors import BoundsError, DomainError, GraphError, TempoError, UndefinedPointError
from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.types import TensorType
from tempo.symbolic.expr import TRUE, Slice, Symbol


def used_symbols(graph: SDG) -> set[Symbol]:
    """Every dim and bound symbol the program refers to."""
    used: set[Symbol] = set()
    for op in graph.ops.values():
        used.update(op.domain)
        for t in op.outputs:
            for d in t.shape:
                used.update(d.symbols())
    for e in graph.edges():
        used.update(e.cond.symbols())
        for entry in e.phi:
            used.update(entry.symbols() if isinstance(entry, Slice) else entry.symbols())
    return used


def resolve_bounds(graph: SDG, bound_of: dict[Symbol, Symbol],
                   given: dict) -> dict[Symbol, int]:
    """Concrete bounds for every bound the program needs; names the missing ones."""
    by_name = {b.name: b for b in bound_of.values()}
    values: dict[Symbol, int] = {}
    for key, value in given.items():
        name = key.name if isinstance(key, Symbol) else str(key)
        if name not in by_name:
            raise BoundsError(f"{name} is not a bound of this context "
                              f"(bounds: {', '.join(by_name)})")
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise BoundsError(f"bound {name} must be an int, got {value!r}")
        if int(value) < 1:
            raise BoundsError(f"bound {name} must be at least 1, got {value}")
        values[by_name[name]] = int(value)
    needed = {bound_of.get(s, s) for s in used_symbols(graph)}
    missing = sorted(b.name for b in needed if b not in values and b in by_name.values())
    if missing:
        user = _first_user(graph, bound_of, by_name[missing[0]])
        raise BoundsError(f"no value given for bound {', '.join(missing)}"
                          f"{f' (used by {user.name})' if user else ''}: pass "
                          f"bounds={{{', '.join(f'{m}: ...' for m in missing)}}} to compile",
                          user.site if user else None)
    return values


def _first_user(graph: SDG, bound_of: dict[Symbol, Symbol], bound: Symbol) -> Op | None:
    dims = {d for d, b in bound_of.items() if b is bound}
    for op in graph.ops.values():
        if dims & set(op.domain) or any(bound in d.symbols() for t in op.outputs for d in t.shape):
            return op
    return None


def check_placeholders(graph: SDG, ops: Iterable | None = None) -> None:
    """Every placeholder needs at least one branch."""
    for op in (graph.ops.values() if ops is None else ops):
        if op.kind == "merge" and not graph.in_edges(op):
            raise UndefinedPointError(f"placeholder {op.name} has no branch: assign it with "
                                      f"y[...] = value", op.site)


def check_graph(graph: SDG, bound_of: dict[Symbol, Symbol]) -> None:
    """Check the SDG's invariants; the error shows the offending op and edge."""
    bounds = set(bound_of.values())
    for op in graph.ops.values():
        edges = graph.in_edges(op)
        if [e.sink_in for e in edges] != list(range(len(edges))):
            raise GraphError(f"inputs of {op!r} are not numbered 0..{len(edges) - 1}")
        for e in edges:
            _check_edge(op, e, bounds)
        _check_types(op, edges)


def check_parallel(graph: SDG, parallel: Iterable[Symbol]) -> None:
    """Ops over a parallel dim read it at their own point of it, or the same points of it
    at every point (``x[0]``, ``x[0:B]``), never at others that depend on it (``x[b - 1]``)."""
    for d in parallel:
        for e in graph.edges():
            if d not in e.src.domain or d not in e.sink.domain:
                continue
            entry = e.phi[e.src.domain.index(d)]
            if entry is not d and d in entry.symbols():
                raise DomainError(
                    f"{e.sink.label or e.sink.kind} reads {e.src.label or e.src.kind} at "
                    f"{d.name} = {entry}, but {d.name} is a parallel dim: a point of it reads "
                    f"no other point that depends on it (read {d.name} itself, a fixed point or "
                    f"a fixed window of it, or declare {d.name} an ordinary dim)", e.sink.site)


def _check_edge(op: Op, e: Edge, bounds: set[Symbol]) -> None:
    where = f"\n  in edge {e!r}\n  of op {op!r}"
    if e.sink is not op:
        raise GraphError(f"edge is listed under the wrong sink{where}")
    if len(e.phi) != len(e.src.domain):
        raise GraphError(f"dependence has {len(e.phi)} entries for a source domain of "
                         f"{len(e.src.domain)} dims{where}")
    allowed = set(op.domain) | bounds
    for entry in (*e.phi, e.cond):
        stray = entry.symbols() - allowed
        if stray:
            raise GraphError(f"{', '.join(s.name for s in stray)} is not in the sink's domain{where}")
    if not e.cond.is_bool:
        raise GraphError(f"edge condition {e.cond} is not boolean{where}")
    if not op.definition.conditional_inputs and e.cond is not TRUE:
        raise GraphError(f"{op.kind} ops have no conditional inputs{where}")


def _check_types(op: Op, edges: list[Edge]) -> None:
    if op.kind == "sum_readers":
        return
    in_types = [_read_type(e) for e in edges]
    if op.kind == "merge":
        out = op.outputs[0]
        bad = [e for e, t in zip(edges, in_types) if t != out]
        if bad:
            raise GraphError(f"branch {bad[0]!r} has type {_read_type(bad[0])!r}, "
                             f"the placeholder {op!r} has {out!r}")
        return
    try:
        inferred = op.definition.infer(*in_types, **op.params)
    except TempoError as err:
        raise GraphError(f"{op!r} no longer type-checks: {err.args[0]}") from None
    if tuple(inferred) != tuple(op.outputs):
        raise GraphError(f"{op!r} declares {list(op.outputs)} but its inputs give {list(inferred)}")


def _read_type(e: Edge) -> TensorType:
    """The type the sink sees: slices of the source's dims become leading spatial dims."""
    t = e.src.outputs[e.src_out]
    sizes = tuple(entry.size for entry in e.phi if isinstance(entry, Slice))
    return TensorType((*sizes, *t.shape), t.dtype)
