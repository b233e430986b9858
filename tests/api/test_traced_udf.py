"""Traceable UDFs: pure JAX functions that run as device ops (and fuse), on both backends,
with their outputs found by tracing and declared outputs checked."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import tempo as tp


def _step(x, a):
    return jnp.sin(x) + a, (x * a).sum()


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_traced_udf_matches_the_function_and_fuses(backend):
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(data)[t] * 2.0
        a = tp.symbol_value(t).astype("float32")
        y, s = tp.udf(_step, [x, a], traceable=True, name="step")
        z = y + 1.0
    exe = ctx.compile({T: 4}, outputs=[z, s], backend=backend)
    res = exe.run()
    xs, steps = data * 2.0, np.arange(4, dtype=np.float32)[:, None]
    np.testing.assert_allclose(res[z], np.sin(xs) + steps + 1.0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(res[s], (xs * steps).sum(1), rtol=1e-6)
    # The UDF runs inside the one fused op, with the ops around it and the outputs.
    assert any(n.startswith("fusion: 5 ops into 1 fused ops") for n in exe.report.notes), exe.report.notes
    assert [op.kind for op in exe.graph.ops.values() if op.kind != "eval_symbol"] == ["fused"]


def test_declared_outputs_are_checked_against_the_trace():
    ctx = tp.Context(dims=("t",))
    with ctx:
        x = tp.const(np.zeros(3, np.float32))
        with pytest.raises(tp.TempoError, match="returns .* declared"):
            tp.udf(lambda v: v * 2, [x], [((4,), "float32")], traceable=True)
        with pytest.raises(tp.TempoError, match="failed to trace"):
            tp.udf(lambda v: v @ jnp.ones((5, 5)), [x], traceable=True)
