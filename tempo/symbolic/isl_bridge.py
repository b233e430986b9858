"""Translation between our expressions and isl (through ``islpy``).

isl is the algebra engine: sets of points, dependence relations, projections and
piecewise minima/maxima. Expressions go to isl as text with an explicit mapping from
symbols to isl variable names; results come back as isl AST expressions, which are
turned into our expressions by name lookup in the same mapping (never by parsing).
"""

from __future__ import annotations

from collections.abc import Mapping

import islpy as isl

from tempo.errors import UnsupportedExpressionError
from tempo.symbolic.expr import (
    Expr,
    Symbol,
    const,
    from_linear_form,
    linear_form,
    logical_and,
    logical_or,
    maximum,
    minimum,
    select,
)

_ISL_INFIX = {"add": "+", "sub": "-", "eq": "=", "ne": "!=", "lt": "<", "le": "<=",
              "gt": ">", "ge": ">=", "and": "and", "or": "or"}


def to_isl(e: Expr, names: Mapping[Symbol, str]) -> str:
    """isl text for a quasi-affine expression or condition."""
    if e.op == "const":
        v = e.value
        return ("true" if v else "false") if isinstance(v, bool) else str(v)
    if e.op == "sym":
        try:
            return names[e]  # type: ignore[index]
        except KeyError:
            raise UnsupportedExpressionError(
                f"symbol {e} is not a dimension in scope here") from None
    a = [to_isl(c, names) for c in e.args]
    if e.op == "ne":
        return f"({a[0]} < {a[1]} or {a[0]} > {a[1]})"
    if e.op in _ISL_INFIX:
        return f"({a[0]} {_ISL_INFIX[e.op]} {a[1]})"
    if e.op == "mul":
        if not (e.args[0].is_const or e.args[1].is_const):
            raise UnsupportedExpressionError(
                f"{e} multiplies two symbolic values; dependences must be quasi-affine")
        return f"({a[0]} * {a[1]})"
    if e.op in ("floordiv", "mod"):
        if not e.args[1].is_const or e.args[1].value <= 0:
            raise UnsupportedExpressionError(
                f"{e} divides by a non-constant or non-positive value")
        return f"floor({a[0]} / {a[1]})" if e.op == "floordiv" else f"({a[0]} mod {a[1]})"
    if e.op in ("min", "max"):
        return f"{e.op}({a[0]}, {a[1]})"
    if e.op == "not":
        return f"(not {a[0]})"
    raise UnsupportedExpressionError(f"isl cannot represent {e}")


_AST_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "fdiv_q": lambda a, b: a // b, "pdiv_q": lambda a, b: a // b, "div": lambda a, b: a // b,
    "pdiv_r": lambda a, b: a % b, "zdiv_r": lambda a, b: a % b,
    "eq": lambda a, b: a == b, "le": lambda a, b: a <= b, "lt": lambda a, b: a < b,
    "ge": lambda a, b: a >= b, "gt": lambda a, b: a > b,
    "and_": logical_and, "and_then": logical_and, "or_": logical_or, "or_else": logical_or,
}


def from_isl_ast_expr(e: isl.AstExpr, symbols: Mapping[str, Expr], eq_as: str = "eq") -> Expr:
    """Our expression for an isl AST expression; identifiers are looked up in ``symbols``.

    ``eq_as`` reads an equality that selects between two values as ``le`` or ``ge``
    (isl writes a one-point piece as an equality); the caller verifies the result.
    """
    kind = e.get_type()
    if kind == isl.ast_expr_type.int:
        return const(e.get_val().to_python())
    if kind == isl.ast_expr_type.id:
        name = e.get_id().get_name()
        if name not in symbols:
            raise UnsupportedExpressionError(f"isl produced an unknown identifier {name!r}")
        return symbols[name]
    op = e.get_op_type().name
    args = [from_isl_ast_expr(e.get_op_arg(k), symbols, eq_as) for k in range(e.get_op_n_arg())]
    if op in ("min", "max"):
        out = args[0]
        for a in args[1:]:
            out = minimum(out, a) if op == "min" else maximum(out, a)
        return out
    if op == "minus":
        return -args[0]
    if op in ("select", "cond"):
        cond = args[0]
        if cond.op == "eq" and eq_as != "eq":
            cond = _AST_BINARY[eq_as](*cond.args)
        try:
            return select_as_min_max(cond, args[1], args[2])
        except UnsupportedExpressionError:
            return select(args[0], args[1], args[2])
    if op in _AST_BINARY:
        return _AST_BINARY[op](*args)
    raise UnsupportedExpressionError(f"isl AST operation {op!r} is not supported")


def select_as_min_max(cond: Expr, a: Expr, b: Expr) -> Expr:
    """``a if cond else b`` as ``min(a, b)`` or ``max(a, b)`` when ``cond`` says which."""
    if cond.op in ("le", "lt", "ge", "gt"):
        lhs, rhs = cond.args
        if cond.op in ("ge", "gt"):
            lhs, rhs = rhs, lhs
        strict = cond.op in ("lt", "gt")
        gap = linear_form(rhs - lhs)  # cond: gap >= 0 (or > 0)
        if gap is not None:
            for candidate, pick in ((linear_form(b - a), minimum), (linear_form(a - b), maximum)):
                if candidate is None:
                    continue
                shift = candidate[1] - gap[1]
                if candidate[0] == gap[0] and shift in ((-1, 0) if strict else (0, 1)):
                    return pick(a, b)
    raise UnsupportedExpressionError(f"cannot express ({a} if {cond} else {b}) with min/max")


def pw_aff_to_expr(pa: isl.PwAff, context: isl.Set, symbols: Mapping[str, Expr]) -> Expr:
    """Our expression for a piecewise quasi-affine function, simplified within ``context``."""
    build = isl.AstBuild.from_context(context)
    simplified = pa.coalesce().gist(context).coalesce()
    ast = build.expr_from_pw_aff(simplified)
    names = {sym: name for name, sym in symbols.items()}
    for eq_as in ("eq", "le", "ge"):
        try:
            out = normalize(from_isl_ast_expr(ast, symbols, eq_as))
            text = to_isl(out, names)  # a select that is no min/max has no isl form
        except UnsupportedExpressionError:
            continue
        params = ", ".join(names.values())
        back = isl.PwAff(f"[{params}] -> {{ [({text})] }}")
        where = pa.domain().intersect_params(context)
        if back.intersect_domain(where).is_equal(pa.intersect_domain(where)):
            return out
    raise UnsupportedExpressionError(f"cannot write {pa} with min/max")


def normalize(e: Expr) -> Expr:
    """Affine parts written canonically (``T - t - 1`` rather than ``0 - t + T - 1``)."""
    form = linear_form(e)
    if form is not None:
        return from_linear_form(form)
    if e.op in ("min", "max"):
        fn = minimum if e.op == "min" else maximum
        return fn(normalize(e.args[0]), normalize(e.args[1]))
    return e
