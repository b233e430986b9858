"""Memory is scheduled: a recurrence that only needs its previous point runs in bounded memory,
whatever T is; ``exe.stats.peak`` (peak number of live stored points) is a real measurement."""

import numpy as np
import pytest

import tempo as tp

BIG = 100_000


def decay_program(n):
    """y[0] = 0; y[t+1] = 0.5 y[t] + (t mod 7); only y[T-1] is an output."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        y = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        y[0] = 0.0
        y[t + 1] = y * 0.5 + tp.symbol_value(t % 7).astype("float32")
        last = y[T - 1]
    assert last.domain == ()
    exe = ctx.compile(bounds={T: n}, outputs=[last], backend="numpy")
    return exe, last


def numpy_decay(n):
    y = 0.0
    for k in range(n - 1):
        y = 0.5 * y + (k % 7)
    return y


@pytest.fixture(scope="module")
def big_run():
    exe, last = decay_program(BIG)
    res = exe.run()
    return exe, float(res[last]), exe.stats.peak


def test_long_recurrence_value(big_run):
    _, value, _ = big_run
    np.testing.assert_allclose(value, numpy_decay(BIG), rtol=1e-5)


def test_long_recurrence_runs_in_bounded_memory(big_run):
    _, _, peak = big_run
    assert 0 < peak <= 16


def test_peak_does_not_grow_with_T(big_run):
    _, _, big_peak = big_run
    exe, last = decay_program(1_000)
    res = exe.run()
    np.testing.assert_allclose(float(res[last]), numpy_decay(1_000), rtol=1e-5)
    assert exe.stats.peak == big_peak


def test_simple_closed_form_recurrence_in_bounded_memory():
    """y[t+1] = 0.5 y[t] + 1 from y[0] = 0 has y[t] = 2 (1 - 0.5**t)."""
    n = 20_000
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        y = tp.placeholder(domain=(t,))
        y[0] = 0.0
        y[t + 1] = y * 0.5 + 1.0
        last = y[T - 1]
        tenth = y[9]
    exe = ctx.compile(bounds={T: n}, outputs=[last, tenth], backend="numpy")
    res = exe.run()
    np.testing.assert_allclose(float(res[tenth]), 2.0 * (1.0 - 0.5 ** 9), rtol=1e-6)
    np.testing.assert_allclose(float(res[last]), 2.0 * (1.0 - 0.5 ** (n - 1)), rtol=1e-6)
    assert exe.stats.peak <= 16


def causal_program(n):
    """c[t] = sum(x[0:t+1]) with x = 2 * arange: every x must stay alive until the end."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(np.arange(n, dtype=np.float32))[t] * 2.0
        c = x[0:t + 1].sum()
        total = c[T - 1]
    exe = ctx.compile(bounds={T: n}, outputs=[total], backend="numpy")
    return exe, total


def test_peak_grows_when_the_program_needs_it():
    peaks = {}
    for n in (50, 200):
        exe, total = causal_program(n)
        res = exe.run()
        np.testing.assert_allclose(float(res[total]), float(n * (n - 1)), rtol=1e-6)
        peaks[n] = exe.stats.peak
        assert peaks[n] >= n              # all of x[0:T] is alive when c[T-1] reads it
    assert peaks[200] > peaks[50]


def test_stats_are_reset_by_each_run():
    exe, last = decay_program(500)
    exe.run()
    first = exe.stats.peak
    exe.run()
    assert exe.stats.peak == first


def window_program(n):
    """w[t] = sum(x[max(0, t-3):t+1]), accumulated into s; only s[T-1] is an output.

    Each x point is read by at most four windows, so it can be freed four steps after it
    was made: the live set does not need to grow with T.
    """
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.symbol_value(t).astype("float32") * 2.0
        w = x[tp.max(0, t - 3):t + 1].sum()
        s = tp.placeholder(domain=(t,))
        s[0] = w
        s[t + 1] = s + w[t + 1]
        last = s[T - 1]
    exe = ctx.compile(bounds={T: n}, outputs=[last], backend="numpy")
    return exe, last


def test_backward_window_runs_in_bounded_memory():
    peaks = {}
    for n in (50, 200):
        exe, last = window_program(n)
        res = exe.run()
        xs = 2.0 * np.arange(n)
        want = sum(xs[max(0, k - 3):k + 1].sum() for k in range(n))
        np.testing.assert_allclose(float(res[last]), want, rtol=1e-6)
        peaks[n] = exe.stats.peak
    assert peaks[200] == peaks[50], peaks


# ---- where points wait: swapping to host memory (tempo.MemoryPolicy) ------------------------
WIDE = np.random.default_rng(2).normal(size=(8, 256)).astype(np.float32)  # 1 KiB per point


def last_point_program():
    """A recurrence ``x[t]`` computed forwards, each point scaled by the last one: every
    point of x waits in memory until the recurrence has reached ``x[T - 1]``."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.placeholder(shape=(256,), dtype="float32", domain=(t,))
        x[0] = tp.const(WIDE[0])
        x[t + 1] = (x * 0.5 + tp.const(WIDE)[t + 1]).tanh()
        out = (x * x[T - 1]).sum()
    return ctx, {T: 8}, out


def numpy_last_point() -> np.ndarray:
    xs = [WIDE[0]]
    for k in range(1, 8):
        xs.append(np.tanh(xs[-1] * 0.5 + WIDE[k]))
    return (np.stack(xs) * xs[-1]).sum(axis=1)


def test_points_that_outlive_their_loop_wait_in_host_memory():
    ctx, bounds, out = last_point_program()
    low = ctx.compile(bounds, [out], backend="jax", memory=tp.MemoryPolicy(swap=True, swap_min_bytes=0))
    default = ctx.compile(bounds, [out], backend="jax")
    for exe in (low, default):
        np.testing.assert_allclose(exe.run()[out], numpy_last_point(), rtol=1e-5, atol=1e-4)
    assert len(low.swapped) == 1 and not default.swapped
    # all 8 points of x (1 KiB each) wait at once: on the host with swapping, else on the device
    assert low.stats.peak_host_bytes == 8 * 1024
    assert default.stats.peak_device_bytes >= 8 * 1024
    # what stays on the device: the constant, one temporary, the outputs
    assert default.stats.peak_device_bytes - low.stats.peak_device_bytes >= 7 * 1024
    assert low.stats.device_bytes == default.stats.device_bytes  # the kept outputs only


def test_only_tensors_above_the_threshold_are_swapped():
    ctx, bounds, out = last_point_program()
    exe = ctx.compile(bounds, [out], backend="jax", memory=tp.MemoryPolicy(swap=True, swap_min_bytes=1025))
    assert not exe.swapped


def test_points_used_inside_their_loop_stay_on_the_device():
    """A recurrence reads ``y[t - 1]`` in the loop that produced it: nothing to swap."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        y = tp.placeholder(shape=(256,), dtype="float32", domain=(t,))
        y[0] = tp.const(WIDE[0])
        y[t + 1] = (y * 0.5).tanh()
        last = y[T - 1]
    exe = ctx.compile({T: 8}, [last], backend="jax", memory=tp.MemoryPolicy(swap=True, swap_min_bytes=0))
    assert not exe.swapped


def test_swapping_changes_nothing_on_the_numpy_backend():
    ctx, bounds, out = last_point_program()
    exe = ctx.compile(bounds, [out], backend="numpy", memory=tp.MemoryPolicy(swap=True, swap_min_bytes=0))
    assert not exe.swapped


def test_a_negative_threshold_is_rejected():
    with pytest.raises(ValueError, match="swap_min_bytes"):
        tp.MemoryPolicy(swap=True, swap_min_bytes=-1)


# ---- donation -----------------------------------------------------------------------------
STATE = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)


def state_program():
    """A recurrent state updated in place: ``y[t+1] = tanh(0.5 y[t] + x[t+1])``."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        y = tp.placeholder(shape=(256,), dtype="float32", domain=(t,))
        y[0] = tp.const(STATE[0])
        y[t + 1] = (y * 0.5 + tp.const(STATE)[t + 1]).tanh()
        last = y[T - 1]
    return ctx, {T: 8}, last


def numpy_state(n: int = 8) -> np.ndarray:
    y = STATE[0]
    for k in range(1, n):
        y = np.tanh(y * 0.5 + STATE[k])
    return y


def test_a_recurrent_state_is_updated_in_the_buffer_it_replaces():
    ctx, bounds, last = state_program()
    donating = ctx.compile(bounds, [last], backend="jax", memory=tp.MemoryPolicy(donate_min_bytes=0),
                           loops=tp.LoopPolicy("interpreted"))
    plain = ctx.compile(bounds, [last], backend="jax", memory=tp.MemoryPolicy(donate=False),
                        loops=tp.LoopPolicy("interpreted"))
    for exe in (donating, plain):
        np.testing.assert_allclose(exe.run()[last], numpy_state(), rtol=1e-6, atol=1e-6)
    # each of the 7 updates reads y[t] last and takes its 1 KiB buffer over
    assert donating.stats.donated == 7 and donating.stats.donated_bytes == 7 * 1024
    assert plain.stats.donated == 0
    # later runs reuse the donating kernels and donate again
    np.testing.assert_allclose(donating.run()[last], numpy_state(), rtol=1e-6, atol=1e-6)
    assert donating.stats.donated == 7


def test_small_values_and_the_numpy_backend_donate_nothing():
    ctx, bounds, last = state_program()
    small = ctx.compile(bounds, [last], backend="jax", memory=tp.MemoryPolicy(donate_min_bytes=1025))
    numpy = ctx.compile(bounds, [last], backend="numpy", memory=tp.MemoryPolicy(donate_min_bytes=0))
    for exe in (small, numpy):
        np.testing.assert_allclose(exe.run()[last], numpy_state(), rtol=1e-6, atol=1e-6)
        assert exe.stats.donated == 0 and not exe.schedule.last_reads


@pytest.mark.parametrize("passes", [None, []])
def test_a_value_another_store_holds_is_not_donated(passes):
    """The placeholder ``y[t+1]`` holds the same array as ``n[t]``. The update reads
    ``y[t+1]`` last, but ``out`` reads ``n[t]`` after the loop (it needs ``y[T-1]``):
    donating ``y[t+1]`` would delete the array ``out`` still has to read."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        y = tp.placeholder(shape=(256,), dtype="float32", domain=(t,))
        y[0] = tp.const(STATE[0])
        n = (y * 0.5 + tp.const(STATE)[t + 1]).tanh()
        y[t + 1] = n
        out = n * y[T - 1]
    exe = ctx.compile({T: 7}, [out], backend="jax", passes=passes,
                      memory=tp.MemoryPolicy(donate_min_bytes=0), loops=tp.LoopPolicy("interpreted"))
    ys = [STATE[0]]
    for k in range(1, 8):
        ys.append(np.tanh(ys[-1] * 0.5 + STATE[k]))
    expected = np.stack([ys[k + 1] * ys[6] for k in range(7)])
    for _ in range(2):
        np.testing.assert_allclose(exe.run()[out], expected, rtol=1e-6, atol=1e-6)


def test_a_negative_donation_threshold_is_rejected():
    with pytest.raises(ValueError, match="donate_min_bytes"):
        tp.MemoryPolicy(donate_min_bytes=-1)


class _AllSplit:
    """A NumPy backend that reports every value split over devices (``SplitPointStore``
    counts their bytes in ``MemoryStats.split``)."""

    def __init__(self) -> None:
        from tempo.runtime.backends import NumpyBackend
        self._numpy = NumpyBackend()

    def is_split(self, value) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self._numpy, name)


@pytest.mark.parametrize("kind", ["point", "block", "split", "split, shapes vary"])
def test_freeing_many_points_is_freeing_each(kind):
    """A loop's frees, batched (``free_many``), leave a store as one free per point
    does: the same values and rows held, live points and bytes (split bytes too); a
    block's buffer is released once all its rows were written and freed."""
    from tempo.runtime.backends import NumpyBackend
    from tempo.runtime.stores import BlockStore, MemoryStats, PointStore, SplitPointStore

    def filled() -> tuple:
        stats = MemoryStats()
        if kind.startswith("split"):
            store = SplitPointStore(_AllSplit(), stats, lambda sizes: np.zeros(sizes),
                                    point_bytes=None if kind.endswith("vary") else 16)
            store.write_rows([(0, k) for k in range(4)], np.arange(8.0).reshape(4, 2), list(range(4)))
            store.write((1, 0), np.ones(2))
        elif kind == "point":
            store = PointStore(NumpyBackend(), stats, lambda sizes: np.zeros(sizes))
            store.write_rows([(0, k) for k in range(4)], np.arange(8.0).reshape(4, 2), list(range(4)))
            store.write((1, 0), np.ones(2))
        else:
            store = BlockStore(stats, 4, (2,), "float64")
            store.write_rows([(0, k) for k in range(4)], np.arange(8.0).reshape(4, 2), list(range(4)))
            store.write((1, 0), np.ones(2))
        return store, stats

    points = [(0, 0), (0, 2), (0, 1), (0, 3), (1, 0), (2, 5)]  # (2, 5) was never written
    one, one_stats = filled()
    for point in points:
        one.free(point)
    many, many_stats = filled()
    many.free_many(points + ([] if kind == "block" else [(0, 2)]))  # (a point named twice)
    assert many_stats == one_stats
    assert many_stats.live == 0
    if kind.startswith("split"):
        assert one_stats.split.now == 0 and one_stats.split.peak == 5 * 16
    if kind != "block":
        assert not many.data and not many.data.rows
    else:
        assert list(many.blocks) == list(one.blocks) == [(1,)]  # (1,): one of 4 rows written
        assert many_stats.host.now == one_stats.host.now == 4 * 2 * 8


def test_a_block_stores_rows_written_at_once_are_written_each():
    """Rows of one stacked array written at points of several buffers, interleaved
    (``BlockStore.write_rows``), hold what writing each point alone holds, with the same
    live points."""
    from tempo.runtime.stores import BlockStore, MemoryStats

    stacked = np.arange(12.0).reshape(6, 2)
    points = [(1, 0), (0, 2), (1, 1), (0, 0), (1, 3), (0, 1)]
    rows = [5, 0, 3, 1, 2, 4]
    at_once_stats, each_stats = MemoryStats(), MemoryStats()
    at_once, each = BlockStore(at_once_stats, 4, (2,), "float64"), BlockStore(each_stats, 4, (2,), "float64")
    at_once.write_rows(points, stacked, rows)
    for point, row in zip(points, rows):
        each.write(point, stacked[row])
    for point, row in zip(points, rows):
        np.testing.assert_array_equal(at_once.read(point), stacked[row])
    assert at_once_stats == each_stats and at_once_stats.live == 6
    assert sorted(at_once.live) == [(0,), (1,)] and at_once.live[(1,)] == {0, 1, 3}


def test_a_block_stores_points_of_one_buffer_freed_at_once_are_freed_each():
    """A loop's frees of one buffer's points (one prefix, a point named twice), batched,
    leave the store as one free per point does; the buffer goes once all its rows are."""
    from tempo.runtime.stores import BlockStore, MemoryStats

    stores = []
    for _ in range(2):
        stats = MemoryStats()
        store = BlockStore(stats, 4, (2,), "float64")
        store.write_rows([(3, k) for k in range(4)], np.arange(8.0).reshape(4, 2), list(range(4)))
        stores.append((store, stats))
    (one, one_stats), (many, many_stats) = stores
    points = [(3, 2), (3, 0), (3, 2)]
    for point in points:
        one.free(point)
    many.free_many(points)
    assert many_stats == one_stats and many_stats.live == 2 and many.live[(3,)] == {1, 3}
    many.free_many([(3, 1), (3, 3)])
    assert many_stats.live == 0 and not many.blocks


def test_a_block_stores_rows_stack_as_one_copy():
    """A lowered loop reading one value per iteration from a block store takes the rows
    of one buffer at once, as reading each point and stacking would; points of two
    buffers are not one array."""
    from tempo.runtime.stores import BlockStore, MemoryStats

    store = BlockStore(MemoryStats(), 5, (2,), "float32")
    store.write_rows([(0, k) for k in range(5)], np.arange(10, dtype=np.float32).reshape(5, 2),
                     list(range(5)))
    store.write((1, 0), np.ones(2, np.float32))
    points = [(0, 4), (0, 1), (0, 1), (0, 3)]
    rows = store.stacked(points)
    np.testing.assert_array_equal(rows, np.stack([store.read_point(p) for p in points]))
    rows[0] = -1  # a copy: the buffer is unchanged
    np.testing.assert_array_equal(store.read_point((0, 4)), [8, 9])
    assert store.stacked([(0, 0), (1, 0)]) is None
    assert store.stacked([(2, 0)]) is None and store.stacked([]) is None


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_slice_of_rows_a_backward_loop_stacked_is_one_gather(monkeypatch, backend):
    """A backward loop's outputs are stacked in reverse order of their points: a forward
    slice of them is one gather of the stacked array (was one slice per point); points of
    another array and single points join it."""
    from tempo.runtime.backends import make_backend
    from tempo.runtime.stores import MemoryStats, PointStore
    arrays = make_backend(backend)
    calls: list[str] = []
    for name in ("take", "rows", "stack"):
        original = getattr(arrays, name)
        monkeypatch.setattr(arrays, name, lambda *a, name=name, original=original: (calls.append(name),
                                                                                     original(*a))[1])
    store = PointStore(arrays, MemoryStats(), lambda sizes: np.zeros(sizes))
    stacked = np.arange(12, dtype=np.float32).reshape(6, 2)  # row n holds point 5 - n
    store.write_rows([(0, 5 - n) for n in range(6)], stacked, list(range(6)))
    store.write((0, 6), np.full(2, -1, np.float32))
    got = store.read((0, slice(0, 7)))
    expected = np.concatenate([stacked[::-1], np.full((1, 2), -1, np.float32)])
    np.testing.assert_array_equal(np.asarray(got), expected)
    assert calls == ["take", "stack"]
    calls.clear()
    np.testing.assert_array_equal(np.asarray(store.read((0, slice(2, 5)))), stacked[3:0:-1])
    assert calls == ["take"]


def windows_and_sums_program():
    """A backward window and an anti-causal sum (block stores) over ``(i, t)``."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = (tp.const(WIDE)[t] * 2.0).tanh()
        w = x[i, tp.max(0, t - 3):t + 1].mean(0)
        g = x[i, t:T].sum(0)
        out = (w * g).sum()
    return ctx, {I: 2, T: 8}, out


@pytest.mark.parametrize("program", [last_point_program, windows_and_sums_program])
@pytest.mark.parametrize("memory", [tp.MemoryPolicy(), tp.MemoryPolicy(swap=True, swap_min_bytes=0)])
def test_the_predicted_footprint_is_what_the_run_holds(program, memory):
    """Without running, the schedule predicts the stores' peak bytes on the device and in
    host memory: exactly what the run then measures (interpreted loops, so every point goes
    through the stores)."""
    ctx, bounds, out = program()
    exe = ctx.compile(bounds, [out], backend="jax", memory=memory, loops=tp.LoopPolicy("interpreted"))
    predicted = exe.predicted_footprint()
    exe.run()
    assert predicted.device.peak == exe.stats.peak_device_bytes
    assert predicted.host.peak == exe.stats.peak_host_bytes
    assert predicted.device.peak + predicted.host.peak > 0


def _window_sums(n: int, w: int, backend: str, ahead: bool = False):
    """y[t] = sum of x over the last ``w`` positions, x[t] = (t mod 5) * ones(8). With
    ``ahead``, a second reader of x[T-1] at every t makes all of x be computed first."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.symbol_value(t % 5).astype("float32").unsqueeze(0).expand(8)
        y = x[tp.max(0, t - w + 1):t + 1].sum(0)
        if ahead:
            y = y + x[T - 1] * 0.0
    exe = ctx.compile(bounds={T: n}, outputs=[y], backend=backend)
    return exe, exe.run()[y]


def _expected_window_sums(n: int, w: int) -> np.ndarray:
    x = np.array([k % 5 for k in range(n)], np.float32)
    return np.array([x[max(0, k - w + 1):k + 1].sum() for k in range(n)])[:, None] * np.ones(8)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_window_read_keeps_a_ring_of_its_width(backend):
    """The store of x holds w rows (a ring, each point written once) however long the dim:
    its bytes do not grow with T."""
    peaks = {}
    for n in (60, 240):
        exe, got = _window_sums(n, 4, backend)
        np.testing.assert_allclose(got, _expected_window_sums(n, 4))
        peaks[n] = exe.stats.peak_host_bytes
    assert peaks[60] == peaks[240] <= 4 * 8 * 4  # (JAX: on the device)


def test_a_window_store_grows_rather_than_overwrite_a_live_point():
    exe, got = _window_sums(40, 3, "numpy", ahead=True)
    np.testing.assert_allclose(got, _expected_window_sums(40, 3))


def test_the_predicted_footprint_counts_a_window_store_as_its_ring():
    exe, _ = _window_sums(200, 4, "numpy")
    assert exe.predicted_footprint().host.peak == exe.stats.peak_host_bytes == 4 * 8 * 4
