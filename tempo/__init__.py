"""Tempo: recurrent tensors compiled through a symbolic dependence graph, isl and JAX."""

from tempo.api import (
    Context,
    RecurrentTensor,
    cat,
    const,
    matmul,
    max,
    min,
    normal,
    placeholder,
    randint,
    sink,
    stack,
    stop_when,
    symbol_value,
    udf,
    uniform,
    where,
)
from tempo.errors import (
    BoundsError,
    DomainError,
    OutOfRangeError,
    ShapeError,
    TempoError,
    UDFError,
    UndefinedPointError,
    UnschedulableError,
    UnsupportedExpressionError,
)
from tempo.options import Distribution, LoopPolicy, MemoryPolicy
from tempo.runtime.profile import RunProfile
from tempo.symbolic.expr import Slice, Symbol

__all__ = [
    "BoundsError", "Context", "Distribution", "DomainError", "LoopPolicy", "MemoryPolicy", "OutOfRangeError",
    "RecurrentTensor", "RunProfile", "ShapeError", "Slice", "Symbol", "TempoError", "UDFError",
    "UndefinedPointError",
    "UnschedulableError", "UnsupportedExpressionError", "cat", "const", "matmul", "max", "min", "normal",
    "placeholder", "randint", "sink", "stack", "stop_when", "symbol_value", "udf", "uniform", "where",
]
__version__ = "0.1.0"
