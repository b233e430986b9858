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
    import jax
    platform = jax.default_backend()  # (cpu here and in CI; gpu on a GPU machine)
    assert describe_backend("auto").startswith(f"backend: jax (auto) on {platform} device")
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
    # (shapes no other test makes: JAX would not compile a shape it compiled before)
    value = np.arange(7 * 13, dtype=np.int16).reshape(7, 13)
    const = Op(7919, "const", {"value": value}, (), (TensorType((7, 13), "int16"),), None, when=TRUE)
    try:
        with jax.log_compiles():
            zeros = backend.zeros((11, 3, 5), "int16")
            on_device = backend.kernel(const, {"value": value}, True)({})
    finally:
        logger.removeHandler(handler)
    assert compiled == []
    assert isinstance(zeros, jax.Array) and zeros.dtype == np.int16
    np.testing.assert_array_equal(np.asarray(zeros), np.zeros((11, 3, 5), np.int16))
    assert isinstance(on_device, jax.Array)
    value[0, 0] = 99  # the device value is a copy: the user's array may change later
    assert int(on_device[0, 0]) == 0
    np.testing.assert_array_equal(np.asarray(on_device)[1:], value[1:])


def test_host_arrays_reach_the_device_without_compiling_as_copies():
    """A lowered loop's masks and indices (``resident``), a host op's large output
    (``from_host``) and stacked host points (``stack``) compile no program
    (``jnp.asarray`` compiles one per shape, as the control shows); what is moved is a copy,
    which later changes to the host array do not reach (the arrays are aligned, which a CPU's
    ``device_put`` would otherwise adopt)."""
    import jax
    from compile_log import compiled_here

    from tempo.runtime.backends import SMALL_HOST_BYTES, make_backend
    from tempo.runtime.stores import aligned_zeros
    backend = make_backend("jax")
    # (shapes no other test makes: JAX would not compile a shape it compiled before)
    mask = aligned_zeros((4099,), "bool")
    mask[::3] = True
    big = aligned_zeros((SMALL_HOST_BYTES // 2 + 4099,), "int16")
    big[:] = np.arange(big.size) % 251
    points = [np.full((5, 7), k, np.float32) for k in range(3)]
    with compiled_here() as compiled:
        moved = [backend.resident(mask), backend.from_host(big), backend.stack(points)]
        control = jax.numpy.asarray(np.zeros((4099, 3), np.int8))
    assert len(compiled) == 1 and "stage" in compiled[0], compiled  # (the control's)
    assert all(isinstance(v, jax.Array) for v in [*moved, control])
    expected = [mask.copy(), big.copy(), np.stack(points)]
    mask[:] = True
    big[:] = 7
    for value, want in zip(moved, expected):
        np.testing.assert_array_equal(np.asarray(value), want)


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


def _state_program():
    """A recurrent state that its update donates (the point read last each step)."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    state = np.random.default_rng(2).normal(size=(8, 64)).astype(np.float32)
    with ctx:
        y = tp.placeholder(shape=(64,), dtype="float32", domain=(t,))
        y[0] = tp.const(state[0])
        y[t + 1] = (y * 0.5 + tp.const(state)[t + 1]).tanh()
        last = y[T - 1]
    return ctx, {T: 8}, [last]


@pytest.mark.parametrize("program,loops,memory", [
    (_whole_rows_program, "interpreted", None), (_whole_rows_program, "lowered", None),
    (_state_program, "interpreted", tp.MemoryPolicy(donate_min_bytes=0))])
def test_kernels_compiled_ahead_are_the_programs_their_launches_run(monkeypatch, program, loops, memory):
    """The first run compiles the kernels of statements launched one by one in the
    background (``Executable._compile_ahead``), for the input shapes and dtypes the types
    say and the inputs the statement donates; made to wait for those compiles, no launch
    of such a kernel compiles anything (else the program compiled ahead is never used),
    and the values are the reference evaluator's."""
    import logging

    import jax

    from tempo.reference import evaluate
    from tempo.runtime import executable
    from tempo.runtime.backends import JaxBackend
    compiled_in_launch: dict[int, list[bool]] = {}
    ahead: set[int] = set()
    compile_ahead, jitted = JaxBackend.compile_ahead, JaxBackend._jitted

    def recording_ahead(self, op, static_params, inputs, donate=()):
        ahead.add(op.id)
        return compile_ahead(self, op, static_params, inputs, donate)

    compiles: list[str] = []  # what JAX compiles on this thread (it logs its own thread's)

    class Compiles(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Compiling"):
                compiles.append(record.getMessage())

    class Recorded:  # the jitted kernel, noting whether a call compiled a program
        def __init__(self, kernel, op_id):
            self.kernel, self.op_id = kernel, op_id

        def lower(self, *args):
            return self.kernel.lower(*args)

        def __call__(self, *xs):
            before = len(compiles)
            out = self.kernel(*xs)
            compiled_in_launch.setdefault(self.op_id, []).append(len(compiles) > before)
            return out

    def waiting(futures, launch):  # the first launches wait (none takes a compile over)
        def launch_after(point):
            for future in futures:
                future.result()  # (raises if the compile failed)
            launch(point)
        return launch_after
    monkeypatch.setattr(JaxBackend, "compile_ahead", recording_ahead)
    monkeypatch.setattr(JaxBackend, "_jitted", lambda self, kind, params, donate=(), op_id=None:
                        Recorded(jitted(self, kind, params, donate, op_id), op_id))
    monkeypatch.setattr(executable, "_after_compiling", waiting)
    ctx, bounds, outputs = program()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy(loops), memory=memory)
    handler, logger = Compiles(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            got = exe.run()
    finally:
        logger.removeHandler(handler)
    ref = evaluate(ctx, bounds, outputs)
    for rt in outputs:
        np.testing.assert_allclose(got[rt], ref[rt.key], rtol=1e-5, atol=1e-6)
    launched = {op_id: calls for op_id, calls in compiled_in_launch.items() if op_id in ahead}
    assert launched, (ahead, compiled_in_launch)
    assert not any(any(calls) for calls in launched.values()), \
        {exe.graph.ops[op_id].name: calls for op_id, calls in launched.items()}
    if memory is not None:
        assert exe.stats.donated > 0


def test_float32_contractions_are_lowered_at_float32_precision():
    """Kernels' matrix products ask XLA for float32 precision (on a GPU JAX's default
    rounds their inputs to TensorFloat-32; on this CPU both are float32, so the lowered
    program is what can be checked): the kernels of ``matmul`` and of ``discounted_sum``
    (a tensordot), traced with the backend's namespace."""
    import jax
    import jax.numpy as jnp

    from tempo.ir.ops import op_def
    from tempo.runtime.backends import JaxBackend
    xp = JaxBackend().xp
    a = jnp.ones((3, 4), jnp.float32)
    kernels = {"matmul": (lambda x: op_def("matmul").kernel(xp, {}, x, x.T)),
               "discounted_sum": (lambda x: op_def("discounted_sum").kernel(xp, {"dim": 0, "gamma": 0.9}, x))}
    for kind, kernel in kernels.items():
        assert "precision = [HIGHEST, HIGHEST]" in jax.jit(kernel).lower(a).as_text(), kind


def _keys(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Keys with many ties and, for floats, both zeros, both infinities and NaNs of
    several signs and payloads."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        pool = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, np.nan, 3e-39, -3e-39], np.float32)
        x = rng.choice(np.concatenate([pool, rng.standard_normal(8).astype(np.float32)]), size=shape)
        x = x.astype(dtype)
        nan = np.isnan(x)
        if dtype == np.float32:
            payloads = np.array([0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001], np.uint32)
        elif dtype == np.float16:
            payloads = np.array([0x7E00, 0xFE00, 0x7E01, 0x7C01], np.uint16)
        else:
            return x
        x.view(payloads.dtype)[nan] = rng.choice(payloads, size=int(nan.sum()))
        return x
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    info = np.iinfo(dtype)
    return rng.choice(np.array([info.min, info.max, 0, 1, info.max // 2]), size=shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "int16", "int32", "uint8",
                                   "uint16", "uint32", "int64", "bool"])
def test_stable_argsort_is_numpys_stable_argsort(dtype):
    """The packed sort orders as NumPy's stable argsort does, ties by index: equal
    values, -0.0 and 0.0, every NaN (whatever its sign and payload) after +inf; along any
    axis, and for empty arrays (64-bit keys take NumPy's own)."""
    from tempo.runtime.backends import _ordered_bits, stable_argsort
    rng = np.random.default_rng(0)
    cases = [((1000,), -1), ((7, 300), 1), ((7, 300), 0), ((3, 5, 64), 1), ((0,), 0), ((4, 0), -1),
             ((0, 5), -1)]
    for shape, axis in cases:
        keys = _keys(np.dtype(dtype), shape, rng)
        packed = _ordered_bits(np.moveaxis(keys, axis, -1)) is not None  # (else NumPy's own sort)
        assert packed == (np.dtype(dtype).itemsize <= 4)
        with np.errstate(invalid="raise"):  # (a signaling NaN must not reach arithmetic that warns)
            order = stable_argsort(keys, axis)
        assert order.dtype == np.int32
        np.testing.assert_array_equal(order, np.argsort(keys, axis=axis, kind="stable"))


def _recurrence_by_loop(c: np.ndarray, d: np.ndarray, dim: int, forward: bool) -> np.ndarray:
    """``x[k] = d[k] + c[k] * x[k -/+ 1]`` row by row, in float64 (``c`` all ``n`` rows)."""
    c, d = np.moveaxis(c, dim, 0).astype(np.float64), np.moveaxis(d, dim, 0).astype(np.float64)
    x, n = d.copy(), d.shape[0]
    for k in (range(1, n) if forward else range(n - 2, -1, -1)):
        x[k] = d[k] + c[k] * x[k - 1 if forward else k + 1]
    return np.moveaxis(x, 0, dim)


@pytest.mark.parametrize("forward", [False, True])
def test_linear_recurrence_on_cpu_is_the_recurrence(forward):
    """JAX on a CPU runs ``linear_recurrence`` as a scan (``XlaNamespace``), NumPy by
    doubling steps: both give the recurrence, along any dim, with the coefficients of
    every row or of the ``n - 1`` rows used, for any length (one row: the terms)."""
    import jax
    import jax.numpy as jnp

    from tempo.ir.ops import _linear_recurrence
    from tempo.runtime.backends import XlaNamespace

    xla = XlaNamespace(jax, jnp, on_cpu=True)
    off_cpu = XlaNamespace(jax, jnp, on_cpu=False)
    ones = np.ones((8, 3), np.float32)

    def traced(xp) -> str:
        fn = lambda c, d: _linear_recurrence(xp, {"dim": 0, "forward": forward}, c, d)  # noqa: E731
        return str(jax.make_jaxpr(fn)(ones, ones))
    assert "scan[" in traced(xla) and "scan[" not in traced(off_cpu)  # (elsewhere: the doubling)
    assert getattr(off_cpu, "linear_recurrence", None) is None
    rng = np.random.default_rng(1)
    for shape, dim in [((250, 16), 0), ((3, 64, 2), 1), ((5, 7), -1), ((1, 4), 0), ((2, 3), 0)]:
        d = rng.normal(size=shape).astype(np.float32)
        c = rng.uniform(0.0, 1.0, size=shape).astype(np.float32)
        expected = _recurrence_by_loop(c, d, dim, forward)
        n = shape[dim]
        used = [slice(None)] * len(shape)
        used[dim] = slice(1, None) if forward else slice(0, n - 1)
        for coefficients in (c, c[tuple(used)]):
            params = {"dim": dim, "forward": forward}
            for xp in (xla, np):
                got = np.asarray(_linear_recurrence(xp, params, coefficients, d))
                assert got.dtype == np.float32 and got.shape == d.shape
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
