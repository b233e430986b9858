"""Inversion of dependence expressions, checked by brute-force enumeration.

Semantics: a sink with dims ``sink_dims`` reads a source with dims ``source_dims`` at
``phi(p)`` (one point or slice per source dim, over the sink's symbols). For a source
point ``s``, the readers of ``s`` are the in-range sink points ``p`` (``0 <= p < bound``
per dim) with ``s`` in ``phi(p)``. ``invert_dependence`` returns one entry per sink dim
over the source's symbols; evaluated at ``s`` it must denote exactly the readers of ``s``.

Convention for source points that nobody reads: the inverse is only required to be exact
where the set of readers is non-empty (isl computes the bounds of a non-empty set; where
it is empty, the returned expression is unconstrained). Every check below therefore
compares on source points with at least one reader, and additionally asserts that each
case has such points, so no check is vacuous.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tempo.errors import TempoError, UnsupportedExpressionError
from tempo.symbolic.expr import Expr, Slice, Symbol, as_expr, maximum, minimum
from tempo.symbolic.inversion import invert_dependence, read_condition

t = Symbol("t")
i = Symbol("i")
T = Symbol("T", "bound")
I = Symbol("I", "bound")
BOUNDS = {t: T, i: I}
T_VALUES = range(1, 9)
I_VALUES = range(1, 5)


def _denotes(entry, env: dict) -> range:
    """The coordinates an index entry denotes at ``env`` (a point or a half-open range)."""
    if isinstance(entry, Slice):
        return range(entry.start.evaluate(env), entry.stop.evaluate(env))
    value = as_expr(entry).evaluate(env)
    return range(value, value + 1)


def _bound_envs(dims) -> list[dict]:
    syms = sorted({BOUNDS[d] for d in dims}, key=lambda b: b.name)
    values = [I_VALUES if b is I else T_VALUES for b in syms]
    envs = [dict(zip(syms, combo)) for combo in itertools.product(*values)]
    for env in envs:  # evaluation may also mention bounds of dims on the other side
        env.setdefault(T, 1)
        env.setdefault(I, 1)
    return envs


def _box(dims, env) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(env[BOUNDS[d]]) for d in dims)))


def check_inverse(phi, sink_dims, source_dims, inverse=None) -> int:
    """Compare the inverse with brute force for every bound value; return how many source
    points were checked (those with at least one reader)."""
    if inverse is None:
        inverse = invert_dependence(phi, sink_dims, source_dims, BOUNDS)
    assert len(inverse) == len(sink_dims)
    region = read_condition(phi, sink_dims, source_dims, BOUNDS)
    dims = {*sink_dims, *source_dims}
    checked = 0
    for bounds in _bound_envs(dims):
        readers: dict[tuple, set] = {s: set() for s in _box(source_dims, bounds)}
        for p in _box(sink_dims, bounds):
            env = {**bounds, **dict(zip(sink_dims, p))}
            for s in itertools.product(*(_denotes(e, env) for e in phi)):
                if s in readers:  # reads outside the source's range are not reads of a point
                    readers[s].add(p)
        for s, expected in readers.items():
            env = {**bounds, **dict(zip(source_dims, s))}
            assert bool(region.evaluate(env)) == bool(expected), (
                f"phi={list(phi)} bounds={bounds} source point={s}: read condition {region} "
                f"is {region.evaluate(env)}, brute force finds {len(expected)} readers")
            if not expected:
                continue
            got = set(itertools.product(*(_denotes(e, env) for e in inverse)))
            assert got == expected, (f"phi={list(phi)} sink={sink_dims} source={source_dims} "
                                     f"bounds={bounds} source point={s}: inverse {inverse} "
                                     f"gives {sorted(got)}, brute force {sorted(expected)}")
            checked += 1
    assert checked > 0, "no source point is read: the case checks nothing"
    return checked


# ---- the named cases ------------------------------------------------------------------------
CASES = {
    "shift": ([t + 3], (t,), (t,)),
    "back shift": ([t - 1], (t,), (t,)),
    "backward window": ([Slice(maximum(0, t - 3), t + 1)], (t,), (t,)),
    "anti-causal": ([Slice(t, T)], (t,), (t,)),
    "causal": ([Slice(0, t + 1)], (t,), (t,)),
    "forward window": ([Slice(t, minimum(t + 3, T))], (t,), (t,)),
    "constant point": ([as_expr(0)], (t,), (t,)),
    "last point": ([T - 1], (t,), (t,)),
    "constant slice": ([Slice(0, T)], (t,), (t,)),
    "reverse": ([T - 1 - t], (t,), (t,)),
    "two-sided window": ([Slice(maximum(0, t - 4), minimum(T, t + 2))], (t,), (t,)),
    "unclipped window": ([Slice(t - 2, t + 1)], (t,), (t,)),
    "identity": ([t], (t,), (t,)),
    "nested shift": ([i, t - 1], (i, t), (i, t)),
    "nested window": ([i, Slice(maximum(0, t - 2), t + 1)], (i, t), (i, t)),
    "outer causal": ([Slice(0, i + 1), t], (i, t), (i, t)),
    "broadcast over i": ([t], (i, t), (t,)),
    "broadcast shifted": ([t - 1], (i, t), (t,)),
    "read fixed i": ([as_expr(0), t], (t,), (i, t)),
    "reduce over i": ([Slice(0, I), t], (t,), (i, t)),
    "last i": ([I - 1, t + 1], (t,), (i, t)),
    "transpose-like": ([t, i], (i, t), (t, i)),
    "floordiv": ([t // 2], (t,), (t,)),
    "stride": ([t * 2], (t,), (t,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_inverse_matches_brute_force(name):
    phi, sink_dims, source_dims = CASES[name]
    check_inverse(phi, sink_dims, source_dims)


# ---- the exact results the design names --------------------------------------------------
def test_shift_inverts_to_negative_shift():
    (inv,) = invert_dependence([t + 3], (t,), (t,), BOUNDS)
    assert inv is t - 3


def test_backward_window_inverts_to_clipped_forward_window():
    (inv,) = invert_dependence([Slice(maximum(0, t - 3), t + 1)], (t,), (t,), BOUNDS)
    assert isinstance(inv, Slice)
    assert inv.start is t
    assert inv.stop is minimum(t + 4, T) or inv.stop is minimum(T, t + 4)


def test_anti_causal_slice_inverts_to_causal_slice():
    (inv,) = invert_dependence([Slice(t, T)], (t,), (t,), BOUNDS)
    assert isinstance(inv, Slice)
    assert inv.start is as_expr(0) and inv.stop is t + 1


def test_causal_slice_inverts_to_anti_causal_slice():
    (inv,) = invert_dependence([Slice(0, t + 1)], (t,), (t,), BOUNDS)
    assert isinstance(inv, Slice)
    assert inv.start is t and inv.stop is T


def test_constant_point_is_read_by_every_sink_point():
    (inv,) = invert_dependence([as_expr(0)], (t,), (t,), BOUNDS)
    assert isinstance(inv, Slice) and inv.start is as_expr(0) and inv.stop is T


def test_broadcast_inverse_covers_the_whole_missing_dim():
    inv_i, inv_t = invert_dependence([t], (i, t), (t,), BOUNDS)
    assert isinstance(inv_i, Slice) and inv_i.start is as_expr(0) and inv_i.stop is I
    assert inv_t is t


def test_nested_shift_inverts_per_dim():
    inv_i, inv_t = invert_dependence([i, t - 1], (i, t), (i, t), BOUNDS)
    assert inv_i is i and inv_t is t + 1


def test_inverse_entries_use_only_source_symbols_and_bounds():
    inv = invert_dependence([i, Slice(maximum(0, t - 2), t + 1)], (i, t), (i, t), BOUNDS)
    for entry in inv:
        assert entry.symbols() <= {i, t, I, T}
    (only_t,) = invert_dependence([as_expr(0), t], (t,), (i, t), BOUNDS)
    assert only_t.symbols() <= {i, t, I, T}


def test_inverse_of_inverse_gives_back_the_window():
    phi = [Slice(maximum(0, t - 2), t + 1)]  # in range and non-empty at every sink point
    inv = invert_dependence(phi, (t,), (t,), BOUNDS)
    back = invert_dependence(list(inv), (t,), (t,), BOUNDS)
    check_inverse(list(inv), (t,), (t,), back)
    for n in T_VALUES:
        for p in range(n):
            env = {t: p, T: n}
            assert _denotes(back[0], env) == _denotes(phi[0], env), (n, p, back)


# ---- random window families --------------------------------------------------------------
def _start(kind: str, a: int) -> Expr:
    return {"zero": as_expr(0), "shift": t + a, "clipped": maximum(0, t + a)}[kind]


def _stop(kind: str, b: int) -> Expr:
    return {"end": T, "shift": t + b, "clipped": minimum(T, t + b)}[kind]


@settings(max_examples=40, deadline=None)
@given(start=st.sampled_from(["zero", "shift", "clipped"]), a=st.integers(-4, 2),
       stop=st.sampled_from(["end", "shift", "clipped"]), width=st.integers(1, 5))
def test_random_windows_invert_exactly(start, a, stop, width):
    phi = [Slice(_start(start, a), _stop(stop, a + width))]
    check_inverse(phi, (t,), (t,))


@settings(max_examples=25, deadline=None)
@given(k=st.integers(-5, 5), nested=st.booleans())
def test_random_point_shifts_invert_exactly(k, nested):
    if nested:
        inv = invert_dependence([i, t + k], (i, t), (i, t), BOUNDS)
        assert inv[0] is i and inv[1] is t - k
        check_inverse([i, t + k], (i, t), (i, t), inv)
    else:
        (inv,) = invert_dependence([t + k], (t,), (t,), BOUNDS)
        assert inv is t - k
        check_inverse([t + k], (t,), (t,), [inv])


# ---- unsupported patterns ----------------------------------------------------------------
@pytest.mark.parametrize("phi,sink_dims,source_dims", [
    ([minimum(t + 5, T - 1)], (t,), (t,)),     # clamped point: a piecewise inverse
    ([i + t], (i, t), (t,)),                   # diagonal: the readers are not a box
    ([t * t], (t,), (t,)),                     # not quasi-affine
    ([t // T], (t,), (t,)),                    # division by a symbol
])
def test_unsupported_patterns_raise_unsupported_expression_error(phi, sink_dims, source_dims):
    with pytest.raises(UnsupportedExpressionError):
        invert_dependence(phi, sink_dims, source_dims, BOUNDS)


@pytest.mark.parametrize("phi,sink_dims,source_dims", [
    ([t % 3], (t,), (t,)),            # readers of s: every p with p % 3 == s, e.g. {0, 3, 6}
    ([t % 2], (t,), (t,)),
    ([(t % 2) * 2], (t,), (t,)),
    ([i % 2, t], (i, t), (i, t)),
])
def test_strided_readers_are_exact_or_unsupported(phi, sink_dims, source_dims):
    """The readers of a source point form a strided set, not an interval: the inverse must
    not silently cover the gaps (a slice min:max+1 would claim sink points that never read
    the source). Either it is exact, or the pattern is reported as unsupported."""
    try:
        inverse = invert_dependence(phi, sink_dims, source_dims, BOUNDS)
    except UnsupportedExpressionError:
        return
    check_inverse(phi, sink_dims, source_dims, inverse)


@pytest.mark.parametrize("phi", [[Slice(0, 0)], [Slice(t + 1, t + 1)], [T], [t + T]],
                         ids=["0:0", "t+1:t+1", "T", "t+T"])
def test_dependence_that_reads_no_point_fails_cleanly(phi):
    """No sink point reads any source point. Whatever the answer (an empty inverse or an
    error), it must not be a raw isl exception: Tempo's errors are TempoErrors."""
    try:
        invert_dependence(phi, (t,), (t,), BOUNDS)
    except TempoError:
        pass


def test_phi_of_the_wrong_length_is_a_value_error():
    with pytest.raises(ValueError):
        invert_dependence([t, t], (t,), (t,), BOUNDS)
