"""The symbolic dependence graph: ops, edges, op definitions and validation."""

from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.ops import OPS, OpDef, op_def
from tempo.ir.types import TensorType

__all__ = ["OPS", "SDG", "Edge", "Op", "OpDef", "TensorType", "op_def"]
