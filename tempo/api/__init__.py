"""The user-facing API: contexts, recurrent tensors and the functions that build them."""

from tempo.api.context import Context
from tempo.api.functions import (
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
from tempo.api.tensor import RecurrentTensor

__all__ = ["Context", "RecurrentTensor", "cat", "const", "matmul", "max", "min", "normal",
           "placeholder", "randint", "sink", "stack", "stop_when", "symbol_value", "udf", "uniform", "where"]
