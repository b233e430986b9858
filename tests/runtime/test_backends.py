"""Backend-specific behaviour: dtype support and agreement on the same program."""

import numpy as np
import pytest

import tempo as tp


def _float64_program():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        a = tp.symbol_value(t).astype("float64") * 1.5
    return ctx, T, a


def test_numpy_backend_keeps_64_bit_dtypes():
    ctx, T, a = _float64_program()
    got = ctx.compile({T: 3}, [a], backend="numpy").run()[a]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.arange(3) * 1.5)


def test_jax_backend_rejects_64_bit_dtypes_without_x64():
    import jax
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is enabled in this process")
    ctx, T, a = _float64_program()
    with pytest.raises(tp.TempoError, match="x64"):
        ctx.compile({T: 3}, [a], backend="jax")


def test_unknown_backend_is_named():
    ctx, T, a = _float64_program()
    with pytest.raises(tp.TempoError, match="unknown backend 'torch'"):
        ctx.compile({T: 3}, [a], backend="torch")


@pytest.mark.parametrize("name", ["numpy", "jax"])
def test_rows_of_stacked_values_are_taken_where_the_values_are(name):
    """``take`` and ``rows`` index like NumPy; on JAX, device arrays through jitted
    functions, host arrays (a point op's batched values) in place, not moved whole."""
    from tempo.runtime.backends import make_backend

    backend = make_backend(name)
    host = np.arange(24, dtype=np.float32).reshape(6, 4)
    for values in (host, backend.from_host(host)):
        np.testing.assert_array_equal(np.asarray(backend.take(values, 2)), host[2])
        np.testing.assert_array_equal(np.asarray(backend.take(values, np.array([5, 0, 5]))), host[[5, 0, 5]])
        np.testing.assert_array_equal(np.asarray(backend.rows(values, 1, 3)), host[1:4])
    assert isinstance(backend.take(host, 2), np.ndarray)
    assert isinstance(backend.rows(host, 1, 3), np.ndarray)


def test_auto_is_jax_where_it_imports_and_numpy_where_it_does_not(monkeypatch):
    import builtins

    from tempo.runtime.backends import describe_backend, make_backend, resolve_backend

    assert resolve_backend("auto") == "jax" and make_backend("auto").name == "jax"
    assert describe_backend("auto").startswith("backend: jax (auto) on cpu device")
    assert describe_backend("numpy") == "backend: numpy on host CPU"
    real_import = builtins.__import__

    def without_jax(name, *args, **kwargs):
        if name == "jax" or name.startswith("jax."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", without_jax)
    assert resolve_backend("auto") == "numpy"
    assert describe_backend("auto") == "backend: numpy (auto) on host CPU (JAX is not installed)"
    ctx, T, a = _float64_program()  # what auto compiles to runs: 64-bit values on NumPy
    np.testing.assert_array_equal(ctx.compile({T: 3}, [a]).run()[a], np.arange(3) * 1.5)


def test_zeros_and_constants_reach_the_device_without_compiling():
    """``jnp.zeros`` and ``jnp.asarray`` compile a program per shape (about 15 ms each on a
    CPU); a lowered loop's initial carries and the program's constants are moved there
    instead."""
    import logging

    import jax

    from tempo.ir.graph import Op
    from tempo.ir.types import TensorType
    from tempo.runtime.backends import make_backend
    from tempo.symbolic.expr import TRUE
    backend = make_backend("jax")
    compiled: list[str] = []

    class Compiles(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Compiling"):
                compiled.append(record.getMessage())
    handler, logger = Compiles(), logging.getLogger("jax")
    logger.addHandler(handler)
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    const = Op(7919, "const", {"value": value}, (), (TensorType((3, 4), "float32"),), None, when=TRUE)
    try:
        with jax.log_compiles():
            zeros = backend.zeros((5, 3), "int32")
            on_device = backend.kernel(const, {"value": value}, True)({})
    finally:
        logger.removeHandler(handler)
    assert compiled == []
    assert isinstance(zeros, jax.Array) and zeros.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(zeros), np.zeros((5, 3), np.int32))
    assert isinstance(on_device, jax.Array)
    np.testing.assert_array_equal(np.asarray(on_device), value)


def _whole_rows_program():
    """Over (i, t): a recurrence over t whose rows are read whole at every i (a slice of a
    block store), a point read of the last row, and a recurrence over i."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(0)
    with ctx:
        x = tp.const(rng.uniform(-1, 1, (4, 6, 3)).astype(np.float32))[i, t]
        h = tp.placeholder(shape=(3,), dtype="float32", domain=(i,))
        s = tp.placeholder(shape=(3,), dtype="float32", domain=(i, t))
        s[t == 0] = x + h
        s[True] = (s[i, t - 1] * 0.5 + x).tanh()
        total = s[i, 0:T].sum(0) + s[i, T - 1]
        h[0] = x[0, 0]
        h[i + 1] = (h[i] + total[i] * 0.1).tanh()
    return ctx, {I: 4, T: 6}, [s, total, h]


@pytest.mark.parametrize("loops", ["interpreted", "lowered"])
def test_kernels_compiled_ahead_get_the_inputs_they_were_compiled_for(monkeypatch, loops):
    """The first run compiles the kernels of statements launched one by one in the
    background (``Executable._compile_ahead``), for the input shapes and dtypes the types
    say; every launch of such a kernel gets exactly those (else the program compiled
    ahead would never be used), and the values are the reference evaluator's."""
    from tempo.reference import evaluate
    from tempo.runtime.backends import JaxBackend
    ahead: dict[int, list] = {}
    calls: dict[int, list] = {}
    compile_ahead, jitted = JaxBackend.compile_ahead, JaxBackend._jitted

    def recording_ahead(self, op, static_params, inputs):
        ahead[op.id] = [(tuple(shape), np.dtype(dtype)) for shape, dtype in inputs]
        return compile_ahead(self, op, static_params, inputs)

    def recording_jitted(self, kind, params, donate=(), op_id=None):
        kernel = jitted(self, kind, params, donate, op_id)

        def call(*xs):
            calls.setdefault(op_id, []).append([(tuple(np.shape(x)), np.dtype(x.dtype)) for x in xs])
            return kernel(*xs)
        return call
    monkeypatch.setattr(JaxBackend, "compile_ahead", recording_ahead)
    monkeypatch.setattr(JaxBackend, "_jitted", recording_jitted)
    ctx, bounds, outputs = _whole_rows_program()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy(loops))
    got = exe.run()
    ref = evaluate(ctx, bounds, outputs)
    for rt in outputs:
        np.testing.assert_allclose(got[rt], ref[rt.key], rtol=1e-5, atol=1e-6)
    launched = {op_id: shapes for op_id, shapes in calls.items() if op_id in ahead}
    assert launched and any(len(shape) > 1 for shapes in ahead.values() for shape, _ in shapes)
    for op_id, shapes in launched.items():
        assert all(call == ahead[op_id] for call in shapes), (exe.graph.ops[op_id].name, ahead[op_id], shapes)
