"""Loop lowering: a loop or loop nest of device ops runs as one ``lax.scan``.

The executor interprets the schedule one statement instance at a time: per step of an
acting loop, a few launches, each reading and writing tensor stores from Python. Where a
loop's bodies hold only device ops with static shapes (and merges between them, point
ops and frees), the whole loop can instead run as a single XLA loop: values the body
produces and reads in the same iteration flow directly, values read at later iterations
are the scan's carry, values produced before the loop come in as constants or as
per-iteration inputs, and the values read after the loop come out stacked and are
written to their stores. A nest is flattened into one sequence of iterations
(``tempo.runtime.nest``), so ``for i: for t:`` is one scan over the points ``(i, t)``;
its interpreted form runs its inner loops as their own lowerable loops.

Each entry's plan (``tempo.runtime.plan``) is made from its concrete points (the outer
loop counters are known then), for all iterations at once (indices, guards and dependences
compiled for NumPy arrays): every read is resolved to the iteration that produced it, or
to a store when no iteration did, so a lowered loop reads exactly what the interpreted
one would. Point ops (``symbol_value``, the coordinates random draws are keyed by) run on
the host while the plan is made, batched (``OpDef.batched``); the scan reads their
values. A loop of point ops alone (and frees) runs batched that way, with no scan. Where
reads do not fit (slices of values made in the loop, older values than the latest) or
the scan does not compile, the loop is interpreted from then on (in the executable's
later runs too), and ``LoopChoice.fallbacks`` says why.

``LoopPolicy.mode`` chooses per loop: ``"lowered"`` (the default) runs every loop that
allows it as one scan from its first entry (a decision that depends only on the program
and its sizes, so that two runs, or a run and its resumption, run the same kernels the same
way); ``"timed"`` interprets the first three entries and runs the next three lowered,
timing the last two of each (the first ones compile kernels, the scan and the stacking of
its inputs; the faster of two timings counts, so that one disturbed entry does not
decide), and keeps the faster form from then on (entries of later runs of the executable
count too: a nest entered once per run is timed over its first six runs);
``"interpreted"`` never lowers. Both forms run the same kernels, but XLA may fuse them
differently inside a scan, so results can differ in the last bits between the forms (PPO
on gymnax CartPole: losses equal to 1e-7): ``timed`` lowers a loop only when that is
clearly faster (``margin``), but which form a close call gets can differ between runs, so
its runs are not bitwise reproducible.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tempo.errors import Unlowerable
from tempo.ir.graph import SDG, Op, has_static_shapes
from tempo.ir.ops import param_symbols, resolve_params
from tempo.options import LoopPolicy
from tempo.runtime import nest
from tempo.runtime.plan import LoopPlanner, Plan, Slot, point_op, tuples
from tempo.schedule import ast
from tempo.schedule.scheduler import Statement
from tempo.symbolic.expr import Symbol

if TYPE_CHECKING:
    from tempo.runtime.backends import JaxBackend

WARM_ENTRIES = 1
"""Entries of each form ``timed`` runs before timing that form (they compile)."""
TIMED_ENTRIES = 2
"""Entries of each form ``timed`` times; the fastest counts."""


@dataclass
class LoopChoice:
    """What the run measured and chose for one lowerable loop (seconds per iteration)."""

    name: str
    statements: list[str]
    depth: int = 1
    """Loops on the longest path of the nest (1: a loop without inner loops)."""
    interpreted: float | None = None
    lowered: float | None = None
    compile_seconds: float = 0.0
    form: str | None = None
    fallbacks: list[str] = field(default_factory=list)
    reused: int = 0
    """Lowered entries whose plan was an earlier entry's, moved (``LoopPlanner``)."""
    entries: int = 0
    """Times the loop was entered (a nest's inner loop: only in the nest's interpreted
    entries)."""

    def __str__(self) -> str:
        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1e3:.3f} ms"
        name = self.name if self.depth == 1 else f"{self.name} (a nest {self.depth} loops deep)"
        if not self.entries:
            return f"{name} [{', '.join(self.statements)}]: not entered"
        if self.form == "batched":
            return f"{name} [{', '.join(self.statements)}]: batched on the host (point ops and frees)"
        why = f" (interpreted: {self.fallbacks[0]})" if self.fallbacks else ""
        return (f"{name} [{', '.join(self.statements)}]: {self.form or 'undecided'}; per iteration "
                f"interpreted {ms(self.interpreted)}, lowered {ms(self.lowered)} "
                f"(compile {self.compile_seconds:.2f} s; plans reused in {self.reused} entries){why}")


# ---- finding the loops -------------------------------------------------------------------
@dataclass(frozen=True)
class Lowerable:
    """A loop (or loop nest) that statement ``L<k>`` runs at its ``outer`` counters, and
    its interpreted form: the loop with the lowerable loops inside it (a nest's inner
    loop) replaced by their own statements."""

    loop: ast.Loop
    outer: tuple[Symbol, ...]
    interpreted: ast.Loop


def lower_loops(root: ast.Node, statements: dict[str, Statement], graph: SDG,
                bounds: dict[Symbol, int], nests: bool = True) -> tuple[ast.Node, dict[str, Lowerable]]:
    """``root`` with each outermost lowerable loop or loop nest replaced by a statement
    ``L<k>`` at its outer loop counters, and what each such statement stands for. Inside a
    lowerable nest, the lowerable loops are found the same way, for its interpreted form:
    a nest that runs interpreted still runs its inner loop in the form that loop chose."""
    found: dict[str, Lowerable] = {}

    def lowerable(loop: ast.Loop) -> bool:
        return _lowerable(loop, statements, graph, bounds, nests)

    def visit(node: ast.Node, outer: tuple[Symbol, ...]) -> ast.Node:
        if isinstance(node, ast.Seq):
            return ast.Seq(tuple(visit(c, outer) for c in _with_peeled_iterations(node.body, lowerable)))
        if isinstance(node, ast.If):
            orelse = visit(node.orelse, outer) if node.orelse is not None else None
            return ast.If(node.cond, visit(node.then, outer), orelse)
        if isinstance(node, ast.Loop):
            inner = ast.Loop(node.var, node.start, node.cond, node.step,
                             visit(node.body, (*outer, node.var)))
            if not _lowerable(node, statements, graph, bounds, nests):
                return inner
            name = f"L{len(found)}"
            found[name] = Lowerable(node, outer, inner)
            return ast.Stmt(name, outer)
        return node
    return visit(root, ()), found


def _with_peeled_iterations(body: tuple[ast.Node, ...],
                            lowerable: Callable[[ast.Loop], bool]) -> list[ast.Node]:
    """``body`` with each lowerable innermost loop given back the iterations isl peeled
    off it into the statements around it (``nest.with_peeled_iterations``: a recurrence's
    first step, an update loop's last), where the loop stays lowerable with them: the
    peeled statements then run inside the loop's scan instead of as kernels of their own,
    each compiled a second time outside the scan (PPO's acting step and its update)."""
    out = list(body)
    k = 0
    while k < len(out):
        loop = out[k]
        if isinstance(loop, ast.Loop) and nest.is_nest(loop) and nest.depth(loop) == 1 and lowerable(loop):
            start, stop = k, k + 1
            while start and isinstance(out[start - 1], ast.Stmt):
                start -= 1
            while stop < len(out) and isinstance(out[stop], ast.Stmt):
                stop += 1
            before, after = out[start:k], out[k + 1:stop]
            for take_before, take_after in ((True, True), (True, False), (False, True)):
                kept_before, unpeeled, kept_after = nest.with_peeled_iterations(
                    before if take_before else [], loop, after if take_after else [])
                if unpeeled is not loop and lowerable(unpeeled):
                    kept_before = kept_before if take_before else before
                    kept_after = kept_after if take_after else after
                    out[start:stop] = [*kept_before, unpeeled, *kept_after]
                    k = start + len(kept_before)
                    break
        k += 1
    return out


def _lowerable(loop: ast.Loop, statements: dict[str, Statement], graph: SDG,
               bounds: dict[Symbol, int], nests: bool) -> bool:
    """A ``range`` loop, or a nest of them (``tempo.runtime.nest``), whose statements
    are device ops with static shapes and point-independent params that read points (not
    slices), merges, point ops and frees, each op executed at one place in the bodies (a
    scan), or only point ops and frees (run batched on the host: the values of point ops,
    all at once; frees, one call per store)."""
    if not nest.is_nest(loop) or (nest.depth(loop) > 1 and not nests):
        return False
    body = [item.stmt for item in nest.levels_and_items(nest.unpeeled(loop))[1]]
    ops = [statements[s.name].op for s in body if statements[s.name].kind == "exec"]
    execs = [op for op in ops if not point_op(op)]
    if not execs:
        return bool(body)
    once = len({op.id for op in execs}) == len(execs)  # not unrolled (S4(c, 0); S4(c, 1))
    return once and any(op.kind != "merge" for op in execs) and all(
        _device_op(op, graph, bounds) and not any(e.slices for e in graph.in_edges(op)) for op in execs)


def _device_op(op: Op, graph: SDG, bounds: dict[Symbol, int]) -> bool:
    if op.kind == "merge":
        return has_static_shapes(op, graph.in_edges(op), set(bounds))
    return (not op.definition.host and op.kind != "sum_readers"
            and not (param_symbols(op.params) & set(op.domain))
            and has_static_shapes(op, graph.in_edges(op), set(bounds)))


# ---- running a loop ----------------------------------------------------------------------
class LoopLauncher:
    """Runs one lowerable loop (statement ``L<k>``) at its outer counters, in the form its
    policy chooses. Made once per executable: its compiled scans, plan templates and
    timings serve every run; ``bind`` gives it a run's stores and statements."""

    def __init__(self, lowerable: Lowerable, statements: dict[str, Statement], graph: SDG,
                 bounds: dict[Symbol, int], backend: JaxBackend, policy: LoopPolicy, choice: LoopChoice):
        loop, outer = lowerable.loop, lowerable.outer
        self.bounds, self.backend, self.policy, self.choice = bounds, backend, policy, choice
        self.planner = LoopPlanner(loop, outer, statements, graph, bounds, backend)
        self.execs = self.planner.execs
        self.interpret = _interpreter(lowerable.interpreted, [v.name for v in outer])
        self.traced: dict[tuple, Callable] = {}
        """Compiled scans by plan signature."""
        self.collective: dict[tuple, bool] = {}
        """Per plan signature, whether the scan communicates between devices (then it runs
        alone: ``JaxBackend.one_at_a_time``)."""
        self.timings = 0
        self.last_form = ""
        self.stores: dict = {}
        self.namespace: dict[str, Callable] = {}
        self.wait_for_outputs = False
        """A lowered entry returns once its outputs are computed (set by the profiler; a
        scan that holds a collective over several CPU devices always does)."""
        self._compiling = 0.0

    def bind(self, stores: dict, namespace: dict[str, Callable], batched: dict[str, Callable]) -> None:
        """Run with a run's ``stores``, its statements (``namespace``: what the interpreted
        form calls) and its batched point ops."""
        self.stores, self.namespace = stores, namespace
        self.planner.bind(stores, batched)
        self.wait_for_outputs = False

    def __call__(self, outer: tuple[int, ...]) -> None:
        self.choice.entries += 1
        space = self.planner.space(outer)
        if not self.execs:  # point ops and frees only: always cheaper batched
            self.choice.form = self.last_form = "batched"
            self._run_batched(outer, space)
            return
        form, timed = self._form(space.trips)
        self._compiling = 0.0
        if timed:  # charge neither form with device work dispatched before the loop
            self._wait_for_stores()
        begin = time.perf_counter()
        if form == "lowered":
            try:
                reused = self.planner.reused
                plan = self.planner.plan(outer, space)
                self.choice.reused += self.planner.reused - reused
                self._run_lowered(plan)
            except Unlowerable as why:
                self.choice.fallbacks.append(str(why))
                form = "interpreted"
        self.last_form = form
        if form == "interpreted":
            self.interpret(self.namespace, *outer)
        if timed:
            self._wait_for_stores()
            self._record(form, (time.perf_counter() - begin - self._compiling) / space.trips)

    def _form(self, trips: int) -> tuple[str, bool]:
        """The form of this entry, and whether it is timed. ``timed`` runs three entries
        of each form and times the last two of each (the first compiles: the body's
        kernels, the scan, the stacking of its inputs), then keeps the lowered form if its
        faster timing was clearly faster than the interpreted form's."""
        choice = self.choice
        if self.policy.mode == "interpreted" or trips < self.policy.min_trips or choice.fallbacks:
            return "interpreted", False
        if self.policy.mode == "lowered":
            choice.form = "lowered"
            return "lowered", False
        if choice.form is not None:
            return choice.form, False
        self.timings += 1
        per_form = WARM_ENTRIES + TIMED_ENTRIES
        form = "interpreted" if self.timings <= per_form else "lowered"
        return form, (self.timings - 1) % per_form >= WARM_ENTRIES

    def _record(self, form: str, seconds: float) -> None:
        choice = self.choice
        if form == "interpreted":
            choice.interpreted = seconds if choice.interpreted is None else min(choice.interpreted, seconds)
        else:
            choice.lowered = seconds if choice.lowered is None else min(choice.lowered, seconds)
        if self.timings == 2 * (WARM_ENTRIES + TIMED_ENTRIES) and choice.interpreted is not None \
                and choice.lowered is not None:
            faster = choice.lowered < (1.0 - self.policy.margin) * choice.interpreted
            choice.form = "lowered" if faster else "interpreted"

    def _wait_for_stores(self) -> None:
        """Wait for every stored device value (block stores are host memory)."""
        points = [store.data for store in self.stores.values() if hasattr(store, "data")]
        self.backend.synchronize([[*data.values(), *(v for v, _ in data.rows.values())]
                                  for data in points])

    def _run_batched(self, outer: tuple[int, ...], space: nest.Space) -> None:
        """A loop of point ops and frees: each statement at all its points at once (a
        point is made before it is freed, so statement order is enough)."""
        for name, st, iterations, coords in self.planner.instances(outer, space):
            points = tuples(coords, len(iterations))
            if st.kind == "free":
                self._free(st.op, st.freed, points)
            elif points:
                self.planner.batched[name](coords, points)

    def _free(self, op: Op, outputs: tuple[int, ...], points: list[tuple]) -> None:
        for k in outputs:
            self.stores[(op.id, k)].free_many(points)

    def _run_lowered(self, plan: Plan) -> None:
        stacked = self._stacked_bytes(plan) / 2**20
        if stacked > self.policy.max_stacked_mb:
            raise Unlowerable(f"its outputs stacked over the loop would hold {stacked:.0f} MiB, more than "
                              f"LoopPolicy.max_stacked_mb={self.policy.max_stacked_mb:g}")
        fn = self.traced.get(plan.signature)
        args = (plan.consts, plan.stacked, plan.branches, plan.active, plan.rows_at, plan.carry_init)
        if fn is None:
            begin = time.perf_counter()
            try:
                fn = self.backend.jax.jit(self._scan(plan)).lower(*args).compile()
            except Exception as err:  # a kernel that does not trace inside a scan
                raise Unlowerable(f"the scan did not compile: {type(err).__name__}: {err}") from err
            self._compiling = time.perf_counter() - begin
            self.choice.compile_seconds += self._compiling
            self.traced[plan.signature] = fn
            backend = self.backend
            self.collective[plan.signature] = backend.one_at_a_time and backend.holds_collectives(fn)
        last, outputs = fn(*args)
        if self.wait_for_outputs or self.collective[plan.signature]:
            self.backend.synchronize((last, outputs))
        for key in plan.finals:  # the one kept point, made at the last iteration
            self.stores[key].write(plan.made[key].kept[1][0], last[key])
        sparse = {key for key, _ in plan.sparse}
        for key, values in zip(plan.exported, outputs):
            made = plan.made[key]
            if key in self.planner.blocks:  # every row, then the frees: a block is released when
                rows = list(range(len(made.rows))) if key in sparse else made.rows  # all its rows
                self.stores[key].write_rows(made.points, values, rows)
                self.stores[key].free_many([p for p, freed in zip(made.points, made.freed) if freed])
            else:
                rows, points = made.kept
                self.stores[key].write_rows(points, values, made.kept_runs if key in sparse else rows)
        for op, freed, points in plan.frees:
            self._free(op, freed, points)

    def _stacked_bytes(self, plan: Plan) -> int:
        """Bytes of the plan's outputs stacked over the entry's iterations (or runs)."""
        rows = dict(plan.sparse)
        total = 0
        for key in plan.exported:
            shape, dtype = self.planner.output_type(key)
            row = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            total += rows.get(key, plan.trips) * row
        return total

    def _scan(self, plan: Plan) -> Callable:
        """The loop as a function of the plan's values, for ``jax.jit``."""
        jax, xp = self.backend.jax, self.backend.xp
        slots, runs = plan.slots, plan.runs
        carried = sorted({*plan.carries, *plan.masked, *plan.finals})
        masked = {key: n for n, key in enumerate(plan.masked)}
        sparse = {key: n for n, (key, _) in enumerate(plan.sparse)}
        buffers = []  # per sparse output: a row per run, and one where the op does not run
        for key, count in plan.sparse:
            shape, dtype = self.planner.output_type(key)
            buffers.append(((count + 1, *shape), dtype))
        # Made in the program: as arguments, zeros are moved in at every call (over a mesh
        # of forced CPU devices, PPO's update scan's 9 were copied to each device each time).
        zeros = {key: self.planner.output_type(key) for key in plan.zeros}
        merges = [pos for pos, (op, _) in enumerate(self.execs) if op.kind == "merge"]
        kernels = [(op, op.definition.kernel, resolve_params(op.params, self.bounds))
                   for op, _ in self.execs]

        def run(consts: list, stacked: list, branches: list, active: list, rows_at: list,
                init: dict) -> Any:
            def step(state: tuple, xs: tuple) -> tuple[tuple, tuple]:
                carry, rows = state
                per_step, branch, runs_now, row_now = xs
                values: dict[tuple[int, int], Any] = {}

                def made(key: tuple[int, int], out: Any) -> None:
                    """An op's output; where the op does not run, its latest value."""
                    n = masked.get(key)
                    values[key] = out if n is None else xp.where(runs_now[n], out, carry[key])

                def value(slot: Slot) -> Any:
                    if slot.kind == "body":
                        return values[slot.key]
                    if slot.kind == "carry":
                        return carry[slot.key]
                    return consts[slot.key] if slot.kind == "const" else per_step[slot.key]
                for pos, (op, kernel, params) in enumerate(kernels):
                    if not runs[pos]:  # its values are read nowhere in this entry
                        continue
                    row = slots[pos]
                    if op.kind == "merge":
                        chosen = branch[merges.index(pos)]
                        taken = [(k, value(s)) for k, s in enumerate(row) if s.kind != "unused"]
                        out = taken[0][1]
                        for k, v in taken[1:]:
                            out = xp.where(chosen == k, v, out)
                        made((op.id, 0), out)
                        continue
                    outs = kernel(xp, params, *(value(s) for s in row))
                    for k, out in enumerate(outs if op.definition.multi_output else (outs,)):
                        made((op.id, k), out)
                rows = tuple(jax.lax.dynamic_update_index_in_dim(rows[n], values[key], row_now[n], 0)
                             for key, n in sparse.items())
                return ({key: values[key] for key in carried}, rows), \
                    tuple(values[key] for key in plan.exported if key not in sparse)
            empty = tuple(xp.zeros(shape, dtype) for shape, dtype in buffers)
            init = {**init, **{key: xp.zeros(shape, dtype) for key, (shape, dtype) in zeros.items()}}
            xs = (stacked, branches, active, rows_at)
            (last, rows), per_iteration = jax.lax.scan(step, (init, empty), xs, length=plan.trips)
            dense = iter(per_iteration)
            return last, tuple(rows[sparse[key]][:-1] if key in sparse else next(dense)
                               for key in plan.exported)
        return run


def _interpreter(loop: ast.Loop, outer: list[str]) -> Callable[..., None]:
    """The loop as interpreted Python: ``fn(namespace, *outer counters)``."""
    def call(stmt: ast.Stmt) -> str:
        return f"ns[{stmt.name!r}](({''.join(e.to_python() + ', ' for e in stmt.index)}))"
    source = "\n".join([f"def loop({', '.join(['ns', *outer])}):", *ast.to_python(loop, call, indent=1)])
    scope: dict[str, Any] = {"min": min, "max": max}
    exec(compile(source, "<tempo loop>", "exec"), scope)  # noqa: S102 - generated code
    return scope["loop"]
