"""Algebraic simplification: ops that return their operand go, symbolic shapes included;
nothing that broadcasts, promotes, reads another point or is an output is touched."""

from __future__ import annotations

import numpy as np

import tempo as tp

RNG = np.random.default_rng(7)
XS = RNG.normal(size=(6, 2, 3)).astype(np.float32)


def test_operand_returning_ops_go(run_pass, backend, check):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[t]                                      # (2, 3) at each t
        y = ((x * 1.0) / 1.0 + 0.0) ** 1.0                       # x
        y = 1.0 * (0.0 + (y - 0.0))                              # x
        y = -(-y)  # noqa: B002 - a double negation, on purpose     # x
        y = y.astype("float32").expand(y.shape).sum(())          # x
        y = y.permute(1, 0).permute(1, 0).permute(0, 1)          # x
        y = y.reshape(3, 2).reshape(6).reshape(2, 3).unsqueeze(0).squeeze(0)   # x
        y = tp.where(x > 0, y, y).sum(0, keepdim=True).sum(0, keepdim=True).detach()  # (1, 3)
        window = x[0:t + 1]                                      # (t + 1, 2, 3): symbolic
        w = window.reshape(window.shape) * 1.0
        out = y.sum() + w.sum()
    run = run_pass(ctx, {T: 6}, [out], "simplify")
    gone = ("div", "pow", "neg", "astype", "expand", "permute", "reshape", "unsqueeze", "squeeze",
            "where", "detach", "sub")
    for kind in gone:
        assert run.count(kind, "before") > 0 and run.count(kind) == 0, kind
    assert run.count("mul") == 0 and run.count("add") == 1       # out's own + remains
    assert run.count("reduce_sum") == 3  # x.sum(0, keepdim=True), y.sum(), w.sum()
    note = run.state.notes[0]
    assert note.startswith("simplify: 20 ops replaced by their operand (3 reshape to the same shape, "
                           "3 x * 1, 2 x + 0, 1 -(-x), ")
    check(ctx, {T: 6}, [out], ("simplify",), backend)


def test_broadcasts_promotions_and_other_reads_stay(run_pass, check):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS[:, 0])[t]                                          # (3,)
        wider = x * tp.const(np.ones((2, 3), np.float32))                  # (2, 3): broadcasts
        shifted = x + tp.const(np.zeros((4, 1, 3), np.float32))            # (4, 1, 3)
        counts = tp.symbol_value(t) * 1.0                                  # int32 -> float32
        halves = x * tp.const(np.array([1.0, 1.0, 0.5], np.float32))       # not all ones
        negated = 0.0 - x                                                  # not x - 0
        summed = tp.const(XS[:, 0, :1])[t].sum(0)                          # (1,) -> (): drops
        # An astype to the same dtype that reads t - 1 directly (as copy propagation leaves
        # x[t - 1].astype(...)): its value is not x's at t.
        previous = tp.RecurrentTensor(ctx, ctx.add_op("astype", [x], {"dtype": "float32"}, domain=(t,),
                                                      phis=[(tp.max(t - 1, 0),)]))
        out = (wider.sum() + shifted.sum() + counts + halves.sum() + negated.sum()
               + summed + previous.sum())
    run = run_pass(ctx, {T: 5}, [out], "simplify")
    assert run.count("mul", "before") == 3 and run.count("mul") == 3
    assert len(run.after) == len(run.before) and run.count("sub") == run.count("astype") == 1
    assert run.state.notes == ["simplify: 0 ops removed"]
    check(ctx, {T: 5}, [out], ("simplify",))


def test_outputs_are_not_replaced(run_pass, check):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[t]
        same = x * 1.0
        out = (same + 0.0).sum()
    run = run_pass(ctx, {T: 3}, [same, out], "simplify")
    assert same.op.id in run.after.ops and run.count("add") == 0
    check(ctx, {T: 3}, [same, out], ("simplify",))
