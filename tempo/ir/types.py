"""Tensor types: a spatial shape (ints or symbolic expressions) and a dtype."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tempo.errors import ShapeError
from tempo.symbolic.expr import Expr, ExprLike, as_expr

Shape = tuple[Expr, ...]


def as_shape(dims) -> Shape:
    return tuple(as_expr(d) for d in dims)


_CANONICAL = frozenset({"float32", "float64", "float16", "int8", "int16", "int32", "int64",
                        "uint8", "uint16", "uint32", "uint64", "bool"})
"""Names that are their own canonical name (a compile makes thousands of types)."""


def dtype_name(dtype) -> str:
    """Canonical dtype name; Python ``float``/``int`` map to float32/int32."""
    if type(dtype) is str and dtype in _CANONICAL:
        return dtype
    if dtype is float:
        return "float32"
    if dtype is int:
        return "int32"
    if dtype is bool:
        return "bool"
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise ShapeError(f"{dtype!r} is not a dtype") from None
    if np.dtype(name).kind not in "biuf":
        raise ShapeError(f"dtype {name} is not supported: use bool, ints or floats")
    return name


@dataclass(frozen=True)
class TensorType:
    shape: Shape
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", as_shape(self.shape))
        object.__setattr__(self, "dtype", dtype_name(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(d.is_const for d in self.shape)

    def nbytes(self, env: dict) -> int | None:
        """Bytes of one value with its dims evaluated in ``env`` (bounds, and a point's
        coordinates where the shape depends on it); None when a dim is not known there."""
        count = 1
        for d in self.shape:
            size = d.substitute(env)
            if not size.is_const:
                return None
            count *= int(size.value)
        return count * np.dtype(self.dtype).itemsize

    def __repr__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


def same_dim(a: ExprLike, b: ExprLike) -> bool:
    return as_expr(a) is as_expr(b)
