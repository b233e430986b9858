"""Recurrent tensors: spatial tensors with a temporal domain, indexed by symbolic expressions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tempo.api.context import Context
from tempo.errors import DomainError, ShapeError, TempoError, user_site
from tempo.ir.graph import Op
from tempo.ir.ops import broadcast_shapes
from tempo.ir.types import Shape, TensorType, dtype_name
from tempo.symbolic.expr import (
    TRUE,
    Expr,
    ExprLike,
    IndexEntry,
    Slice,
    Symbol,
    as_expr,
    linear_form,
    logical_and,
)

Scalar = int | float | bool


class RecurrentTensor:
    """One output of an op of the SDG. Behaves like a NumPy array at each point of its domain."""

    __slots__ = ("ctx", "op", "out")
    __array_priority__ = 1000

    def __init__(self, ctx: Context, op: Op, out: int = 0):
        self.ctx, self.op, self.out = ctx, op, out

    # ---- type -------------------------------------------------------------------------
    @property
    def type(self) -> TensorType:
        return self.op.outputs[self.out]

    @property
    def shape(self) -> Shape:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def domain(self) -> tuple[Symbol, ...]:
        return self.op.domain

    @property
    def key(self) -> tuple[int, int]:
        return (self.op.id, self.out)

    def __hash__(self) -> int:
        return hash(self.key)

    def __bool__(self) -> bool:
        raise TempoError("a recurrent tensor has no truth value; use tp.where for selection",
                         user_site())

    def __repr__(self) -> str:
        dom = ", ".join(d.name for d in self.domain)
        return f"RT({self.op.name}, domain=({dom}), {self.type!r})"

    # ---- building blocks -------------------------------------------------------------
    def apply(self, kind: str, *others: Any, **params: Any) -> RecurrentTensor:
        """A new op of ``kind`` (``tempo.ir.ops``) reading this tensor and ``others`` (lifted
        to tensors of this context), with ``params``: how every method, free function and
        gradient rule builds an op."""
        inputs = [self, *(lift(self.ctx, o, like=self) for o in others)]
        return RecurrentTensor(self.ctx, self.ctx.add_op(kind, inputs, params))

    def _rapply(self, kind: str, other: Any) -> RecurrentTensor:
        return lift(self.ctx, other, like=self).apply(kind, self)

    # ---- arithmetic and comparison ----------------------------------------------------
    def __add__(self, o: Any) -> RecurrentTensor: return self.apply("add", o)
    def __radd__(self, o: Any) -> RecurrentTensor: return self._rapply("add", o)
    def __sub__(self, o: Any) -> RecurrentTensor: return self.apply("sub", o)
    def __rsub__(self, o: Any) -> RecurrentTensor: return self._rapply("sub", o)
    def __mul__(self, o: Any) -> RecurrentTensor: return self.apply("mul", o)
    def __rmul__(self, o: Any) -> RecurrentTensor: return self._rapply("mul", o)
    def __truediv__(self, o: Any) -> RecurrentTensor: return self.apply("div", o)
    def __rtruediv__(self, o: Any) -> RecurrentTensor: return self._rapply("div", o)
    def __floordiv__(self, o: Any) -> RecurrentTensor: return self.apply("floordiv", o)
    def __rfloordiv__(self, o: Any) -> RecurrentTensor: return self._rapply("floordiv", o)
    def __mod__(self, o: Any) -> RecurrentTensor: return self.apply("mod", o)
    def __rmod__(self, o: Any) -> RecurrentTensor: return self._rapply("mod", o)
    def __pow__(self, o: Any) -> RecurrentTensor: return self.apply("pow", o)
    def __rpow__(self, o: Any) -> RecurrentTensor: return self._rapply("pow", o)
    def __matmul__(self, o: Any) -> RecurrentTensor: return self.apply("matmul", o)
    def __rmatmul__(self, o: Any) -> RecurrentTensor: return self._rapply("matmul", o)
    def __neg__(self) -> RecurrentTensor: return self.apply("neg")
    def __eq__(self, o: Any) -> RecurrentTensor: return self.apply("eq", o)  # type: ignore[override]
    def __ne__(self, o: Any) -> RecurrentTensor: return self.apply("ne", o)  # type: ignore[override]
    def __lt__(self, o: Any) -> RecurrentTensor: return self.apply("lt", o)
    def __le__(self, o: Any) -> RecurrentTensor: return self.apply("le", o)
    def __gt__(self, o: Any) -> RecurrentTensor: return self.apply("gt", o)
    def __ge__(self, o: Any) -> RecurrentTensor: return self.apply("ge", o)
    def __and__(self, o: Any) -> RecurrentTensor: return self.apply("and", o)
    def __or__(self, o: Any) -> RecurrentTensor: return self.apply("or", o)
    def __invert__(self) -> RecurrentTensor: return self.apply("not")

    def exp(self) -> RecurrentTensor: return self.apply("exp")
    def log(self) -> RecurrentTensor: return self.apply("log")
    def tanh(self) -> RecurrentTensor: return self.apply("tanh")
    def sqrt(self) -> RecurrentTensor: return self.apply("sqrt")
    def abs(self) -> RecurrentTensor: return self.apply("abs")
    def sin(self) -> RecurrentTensor: return self.apply("sin")
    def cos(self) -> RecurrentTensor: return self.apply("cos")
    def floor(self) -> RecurrentTensor: return self.apply("floor")

    def sigmoid(self) -> RecurrentTensor:
        return 1.0 / (1.0 + (-self).exp())

    def relu(self) -> RecurrentTensor:
        return self.apply("maximum", 0)

    def square(self) -> RecurrentTensor:
        return self * self

    def softplus(self) -> RecurrentTensor:
        """``log(1 + exp(x))``, computed without overflow."""
        return self.relu() + (-self.abs()).exp().log1p()

    def log1p(self) -> RecurrentTensor:
        return (1.0 + self).log()

    def clip(self, low: Any, high: Any) -> RecurrentTensor:
        """Values limited to ``[low, high]``."""
        return self.apply("maximum", low).apply("minimum", high)

    def logsumexp(self, dim: int = -1, keepdim: bool = False) -> RecurrentTensor:
        """``log(sum(exp(x), dim))``, shifted by the maximum for stability."""
        top = self.max(dim, keepdim=True).detach()
        out = (self - top).exp().sum(dim, keepdim=True).log() + top
        return out if keepdim else out.squeeze(dim)

    def log_softmax(self, dim: int = -1) -> RecurrentTensor:
        return self - self.logsumexp(dim, keepdim=True)

    def softmax(self, dim: int = -1) -> RecurrentTensor:
        return self.log_softmax(dim).exp()

    def argmax(self, dim: int = -1) -> RecurrentTensor:
        """Index of the largest entry along spatial ``dim`` (int32)."""
        return self.apply("argmax", dim=dim)

    def argsort(self, dim: int = -1) -> RecurrentTensor:
        """Indices that sort spatial ``dim`` ascending (stable; int32). On uniform random
        keys this is a random permutation."""
        return self.apply("argsort", dim=dim)

    # ---- autodiff ---------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        """Whether ``backward()`` computes a gradient for this tensor (a leaf)."""
        return self.op.id in self.ctx.leaves

    @property
    def grad(self) -> RecurrentTensor:
        """The gradient RT set by ``backward()`` (same shape, domain extended by the
        loss's domain)."""
        grad = self.ctx.grads.get(self.key)
        if grad is None:
            reason = ("call backward() on a loss that depends on it first" if self.requires_grad
                      else "it does not require grad (tp.const(..., requires_grad=True))")
            raise TempoError(f"{self!r} has no gradient: {reason}", user_site())
        return grad

    def detach(self) -> RecurrentTensor:
        """The same values, as a constant for differentiation."""
        return self.apply("detach")

    def backward(self) -> None:
        """Differentiate this scalar loss; sets ``.grad`` of every leaf it depends on."""
        from tempo.api.autodiff import backward
        backward(self)

    def astype(self, dtype: Any) -> RecurrentTensor:
        """The values converted to ``dtype``."""
        return self.apply("astype", dtype=dtype_name(dtype))

    # ---- reductions and scans ---------------------------------------------------------
    def _reduce(self, kind: str, dim: int | Sequence[int] | None, keepdim: bool) -> RecurrentTensor:
        dims = tuple(range(self.ndim)) if dim is None else (
            (dim,) if isinstance(dim, int) else tuple(dim))
        return self.apply(f"reduce_{kind}", dims=dims, keepdims=keepdim)

    def sum(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> RecurrentTensor:
        """Sum over spatial ``dim`` (all by default)."""
        return self._reduce("sum", dim, keepdim)

    def mean(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> RecurrentTensor:
        """Mean over spatial ``dim`` (all by default)."""
        return self._reduce("mean", dim, keepdim)

    def max(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> RecurrentTensor:
        """Maximum over spatial ``dim`` (all by default)."""
        return self._reduce("max", dim, keepdim)

    def min(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> RecurrentTensor:
        """Minimum over spatial ``dim`` (all by default)."""
        return self._reduce("min", dim, keepdim)

    def prod(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> RecurrentTensor:
        """Product over spatial ``dim`` (all by default)."""
        return self._reduce("prod", dim, keepdim)

    def cumsum(self, dim: int = 0) -> RecurrentTensor:
        """Cumulative sum along spatial ``dim``."""
        return self.apply("cumsum", dim=dim)

    def discounted_sum(self, gamma: float, dim: int = 0) -> RecurrentTensor:
        """``sum_k gamma**k * x[k]`` along spatial ``dim`` (the leading one by default)."""
        return self.apply("discounted_sum", dim=dim, gamma=float(gamma))

    # ---- layout -----------------------------------------------------------------------
    def reshape(self, *shape: ExprLike | Sequence[ExprLike]) -> RecurrentTensor:
        """Same data, new spatial shape (sizes may be symbolic)."""
        return self.apply("reshape", shape=_shape_arg(shape))

    def permute(self, *dims: int | Sequence[int]) -> RecurrentTensor:
        """Reorder the spatial dims."""
        return self.apply("permute", dims=tuple(_shape_arg(dims, ints=True)))

    def expand(self, *shape: ExprLike | Sequence[ExprLike]) -> RecurrentTensor:
        """Broadcast to ``shape`` (sizes may be symbolic)."""
        return self.apply("expand", shape=_shape_arg(shape))

    def squeeze(self, dim: int = 0) -> RecurrentTensor:
        """Remove spatial ``dim`` of size 1."""
        return self.apply("squeeze", dim=dim)

    def unsqueeze(self, dim: int = 0) -> RecurrentTensor:
        """Insert a spatial dim of size 1 at ``dim``."""
        return self.apply("unsqueeze", dim=dim)

    def gather(self, index: RecurrentTensor, dim: int = -1) -> RecurrentTensor:
        """``take_along_axis``: an index of the same rank picks entries along ``dim``."""
        return self.apply("gather", index, dim=dim)

    # ---- indexing ---------------------------------------------------------------------
    def __getitem__(self, key: Any) -> RecurrentTensor:
        entries = key if isinstance(key, tuple) else (key,)
        temporal, spatial = entries[:len(self.domain)], entries[len(self.domain):]
        out = self._index_temporal(temporal) if temporal else self
        return out._index_spatial(spatial) if spatial else out

    def _index_temporal(self, entries: Sequence[Any]) -> RecurrentTensor:
        phi = list(self.domain)
        for k, entry in enumerate(entries):
            phi[k] = _temporal_entry(self.ctx, entry, self.domain[k])
        self._check_index_order(phi, len(entries))
        if all(e is d for e, d in zip(phi, self.domain)):
            return self
        domain = self.ctx.ordered(s for e in phi for s in e.symbols() if s in self.ctx.bound_of)
        sizes = tuple(e.size for e in phi if isinstance(e, Slice))
        out_type = TensorType((*sizes, *self.shape), self.dtype)
        op = self.ctx.add_op("identity", [self], {"out_type": out_type}, domain=domain,
                             phis=[tuple(phi)])
        op.requires = tuple((e.start <= e.stop, f"temporal slice {e} ends before it starts")
                            for e in phi if isinstance(e, Slice) and not (e.start <= e.stop).is_const)
        return RecurrentTensor(self.ctx, op)

    def _check_index_order(self, phi: list[IndexEntry], given: int) -> None:
        """Indices name the dims in order: an index of dim ``b`` written over a later dim
        the index leaves out (``G[t+1]`` of a ``(b, i, t)`` tensor reads ``G[t+1, i, t]``)
        is almost surely meant for that dim, and is an error saying how to write it."""
        unindexed = set(self.domain[given:])
        suggestion = list(self.domain)
        misplaced = []
        for k in range(given):
            symbols = phi[k].symbols()
            later = [d for d in self.domain[k + 1:] if d in symbols and d in unindexed]
            if self.domain[k] in symbols or not later:
                suggestion[k] = phi[k]
                continue
            misplaced.append(k)
            suggestion[self.domain.index(later[0])] = phi[k]
        if misplaced:
            k = misplaced[0]
            written = ", ".join(map(str, phi[:given]))
            raise DomainError(
                f"{self.op.name}[{written}] applies {phi[k]} to dim {self.domain[k].name} of "
                f"{self.op.name}, whose dims are ({_names(self.domain)}): indices name the dims in "
                f"order; write {self.op.name}[{', '.join(map(str, suggestion))}]", user_site())

    def _index_spatial(self, entries: Sequence[Any]) -> RecurrentTensor:
        out, dim = self, 0
        for entry in entries:
            if entry is Ellipsis:
                rest = sum(1 for e in entries[entries.index(Ellipsis) + 1:] if e is not None)
                if rest > out.ndim - dim:
                    raise ShapeError(f"too many indices for a tensor of shape {_fmt(out.shape)}",
                                     user_site())
                dim = out.ndim - rest
            elif entry is None:
                out, dim = out.unsqueeze(dim), dim + 1
            elif isinstance(entry, slice):
                out, dim = out._spatial_slice(dim, entry), dim + 1
            else:
                if dim >= out.ndim:
                    raise ShapeError(f"too many indices for a tensor of shape {out.shape}", user_site())
                out, dim = out._take(dim, entry), dim + _index_ndim(entry)
        return out

    def _take(self, dim: int, entry: Any) -> RecurrentTensor:
        """Index spatial ``dim`` by an int, a symbolic expression or an int RT."""
        if isinstance(entry, RecurrentTensor):
            return self.apply("take", entry, dim=dim)
        size = self.shape[dim]
        if isinstance(entry, (int, np.integer)):
            if size.is_const and not -size.value <= entry < size.value:
                raise ShapeError(f"index {entry} is out of range for dim {dim} of size {size.value}",
                                 user_site())
            entry = int(entry) % size.value if size.is_const else int(entry)
        out = self.apply("take", index_value(self.ctx, entry), dim=dim)
        expr = as_expr(entry)
        if not expr.is_const:
            out.op.requires += (((expr >= 0) & (expr < size),
                                 f"spatial index {expr} is outside dim {dim} (size {size})"),)
        return out

    def _spatial_slice(self, dim: int, entry: slice) -> RecurrentTensor:
        if entry.step not in (None, 1):
            raise ShapeError("spatial slices support step 1 only", user_site())
        size = self.shape[dim]
        static = all(isinstance(v, (int, np.integer, type(None))) for v in (entry.start, entry.stop))
        if static and size.is_const:  # Python semantics: negative indices, clamping
            start, stop, _ = entry.indices(size.value)
            return self.apply("slice", dim=dim, start=as_expr(start), stop=as_expr(max(start, stop)))
        start = as_expr(0 if entry.start is None else entry.start)
        stop = size if entry.stop is None else as_expr(entry.stop)
        for bound in (start, stop):
            self.ctx.check_symbols(bound, "a spatial slice")
        out = self.apply("slice", dim=dim, start=start, stop=stop)
        out.op.requires += (((start >= 0) & (start <= stop) & (stop <= size),
                             f"spatial slice {start}:{stop} is outside dim {dim} (size {size})"),)
        return out

    def __setitem__(self, key: Any, value: Any) -> None:
        """Define a branch of a placeholder: ``y[0] = v``, ``y[t+1] = v``, ``y[cond] = v``."""
        if self.op.kind != "merge":
            raise DomainError(f"only placeholders can be assigned to; {self.op.name} is a "
                              f"{self.op.kind} (create it with tp.placeholder)", user_site())
        value = lift(self.ctx, value, like=self)
        cond, shifts = self._branch_key(key)
        extra = [d.name for d in value.domain if d not in self.domain]
        if extra:
            raise DomainError(f"the value assigned to {self.op.name} varies over {', '.join(extra)}"
                              f", which is not in its domain ({_names(self.domain)})", user_site())
        if tuple(value.shape) != tuple(self.shape):
            try:
                broadcast_shapes(value.shape, self.shape)
            except ShapeError:
                raise ShapeError(f"cannot assign a value of shape {_fmt(value.shape)} to "
                                 f"{self.op.name} of shape {_fmt(self.shape)}", user_site()) from None
            value = value.expand(self.shape)
        if value.dtype != self.dtype:
            if not _widens(value.dtype, self.dtype):
                raise ShapeError(f"the value assigned to {self.op.name} is {value.dtype}, the placeholder "
                                 f"{self.dtype}: convert it with .astype({str(self.dtype)!r}) if that is "
                                 f"what you mean", user_site())
            value = value.astype(self.dtype)
        phi = tuple(shifts.get(d, d) for d in value.domain)
        self.ctx.add_branch(self.op, value, phi, cond)

    def _branch_key(self, key: Any) -> tuple[Expr, dict[Symbol, Expr]]:
        """The condition under which a branch applies, and the read shift per dim."""
        if isinstance(key, bool) or (isinstance(key, Expr) and key.is_bool):
            self.ctx.check_symbols(as_expr(key), "a branch condition")
            return as_expr(key), {}
        entries = key if isinstance(key, tuple) else (key,)
        if len(entries) > len(self.domain):
            raise DomainError(f"{len(entries)} indices for {self.op.name} whose domain has "
                              f"{len(self.domain)} dims ({_names(self.domain)})", user_site())
        cond: Expr = TRUE
        shifts: dict[Symbol, Expr] = {}
        for dim, entry in zip(self.domain, entries):
            entry = as_expr(entry)
            self.ctx.check_symbols(entry, "a branch index")
            bound = self.ctx.bound_of[dim]
            if entry is dim:
                continue
            if dim not in entry.symbols():
                cond = logical_and(cond, dim == entry)
                continue
            form = linear_form(entry)
            if form is None or form[0] != {dim: 1}:
                raise DomainError(f"cannot assign at index {entry} of dim {dim}: use a "
                                  f"constant, {dim}, {dim}+k, or a boolean condition", user_site())
            source = dim - (entry - dim)
            shifts[dim] = source
            cond = logical_and(cond, logical_and(source >= 0, source < bound))
        return cond, shifts


def _index_ndim(entry: Any) -> int:
    return entry.ndim if isinstance(entry, RecurrentTensor) else 0


def _names(dims: Sequence[Symbol]) -> str:
    return ", ".join(d.name for d in dims)


def _fmt(shape: Shape) -> str:
    return f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"


def _shape_arg(args: tuple, ints: bool = False) -> tuple:
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return tuple(int(a) for a in args) if ints else tuple(as_expr(a) for a in args)


def _temporal_entry(ctx: Context, entry: Any, dim: Symbol) -> IndexEntry:
    bound = ctx.bound_of[dim]
    if isinstance(entry, slice):
        if entry.step not in (None, 1):
            raise DomainError("temporal slices support step 1 only", user_site())
        out: IndexEntry = Slice(0 if entry.start is None else entry.start,
                                bound if entry.stop is None else entry.stop)
        ctx.check_symbols(out.start, "a temporal index")
        ctx.check_symbols(out.stop, "a temporal index")
        return out
    if isinstance(entry, RecurrentTensor):
        raise DomainError("temporal dims are indexed by symbolic expressions, not tensors",
                          user_site())
    expr = as_expr(entry)
    if expr.is_bool:
        raise DomainError(f"a boolean condition ({expr}) cannot be used to read a tensor; "
                          "use it to assign a placeholder branch", user_site())
    ctx.check_symbols(expr, "a temporal index")
    return expr


def _widens(source: Any, target: Any) -> bool:
    """Whether ``source`` values convert to ``target`` without losing their kind (bool or
    int to int or float, a narrower float to a wider one): what a branch may assign."""
    src, dst = np.dtype(source), np.dtype(target)
    return np.can_cast(src, dst, "safe") or (src.kind in "biu" and dst.kind == "f")


def lift(ctx: Context, value: Any, like: RecurrentTensor | None = None) -> RecurrentTensor:
    """An RT for ``value``: RTs pass through, symbols become symbol values, scalars constants."""
    if isinstance(value, RecurrentTensor):
        if value.ctx is not ctx:
            raise TempoError("cannot mix tensors of different contexts", user_site())
        return value
    if isinstance(value, Expr):
        return symbol_value(ctx, value)
    if isinstance(value, (bool, int, float, np.number)) and like is not None:
        return constant(ctx, np.asarray(value, dtype=_scalar_dtype(value, like.dtype)))
    return constant(ctx, np.asarray(value))


def _scalar_dtype(value: Scalar | np.number, like: str) -> str:
    """Python scalars adopt the tensor's dtype when they fit its kind (weak typing)."""
    if isinstance(value, np.number):
        return value.dtype.name
    kind = np.dtype(like).kind
    if isinstance(value, bool):
        return like
    if isinstance(value, int):
        return like if kind in "iuf" else "int32"
    return like if kind == "f" else "float32"


def constant(ctx: Context, value: Any, dtype: Any = None,
             requires_grad: bool = False) -> RecurrentTensor:
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise ShapeError(f"cannot make a tensor of {array.dtype} values", user_site())
    if dtype is not None:
        array = array.astype(dtype_name(dtype))
    elif array.dtype == np.float64:
        array = array.astype(np.float32)
    elif array.dtype == np.int64:
        array = array.astype(np.int32)
    op = ctx.add_op("const", [], {"value": array}, label="const")
    if requires_grad:
        if array.dtype.kind != "f":
            raise TempoError(f"only floating-point tensors can require grad, got {array.dtype}",
                             user_site())
        ctx.leaves.add(op.id)
    return RecurrentTensor(ctx, op)


def arange(ctx: Context, size: ExprLike, dtype: str = "int32") -> RecurrentTensor:
    """``0, 1, ..., size-1`` (``size`` may be symbolic)."""
    return RecurrentTensor(ctx, ctx.add_op("arange", [], {"size": as_expr(size), "dtype": dtype}))


def symbol_value(ctx: Context, expr: ExprLike, dtype: str = "int32") -> RecurrentTensor:
    expr = as_expr(expr)
    ctx.check_symbols(expr, "symbol_value")
    domain = [s for s in expr.symbols() if s in ctx.bound_of]
    op = ctx.add_op("eval_symbol", [], {"expr": expr, "dtype": dtype}, domain=domain,
                    label=f"sym({expr})")
    return RecurrentTensor(ctx, op)


def index_value(ctx: Context, entry: Any) -> RecurrentTensor:
    """A scalar int32 RT holding a spatial index (an int or a symbolic expression)."""
    if isinstance(entry, Expr):
        return symbol_value(ctx, entry)
    if isinstance(entry, (int, np.integer)):
        return constant(ctx, np.asarray(entry, dtype=np.int32))
    raise ShapeError(f"cannot index a spatial dim with {entry!r}", user_site())
