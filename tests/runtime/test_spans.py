"""Loops lowered in spans (``tempo.runtime.lowering``): a loop whose block kernel reads
and writes device buffers runs its iterations as scans, one per stretch of iterations
over which the buffers keep their shape, carrying the buffers; the values are the
reference evaluator's and the interpreted loop's."""

from __future__ import annotations

import numpy as np
import pytest

import tempo as tp
from tempo.reference import evaluate

jax = pytest.importorskip("jax")


def _attention(length: int, window: int | None = None, seed: int = 0):
    """``s[t]``: the sum over ``y[0:t+1]`` (or its last ``window`` rows) of ``exp(q . y)``,
    with ``y[t]`` made at ``t`` (one fused kernel writes it and reads the rows); the
    context, bounds and ``s``."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(seed)
    with ctx:
        x = tp.const(rng.normal(size=(length, 2, 3)).astype(np.float32))[t]
        y = x.tanh()
        q = tp.const(rng.normal(size=(2, 1, 3)).astype(np.float32))
        rows = y[0:t + 1] if window is None else y[tp.max(0, t - window + 1):t + 1]
        s = (q @ rows.permute(1, 2, 0)).exp().sum(-1)
    return ctx, {T: length}, s


def _run(length: int, window: int | None, loops: tp.LoopPolicy | None = None, tile: int | None = 16):
    ctx, bounds, s = _attention(length, window)
    with ctx:
        exe = ctx.compile(bounds, [s], backend="jax", tile=tile, loops=loops)
        got = exe.run()[s]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
    return exe, got


def test_runs_of_rows_from_a_moving_first_row_are_read_in_place():
    """A window of 4 whose rows are also kept (``y`` is an output too: a buffer of every
    row, no ring): from the 4th point on each read is a run of the buffer's rows starting
    one row later than the last, read in place inside the scan (its first row per
    iteration); the first three read from row 0, whole (too few for a span). The values are
    the reference evaluator's."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    rng = np.random.default_rng(5)
    with ctx:
        y = tp.const(rng.normal(size=(60, 2, 3)).astype(np.float32))[t].tanh()
        q = tp.const(rng.normal(size=(2, 1, 3)).astype(np.float32))
        s = (q @ y[tp.max(0, t - 3):t + 1].permute(1, 2, 0)).exp().sum(-1)
        exe = ctx.compile({T: 60}, [s, y], backend="jax", tile=16)
        got = exe.run()
    expected = evaluate(ctx, {T: 60}, [s, y])
    np.testing.assert_allclose(got[s], expected[s.key], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[y], expected[y.key], rtol=1e-6)
    choice = _spans(exe)
    assert choice.iterations_in_scans >= 50 and choice.scans >= 1


def _spans(exe) -> tp.runtime.lowering.LoopChoice:
    (choice,) = [c for c in exe.loop_choices.values() if c.form == "spans"]
    return choice


@pytest.mark.parametrize("window,tile,lowered,scans", [(None, 16, 80, 5), (4, None, 89, 1), (4, 16, 0, 0)])
def test_a_block_kernels_loop_runs_in_spans(window, tile, lowered, scans):
    """Causal reads in tiles of 16 rows: the buffer grows by a tile at a time, each tile
    is a span, and the last 10 iterations (fewer than ``MIN_SPAN``) are interpreted. A
    window of 4 padded to itself: a ring that the scan overwrites as its rows are freed,
    read whole, one span (the last iteration, which frees the rows left in an inner loop,
    is interpreted). A window of 4 padded to 16 rows: a ring of 16 whose 4 points lie
    anywhere in it, neither the whole ring in order nor one run of its rows: interpreted
    (the launcher gathers the rows). The values are the reference
    evaluator's and, to float rounding, the interpreted loop's; a second run compiles
    nothing."""
    exe, got = _run(90, window, tile=tile)
    choice = _spans(exe)
    counts = (choice.iterations_in_scans, choice.interpreted_iterations, choice.scans)
    assert counts == (lowered, 90 - lowered, scans)
    compiled = choice.compile_seconds
    np.testing.assert_array_equal(exe.run()[exe.outputs[0]], got)
    assert choice.compile_seconds == compiled and choice.scans == 2 * scans
    interpreted, interpreted_run = _run(90, window, tp.LoopPolicy(mode="interpreted"), tile=tile)
    np.testing.assert_allclose(got, interpreted_run, rtol=1e-6)
    # the device bytes the stores held at most (the buffers), and what is left, as interpreted
    assert exe.stats.device.peak == interpreted.stats.device.peak
    assert exe.stats.live == interpreted.stats.live and exe.stats.device.now == interpreted.stats.device.now


def test_the_next_tiles_scan_compiles_while_a_span_runs(monkeypatch):
    """Causal reads in tiles of 16 rows: while each span runs, the scan of the next tile
    (16 iterations, the buffer 16 rows longer) compiles on a background thread, and the
    next span takes it: only the first of the five compiles in the foreground, none is
    left over, and none is made for a span that does not come (the last 10 iterations)."""
    from tempo.runtime.backends import JaxBackend
    background = []
    original = JaxBackend.compile_in_background

    def recording(self, jitted, args):
        background.append(args[6][0].shape)  # the first buffer's shape
        return original(self, jitted, args)
    monkeypatch.setattr(JaxBackend, "compile_in_background", recording)
    exe, _ = _run(90, None)
    (launcher,) = [launch for launch in exe._launchers.values() if launch.spans is not None]
    assert [shape[-1] for shape in background] == [32, 48, 64, 80]  # rows along the last axis
    assert not launcher.compiling and len(launcher.traced) == 5


def _doubled_on_the_host(s, **when):
    """``s`` doubled by a host UDF (a host op with an output: the loop needs the host at
    its points)."""
    (doubled,) = tp.udf(lambda value: value * 2, [s], outputs=[(tuple(s.shape), "float32")],
                        name="double", **when)
    return doubled


def test_a_loop_with_a_host_op_at_every_point_is_not_lowered():
    """A host UDF with an output at every point, unguarded: the loop is not lowered."""
    ctx, bounds, s = _attention(40)
    with ctx:
        doubled = _doubled_on_the_host(s)
        exe = ctx.compile(bounds, [doubled], backend="jax", tile=16)
        got = exe.run()[doubled]
    np.testing.assert_allclose(got, evaluate(ctx, bounds, [doubled])[doubled.key], rtol=1e-5, atol=1e-5)
    assert not any(c.form == "spans" for c in exe.loop_choices.values())


def test_a_host_op_at_every_other_point_leaves_no_span():
    """A host UDF guarded to the even points: the loop is lowered in spans, but no stretch
    without it is long enough for a scan; the values are the reference's, and the UDF ran
    at the even points, in order."""
    ctx, bounds, s = _attention(40)
    (t,) = ctx.dims
    expected = evaluate(ctx, bounds, [s])[s.key]  # (before the UDF: the evaluator runs it too)
    seen = []
    with ctx:
        (_,) = tp.udf(lambda point, value: (seen.append(point["t"]), value * 2)[1], [s],
                      outputs=[(tuple(s.shape), "float32")], name="double", pass_point=True, when=t % 2 == 0)
        exe = ctx.compile(bounds, [s], backend="jax", tile=16)
        got = exe.run()[s]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert seen == list(range(0, 40, 2))
    choice = _spans(exe)
    assert (choice.iterations_in_scans, choice.interpreted_iterations) == (0, 40)


def test_sinks_are_called_after_each_span_in_order():
    """A sink at every point does not keep the loop from its spans: it is called after
    each span (of at most ``SINK_SPAN`` iterations) with the values the scan made, at every
    point in order, as the interpreted loop calls it."""
    from tempo.runtime.lowering import SINK_SPAN
    length = 3 * SINK_SPAN + 10
    seen, live = {}, {}
    for mode in ("interpreted", "lowered"):
        ctx, bounds, s = _attention(length)
        expected = evaluate(ctx, bounds, [s])[s.key]  # (before the sink: the evaluator calls sinks too)
        calls = seen[mode] = []
        with ctx:  # (on a value read by nothing else: its points are freed after the sink)
            tp.sink(s * 2.0, lambda value, point, calls=calls: calls.append((point["t"], np.array(value))))
            exe = ctx.compile(bounds, [s], backend="jax", tile=16, loops=tp.LoopPolicy(mode=mode))
            got = exe.run()[s]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        live[mode] = exe.stats.live
    assert [t for t, _ in seen["lowered"]] == list(range(length))
    for (_, ours), (_, theirs), want in zip(seen["lowered"], seen["interpreted"], expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ours, 2 * want, rtol=1e-5, atol=1e-5)
    choice = _spans(exe)
    assert choice.scans >= 3 and choice.iterations_in_scans >= 3 * (SINK_SPAN - 16)
    assert live["lowered"] == live["interpreted"]  # the points the sink read, freed after it


def test_stop_when_in_spans_stops_where_the_interpreted_loop_stops():
    """``tp.stop_when`` on a value the scans make: the run stops at the first point where
    it holds, as the interpreted loop does; later points' sinks are not called and the
    outputs end there, although the scans ran past it; the stop point's own sink is called."""
    from tempo.runtime.lowering import SINK_SPAN
    length, stop = 4 * SINK_SPAN, SINK_SPAN + 20
    results = {}
    for mode in ("interpreted", "lowered"):
        ctx, bounds, s = _attention(length, seed=3)
        (t,) = ctx.dims
        expected = evaluate(ctx, bounds, [s])[s.key]
        floor = float(expected.sum(axis=(1, 2)).min()) - 1.0  # (a condition the scans compute)
        calls = []
        with ctx:
            tp.stop_when((s.sum() > floor) & (tp.symbol_value(t) >= stop))
            tp.sink(s, lambda value, point, calls=calls: calls.append(point["t"]))
            exe = ctx.compile(bounds, [s], backend="jax", tile=16, loops=tp.LoopPolicy(mode=mode))
            out = exe.run()
        results[mode] = (out.stopped_at, out[s], calls)
    stopped, got, calls = results["lowered"]
    assert stopped == results["interpreted"][0] == {"t": stop}
    assert calls == results["interpreted"][2] == list(range(stop + 1))  # (the stop point's sink too)
    np.testing.assert_allclose(got, expected[:stop + 1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results["interpreted"][1], expected[:stop + 1], rtol=1e-5, atol=1e-5)
    choice = _spans(exe)
    assert choice.scans >= 2 and choice.iterations_in_scans > stop  # (the scans ran past it)


def test_spans_with_sinks_keep_one_length_under_a_small_stacked_bound():
    """Reads padded to one shape (no tiles: the buffer never grows) and a sink at every
    point, with ``max_stacked_mb`` allowing 52 iterations: spans of 32 (the largest power
    of two within it, so that they end at its multiples), no tail left to interpret
    (spans of 52 would leave 12 of every 64); two scan programs (the first span is shorter),
    and the values are the reference's."""
    length = 256

    def run(max_stacked_mb: float):
        ctx, bounds, s = _attention(length)
        expected = evaluate(ctx, bounds, [s])[s.key]
        with ctx:
            tp.sink(s * 2.0, lambda value, point: None)
            exe = ctx.compile(bounds, [s], backend="jax", tile=None,
                              loops=tp.LoopPolicy(max_stacked_mb=max_stacked_mb))
            np.testing.assert_allclose(exe.run()[s], expected, rtol=1e-5, atol=1e-5)
        return exe, [launch for launch in exe._launchers.values() if launch.spans is not None][0]
    _, launcher = run(64.0)
    row = max(launcher._row_bytes)
    exe, launcher = run((52 * sum(launcher._row_bytes) + row // 2) / 2**20)
    choice = _spans(exe)
    # (the first iteration makes the buffer, interpreted; then 31 iterations to the first
    # multiple of 32, and 7 spans of 32)
    assert (choice.scans, choice.iterations_in_scans, choice.interpreted_iterations) == (8, 255, 1)
    assert len(launcher.traced) == 2


def test_spans_are_not_made_where_the_policy_interprets():
    exe, got = _run(40, None, tp.LoopPolicy(mode="interpreted"))
    assert exe.loop_choices == {}


def test_outputs_stacked_beyond_the_policys_bound_shorten_the_spans():
    """``max_stacked_mb`` below one iteration's outputs: no span at all (interpreted);
    below 40 iterations' (``s`` is 8 bytes a point): spans of at most that many. The
    values are the reference's either way."""
    exe, _ = _run(90, None, tp.LoopPolicy(max_stacked_mb=1e-6))
    assert _spans(exe).iterations_in_scans == 0
    exe, _ = _run(90, None, tp.LoopPolicy(max_stacked_mb=20 * 8 / 2**20), tile=64)
    choice = _spans(exe)
    assert choice.iterations_in_scans > 0 and choice.iterations_in_scans <= 20 * choice.scans


def test_a_ring_row_still_needed_is_not_overwritten_by_a_span():
    """``WindowStore.first_overwritten``: a scan writing points 4, 5, 6 at iterations 10,
    11, 12 into a ring of 4 holding points 0-3 may overwrite point 0 (freed before), point
    1 only if an earlier iteration frees it, and point 2 likewise."""
    from tempo.runtime.stores import MemoryStats, WindowStore
    store = WindowStore(MemoryStats(), 12, (2,), "float32", capacity=4)
    for k in range(4):
        store.write((0, k), np.full(2, k, np.float32))
    store.free((0, 0))
    assert store.first_overwritten((0,), [4, 5, 6], first=10, freed_at={}) == 1
    assert store.first_overwritten((0,), [4, 5, 6], first=10, freed_at={1: 11}) == 1  # freed too late
    assert store.first_overwritten((0,), [4, 5, 6], first=10, freed_at={1: 10}) == 2
    assert store.first_overwritten((0,), [4, 5, 6], first=10, freed_at={1: 10, 2: 11}) == 3
    # points 4.. wrap around the ring within the span: 8 replaces 4 once 4 was freed
    everything = {1: 10, 2: 11, 3: 12, 4: 13}
    assert store.first_overwritten((0,), [4, 5, 6, 7, 8, 9], first=10, freed_at=everything) == 5
    assert store.first_overwritten((0,), [4, 5, 6, 7, 8], first=10, freed_at={**everything, 4: 14}) == 4
    assert store.capacity[(0,)] == 4  # nothing grew


def test_the_profile_times_each_scan_of_a_loop_in_spans():
    """``RunProfile``: a loop lowered in spans gets a row with one call per scan (its
    interpreted iterations are timed statement by statement)."""
    ctx, bounds, s = _attention(90)
    with ctx:
        exe = ctx.compile(bounds, [s], backend="jax", tile=16)
    profile = tp.RunProfile()
    exe.run(profile=profile)
    (name,) = [name for name, c in exe.loop_choices.items() if c.form == "spans"]
    row = profile.ops[("loop", name)]
    assert row.calls == exe.loop_choices[name].scans == 5 and row.seconds > 0


def test_spans_on_an_accelerator_end_at_multiples_of_the_sink_span():
    """On an accelerator (the backend told it is not on a CPU), a loop without sinks has
    its spans cut as where sinks run: at multiples of ``SINK_SPAN``, all one program;
    the values are the reference's. On this CPU the same loop runs in a single span."""
    from tempo.runtime.lowering import SINK_SPAN
    length = 4 * SINK_SPAN
    scans = {}
    for on_cpu in (True, False):
        ctx, bounds, s = _attention(length, window=4)
        exe = ctx.compile(bounds, [s], backend="jax")
        exe.backend.on_cpu = on_cpu
        got = exe.run()[s]
        np.testing.assert_allclose(got, evaluate(ctx, bounds, [s])[s.key], rtol=1e-5, atol=1e-5)
        scans[on_cpu] = _spans(exe).scans
    assert scans == {True: 1, False: 4}
