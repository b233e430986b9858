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
