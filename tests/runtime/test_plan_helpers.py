"""Small helpers of the loop planner and of vectorized index functions, against NumPy's
own functions as the reference."""

import numpy as np
import pytest

from tempo.runtime.plan import _same
from tempo.runtime.stores import _by_prefix
from tempo.symbolic.expr import _broadcast

BASE = np.arange(12).reshape(3, 4)
ARRAYS = [
    np.arange(6), np.arange(6, dtype=np.int32), np.arange(6) + 1, np.arange(7), BASE[:, 1],
    BASE.T[1].copy(), BASE[::2, ::2].ravel(), np.broadcast_to(np.int64(4), (6,)), np.full(6, 4),
    np.array(3), np.array(3, np.int32), np.array([True, False]), np.array([1, 0]),
    np.array([1.0, np.nan]), np.array([0.0, -0.0]), np.array([-0.0, 0.0]), 3, 3.0,
    np.arange(6).reshape(2, 3), np.array([3]),
]


@pytest.mark.parametrize("a", range(len(ARRAYS)))
def test_same_is_array_equal(a):
    """``_same`` answers as ``np.array_equal`` for every pair: contiguous or not,
    broadcast, other dtypes, 0-d, booleans, floats (NaN, signed zeros), Python scalars."""
    for b in ARRAYS:
        assert _same(ARRAYS[a], b) == np.array_equal(ARRAYS[a], b), (ARRAYS[a], b)


@pytest.mark.parametrize("value", [7, True, 2.5, np.int32(3), np.bool_(False), np.array(5, np.int16)])
@pytest.mark.parametrize("shape", [(4,), (2, 3), ()])
def test_broadcast_gives_a_scalar_the_shape_and_dtype_numpy_gives_it(value, shape):
    """A scalar broadcast with an array of ``shape`` has the values, shape and dtype of
    ``np.broadcast_to``'s; an array of that shape comes back as it is."""
    array = np.zeros(shape, np.int64)
    spread, same = _broadcast((value, array), ((), shape))
    expected = np.broadcast_to(value, shape)
    assert same is array
    assert np.shape(spread) == expected.shape and np.asarray(spread).dtype == expected.dtype
    np.testing.assert_array_equal(spread, expected)


def test_broadcast_spreads_arrays_of_other_shapes_as_numpy_does():
    """Values of different shapes come out with the shape ``np.broadcast_shapes`` gives
    and ``np.broadcast_to``'s values."""
    row, column = np.arange(3).reshape(1, 3), np.arange(2).reshape(2, 1)
    out = _broadcast((row, column, 4), ((1, 3), (2, 1), ()))
    for got, value in zip(out, (row, column, 4)):
        np.testing.assert_array_equal(got, np.broadcast_to(value, (2, 3)))


@pytest.mark.parametrize("points", [
    [(3, 0), (3, 1), (3, 5)], [(3, 0), (4, 1), (3, 2)], [(1, 2, 0), (1, 2, 4), (1, 3, 1), (1, 2, 4)],
    [(0,), (5,), (2,)], [], [(7, 7)],
])
def test_by_prefix_groups_as_a_dictionary_does(points):
    """``_by_prefix`` groups points by all coordinates but the last, in order, with their
    rows, as a plain per-point dictionary grouping does (the first and last points sharing
    a prefix that a middle one does not included)."""
    rows = [10 + n for n in range(len(points))]
    expected: dict = {}
    for point, row in zip(points, rows):
        ks, taken = expected.setdefault(point[:-1], ([], []))
        ks.append(point[-1])
        taken.append(row)
    assert _by_prefix(points, rows) == expected
    assert {prefix: ks for prefix, (ks, _) in _by_prefix(points).items()} == \
        {prefix: ks for prefix, (ks, _) in expected.items()}


def test_canonical_merges_keep_the_branch_each_iteration_takes():
    """A merge's row keeps the taken branches' slots only, ordered by what they read, and
    each iteration's branch number points at the slot its input had: two entries taking
    different inputs that read the same kinds of value get equal rows. A branch taken
    without a slot is refused (the loop is then interpreted), never read as another."""
    from tempo.errors import Unlowerable
    from tempo.runtime.plan import Slot, _canonical_merges
    unused, const, carry = Slot("unused"), Slot("const", 0), Slot("carry", (7, 0))
    first = ((const, unused, carry),)
    later = ((unused, const, carry),)
    rows_first, ordinals_first = _canonical_merges(first, {0: np.array([0, 2, 2])}, ["m"])
    rows_later, ordinals_later = _canonical_merges(later, {0: np.array([1, 2, 2])}, ["m"])
    assert rows_first == rows_later == ((carry, const),)
    for (original,), rows, ordinals, chosen in ((first, rows_first, ordinals_first, [0, 2, 2]),
                                                (later, rows_later, ordinals_later, [1, 2, 2])):
        assert [rows[0][ordinals[0][k]] for k in chosen] == [original[k] for k in chosen]
    with pytest.raises(Unlowerable, match="m takes a branch"):
        _canonical_merges(first, {0: np.array([1, 2])}, ["m"])


def test_seeds_start_a_carry_only_where_no_other_value_would():
    """``LoopPlanner._seeded`` on hand-made rows (4 iterations, execs 0-4 merges, each
    reading a carry from iteration 1 on): a merge taking a constant at iteration 0 seeds
    its carry (the constants after it renumbered); one whose first point was made before
    the loop (it runs from iteration 1, masked) seeds its carry with its own initial value
    and is no longer masked. Not seeded: a carry a stored point starts already, a masked
    carry, a carry another merge seeded first, a merge taking its constant later."""
    from types import SimpleNamespace

    from tempo.runtime.plan import LoopPlanner, Slot
    carry = [Slot("carry", (10 + n, 0)) for n in range(6)]
    slots = ((Slot("const", 0), carry[0]),          # 0: seeds carry 0
             (Slot("const", 1), carry[1]),          # 1: carry 1 starts from a stored point
             (Slot("const", 2), carry[0]),          # 2: carry 0 seeded by merge 0 already
             (Slot("const", 3), carry[2]),          # 3: carry 2 masked
             (carry[3],),                           # 4: runs from iteration 1 on, masked
             (Slot("body", (20, 0)), Slot("const", 4)))  # 5: reads the constant at every iteration
    fetches = [("const", 0, 0, (30, 0)), ("const", 1, 0, (31, 0)), ("init", 6, 0, (11, 0)),
               ("const", 2, 0, (32, 0)), ("const", 3, 0, (33, 0)), ("init", 7, 0, (4, 0)),
               ("const", 5, 1, (34, 0))]
    every, later = np.arange(4), np.arange(1, 4)
    taken = {0: np.array([0, 1, 1, 1]), 1: np.array([0, 1, 1, 1]), 2: np.array([0, 1, 1, 1]),
             3: np.array([0, 1, 1, 1]), 4: np.array([0, 0, 0]), 5: np.array([1, 1, 1, 1])}
    runs = [(every, ()), (every, ()), (every, ()), (every, ()), (later, ()), (every, ())]
    planner = SimpleNamespace(execs=[(SimpleNamespace(id=n), []) for n in range(6)])
    rows, seeded, chosen, masked = LoopPlanner._seeded(planner, slots, fetches, taken, runs,
                                                       {(12, 0), (4, 0)}, 4)
    assert [f for f in seeded if f[0] == "seed"] == [("seed", 0, 0, (10, 0)), ("seed", 7, 0, (13, 0))]
    assert ("init", 7, 0, (4, 0)) in seeded and masked == {(12, 0)}
    assert rows[0] == (Slot("unused"), carry[0]) and chosen[0].tolist() == [1, 1, 1, 1]
    assert rows[1:4] == ((Slot("const", 0), carry[1]), (Slot("const", 1), carry[0]),
                         (Slot("const", 2), carry[2]))  # (renumbered: constant 0 is a seed now)
    assert rows[5] == (Slot("body", (20, 0)), Slot("const", 3))
    assert all(chosen[pos] is taken[pos] for pos in (1, 2, 3, 4, 5))
    consts = [(pos, k) for kind, pos, k, _ in seeded if kind == "const"]
    assert consts == [(1, 0), (2, 0), (3, 0), (5, 1)]  # (in the order of their new numbers)


def test_merges_of_one_constant_from_the_first_iteration_run_at_every_iteration():
    """``LoopPlanner._constant_merges``: a merge taking one constant wherever it runs,
    from the first iteration on, has that value at every iteration (it need not be
    masked); not one that starts later (before, its carry holds another value), nor one
    taking two constants or a carry."""
    from types import SimpleNamespace

    from tempo.runtime.plan import LoopPlanner, Slot
    const, other, carry = Slot("const", 0), Slot("const", 1), Slot("carry", (9, 0))
    slots = ((const, carry), (const, carry), (const, other), (carry, const), (Slot("unused"), const))
    chosen = {0: np.array([0]), 1: np.array([0, 0]), 2: np.array([0, 1]), 3: np.array([0, 0]),
              4: np.array([1, 1, 1])}
    runs = [(np.array([0]), ()), (np.array([3, 4]), ()), (np.array([0, 2]), ()), (np.array([0, 1]), ()),
            (np.array([0, 5, 6]), ())]
    planner = SimpleNamespace(execs=[(SimpleNamespace(id=10 + n), []) for n in range(5)])
    assert LoopPlanner._constant_merges(planner, slots, chosen, runs) == {(10, 0), (14, 0)}
