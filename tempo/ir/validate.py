"""Checks of a whole program before it is evaluated or scheduled."""

from __future__ import annotations

from typing import Iterable

from tempo.errors import BoundsError, UndefinedPointError
from tempo.ir.graph import SDG
from tempo.symbolic.expr import Slice, Symbol


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
        if int(value) < 1:
            raise BoundsError(f"bound {name} must be at least 1, got {value}")
        values[by_name[name]] = int(value)
    needed = {bound_of.get(s, s) for s in used_symbols(graph)}
    missing = sorted(b.name for b in needed if b not in values and b in by_name.values())
    if missing:
        raise BoundsError(f"no value given for bound {', '.join(missing)}: pass "
                          f"bounds={{{', '.join(f'{m}: ...' for m in missing)}}} to compile")
    return values


def check_placeholders(graph: SDG, ops: Iterable | None = None) -> None:
    """Every placeholder needs at least one branch."""
    for op in (graph.ops.values() if ops is None else ops):
        if op.kind == "merge" and not graph.in_edges(op):
            raise UndefinedPointError(f"placeholder {op.name} has no branch: assign it with "
                                      f"y[...] = value", op.site)
