"""A profiled run times every statement it executes: the calls it counts are the
statements the schedule runs, and its results are those of a plain run."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import tempo as tp
from tempo.runtime.profile import RunProfile

XS = np.random.default_rng(4).normal(size=(6, 3)).astype(np.float32)


def _program():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[t]
        y = tp.placeholder((3,), domain=(t,))
        y[0] = x
        y[t + 1] = (y * 0.5 + x[t + 1]).tanh()
        out = y[0:t + 1].sum(0)
    return ctx, {T: 6}, out


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_profile_counts_every_executed_statement(backend):
    ctx, bounds, out = _program()
    exe = ctx.compile(bounds, [out], backend=backend)
    profile = RunProfile()
    profiled = exe.run(profile=profile)[out]
    np.testing.assert_array_equal(profiled, exe.run()[out])
    expected = Counter((kind, op.name) for kind, op, _ in exe.execution_order())
    assert {key: t.calls for key, t in profile.ops.items() if t.calls} == dict(expected)
    assert all(t.seconds >= 0 for t in profile.ops.values()) and profile.total > 0
    table = profile.table()
    assert all(name in table for _, name in expected)
    assert len(profile.table(top=2).splitlines()) == 4  # header, two ops, total
