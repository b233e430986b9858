"""Counter-based draws (tempo.ir.random): Threefry-2x32 against its published test vectors
and JAX's implementation, the same bits on NumPy and XLA, and the distributions' moments."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

from tempo.ir import random

U32 = np.uint32


@pytest.mark.parametrize("key,counter,expected", [
    # Random123's known-answer tests for threefry2x32_20: (key, counter) -> output
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
])
def test_threefry_known_answers(key, counter, expected):
    with np.errstate(over="ignore"):
        out = random.threefry2x32(np, tuple(U32(k) for k in key), tuple(U32(c) for c in counter))
    assert tuple(int(v) for v in out) == expected


def test_threefry_equals_jax_on_arrays():
    rng = np.random.default_rng(0)
    key = rng.integers(0, 2 ** 32, 2, dtype=np.uint32)
    counter = rng.integers(0, 2 ** 32, (2, 1000), dtype=np.uint32)
    ours = random.threefry2x32(np, (key[0], key[1]), (counter[0], counter[1]))
    theirs = np.asarray(threefry_2x32(jnp.asarray(key), jnp.asarray(counter.ravel())))
    np.testing.assert_array_equal(np.concatenate(ours), theirs)


DISTS = {
    "uniform": {"dist": "uniform", "low": -1.0, "high": 3.0, "dtype": "float32"},
    "normal": {"dist": "normal", "loc": 0.5, "scale": 2.0, "dtype": "float32"},
    "randint": {"dist": "randint", "low": -3, "high": 4, "dtype": "int32"},
}


def _params(name: str, shape=(200_000,), key=7) -> dict:
    return {**DISTS[name], "shape": shape, "seed": 11, "key": key}


@pytest.mark.parametrize("name", list(DISTS))
def test_numpy_and_xla_draw_the_same_numbers(name):
    coords = np.asarray([3, 1], np.uint32)
    host = random.sample(np, _params(name, (64, 5)), coords)
    device = np.asarray(jax.jit(lambda c: random.sample(jnp, _params(name, (64, 5)), c))(coords))
    assert host.dtype == device.dtype and host.shape == (64, 5)
    if name == "normal":  # log and sqrt may differ in the last bit
        np.testing.assert_allclose(host, device, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(host, device)


def test_moments_match_the_distributions():
    coords = np.asarray([0], np.uint32)
    u = random.sample(np, _params("uniform"), coords)
    assert u.min() >= -1.0 and u.max() < 3.0
    assert abs(u.mean() - 1.0) < 0.02 and abs(u.var() - 16 / 12) < 0.02
    z = random.sample(np, _params("normal"), coords)
    assert abs(z.mean() - 0.5) < 0.02 and abs(z.std() - 2.0) < 0.02
    assert abs(((z - 0.5) / 2.0 > 1.96).mean() - 0.025) < 0.003  # the tail, not just moments
    k = random.sample(np, _params("randint"), coords)
    counts = np.bincount(k - -3, minlength=7)
    assert len(counts) == 7 and np.abs(counts / len(k) - 1 / 7).max() < 0.005


def test_normal_draws_are_the_inverse_cdf_of_their_uniform_words():
    """Every 24-bit input, against float64's inverse normal CDF (scipy's ``ndtri``)."""
    from scipy.special import ndtri
    top = np.arange(2 ** 24, dtype=np.uint32)
    bits = top << np.uint32(8) | np.uint32(0xAB)  # the low bits are not used
    z = random.standard_normal(np, bits)
    u = (2.0 * top.astype(np.float64) + 1.0) / 2.0 ** 25  # the open interval's points, as probabilities
    exact = ndtri(u)
    assert z.dtype == np.float32 and np.all(np.diff(z) > 0)  # strictly increasing in the word
    np.testing.assert_allclose(z, exact, rtol=5e-7, atol=1e-7)
    assert z[0] == -z[-1] and abs(z[-1] - 5.42) < 0.01  # symmetric; tails to 5.4 sigma


def test_points_and_keys_give_independent_draws():
    a = random.sample(np, _params("uniform", (10_000,)), np.asarray([0, 1], np.uint32))
    again = random.sample(np, _params("uniform", (10_000,)), np.asarray([0, 1], np.uint32))
    other_point = random.sample(np, _params("uniform", (10_000,)), np.asarray([1, 0], np.uint32))
    other_key = random.sample(np, _params("uniform", (10_000,), key=8), np.asarray([0, 1], np.uint32))
    np.testing.assert_array_equal(a, again)
    for b in (other_point, other_key):
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.05 and not np.array_equal(a, b)


@pytest.mark.parametrize("low,high,dtype,message", [
    (0, 1_500_000_000, "int32", "cannot draw uniformly"),  # 32 bits mod 1.5e9: 30% of values favoured
    (0, 300, "int8", "does not fit int8"),
    (0, 4, "float32", "draws integers"),
])
def test_randint_rejects_ranges_it_cannot_draw_exactly(low, high, dtype, message):
    import tempo as tp
    ctx = tp.Context(dims=("t",))
    with ctx, pytest.raises(tp.ShapeError, match=message):
        tp.randint(low, high, (3,), dtype=dtype)


def test_randint_allows_powers_of_two_and_small_remainders():
    import tempo as tp
    ctx = tp.Context(dims=("t",))
    with ctx:
        tp.randint(0, 2 ** 31, (3,))       # divides 2**32: no value favoured
        tp.randint(0, 2 ** 31 - 1, (3,))   # 2 of 2**31 - 1 values favoured by 2**-31
        tp.randint(-5, 60_000, (3,))


def test_rows_of_a_draw_over_a_mesh_fold_their_own_shared_coordinates():
    """One draw per row of coordinates whose first columns are the same in every row:
    without a mesh they are folded once (from row 0); over a device mesh each row folds
    its own (row 0 would be sent to every device at each draw). The words are the same,
    and the same as with nothing shared."""

    class OnAMesh:  # NumPy, as a namespace traced over a mesh is
        mesh_key = (("b",), (0, 1))

        def __getattr__(self, name):
            return getattr(np, name)
    rows = np.array([[7, 3, b] for b in range(5)], U32)  # (iteration, step, env) per row
    once = random.random_bits(np, 11, 5, rows, 4, shared=2, counted=True)
    each = random.random_bits(OnAMesh(), 11, 5, rows, 4, shared=2, counted=True)
    plain = random.random_bits(np, 11, 5, rows, 4, shared=0, counted=True)
    for a, b, c in zip(once, each, plain):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    # Which row the mesh reads: with columns that differ between rows (outside the
    # contract, to tell the two apart), each row's own words, not row 0's.
    rows[:, 0] = np.arange(5)
    each = random.random_bits(OnAMesh(), 11, 5, rows, 4, shared=2, counted=True)
    plain = random.random_bits(np, 11, 5, rows, 4, shared=0, counted=True)
    once = random.random_bits(np, 11, 5, rows, 4, shared=2, counted=True)
    np.testing.assert_array_equal(each[0], plain[0])
    assert (each[0][1:] != once[0][1:]).any()
