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
    exe = ctx.compile(bounds, [out], backend=backend, loops=tp.LoopPolicy("interpreted"))
    profile = RunProfile()
    profiled = exe.run(profile=profile)[out]
    np.testing.assert_array_equal(profiled, exe.run()[out])
    expected = Counter((kind, op.name) for kind, op, _ in exe.execution_order())
    assert {key: t.calls for key, t in profile.ops.items() if t.calls} == dict(expected)
    assert all(t.seconds >= 0 for t in profile.ops.values()) and profile.total > 0
    table = profile.table()
    assert all(name in table for _, name in expected)
    assert len(profile.table(top=2).splitlines()) == 4  # header, two ops, total


def test_loops_run_whole_are_one_row_and_the_rest_is_counted():
    """A loop run as one scan or batched on the host (here the frees of ``y``, batched)
    is timed whole, as ``("loop", name)``; every statement outside such loops is still
    counted once per execution."""
    ctx, bounds, out = _program()
    exe = ctx.compile(bounds, [out], backend="jax")
    profile = RunProfile()
    np.testing.assert_array_equal(exe.run(profile=profile)[out], exe.run()[out])
    whole = [name for name, c in exe.loop_choices.items() if c.form in ("lowered", "batched")]
    assert whole, [str(c) for c in exe.loop_choices.values()]
    assert all(profile.ops[("loop", name)].calls >= 1 for name in whole)
    inside = {(st.kind, st.op.name) for name in whole
              for st in map(exe.schedule.statements.get, exe.loop_choices[name].statements)}
    expected = Counter((kind, op.name) for kind, op, _ in exe.execution_order()
                       if (kind, op.name) not in inside)
    assert {key: t.calls for key, t in profile.ops.items()
            if t.calls and key[0] != "loop" and key not in inside} == dict(expected)


def test_the_xla_programs_a_run_makes_are_counted():
    """``exe.xla`` counts, from JAX's monitoring events, the programs the runs trace,
    lower and compile (kernels and scans), and their seconds; a second run of the same
    executable makes none; the NumPy backend's runs record nothing."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:  # (constants of a shape no other test uses: nothing is compiled already)
        x = tp.const(np.linspace(-1, 1, 23 * 7, dtype=np.float32).reshape(23, 7))[t]
        s = tp.placeholder(shape=(7,), dtype="float32", domain=(t,))
        s[0] = x[0]
        s[t + 1] = (s * 0.25 + x[t + 1]).tanh()
    exe = ctx.compile({T: 23}, [s], backend="jax")
    exe.run()
    made = dict(exe.xla.programs)
    assert made.get("compiling", 0) >= 1 and made.get("tracing", 0) >= 1, made
    assert exe.xla.seconds["compiling"] > 0
    assert "compiling" in str(exe.xla)
    exe.run()
    assert exe.xla.programs == made
    import jax  # compiled outside a run: not counted (the listener is gone)
    jax.jit(lambda v: v * 3.0 + 1.0)(np.ones((5, 11), np.float32)).block_until_ready()
    assert exe.xla.programs == made
    numpy_exe = ctx.compile({T: 23}, [s], backend="numpy")
    numpy_exe.run()
    assert numpy_exe.xla.programs == {}
