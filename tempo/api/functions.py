"""Free functions of the public API: sources, selection, UDFs, sinks and random tensors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tempo.api.context import Context, active_context
from tempo.api.tensor import RecurrentTensor, constant, lift
from tempo.api.tensor import symbol_value as _symbol_value
from tempo.errors import DomainError, ShapeError, StopRun, UDFError, user_site
from tempo.ir.graph import Op
from tempo.ir.types import TensorType, dtype_name
from tempo.symbolic.expr import Expr, ExprLike, Symbol, as_expr, maximum, minimum


def const(value: Any, dtype: Any = None, requires_grad: bool = False) -> RecurrentTensor:
    """A constant tensor (empty domain). float64 and int64 arrays become float32 and int32.

    With ``requires_grad``, ``backward()`` computes its gradient (``x.grad``)."""
    return constant(active_context(), value, dtype, requires_grad)


def placeholder(shape: Sequence[ExprLike] = (), dtype: Any = "float32",
                domain: Sequence[Symbol] | None = None) -> RecurrentTensor:
    """A tensor defined by branch assignments (``y[0] = ...``, ``y[t+1] = ...``).

    ``domain`` defaults to every dim of the context.
    """
    ctx = active_context()
    dims = ctx.dims if domain is None else ctx.ordered(domain)
    out_type = TensorType(tuple(shape), dtype_name(dtype))
    op = ctx.add_op("merge", [], {"out_type": out_type}, domain=dims, phis=[],
                    label=_assigned_name(user_site().line) or "placeholder")
    return RecurrentTensor(ctx, op)


def _assigned_name(line: str) -> str | None:
    """``y`` for a source line ``y = tp.placeholder(...)``."""
    target, sep, _ = line.partition("=")
    target = target.strip()
    return target if sep and target.isidentifier() else None


def symbol_value(expr: ExprLike, dtype: Any = "int32") -> RecurrentTensor:
    """An int RT whose value at each point is ``expr`` evaluated there."""
    return _symbol_value(active_context(), expr, dtype_name(dtype))


def _context_of(*values: Any) -> Context:
    for v in values:
        if isinstance(v, RecurrentTensor):
            return v.ctx
    return active_context()


def where(cond: Any, a: Any, b: Any) -> RecurrentTensor:
    """Elementwise ``a if cond else b``."""
    ctx = _context_of(cond, a, b)
    like = next((v for v in (a, b) if isinstance(v, RecurrentTensor)), None)
    c = lift(ctx, cond)
    if c.dtype != "bool":
        c = c.astype("bool")
    a_rt = lift(ctx, a, like=like)
    return c.apply("where", a_rt, lift(ctx, b, like=a_rt))


def max(a: Any, b: Any) -> Any:  # noqa: A001 - mirrors the maths
    """``max`` of symbolic expressions, or the elementwise maximum of RTs."""
    return _min_max(a, b, maximum, "maximum")


def min(a: Any, b: Any) -> Any:  # noqa: A001
    """``min`` of symbolic expressions, or the elementwise minimum of RTs."""
    return _min_max(a, b, minimum, "minimum")


def _min_max(a: Any, b: Any, symbolic: Callable, kind: str) -> Any:
    if isinstance(a, RecurrentTensor) or isinstance(b, RecurrentTensor):
        ctx = _context_of(a, b)
        like = a if isinstance(a, RecurrentTensor) else b
        return lift(ctx, a, like=like).apply(kind, lift(ctx, b, like=like))
    return symbolic(as_expr(a), as_expr(b))


def cat(tensors: Sequence[RecurrentTensor], dim: int = 0) -> RecurrentTensor:
    """Concatenate along spatial ``dim``."""
    first, *rest = _non_empty(tensors, "cat")
    return first.apply("cat", *rest, dim=dim)


def stack(tensors: Sequence[RecurrentTensor], dim: int = 0) -> RecurrentTensor:
    """Stack along a new spatial ``dim``."""
    first, *rest = _non_empty(tensors, "stack")
    return first.apply("stack", *rest, dim=dim)


def _non_empty(tensors: Sequence[RecurrentTensor], what: str) -> Sequence[RecurrentTensor]:
    if not tensors:
        raise ShapeError(f"{what} needs at least one tensor", user_site())
    return tensors


def matmul(a: RecurrentTensor, b: RecurrentTensor) -> RecurrentTensor:
    """``a @ b``."""
    return a @ b


# ---- random -----------------------------------------------------------------------------
def _random(dist: str, shape: Sequence[int], dtype: str, domain: Sequence[Symbol] | None,
            **params: Any) -> RecurrentTensor:
    ctx = active_context()
    dims = ctx.dims if domain is None else ctx.ordered(domain)
    for d in shape:
        if not as_expr(d).is_const:
            raise ShapeError("random tensors need a static shape", user_site())
    # Parallel dims are keyed last, so that a draw laid out over one shares the keying of
    # the other coordinates, and the last of them counts elements (tempo.ir.random).
    keyed = (*(d for d in dims if d not in ctx.parallel), *(d for d in dims if d in ctx.parallel))
    counted = bool(keyed) and keyed[-1] in ctx.parallel
    params = {"dist": dist, "shape": tuple(int(as_expr(d).value) for d in shape),
              "dtype": dtype, "seed": ctx.seed, "key": len(ctx.graph.ops), **params,
              **({"counted": True} if counted else {})}
    point = [RecurrentTensor(ctx, ctx.add_op("coords", [], {"dims": keyed}, domain=dims, label="point"))] \
        if dims else []
    return RecurrentTensor(ctx, ctx.add_op("rng", point, params, domain=dims, label=dist))


def uniform(shape: Sequence[int] = (), low: float = 0.0, high: float = 1.0,
            domain: Sequence[Symbol] | None = None, dtype: Any = "float32") -> RecurrentTensor:
    """Uniform samples, fresh at every point of ``domain`` (default: all dims), seeded by
    the context seed and the point."""
    return _random("uniform", shape, dtype_name(dtype), domain, low=low, high=high)


def normal(shape: Sequence[int] = (), loc: float = 0.0, scale: float = 1.0,
           domain: Sequence[Symbol] | None = None, dtype: Any = "float32") -> RecurrentTensor:
    """Normal samples, fresh at every point of ``domain``."""
    return _random("normal", shape, dtype_name(dtype), domain, loc=loc, scale=scale)


def randint(low: int, high: int, shape: Sequence[int] = (),
            domain: Sequence[Symbol] | None = None, dtype: Any = "int32") -> RecurrentTensor:
    """Integers in ``[low, high)``, fresh at every point of ``domain``."""
    if high <= low:
        raise ShapeError(f"randint needs low < high, got [{low}, {high})", user_site())
    name = dtype_name(dtype)
    if np.dtype(name).kind not in "iu":
        raise ShapeError(f"randint draws integers, not {name}", user_site())
    if low < np.iinfo(name).min or high - 1 > np.iinfo(name).max:
        raise ShapeError(f"randint's range [{low}, {high}) does not fit {name}", user_site())
    span = high - low
    # A draw is 32 random bits modulo the range: the lowest 2**32 % span values come up once
    # more than the others, a negligible share only while that remainder is small.
    if span > 2 ** 32 or 2 ** 32 % span > 2 ** 16:
        raise ShapeError(f"randint cannot draw uniformly from {span} values with 32 random bits; "
                         f"use at most 65536 values or a power of two", user_site())
    return _random("randint", shape, name, domain, low=low, high=high)


# ---- user functions ---------------------------------------------------------------------
def udf(fn: Callable[..., Any], inputs: Sequence[Any] = (),
        outputs: Sequence[tuple[Sequence[int], Any]] = (),
        domain: Sequence[Symbol] = (), name: str | None = None,
        pass_point: bool = False, when: Any = True,
        traceable: bool = False, batched: Callable[..., Any] | None = None,
        own_rows: bool = False) -> tuple[RecurrentTensor, ...]:
    """Call a host function once at every point of the domain (in schedule order).

    ``fn`` receives the inputs as NumPy arrays (and the point as ``{dim name: int}``
    first, when ``pass_point``) and returns one array per declared ``(shape, dtype)`` of
    ``outputs``. The domain is ``domain`` united with the inputs' domains. A UDF may keep
    external state (an environment, a logger); it runs at every point of its domain where
    the condition ``when`` holds (e.g. ``(i + 1) % 10 == 0``).

    With ``traceable``, ``fn`` is a pure JAX function (an in-graph env's step): it runs
    on the device like any op, jitted, and may be fused with its neighbours; its outputs
    are found by tracing it (``outputs``, when given, are checked against them).

    Over a parallel dim (``tp.Context(parallel=...)``) the compiler calls a host UDF once
    for every point of that dim at once when it has a ``batched`` form: the same function
    over inputs and outputs with a leading axis of the dim's size (inputs without the dim
    unchanged; the point, when passed, without the dim). A UDF over two parallel dims
    keeps its loops. A traceable UDF needs none: it is ``jax.vmap``-ed. Where the
    parallel dim is split over the devices of several processes (``tp.Distribution``
    over several hosts), every process calls ``batched`` with every row, gathered; with
    ``own_rows``, each calls it with the rows its own devices hold (the point, which
    ``pass_point`` hands in, then maps the dim's name to their indices) and returns those
    rows: host envs stepped by the host of their shard.
    """
    if traceable:
        if batched is not None:
            raise UDFError("a traceable UDF is vmapped over parallel dims; it takes no `batched`",
                           user_site())
        return _traced_udf(fn, inputs, outputs, domain, name, pass_point, when)
    if own_rows and batched is None:
        raise UDFError("own_rows is about a UDF's batched form; give it one (batched=...)", user_site())
    ctx, op = _host_udf(fn, inputs, outputs, domain, name, pass_point, when, batched)
    op.params["own_rows"] = own_rows
    return tuple(RecurrentTensor(ctx, op, k) for k in range(len(op.outputs)))


def _host_udf(fn: Callable[..., Any], inputs: Sequence[Any], outputs: Sequence[tuple[Sequence[int], Any]],
              domain: Sequence[Symbol], name: str | None, pass_point: bool, when: Any,
              batched: Callable[..., Any] | None) -> tuple[Context, Op]:
    """The context and op of a host ``udf``."""
    ctx = _context_of(*inputs)
    rts = [lift(ctx, x) for x in inputs]
    out_types = tuple(TensorType(tuple(s), dtype_name(d)) for s, d in outputs)
    for t in out_types:
        if not t.is_static:
            raise ShapeError("UDF outputs need static shapes", user_site())
    site = user_site()
    label = name or getattr(fn, "__name__", "udf")
    call = _checked_call(fn, out_types, label, site, pass_point)

    def batched_call(stacked: tuple[TensorType, ...]) -> Callable:
        return _checked_call(batched, stacked, f"{label} (batched)", site, pass_point)
    params = {"call": call, "out_types": out_types, "batched": batched_call if batched else None}
    op = ctx.add_op("udf", rts, params,
                    domain=[*domain, *(s for s in as_expr(when).symbols() if s in ctx.bound_of)],
                    label=label)
    op.when = _condition(ctx, when)
    return ctx, op


def _traced_udf(fn: Callable[..., Any], inputs: Sequence[Any], outputs: Sequence[tuple],
                domain: Sequence[Symbol], name: str | None, pass_point: bool,
                when: Any) -> tuple[RecurrentTensor, ...]:
    import jax
    label = name or getattr(fn, "__name__", "udf")
    if pass_point or when is not True:
        raise DomainError(f"traceable UDF {label} runs at every point of its domain and gets no "
                          f"point; index its inputs by the dims instead", user_site())
    ctx = _context_of(*inputs)
    rts = [lift(ctx, x) for x in inputs]
    for k, rt in enumerate(rts):
        if not rt.type.is_static:
            raise ShapeError(f"input {k} of traceable UDF {label} has a shape that varies with "
                             f"the point ({rt.type})", user_site())

    def as_tuple(*xs: Any) -> tuple:
        out = fn(*xs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)
    specs = [jax.ShapeDtypeStruct(tuple(int(d.value) for d in rt.shape), rt.dtype) for rt in rts]
    try:
        traced = jax.eval_shape(as_tuple, *specs)
    except Exception as err:
        raise UDFError(f"traceable UDF {label} failed to trace on inputs "
                       f"{[(s.shape, str(s.dtype)) for s in specs]}: {err}", user_site()) from err
    out_types = tuple(TensorType(tuple(o.shape), dtype_name(o.dtype)) for o in traced)
    declared = tuple(TensorType(tuple(s), dtype_name(d)) for s, d in outputs)
    if outputs and declared != out_types:
        raise UDFError(f"traceable UDF {label} returns {list(out_types)}, declared "
                       f"{list(declared)}", user_site())
    op = ctx.add_op("traced_udf", rts, {"fn": jax.jit(as_tuple), "out_types": out_types},
                    domain=list(domain), label=label)
    return tuple(RecurrentTensor(ctx, op, k) for k in range(len(out_types)))


def sink(x: RecurrentTensor | Sequence[RecurrentTensor], fn: Callable[..., None],
         name: str | None = None, when: Any = True) -> None:
    """Call ``fn(value, point)`` with the value of ``x`` at every point of its domain where
    ``when`` holds; with a list of RTs, ``fn(values, point)`` gets a list of values."""
    _sink(x, fn, name, when)


def _sink(x: RecurrentTensor | Sequence[RecurrentTensor], fn: Callable[..., None], name: str | None,
          when: Any) -> Op:
    many = isinstance(x, (list, tuple))

    def call(point: dict[str, int], *values: np.ndarray) -> None:
        fn(list(values) if many else values[0], point)  # a logger's result is not an output
    return _host_udf(call, list(x) if many else [x], (), (), name or getattr(fn, "__name__", "sink"),
                     True, when, None)[1]


def stop_when(cond: RecurrentTensor, name: str | None = None) -> None:
    """End the run at the first point, in execution order, where the boolean ``cond``
    holds: nothing scheduled after that point runs (a decode loop that stops once every
    sequence has ended). The run's outputs then hold their points up to and including
    that point along the last dim of ``cond``'s domain (``Results.stopped_at`` says
    where); an output point that was not computed by then is an error when read."""
    if not isinstance(cond, RecurrentTensor) or cond.dtype != "bool" or tuple(cond.shape):
        raise DomainError(f"stop_when needs a boolean scalar (reduce it: cond.max()), got {cond!r}",
                          user_site())
    if not cond.domain:
        raise DomainError("stop_when needs a condition that varies over a dim", user_site())

    def check(value: np.ndarray, point: dict[str, int]) -> None:
        if bool(value):
            raise StopRun(point)
    _sink(cond, check, name or "stop_when", True).params["stops"] = True  # (after its point's sinks)


def _condition(ctx: Context, when: Any) -> Expr:
    cond = as_expr(when)
    if not cond.is_bool:
        raise DomainError(f"`when` must be a boolean condition over the dims, got {cond}",
                          user_site())
    ctx.check_symbols(cond, "a `when` condition")
    return cond


def _checked_call(fn: Callable, out_types: tuple[TensorType, ...], label: str, site: Any,
                  pass_point: bool) -> Callable:
    declared = tuple((tuple(d.value for d in t.shape), np.dtype(t.dtype)) for t in out_types)

    def call(point: dict[Symbol, int], *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
        args = ({s.name: v for s, v in point.items() if s.kind == "dim"}, *inputs) \
            if pass_point else inputs
        rows = next((len(v) for v in point.values() if isinstance(v, np.ndarray)), None)  # (a
        # batched form called with this process's rows of a dim split over processes)
        try:
            result = fn(*args)
        except Exception as err:
            at = {s.name: v for s, v in point.items() if s.kind == "dim"}
            err.add_note(f"raised in UDF {label!r} at {at}" + (f", defined at {site}" if site else ""))
            raise
        if len(out_types) == 1:
            values: tuple = (result,)
        elif result is None or isinstance(result, (tuple, list)):
            values = () if result is None else tuple(result)
        else:
            values = (result,)
        if len(values) != len(out_types):
            raise UDFError(f"UDF {label} returned {len(values)} values, declared {len(out_types)}",
                           site)
        return tuple(_conform(v, shape, dtype, label, site, rows)
                     for v, (shape, dtype) in zip(values, declared))
    return call


def _conform(value: Any, shape: tuple[int, ...], dtype: np.dtype, label: str, site: Any,
             rows: int | None = None) -> np.ndarray:
    """``value`` as declared, of ``shape`` and ``dtype`` (``rows``: with that many rows
    instead of its first axis's)."""
    array = np.asarray(value)
    if rows is not None:
        shape = (rows, *shape[1:])
    if array.shape != shape:
        hint = " (return the array itself, not a 1-tuple)" if isinstance(value, tuple) else ""
        raise UDFError(f"UDF {label} returned shape {array.shape}, declared {shape}{hint}", site)
    if array.dtype != dtype:
        if not np.can_cast(array.dtype, dtype, casting="same_kind"):
            raise UDFError(f"UDF {label} returned dtype {array.dtype}, declared {dtype}", site)
        array = array.astype(dtype)
    return array
