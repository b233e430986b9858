"""Loop lowering (tempo.runtime.lowering): loops run as one ``lax.scan`` compute what the
reference evaluator computes, and the timed policy measures both forms."""

import pathlib

import numpy as np
import pytest
from test_nest import _interpreted, _loop, _s, _skewed_loop_with_peeled_iterations, c0

import tempo as tp
from tempo.errors import SourceSite
from tempo.ir.graph import Op
from tempo.reference import evaluate
from tempo.runtime.lowering import MOVED_FREES_MAX_BYTES, _flat, _held_bytes, _with_peeled_iterations
from tempo.schedule import ast
from tempo.schedule.scheduler import Statement


def _recurrences(entries: int = 4):
    """Over (i, t): a recurrence over t restarted every i (``entries`` of them), a
    two-branch placeholder and a symbol read, so the t loop has a carry, merges and a
    point op."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(np.linspace(-1, 1, entries * 20, dtype=np.float32).reshape(entries, 20))[i, t]
        s = tp.placeholder(shape=(), dtype="float32", domain=(i, t))
        s[i, 0] = x[i, 0]
        s[i, t + 1] = (s * 0.5 + x[i, t + 1]).tanh()
        c = tp.placeholder(shape=(), dtype="float32", domain=(i, t))
        c[t % 3 == 0] = s * 2.0
        c[True] = s + tp.symbol_value(t).astype("float32")
    return ctx, {I: entries, T: 20}, [s, c]


def _check(exe, ctx, bounds, outputs):
    res = exe.run()
    ref = evaluate(ctx, bounds, outputs)
    for rt in outputs:
        np.testing.assert_allclose(res[rt], ref[rt.key], rtol=1e-6, atol=1e-6)


def test_a_lowered_loop_computes_what_the_reference_does():
    ctx, bounds, outputs = _recurrences()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered"))
    _check(exe, ctx, bounds, outputs)
    lowered = [c for c in exe.loop_choices.values() if c.form == "lowered" and not c.fallbacks]
    assert lowered, [str(c) for c in exe.loop_choices.values()]


def test_translated_entries_reuse_the_plan():
    """The t loop's entries at i = 2 and 3 are the one at i = 1 moved along i (the one at
    i = 0 is not: frees of the previous i's points start at i = 1), so they take its plan
    and only read their stored values anew; the entry at i = 0 takes the plan made ahead
    of the run (``LoopLauncher.compile_ahead``). (With nests lowered, the (i, t) nest is
    one scan entered once.)"""
    ctx, bounds, outputs = _recurrences()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered", nests=False))
    _check(exe, ctx, bounds, outputs)
    assert max(c.reused for c in exe.loop_choices.values()) == bounds[ctx.bounds[0]] - 1
    assert "plans reused in 3 entries" in "\n".join(map(str, exe.loop_choices.values()))


def test_entries_taking_different_branches_of_a_merge_run_one_program():
    """The t loop starts from a constant at i = 0 and from the entry before's last value
    afterwards: the merge takes another of its inputs, but both read a stored value, so
    every entry runs the scan traced for the first."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(np.linspace(-1, 1, 80, dtype=np.float32).reshape(4, 20))[i, t]
        s = tp.placeholder(shape=(), dtype="float32", domain=(i, t))
        s[0, 0] = x[0, 0]
        s[i, 0] = s[i - 1, T - 1] + 1.0
        s[i, t + 1] = (s * 0.5 + x[i, t + 1]).tanh()
    bounds = {I: 4, T: 20}
    exe = ctx.compile(bounds, [s], backend="jax", loops=tp.LoopPolicy("lowered", nests=False))
    _check(exe, ctx, bounds, [s])
    [launcher] = [launch for launch in exe._launchers.values() if launch.traced]
    assert not launcher.choice.fallbacks, str(launcher.choice)  # (every entry ran as the scan)
    assert launcher.choice.reused == bounds[I] - 2  # (i = 0 and 1 planned, 2 and 3 translated)
    assert len(launcher.traced) == 1, list(launcher.traced)


def _restarted_recurrences(shared: bool):
    """Over (i, t): ``s`` starts each t loop from the entry before's last value plus one
    (a stored value of another op) and carries ``h`` over t, as PPO's update loop starts
    each Adam moment; with ``shared``, ``r`` restarts from another stored value and
    carries the same ``h``. (Unshared, ``r`` is a linear recurrence: the lift pass makes
    it one ``linear_recurrence`` outside the loop, a scan of its own on a CPU.)"""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(np.linspace(-1, 1, 80, dtype=np.float32).reshape(4, 20))[i, t]
        s = tp.placeholder(shape=(), dtype="float32", domain=(i, t))
        r = tp.placeholder(shape=(), dtype="float32", domain=(i, t))
        s[0, 0] = x[0, 0]
        s[i, 0] = s[i - 1, T - 1] + 1.0
        h = (s * 0.5 + r * 0.25 + x).tanh() if shared else (s * 0.5 + x).tanh()
        s[i, t + 1] = h[i, t]
        r[0, 0] = x[0, 0] * 2.0
        r[i, 0] = r[i - 1, T - 1] - 1.0
        r[i, t + 1] = (h[i, t] if shared else r[i, t] * 0.9 + x[i, t])
    return ctx, {I: 4, T: 20}, [s, r]


@pytest.mark.parametrize("shared", [False, True])
def test_a_carry_starts_from_the_stored_value_its_merge_takes_first(shared, monkeypatch):
    """A merge that reads a stored value at the loop's first iteration and a carry at
    every other reads the carry alone, started from that value (a seed): its select
    leaves the scan. Two merges that would start one carry from two values: one seeds it,
    the other keeps its select. With seeds or without, the reference's values."""
    from tempo.runtime.plan import LoopPlanner as Planner
    seeded = _lowered_restarts(shared, monkeypatch)
    monkeypatch.setattr(Planner, "_seeded", lambda self, slots, fetches, taken, runs, masked, trips:
                        (slots, fetches, taken, masked))
    unseeded = _lowered_restarts(shared, monkeypatch)
    assert seeded["seeds"] == 1 and unseeded["seeds"] == 0  # (unshared, ``r`` restarts outside the scan)
    assert seeded["merge slots"] == ([1, 2] if shared else [1, 1])
    assert unseeded["selects"] - seeded["selects"] == 1


def _lowered_restarts(shared: bool, monkeypatch) -> dict[str, object]:
    """``_restarted_recurrences`` lowered and checked against the reference: the seeds of
    its t loop's plan, the slots of its merges and the selects its scan applies."""
    import jax

    from tempo.runtime.lowering import LoopLauncher
    plans, run_lowered = [], LoopLauncher._run_lowered
    monkeypatch.setattr(LoopLauncher, "_run_lowered",
                        lambda self, plan, span=None: (plans.append(plan), run_lowered(self, plan, span))[1])
    ctx, bounds, outputs = _restarted_recurrences(shared)
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered", nests=False))
    _check(exe, ctx, bounds, outputs)
    monkeypatch.setattr(LoopLauncher, "_run_lowered", run_lowered)
    [launcher] = [launch for launch in exe._launchers.values() if launch.traced]
    assert not launcher.choice.fallbacks, str(launcher.choice)
    assert len(plans) == bounds[ctx.bounds[0]] and launcher.planner.reused  # (translated entries too)
    assert len(launcher.traced) == 1  # (entry 0 seeds from x[0, 0], the others from s + 1: one program)
    planner, plan = launcher.planner, plans[-1]
    return {"seeds": sum(fetch[0] == "seed" for fetch in planner.templates[0].fetches),
            "merge slots": sorted(len(plan.slots[pos]) for pos in planner.choices),
            "selects": _selects(jax.make_jaxpr(launcher._scan(plan))(*plan.arguments).jaxpr)}


def _selects(jaxpr) -> int:
    """The ``select_n`` a jaxpr applies, those of the functions it calls included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "select_n"
        for value in eqn.params.values():
            for each in value if isinstance(value, tuple) else (value,):  # (a cond's branches)
                inner = getattr(each, "jaxpr", each)
                if hasattr(inner, "eqns"):
                    count += _selects(inner)
    return count


def test_moved_reads_check_each_kind_of_affine_read_as_each_read():
    """A template's affine reads of values the loop makes are checked once per kind
    (coefficients, reader's and maker's index groups): an entry moved by any offsets per
    index group is refused exactly where checking every such read is refused."""
    from tempo.runtime.plan import ANY, _offset
    ctx, bounds, outputs = _recurrences()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered", nests=False))
    exe.run()
    planner = max(exe._launchers.values(), key=lambda launch: launch.choice.reused).planner
    template = planner.templates[0]
    space = planner.space((3,))
    groups = planner._groups((3,), space)
    instances = planner._per_statement(groups)
    runs = [instances[n] for n in planner.exec_items]
    moved = [_offset(was, now) if len(now_at) else ANY
             for (_, was), (now_at, now) in zip(template.groups, groups)]
    made = {op_id for op_id, _ in template.plan.made}

    def each_read_moves(ops: list) -> bool:
        for pos, row in enumerate(template.reads):
            for k, r in enumerate(row):
                linear = planner.linear[planner.execs[pos][0].id][k]
                if r is None or linear is None or r.edge.src.id not in made:
                    continue
                target = ops[planner.positions[r.edge.src.id]]
                shift = tuple(sum(a * d for a, d in zip(coefficients, ops[pos])) for coefficients in linear)
                if target is not ANY and shift != target:
                    return False
        return True

    outcomes = set()
    for changed in [None, *range(len(moved))]:
        for delta in ((1, 0), (0, 1), (1, -1)):
            offsets = [m if g != changed or m is ANY else tuple(a + d for a, d in zip(m, delta))
                       for g, m in enumerate(moved)]
            ops = [offsets[planner.exec_groups[pos]] for pos in range(len(planner.execs))]
            expected = each_read_moves(ops)
            assert (planner._moved_reads(template, runs, ops) is not None) == expected
            outcomes.add(expected)
    assert outcomes == {True, False}


def test_peeled_iterations_go_back_into_a_lowerable_loop_where_it_stays_lowerable():
    """The statements isl peeled off a lowerable loop go back into it (their kernels then
    run in its scan, not compiled a second time outside it), unless that would make it
    unlowerable (standing for a host op: the instance ``refused``); then it takes back
    what it can. The statement instances run in the same order either way."""
    before, loop, after = _skewed_loop_with_peeled_iterations()
    expected = _interpreted(_loop(c0, 0, 1, *before, loop, *after), {})
    cases = ((None, ["A", "E"]), (("T", (3,)), ["A", "T", "E"]), (("S", (0,)), ["A", "S", "F", "E"]))
    for refused, outside in cases:
        def lowerable(candidate: ast.Loop, refused: tuple | None = refused) -> bool:
            return refused not in _interpreted(_loop(c0, 0, 1, candidate), {})
        body = _with_peeled_iterations((*before, loop, *after), lowerable, _statements({}), _bytes(0))
        assert [n.name for n in body if isinstance(n, ast.Stmt)] == outside
        assert _interpreted(_loop(c0, 0, 1, *body), {}) == expected


def _statements(frees: dict[str, str]) -> dict[str, Statement]:
    """Statements for the skewed loop's names, each executing an op of its own, and the
    ``frees``: a free statement's name -> the name of the statement whose op it frees."""
    site = SourceSite("test_lowering.py", 1)
    ops = {name: Op(k, "const", {}, (), (), site) for k, name in enumerate("ASTFE")}
    statements = {name: Statement("exec", op) for name, op in ops.items()}
    return statements | {name: Statement("free", ops[freed]) for name, freed in frees.items()}


def _bytes(size: int | None):
    """Every free statement's points hold ``size`` bytes (None: rows of a block)."""
    return lambda statement: size


def test_guarded_frees_between_peeled_iterations_and_their_loop_move_after_it():
    """A free under a guard between a loop and its peeled first iteration (isl puts a
    value's last free there) would cut the peeled statements off: it moves after the loop
    and the statements after it; the loop then takes its iteration back. Nested sequences
    (isl's) are spliced first."""
    before, loop, after = _skewed_loop_with_peeled_iterations()
    guarded = ast.If(c0 >= 0, ast.Seq((_s("G"),)))
    body = (*before[:2], guarded, *before[2:], loop, *after)
    lowerable = lambda candidate: True  # noqa: E731
    moved = _with_peeled_iterations(body, lowerable, _statements({"G": "A"}), _bytes(8))
    assert [n.name if isinstance(n, ast.Stmt) else type(n).__name__ for n in moved
            if not isinstance(n, ast.Loop)] == ["A", "E", "If"]
    expected = [i for i in _interpreted(_loop(c0, 0, 1, *body), {}) if i[0] != "G"] + [("G", ())]
    assert _interpreted(_loop(c0, 0, 1, *moved), {}) == expected
    nested = (before[0], ast.Seq((before[1], guarded, before[2])), loop, *after)
    assert _with_peeled_iterations(_flat(nested), lowerable, _statements({"G": "A"}), _bytes(8)) == moved
    # a loop that takes back only its last iteration leaves the free where it was
    def after_only(candidate: ast.Loop) -> bool:
        return ("S", (0,)) not in _interpreted(_loop(c0, 0, 1, candidate), {})
    stays = _with_peeled_iterations(body, after_only, _statements({"G": "A"}), _bytes(8))
    assert stays.index(guarded) < [type(n) for n in stays].index(ast.Loop)
    assert _interpreted(_loop(c0, 0, 1, *stays), {}) == _interpreted(_loop(c0, 0, 1, *body), {})


def test_guarded_frees_move_while_they_keep_little_waiting():
    """A moved free keeps its point waiting while the loop runs (the iteration before's
    last step, which the peeled first step read, is a point of an op the loop computes):
    frees move only while they keep at most ``MOVED_FREES_MAX_BYTES`` waiting in all, and
    never where what a free keeps is not known (rows of a block)."""
    before, loop, after = _skewed_loop_with_peeled_iterations()
    guarded = ast.If(c0 >= 0, ast.Seq((_s("G"),)))
    body = (*before[:2], guarded, *before[2:], loop, *after)
    lowerable = lambda candidate: True  # noqa: E731
    statements = _statements({"G": "S", "H": "F"})  # (the loop computes S and F)
    expected = [i for i in _interpreted(_loop(c0, 0, 1, *body), {}) if i[0] != "G"] + [("G", ())]
    moved = _with_peeled_iterations(body, lowerable, statements, _bytes(MOVED_FREES_MAX_BYTES))
    assert [n.name for n in moved if isinstance(n, ast.Stmt)] == ["A", "E"] and moved[-1] == guarded
    assert _interpreted(_loop(c0, 0, 1, *moved), {}) == expected
    for size in (MOVED_FREES_MAX_BYTES + 1, None):  # too much waiting, or not known
        kept = _with_peeled_iterations(body, lowerable, statements, _bytes(size))
        assert guarded in kept and _s("S", 0) in kept  # only the statements after it go back
        assert _interpreted(_loop(c0, 0, 1, *kept), {}) == _interpreted(_loop(c0, 0, 1, *body), {})
    # two frees of 3 MiB each: the one next to the loop moves, the other stays before it
    other = ast.If(c0 >= 0, ast.Seq((_s("H"),)))
    body = (*before[:2], guarded, other, *before[2:], loop, *after)
    out = _with_peeled_iterations(body, lowerable, statements, _bytes(3 << 20))
    looped = [type(n) for n in out].index(ast.Loop)
    assert out.index(guarded) < looped < out.index(other)
    order = _interpreted(_loop(c0, 0, 1, *out), {})
    assert sorted(order) == sorted(_interpreted(_loop(c0, 0, 1, *body), {})) and order[-1] == ("H", ())


def test_a_free_keeps_one_point_unless_its_points_are_rows_of_a_block():
    """``_held_bytes``: the bytes of one point of the outputs a free statement frees; not
    known (None) for an output a reader slices along its innermost dim (a block store's
    rows, which a free may release whole)."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(np.ones((5, 3), dtype=np.float32))[t]
        y = x * 2.0
        z = y + 1.0
        w = y[0:T].sum(0)
    held = _held_bytes(ctx.graph, {T: 5})
    assert held(Statement("free", z.op)) == 3 * 4
    assert held(Statement("free", y.op)) is None
    assert w.op is not None


def test_timed_policy_measures_both_forms_then_keeps_one():
    ctx, bounds, outputs = _recurrences(entries=8)
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("timed"))
    _check(exe, ctx, bounds, outputs)
    # The t loop is entered once per i (8 times): three entries per form, the last two
    # timed, then the chosen form.
    timed = [c for c in exe.loop_choices.values() if c.interpreted is not None and c.lowered is not None]
    assert timed, [str(c) for c in exe.loop_choices.values()]
    for choice in timed:
        faster = choice.lowered < (1 - exe.loops.margin) * choice.interpreted
        assert choice.form == ("lowered" if faster else "interpreted")
        assert "per iteration" in str(choice)
    ctx, bounds, outputs = _recurrences(entries=5)  # the second lowered timing is missing
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("timed"))
    _check(exe, ctx, bounds, outputs)
    timed = [c for c in exe.loop_choices.values() if c.interpreted is not None]
    assert timed and all(c.lowered is not None and c.form is None for c in timed)


def test_interpreted_policy_and_numpy_backend_lower_nothing():
    ctx, bounds, outputs = _recurrences()
    assert not ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("interpreted")).loop_choices
    assert not ctx.compile(bounds, outputs, backend="numpy").loop_choices


def test_loops_holding_host_udfs_stay_interpreted():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    seen = []
    with ctx:
        s = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        s[0] = tp.const(np.float32(1.0))
        s[t + 1] = s * 0.5
        tp.sink(s, lambda value, point: seen.append((point["t"], float(value))))
    exe = ctx.compile({T: 8}, [s], backend="jax", loops=tp.LoopPolicy("lowered"))
    exe.run()
    assert [v for _, v in sorted(seen)] == [0.5 ** k for k in range(8)]
    sink_names = {name for name, st in exe.schedule.statements.items() if st.op.kind == "udf"}
    for choice in exe.loop_choices.values():
        assert not sink_names & set(choice.statements)


def test_lowering_keeps_the_execution_order_and_profiles_the_loop():
    ctx, bounds, outputs = _recurrences()
    lowered = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered", nests=False))
    plain = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("interpreted"))
    names = [(kind, op.name, p) for kind, op, p in lowered.execution_order()]
    assert names == [(kind, op.name, p) for kind, op, p in plain.execution_order()]
    profile = tp.RunProfile()
    lowered.run(profile=profile)
    loops = {name: t for (kind, name), t in profile.ops.items() if kind == "loop"}
    assert loops and all(t.calls >= 1 for t in loops.values())
    assert max(t.calls for t in loops.values()) == bounds[ctx.bounds[0]]  # the t loop, once per i


@pytest.mark.parametrize("mode", ["lowered", "timed"])
def test_entries_with_different_trip_counts(mode):
    """A triangular loop (``for t in range(i, T)``): each entry has its own trip count."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    data = np.random.default_rng(0).uniform(-1, 1, (4, 9, 2)).astype(np.float32)
    with ctx:
        x = tp.const(data)[i, t]
        y = tp.placeholder(shape=(2,), dtype="float32", domain=(i, t))
        y[i % 3 == 0] = x * 2.0
        y[True] = x[i, t + 1:T].sum(0)
    bounds = {I: 4, T: 9}
    exe = ctx.compile(bounds, [y], backend="jax", loops=tp.LoopPolicy(mode, min_trips=2))
    _check(exe, ctx, bounds, [y])


def test_compiled_scans_are_kept_across_runs():
    ctx, bounds, outputs = _recurrences()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered"))
    exe.run()
    compiled = {name: c.compile_seconds for name, c in exe.loop_choices.items()}
    _check(exe, ctx, bounds, outputs)
    assert {name: c.compile_seconds for name, c in exe.loop_choices.items()} == compiled


def test_unknown_loop_mode_is_named():
    with pytest.raises(ValueError, match="unknown loop mode 'fast'"):
        tp.LoopPolicy("fast")
    with pytest.raises(ValueError, match="late_sinks must be true, false or None, got 0"):
        tp.LoopPolicy(late_sinks=0)  # (not taken for False: anything but False is late)


@pytest.mark.parametrize("env", ["synthetic"])
def test_ppo_trains_the_same_with_lowered_and_interpreted_loops(env, tmp_path: pathlib.Path):
    """PPO's acting, GAE and shuffle loops lowered: the same losses as interpreted."""
    from tempo_rl.config import load_config
    from tempo_rl.train import train
    histories = {}
    for mode in ("lowered", "interpreted"):
        cfg = load_config(f"env={env}", "env.num_envs=4", "algorithm.num_steps=16",
                          "total_timesteps=192", "backend=jax", f"loops={mode}", "progress=false")
        cfg["logger"] = {**cfg.get("logger", {}), "wandb": {"enabled": False}}
        result = train(cfg, tmp_path / mode, progress=False)
        histories[mode] = result.history
    assert len(histories["lowered"]) == 3
    for a, b in zip(histories["lowered"], histories["interpreted"]):
        for name in ("losses/policy_loss", "losses/value_loss", "losses/entropy"):
            np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_an_executable_keeps_no_stored_values_after_a_run(monkeypatch):
    """The loop launchers serve every run of an executable, but the stores (every value a
    run made) are released when the run returns."""
    import gc
    import weakref

    from tempo.runtime import executable
    made, make = [], executable._make_stores

    def recording(*args, **kwargs):
        stores = make(*args, **kwargs)
        made.extend(weakref.ref(store) for store in stores.values())
        return stores
    monkeypatch.setattr(executable, "_make_stores", recording)
    ctx, bounds, outputs = _recurrences()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered"))
    results = exe.run()
    gc.collect()
    assert made and all(ref() is None for ref in made)
    _check(exe, ctx, bounds, outputs)
    assert results[outputs[0]].shape == (4, 20)


def test_the_stacked_cap_is_the_policys_else_by_the_device():
    """``max_stacked_mb``: the policy's when given; by default 64 MiB on a CPU and a
    sixteenth of the device's memory on an accelerator (whose ``memory_stats`` says it)."""
    from types import SimpleNamespace

    from tempo.runtime.lowering import CPU_STACKED_MB, stacked_cap_mb
    cpu = SimpleNamespace(on_cpu=True)
    assert stacked_cap_mb(tp.LoopPolicy(), cpu) == CPU_STACKED_MB == 64
    assert stacked_cap_mb(tp.LoopPolicy(max_stacked_mb=8), cpu) == 8
    device = SimpleNamespace(memory_stats=lambda: {"bytes_limit": 80 * 2**30})
    gpu = SimpleNamespace(on_cpu=False, jax=SimpleNamespace(devices=lambda: [device]))
    assert stacked_cap_mb(tp.LoopPolicy(), gpu) == 80 * 1024 / 16
    assert stacked_cap_mb(tp.LoopPolicy(max_stacked_mb=8), gpu) == 8
    silent = SimpleNamespace(memory_stats=lambda: None)
    unknown = SimpleNamespace(on_cpu=False, jax=SimpleNamespace(devices=lambda: [silent]))
    assert stacked_cap_mb(tp.LoopPolicy(), unknown) == CPU_STACKED_MB
    with pytest.raises(ValueError, match="max_stacked_mb"):
        tp.LoopPolicy(max_stacked_mb=-1)


def test_a_plans_per_iteration_arrays_are_moved_to_the_device_once():
    """The branches, masks and rows a lowered loop's plan passes to every call of its scan
    (shared by the plans of translated entries) are device arrays, not NumPy arrays that
    each call would move again; the values are still the reference's."""
    import jax
    ctx, bounds, outputs = _recurrences()
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered", nests=False))
    _check(exe, ctx, bounds, outputs)
    templates = [t for launch in exe._launchers.values() for t in launch.planner.templates]
    arrays = [a for t in templates for a in (*t.plan.branches, *t.plan.active, *t.plan.rows_at)]
    assert arrays and all(isinstance(a, jax.Array) for a in arrays)


@pytest.mark.parametrize("nests", [True, False])
def test_a_first_run_compiles_each_loops_first_scan_ahead(monkeypatch, nests):
    """At its first run an executable plans each lowered loop's first entry before
    running anything and compiles its scan on a background thread; the entry then takes
    that program: no scan compiles on the program's thread, in the first run or the
    next. The values are the reference's."""
    from compile_log import compiled_here

    from tempo.runtime.backends import JaxBackend
    started = []
    in_background = JaxBackend.compile_in_background

    def recording(self, fn, args):
        started.append(fn)
        return in_background(self, fn, args)
    monkeypatch.setattr(JaxBackend, "compile_in_background", recording)
    ctx, bounds, outputs = _recurrences(entries=3)  # (a size no other test compiles)
    exe = ctx.compile(bounds, outputs, backend="jax", loops=tp.LoopPolicy("lowered", nests=nests))
    with compiled_here("run") as here:
        _check(exe, ctx, bounds, outputs)
        _check(exe, ctx, bounds, outputs)
    lowered = [c for c in exe.loop_choices.values() if c.form == "lowered" and not c.fallbacks]
    assert lowered and len(started) == len(lowered), ([str(c) for c in exe.loop_choices.values()], started)
    assert not here, here
    assert all(not launch.compiling and not launch.ahead_types for launch in exe._launchers.values())
