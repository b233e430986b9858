"""Block and window stores with their buffers on the device (``DeviceBuffers``) hold,
deliver and count exactly what the same stores with host buffers do, and programs get the
reference evaluator's values with either."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.passes import PIPELINE
from tempo.reference import evaluate

jax = pytest.importorskip("jax")


ROW = (2, 3)


def _store(kind: str, device: bool, axis: int = 0):
    from tempo.runtime.backends import JaxBackend
    from tempo.runtime.stores import BlockStore, DeviceBuffers, HostBuffers, MemoryStats, WindowStore
    stats = MemoryStats()
    buffers = DeviceBuffers(JaxBackend(), axis) if device else HostBuffers(axis=axis)
    if kind == "block":
        return BlockStore(stats, 12, ROW, "float32", rows=16, buffers=buffers), stats
    if kind == "growing":
        return BlockStore(stats, 12, ROW, "float32", rows=16, buffers=buffers, step=5), stats
    return WindowStore(stats, 12, ROW, "float32", capacity=4, buffers=buffers), stats


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("kind", ["block", "growing", "window"])
def test_device_buffers_behave_as_host_buffers(kind, axis):
    """A random run of writes (one row, several rows of a stacked array), frees and reads
    (points, slices, padded slices, gathered rows) gives the same values from both stores,
    equal to the values written, with a slice's rows along the buffers' ``axis``
    (``tempo.passes.layout``), and the same counts; the device store counts its bytes as
    device bytes, the host one as host bytes."""
    rng = np.random.default_rng(3)
    host, host_stats = _store(kind, device=False, axis=axis)
    device, device_stats = _store(kind, device=True, axis=axis)
    written: dict[tuple[int, int], np.ndarray] = {}
    k = {0: 0, 1: 0}  # next row per prefix; a window reads at most 4 back
    for _ in range(60):
        prefix = int(rng.integers(2))
        action = rng.random()
        if action < 0.45 and k[prefix] < 12:
            value = rng.normal(size=ROW).astype(np.float32)
            for store in (host, device):
                store.write((prefix, k[prefix]), value if store is host else jax.numpy.asarray(value))
            written[prefix, k[prefix]] = value
            k[prefix] += 1
        elif action < 0.55 and k[prefix] <= 9:
            rows = rng.normal(size=(5, *ROW)).astype(np.float32)
            points = [(prefix, k[prefix] + n) for n in range(3)]
            for store in (host, device):
                store.write_rows(points, rows if store is host else jax.numpy.asarray(rows), [1, 2, 3])
            written.update({p: rows[n + 1] for n, p in enumerate(points)})
            k[prefix] += 3
        elif action < 0.75 and (prefix, k[prefix] - 1) in written:
            stop = k[prefix]
            start = stop - 1  # a run of live points ending at the last, at most 4 long
            while start > max(0, stop - 4) and (prefix, start - 1) in written:
                start -= 1
            index = (prefix, slice(start, stop))
            expected = np.stack([written[prefix, j] for j in range(start, stop)])
            for store in (host, device):
                np.testing.assert_array_equal(np.asarray(store.read(index)), np.moveaxis(expected, 0, axis))
            padded = (prefix, slice(start, stop, 4))  # padded to 4 rows: the points first
            for store in (host, device):
                got = np.moveaxis(np.asarray(store.read(padded)), axis, 0)
                assert got.shape == (4, *ROW)
                np.testing.assert_array_equal(got[:stop - start], expected)
            points = [(prefix, j) for j in range(start, stop)]
            for store in (host, device):
                np.testing.assert_array_equal(np.asarray(store.stacked(points)), expected)
                np.testing.assert_array_equal(np.asarray(store.read_point(points[-1])), expected[-1])
        elif k[prefix] > 0:
            point = (prefix, int(rng.integers(max(0, k[prefix] - 2), k[prefix])))
            for store in (host, device):
                store.free(point)
            written.pop(point, None)
        assert host_stats.live == device_stats.live
        assert host_stats.host.now == device_stats.device.now and device_stats.host.now == 0
        assert host.blocks.keys() == device.blocks.keys()
    assert host_stats.peak == device_stats.peak
    assert host_stats.host.peak == device_stats.device.peak


def test_a_written_device_buffer_is_not_copied_out():
    """A row written into a device buffer stays a device array (no host copy, no wait):
    the buffer is a JAX array, updated in place, and a slice read is one too."""
    store, _ = _store("block", device=True)
    store.write((0, 0), jax.numpy.ones(ROW, np.float32))
    assert isinstance(store.blocks[(0,)], jax.Array)
    assert isinstance(store.read((0, slice(0, 1))), jax.Array)


def test_a_device_buffer_adopts_a_whole_stacked_output():
    """A scan's stacked output holding every row of a buffer not yet made becomes that
    buffer as it is (no slice program, no copy); from a stacked output with more rows the
    buffer is a slice. A read of the whole buffer is still a copy: it keeps its values
    after the next write takes the buffer over."""
    from tempo.runtime.backends import JaxBackend
    from tempo.runtime.stores import BlockStore, DeviceBuffers, MemoryStats
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(12, *ROW)).astype(np.float32)
    store = BlockStore(MemoryStats(), 12, ROW, "float32", buffers=DeviceBuffers(JaxBackend()))
    stacked = jax.numpy.asarray(rows)
    store.write_rows([(0, k) for k in range(12)], stacked, list(range(12)))
    assert store.blocks[(0,)] is stacked
    longer = jax.numpy.asarray(np.concatenate([rows, rows[:1]]))
    store.write_rows([(1, k) for k in range(12)], longer, list(range(1, 13)))
    assert store.blocks[(1,)] is not longer
    np.testing.assert_array_equal(np.asarray(store.read((1, slice(0, 12)))), [*rows[1:], rows[0]])
    whole = store.read((0, slice(0, 12)))
    store.free((0, 3))
    store.write((0, 3), jax.numpy.full(ROW, 7.0, np.float32))
    np.testing.assert_array_equal(np.asarray(whole), rows)
    assert (np.asarray(store.read((0, slice(3, 4)))) == 7.0).all()


def _causal_sums(tile: int | None = None):
    """``s[t] = sum(x[0:t+1] * w)`` over ``t``: a growing slice read by a device kernel."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32))[t]
        y = x.tanh() * 2.0  # stored: computed per point
        w = tp.const(np.linspace(-1, 1, 3).astype(np.float32))
        s = (y[0:t + 1] * w).sum(-1).sum(0)
    return ctx, {T: 40}, s


def test_a_growing_slice_read_by_a_jitted_kernel_stays_on_the_device():
    """With tiles (static shapes), the slice's store keeps its buffer on the device; the
    values are the reference evaluator's."""
    ctx, bounds, s = _causal_sums()
    with ctx:
        exe = ctx.compile(bounds, [s], backend="jax", tile=16)
        got = exe.run()[s]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
    from tempo.runtime.stores import BlockStore
    blocks = [store for store in _stores_of(exe).values() if isinstance(store, BlockStore)]
    assert blocks and all(store.buffers.on_device for store in blocks)
    assert exe.stats.peak_host_bytes == 0 and exe.stats.peak_device_bytes > 0


def test_a_large_buffer_on_a_cpu_stays_in_host_memory(monkeypatch):
    """On a CPU a buffer larger than ``CPU_DEVICE_BUFFER_BYTES`` is host memory (its reads
    are handed over in place); the values do not change."""
    from tempo.runtime import executable
    monkeypatch.setattr(executable, "CPU_DEVICE_BUFFER_BYTES", 16)
    ctx, bounds, s = _causal_sums()
    with ctx:
        exe = ctx.compile(bounds, [s], backend="jax", tile=16)
        got = exe.run()[s]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
    assert exe.stats.peak_host_bytes > 0 and exe.backend.on_cpu


def test_a_slice_read_on_the_host_keeps_a_host_buffer():
    """Without tiles the slice's readers have shapes that vary by point and run on the
    host: the buffer stays in host memory, and the values are the reference's."""
    ctx, bounds, s = _causal_sums()
    with ctx:
        exe = ctx.compile(bounds, [s], backend="jax", passes=[name for name, _ in PIPELINE if name != "tile"])
        got = exe.run()[s]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
    assert exe.stats.peak_host_bytes > 0


def _stores_of(exe):
    """The stores a run of ``exe`` makes (as ``Executable.run`` makes them)."""
    from tempo.runtime import executable
    from tempo.runtime.stores import MemoryStats
    return executable._make_stores(exe.graph, exe.bounds, exe.ctx.bound_of, exe.backend, MemoryStats(),
                                   exe.swapped, exe.windows)


def _exp_attention(length: int, seed: int, window: int | None = None):
    """``s[t]``: the sum over the rows of ``y[0:t+1]`` (or a window of it) of ``exp(q . y)``,
    the read laid out ``(2, 3, n)`` for the matmul; the context, bounds and ``s``."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(seed)
    with ctx:
        x = tp.const(rng.normal(size=(length, 2, 3)).astype(np.float32))[t]
        y = x.tanh()  # (2, 3) per point
        q = tp.const(rng.normal(size=(2, 1, 3)).astype(np.float32))
        rows = y[0:t + 1] if window is None else y[tp.max(0, t - window + 1):t + 1]
        s = (q @ rows.permute(1, 2, 0)).exp().sum(-1)
    return ctx, {T: length}, s


INTERPRETED = tp.LoopPolicy(mode="interpreted")
"""Loops run one launch per point: the block launcher's own reads and writes."""


def _checked_attention(length: int, seed: int, window: int | None = None, without: str | None = None,
                       tile: int | None = 16, loops: tp.LoopPolicy | None = INTERPRETED):
    """``_exp_attention`` compiled on JAX (all passes but ``without``) and run, its values
    checked against the reference evaluator; the executable. Its loop is interpreted
    unless ``loops`` says otherwise (lowered: in spans, see ``test_spans.py``)."""
    ctx, bounds, s = _exp_attention(length, seed, window)
    passes = None if without is None else [name for name, _ in PIPELINE if name != without]
    with ctx:
        exe = ctx.compile(bounds, [s], backend="jax", tile=tile, passes=passes, loops=loops)
        got = exe.run()[s]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
    return exe


def _record_ring_reads(monkeypatch) -> list[bool]:
    """Per call of ``WindowStore.ring_slice`` from now on: whether it gave the whole ring."""
    from tempo.runtime.stores import WindowStore
    given, ring_slice = [], WindowStore.ring_slice

    def recording(self, index, put=False):
        ring = ring_slice(self, index, put)
        given.append(ring is not None)
        return ring
    monkeypatch.setattr(WindowStore, "ring_slice", recording)
    return given


def test_a_kernel_reads_rings_in_ring_order_only_where_nothing_else_has_the_padded_length(monkeypatch):
    """Without fusion the scores' matmul is a kernel of its own whose output has the
    window's padded length, which its reader would see in the points' order: that kernel
    reads the ring in the points' order (a gather once the window wraps). The values are
    the reference evaluator's either way."""
    rings = _record_ring_reads(monkeypatch)
    _checked_attention(40, 1, window=4, without="fusion", tile=None)
    assert not rings


def test_a_rings_rows_in_ring_order_are_the_reads_points():
    """``WindowStore.ring_slice`` gives the whole ring where a padded read as long as the
    ring fills it (with the row a ``put_row`` adds, or without) or starts at its first
    row; not where the masked rows would be others than the read's last ones, nor for a
    read shorter than the ring, nor once the ring grew."""
    from tempo.runtime.stores import MemoryStats, WindowStore
    store = WindowStore(MemoryStats(), 12, (2,), "float32", capacity=4)
    for k in range(7):
        if k >= 4:
            store.free((0, k - 4))
        store.write((0, k), np.full(2, k, np.float32))  # points 3..6 live at rows 3, 0, 1, 2
    block = store.blocks[(0,)]
    assert store.ring_slice((0, slice(3, 7, 4))) == (block, 0, 4)  # fills the ring
    assert store.ring_slice((0, slice(3, 6, 4)), put=True) == (block, 0, 4)  # and the put row
    assert store.ring_slice((0, slice(3, 6, 4))) is None  # the row after 5 would be masked
    assert store.ring_slice((0, slice(4, 6, 4))) == (block, 0, 4)  # from row 0: the points' order
    assert store.ring_slice((0, slice(5, 7, 4))) is None
    assert store.ring_slice((0, slice(4, 6, 2))) is None  # shorter than the ring
    np.testing.assert_array_equal(store.read((0, slice(3, 7)))[:, 0], [3, 4, 5, 6])  # a gather
    store.write((0, 7), np.full(2, 7, np.float32))  # point 3 still live: the ring doubles
    assert store.capacity[(0,)] == 8 and store.ring_slice((0, slice(4, 8, 4))) is None
    np.testing.assert_array_equal(store.read((0, slice(3, 8)))[:, 0], [3, 4, 5, 6, 7])


def _record_first_rows(monkeypatch) -> list[tuple[int, int]]:
    """The (rows read, buffer rows) of every block read the kernels trace from now on."""
    from tempo.runtime import backends
    read, first_rows = [], backends._first_rows

    def recording(lax, block, start, count, axis):
        read.append((count, block.shape[axis]))
        return first_rows(lax, block, start, count, axis)
    monkeypatch.setattr(backends, "_first_rows", recording)
    return read


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("newest", [True, False])
def test_kernels_slice_device_buffers_themselves(monkeypatch, window, newest):
    """A tiled read of a device buffer is sliced inside the reading kernel (no program
    copying the rows out first), including rows laid out along another axis
    (``tempo.passes.layout``), and the kernel making the rows writes them into the buffer
    itself (into a window's ring once). With ``tempo.passes.newest`` that is one kernel,
    which writes the row of its point and reads the rows from the written buffer; without
    it, two. A window's ring is read whole, in ring order, never sliced. The values are the
    reference evaluator's."""
    from tempo.runtime.backends import JaxBackend
    made = []
    original = JaxBackend.block_kernel

    def recording(self, op, params, inputs, slices, writes=(), shared=(), returned=()):
        made.append((slices, writes, shared))
        return original(self, op, params, inputs, slices, writes, shared, returned)
    monkeypatch.setattr(JaxBackend, "block_kernel", recording)
    rings = _record_ring_reads(monkeypatch)
    # a window's reads: padded to the window (the compiler's choice)
    exe = _checked_attention(40, 1, window, without=None if newest else "newest",
                             tile=16 if window is None else None)
    (read,) = [e for e in exe.graph.edges() if e.slices]
    assert read.rows_at == 2
    writes = ((read.src_out, 2),)  # y's rows, by y's kernel
    if window is not None:  # a ring of the window's rows, split read or not
        assert exe.windows == {(read.src.id, read.src_out): window}
        assert len(rings) >= 40 and all(rings)  # every launch (and those compiled ahead)
    if newest:
        assert read.src is read.sink  # the fused kernel reads the rows it writes
        assert made == [(((read.sink_in, 2),), writes, ((read.sink_in, 0),))]
    else:
        assert read.src is not read.sink
        assert (((read.sink_in, 2),), (), ()) in made
        assert [w for _, w, _ in made if w] == [writes]


@pytest.mark.parametrize("fused", [True, False])
def test_long_reads_of_a_buffers_first_rows_read_the_whole_buffer(monkeypatch, fused):
    """A kernel whose tiled read of ``y[0:t+1]`` covers more than ``WHOLE_BUFFER_SHARE``
    (0.6) of the buffer reads the whole buffer (no rows sliced out) and masks the rows past ``t``; shorter
    reads are sliced. Not where a value of the padded length leaves the kernel (without
    fusion, the reading matmul's output has the padded length). The values are the
    reference evaluator's either way. (Buffers that do not grow: a growing one holds the
    read's rows exactly, see below.)"""
    from tempo.runtime import executable
    from tempo.runtime.backends import JaxBackend
    monkeypatch.setattr(executable, "_growth_step", lambda readers, bounds: None)
    rows_read = set()
    original = JaxBackend.block_kernel

    def recording(self, op, params, inputs, slices, writes=(), shared=(), returned=()):
        run = original(self, op, params, inputs, slices, writes, shared, returned)

        def recorded(rows, *args):
            rows_read.update(rows)
            return run(rows, *args)
        return recorded if slices else run
    monkeypatch.setattr(JaxBackend, "block_kernel", recording)
    _checked_attention(90, 2, without=None if fused else "fusion")
    # 64 and 80 rows of 96: the whole buffer
    assert rows_read == ({16, 32, 48, 96} if fused else {16, 32, 48, 64, 80, 96})


@pytest.mark.parametrize("newest", [True, False])
def test_a_buffer_read_from_its_first_row_grows_by_tiles(monkeypatch, newest):
    """A device buffer whose readers read its first rows, padded to tiles, holds whole
    tiles up to its last written row: every kernel reads the whole buffer (no rows sliced
    out), which ends at the padded length of the longest read; the values are the
    reference evaluator's."""
    rows_read = _record_first_rows(monkeypatch)
    _checked_attention(90, 2, without=None if newest else "newest")
    assert {rows for _, rows in rows_read} == {16, 32, 48, 64, 80, 96}
    assert all(count == rows for count, rows in rows_read)


def test_later_row_counts_compile_in_the_background(monkeypatch):
    """At its first launch, a kernel with tiled reads starts compiling the row counts its
    later points read, in the order they come (a decoder's next tiles compile while it
    decodes), for the shapes its buffers will have then: no later launch compiles in the
    foreground, in this run or the next. The values are the reference evaluator's."""
    import logging
    import threading

    from tempo.runtime.backends import JaxBackend
    later, kernels, compiles = [], set(), []
    original = JaxBackend.compile_later

    def recording(self, kernel, static, args, first=False):
        later.append(static)
        kernels.add(kernel)
        return original(self, kernel, static, args, first)
    monkeypatch.setattr(JaxBackend, "compile_later", recording)

    class Compiles(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Compiling jit(block_"):
                compiles.append(threading.current_thread() is threading.main_thread())
    handler, logger = Compiles(), logging.getLogger("jax")
    logger.addHandler(handler)
    ctx, bounds, s = _exp_attention(90, seed=3)
    try:
        with ctx, jax.log_compiles():
            exe = ctx.compile(bounds, [s], backend="jax", tile=16, loops=INTERPRETED)
            got = exe.run()[s]
            again = exe.run()[s]  # the programs kept: nothing compiles again
    finally:
        logger.removeHandler(handler)
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(again, got)
    # t = 0 reads 16 rows (no points, padded), then 32, 48, ...: the buffer grows with them
    assert later == [(32,), (48,), (64,), (80,), (96,)]
    assert compiles == [True]  # in the foreground, only the first launch (JAX logs this thread's)
    (kernel,) = kernels
    assert kernel._cache_size() == 6  # one program per count read


def _rollout_sums(host_step: bool = False):
    """Over (i, t): ``x`` made by a device kernel and ``h``, a merge over ``t`` (its first
    point a constant, the others a device kernel's, or with ``host_step`` a host UDF's), both
    read whole by a learner-like op over ``i`` (``[i, 0:T]``)."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(5)
    with ctx:
        x = (tp.const(rng.normal(size=(3, 12, 4)).astype(np.float32))[i, t] * 1.5).tanh()
        h = tp.placeholder(shape=(4,), dtype="float32", domain=(i, t))
        h[i, 0] = tp.const(np.ones(4, np.float32))
        if host_step:
            h[i, t + 1] = tp.udf(lambda a, b: np.tanh(a * 0.9 + b), [h, x], [((4,), "float32")],
                                 name="host_step")[0]
        else:
            h[i, t + 1] = h * 0.9 + x * 0.5
        s = (x[i, 0:T] * h[i, 0:T]).sum(0).sum(-1)
    return ctx, {I: 3, T: 12}, s


@pytest.mark.parametrize("loops", ["lowered", "interpreted"])
def test_rows_read_whole_stay_on_the_device(loops):
    """A store read whole by an op outside its innermost dim (a rollout read by the
    learner) keeps device buffers, also a merge of device values; the values are the
    reference evaluator's."""
    from tempo.runtime.stores import BlockStore
    ctx, bounds, s = _rollout_sums()
    with ctx:
        exe = ctx.compile(bounds, [s], backend="jax", loops=tp.LoopPolicy(loops))
        got = exe.run()[s]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
    blocks = {exe.graph.ops[op].kind: store for (op, _), store in _stores_of(exe).items()
              if isinstance(store, BlockStore)}
    assert "merge" in blocks and len(blocks) == 2, blocks
    assert all(store.buffers.on_device for store in blocks.values())
    assert exe.stats.peak_host_bytes == 0


def test_a_merge_stepped_by_a_host_op_keeps_host_buffers():
    """A merge whose values along ``t`` come from a host op (a host env's observations)
    keeps host buffers: a device buffer would take a host row at every step. The device
    kernel's store beside it is on the device."""
    from tempo.runtime.stores import BlockStore
    ctx, bounds, s = _rollout_sums(host_step=True)
    with ctx:
        exe = ctx.compile(bounds, [s], backend="jax")
        got = exe.run()[s]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
    placed = {exe.graph.ops[op].kind: store.buffers.on_device for (op, _), store in _stores_of(exe).items()
              if isinstance(store, BlockStore)}
    assert placed.get("merge") is False and True in placed.values(), placed


def test_a_host_op_takes_the_row_a_kernel_wrote_without_a_gather(monkeypatch):
    """A host op reading a point of device buffers that a kernel writes itself (a host
    env reading the action the policy kernel wrote) gets the row the kernel returned
    beside the buffer: no program gathers it from the buffer (one launch a step). The
    values are the reference evaluator's."""
    from tempo.runtime.backends import JaxBackend
    from tempo.runtime.stores import BlockStore
    gathered = []
    take = JaxBackend.take
    monkeypatch.setattr(JaxBackend, "take", lambda self, *args: gathered.append(args[1]) or take(self, *args))
    ctx, bounds, s = _rollout_sums(host_step=True)
    with ctx:
        exe = ctx.compile(bounds, [s], backend="jax", loops=tp.LoopPolicy("interpreted"))
        got = exe.run()[s]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
    read = [store for store in _stores_of(exe).values()
            if isinstance(store, BlockStore) and store.point_reads]
    assert len(read) == 1 and read[0].buffers.on_device  # x's: the host step reads x[i, t]
    assert gathered == []


@pytest.mark.parametrize("loops", ["lowered", "interpreted"])
def test_an_op_without_dims_reads_a_device_buffer_whole(loops):
    """An op without dims (a point ``()``) reading every row of a device buffer: its
    block launcher has no later points to compile ahead; the value is the reference's."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(np.random.default_rng(2).normal(size=(10, 3)).astype(np.float32))[t].tanh()
        s = (x[0:T] * 2.0).sum(0)
        exe = ctx.compile({T: 10}, [s], backend="jax", loops=tp.LoopPolicy(loops))
        got = exe.run()[s]
    np.testing.assert_allclose(got, evaluate(ctx, {T: 10}, [s])[s.key], rtol=1e-5, atol=1e-5)
    from tempo.runtime.stores import BlockStore
    blocks = [store for store in _stores_of(exe).values() if isinstance(store, BlockStore)]
    assert blocks and all(store.buffers.on_device for store in blocks)


@pytest.mark.parametrize("loops", ["lowered", "interpreted"])
def test_a_learner_reading_a_rollout_from_device_buffers_compiles_ahead(monkeypatch, loops):
    """The kernel reading a rollout whole from device buffers starts compiling in the
    background before the run makes the buffers (their shapes are known ahead), and its
    first launch takes that program (the compile is waited for, not cancelled), for the
    arguments it launches with: with the loop lowered, no program taking the learner's
    arguments (two buffers of 12 x 4, each with its first row) compiles on the program's
    thread (interpreted, the writer's kernel takes arguments of those types too). The
    values are the reference evaluator's."""
    from compile_log import compiled_here

    from tempo.runtime import executable
    events = []
    ahead, ready = executable._Programs.ahead, executable._Programs.ready

    def recording_ahead(self, kernel, shape, args, first=False):
        events.append(("ahead", shape))
        return ahead(self, kernel, shape, args, first)

    def recording_ready(self, kernel, shape, later):
        pending = self.compiling.get(shape)
        ready(self, kernel, shape, later)
        events.append(("ready", shape, pending is not None and not pending.cancelled()))
    monkeypatch.setattr(executable._Programs, "ahead", recording_ahead)
    monkeypatch.setattr(executable._Programs, "ready", recording_ready)
    ctx, bounds, s = _rollout_sums()
    with ctx, compiled_here("run") as here:
        exe = ctx.compile(bounds, [s], backend="jax", loops=tp.LoopPolicy(loops))
        got = exe.run()[s]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
    # the learner's launch: two buffers read (12 rows each), none written (a writer, in
    # the interpreted form, makes its buffer as it goes: not compiled ahead)
    learner = ((12, 12), (12, 12), ())
    assert events[0] == ("ahead", learner) and ("ready", learner, True) in events, events
    pair = "ShapedArray(float32[12,4]), ShapedArray(int32[])"
    types = f"({pair}, {pair})"
    assert loops == "interpreted" or not [line for line in here if types in line], here
