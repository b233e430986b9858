"""Captured iterations (``tempo.runtime.capture``): a training loop's steady iterations run
as one program each. They must compute what the interpreted iterations compute (compared
with the same program run without capturing and on NumPy), run late sinks in order with
the values of their iteration, resume where the program says, and refuse, with a reason,
the loops they cannot run so."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tempo as tp
from tempo import cache as tempo_cache
from tempo.runtime import capture
from tempo.runtime.capture import _close
from tempo.runtime.stores import BlockStore, DeviceBuffers, MemoryStats, PointStore

I, T = 9, 6


pytestmark = pytest.mark.usefixtures("captures_checked_alone")


def _program(log: list, host_step: bool = False):
    """Over (i, t): ``w[i]`` a recurrence updated from a rollout ``h[i, 0:T]``, itself a
    recurrence over ``t`` (a lowered loop) driven by random draws (point ops key them); a
    host UDF counts each rollout (only a sink reads it: a late sink), and a sink logs the
    loss and the count. ``host_step``: a host UDF whose value the rollout reads runs at
    every iteration (as a host env's step)."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (Ib, Tb) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.placeholder(shape=(3,), dtype="float32", domain=(i,))
        w[0] = tp.const(np.array([0.5, -1.0, 2.0], np.float32))
        noise = tp.normal((3,), domain=(i, t))
        if host_step:
            (scale,) = tp.udf(lambda point: np.float32(1.0 + point["i"]), [], [((), "float32")], domain=(i,),
                              pass_point=True, name="prompt")
            noise = noise * scale
        h = tp.placeholder(shape=(3,), dtype="float32", domain=(i, t))
        h[i, 0] = w
        h[i, t + 1] = (h * 0.9 + 0.3 * noise).tanh()
        loss = (h[i, 0:Tb] ** 2).mean()
        w[i + 1] = w - 0.1 * h[i, 0:Tb].mean(dim=0) * loss

        def tally(point, rollout):
            log.append(("tally", point["i"], float(rollout.sum())))
            return np.array([point["i"], -1.0], np.float32)
        (counted,) = tp.udf(tally, [h[i, 0:Tb]], [((2,), "float32")], pass_point=True, name="tally")
        tp.sink([loss, counted.max()], lambda values, point: log.append(
            ("sink", point["i"], float(values[0]), float(values[1]))), name="logged")
    return ctx, w, (Ib, Tb)


def _run(backend: str = "jax", capture_mode: bool | None = True, host_step: bool = False,
         origin: dict | None = None, runs: int = 1):
    log: list = []
    ctx, w, (Ib, Tb) = _program(log, host_step)
    exe = ctx.compile({Ib: I, Tb: T}, [w], backend=backend, loops=tp.LoopPolicy(capture=capture_mode))
    for _ in range(runs):
        log.clear()
        res = exe.run(origin={ctx.dims[0]: origin} if origin else None)
    return exe, res[w], log


def test_captured_iterations_compute_what_interpreted_ones_do():
    exe, captured, log = _run()
    report = exe._runner.report
    # The first iteration is a kind of its own; the next records, the one after is traced
    # and checked against its interpreted run; the last is a kind of its own.
    assert report.captured >= I - 5, str(report)
    assert not report.refused, str(report)
    _, plain, plain_log = _run(capture_mode=False)
    _, reference, reference_log = _run(backend="numpy", capture_mode=False)
    np.testing.assert_allclose(captured, plain, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(captured, reference, rtol=1e-5, atol=1e-6)
    # the late sinks ran once per iteration, in order, with the values of their iteration
    assert [entry[:2] for entry in log] == [entry[:2] for entry in plain_log]
    for ours, theirs in zip(log, reference_log):
        np.testing.assert_allclose(ours[2:], theirs[2:], rtol=1e-5, atol=1e-6)


def test_a_second_run_runs_the_programs_the_first_compiled():
    exe, values, _ = _run(runs=2)
    _, plain, _ = _run(capture_mode=False)
    np.testing.assert_allclose(values, plain, rtol=1e-6, atol=1e-7)
    # one program for the steady kind, compiled once; the second run runs its steady
    # iterations as it from the start (the first two iterations are kinds of their own)
    assert exe._runner.report.programs == 1
    assert exe._runner.report.captured >= (I - 5) + (I - 3), str(exe._runner.report)


def test_a_resumed_run_feeds_its_programs_the_moved_coordinates():
    """With an origin, the random draws are keyed by the run's own coordinates moved by it,
    as in the interpreted run: the point ops' values come into the program moved too."""
    _, captured, _ = _run(origin=4)
    _, plain, _ = _run(capture_mode=False, origin=4)
    np.testing.assert_allclose(captured, plain, rtol=1e-6, atol=1e-7)
    _, unmoved, _ = _run(capture_mode=False)
    assert not np.allclose(captured, unmoved)  # (the draws do depend on the origin)


def _changed_programs(monkeypatch, change, late: bool = False) -> None:
    """Every kind's compiled program with ``change`` applied to its floating-point outputs
    (``late``: to the values it hands the late sinks instead)."""
    compiled = capture.IterationRunner._compiled

    def floats(values: list) -> list:
        return [change(x) if np.issubdtype(x.dtype, np.floating) else x for x in values]

    def changed(self, kind):
        compiled(self, kind)
        program = kind.program

        def run(leaves, values):
            out, early = program(leaves, values)
            return (out, floats(early)) if late else ([floats(held) for held in out], early)
        kind.program = run
    monkeypatch.setattr(capture.IterationRunner, "_compiled", changed)


def test_a_program_whose_values_differ_is_never_run(monkeypatch):
    """The first run of a kind's program is checked against the interpreted iteration; a
    program that computes something else is refused, and the run keeps the interpreter's
    values."""
    _changed_programs(monkeypatch, lambda x: x + 1)
    exe, values, _ = _run()
    _, plain, _ = _run(capture_mode=False)
    assert exe._runner.report.captured == 0
    assert "differ" in str(exe._runner.report)
    np.testing.assert_array_equal(values, plain)


def test_a_program_handing_late_sinks_other_values_is_never_run(monkeypatch):
    """The check compares what the program hands the late sinks too (the rollout the
    tally reads is freed within the iteration: only the sink sees it)."""
    _changed_programs(monkeypatch, lambda x: x * 2, late=True)
    exe, values, log = _run()
    _, plain, plain_log = _run(capture_mode=False)
    assert exe._runner.report.captured == 0 and "late sinks' inputs" in str(exe._runner.report)
    np.testing.assert_array_equal(values, plain)
    assert log == plain_log


def test_by_default_only_programs_equal_to_the_bit_run(monkeypatch):
    """``capture=None`` runs a kind's program only where its first run matched the
    interpreted iteration bit for bit (a program that differs in its last bits is refused,
    and the run's values are the interpreter's)."""
    monkeypatch.setattr(capture, "CPU_FRESH_ITERATIONS", 0)  # (this loop is short)
    _changed_programs(monkeypatch, lambda x: np.nextafter(x, np.inf).astype(x.dtype))
    exe, values, _ = _run(capture_mode=None)
    _, plain, _ = _run(capture_mode=False)
    assert exe._runner.report.captured == 0 and "last bits" in str(exe._runner.report)
    np.testing.assert_array_equal(values, plain)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the default's rule for a CPU")
def test_by_default_a_cpu_captures_short_loops_once_checked_before(monkeypatch):
    """On a CPU the default captures a loop shorter than ``CPU_FRESH_ITERATIONS`` only
    where the compile cache notes that its programs were compiled and matched the
    interpreted iterations bit for bit before (and the loop has ``CPU_CHECKED_ITERATIONS``
    iterations); where they matched only up to rounding, it does not try them again."""
    monkeypatch.setattr(capture, "CPU_CHECKED_ITERATIONS", I)
    exe, _, _ = _run(capture_mode=None)
    assert exe._runner is None and "fewer than" in exe.iteration_report
    exe, _, _ = _run(capture_mode=True)  # compiles them, checks them and notes how they compared
    assert exe._runner.report.captured > 0
    exe, values, _ = _run(capture_mode=None)
    assert exe._runner is not None and exe._runner.report.captured > 0, exe.iteration_report
    _, plain, _ = _run(capture_mode=False)
    np.testing.assert_array_equal(values, plain)
    monkeypatch.setattr(capture, "CPU_CHECKED_ITERATIONS", I + 1)
    assert "tracing and loading" in _run(capture_mode=None)[0].iteration_report
    marker = exe._runner.marker
    tempo_cache.store(capture.MARKER, marker, capture.CLOSE)  # (as n-step's would be)
    exe, _, _ = _run(capture_mode=None)
    assert exe._runner is None and "last bits" in exe.iteration_report
    assert _run(capture_mode=True)[0]._runner.report.captured > 0
    assert capture.checked_before(marker) == capture.CLOSE  # (its exact check kept the worst)


def test_a_host_op_at_every_iteration_keeps_the_loop_interpreted():
    exe, values, _ = _run(host_step=True)
    assert exe._runner is None
    assert "prompt" in exe.iteration_report and "steady iterations" in exe.iteration_report
    _, plain, _ = _run(capture_mode=False, host_step=True)
    np.testing.assert_array_equal(values, plain)


def test_a_loop_without_a_lowered_loop_inside_is_not_planned():
    ctx = tp.Context(dims=("i",))
    (i,), (Ib,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.placeholder(shape=(), dtype="float32", domain=(i,))
        x[0] = tp.const(np.float32(1.0))
        x[i + 1] = x * 0.5
    exe = ctx.compile({Ib: 4}, [x], backend="jax", loops=tp.LoopPolicy(capture=True))
    assert "no outermost loop holds a lowered loop" in exe.iteration_report
    np.testing.assert_allclose(exe.run()[x], 0.5 ** np.arange(4))


def test_store_state_moves_between_iterations():
    """A store's points within a window, as a structure relative to an iteration and the
    values, put back elsewhere: the same reads there."""
    import jax.numpy as jnp

    from tempo.runtime.backends import JaxBackend
    backend = JaxBackend()
    stats = MemoryStats()
    points = PointStore(backend, stats, lambda sizes: None, 4)
    points.write((3, 0), jnp.float32(1.0))
    points.write_rows([(3, 1), (3, 2)], jnp.arange(2, dtype=jnp.float32) + 5, [0, 1])
    points.write((1, 0), jnp.float32(9.0))  # (outside the window)
    relative = capture._relative(0, 3, -1, 0)
    structure, values = points.state(relative)
    other = PointStore(backend, MemoryStats(), lambda sizes: None, 4)
    other.set_state(structure, values, capture._placer(0, 7))
    assert [float(other.read(p)) for p in [(7, 0), (7, 1), (7, 2)]] == [1.0, 5.0, 6.0]
    assert not other.holds((5, 0))
    points.forget_state(structure, capture._placer(0, 3))
    assert not points.holds((3, 0)) and not points.holds((3, 2)) and points.holds((1, 0))

    blocks = BlockStore(stats, 4, (2,), "float32", buffers=DeviceBuffers(backend))
    blocks.write_rows([(3, k) for k in range(4)], jnp.ones((4, 2), jnp.float32), [0, 1, 2, 3])
    blocks.free((3, 0))
    structure, values = blocks.state(relative)
    moved = BlockStore(MemoryStats(), 4, (2,), "float32", buffers=DeviceBuffers(backend))
    moved.set_state(structure, values, capture._placer(0, 7))
    assert [moved.holds((7, k)) for k in range(4)] == [False, True, True, True]
    np.testing.assert_array_equal(moved.read((7, slice(1, 4))), np.ones((3, 2), np.float32))


def test_close_allows_rounding_only():
    a = np.array([1.0, 2.0], np.float32)
    assert _close(a, np.nextafter(a, np.inf).astype(np.float32))
    assert not _close(a, a + 1e-2)
    assert not _close(np.array([1, 2]), np.array([1, 3]))


def test_only_reads_moved_along_the_dim_by_a_constant_move_with_the_iteration():
    from tempo.runtime.capture import _read_offset
    from tempo.symbolic.expr import Slice, Symbol
    i, t = Symbol("i"), Symbol("t")
    assert _read_offset((i - 1, t), (i, t), i) == -1
    assert _read_offset((t,), (t,), i) is None
    assert isinstance(_read_offset((i, t + i), (i, t), i), str)  # (the dim in another entry)
    assert isinstance(_read_offset((i, Slice(0, i)), (i, t), i), str)
    assert isinstance(_read_offset((Slice(0, i), t), (i, t), i), str)
    assert isinstance(_read_offset((i * 2, t), (i, t), i), str)
