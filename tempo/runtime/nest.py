"""A loop nest flattened into one sequence of iterations, for one ``lax.scan``.

A nest is a loop whose body holds statements and loops (guarded or not), theirs too,
all ``range`` loops. Its flattened iterations are, per iteration of a loop, those of its
inner loops one after the other (for ``for i: for t: ...``, the points ``(i, t)`` in
order), a loop without inner loops contributing its own iterations. A statement of a
loop body runs at the first flattened iteration of its loop's iteration when it comes
before the body's first inner loop, at the last flattened iteration of the inner loop it
follows otherwise, and at every iteration of an innermost loop. An inner loop with no
iterations (its guard is false, or its range is empty) still gets one flattened
iteration, where only the statements around it run. So one pass over all statements per
flattened iteration, in the program's text order, each where it runs, executes every
statement instance in the program's order. A single loop is the nest of one level.

isl peels the first or last iteration of an innermost loop where a statement runs only
there (the initial branch of a recurrence: ``s[i, 0] = ...``), which puts that loop's
statements at two places of the nest. ``unpeeled`` puts the iteration back into the loop,
guarded, so that each op runs at one place of the flattened body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tempo.schedule import ast
from tempo.symbolic.expr import (
    TRUE,
    Expr,
    Symbol,
    compile_function,
    compile_vectorized,
    logical_and,
    maximum,
    minimum,
)

Guarded = tuple[ast.Stmt, tuple[Expr, ...]]


# ---- the nest's shape ----------------------------------------------------------------------
def is_nest(loop: ast.Loop) -> bool:
    """Whether every loop of ``loop`` (itself included) is a ``range`` with a positive step."""
    if ast.range_stop(loop) is None or loop.step < 1:
        return False
    return all(is_nest(node) for node, _ in ast.guarded_items(loop.body) if isinstance(node, ast.Loop))


def depth(loop: ast.Loop) -> int:
    """The loops on the longest path from ``loop`` inward (1: no inner loop)."""
    inner = [node for node, _ in ast.guarded_items(loop.body) if isinstance(node, ast.Loop)]
    return 1 + max((depth(node) for node in inner), default=0)


Body = list[tuple[ast.Stmt | ast.Loop, tuple[Expr, ...]]]


def unpeeled(loop: ast.Loop) -> ast.Loop:
    """``loop`` with each innermost inner loop extended by one iteration where
    the statements just before it (after it) are its peeled first (last) iteration: the
    longest common subsequence of those statements and the loop's body, matched by
    statement, index and guards at the extra iteration, runs once, and the rest runs
    guarded by the iteration (the peeled statements at the extra one, the loop's at its
    own). Statements outside the matched ones stay where they are. No statement instance
    moves in the execution order."""
    body: Body = [(unpeeled(node) if isinstance(node, ast.Loop) else node, guard)
                  for node, guard in ast.guarded_items(loop.body)]
    body = _unpeel_each(body, first=True)
    body = _unpeel_each(body[::-1], first=False)[::-1]
    return ast.Loop(loop.var, loop.start, loop.cond, loop.step, _sequence(body))


def with_peeled_iterations(before: list[ast.Stmt], loop: ast.Loop,
                           after: list[ast.Stmt]) -> tuple[list[ast.Stmt], ast.Loop, list[ast.Stmt]]:
    """An innermost ``loop`` given back its peeled first and last iterations from the
    statements just ``before`` and ``after`` it in its body (as ``unpeeled`` does for a
    nest's inner loops): the statements that stay before it, the loop, those that stay
    after it."""
    kept_before, loop = _unpeel([(stmt, ()) for stmt in before], loop, first=True)
    kept_after, loop = _unpeel([(stmt, ()) for stmt in after], loop, first=False)
    return [stmt for stmt, _ in kept_before], loop, [stmt for stmt, _ in kept_after]  # type: ignore[misc]


def _unpeel_each(body: Body, first: bool) -> Body:
    """``body`` with each innermost loop given back the statements just before it
    (``first``; with ``body`` reversed, those just after it) that are its peeled
    iteration. A guarded loop's peeled statements are under the same guards."""
    out: Body = []
    for node, guard in body:
        if isinstance(node, ast.Loop) and depth(node) == 1:
            shared = tuple(map(repr, guard))
            start = len(out)
            while start and isinstance(out[start - 1][0], ast.Stmt) and \
                    tuple(map(repr, out[start - 1][1][:len(guard)])) == shared:
                start -= 1
            around: list[Guarded] = [(stmt, g[len(guard):]) for stmt, g in out[start:]]  # type: ignore[misc]
            kept, node = _unpeel(around if first else around[::-1], node, first)
            kept = [(stmt, (*guard, *g)) for stmt, g in kept]
            out[start:] = kept if first else kept[::-1]
        out.append((node, guard))
    return out


def _unpeel(around: list[Guarded], inner: ast.Loop, first: bool) -> tuple[list[Guarded], ast.Loop]:
    """The statements ``around`` an innermost loop (just before it if ``first``, else just
    after it, in text order) that stay there, and the loop given back those that are its
    peeled iteration (``unpeeled``)."""
    stop = ast.range_stop(inner)
    if stop is None or (not first and inner.step != 1):
        return around, inner
    body: list[Guarded] = ast.guarded_items(inner.body)  # type: ignore[assignment]
    extra = inner.start - inner.step if first else stop
    pairs = _common(around, body, {inner.var: extra})
    if not pairs:
        return around, inner
    if first:
        cut = pairs[0][0]
        peeled, kept = around[cut:], around[:cut]
        pairs = [(pn - cut, bn) for pn, bn in pairs]
        own = inner.var >= inner.start
    else:
        cut = pairs[-1][0] + 1
        peeled, kept = around[:cut], around[cut:]
        own = inner.var < stop
    merged: list[Guarded] = []
    p = b = 0
    for pn, bn in [*pairs, (len(peeled), len(body))]:
        merged += [(stmt, (*guard, inner.var == extra)) for stmt, guard in peeled[p:pn]]
        merged += [(stmt, (*guard, own)) for stmt, guard in body[b:bn]]
        if bn < len(body):
            merged.append(body[bn])
        p, b = pn + 1, bn + 1
    # The extra iteration runs even where the loop's own range is empty, as the peeled
    # statements did.
    if first:
        return kept, ast.Loop(inner.var, extra, inner.var < maximum(stop, extra + inner.step),
                              inner.step, _sequence(merged))
    return kept, ast.Loop(inner.var, minimum(inner.start, stop), inner.var < stop + 1, inner.step,
                          _sequence(merged))


def _common(before: list[Guarded], body: list[Guarded], at: dict[Symbol, Expr]) -> list[tuple[int, int]]:
    """The longest common subsequence of the statements ``before`` a loop and those of its
    ``body`` at iteration ``at``, as pairs of positions."""
    def key(stmt: ast.Stmt, guard: tuple[Expr, ...], subst: dict) -> tuple:
        guards = (e.substitute(subst) for e in guard)  # a guard that holds there is no guard
        return (stmt.name, tuple(repr(e.substitute(subst)) for e in stmt.index),
                tuple(repr(e) for e in guards if e is not TRUE))
    left = [key(stmt, guard, {}) for stmt, guard in before]
    right = [key(stmt, guard, at) for stmt, guard in body]
    lengths = np.zeros((len(left) + 1, len(right) + 1), np.int64)
    for i in range(len(left) - 1, -1, -1):
        for j in range(len(right) - 1, -1, -1):
            lengths[i, j] = lengths[i + 1, j + 1] + 1 if left[i] == right[j] \
                else max(lengths[i + 1, j], lengths[i, j + 1])
    pairs, i, j = [], 0, 0
    while i < len(left) and j < len(right):
        if left[i] == right[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif lengths[i + 1, j] >= lengths[i, j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def _sequence(items: list) -> ast.Node:
    """Guarded statements and loops as a body."""
    def one(node: ast.Node, guard: tuple[Expr, ...]) -> ast.Node:
        if not guard:
            return node
        cond = guard[0]
        for c in guard[1:]:
            cond = logical_and(cond, c)
        return ast.If(cond, node)
    return ast.Seq(tuple(one(node, guard) for node, guard in items))


# ---- statements and where they run ---------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """A statement of the nest, its guards, the loop whose body holds it (a position in
    ``Nest.loops``) and where it runs there: ``after`` -1 before the body's first inner
    loop (at every iteration of an innermost loop), ``j`` after its ``j``-th inner loop."""

    stmt: ast.Stmt
    guard: tuple[Expr, ...]
    loop: int
    after: int


@dataclass(frozen=True)
class Level:
    """A loop of the nest: the loop, its guard in its parent's body, its parent (a
    position in ``Nest.loops``, None for the root) and its inner loops."""

    loop: ast.Loop
    guard: tuple[Expr, ...]
    parent: int | None
    children: tuple[int, ...]


def levels_and_items(root: ast.Loop) -> tuple[list[Level], list[Item]]:
    """The loops of a nest (depth first) and its statements in text order."""
    levels: list[Level] = []
    items: list[Item] = []

    def visit(loop: ast.Loop, guard: tuple[Expr, ...], parent: int | None) -> int:
        here = len(levels)
        levels.append(Level(loop, guard, parent, ()))
        children: list[int] = []
        for node, inner_guard in ast.guarded_items(loop.body):
            if isinstance(node, ast.Loop):
                children.append(visit(node, inner_guard, here))
            else:
                items.append(Item(node, inner_guard, here, len(children) - 1))
        levels[here] = Level(loop, guard, parent, tuple(children))
        return here
    visit(root, (), None)
    return levels, items


def statement_names(loop: ast.Loop) -> list[str]:
    """The statements of a nest's bodies."""
    return sorted(item.stmt.name for item in levels_and_items(unpeeled(loop))[1])


# ---- one entry's iterations ----------------------------------------------------------------
@dataclass
class Space:
    """One entry's flattened iterations."""

    trips: int
    counters: dict[Symbol, np.ndarray]
    """Each loop variable's value at each flattened iteration (0 outside its loop)."""
    inside: dict[int, np.ndarray]
    """Per loop, which of its iterations each flattened iteration is in (-1: none)."""
    segments: dict[tuple[int, int], np.ndarray]
    """Per loop and inner loop ``j``: the loop's iteration whose ``j``-th inner loop each
    flattened iteration runs (-1: none), an inner loop without iterations included."""
    _at: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    def at(self, loop: int, after: int, innermost: bool) -> np.ndarray:
        """The flattened iterations where a statement of ``loop`` at ``after`` runs."""
        key = (loop, after)
        if key not in self._at:
            ids = self.inside[loop] if after < 0 else self.segments[(loop, after)]
            present = ids >= 0
            if after < 0 and innermost:
                edge = present
            elif after < 0:  # the first of each iteration
                edge = present & np.concatenate([[True], ids[1:] != ids[:-1]])
            else:  # the last of each iteration's segment
                edge = present & np.concatenate([ids[1:] != ids[:-1], [True]])
            self._at[key] = np.flatnonzero(edge)
        return self._at[key]

    def span(self, first: int, stop: int) -> Space:
        """Iterations ``first .. stop - 1`` of a loop without inner loops, numbered from 0
        (``tempo.runtime.lowering``: a loop lowered in spans)."""
        if self.segments or len(self.inside) != 1:
            raise ValueError("internal: only a loop without inner loops is lowered in spans")
        every = np.arange(stop - first)
        return Space(stop - first, {v: c[first:stop] for v, c in self.counters.items()}, {0: every}, {},
                     {(0, -1): every})


@dataclass
class _Flat:
    """Flattened iterations under some entries of a loop (``Nest._expand``)."""

    parent: np.ndarray
    counters: dict[Symbol, np.ndarray]
    inside: dict[int, np.ndarray]
    segments: dict[tuple[int, int], np.ndarray]

    def take(self, order: np.ndarray) -> _Flat:
        return _Flat(self.parent[order], {k: v[order] for k, v in self.counters.items()},
                     {k: v[order] for k, v in self.inside.items()},
                     {k: v[order] for k, v in self.segments.items()})


class Nest:
    """The loops and statements of a nest (``unpeeled``), and its iterations per entry."""

    def __init__(self, loop: ast.Loop, outer: tuple[Symbol, ...]):
        if not is_nest(loop):
            raise ValueError("internal: not a loop nest")
        self.levels, self.items = levels_and_items(unpeeled(loop))
        self.vars: tuple[Symbol, ...] = tuple(dict.fromkeys(lv.loop.var for lv in self.levels))
        """The nest's loop variables (sibling loops share theirs)."""
        self.enclosing = [self._enclosing(n) for n in range(len(self.levels))]
        self.single = compile_function([loop.start, ast.range_stop(loop)], outer) \
            if len(self.levels) == 1 else None
        """A loop without inner loops: its range, for plain ints."""
        self.ranges: list[Callable[..., tuple]] = []
        self.guards: list[Callable[..., tuple] | None] = []
        for n, level in enumerate(self.levels):
            params = [*outer, *self.enclosing[n]]
            self.ranges.append(compile_vectorized([level.loop.start, ast.range_stop(level.loop)], params))
            self.guards.append(compile_vectorized(level.guard, params) if level.guard else None)

    def _enclosing(self, n: int) -> tuple[Symbol, ...]:
        """The variables of the loops around loop ``n``, outermost first."""
        parent = self.levels[n].parent
        return () if parent is None else (*self._enclosing(parent), self.levels[parent].loop.var)

    def innermost(self, n: int) -> bool:
        return not self.levels[n].children

    def space(self, outer: tuple[int, ...]) -> Space:
        """The flattened iterations of the entry at ``outer``."""
        if self.single is not None:  # one loop: its own iterations (the common case, kept cheap)
            start, stop = self.single(*outer)
            values = np.arange(start, stop, self.levels[0].loop.step, dtype=np.int64)
            every = np.arange(len(values))
            return Space(len(values), {self.vars[0]: values}, {0: every}, {}, {(0, -1): every})
        flat = self._expand(0, outer, {}, 1)
        trips = len(flat.parent)
        counters = {v: flat.counters.get(v, np.zeros(trips, np.int64)) for v in self.vars}
        return Space(trips, counters, flat.inside, flat.segments)

    def _expand(self, n: int, outer: tuple[int, ...], frame: dict[Symbol, np.ndarray], width: int) -> _Flat:
        """The flattened iterations of loop ``n`` under each of ``width`` iterations of its
        parent (``frame``: the enclosing variables' values at them), in order."""
        level = self.levels[n]
        values = [frame[v] for v in self.enclosing[n]]
        start, stop = (np.broadcast_to(np.asarray(v, np.int64), (width,))
                       for v in self.ranges[n](*outer, *values))
        counts = np.maximum(0, -((start - stop) // level.loop.step))
        guard = self.guards[n]
        if guard is not None:
            counts = np.where(np.logical_and.reduce([np.broadcast_to(c, (width,))
                                                     for c in guard(*outer, *values)]), counts, 0)
        parent = np.repeat(np.arange(width), counts)
        offset = np.arange(len(parent)) - (np.cumsum(counts) - counts)[parent]
        iterations = {**{v: a[parent] for v, a in frame.items()},
                      level.loop.var: start[parent] + offset * level.loop.step}
        count = len(parent)
        if not level.children:
            return _Flat(parent, iterations, {n: np.arange(count)}, {})
        parts = [self._segment(n, j, child, outer, iterations, count)
                 for j, child in enumerate(level.children)]
        whole = _concatenate(parts)
        which = np.concatenate([np.full(len(p.parent), j) for j, p in enumerate(parts)])
        rank = np.concatenate([np.arange(len(p.parent)) for p in parts])
        whole = whole.take(np.lexsort((rank, which, whole.parent)))
        whole.inside[n] = whole.parent
        whole.parent = parent[whole.parent]
        return whole

    def _segment(self, n: int, j: int, child: int, outer: tuple[int, ...],
                 frame: dict[Symbol, np.ndarray], width: int) -> _Flat:
        """Inner loop ``j`` of loop ``n``'s iterations, one flattened iteration (where only
        the statements around it run) for each iteration where it has none."""
        flat = self._expand(child, outer, frame, width)
        missing = np.flatnonzero(np.bincount(flat.parent, minlength=width) == 0)
        if len(missing):
            empty = _Flat(missing, {v: a[missing] for v, a in frame.items()}, {}, {})
            flat = _concatenate([flat, empty])
            flat = flat.take(np.argsort(flat.parent, kind="stable"))
        flat.segments[(n, j)] = flat.parent
        return flat


def _concatenate(parts: list[_Flat]) -> _Flat:
    """Flattened iterations one after the other; what a part lacks is 0 (counters) or -1."""
    def join(field: str, missing: int) -> dict:
        keys = dict.fromkeys(k for p in parts for k in getattr(p, field))
        return {k: np.concatenate([getattr(p, field).get(k, np.full(len(p.parent), missing, np.int64))
                                   for p in parts]) for k in keys}
    return _Flat(np.concatenate([p.parent for p in parts]), join("counters", 0), join("inside", -1),
                 join("segments", -1))
