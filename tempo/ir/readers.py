"""Reader sums: the transpose of a dependence edge, used by automatic differentiation.

An edge ``sink --phi--> src`` says that the sink at ``p`` reads the source at ``phi(p)``.
Its transpose is an op over the source's domain that, at a source point ``q``, sums a
per-sink-point tensor ``g[p]`` over every sink point ``p`` that read ``q``. Where ``phi``
reads a slice of a source dim, ``g[p]`` has one leading dim per slice and the entry for
``q`` sits at ``q - start(p)``. The reading sink points are the inverse of ``phi``
(``tempo.symbolic.inversion``), a box of ranges over the sink dims.

Sink points may read slices of different sizes (``x[0:t+1]``), so the ``g[p]`` are not
stacked: each is read as a point and indexed on its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tempo.symbolic.expr import Expr, IndexEntry, Slice, Symbol, compile_function

PointRead = Callable[[tuple[int, ...]], Any]


@dataclass(frozen=True)
class ReaderSum:
    """What a ``sum_readers`` op sums (its ``reads`` param).

    ``inverse`` has one entry per sink dim, written over the op's own dims (the source's);
    ``sink_cond`` (over the sink dims) filters the reading points; ``offsets`` pairs, per
    leading slice dim of ``g``, the position of the sliced dim in the op's domain with the
    slice's start over the sink dims (position None: the axis is kept whole, as where a
    parallel dim was laid out); ``g_dims`` are the positions in ``sink_dims`` of the dims
    ``g`` varies over. ``lead``: one entry per leading stacked axis each ``g`` has before
    those (a dim laid out by ``tempo.passes.parallel`` or ``tempo.passes.vectorize``),
    ``"keep"`` to keep it, ``"sum"`` to sum it away. ``first``: the axis of the sum that
    goes first (counted among the kept axes, leading ones then whole windows), where a
    window kept whole is over a dim ``tempo.passes.vectorize`` laid out (stacked first).
    """

    sink_dims: tuple[Symbol, ...]
    inverse: tuple[IndexEntry, ...]
    sink_cond: Expr
    offsets: tuple[tuple[int | None, Expr], ...]
    g_dims: tuple[int, ...]
    lead: tuple[str, ...] = ()
    first: int = 0

    def symbols(self) -> frozenset[Symbol]:
        """Bound symbols the sum refers to (the op's dims are implied by its domain)."""
        out: set[Symbol] = set()
        for e in (*self.inverse, self.sink_cond, *(s for _, s in self.offsets)):
            out |= e.symbols()
        return frozenset(s for s in out if s.kind == "bound")


def compile_reader_sum(reads: ReaderSum, domain: tuple[Symbol, ...],
                       bounds: dict[Symbol, int]) -> Callable[[tuple[int, ...], PointRead], Any]:
    """``accumulate(q, read)``: the sum at source point ``q``, reading ``g`` through
    ``read(point of g)``; ``None`` when no sink point read ``q``."""
    inverse = compile_function(reads.inverse, domain, bounds)
    cond = compile_function([reads.sink_cond], reads.sink_dims, bounds)
    starts = compile_function([s for _, s in reads.offsets], reads.sink_dims, bounds)
    positions = [k for k, _ in reads.offsets]
    g_dims = reads.g_dims
    summed = tuple(k for k, lead in enumerate(reads.lead) if lead == "sum")
    kept = tuple(slice(None) for lead in reads.lead if lead == "keep")
    first = reads.first

    def accumulate(q: tuple[int, ...], read: PointRead) -> Any:
        axes = [range(e.start, e.stop) if isinstance(e, slice) else (e,) for e in inverse(*q)]
        total = None
        for p in itertools.product(*axes):
            if not cond(*p)[0]:
                continue
            value = read(tuple(p[k] for k in g_dims))
            if summed:
                value = value.sum(summed)
            index = tuple(slice(None) if k is None else q[k] - start
                          for k, start in zip(positions, starts(*p)))
            value = value[(*kept, *index)]
            total = value if total is None else total + value
        if first and total is not None:
            total = total.transpose((first, *(k for k in range(total.ndim) if k != first)))
        return total
    return accumulate


def reader_points(reads: ReaderSum, domain: tuple[Symbol, ...], env: dict[Symbol, int]
                  ) -> list[tuple[int, ...]]:
    """The points of ``g`` read at the source point in ``env`` (for the reference)."""
    out = []
    axes = [range(e.start.evaluate(env), e.stop.evaluate(env)) if isinstance(e, Slice)
            else (e.evaluate(env),) for e in reads.inverse]
    for p in itertools.product(*axes):
        sink_env = {**env, **dict(zip(reads.sink_dims, p))}
        if reads.sink_cond.evaluate(sink_env):
            out.append(tuple(p[k] for k in reads.g_dims))
    return out
