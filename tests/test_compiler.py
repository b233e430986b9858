"""The compiler driver: the process's garbage collector is left as it was found."""

import gc

import numpy as np
import pytest

import tempo as tp
from tempo.errors import TempoError


def _program(bad: bool = False):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(np.arange(4, dtype=np.float32))[t]
        y = x[t + 5] if bad else x * 2.0  # (a read beyond x's points: an error at compile)
    return ctx, {T: 4}, y


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("bad", [False, True])
def test_compile_pauses_the_garbage_collector_and_leaves_it_as_it_was(enabled, bad, monkeypatch):
    import tempo.compiler
    during = []
    analyze = tempo.compiler.analyze_points

    def recording(*args, **kwargs):
        during.append(gc.isenabled())
        return analyze(*args, **kwargs)
    monkeypatch.setattr(tempo.compiler, "analyze_points", recording)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        ctx, bounds, y = _program(bad)
        if bad:
            with pytest.raises(TempoError):
                ctx.compile(bounds, [y], backend="numpy")
        else:
            ctx.compile(bounds, [y], backend="numpy")
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert during == [False]


def test_compiles_in_two_threads_turn_the_collector_back_on_once_both_end():
    import threading

    from tempo.compiler import _collector_paused
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with _collector_paused:
            inside.set()
            leave.wait(10)
    was = gc.isenabled()
    gc.enable()
    try:
        thread = threading.Thread(target=other)
        thread.start()
        inside.wait(10)
        with _collector_paused:
            assert not gc.isenabled()
        assert not gc.isenabled()  # the other compile is still going
        leave.set()
        thread.join(10)
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
