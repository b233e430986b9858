"""The SDG checker catches broken invariants and shows the offending op and edge."""

import dataclasses

import numpy as np
import pytest

import tempo as tp
from tempo.errors import GraphError
from tempo.ir.graph import Edge
from tempo.ir.types import TensorType
from tempo.ir.validate import check_graph, resolve_bounds


def _program():
    ctx = tp.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = tp.const(np.arange(6, dtype=np.float32))[t]
        y = tp.placeholder(shape=(), domain=(t,))
        y[0] = x[0]
        y[t + 1] = y * 0.5 + x[t + 1]
    return ctx, x, y


def test_frontend_graph_passes_the_checker():
    ctx, _, _ = _program()
    check_graph(ctx.graph, ctx.bound_of)


def test_dependence_with_wrong_arity_is_reported():
    ctx, _, y = _program()
    edges = ctx.graph.in_edges(y.op)
    edges[0] = dataclasses.replace(edges[0], phi=(*edges[0].phi, edges[0].phi[0]) if edges[0].phi
                                   else (ctx.dims[0],))
    with pytest.raises(GraphError, match="entries for a source domain"):
        check_graph(ctx.graph, ctx.bound_of)


def test_symbol_outside_sink_domain_is_reported():
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        x = tp.symbol_value(t) + 1
    op = x.op
    edge = ctx.graph.in_edges(op)[0]
    ctx.graph.in_edges(op)[0] = Edge(op, 0, edge.src, edge.src_out, (i,))
    with pytest.raises(GraphError, match="not in the sink's domain"):
        check_graph(ctx.graph, ctx.bound_of)


def test_type_drift_is_reported():
    ctx, x, _ = _program()
    x.op.outputs = (TensorType((3,), "float32"),)
    with pytest.raises(GraphError):
        check_graph(ctx.graph, ctx.bound_of)


def test_bounds_are_resolved_by_symbol_or_name_and_validated():
    ctx, _, _ = _program()
    (T,) = ctx.bounds
    assert resolve_bounds(ctx.graph, ctx.bound_of, {"T": 4}) == {T: 4}
    with pytest.raises(tp.BoundsError, match="at least 1"):
        resolve_bounds(ctx.graph, ctx.bound_of, {T: 0})
    with pytest.raises(tp.BoundsError, match="not a bound"):
        resolve_bounds(ctx.graph, ctx.bound_of, {"Q": 3, T: 2})


def test_dot_export_lists_every_op_and_edge():
    ctx, _, _ = _program()
    dot = ctx.graph.to_dot()
    assert dot.startswith("digraph sdg {") and dot.rstrip().endswith("}")
    assert all(f"op{op.id} [" in dot for op in ctx.graph.ops.values())
    assert dot.count("->") == sum(1 for _ in ctx.graph.edges())


def test_compile_checks_only_what_the_outputs_need():
    """An unrelated unassigned placeholder and an unrelated dim's bound block nothing."""
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        tp.placeholder(shape=(), domain=(t,))          # never assigned, never read
        tp.symbol_value(i) * 2                         # needs I, never read
        b = tp.symbol_value(t) + 1
    for backend in ("numpy", "jax"):
        np.testing.assert_array_equal(ctx.compile({T: 3}, [b], backend=backend).run()[b], [1, 2, 3])
    from tempo.reference import evaluate
    np.testing.assert_array_equal(evaluate(ctx, {T: 3}, [b])[b.key], [1, 2, 3])
