"""Symbolic integer and boolean expressions over index and bound symbols.

Nodes are immutable and hash-consed: building the same expression twice gives the same
object, so identity is structural equality. ``==`` builds an equality *expression*; its
truth value (used by dicts and ``in``) is structural identity.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from tempo.errors import UnsupportedExpressionError

ExprLike = Union["Expr", int, bool]

_ARITH = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
          "floordiv": operator.floordiv, "mod": operator.mod}
_COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt,
            "le": operator.le, "gt": operator.gt, "ge": operator.ge}
_PY_INFIX = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%",
             "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
             "and": "and", "or": "or"}
_BOOL_OPS = frozenset(_COMPARE) | {"and", "or", "not"}


class Expr:
    """An immutable symbolic expression node: ``op`` and ``args``."""

    __slots__ = ("op", "args", "_hash", "__weakref__")
    _cache: weakref.WeakValueDictionary[tuple, Expr] = weakref.WeakValueDictionary()

    op: str
    args: tuple

    def __new__(cls, op: str, *args: Any) -> Expr:
        key = (cls, op, *((type(a), a) if not isinstance(a, Expr) else a for a in args))
        node = Expr._cache.get(key)
        if node is None:
            node = object.__new__(cls)
            object.__setattr__(node, "op", op)
            object.__setattr__(node, "args", args)
            object.__setattr__(node, "_hash", hash(key))
            Expr._cache[key] = node
        return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("symbolic expressions are immutable")

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return (type(self), (self.op, *self.args))

    # ---- classification -------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def value(self) -> int | bool:
        if self.op != "const":
            raise TypeError(f"{self} is not a constant")
        return self.args[0]

    @property
    def is_bool(self) -> bool:
        return self.op in _BOOL_OPS or (self.op == "const" and isinstance(self.args[0], bool))

    @property
    def children(self) -> tuple[Expr, ...]:
        return tuple(a for a in self.args if isinstance(a, Expr))

    def symbols(self) -> frozenset[Symbol]:
        """Every symbol occurring in the expression."""
        if isinstance(self, Symbol):
            return frozenset((self,))
        out: frozenset[Symbol] = frozenset()
        for child in self.children:
            out |= child.symbols()
        return out

    # ---- truth value ------------------------------------------------------------------
    def __bool__(self) -> bool:
        if self.op == "const":
            return bool(self.args[0])
        if self.op == "eq":
            return self.args[0] is self.args[1]
        if self.op == "ne":
            return self.args[0] is not self.args[1]
        raise TypeError(f"the symbolic expression {self} has no truth value; "
                        "evaluate it at a point first")

    # ---- operators --------------------------------------------------------------------
    def __add__(self, o: ExprLike) -> Expr: return _binary("add", self, o)
    def __radd__(self, o: ExprLike) -> Expr: return _binary("add", o, self)
    def __sub__(self, o: ExprLike) -> Expr: return _binary("sub", self, o)
    def __rsub__(self, o: ExprLike) -> Expr: return _binary("sub", o, self)
    def __mul__(self, o: ExprLike) -> Expr: return _binary("mul", self, o)
    def __rmul__(self, o: ExprLike) -> Expr: return _binary("mul", o, self)
    def __floordiv__(self, o: ExprLike) -> Expr: return _binary("floordiv", self, o)
    def __rfloordiv__(self, o: ExprLike) -> Expr: return _binary("floordiv", o, self)
    def __mod__(self, o: ExprLike) -> Expr: return _binary("mod", self, o)
    def __rmod__(self, o: ExprLike) -> Expr: return _binary("mod", o, self)
    def __neg__(self) -> Expr: return _binary("sub", 0, self)
    def __pos__(self) -> Expr: return self
    def __eq__(self, o: object) -> Expr: return _binary("eq", self, o)  # type: ignore[override]
    def __ne__(self, o: object) -> Expr: return _binary("ne", self, o)  # type: ignore[override]
    def __lt__(self, o: ExprLike) -> Expr: return _binary("lt", self, o)
    def __le__(self, o: ExprLike) -> Expr: return _binary("le", self, o)
    def __gt__(self, o: ExprLike) -> Expr: return _binary("gt", self, o)
    def __ge__(self, o: ExprLike) -> Expr: return _binary("ge", self, o)
    def __and__(self, o: ExprLike) -> Expr: return logical_and(self, o)
    def __rand__(self, o: ExprLike) -> Expr: return logical_and(o, self)
    def __or__(self, o: ExprLike) -> Expr: return logical_or(self, o)
    def __ror__(self, o: ExprLike) -> Expr: return logical_or(o, self)
    def __invert__(self) -> Expr: return logical_not(self)

    # ---- evaluation -------------------------------------------------------------------
    def evaluate(self, env: dict[Symbol, int]) -> int | bool:
        """The value of the expression with each symbol taken from ``env``."""
        return _evaluate(self, env)

    def substitute(self, mapping: dict[Symbol, ExprLike]) -> Expr:
        """The expression with symbols replaced (and simplified again)."""
        return _substitute(self, {k: as_expr(v) for k, v in mapping.items()})

    def to_python(self, names: dict[Symbol, str] | None = None) -> str:
        """Python source for the expression; symbols print as ``names[s]`` or their name."""
        return _to_python(self, names or {})

    def __repr__(self) -> str:
        return self.to_python()

    __str__ = __repr__


class Symbol(Expr):
    """A named symbol: a dimension's index (``t``) or its upper bound (``T``)."""

    __slots__ = ()

    def __new__(cls, name: str, kind: str = "dim") -> Symbol:
        return super().__new__(cls, "sym", name, kind)  # type: ignore[return-value]

    @property
    def name(self) -> str:
        return self.args[0]

    @property
    def kind(self) -> str:
        return self.args[1]

    def __reduce__(self):
        return (Symbol, (self.name, self.kind))


def const(value: int | bool) -> Expr:
    """A constant expression."""
    return Expr("const", value)


TRUE = const(True)
FALSE = const(False)


def as_expr(value: ExprLike) -> Expr:
    """Turn an int, bool or numpy integer into an expression."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return const(value)
    try:
        import numpy as np
        if isinstance(value, (np.integer, np.bool_)):
            return const(value.item())
    except ImportError:  # pragma: no cover
        pass
    if isinstance(value, int):
        return const(value)
    raise UnsupportedExpressionError(
        f"cannot use {value!r} ({type(value).__name__}) in a symbolic expression; "
        "only ints, bools and symbols are allowed")


# ---- construction with local simplification -----------------------------------------
def _binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if a.is_const and b.is_const:
        fn = _ARITH.get(op) or _COMPARE[op]
        if op in ("floordiv", "mod") and b.value == 0:
            raise ZeroDivisionError(f"symbolic {op} by zero")
        return const(fn(a.value, b.value))
    if op in _ARITH:
        return _simplify_arith(op, a, b)
    if a is b:
        return const(op in ("eq", "le", "ge"))
    return Expr(op, a, b)


def _simplify_arith(op: str, a: Expr, b: Expr) -> Expr:
    if op in ("add", "sub", "mul"):
        la, lb = linear_form(a), linear_form(b)
        if la is not None and lb is not None and not (op == "mul" and la[0] and lb[0]):
            return from_linear_form(_combine(op, la, lb))
    zero_a = a.is_const and a.value == 0
    zero_b = b.is_const and b.value == 0
    one_b = b.is_const and b.value == 1
    if op in ("add", "sub") and b.is_const and a.op in ("min", "max"):
        return _min_max(a.op, _binary(op, a.args[0], b), _binary(op, a.args[1], b))
    if op == "mul" and (zero_a or zero_b):
        return const(0)
    if op == "floordiv" and one_b:
        return a
    if op == "mod" and one_b:
        return const(0)
    return Expr(op, a, b)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    """Symbolic ``min(a, b)``."""
    return _min_max("min", as_expr(a), as_expr(b))


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    """Symbolic ``max(a, b)``."""
    return _min_max("max", as_expr(a), as_expr(b))


def _min_max(op: str, a: Expr, b: Expr) -> Expr:
    if a.is_const and b.is_const:
        return const(min(a.value, b.value) if op == "min" else max(a.value, b.value))
    if a is b:
        return a
    diff = _constant_difference(a, b)
    if diff is not None:
        return (b if diff > 0 else a) if op == "min" else (a if diff > 0 else b)
    return Expr(op, a, b)


def _constant_difference(a: Expr, b: Expr) -> int | None:
    """``a - b`` when it is a constant, e.g. ``(t+4) - (t+1)``."""
    la, lb = linear_form(a), linear_form(b)
    if la is None or lb is None or la[0] != lb[0]:
        return None
    return la[1] - lb[1]


LinearForm = tuple[dict["Symbol", int], int]


def linear_form(e: Expr) -> LinearForm | None:
    """``e`` as ``({symbol: coefficient}, constant)`` when it is affine, else None."""
    if e.op == "const":
        return ({}, int(e.value)) if not isinstance(e.value, bool) else None
    if e.op == "sym":
        return ({e: 1}, 0)  # type: ignore[dict-item]
    if e.op in ("add", "sub", "mul"):
        a, b = linear_form(e.args[0]), linear_form(e.args[1])
        if a is None or b is None or (e.op == "mul" and a[0] and b[0]):
            return None
        return _combine(e.op, a, b)
    return None


def _combine(op: str, a: LinearForm, b: LinearForm) -> LinearForm:
    if op == "mul":
        (coeffs, c), k = (a, b[1]) if not b[0] else (b, a[1])
        return ({s: v * k for s, v in coeffs.items() if v * k}, c * k)
    sign = 1 if op == "add" else -1
    coeffs = dict(a[0])
    for s, v in b[0].items():
        coeffs[s] = coeffs.get(s, 0) + sign * v
    return ({s: v for s, v in coeffs.items() if v}, a[1] + sign * b[1])


def from_linear_form(form: LinearForm) -> Expr:
    """The canonical expression of a linear form: positive terms first, constant last."""
    coeffs, c = form
    out: Expr | None = None
    for s, v in sorted(coeffs.items(), key=lambda kv: (kv[1] < 0, kv[0].name)):
        term = s if abs(v) == 1 else Expr("mul", s, const(abs(v)))
        if out is None:
            out = term if v > 0 else Expr("sub", const(0), term)
        else:
            out = Expr("add" if v > 0 else "sub", out, term)
    if out is None:
        return const(c)
    return out if c == 0 else Expr("add" if c > 0 else "sub", out, const(abs(c)))


def logical_and(a: ExprLike, b: ExprLike) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if a.is_const:
        return b if a.value else FALSE
    if b.is_const:
        return a if b.value else FALSE
    return a if a is b else Expr("and", a, b)


def logical_or(a: ExprLike, b: ExprLike) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if a.is_const:
        return TRUE if a.value else b
    if b.is_const:
        return TRUE if b.value else a
    return a if a is b else Expr("or", a, b)


_NEGATED = {"eq": "ne", "ne": "eq", "lt": "ge", "ge": "lt", "le": "gt", "gt": "le"}


def logical_not(a: ExprLike) -> Expr:
    """Negation, pushed through comparisons and De Morgan's laws."""
    a = as_expr(a)
    if a.is_const:
        return const(not a.value)
    if a.op in _NEGATED:
        return _binary(_NEGATED[a.op], *a.args)
    if a.op == "and":
        return logical_or(logical_not(a.args[0]), logical_not(a.args[1]))
    if a.op == "or":
        return logical_and(logical_not(a.args[0]), logical_not(a.args[1]))
    if a.op == "not":
        return a.args[0]
    return Expr("not", a)


def select(cond: ExprLike, a: ExprLike, b: ExprLike) -> Expr:
    """``a if cond else b``."""
    cond, a, b = as_expr(cond), as_expr(a), as_expr(b)
    if cond.is_const:
        return a if cond.value else b
    return a if a is b else Expr("select", cond, a, b)


_REBUILD: dict[str, Callable[..., Expr]] = {
    **{op: (lambda o: lambda a, b: _binary(o, a, b))(op) for op in (*_ARITH, *_COMPARE)},
    "min": minimum, "max": maximum, "and": logical_and, "or": logical_or, "not": logical_not,
    "select": select,
}


_ARITY = {**{op: 2 for op in (*_ARITH, *_COMPARE, "and", "or", "min", "max")}, "not": 1, "select": 3}
"""The operand count of each operation over expressions."""


def to_data(e: Expr) -> list:
    """``e`` as nested lists of strings, ints and bools (JSON's): ``["const", v]``,
    ``["sym", name, kind]`` or ``[op, operand, ...]``."""
    if e.op == "sym":
        return [e.op, *e.args]
    if e.op == "const":
        value = e.args[0]  # (a NumPy scalar as Python's)
        return [e.op, value if type(value) in (int, bool) else value.item()]
    return [e.op, *(to_data(a) for a in e.args)]


def from_data(data: Any, symbols: Collection[Symbol]) -> Expr:
    """The expression ``to_data`` gave ``data`` for, rebuilt as it was (no simplification);
    ``ValueError`` for anything else: a symbol must be one of ``symbols``, a constant an int
    or a bool, an operation one of ours with its operand count."""
    if not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise ValueError(f"not an expression: {data!r}")
    op, *args = data
    if op == "const" and len(args) == 1 and type(args[0]) in (int, bool):
        return const(args[0])
    if op == "sym" and len(args) == 2 and all(isinstance(a, str) for a in args) \
            and Symbol(*args) in symbols:
        return Symbol(*args)
    if _ARITY.get(op) != len(args):
        raise ValueError(f"not an expression: {data!r}")
    return Expr(op, *(from_data(a, symbols) for a in args))


# ---- interpretation -----------------------------------------------------------------
def _evaluate(e: Expr, env: dict[Symbol, int]) -> Any:
    if e.op == "const":
        return e.args[0]
    if e.op == "sym":
        try:
            return env[e]  # type: ignore[index]
        except KeyError:
            raise UnsupportedExpressionError(f"no value for symbol {e} when evaluating") from None
    if e.op == "select":
        return _evaluate(e.args[1] if _evaluate(e.args[0], env) else e.args[2], env)
    vals = [_evaluate(c, env) for c in e.args]
    if e.op in _ARITH:
        return _ARITH[e.op](*vals)
    if e.op in _COMPARE:
        return _COMPARE[e.op](*vals)
    return {"min": min, "max": max, "and": lambda a, b: a and b,
            "or": lambda a, b: a or b, "not": lambda a: not a}[e.op](*vals)


def _substitute(e: Expr, mapping: dict[Symbol, Expr]) -> Expr:
    if e.op == "sym":
        return mapping.get(e, e)  # type: ignore[arg-type]
    if e.op == "const":
        return e
    return _REBUILD[e.op](*(_substitute(c, mapping) for c in e.args))


_NP_INFIX = {**_PY_INFIX, "and": "&", "or": "|"}
_NP_CALLS = {"min": "_np.minimum", "max": "_np.maximum", "not": "_np.logical_not", "select": "_np.where"}


def _to_python(e: Expr, names: dict[Symbol, str], numpy: bool = False) -> str:
    """Python source for ``e``; with ``numpy``, for NumPy arrays of symbol values
    (elementwise logic, ``np.minimum``/``np.maximum``)."""
    if e.op == "const":
        return repr(e.args[0])
    if e.op == "sym":
        return names.get(e, e.args[0])  # type: ignore[call-overload]
    parts = [_to_python(c, names, numpy) for c in e.args]
    infix = _NP_INFIX if numpy else _PY_INFIX
    if e.op in infix:
        return f"({parts[0]} {infix[e.op]} {parts[1]})"
    if numpy:
        return f"{_NP_CALLS[e.op]}({', '.join(parts)})"
    if e.op == "not":
        return f"(not {parts[0]})"
    if e.op == "select":
        return f"({parts[1]} if {parts[0]} else {parts[2]})"
    return f"{e.op}({', '.join(parts)})"


@dataclass(frozen=True)
class Slice:
    """A half-open range ``start:stop`` of a temporal dimension (step 1)."""

    start: Expr
    stop: Expr
    pad: Expr | None = None
    """Rows the read delivers when set (at least ``stop - start``): the points, then rows
    that are not points, which the readers mask (``tempo.passes.tile``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", as_expr(self.start))
        object.__setattr__(self, "stop", as_expr(self.stop))
        if self.pad is not None:
            object.__setattr__(self, "pad", as_expr(self.pad))

    def symbols(self) -> frozenset[Symbol]:
        out = self.start.symbols() | self.stop.symbols()
        return out if self.pad is None else out | self.pad.symbols()

    @property
    def count(self) -> Expr:
        """The points read."""
        return self.stop - self.start

    @property
    def size(self) -> Expr:
        """The rows delivered: the points, padded to ``pad`` when set."""
        return self.count if self.pad is None else self.pad

    def substitute(self, mapping: dict[Symbol, ExprLike]) -> Slice:
        pad = None if self.pad is None else self.pad.substitute(mapping)
        return Slice(self.start.substitute(mapping), self.stop.substitute(mapping), pad)

    def __repr__(self) -> str:
        return f"{self.start}:{self.stop}" + ("" if self.pad is None else f" (padded to {self.pad})")


IndexEntry = Expr | Slice


def compile_function(exprs: Iterable[IndexEntry], params: Iterable[Symbol],
                     constants: dict[Symbol, int] | None = None) -> Callable[..., tuple]:
    """A Python function of ``params`` returning the tuple of ``exprs`` (slices as ``slice``;
    a padded slice's rows are its ``step``).

    Bound symbols are folded in from ``constants``. The function is generated source, so
    the per-call cost is that of plain Python arithmetic.
    """
    params = list(params)
    names = {s: f"_a{k}" for k, s in enumerate(params)}
    subst = dict(constants or {})
    body = []
    for entry in exprs:
        if isinstance(entry, Slice):
            entry = entry.substitute(subst)  # type: ignore[arg-type]
            pad = "" if entry.pad is None else f", {entry.pad.to_python(names)}"  # rows, as the step
            body.append(f"slice({entry.start.to_python(names)}, {entry.stop.to_python(names)}{pad})")
        else:
            body.append(entry.substitute(subst).to_python(names))  # type: ignore[arg-type]
    src = f"lambda {', '.join(names[s] for s in params)}: ({''.join(b + ', ' for b in body)})"
    return eval(src, {"min": min, "max": max, "slice": slice})  # noqa: S307 - generated source


def compile_vectorized(exprs: Iterable[Expr], params: Iterable[Symbol],
                       constants: dict[Symbol, int] | None = None) -> Callable[..., tuple]:
    """``compile_function`` for NumPy arrays: each param is a scalar or an array (the
    arrays of one shape), and each result an array of that shape (integers, or booleans
    for conditions), so that a loop's indices are computed for all its iterations at once."""
    params = list(params)
    names = {s: f"_a{k}" for k, s in enumerate(params)}
    subst = dict(constants or {})
    body = "".join(_to_python(e.substitute(subst), names, numpy=True) + ", " for e in exprs)
    shapes = "".join(f"_np.shape({names[s]}), " for s in params)
    src = f"lambda {', '.join(names[s] for s in params)}: _broadcast(({body}), ({shapes}))"
    return eval(src, {"_np": np, "_broadcast": _broadcast})  # noqa: S307 - generated source


def _broadcast(values: tuple, shapes: tuple) -> tuple:
    distinct = {s for s in shapes if s}
    shape = distinct.pop() if len(distinct) == 1 else np.broadcast_shapes(*shapes)
    # (``getattr``, not ``np.shape``: that converts a Python scalar to an array to ask;
    # ``np.full`` makes a scalar's array in a third of ``np.broadcast_to``'s time)
    return tuple(v if getattr(v, "shape", ()) == shape else np.full(shape, v) if getattr(v, "ndim", 0) == 0
                 else np.broadcast_to(v, shape) for v in values)
