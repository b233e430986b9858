"""Duplicate elimination: ops computing the same values merge, to a fixpoint; reads of other
points, random draws, UDFs and outputs stay apart; results equal the reference's."""

from __future__ import annotations

import numpy as np

import tempo as tp

RNG = np.random.default_rng(3)
XS = RNG.normal(size=(6, 3)).astype(np.float32)


def test_duplicate_chains_merge_to_a_fixpoint(run_pass, backend, check):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[t]
        a = ((x * 2.0 + 1.0).exp() - tp.symbol_value(t)).sum()   # built twice, op by op
        b = ((x * 2.0 + 1.0).exp() - tp.symbol_value(t)).sum()
        out = a * b
    run = run_pass(ctx, {T: 6}, [out], "dedup")
    for kind in ("exp", "add", "sub", "reduce_sum"):
        assert run.count(kind, "before") == 2 and run.count(kind) == 1, kind
    assert run.count("eval_symbol", "before") == 3 and run.count("eval_symbol") == 1  # [t] too
    assert run.count("mul") == 2  # x * 2.0 once, and a * b
    assert run.count("const", "before") == 5 and run.count("const") == 3  # XS, 2.0, 1.0
    assert run.state.notes == [f"dedup: {len(run.before) - len(run.after)} ops merged"]
    exe = check(ctx, {T: 6}, [out], ("dedup",), backend)
    assert sorted(op.kind for op in exe.graph.ops.values()) == run.kinds()


def test_reads_of_different_points_do_not_merge(run_pass, check):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[t]
        prev = x[tp.max(t - 1, 0)] * 2.0
        nxt = x[tp.min(t + 1, T - 1)] * 2.0
        same = x[tp.max(t - 1, 0)] * 2.0
        out = prev + nxt + same
    run = run_pass(ctx, {T: 6}, [out], "dedup")
    assert run.count("identity", "before") == 3 and run.count("identity") == 2
    assert run.count("mul") == 2
    check(ctx, {T: 6}, [out], ("dedup",))


def test_conditions_and_branches_are_part_of_the_value(run_pass, check):
    """Placeholders with the same branches merge; with other conditions they do not."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[t]
        p, q, r = (tp.placeholder((3,)) for _ in range(3))
        p[t % 2 == 0] = x
        p[True] = -x
        q[t % 2 == 0] = x
        q[True] = -x
        r[t % 3 == 0] = x
        r[True] = -x
        out = p + q + r
    run = run_pass(ctx, {T: 6}, [out], "dedup")
    assert run.count("merge", "before") == 3 and run.count("merge") == 2
    check(ctx, {T: 6}, [out], ("dedup",))


def test_draws_with_their_own_keys_and_udfs_never_merge(run_pass, check):
    ctx = tp.Context(dims=("t",), seed=4)
    (t,), (T,) = ctx.dims, ctx.bounds
    calls = []

    def record(x):
        calls.append(float(x))
        return x

    with ctx:
        # Two draws: each has its own key, so they differ; the point coordinates they are
        # keyed by are one value, shared.
        u1 = tp.uniform((2,), domain=(t,))
        u2 = tp.uniform((2,), domain=(t,))
        x = tp.const(XS)[t].sum()
        (y1,) = tp.udf(record, [x], [((), "float32")])
        (y2,) = tp.udf(record, [x], [((), "float32")])
        out = u1.sum() - u2.sum() + y1 + y2
    run = run_pass(ctx, {T: 6}, [out], "dedup")
    assert run.count("rng") == 2 and run.count("udf") == 2
    assert run.count("coords", "before") == 2 and run.count("coords") == 1
    exe = check(ctx, {T: 6}, [out], ("dedup",))
    calls.clear()
    exe.run()
    assert len(calls) == 12  # both UDFs, at every point


def test_outputs_keep_their_own_op(run_pass, check):
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(XS)[t]
        hidden = x * 3.0            # not an output: merges into the output below
        kept = x * 3.0
        also_kept = x * 3.0         # a second output: stays, with its own store
        out = hidden.sum()
    outputs = [kept, also_kept, out]
    run = run_pass(ctx, {T: 6}, outputs, "dedup")
    assert hidden.op.id not in run.after.ops
    assert kept.op.id in run.after.ops and also_kept.op.id in run.after.ops
    reduce_op = out.op
    assert run.after.in_edges(reduce_op)[0].src is kept.op
    check(ctx, {T: 6}, outputs, ("dedup",))


def test_training_program_merges_and_keeps_its_trajectory():
    from tempo.api import nn, optim
    ctx = tp.Context(dims=("i",), seed=1)
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        model = nn.MLP(3, [8], 1, domain=(i,))
        loss = ((model(tp.const(XS)) - 1.0) ** 2).mean()
        loss.backward()
        optim.Adam(model.parameters(), lr=0.01).step()
    outputs = [loss, *model.parameters()]
    plain = ctx.compile({I: 4}, outputs, backend="numpy", passes=())
    exe = ctx.compile({I: 4}, outputs, backend="numpy", passes=("dedup",))
    assert len(exe.graph) < len(plain.graph) - 20
    a, b = plain.run(), exe.run()
    for rt in outputs:
        np.testing.assert_array_equal(a[rt], b[rt])
