"""Array backends: how kernels run, where values live, how stores stack and update."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from tempo.errors import TempoError, Uncapturable
from tempo.ir.graph import Op
from tempo.ir.ops import op_def
from tempo.runtime.stores import ALIGNMENT

DeviceKernel = Callable[..., Any]  # (params, *inputs) -> array or tuple
SMALL_HOST_BYTES = 1024
"""Host values up to this size are not moved to the JAX device (see ``from_host``)."""
VIEW_MIN_BYTES = 1 << 16
"""Block-store rows at least this large are handed to JAX kernels as device arrays over
the host buffer (``JaxBackend.view_of_host``); below it ``device_put`` costs more than the
copy a kernel makes."""


class Backend(Protocol):
    """What the runtime asks of an array backend (``NumpyBackend``, ``JaxBackend``)."""

    name: str
    mesh: Any
    """The device mesh a parallel dim is split over (JAX), or None."""
    one_at_a_time: bool
    """Kernels return once their outputs are computed (no asynchronous dispatch)."""
    on_cpu: bool
    """Whether the backend computes on this host's CPU (its arrays are host memory)."""
    capturing: bool
    """Whether an iteration is being traced into one program (``tempo.runtime.capture``)."""

    def kernel(self, op: Op, static_params: dict | None, static_shapes: bool) -> DeviceKernel:
        """The function that runs ``op`` on this backend's arrays."""
        ...

    def compile_ahead(self, op: Op, static_params: dict, inputs: list[tuple[tuple[int, ...], str]],
                      donate: tuple[int, ...] = ()) -> Future | None:
        """Start compiling ``op``'s kernel (taking over the inputs at ``donate``) for
        inputs of these shapes and dtypes in the background (None: nothing to compile)."""
        ...

    def from_host(self, value: np.ndarray) -> Any:
        """A host array as this backend's value."""
        ...

    def resident(self, value: np.ndarray) -> Any:
        """A host array that many calls take, as this backend's value moved there once."""
        ...

    def view_of_host(self, rows: np.ndarray) -> Any:
        """Rows of a host buffer as a value kernels take (without a copy where possible)."""
        ...

    def to_host(self, value: Any) -> np.ndarray:
        ...

    def copy_to_host_ahead(self, values: list[Any]) -> None:
        """Start copying ``values`` to host memory, for a ``to_host`` later that should not
        wait for the copy (nothing to do where values are host memory)."""
        ...

    def process_rows(self, dim: str, size: int) -> tuple[int, int] | None:
        """The rows ``lo .. hi - 1`` of ``size`` that this process's devices hold of a value
        split along ``dim`` over a mesh of several processes; None where every process
        holds (or gathers) every row."""
        ...

    def check_dtype(self, op: Op) -> None:
        """An error if ``op``'s dtypes are not supported here."""
        ...

    def stack(self, values: list[Any]) -> Any:
        ...

    def concatenate(self, values: list[Any], axis: int = 0) -> Any:
        """``values`` joined along ``axis``."""
        ...

    def moveaxis(self, value: Any, source: int, destination: int) -> Any:
        """``value`` with axis ``source`` moved to ``destination``."""
        ...

    def synchronize(self, value: Any) -> None:
        """Wait until ``value`` (and what it depends on) is computed."""
        ...

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Any:
        ...

    def donatable(self, value: Any) -> bool:
        """Whether a kernel may take over ``value``'s buffer."""
        ...

    def take(self, values: Any, rows: Any, axis: int = 0) -> Any:
        ...

    def rows(self, values: Any, start: int, count: int, axis: int = 0) -> Any:
        ...


class NumpyBackend:
    """Plain NumPy on the host: simple, for tests and debugging."""

    name = "numpy"
    mesh = None
    one_at_a_time = False
    on_cpu = True
    capturing = False

    def kernel(self, op: Op, static_params: dict | None, static_shapes: bool) -> DeviceKernel:
        fn = op.definition.kernel
        return lambda params, *xs: fn(np, params, *xs)

    def from_host(self, value: np.ndarray) -> Any:
        return value

    def resident(self, value: np.ndarray) -> Any:
        return value

    def view_of_host(self, rows: np.ndarray) -> np.ndarray:
        return rows

    def to_host(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def copy_to_host_ahead(self, values: list[Any]) -> None:
        """NumPy values are host memory."""

    def process_rows(self, dim: str, size: int) -> None:
        return None

    def check_dtype(self, op: Op) -> None:
        """Every dtype runs on NumPy."""

    def stack(self, values: list[Any]) -> Any:
        return np.stack(values)

    def concatenate(self, values: list[Any], axis: int = 0) -> Any:
        return np.concatenate(values, axis)

    def moveaxis(self, value: Any, source: int, destination: int) -> Any:
        return np.moveaxis(value, source, destination)

    def synchronize(self, value: Any) -> None:
        """NumPy computes eagerly: nothing to wait for."""

    def compile_ahead(self, op: Op, static_params: dict, inputs: list[tuple[tuple[int, ...], str]],
                      donate: tuple[int, ...] = ()) -> Future | None:
        """NumPy kernels are not compiled."""
        return None

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Any:
        return np.zeros(shape, dtype)

    def donatable(self, value: Any) -> bool:
        """NumPy kernels allocate their outputs: nothing is donated."""
        return False

    def take(self, values: Any, rows: Any, axis: int = 0) -> Any:
        """``values[rows]`` along ``axis``: one row (an int) or several (an index array)."""
        return values[rows] if axis == 0 else np.take(values, rows, axis)

    def rows(self, values: Any, start: int, count: int, axis: int = 0) -> Any:
        """``values[start:start + count]`` along ``axis``."""
        return values[(slice(None),) * axis + (slice(start, start + count),)]


class JaxBackend:
    """JAX: kernels are jitted once per op (and per distinct symbolic params); values stay
    on the device between ops."""

    name = "jax"

    def __init__(self, mesh: Any = None) -> None:
        import jax
        import jax.numpy as jnp

        from tempo.cache import enable_jax_cache
        enable_jax_cache()  # XLA's programs kept between runs, with isl's schedules
        self.jax, self.jnp = jax, jnp
        self.mesh = mesh
        """The ``jax.sharding.Mesh`` a parallel dim is split over (one axis, named after
        the dim; ``make_mesh``), or None: one device."""
        self.on_cpu = jax.default_backend() == "cpu"
        """Whether the device is this host's CPU (device arrays are host memory)."""
        self.xp = XlaNamespace(jax, jnp, self.on_cpu, mesh)
        """The array module kernels are traced with."""
        self._many_processes = jax.process_count() > 1
        self._process_rows: dict[tuple[str, int], tuple[int, int]] = {}
        self.capturing = False
        """Set while an iteration is traced into one program (``tempo.runtime.capture``):
        values are tracers, nothing is donated or copied to the host."""
        self.one_at_a_time = self.on_cpu and mesh is not None and mesh.size > 1
        """A program holding a collective returns once its outputs are computed. Over
        several CPU devices, XLA runs each device's part of a program on a shared thread
        pool, and a collective (a sum over ``b``) waits for every part: with several such
        programs in flight the pool's threads can all be waiting in one program's
        collective for parts queued behind another's, and XLA aborts the process after
        40 s (seen with 4 forced devices on 2 cores, from 50 all-reduces dispatched
        without waiting). Programs without collectives never wait inside, so they are
        dispatched as usual (``holds_collectives``)."""
        self._collectives: dict[tuple, bool] = {}
        self._ahead: dict[tuple, Future] = {}
        """The compiles ``compile_ahead`` started, by kernel and input shapes."""
        self._by_op: dict[tuple, Callable] = {}
        # Indexing a device array from Python costs 40 us (a slice) to 250 us (a gather);
        # these jitted forms about 9 us.
        self._take = jax.jit(lambda values, rows, axis: values[(slice(None),) * axis + (rows,)],
                             static_argnums=2)
        self._rows = jax.jit(jax.lax.dynamic_slice_in_dim, static_argnums=(2, 3))
        self._set_row = jax.jit(lambda block, k, row, axis: jax.lax.dynamic_update_index_in_dim(
            block, row, k, axis), static_argnums=3, donate_argnums=0)
        self._set_rows = jax.jit(lambda block, ks, rows, axis: block.at[(slice(None),) * axis + (ks,)].set(
            jnp.moveaxis(rows, 0, axis)), static_argnums=3, donate_argnums=0)
        self._moveaxis = jax.jit(jnp.moveaxis, static_argnums=(1, 2))

    def kernel(self, op: Op, static_params: dict | None, static_shapes: bool,
               donate: tuple[int, ...] = ()) -> DeviceKernel:
        """A jitted kernel: once for ``static_params``, else once per distinct params. It
        takes over the buffers of its inputs at positions ``donate`` (static params only).

        Ops whose shapes vary between points (``x[0:t+1]``) run with NumPy, and their
        values stay NumPy arrays (kernels reading them convert them): XLA would compile
        once per shape, and so do eager JAX and ``jnp.asarray`` (``lax.stage``): REINFORCE's
        ``r[t:T]`` ops compiled three programs per step, about 5 MB of RSS each, until tiling
        makes those shapes static."""
        launch = self._kernel(op, static_params, static_shapes, donate)
        if not self.one_at_a_time or op.kind == "const" or not static_shapes:
            return launch  # (a constant is on the device already; NumPy runs at once)
        if static_params is None:
            return lambda params, *xs: self._settled(launch(params, *xs))
        jitted = self._jitted(op.kind, static_params, donate, op.id)

        def launch_one_collective_at_a_time(params: dict, *xs: Any) -> Any:
            collective = self._holds_collective_for(jitted, xs)
            out = launch(params, *xs)
            return self.jax.block_until_ready(out) if collective else out
        return launch_one_collective_at_a_time

    def holds_collectives(self, compiled: Any) -> bool:
        """Whether compiled program ``compiled`` (``jax.stages.Compiled``) communicates
        between devices: such programs run one at a time (``one_at_a_time``)."""
        text = compiled.as_text()
        return any(name in text for name in COLLECTIVES)

    def _holds_collective_for(self, jitted: Callable, args: tuple) -> bool:
        """Whether ``jitted``'s program for arguments like ``args`` (shapes, dtypes and
        placement) holds a collective; found once per kind of arguments, from the program
        the call compiles (JAX keeps it, so the call that follows does not compile)."""
        key = (jitted, *((np.shape(x), x.dtype, getattr(x, "sharding", None)) for x in args))
        found = self._collectives.get(key)
        if found is None:
            found = self._collectives[key] = self.holds_collectives(jitted.lower(*args).compile())
        return found

    def _kernel(self, op: Op, static_params: dict | None, static_shapes: bool,
                donate: tuple[int, ...]) -> DeviceKernel:
        fn = op.definition.kernel
        if op.kind == "const" and static_params is not None and not donate:
            return self._constant(op.id, static_params["value"])
        if not static_shapes:
            host, xp = self.to_host, self.xp

            def varying(params: dict, *xs: Any) -> Any:
                if self.capturing:  # (an iteration's one program: every shape is fixed in it)
                    return fn(xp, params, *xs)
                return fn(np, params, *(host(x) for x in xs))
            return varying
        if static_params is not None:
            compiled = self._jitted(op.kind, static_params, donate, op.id)
            return lambda params, *xs: compiled(*xs)
        return lambda params, *xs: self._jitted(op.kind, params)(*xs)

    def _constant(self, op_id: int, value: np.ndarray) -> DeviceKernel:
        """A constant op's kernel: its value moved to the device once, for every run of the
        executable (a jitted kernel would copy it out of the compiled program at each run,
        134 MB in 8-25 ms here). The kernel's own reference keeps the value from being
        donated: a launcher donates only inputs nothing else holds."""
        key = ("const", op_id)
        kernel = self._by_op.get(key)
        if kernel is None:
            # Copied first: on a CPU ``device_put`` adopts an aligned host array without
            # copying it, and the value may be the user's array (``tp.const``), unless it is
            # read-only and owns its memory (a model's weights): taken as a promise that it
            # does not change.
            frozen = isinstance(value, np.ndarray) and not value.flags.writeable and value.flags.owndata
            own = value if frozen else np.array(value, copy=True)
            on_device = self.jax.device_put(own) if self.mesh is None else self.replicated(own)
            kernel = self._by_op[key] = lambda params: on_device
        return kernel

    def _jitted(self, kind: str, params: dict, donate: tuple[int, ...] = (),
                op_id: int | None = None) -> Callable:
        """One jitted function per (op kind, params, donated inputs), shared by every
        program; params that hold arrays (constants folded into a fused op) are not
        hashable, and their kernels are kept per op (``op_id``) by this backend, so that
        an executable's later runs reuse them."""
        frozen = _freeze(kind, params)
        if frozen is not None:  # kernels trace with ``self.xp``: one per mesh
            cache, key = _JIT_CACHE, (*frozen, donate, self.xp.mesh_key)
        else:
            cache, key = self._by_op, None if op_id is None else (op_id, donate)
        kernel = cache.get(key) if key is not None else None
        if kernel is None:
            fn, xp = op_def(kind).kernel, self.xp
            def traced(*xs: Any) -> Any:
                return fn(xp, params, *xs)
            traced.__name__ = traced.__qualname__ = _program_name(kind, params)
            kernel = self.jax.jit(traced, donate_argnums=donate)
            if key is not None:
                cache[key] = kernel
        return kernel

    def block_kernel(self, op: Op, params: dict, inputs: int, slices: tuple[tuple[int, int], ...],
                     writes: tuple[tuple[int, int], ...] = (),
                     shared: tuple[tuple[int, int], ...] = (), returned: tuple[int, ...] = ()) -> Callable:
        """``op``'s kernel (of ``inputs`` inputs) reading and writing device block stores'
        buffers itself: ``fn(rows, *inputs, *buffers, *rows_written)``. The inputs at
        ``slices`` (``(position, axis)`` pairs) are ``(buffer, first row)`` pairs of
        buffers whose rows lie along ``axis``, sliced inside the compiled kernel (``rows``:
        the static row count of each slice): XLA reads the rows where they are instead of
        a separate program copying them out first (a decoder's attention reads ``k[0:t+1]``
        at every position). For each of ``writes`` (``(output, axis)``) a buffer follows
        the inputs, and after the buffers the row of each to write: the kernel writes that
        output into the buffer at that row, takes the buffer over, and returns ``(outputs,
        buffers)``, the outputs without those written into buffers (one launch instead of
        one more per written row, and no output array made for a row in a buffer). An input
        of ``shared`` (``(position, write)``) is the first row only, of the buffer of
        ``writes[write]``: the ``put_row`` members reading it write the row there first and
        read the rows from the written buffer (``tempo.passes.newest``). For each of
        ``returned`` (positions in ``writes``) the row written is returned too, ``(outputs,
        buffers, rows)``: a point read of it then needs no gather from the buffer (a host
        env reading the action the policy kernel just wrote)."""
        frozen = _freeze(op.kind, params)  # shared by ops of the same kind and params
        cache, key = (_JIT_CACHE, ("blocks", *frozen, inputs, slices, writes, shared, returned,
                                   self.xp.mesh_key)) \
            if frozen is not None else (self._by_op, ("blocks", op.id, slices, writes, shared, returned))
        kernel = cache.get(key)
        if kernel is None:
            donate = tuple(range(1 + inputs, 1 + inputs + len(writes)))
            run = self.block_body(op, params, inputs, slices, writes, shared, returned)
            kernel = cache[key] = self.jax.jit(run, static_argnums=0, donate_argnums=donate)
        return kernel

    def block_body(self, op: Op, params: dict, inputs: int, slices: tuple[tuple[int, int], ...],
                   writes: tuple[tuple[int, int], ...] = (),
                   shared: tuple[tuple[int, int], ...] = (), returned: tuple[int, ...] = ()) -> Callable:
        """What ``block_kernel`` compiles, as a function to trace: ``fn(rows, *inputs,
        *buffers, *rows_written)`` (a lowered loop's scan calls it at each iteration),
        returning ``(outputs, buffers)``, and the rows of ``returned`` third where any."""
        fn, xp, jax = op.definition.kernel, self.xp, self.jax
        multi, on_cpu = op.definition.multi_output, self.on_cpu
        in_buffer = dict(shared)
        into_buffers = {out for out, _ in writes}

        def run(rows: tuple[int, ...], *args: Any) -> Any:
            xs = list(args[:inputs])
            at = iter(args[inputs + len(writes):])
            buffers = [_WrittenBuffer(jax.lax, block, axis, next(at), on_cpu)
                       for block, (_, axis) in zip(args[inputs:inputs + len(writes)], writes)]
            for (position, axis), count in zip(slices, rows):
                if position in in_buffer:
                    xs[position] = _RowsToPut(buffers[in_buffer[position]], xs[position], count)
                    continue
                block, start = xs[position]
                xs[position] = _first_rows(jax.lax, block, start, count, axis)
            outs = fn(xp, params, *xs)
            if not writes:
                return outs
            outs = tuple(outs) if multi else (outs,)
            written = tuple(buffer.written(outs[out]) for buffer, (out, _) in zip(buffers, writes))
            unwritten = tuple(o for k, o in enumerate(outs) if k not in into_buffers)
            if not returned:
                return unwritten, written
            return unwritten, written, tuple(outs[writes[n][0]] for n in returned)
        run.__name__ = run.__qualname__ = "block_" + _program_name(op.kind, params)
        return run

    def compile_later(self, kernel: Callable, static: Any, args: tuple, first: bool = False) -> Future:
        """Compile jitted ``kernel`` for static argument ``static`` and arguments shaped as
        ``args``, on a background thread; once the future is done, calling
        ``kernel(static, *args)`` runs without compiling (XLA's compiler releases the GIL,
        so the caller's thread goes on meanwhile). ``first``: a kernel's first launch,
        compiled with the kernels of ``compile_ahead`` (on their thread, in order), not
        behind the scans of ``compile_in_background``."""
        specs = self._specs(args)
        thread = _ahead_thread() if first else _compiler_thread()
        return thread.submit(lambda: kernel.lower(static, *specs).compile())

    def compile_in_background(self, jitted: Callable, args: tuple) -> Future:
        """Compile ``jitted`` (a ``jax.jit`` function) for arguments shaped as ``args`` on
        the thread of ``compile_later``: the future's result is the compiled program."""
        specs = self._specs(args)
        return _compiler_thread().submit(lambda: jitted.lower(*specs).compile())

    def compile_lowered_in_background(self, lowered: Any) -> Future:
        """Compile ``lowered`` (a traced and lowered ``jax.jit`` program: a captured
        iteration's, ``tempo.runtime.capture``) on the thread of ``compile_later``."""
        return _compiler_thread().submit(lowered.compile)

    def _specs(self, args: Any) -> Any:
        """``args`` as shapes and dtypes (``BufferShape``s are shapes already)."""
        return self.jax.tree_util.tree_map(
            lambda a: self.jax.ShapeDtypeStruct(getattr(a, "shape", None) or np.shape(a), a.dtype), args)

    def compile_ahead(self, op: Op, static_params: dict, inputs: list[tuple[tuple[int, ...], str]],
                      donate: tuple[int, ...] = ()) -> Future | None:
        """Compile ``op``'s kernel (the one ``kernel(op, static_params, True, donate)``
        calls) for inputs of these shapes and dtypes on a background thread (its own, so
        that ``compile_later``'s programs do not queue behind these); a later call with
        such inputs finds the program compiled. Kernels shared by ops of the same kind and
        params are compiled once per shapes. None on a mesh (the inputs' shardings are not
        known ahead) and for constants (nothing to compile)."""
        if self.mesh is not None or op.kind == "const":
            return None
        kernel = self._jitted(op.kind, static_params, donate, op.id)
        key = (kernel, tuple((tuple(shape), str(dtype)) for shape, dtype in inputs))
        future = self._ahead.get(key)
        if future is None or future.cancelled():
            specs = [self.jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in inputs]
            future = self._ahead[key] = _ahead_thread().submit(lambda: kernel.lower(*specs).compile())
        return future

    def donatable(self, value: Any) -> bool:
        """Whether a kernel can take ``value``'s buffer over (a device array; not while an
        iteration is captured, ``capturing``)."""
        return isinstance(value, self.jax.Array) and not self.capturing

    def from_host(self, value: np.ndarray) -> Any:
        """``value`` on the device; small values (a point op's coordinates or row index)
        stay NumPy arrays, which the kernels reading them take as they are: a move costs
        ~13 us a call, a jitted kernel's conversion of a small NumPy input ~1.4 us."""
        value = np.asarray(value)
        return value if value.nbytes <= SMALL_HOST_BYTES else self._moved(value)

    def resident(self, value: np.ndarray) -> Any:
        """``value`` on the device, whatever its size: a call of a compiled program moves
        each NumPy argument anew (a lowered loop's per-iteration branches and masks, which
        its plan's translates share: on an H100, PPO's update scan took 39 NumPy arguments
        and 3.2 ms a call). Over a mesh it stays NumPy: the program places it."""
        return value if self.mesh is not None else self._moved(value)

    def _moved(self, value: np.ndarray) -> Any:
        """A copy of ``value`` on the default device. ``device_put``, not ``jnp.asarray``,
        which runs a program (``lax.stage``) compiled, or loaded from the cache, once per
        shape and dtype (5-8 ms each on a CPU). It moves a copy made here: the host array
        may change later, and ``device_put`` reads it after returning (a transfer in
        flight) or adopts it (an aligned one, on a CPU)."""
        return self.jax.device_put(np.array(value, copy=True))

    def check_dtype(self, op: Op) -> None:
        """64-bit dtypes need JAX's x64 mode; without it JAX would silently narrow them."""
        if self.jax.config.jax_enable_x64:
            return
        wide = [t.dtype for t in op.outputs if np.dtype(t.dtype).itemsize == 8]
        if wide:
            raise TempoError(f"{op.name} produces {wide[0]}, which JAX narrows to 32 bits unless "
                             f"x64 is enabled (JAX_ENABLE_X64=1); use a 32-bit dtype or the numpy "
                             f"backend", op.site)

    def to_host(self, value: Any) -> np.ndarray:
        """``value`` as a NumPy array; a value split over several processes' devices is
        gathered from every process (each must ask for it: they run the same program)."""
        if self.capturing:
            raise Uncapturable("a host op outside the late sinks reads a value the iteration computes")
        if self._many_processes and isinstance(value, self.jax.Array) and not value.is_fully_addressable:
            from jax.experimental import multihost_utils
            return np.asarray(multihost_utils.process_allgather(value, tiled=True))
        return np.asarray(value)

    def copy_to_host_ahead(self, values: list[Any]) -> None:
        """On an accelerator, each device value's copy to host memory is queued behind the
        work that makes it (``jax.Array.copy_to_host_async``), so that a late sink reading
        it an iteration on finds it there instead of queueing its copy behind the next
        iteration's work; a CPU's values are host memory already."""
        if self.on_cpu or self.capturing:
            return
        for value in values:
            if isinstance(value, self.jax.Array) and value.is_fully_addressable:
                value.copy_to_host_async()

    def process_rows(self, dim: str, size: int) -> tuple[int, int] | None:
        if not self._many_processes or self.mesh is None or tuple(self.mesh.axis_names) != (dim,):
            return None
        if (dim, size) not in self._process_rows:
            from jax.sharding import NamedSharding, PartitionSpec
            held = NamedSharding(self.mesh, PartitionSpec(dim)).addressable_devices_indices_map((size,))
            spans = sorted({index[0].indices(size)[:2] for index in held.values()})
            lo, hi = spans[0][0], spans[-1][1]
            if any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
                raise TempoError(f"this process's devices hold rows {spans} of {dim}, not one run of "
                                 f"rows: order the mesh's devices by process")
            self._process_rows[(dim, size)] = (lo, hi)
        return self._process_rows[(dim, size)]

    def local_rows(self, value: Any, rows: tuple[int, int]) -> np.ndarray:
        """Rows ``lo .. hi - 1`` of ``value`` (along its first axis) on the host, from this
        process's devices: the shards of a split value, a replica, or a host array."""
        lo, hi = rows
        if not isinstance(value, self.jax.Array) or value.is_fully_addressable:
            return np.asarray(value)[lo:hi]
        parts, at = [], lo
        shards = [(s.index[0].indices(value.shape[0])[:2] if s.index else (0, value.shape[0]), s)
                  for s in value.addressable_shards]
        while at < hi:
            start, stop, shard = next((a, b, s) for (a, b), s in shards if a <= at < b)
            parts.append(np.asarray(shard.data)[at - start:min(stop, hi) - start])
            at = min(stop, hi)
        return np.concatenate(parts)

    def from_local_rows(self, value: np.ndarray, dim: str, size: int) -> Any:
        """A value split along ``dim`` over the mesh whose rows ``process_rows`` are
        ``value``: each process hands in its own."""
        from jax.sharding import NamedSharding, PartitionSpec
        value = np.asarray(value)
        split = NamedSharding(self.mesh, PartitionSpec(dim))
        return self.jax.make_array_from_process_local_data(split, value, (size, *value.shape[1:]))

    def view_of_host(self, rows: np.ndarray) -> Any:
        """Rows of a block store's host buffer as kernels read them. On CPU a large
        aligned, contiguous slice becomes a device array over the same memory
        (``jax.device_put`` adopts it; a jitted kernel given the NumPy array would copy it
        at every call, and several calls in flight hold a copy each); other rows stay
        NumPy arrays, which kernels convert."""
        if self.on_cpu and rows.nbytes >= VIEW_MIN_BYTES and rows.flags.c_contiguous \
                and rows.ctypes.data % ALIGNMENT == 0:
            return self.jax.device_put(rows)
        return rows

    def stack(self, values: list[Any]) -> Any:
        """One array of ``values``. On CPU through NumPy (device arrays are host memory
        there): ``jnp.stack`` dispatches once per value, 5-10 ms for 250 points. Over a
        mesh on the devices, which keeps the values' shardings, unless they are all host
        arrays (a host op's outputs: n-step's discounted sums over 4 forced CPU devices,
        two stacks of 258 points, 4-6 ms an iteration)."""
        if self.on_cpu and not self.capturing and (self.mesh is None or all(isinstance(v, np.ndarray)
                                                                            for v in values)):
            return self.jax.device_put(np.stack([np.asarray(v) for v in values]))  # (adopts the new stack)
        return self._settled(self.jnp.stack(values))

    def _settled(self, value: Any) -> Any:
        """``value``, once computed where the backend runs one program at a time
        (``one_at_a_time``)."""
        return self.jax.block_until_ready(value) if self.one_at_a_time else value

    def replicated(self, value: np.ndarray) -> Any:
        """``value`` on every device of the mesh (a kernel reading a value on one device
        would copy it to the others at every call)."""
        from jax.sharding import NamedSharding, PartitionSpec
        return self.jax.device_put(value, NamedSharding(self.mesh, PartitionSpec()))

    def is_split(self, value: Any) -> bool:
        """Whether ``value`` is split over several devices (parts of it on each)."""
        if not isinstance(value, self.jax.Array):
            return False
        sharding = value.sharding
        return len(sharding.device_set) > 1 and not sharding.is_fully_replicated

    def concatenate(self, values: list[Any], axis: int = 0) -> Any:
        """``values`` joined along ``axis`` (host arrays stay on the host)."""
        if all(isinstance(v, np.ndarray) for v in values):
            return np.concatenate(values, axis)
        return self._settled(self.jnp.concatenate(values, axis))

    def synchronize(self, value: Any) -> None:
        """Wait until ``value`` has been computed (dispatch is asynchronous)."""
        self.jax.block_until_ready(value)

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Any:
        """Zeros on the device, moved there from the host: ``jnp.zeros`` compiles a program
        per shape (about 15 ms each on a CPU)."""
        return self.jax.device_put(np.zeros(shape, dtype))

    def take(self, values: Any, rows: Any, axis: int = 0) -> Any:
        """``values[rows]`` along ``axis``: one row (an int) or several (an index array).
        Host arrays (a point op's batched values) are indexed in place, not moved to the
        device whole."""
        if isinstance(values, np.ndarray):
            return values[rows] if axis == 0 else np.take(values, rows, axis)
        return self._settled(self._take(values, rows, axis))

    def rows(self, values: Any, start: int, count: int, axis: int = 0) -> Any:
        """``values[start:start + count]`` along ``axis``."""
        if isinstance(values, np.ndarray):
            return values[(slice(None),) * axis + (slice(start, start + count),)]
        return self._settled(self._rows(values, start, count, axis))

    def update_rows(self, block: Any, at: Any, rows: Any, axis: int = 0) -> Any:
        """``block`` with row ``at`` (an int) or rows ``at`` (an index array; ``rows``
        stacked first) along ``axis`` replaced by ``rows``, computed in ``block``'s
        buffer, which the result takes over (a device block store's write,
        ``tempo.runtime.stores.DeviceBuffers``)."""
        update = self._set_row if np.ndim(at) == 0 else self._set_rows
        return self._settled(update(block, at, rows, axis))

    def moveaxis(self, value: Any, source: int, destination: int) -> Any:
        if isinstance(value, np.ndarray):
            return np.moveaxis(value, source, destination)
        return self._settled(self._moveaxis(value, source, destination))


GATHER_WHOLE_MAX_BYTES = 64 << 20
GATHER_WHOLE_MAX_RATIO = 16
"""Over a mesh, an array a list of indices takes rows from is copied whole to every device
when it holds at most ``GATHER_WHOLE_MAX_BYTES`` and at most ``GATHER_WHOLE_MAX_RATIO``
times the rows taken (``XlaNamespace.gather_source``). PPO over 4 forced CPU devices, 64
envs x 128 steps (minibatches of a quarter of the rollout): 12 collectives per minibatch
update -> 3, 0.071-0.078 -> 0.057-0.060 s an iteration. The ratio bounds the cost where
XLA cannot copy once for many takes (outside a loop, or from an array the loop changes,
such as a replay buffer sampled at every step): at most 16 times the rows' own traffic."""

HOST_SORT_MIN = 4096
"""Keys from which a CPU ``argsort`` is ``stable_argsort``'s, called back (``XlaNamespace``):
4,096 keys, 0.17 ms with NumPy's stable argsort against XLA's 0.62 (2 cores, 2026-11-26);
the sort alone now takes 0.025 ms there, NumPy's 0.055 (2026-11-28)."""


class XlaNamespace:
    """``jax.numpy`` as kernels see it, with the functions whose XLA lowering is slow on
    this platform replaced.

    On CPU, XLA sorts a float key with its index (a two-operand sort) about 3x slower
    than NumPy's stable argsort (128k keys: 27 ms vs 10 ms on 2 cores; PPO sorts one key
    per element of its rollout every epoch), and about 20x slower than ``stable_argsort``
    (1.2-1.3 ms), so there an ``argsort`` of at least ``HOST_SORT_MIN`` keys in all is
    ``stable_argsort``, called back from the compiled computation. A
    program holding a callback is never kept in JAX's persistent cache, so shorter sorts
    stay XLA's: their program then loads from the cache instead of compiling again in
    every run (PPO at 8 envs x 64 steps: 0.17 s), for 45 us a sort of 512 keys. Results
    are the same: both sorts are stable.

    On CPU too, a ``linear_recurrence`` (GAE's, lifted by ``tempo.passes.lift``) is a
    sequential ``lax.scan`` over its rows rather than log2 n doubling steps over whole
    arrays: for PPO's advantages at 250 x 512 the scan compiled in 70 ms against 200 ms
    and ran in 0.10-0.27 ms against 0.85-1.06 ms; at 64 x 8, 45 ms against 120 ms and
    8 us against 13-20 us (2-core CPU, 2026-11-28). Both are the same recurrence; sums
    differ in their last bits (5e-7 apart). On an accelerator the doubling's few
    array-wide steps stay, against a scan's launch per row.

    Matrix products of float32 values run at float32 precision on every device, as the
    NumPy reference's do: JAX's default on a GPU rounds their inputs to TensorFloat-32
    (10 mantissa bits), about 1e-3 apart from float32 (a 4-layer decoder's logits moved
    by 1.6e-4 on an H200)."""

    def __init__(self, jax: Any, jnp: Any, on_cpu: bool, mesh: Any = None):
        self._jax, self._jnp = jax, jnp
        self._mesh = mesh
        self.mesh_key = None if mesh is None else \
            (mesh.axis_names, tuple(d.id for d in mesh.devices.flat))
        """What kernels traced with this namespace depend on beyond their op (a key part)."""
        if on_cpu:
            self.argsort = self._host_argsort
            self.linear_recurrence = self._scanned_recurrence

    def matmul(self, a: Any, b: Any) -> Any:
        return self._jnp.matmul(a, b, precision=self._jax.lax.Precision.HIGHEST)

    def tensordot(self, a: Any, b: Any, axes: Any = 2) -> Any:
        return self._jnp.tensordot(a, b, axes, precision=self._jax.lax.Precision.HIGHEST)

    def place_on_mesh(self, x: Any, dim: int) -> Any:
        """``x`` with its axis ``dim`` split over the mesh's one axis (the ``shard`` op);
        ``x`` itself without a mesh."""
        if self._mesh is None:
            return x
        return self._laid_out(x, (None,) * dim + (self._mesh.axis_names[0],))

    def split_rows(self, x: Any) -> Any:
        """``x`` with its leading axis split over the mesh where it divides evenly (a
        layout choice for the rows a list of indices takes; ``ops._take``); ``x`` itself
        without a mesh."""
        if self._mesh is None or x.shape[0] % self._mesh.devices.size:
            return x
        return self.place_on_mesh(x, 0)

    def gather_source(self, x: Any, taken: int) -> Any:
        """``x`` whole on every device, for a take of ``taken`` of its leading rows by a
        list of indices (``ops._take``), where that costs little more than moving the rows
        (``GATHER_WHOLE_MAX_BYTES``, ``GATHER_WHOLE_MAX_RATIO``); ``x`` itself otherwise
        and without a mesh. From rows split over the devices every take costs collectives
        (XLA sends each device all the indices, gathers masked and sums the rows); from a
        whole copy it is local, and in a loop that does not change ``x`` XLA makes the
        copy once, before the loop."""
        if self._mesh is None or x.size * x.dtype.itemsize > GATHER_WHOLE_MAX_BYTES \
                or x.shape[0] > GATHER_WHOLE_MAX_RATIO * taken:
            return x
        return self._laid_out(x, ())

    def _laid_out(self, x: Any, spec: tuple) -> Any:
        """``x`` constrained to the mesh layout ``spec`` (per axis: the mesh axis it is
        split over, or None; ``()``: whole on every device)."""
        from jax.sharding import NamedSharding, PartitionSpec
        return self._jax.lax.with_sharding_constraint(x, NamedSharding(self._mesh, PartitionSpec(*spec)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jnp, name)

    def _host_argsort(self, x: Any, axis: int = -1, stable: bool = True) -> Any:
        if x.size < HOST_SORT_MIN:
            return self._jnp.argsort(x, axis=axis, stable=stable)

        def sort(values: Any) -> np.ndarray:  # (stable either way: an unstable order is any)
            return stable_argsort(np.asarray(values), axis)
        result = self._jax.ShapeDtypeStruct(x.shape, self._jnp.int32)
        return self._jax.pure_callback(sort, result, x)

    def _scanned_recurrence(self, c: Any, d: Any, dim: int, forward: bool) -> Any:
        """``ops._linear_recurrence`` as one ``lax.scan`` along ``dim``: ``x[k] = d[k] +
        c[k] * x[k + 1]`` from the last row (``forward``: ``x[k - 1]``, from the first),
        ``c`` holding the ``n - 1`` coefficients used or all ``n`` rows (the unused one
        the last, or with ``forward`` the first)."""
        jnp = self._jnp
        x, a = jnp.moveaxis(d, dim, 0), jnp.moveaxis(c, dim, 0)
        n = x.shape[0]
        if n < 2:
            return d
        a = a[a.shape[0] - (n - 1):] if forward else a[:n - 1]

        def step(after: Any, row: tuple[Any, Any]) -> tuple[Any, Any]:
            coefficient, term = row
            value = term + coefficient * after
            return value, value
        if forward:
            _, rest = self._jax.lax.scan(step, x[0], (a, x[1:]))
            rows = jnp.concatenate([x[:1], rest])
        else:
            _, rest = self._jax.lax.scan(step, x[n - 1], (a, x[:n - 1]), reverse=True)
            rows = jnp.concatenate([rest, x[n - 1:]])
        return jnp.moveaxis(rows, 0, dim).astype(d.dtype)


def stable_argsort(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """``np.argsort(values, axis, kind="stable")`` as int32. Keys of at most 32 bits are
    sorted about 7x faster (128k float32 keys: 1.2-1.3 ms against 8.8-9.0 on 2 cores): each key's
    bits, made to order as the values do, and its index are packed into one uint64, and
    NumPy sorts those (its 64-bit integer sort, vectorized); the index breaks ties as a
    stable sort does. Other keys take NumPy's stable argsort."""
    x = np.moveaxis(np.asarray(values), axis, -1)
    count = x.shape[-1]
    bits = _ordered_bits(x)
    if bits is None or count >= 2**31 or sys.byteorder != "little":
        return np.moveaxis(np.argsort(x, axis=-1, kind="stable").astype(np.int32), -1, axis)
    packed = np.empty(x.shape, np.uint64)
    words = packed.view(np.uint32).reshape(*x.shape, 2)  # (little-endian: low word first)
    words[..., 0] = np.arange(count, dtype=np.uint32)
    words[..., 1] = bits
    packed.sort(axis=-1)
    return np.moveaxis(words[..., 0].astype(np.int32), -1, axis)


def _ordered_bits(x: np.ndarray) -> np.ndarray | None:
    """uint32 keys in the order NumPy sorts ``x``'s values (equal values equal keys:
    -0.0 and 0.0 alike, and every NaN the same key, after +inf), for floats of at most 32
    bits, integers of at most 32 bits and booleans; else None."""
    if x.dtype.kind == "f" and x.dtype.itemsize <= 4:
        with np.errstate(invalid="ignore"):  # (a signaling NaN's add)
            bits = (np.asarray(x, np.float32) + np.float32(0.0)).view(np.uint32)  # -0.0 + 0.0 is 0.0
        flip = (bits >> np.uint32(31)) * np.uint32(0x7FFFFFFF)  # negatives: every bit
        flip |= np.uint32(0x80000000)                           # others: the sign bit
        bits ^= flip
        nan = np.isnan(x)
        if nan.any():
            bits[nan] = 0xFFFFFFFF
        return bits
    if x.dtype.kind in "iub" and x.dtype.itemsize <= 4:
        return (x.astype(np.int64) + (2**31 if x.dtype.kind == "i" else 0)).astype(np.uint32)
    return None


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all",
               "collective-broadcast", "send(", "recv(")
"""XLA's instructions that communicate between devices (in a compiled program's text)."""


@functools.cache
def _compiler_thread() -> ThreadPoolExecutor:
    """The one thread that compiles a kernel's later shapes (``compile_later``)."""
    return ThreadPoolExecutor(1, thread_name_prefix="tempo-compile")


@functools.cache
def _ahead_thread() -> ThreadPoolExecutor:
    """The one thread that compiles an executable's kernels before their first launch
    (``compile_ahead``)."""
    return ThreadPoolExecutor(1, thread_name_prefix="tempo-compile-ahead")


class _WrittenBuffer:
    """A buffer a block kernel writes its point's row into, at ``slot`` along ``axis``:
    once, by the first ``put_row`` reading it (``_RowsToPut``), or at the end."""

    def __init__(self, lax: Any, block: Any, axis: int, slot: Any, on_cpu: bool):
        self.lax, self.block, self.axis, self.slot, self.on_cpu = lax, block, axis, slot, on_cpu
        self.done = False

    def written(self, row: Any, read_after: bool = False) -> Any:
        """The buffer with ``row`` at its slot. ``read_after``: the kernel reads the
        written buffer too. On a CPU the write is then a conditional (always taken): XLA's
        CPU fusion would otherwise copy the update into each reader, and each copy of an
        in-place update copies the whole buffer first (a batch-1 decoder, four layers,
        2,080-row buffers: 40 buffer copies and 411 us a step against none and 116 us).
        Not measured on an accelerator, which gets the plain update."""
        if not self.done:
            def put(block: Any) -> Any:
                return self.lax.dynamic_update_index_in_dim(block, row, self.slot, self.axis)
            self.block = self.lax.cond(self.slot >= 0, put, lambda block: block, self.block) \
                if read_after and self.on_cpu else put(self.block)
            self.done = True
        return self.block


class _RowsToPut:
    """What a ``put_row`` member of a block kernel reads (``ops._put_row``): ``count`` rows
    from ``start`` of a buffer the kernel writes, read once the row is in."""

    def __init__(self, buffer: _WrittenBuffer, start: Any, count: int):
        self.buffer, self.start, self.count = buffer, start, count

    def put_row(self, row: Any) -> Any:
        block = self.buffer.written(row, read_after=True)
        return _first_rows(self.buffer.lax, block, self.start, self.count, self.buffer.axis)


def _first_rows(lax: Any, block: Any, start: Any, count: int, axis: int) -> Any:
    """``count`` rows of ``block`` from ``start`` along ``axis``: the block itself where
    that is all of it (no slice, which XLA's CPU code would copy)."""
    return block if count == block.shape[axis] else lax.dynamic_slice_in_dim(block, start, count, axis)


_JIT_CACHE: dict[tuple, Callable] = {}


def _freeze(kind: str, params: dict) -> tuple | None:
    """A hashable key for params, or None when they hold arrays or functions."""
    items = []
    for name, value in sorted(params.items()):
        if isinstance(value, (np.ndarray, list, dict)) or callable(value):
            return None
        items.append((name, type(value).__name__, value))
    try:
        hash(tuple(items))
    except TypeError:
        return None
    return (kind, tuple(items))


BACKENDS: dict[str, Callable[[], Any]] = {"numpy": NumpyBackend, "jax": JaxBackend}


def resolve_backend(name: str) -> str:
    """The backend ``name`` stands for: ``"auto"`` is JAX (on its default device: the
    accelerator when there is one) wherever JAX imports, else NumPy."""
    if name == "auto":
        try:
            import jax  # noqa: F401 - only whether it imports
        except ImportError:
            return "numpy"
        return "jax"
    if name not in BACKENDS:
        raise TempoError(f"unknown backend {name!r}; choose one of auto, {', '.join(BACKENDS)}")
    return name


def make_backend(name: str, mesh: Any = None) -> Backend:
    """The backend ``name`` (``auto``, ``numpy`` or ``jax``; see ``resolve_backend``),
    over ``mesh`` (JAX only; ``make_mesh``) when given."""
    chosen = resolve_backend(name)
    if mesh is None:
        return BACKENDS[chosen]()
    if chosen != "jax":
        raise TempoError(f"a program split over devices runs on the jax backend, not {chosen}")
    return JaxBackend(mesh)


def make_mesh(devices: int | None, axis: str) -> Any:
    """A one-axis ``jax.sharding.Mesh`` named ``axis`` over the first ``devices`` of
    ``jax.devices()`` (all when None; every process's after ``jax.distributed.initialize``)."""
    try:
        import jax
    except ImportError:
        raise TempoError("a program split over devices needs JAX, which is not installed") from None
    available = jax.devices()
    count = len(available) if devices is None else devices
    if count > len(available):
        raise TempoError(f"{count} devices asked for, JAX sees {len(available)} "
                         f"({available[0].platform}); on a CPU, "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={count} makes more")
    return jax.sharding.Mesh(np.array(available[:count]), (axis,))


def describe_backend(name: str) -> str:
    """One line for a run's first output: the backend ``name`` resolves to and its device."""
    chosen = resolve_backend(name)
    if chosen == "numpy":
        where = "host CPU" + (" (JAX is not installed)" if name == "auto" else "")
    else:
        import jax
        device = jax.devices()[0]
        where = f"{device.platform} device {device.device_kind!r}, {jax.device_count()} device(s)"
    return f"backend: {chosen}{' (auto)' if name == 'auto' else ''} on {where}"


def _program_name(kind: str, params: dict) -> str:
    """The name of a kernel's XLA program (in JAX's logs and profiles): the op kind, and a
    fused op's members."""
    members = params.get("members") if kind == "fused" else None
    if not members:
        return kind
    names = [getattr(m, "kind", str(m)) for m in members]
    return "fused_" + "_".join(names[:4]) + ("_etc" if len(names) > 4 else "")
