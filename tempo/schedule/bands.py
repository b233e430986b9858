"""Splitting one schedule dim into loops that run one after another.

isl's scheduler may place loops that run one after the other on the same dim, with
different strides: PPO's acting loop at ``2t + 1`` (its state merges at ``2t``) and the
update loop after it at ``505u + 504`` (its parameter merges at ``505u``). Generated as
one loop, that is 8,080 iterations per training iteration, each testing which statement
runs, where the order holds two loops of 250 and 16 iterations; and the acting loop, mixed
with the updates, cannot be lowered to one XLA loop.

``partition`` cuts the dim's values into consecutive intervals: *loops*, over which the
statements' values share a period ``g`` (the dim is then strip-mined: iteration
``(v - first) // g``, and ``(v - first) mod g``, constant per statement, orders the body),
and *points*, single values (statements between loops, and a loop's first or last
iteration where a statement runs only then: peeled, so that the loop body is the same at
every iteration and can be lowered). A loop of period 1 is peeled only for a nested loop
that runs in its first or last iteration alone (n-step's or PPO's acting loop nested in
the first update of the iteration, as isl may place it); a single statement there stays
a guarded statement of the loop. Any cut of the values keeps the order, so the partition only changes the
shape of the code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl


@dataclass(frozen=True)
class Values:
    """One statement's values on the dim: ``lo, lo + stride, ..., hi``; stride 0 for a
    single value, 1 for any set that is not a progression of a larger stride."""

    lo: int
    hi: int
    stride: int
    nested: bool = False
    """The statement runs more than once at a value (a loop nested in an iteration)."""

    def within(self, a: int, b: int) -> Values | None:
        """The values in ``[a, b]``."""
        step = max(self.stride, 1)
        first = self.lo + -(-(max(a, self.lo) - self.lo) // step) * step
        last = self.lo + (min(b, self.hi) - self.lo) // step * step
        if first > last:
            return None
        return Values(first, last, 0 if first == last else self.stride, self.nested)


@dataclass(frozen=True)
class Interval:
    """Values ``first..last`` of the dim: a loop with period ``period`` (>= 1), or a single
    value (``period`` 0, ``first == last``)."""

    first: int
    last: int
    period: int


MAX_POINTS = 64
"""Longest run of values left as single points; longer ones stay loops."""


def values_of(m: isl.Map, dim: int, nests: bool = True) -> Values:
    """The values output ``dim`` of ``m`` takes; ``nests``: whether the statement counts
    as a nested loop where it runs several times at one value (frees do not: they never
    keep a loop from being lowered)."""
    n = m.dim(isl.dim_type.out)
    values = m.range().project_out(isl.dim_type.set, dim + 1, n - dim - 1) \
        .project_out(isl.dim_type.set, 0, dim)
    lo, hi = values.dim_min_val(0).to_python(), values.dim_max_val(0).to_python()
    if lo == hi:
        return Values(lo, hi, 0, nests and m.domain().count_val().to_python() > 1)
    stride = values.get_stride(0).to_python()
    exact = stride > 1 and values.count_val().to_python() == (hi - lo) // stride + 1
    return Values(lo, hi, stride if exact else 1)


def partition(statements: list[Values]) -> list[Interval]:
    """Consecutive intervals covering every statement's values (see the module doc)."""
    out: list[Interval] = []
    for first, last, period in _segments(statements):
        inside = [v for v in (s.within(first, last) for s in statements) if v is not None]
        looped = [v for v in inside if v.stride > 0]
        if period == 0 or not looped:
            out += _points(inside, first, last)
            continue
        start, stop = min(v.lo for v in looped), max(v.hi for v in looped)
        once = [v.lo for v in inside if v.stride == 0 and (period > 1 or v.nested)]
        if any(start <= x < start + period for x in once):  # peel the first iteration
            start += period
        last_start = start + (stop - start) // period * period
        if any(last_start <= x <= stop for x in once):  # peel the last iteration
            stop = last_start - 1
        if stop - start < period:  # at most one iteration left
            out += _points(inside, first, last)
            continue
        out += _points(inside, first, start - 1)
        out.append(Interval(start, stop, period))
        out += _points(inside, stop + 1, last)
    return out


def _segments(statements: list[Values]) -> list[tuple[int, int, int]]:
    """``(first, last, period)`` runs of values over which the statements with several
    values share a period (0: none has several), cut where one more value would break it."""
    looped = [s for s in statements if s.stride > 0]
    lo, hi = min(s.lo for s in statements), max(s.hi for s in statements)
    cuts = sorted({lo, hi + 1} | {s.lo for s in looped} | {s.hi + 1 for s in looped})
    segments = []
    start, period = lo, 0
    for prev, cut in zip(cuts, cuts[1:]):
        extended = _period(looped, start, cut - 1)
        if period > 1 and extended == 1:
            segments.append((start, prev - 1, period))
            start, extended = prev, _period(looped, prev, cut - 1)
        period = extended
    segments.append((start, hi, period))
    return segments


def _period(statements: list[Values], a: int, b: int) -> int:
    """The gcd of the strides of the statements with several values in ``[a, b]``."""
    strides = [v.stride for v in (s.within(a, b) for s in statements) if v is not None and v.stride]
    return math.gcd(*strides) if strides else 0


def _points(inside: list[Values], a: int, b: int) -> list[Interval]:
    """Each value in ``[a, b]`` some statement takes, as a single point (one loop of
    period 1 if there are more than ``MAX_POINTS``)."""
    if a > b:
        return []
    values: set[int] = set()
    for v in inside:
        part = v.within(a, b)
        if part is not None:
            values.update(range(part.lo, part.hi + 1, max(part.stride, 1)))
        if len(values) > MAX_POINTS:
            return [Interval(a, b, 1)]
    return [Interval(x, x, 0) for x in sorted(values)]
