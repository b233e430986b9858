"""Symbols, expressions, slices, inversion and the isl bridge."""

from tempo.symbolic.expr import (
    FALSE,
    TRUE,
    Expr,
    IndexEntry,
    Slice,
    Symbol,
    as_expr,
    compile_function,
    const,
    maximum,
    minimum,
)
from tempo.symbolic.inversion import invert_dependence, read_condition

__all__ = ["FALSE", "TRUE", "Expr", "IndexEntry", "Slice", "Symbol", "as_expr",
           "compile_function", "const", "invert_dependence", "maximum", "minimum", "read_condition"]
