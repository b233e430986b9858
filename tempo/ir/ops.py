"""Operator definitions as data: one ``OpDef`` per op, registered where it is defined.

Each definition carries its shape rule (``infer``: input types and params → output types)
and its kernel, written once against an array module ``xp`` (``numpy`` or ``jax.numpy``)
so that the reference evaluator and every backend share one meaning. Host ops (symbol
values, point coordinates, UDFs) run on the host with the point they execute at; random
draws are device ops of the point's coordinates (``tempo.ir.random``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tempo.errors import ShapeError
from tempo.ir import random
from tempo.ir.types import Shape, TensorType, same_dim
from tempo.symbolic.expr import Expr, as_expr, compile_vectorized, const

Kernel = Callable[..., Any]
InferRule = Callable[..., tuple[TensorType, ...]]


@dataclass(frozen=True)
class OpDef:
    """What an op is: its shape rule and its kernel.

    ``kernel(xp, params, *inputs)`` for device ops, ``kernel(params, point, *inputs)``
    (numpy in, numpy out) for host ops. Kernels return one array, or a tuple when
    ``multi_output``.
    """

    name: str
    infer: InferRule
    kernel: Kernel | None
    host: bool = False
    multi_output: bool = False
    conditional_inputs: bool = False
    """Whether input edges may carry a condition (merge branches, reader sums)."""
    batched: Kernel | None = None
    """For host ops without inputs whose value is a function of the point (symbol values,
    coordinates): ``batched(params, point, count)`` computes ``count`` points at once,
    each coordinate in ``point`` an array, and returns them stacked on a first axis."""
    # What the passes need to know of an op (each pass derives its sets of kinds from these):
    elementwise: bool = False
    """Applied entry by entry, its inputs broadcast against each other."""
    reduction: bool = False
    """Reduces its input over the axes ``dims`` (kept with size 1 under ``keepdims``)."""
    along_dim: bool = False
    """Works along the one axis ``dim`` of its first input; every other axis is a batch axis."""
    linear: tuple[int, ...] = ()
    """The inputs its value is linear in, with the other inputs held fixed: each on its own
    (``mul``), or all together where the op is ``additive``."""
    additive: bool = False
    """Its value is a sum of one term per input of ``linear`` (``add``; ``where``'s branches)."""
    keeps_zero: bool = False
    """Elementwise with one operand, and 0 where that operand is 0."""
    pure: bool = True
    """Its value is a function of its inputs, params and point (a UDF's host code may keep
    state; a random draw is keyed by its point, so it is pure)."""
    derivatives: tuple[Callable[..., Any] | None, ...] = ()
    """For an elementwise op: per input, ``d(g, *inputs, out)``, the cotangent ``g`` times
    the partial derivative of the output in that input (None: no gradient flows to it),
    written with the operators and methods of the tensors given (autodiff gives recurrent
    tensors, and sums broadcast axes back itself). Other ops have their gradient rule in
    ``tempo.api.autodiff.VJPS``."""


OPS: dict[str, OpDef] = {}


def register(name: str, infer: InferRule, kernel: Kernel | None, **flags: Any) -> OpDef:
    OPS[name] = OpDef(name, infer, kernel, **flags)
    return OPS[name]


def kinds_with(trait: str) -> frozenset[str]:
    """The kinds of the ops registered so far that have ``trait`` (an ``OpDef`` field) set."""
    return frozenset(name for name, d in OPS.items() if getattr(d, trait))


def op_def(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"no definition for op {name!r}") from None


# ---- shape helpers ------------------------------------------------------------------
def broadcast_shapes(*shapes: Shape) -> Shape:
    ndim = max(len(s) for s in shapes)
    out = []
    for k in range(ndim):
        dims = [s[k - ndim + len(s)] for s in shapes if k - ndim + len(s) >= 0]
        non_one = [d for d in dims if not (d.is_const and d.value == 1)]
        if any(not same_dim(d, non_one[0]) for d in non_one):
            raise ShapeError(f"shapes {' and '.join(map(_fmt, shapes))} cannot be broadcast")
        out.append(non_one[0] if non_one else const(1))
    return tuple(out)


def _fmt(shape: Shape) -> str:
    return f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"


def normalize_dim(dim: int, ndim: int) -> int:
    if not -ndim <= dim < ndim:
        raise ShapeError(f"dim {dim} is out of range for a tensor with {ndim} dims")
    return dim % ndim


def result_dtype(*dtypes: Any) -> str:
    """Promotion as in JAX: floats win over ints without widening (int32 * float32 is
    float32); within a kind, the wider type."""
    return _result_dtype(tuple(np.dtype(d) for d in dtypes))


@functools.cache
def _result_dtype(dtypes: tuple[np.dtype, ...]) -> str:
    kinds = {d.kind for d in dtypes}
    floats = [d for d in dtypes if d.kind in "fc"]
    if floats and kinds - {"f", "c"}:
        return np.result_type(*floats).name
    return np.result_type(*dtypes).name


def _promote(a: Any, b: Any) -> tuple[Any, Any]:
    """Both operands in their common dtype (kernels run per point: no copy when it holds)."""
    if a.dtype == b.dtype:
        return a, b
    dtype = result_dtype(a.dtype, b.dtype)
    return a.astype(dtype, copy=False), b.astype(dtype, copy=False)


def _same(t: TensorType, **_: Any) -> tuple[TensorType, ...]:
    return (t,)


# ---- elementwise ----------------------------------------------------------------------
def _mask(condition: Any, like: Any) -> Any:
    """1 where ``condition`` holds, else 0, in ``like``'s dtype."""
    return condition.astype(like.dtype)


_UNARY = {"neg": "negative", "exp": "exp", "log": "log", "tanh": "tanh", "sqrt": "sqrt",
          "abs": "abs", "sin": "sin", "cos": "cos", "not": "logical_not", "floor": "floor"}
_UNARY_DERIVATIVES = {
    "neg": lambda g, x, o: -g,
    "exp": lambda g, x, o: g * o,
    "log": lambda g, x, o: g / x,
    "tanh": lambda g, x, o: g * (1.0 - o * o),
    "sqrt": lambda g, x, o: g * 0.5 / o,
    "abs": lambda g, x, o: g * (_mask(x > 0, g) - _mask(x < 0, g)),
    "sin": lambda g, x, o: g * x.cos(),
    "cos": lambda g, x, o: -g * x.sin(),
    "not": None, "floor": None,  # piecewise constant, or boolean: no gradient
}
_KEEPS_ZERO = frozenset({"neg", "tanh", "sqrt", "abs", "sin", "floor"})
for _name, _fn in _UNARY.items():
    register(_name, _same, (lambda fn: lambda xp, p, x: getattr(xp, fn)(x))(_fn), elementwise=True,
             keeps_zero=_name in _KEEPS_ZERO, linear=(0,) if _name == "neg" else (),
             derivatives=(_UNARY_DERIVATIVES[_name],))

_ARITH = {"add": "add", "sub": "subtract", "mul": "multiply", "pow": "power",
          "maximum": "maximum", "minimum": "minimum", "mod": "mod", "floordiv": "floor_divide"}


def _chosen(mine: Any, tie: Any, g: Any) -> Any:
    """maximum/minimum: the cotangent goes to the chosen input, half each on ties (as JAX)."""
    return g * (_mask(mine, g) + 0.5 * _mask(tie, g))


_ARITH_DERIVATIVES = {
    "add": (lambda g, a, b, o: g, lambda g, a, b, o: g),
    "sub": (lambda g, a, b, o: g, lambda g, a, b, o: -g),
    "mul": (lambda g, a, b, o: g * b, lambda g, a, b, o: g * a),
    # d/db a**b = log(a) a**b, taken as 0 where a = 0 (log(1) there)
    "pow": (lambda g, a, b, o: g * b * a ** (b - 1), lambda g, a, b, o: g * (a + _mask(a == 0, a)).log() * o),
    "maximum": (lambda g, a, b, o: _chosen(a > b, a == b, g), lambda g, a, b, o: _chosen(b > a, a == b, g)),
    "minimum": (lambda g, a, b, o: _chosen(a < b, a == b, g), lambda g, a, b, o: _chosen(b < a, a == b, g)),
    "mod": (lambda g, a, b, o: g, lambda g, a, b, o: -g * (a / b).floor()),
    "floordiv": (None, None),
}
_COMPARE = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
            "gt": "greater", "ge": "greater_equal", "and": "logical_and", "or": "logical_or"}


def _infer_binary(a: TensorType, b: TensorType, *, out_dtype: str | None = None) -> tuple[TensorType]:
    return (TensorType(broadcast_shapes(a.shape, b.shape), out_dtype or result_dtype(a.dtype, b.dtype)),)


for _name, _fn in _ARITH.items():
    register(_name, _infer_binary,
             (lambda fn: lambda xp, p, a, b: getattr(xp, fn)(*_promote(a, b)))(_fn), elementwise=True,
             linear=(0, 1) if _name in ("add", "sub", "mul") else (), additive=_name in ("add", "sub"),
             derivatives=_ARITH_DERIVATIVES[_name])
for _name, _fn in _COMPARE.items():
    register(_name, lambda a, b: _infer_binary(a, b, out_dtype="bool"),
             (lambda fn: lambda xp, p, a, b: getattr(xp, fn)(*_promote(a, b)))(_fn), elementwise=True,
             derivatives=(None, None))


def _infer_div(a: TensorType, b: TensorType) -> tuple[TensorType]:
    dtype = result_dtype(a.dtype, b.dtype)
    return _infer_binary(a, b, out_dtype=dtype if np.dtype(dtype).kind == "f" else "float32")


def _div(xp: Any, p: dict, a: Any, b: Any) -> Any:
    dtype = result_dtype(a.dtype, b.dtype)
    dtype = dtype if np.dtype(dtype).kind == "f" else "float32"
    return xp.true_divide(a.astype(dtype), b.astype(dtype))


register("div", _infer_div, _div, elementwise=True, linear=(0,),
         derivatives=(lambda g, a, b, o: g / b, lambda g, a, b, o: -g * a / (b * b)))


def _infer_where(c: TensorType, a: TensorType, b: TensorType) -> tuple[TensorType]:
    if c.dtype != "bool":
        raise ShapeError(f"where needs a bool condition, got {c.dtype}")
    return (TensorType(broadcast_shapes(c.shape, a.shape, b.shape), result_dtype(a.dtype, b.dtype)),)


register("where", _infer_where, lambda xp, p, c, a, b: xp.where(c, *_promote(a, b)), elementwise=True,
         linear=(1, 2), additive=True)
register("astype", lambda x, dtype: (TensorType(x.shape, dtype),),
         lambda xp, p, x: x.astype(p["dtype"]), elementwise=True, linear=(0,), keeps_zero=True)


# ---- matmul -----------------------------------------------------------------------------
def _infer_matmul(a: TensorType, b: TensorType) -> tuple[TensorType]:
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul needs tensors with at least one dim")
    k_a = a.shape[-1]
    k_b = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if not same_dim(k_a, k_b):
        raise ShapeError(f"matmul of {_fmt(a.shape)} @ {_fmt(b.shape)}: "
                         f"contracted dims {k_a} and {k_b} differ")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    rows = a.shape[-2:-1]
    cols = b.shape[-1:] if b.ndim >= 2 else ()
    return (TensorType((*batch, *rows, *cols), result_dtype(a.dtype, b.dtype)),)


register("matmul", _infer_matmul, lambda xp, p, a, b: xp.matmul(*_promote(a, b)), linear=(0, 1))


# ---- reductions and scans -------------------------------------------------------------
def _infer_reduce(x: TensorType, dims: tuple[int, ...], keepdims: bool,
                  out_dtype: str | None = None) -> tuple[TensorType]:
    dims = tuple(normalize_dim(d, x.ndim) for d in dims)
    shape = tuple(const(1) if k in dims else d for k, d in enumerate(x.shape)
                  if keepdims or k not in dims)
    return (TensorType(shape, out_dtype or x.dtype),)


_REDUCE = {"sum": "sum", "prod": "prod", "max": "max", "min": "min"}
for _name, _fn in _REDUCE.items():
    register(f"reduce_{_name}", _infer_reduce,
             (lambda fn: lambda xp, p, x: getattr(xp, fn)(x, axis=p["dims"], keepdims=p["keepdims"]))(_fn),
             reduction=True, linear=(0,) if _name == "sum" else ())


def _infer_mean(x: TensorType, dims: tuple[int, ...], keepdims: bool) -> tuple[TensorType]:
    dtype = x.dtype if np.dtype(x.dtype).kind == "f" else "float32"
    return _infer_reduce(x, dims, keepdims, dtype)


register("reduce_mean", _infer_mean,
         lambda xp, p, x: xp.mean(x, axis=p["dims"], keepdims=p["keepdims"]).astype(
             x.dtype if x.dtype.kind == "f" else "float32"), reduction=True, linear=(0,))


def _infer_scan(x: TensorType, dim: int, **_: Any) -> tuple[TensorType]:
    normalize_dim(dim, x.ndim)
    return (x,)


register("cumsum", _infer_scan, lambda xp, p, x: xp.cumsum(x, axis=p["dim"]).astype(x.dtype), along_dim=True,
         linear=(0,))


def _infer_linear_recurrence(c: TensorType, d: TensorType, dim: int, forward: bool) -> tuple[TensorType]:
    at = normalize_dim(dim, d.ndim)
    if c.dtype != d.dtype or len(c.shape) != len(d.shape) or not all(
            same_dim(a, b) for k, (a, b) in enumerate(zip(c.shape, d.shape)) if k != at):
        raise ShapeError(f"a linear recurrence's coefficients {c.dtype}{_fmt(c.shape)} and terms "
                         f"{d.dtype}{_fmt(d.shape)} differ but along dim {dim}")
    return (d,)


def _linear_recurrence(xp: Any, p: dict, c: Any, d: Any) -> Any:
    """``x[k] = d[k] + c[k] * x[k + 1]`` along ``dim``, from ``x[last] = d[last]``, with
    ``c`` holding the first ``n - 1`` rows' coefficients or all ``n`` (the last unused)
    (``forward``: ``x[k] = d[k] + c[k] * x[k - 1]`` from ``x[0] = d[0]``, ``c`` the last
    ``n - 1`` rows' or all, the first unused), in log2 ``n`` doubling steps (each row
    composes the next ``2^r`` rows' affine maps) of array operations alone, with no
    sequential loop (NumPy, and JAX off a CPU). A namespace with its own
    ``linear_recurrence(c, d, dim, forward)`` runs that instead (JAX on a CPU: a
    sequential scan, ``tempo.runtime.backends.XlaNamespace``)."""
    dim = p["dim"] % d.ndim
    own = getattr(xp, "linear_recurrence", None)
    if own is not None:
        return own(c, d, dim, p["forward"])
    x, a = xp.moveaxis(d, dim, 0), xp.moveaxis(c, dim, 0)
    if p["forward"]:
        x, a = x[::-1], a[::-1]
    n, s = x.shape[0], 1
    a = xp.concatenate([a[:n - 1], xp.zeros((1, *x.shape[1:]), x.dtype)])  # (an unused row: 0, not inf)
    while s < n:
        pad = xp.zeros((s, *x.shape[1:]), x.dtype)
        x = x + a * xp.concatenate([x[s:], pad])
        if 2 * s < n:
            a = a * xp.concatenate([a[s:], pad])
        s *= 2
    if p["forward"]:
        x = x[::-1]
    return xp.moveaxis(x, 0, dim).astype(d.dtype)


register("linear_recurrence", _infer_linear_recurrence, _linear_recurrence)


def _infer_discounted_sum(x: TensorType, dim: int, gamma: float) -> tuple[TensorType]:
    return _infer_reduce(x, (dim,), False)


def _discounted_sum(xp: Any, p: dict, x: Any) -> Any:
    """sum_k gamma^k x[k] along ``dim``."""
    dim = p["dim"] % x.ndim
    weights = xp.asarray(p["gamma"] ** np.arange(x.shape[dim]), dtype=x.dtype)
    return xp.tensordot(weights, xp.moveaxis(x, dim, 0), axes=1).astype(x.dtype)


register("discounted_sum", _infer_discounted_sum, _discounted_sum, along_dim=True, linear=(0,))


# ---- layout ---------------------------------------------------------------------------
def _numel(shape: Shape) -> Expr:
    out: Expr = const(1)
    for d in shape:
        out = out * d
    return out


def _infer_reshape(x: TensorType, shape: Shape) -> tuple[TensorType]:
    shape = tuple(as_expr(d) for d in shape)
    if all(d.is_const for d in (*x.shape, *shape)) and _numel(x.shape) is not _numel(shape):
        raise ShapeError(f"cannot reshape {_fmt(x.shape)} into {_fmt(shape)}")
    return (TensorType(shape, x.dtype),)


register("reshape", _infer_reshape, lambda xp, p, x: xp.reshape(x, p["shape"]), linear=(0,))


def _infer_permute(x: TensorType, dims: tuple[int, ...]) -> tuple[TensorType]:
    if sorted(normalize_dim(d, x.ndim) for d in dims) != list(range(x.ndim)):
        raise ShapeError(f"permute dims {dims} are not a permutation of {x.ndim} dims")
    return (TensorType(tuple(x.shape[d] for d in dims), x.dtype),)


register("permute", _infer_permute, lambda xp, p, x: xp.transpose(x, p["dims"]), linear=(0,))


def _infer_expand(x: TensorType, shape: Shape) -> tuple[TensorType]:
    shape = tuple(as_expr(d) for d in shape)
    if len(shape) < x.ndim:
        raise ShapeError(f"cannot expand {_fmt(x.shape)} to fewer dims {_fmt(shape)}")
    if broadcast_shapes(x.shape, shape) != shape:
        raise ShapeError(f"cannot expand {_fmt(x.shape)} to {_fmt(shape)}")
    return (TensorType(shape, x.dtype),)


register("expand", _infer_expand, lambda xp, p, x: xp.broadcast_to(x, p["shape"]), linear=(0,))


def _infer_squeeze(x: TensorType, dim: int) -> tuple[TensorType]:
    dim = normalize_dim(dim, x.ndim)
    if not (x.shape[dim].is_const and x.shape[dim].value == 1):
        raise ShapeError(f"cannot squeeze dim {dim} of size {x.shape[dim]}")
    return (TensorType(x.shape[:dim] + x.shape[dim + 1:], x.dtype),)


register("squeeze", _infer_squeeze, lambda xp, p, x: xp.squeeze(x, axis=p["dim"]), along_dim=True,
         linear=(0,))


def _infer_unsqueeze(x: TensorType, dim: int) -> tuple[TensorType]:
    dim = normalize_dim(dim, x.ndim + 1)
    return (TensorType(x.shape[:dim] + (const(1),) + x.shape[dim:], x.dtype),)


register("unsqueeze", _infer_unsqueeze, lambda xp, p, x: xp.expand_dims(x, p["dim"]), linear=(0,))


def _infer_cat(*xs: TensorType, dim: int) -> tuple[TensorType]:
    first = xs[0]
    dim = normalize_dim(dim, first.ndim)
    for x in xs[1:]:
        if x.ndim != first.ndim or any(not same_dim(a, b) for k, (a, b)
                                       in enumerate(zip(x.shape, first.shape)) if k != dim):
            raise ShapeError(f"cannot cat {_fmt(first.shape)} with {_fmt(x.shape)} on dim {dim}")
    size: Expr = const(0)
    for x in xs:
        size = size + x.shape[dim]
    shape = first.shape[:dim] + (size,) + first.shape[dim + 1:]
    return (TensorType(shape, result_dtype(*(x.dtype for x in xs))),)


def _same_dtype(xs: tuple) -> list:
    dtype = result_dtype(*(x.dtype for x in xs))
    return [x.astype(dtype) for x in xs]


register("cat", _infer_cat, lambda xp, p, *xs: xp.concatenate(_same_dtype(xs), axis=p["dim"]))


def _infer_stack(*xs: TensorType, dim: int) -> tuple[TensorType]:
    first = xs[0]
    for x in xs[1:]:
        if x.ndim != first.ndim or any(not same_dim(a, b) for a, b in zip(x.shape, first.shape)):
            raise ShapeError(f"cannot stack {_fmt(first.shape)} with {_fmt(x.shape)}")
    dim = normalize_dim(dim, first.ndim + 1)
    shape = first.shape[:dim] + (const(len(xs)),) + first.shape[dim:]
    return (TensorType(shape, result_dtype(*(x.dtype for x in xs))),)


register("stack", _infer_stack, lambda xp, p, *xs: xp.stack(_same_dtype(xs), axis=p["dim"]))


def _infer_slice(x: TensorType, dim: int, start: Expr, stop: Expr) -> tuple[TensorType]:
    dim = normalize_dim(dim, x.ndim)
    shape = x.shape[:dim] + (as_expr(stop) - as_expr(start),) + x.shape[dim + 1:]
    return (TensorType(shape, x.dtype),)


def _slice(xp: Any, p: dict, x: Any) -> Any:
    index = [slice(None)] * x.ndim
    index[p["dim"]] = slice(p["start"], p["stop"])
    return x[tuple(index)]


register("slice", _infer_slice, _slice, along_dim=True, linear=(0,))


def _infer_window(x: TensorType, start: TensorType, dim: int, size: Expr) -> tuple[TensorType]:
    if start.ndim or np.dtype(start.dtype).kind not in "iu":
        raise ShapeError(f"a window's first row is one integer, not {start.dtype}{_fmt(start.shape)}")
    dim = normalize_dim(dim, x.ndim)
    return (TensorType(x.shape[:dim] + (as_expr(size),) + x.shape[dim + 1:], x.dtype),)


def _window(xp: Any, p: dict, x: Any, start: Any) -> Any:
    """``size`` rows of ``x`` along ``dim`` from row ``start`` (an input: one program for
    every start), zeros past its end."""
    dim, size = p["dim"], p["size"]
    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, size)
    return xp.take(xp.pad(x, widths), start + xp.arange(size), axis=dim)


# A slice of varying length padded to ``size`` rows (``tempo.passes.tile``).
register("window", _infer_window, _window)


def _infer_take(x: TensorType, idx: TensorType, dim: int) -> tuple[TensorType]:
    dim = normalize_dim(dim, x.ndim)
    if np.dtype(idx.dtype).kind not in "iu":
        raise ShapeError(f"an index must have an integer dtype, got {idx.dtype}")
    return (TensorType(x.shape[:dim] + idx.shape + x.shape[dim + 1:], x.dtype),)


def _take(xp: Any, p: dict, x: Any, idx: Any) -> Any:
    """Rows ``idx`` of ``x`` along ``dim``. Over a device mesh, a list of indices taking
    leading rows reads ``x`` whole on every device where that costs little more than the
    rows taken (``XlaNamespace.gather_source``), and the rows it takes stay split over the
    devices (``XlaNamespace.split_rows``): a minibatch drawn from a rollout split by env
    is then computed on by every device for its part, and in a loop over minibatches that
    does not change the rollout, XLA copies it once, before the loop."""
    split = getattr(xp, "split_rows", None)
    if split is None or np.ndim(idx) != 1 or normalize_dim(p["dim"], x.ndim) != 0:
        return xp.take(x, idx, axis=p["dim"], mode="clip")
    return split(xp.take(xp.gather_source(x, len(idx)), idx, axis=0, mode="clip"))


# Tensor-valued indices are data: they cannot be checked before running, and a jitted
# kernel cannot raise, so both backends clamp them into range (symbolic and constant
# indices are checked at compile time and at definition).
register("take", _infer_take, _take, linear=(0,))


def _infer_take_along(x: TensorType, idx: TensorType, dim: int) -> tuple[TensorType]:
    normalize_dim(dim, x.ndim)
    if idx.ndim != x.ndim or np.dtype(idx.dtype).kind not in "iu":
        raise ShapeError(f"gather needs an integer index with {x.ndim} dims, got {idx!r}")
    return (TensorType(idx.shape, x.dtype),)


register("gather", _infer_take_along,
         lambda xp, p, x, idx: xp.take_along_axis(x, xp.clip(idx, 0, x.shape[p["dim"]] - 1),
                                                  axis=p["dim"]), linear=(0,))


def _infer_pad(x: TensorType, dim: int, before: Expr, after: Expr) -> tuple[TensorType]:
    dim = normalize_dim(dim, x.ndim)
    size = as_expr(before) + x.shape[dim] + as_expr(after)
    return (TensorType(x.shape[:dim] + (size,) + x.shape[dim + 1:], x.dtype),)


def _pad(xp: Any, p: dict, x: Any) -> Any:
    widths = [(0, 0)] * x.ndim
    widths[p["dim"] % x.ndim] = (p["before"], p["after"])
    return xp.pad(x, widths)


register("pad", _infer_pad, _pad, along_dim=True, linear=(0,))  # zeros before and after along ``dim``


def _infer_argmax(x: TensorType, dim: int) -> tuple[TensorType]:
    return _infer_reduce(x, (dim,), False, "int32")


register("argmax", _infer_argmax,
         lambda xp, p, x: xp.argmax(x, axis=p["dim"]).astype("int32"), along_dim=True)


def _infer_argsort(x: TensorType, dim: int) -> tuple[TensorType]:
    normalize_dim(dim, x.ndim)
    return (TensorType(x.shape, "int32"),)


register("argsort", _infer_argsort,
         lambda xp, p, x: xp.argsort(x, axis=p["dim"], stable=True).astype("int32"), along_dim=True)


def _infer_scatter_take(g: TensorType, idx: TensorType, dim: int, size: Expr) -> tuple[TensorType]:
    shape = g.shape[:dim] + (as_expr(size),) + g.shape[dim + idx.ndim:]
    return (TensorType(shape, g.dtype),)


def _scatter_take(xp: Any, p: dict, g: Any, idx: Any) -> Any:
    """The transpose of ``take``: ``g`` summed into zeros at the (clipped) indices."""
    dim, size = p["dim"], p["size"]
    shape = g.shape[:dim] + (size,) + g.shape[dim + idx.ndim:]
    where = (slice(None),) * dim + (xp.clip(idx, 0, size - 1),)
    if xp is np:
        out = np.zeros(shape, g.dtype)
        np.add.at(out, where, g)
        return out
    return xp.zeros(shape, g.dtype).at[where].add(g)


register("scatter_take", _infer_scatter_take, _scatter_take, linear=(0,))


def _infer_scatter_gather(g: TensorType, idx: TensorType, dim: int, shape: Shape) -> tuple[TensorType]:
    return (TensorType(tuple(as_expr(d) for d in shape), g.dtype),)


def _scatter_gather(xp: Any, p: dict, g: Any, idx: Any) -> Any:
    """The transpose of ``gather``: a one-hot sum along ``dim``."""
    dim = p["dim"] % g.ndim
    size = p["shape"][dim]
    g_last, idx_last = xp.moveaxis(g, dim, -1), xp.moveaxis(xp.clip(idx, 0, size - 1), dim, -1)
    onehot = idx_last[..., None] == xp.arange(size)
    out = (g_last[..., None] * onehot.astype(g.dtype)).sum(axis=-2)
    return xp.broadcast_to(xp.moveaxis(out, -1, dim), tuple(p["shape"])).astype(g.dtype)


register("scatter_gather", _infer_scatter_gather, _scatter_gather, linear=(0,))


# ---- sources ----------------------------------------------------------------------------
register("const", lambda value: (TensorType(value.shape, value.dtype.name),),
         lambda xp, p: xp.asarray(p["value"]))
# Reads its input through the edge's dependence (points or stacked slices) unchanged.
register("identity", lambda x, out_type=None: (out_type or x,), lambda xp, p, x: x, elementwise=True,
         linear=(0,), keeps_zero=True)
# The value unchanged; gradients do not flow through it.
register("detach", _same, lambda xp, p, x: x, elementwise=True, linear=(0,), keeps_zero=True)


def _shard(xp: Any, p: dict, x: Any) -> Any:
    """``x`` unchanged, its axis ``dim`` split over the devices of the backend's mesh
    (``XlaNamespace.place_on_mesh``); a backend without one (NumPy) returns ``x``."""
    place = getattr(xp, "place_on_mesh", None)
    return x if place is None else place(x, p["dim"])


# Where the points of a parallel dim enter the program laid out (tempo.passes.parallel,
# under a ``Distribution``): the value, its axis ``dim`` placed on the device mesh.
register("shard", _same, _shard, along_dim=True, linear=(0,))

register("arange", lambda size, dtype: (TensorType((as_expr(size),), dtype),),
         lambda xp, p: xp.arange(p["size"], dtype=p["dtype"]))


def _mask_rows(xp: Any, p: dict, x: Any, count: Any) -> Any:
    rows = x.shape[p["axis"]]
    valid = (xp.arange(rows) < count).reshape((rows, *(1,) * (-p["axis"] - 1)))
    return xp.where(valid, x, xp.asarray(p["fill"], dtype=x.dtype))


# The rows of axis ``axis`` (from the end) from ``count`` on replaced by ``fill``: the
# padding of a tiled read (``tempo.passes.tile``), masked before a reduction over it.
register("mask_rows", lambda x, count, axis, fill: (x,), _mask_rows)


def _put_row(xp: Any, p: dict, x: Any, row: Any, count: Any) -> Any:
    put = getattr(x, "put_row", None)
    if put is not None:  # rows of a buffer the kernel writes itself (JaxBackend.block_kernel)
        return put(row)
    rows, axis = x.shape[p["axis"]], p["axis"]
    at = (xp.arange(rows) == count - 1).reshape((rows, *(1,) * (x.ndim - axis - 1)))
    return xp.where(at, xp.expand_dims(row, axis), x)


# ``x`` (rows along axis ``axis``, from the start) with row ``count - 1`` replaced by ``row``:
# a tiled read ``k[s:t+1]`` as the earlier rows ``k[s:t]`` (padded as before) and the row
# the reader's own point makes (``tempo.passes.newest``).
register("put_row", lambda x, row, count, axis: (x,), _put_row)


def _eval_symbol(p: dict, point: dict, *inputs: Any) -> np.ndarray:
    return np.asarray(p["expr"].evaluate(point), dtype=p["dtype"])


def _eval_symbol_batched(p: dict, point: dict, count: int) -> np.ndarray:
    names = tuple(point)
    values = _vectorized(p["expr"], names)(*point.values())[0]
    return np.broadcast_to(values, (count,)).astype(p["dtype"])


@functools.cache
def _vectorized(expr: Expr, names: tuple) -> Callable[..., tuple]:
    return compile_vectorized([expr], names)


# ``in_run``: evaluated at the run's own coordinates, not those a resumed run's origin shows
# (honoured by the runtime's host launcher, which every path that runs host ops goes through).
register("eval_symbol", lambda expr, dtype, in_run=False: (TensorType((), dtype),), _eval_symbol,
         host=True, batched=_eval_symbol_batched)


def _coords(p: dict, point: dict, *inputs: Any) -> np.ndarray:
    if "stacked" not in p:
        return np.asarray([point[d] for d in p["dims"]], dtype=np.uint32)
    at, size = p["stacked"]  # the coordinates of every point of a parallel dim laid out
    out = np.empty((size, len(p["dims"])), np.uint32)
    for k, d in enumerate(p["dims"]):
        out[:, k] = _arange_u32(size) if k == at else point[d]
    return out


@functools.cache
def _arange_u32(size: int) -> np.ndarray:
    return np.arange(size, dtype=np.uint32)


def _infer_coords(dims: tuple, stacked: tuple[int, int] | None = None) -> tuple[TensorType]:
    n = as_expr(len(dims))
    return (TensorType((n,) if stacked is None else (as_expr(stacked[1]), n), "uint32"),)


def _coords_batched(p: dict, point: dict, count: int) -> np.ndarray:
    if "stacked" not in p:
        return np.stack([np.broadcast_to(point[d], (count,)) for d in p["dims"]], -1).astype(np.uint32)
    at, size = p["stacked"]
    out = np.empty((count, size, len(p["dims"])), np.uint32)
    for k, d in enumerate(p["dims"]):
        out[:, :, k] = _arange_u32(size) if k == at else np.broadcast_to(point[d], (count,))[:, None]
    return out


# The point's coordinates (as the run sees them, see ``Executable.run``'s origin), which
# random ops encrypt into their draws.
register("coords", _infer_coords, _coords, host=True, batched=_coords_batched)


def _infer_rng(*coords: TensorType, **p: Any) -> tuple[TensorType]:
    batch = (as_expr(p["batch"]),) if "batch" in p else ()  # one draw per row of the coords
    steps = (as_expr(p["steps"]),) if "steps" in p else ()  # and per step (vectorized)
    return (TensorType((*steps, *batch, *p["shape"]), p["dtype"]),)


def _rng(xp: Any, p: dict, *coords: Any) -> Any:
    return random.sample(xp, p, coords[0] if coords else None)


# A draw keyed by (seed, key) and the point's coordinates (its input, when it has a domain).
register("rng", _infer_rng, _rng)


def _udf(p: dict, point: dict, *inputs: Any) -> Any:
    return p["call"](point, *inputs)


register("udf", lambda *inputs, out_types, **_: tuple(out_types), _udf, host=True, multi_output=True,
         pure=False)


def _traced_udf(xp: Any, p: dict, *inputs: Any) -> tuple:
    """A pure JAX function (jitted; inlined when the JAX backend jits around it)."""
    return tuple(xp.asarray(out) for out in p["fn"](*inputs))


register("traced_udf", lambda *inputs, out_types, **_: tuple(out_types), _traced_udf,
         multi_output=True, pure=False)  # an env's step: not merged with another's

# A MergeOp has no kernel: the runtime moves the input of the first branch whose
# condition holds to its output. ``undefined`` (optional): what to tell a user whose
# program needs a point no branch defines (a parameter: the optimizer step).
register("merge", lambda *branches, out_type, undefined=None: (out_type,), None, conditional_inputs=True)
# A reader sum (autodiff's transpose of an edge) has no kernel either: at each point it
# sums the gradient slices of every sink point that read it (see ``tempo.ir.readers``).
register("sum_readers", lambda *inputs, out_type, **_: (out_type,), None, conditional_inputs=True,
         linear=(0,))



def resolve_params(params: dict[str, Any], env: dict) -> dict[str, Any]:
    """Params with every symbolic expression evaluated at ``env`` (for device kernels)."""
    return {k: _resolve(v, env) for k, v in params.items()}


def _resolve(value: Any, env: dict) -> Any:
    if isinstance(value, Expr):
        return value.evaluate(env)
    if isinstance(value, tuple):
        return tuple(_resolve(v, env) for v in value)
    return value


def param_symbols(params: dict[str, Any]) -> frozenset:
    """Every symbol in the params' expressions (shapes, slice bounds)."""
    def symbols(v: Any) -> frozenset:
        if isinstance(v, Expr):
            return v.symbols()
        if isinstance(v, tuple):
            return frozenset().union(*(symbols(x) for x in v))
        return frozenset()
    return frozenset().union(*(symbols(v) for v in params.values()))
