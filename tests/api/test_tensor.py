"""Domain and shape inference of the frontend (the semantics of docs/programming-model.md,
"Recurrent tensors")."""

import numpy as np
import pytest

import tempo as tp
from tempo.runtime.backends import HOST_SORT_MIN
from tempo.symbolic.expr import as_expr


@pytest.fixture
def ctx():
    return tp.Context(dims=("i", "t"))


def test_spatial_index_by_symbol_adds_the_dim(ctx):
    i, t = ctx.dims
    with ctx:
        x = tp.const(np.zeros((4, 100), np.float32))[i, t]
    assert x.domain == (i, t) and x.shape == ()


def test_domains_union_in_context_order(ctx):
    i, t = ctx.dims
    with ctx:
        a = tp.symbol_value(t)
        b = tp.symbol_value(i)
        assert (a + b).domain == (i, t)


def test_temporal_indexing_rules(ctx):
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        x = tp.symbol_value(t) + tp.symbol_value(i)
        assert x[i, t - 1].domain == (i, t)
        assert x[i, 0].domain == (i,)
        assert x[0].domain == (t,)               # missing entries are the identity
        window = x[i, tp.max(0, t - 3):t + 1]
        assert window.domain == (i, t)
        assert window.shape[0] is as_expr(t + 1 - tp.max(0, t - 3))
        whole = x[i, 0:T]
        assert whole.domain == (i,) and whole.shape[0] is T
        assert x[i, t:T].shape[0] is T - t


def test_python_scalars_adopt_the_tensor_dtype(ctx):
    with ctx:
        x = tp.const(np.ones(3, np.float32))
        assert (x * 2).dtype == "float32"
        assert (x * 2.5).dtype == "float32"
        k = tp.const(np.ones(3, np.int32))
        assert (k + 1).dtype == "int32"
        assert (k * 0.5).dtype == "float32"


def test_placeholder_label_is_the_assigned_name(ctx):
    with ctx:
        state = tp.placeholder(shape=(2,))
    assert state.op.name.startswith("state#")


def test_assignment_value_outside_placeholder_domain_is_rejected(ctx):
    i, t = ctx.dims
    with ctx:
        y = tp.placeholder(shape=(), domain=(t,))
        with pytest.raises(tp.DomainError, match="varies over i"):
            y[True] = tp.symbol_value(i).astype("float32")


def test_symbol_of_another_context_is_rejected(ctx):
    other = tp.Context(dims=("k",))
    (k,) = other.dims
    with ctx, pytest.raises(tp.DomainError, match="not a dim"):
        tp.symbol_value(k)


def test_non_affine_dependence_names_the_line(ctx):
    i, t = ctx.dims
    I, T = ctx.bounds
    with ctx:
        x = tp.symbol_value(t)
        y = x[t * t]
    with pytest.raises(tp.UnsupportedExpressionError, match="test_tensor.py"):
        ctx.compile({I: 1, T: 4}, [y], backend="numpy")


@pytest.mark.parametrize("backend", ["numpy", "jax"])
@pytest.mark.parametrize("size", [10, HOST_SORT_MIN])
def test_argsort_of_random_keys_is_a_permutation(backend, size):
    """Both of the JAX backend's CPU sorts (XLA's for short keys, NumPy's called back for
    long ones) are NumPy's stable argsort."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        keys = tp.uniform((size,), domain=(t,))
        perm = keys.argsort()
    res = ctx.compile({T: 5}, outputs=[keys, perm], backend=backend).run()
    np.testing.assert_array_equal(res[perm], np.argsort(res[keys], axis=-1, stable=True))
    assert all(sorted(row) == list(range(size)) for row in res[perm].tolist())
    assert len({tuple(row) for row in res[perm].tolist()}) == 5   # a new draw at every t
