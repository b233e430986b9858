"""Counter-based random numbers: a draw is a pure function of (seed, op key, point).

Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2,
3", SC 2011; the generator under ``jax.random``, though our keying differs so the draws
are not ``jax.random``'s) written against an array module, so NumPy and XLA compute the
same bits (normal draws: up to the last bit of log and sqrt). A random op is then
an ordinary kernel: it runs on the device, fuses with its neighbours, and needs no
generator state, so a resumed run or any schedule draws exactly what the uninterrupted
one did.

Keying: the key is ``(seed, op key)``; each coordinate of the point is folded in by one
Threefry call (in the manner of ``jax.random.fold_in``); element ``n`` of the draw is the encryption of
the counter ``(n, 0)``, which gives two 32-bit words per element. Where the last
coordinate is a parallel dim's (``tp.Context(parallel=...)``, keyed last), it is not
folded: the counter is ``(n, b)``, so the draws of every ``b`` at once are one
encryption.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
PARITY = 0x1BD11BDA
_TO_UNIT = 2.0 ** -24
ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
               -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)
"""Polynomials of Giles' single-precision inverse error function ("Approximating the erfinv
function", GPU Computing Gems, 2011), highest degree first: in ``w - 2.5`` where
``w = -log(1 - x^2) < 5``, in ``sqrt(w) - 3`` beyond."""


def threefry2x32(xp: Any, key: tuple[Any, Any], counter: tuple[Any, Any]) -> tuple[Any, Any]:
    """Encrypt ``counter`` (two uint32 arrays) under ``key`` (two uint32 values)."""
    u32 = xp.uint32
    k0, k1 = key
    schedule = (k0, k1, k0 ^ k1 ^ u32(PARITY))
    x0, x1 = counter[0] + k0, counter[1] + k1
    for group in range(5):
        for r in ROTATIONS[group % 2]:
            x0 = x0 + x1
            x1 = (x1 << u32(r)) | (x1 >> u32(32 - r))
            x1 = x1 ^ x0
        x0 = x0 + schedule[(group + 1) % 3]
        x1 = x1 + schedule[(group + 2) % 3] + u32(group + 1)
    return x0, x1


def random_bits(xp: Any, seed: int, key: int, coords: Any, size: int,
                shared: int = 0, counted: bool = False) -> tuple[Any, Any]:
    """Two uint32 words for each of ``size`` elements of the draw at point ``coords`` (of
    each draw, one per row, when ``coords`` is a matrix whose first ``shared`` columns are
    the same in every row). ``counted``: the last coordinate (a parallel dim's) is the
    counter's second word instead of being folded into the key, so that a draw laid out
    over that dim costs one encryption."""
    u32 = xp.uint32
    rows = coords is not None and coords.ndim == 2
    # Over a device mesh the rows may be split: a shared column taken from row 0 would be
    # sent to every device at each draw (an all-reduce in every step of an acting scan),
    # so each row folds its own copy (the same words: the column is the same in each row).
    shared = 0 if getattr(xp, "mesh_key", None) is not None else shared
    with _wrapping(xp):
        k = (u32(seed & 0xFFFFFFFF), u32(key & 0xFFFFFFFF))
        if seed >> 32:  # seeds beyond 32 bits: the high word folded in too
            k = threefry2x32(xp, k, (u32((seed >> 32) & 0xFFFFFFFF), u32(0xFFFFFFFF)))
        folded = (coords.shape[-1] if coords is not None else 0) - int(counted)
        for n in range(folded):
            column = coords[0, n] if rows and n < shared else coords[..., n]
            k = threefry2x32(xp, k, (column, u32(n)))
        counter = xp.arange(size, dtype=xp.uint32)
        word = coords[..., -1] if counted else u32(0)
        if rows:  # one row of coordinates per draw
            k = tuple(x[:, None] if getattr(x, "ndim", 0) else x for x in k)
            counter = counter[None, :]
            word = word[:, None] if counted else word
        return threefry2x32(xp, k, (counter + xp.zeros_like(word), word + xp.zeros_like(counter)))


def unit_interval(xp: Any, bits: Any) -> Any:
    """Floats in ``[0, 1)`` from the top 24 bits (exact in float32)."""
    return (bits >> xp.uint32(8)).astype(xp.float32) * xp.float32(_TO_UNIT)


def open_interval(xp: Any, bits: Any) -> Any:
    """Floats in ``(-1, 1)`` from the top 24 bits: odd multiples of ``2^-24``, exact in
    float32 and symmetric about 0."""
    odd = (bits >> xp.uint32(8)).astype(xp.int32) * 2 + (1 - 2 ** 24)
    return odd.astype(xp.float32) * xp.float32(_TO_UNIT)


def standard_normal(xp: Any, bits: Any) -> Any:
    """Standard normal floats from 32-bit words by the inverse CDF, ``sqrt(2) erfinv(x)``
    with ``x`` uniform on ``(-1, 1)`` (tails to 5.4 sigma). Polynomials and one log and sqrt,
    where Box-Muller's cosine alone costs three times as much on XLA's CPU backend."""
    x = open_interval(xp, bits)
    one = xp.float32(1.0)
    w = -xp.log((one - x) * (one + x))  # (1 - x) and (1 + x) are exact where either is small
    central = _horner(xp, ERFINV_CENTRAL, w - xp.float32(2.5))
    tail = _horner(xp, ERFINV_TAIL, xp.sqrt(w) - xp.float32(3.0))
    return xp.float32(np.sqrt(2.0)) * xp.where(w < xp.float32(5.0), central, tail) * x


def _horner(xp: Any, coefficients: tuple[float, ...], w: Any) -> Any:
    value = xp.float32(coefficients[0])
    for c in coefficients[1:]:
        value = xp.float32(c) + value * w
    return value


def sample(xp: Any, p: dict, coords: Any = None) -> Any:
    """The draw of distribution ``p["dist"]`` (uniform, normal, randint) at ``coords``
    (``p["batch"]`` draws, one per row of ``coords``, when a parallel dim was laid out;
    and ``p["steps"]`` of those, one per leading row, when the step dim was vectorized:
    each the draw at its own coordinates, bit for bit)."""
    if "steps" in p:
        steps, batch = int(p["steps"]), int(p.get("batch", 1))
        flat = {k: v for k, v in p.items() if k != "steps"}
        draws = sample(xp, {**flat, "batch": steps * batch}, coords.reshape(-1, coords.shape[-1]))
        return draws.reshape((steps, *((batch,) if "batch" in p else ()), *draws.shape[1:]))
    shape = tuple(int(d) for d in p["shape"])
    size = int(np.prod(shape, dtype=np.int64))
    if "batch" in p:  # a parallel dim laid out: one draw per row of ``coords``
        shape = (int(p["batch"]), *shape)
    a, b = random_bits(xp, p["seed"], p["key"], coords, size, p.get("shared", 0), p.get("counted", False))
    if p["dist"] == "uniform":  # below high even where float32 rounding would reach it
        u = unit_interval(xp, a)
        top = np.nextafter(np.float32(p["high"]), np.float32(p["low"]))
        out = xp.minimum(p["low"] + (p["high"] - p["low"]) * u, top)
    elif p["dist"] == "normal":
        out = standard_normal(xp, a) * p["scale"] + p["loc"]
    elif p["dist"] == "randint":
        span = p["high"] - p["low"]
        with _wrapping(xp):
            out = (a % xp.uint32(span)).astype(p["dtype"]) + xp.asarray(p["low"], p["dtype"])
    else:
        raise ValueError(f"unknown distribution {p['dist']!r}")
    # randint: 32 random bits modulo the range; ``tp.randint`` only allows ranges where the
    # values that come up once more than the others are a negligible share (see there)
    return out.reshape(shape).astype(p["dtype"])


def _wrapping(xp: Any) -> contextlib.AbstractContextManager:
    """uint32 arithmetic wraps around by design; NumPy would warn on scalars."""
    return np.errstate(over="ignore") if xp is np else contextlib.nullcontext()
