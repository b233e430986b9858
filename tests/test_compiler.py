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
def test_compile_leaves_the_garbage_collector_as_it_was(enabled, bad):
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
