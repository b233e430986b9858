"""Loop lowering: an innermost loop of device ops runs as one ``lax.scan``.

The executor interprets the schedule one statement instance at a time: per step of an
acting loop, a few launches, each reading and writing tensor stores from Python. Where a
loop's body holds only device ops with static shapes (and merges between them, and
frees), the whole loop can instead run as a single XLA loop: values the body produces and
reads in the same iteration flow directly, values read one iteration later are the scan's
carry, values produced before the loop come in as constants or as per-iteration inputs,
and the values read after the loop come out stacked and are written to their stores.

The plan is made from the concrete points of each entry into the loop (its outer loop
counters are known then), for all iterations at once (indices, guards and dependences
compiled for NumPy arrays): every read is resolved to the iteration that produced it, or
to a store when no iteration did, so a lowered loop reads exactly what the interpreted
one would. Point ops (``symbol_value``, the coordinates random draws are keyed by) run on
the host while the plan is made, batched (``OpDef.batched``); the scan reads their
values. A loop of point ops alone (and frees) runs batched that way, with no scan. Where
reads do not fit (slices of values made in the loop, reads more than one iteration back)
or the scan does not compile, the loop is interpreted from then on (in the executable's
later runs too), and ``LoopChoice.fallbacks`` says why.

``LoopPolicy.mode`` chooses per loop: ``"timed"`` (the default) interprets the first two
entries and runs the next two lowered, timing the second of each (the first ones compile
kernels, the scan and the stacking of its inputs), and keeps the faster form for the rest
of the run;
``"lowered"`` and ``"interpreted"`` force a form. Both forms run the same kernels, but
XLA may fuse them differently inside a scan, so results can differ in the last bits
between the forms (PPO on gymnax CartPole: losses equal to 1e-7). ``timed`` lowers a loop
only when that is clearly faster (``margin``), so close calls do not flip between runs;
force a form where runs must be bitwise reproducible on JAX.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tempo.ir.graph import SDG, Edge, Op, has_static_shapes
from tempo.ir.ops import param_symbols, resolve_params
from tempo.runtime.stores import BlockStore
from tempo.schedule import ast
from tempo.schedule.scheduler import Statement
from tempo.symbolic.expr import Symbol, compile_function, compile_vectorized

MODES = ("timed", "lowered", "interpreted")
WARM_ENTRIES = 2
"""Entries of each form ``timed`` runs before it times one (the earlier ones compile)."""
def _point_op(op: Op) -> bool:
    """A host op without inputs whose value is a function of the point (``OpDef.batched``):
    a lowered loop computes it for all its iterations on the host before its scan, which
    reads the values."""
    return op.definition.batched is not None


@dataclass(frozen=True)
class LoopPolicy:
    """How innermost loops of device ops run on the JAX backend."""

    mode: str = "timed"
    """``timed``: time both forms on the loop's first four entries (two each) and keep the
    lowered form if it was clearly faster;
    ``lowered``: always one ``lax.scan`` where the loop allows it; ``interpreted``: never."""
    min_trips: int = 4
    """Entries with fewer iterations than this are interpreted (a scan would not pay)."""
    margin: float = 0.2
    """``timed`` keeps the lowered form only when it is at least this much faster (a
    share of the interpreted time): close calls, which timing noise could decide either
    way from one run to the next, stay interpreted."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown loop mode {self.mode!r}; choose one of {', '.join(MODES)}")


@dataclass
class LoopChoice:
    """What the run measured and chose for one lowerable loop (seconds per iteration)."""

    name: str
    statements: list[str]
    interpreted: float | None = None
    lowered: float | None = None
    compile_seconds: float = 0.0
    form: str | None = None
    fallbacks: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1e3:.3f} ms"
        if self.form == "batched":
            return f"{self.name} [{', '.join(self.statements)}]: batched (point ops on the host)"
        why = f" (interpreted: {self.fallbacks[0]})" if self.fallbacks else ""
        return (f"{self.name} [{', '.join(self.statements)}]: {self.form or 'undecided'}; per iteration "
                f"interpreted {ms(self.interpreted)}, lowered {ms(self.lowered)} "
                f"(compile {self.compile_seconds:.2f} s){why}")


# ---- finding the loops -------------------------------------------------------------------
def lower_loops(root: ast.Node, statements: dict[str, Statement], graph: SDG,
                bounds: dict[Symbol, int]) -> tuple[ast.Node, dict[str, tuple[ast.Loop, tuple[Symbol, ...]]]]:
    """``root`` with each lowerable innermost loop replaced by a statement ``L<k>`` at its
    outer loop counters, and what each such statement stands for: ``(loop, outer vars)``."""
    found: dict[str, tuple[ast.Loop, tuple[Symbol, ...]]] = {}

    def visit(node: ast.Node, outer: tuple[Symbol, ...]) -> ast.Node:
        if isinstance(node, ast.Seq):
            return ast.Seq(tuple(visit(c, outer) for c in node.body))
        if isinstance(node, ast.If):
            orelse = visit(node.orelse, outer) if node.orelse is not None else None
            return ast.If(node.cond, visit(node.then, outer), orelse)
        if isinstance(node, ast.Loop):
            if _lowerable(node, statements, graph, bounds):
                name = f"L{len(found)}"
                found[name] = (node, outer)
                return ast.Stmt(name, outer)
            return ast.Loop(node.var, node.start, node.cond, node.step,
                            visit(node.body, (*outer, node.var)))
        return node
    return visit(root, ()), found


def _lowerable(loop: ast.Loop, statements: dict[str, Statement], graph: SDG,
               bounds: dict[Symbol, int]) -> bool:
    """An innermost ``range`` loop whose statements are device ops with static shapes and
    point-independent params that read points (not slices), merges, point ops and frees,
    each op executed at one place in the body (a scan), or only point ops and frees (run
    batched on the host)."""
    if ast.range_stop(loop) is None:
        return False
    body = [node for node, _ in _guarded_items(loop.body)]
    if any(isinstance(node, ast.Loop) for node in body):
        return False
    ops = [statements[s.name].op for s in body if statements[s.name].kind == "exec"]
    execs = [op for op in ops if not _point_op(op)]
    if not execs:
        return bool(ops)
    once = len({op.id for op in execs}) == len(execs)  # not unrolled (S4(c, 0); S4(c, 1))
    return once and any(op.kind != "merge" for op in execs) and all(
        _device_op(op, graph, bounds) and not any(e.slices for e in graph.in_edges(op)) for op in execs)


def _device_op(op: Op, graph: SDG, bounds: dict[Symbol, int]) -> bool:
    if op.kind == "merge":
        return has_static_shapes(op, graph.in_edges(op), set(bounds))
    return (not op.definition.host and op.kind != "sum_readers"
            and not (param_symbols(op.params) & set(op.domain))
            and has_static_shapes(op, graph.in_edges(op), set(bounds)))


def _guarded_items(node: ast.Node, guard: tuple = ()) -> list[tuple[Any, tuple]]:
    """The statements and loops of a loop body, in order, each with the conditions
    (expressions) that guard it."""
    if isinstance(node, (ast.Stmt, ast.Loop)):
        return [(node, guard)]
    if isinstance(node, ast.Seq):
        return [item for c in node.body for item in _guarded_items(c, guard)]
    assert isinstance(node, ast.If)
    items = _guarded_items(node.then, (*guard, node.cond))
    if node.orelse is not None:
        items += _guarded_items(node.orelse, (*guard, ~node.cond))
    return items


def statement_names(loop: ast.Loop) -> list[str]:
    """The statements of a lowerable loop's body."""
    return sorted(node.name for node, _ in _guarded_items(loop.body))


# ---- the plan of one entry ---------------------------------------------------------------
@dataclass(frozen=True)
class _Slot:
    """Where input ``k`` of a body op comes from: ``body`` (made earlier in the same
    iteration), ``carry`` (made in the previous one), ``const`` (a stored value, the same
    in every iteration), ``stacked`` (a stored value per iteration) or ``unused`` (a merge
    branch that no iteration of this entry takes, or any input of an op that does not run
    in this entry: the scan skips such ops)."""

    kind: str
    key: Any = None  # (op id, output) for body/carry; the input's number for const/stacked


Slots = tuple[tuple[_Slot, ...], ...]
"""Per exec of a loop body, per input."""


@dataclass
class _Made:
    """The points one body op makes in an entry: the iteration (row) of each, and whether
    the loop also frees it."""

    rows: list[int]
    points: list[tuple]
    freed: list[bool]

    def kept_rows(self) -> list[int]:
        return [n for n, freed in zip(self.rows, self.freed) if not freed]


@dataclass
class _Plan:
    """One entry into the loop, every read resolved: the structure (which decides the
    traced function) and the values to run it with."""

    slots: Slots
    carries: tuple[tuple[int, int], ...]       # outputs read one iteration later
    exported: tuple[tuple[int, int], ...]      # outputs written to their stores afterwards, stacked
    finals: tuple[tuple[int, int], ...]        # outputs whose one kept point is the last
                                               # iteration's: written from the final carry
    consts: list[Any]
    stacked: list[Any]
    branches: list[np.ndarray]                 # per merge of the body: the branch per iteration
    carry_init: dict[tuple[int, int], Any]
    trips: int
    runs: tuple[bool, ...]                     # per exec of the body: whether it runs in this entry
    made: dict[int, _Made]                     # op id -> the points it makes
    frees: list[tuple[Op, tuple]]              # frees of points made before the loop

    @property
    def signature(self) -> tuple:
        return (self.slots, self.carries, self.exported, self.finals, len(self.branches), self.trips,
                self.runs)


class _Unlowerable(Exception):
    """This entry's reads do not fit a scan; the message says why."""


STORE, BODY, CARRY = 0, 1, 2
"""Where a read's value is, per iteration: a store, this iteration's body, the carry."""
SOURCES = ("store", "body", "carry")


def _tuples(coords: tuple[np.ndarray, ...], count: int) -> list[tuple]:
    """Points as tuples, from their coordinates as arrays (``count`` of them)."""
    return list(zip(*(c.tolist() for c in coords))) if coords else [()] * count


class _PointIndex:
    """Finds which of an op's points (made in an entry) a read names: the points are
    numbered in a mixed radix over the box that holds them, and looked up sorted."""

    def __init__(self, coords: tuple[np.ndarray, ...], count: int):
        self.low = [int(c.min()) for c in coords]
        self.high = [int(c.max()) for c in coords]
        sizes = [h - lo + 1 for lo, h in zip(self.low, self.high)]
        self.strides = [int(np.prod(sizes[:d], dtype=np.int64)) for d in range(len(sizes))]
        keys = self._keys(coords, count)
        self.order = np.argsort(keys, kind="stable")
        self.sorted = keys[self.order]

    def _keys(self, coords: tuple[np.ndarray, ...], count: int) -> np.ndarray:
        keys = np.zeros(count, np.int64)
        for c, lo, stride in zip(coords, self.low, self.strides):
            keys += (c - lo) * stride
        return keys

    def find(self, coords: tuple[np.ndarray, ...], count: int) -> np.ndarray:
        """Per read point (``count`` of them), the index of the made point it names, or -1."""
        inside = np.ones(count, bool)
        for c, lo, h in zip(coords, self.low, self.high):
            inside &= (c >= lo) & (c <= h)
        keys = self._keys(coords, count)
        at = np.minimum(np.searchsorted(self.sorted, keys), len(self.sorted) - 1)
        return np.where(inside & (self.sorted[at] == keys), self.order[at], -1)


@dataclass
class _Reads:
    """The reads of one input of one body op in an entry: iterations, points, sources."""

    edge: Edge
    iterations: np.ndarray
    coords: tuple[np.ndarray, ...]
    sources: np.ndarray

    def points(self) -> list[tuple]:
        return _tuples(self.coords, len(self.iterations))


# ---- running a loop ----------------------------------------------------------------------
class LoopLauncher:
    """Runs one lowerable loop (statement ``L<k>``) at its outer counters, in the form its
    policy chooses; ``namespace`` holds the statements the interpreted form calls."""

    def __init__(self, loop: ast.Loop, outer: tuple[Symbol, ...], statements: dict[str, Statement],
                 graph: SDG, stores: dict, bounds: dict[Symbol, int], backend: Any,
                 namespace: dict[str, Callable], batched: dict[str, Callable], policy: LoopPolicy,
                 choice: LoopChoice, traced: dict[tuple, Callable]):
        self.loop, self.stores, self.bounds, self.backend = loop, stores, bounds, backend
        self.namespace, self.batched, self.policy, self.choice = namespace, batched, policy, choice
        counters = [*outer, loop.var]
        self.range = compile_function([loop.start, ast.range_stop(loop)], outer)
        self.items = [(s.name, statements[s.name], compile_vectorized(s.index, counters),
                       compile_vectorized(guard, counters) if guard else None)
                      for s, guard in _guarded_items(loop.body)]
        self.execs = [(st.op, graph.in_edges(st.op)) for _, st, _, _ in self.items
                      if st.kind == "exec" and not _point_op(st.op)]
        self.phis = {op.id: [compile_vectorized(e.phi, op.domain, bounds) for e in edges]
                     for op, edges in self.execs}
        self.conds = {op.id: compile_vectorized([e.cond for e in edges], op.domain, bounds)
                      for op, edges in self.execs if op.kind == "merge"}
        self.interpret = _interpreter(loop, [v.name for v in outer])
        self.traced = traced
        """Compiled scans by plan signature, shared by the executable's runs."""
        self.blocks = {key for key, store in stores.items() if isinstance(store, BlockStore)}
        self.timings = 0
        self.last_form = ""
        self.wait_for_outputs = False
        """Set by the profiler: a lowered entry returns once its outputs are computed."""
        self._compiling = 0.0

    def __call__(self, outer: tuple[int, ...]) -> None:
        start, stop = self.range(*outer)
        steps = range(start, stop, self.loop.step)
        if not self.execs:  # point ops and frees only: always cheaper batched
            self.choice.form = self.last_form = "batched"
            self._run_batched(outer, steps)
            return
        form, timed = self._form(len(steps))
        self._compiling = 0.0
        if timed:  # charge neither form with device work dispatched before the loop
            self._wait_for_stores()
        begin = time.perf_counter()
        if form == "lowered":
            try:
                self._run_lowered(self._plan(outer, steps))
            except _Unlowerable as why:
                self.choice.fallbacks.append(str(why))
                form = "interpreted"
        self.last_form = form
        if form == "interpreted":
            self.interpret(self.namespace, *outer)
        if timed:
            self._wait_for_stores()
            self._record(form, (time.perf_counter() - begin - self._compiling) / len(steps))

    def _form(self, trips: int) -> tuple[str, bool]:
        """The form of this entry, and whether it is timed. ``timed`` runs two entries of
        each form and times the second of each (the first compiles: the body's kernels,
        the scan, the stacking of its inputs), then keeps the lowered form if it was
        clearly faster."""
        choice = self.choice
        if self.policy.mode == "interpreted" or trips < self.policy.min_trips or choice.fallbacks:
            return "interpreted", False
        if self.policy.mode == "lowered":
            choice.form = "lowered"
            return "lowered", False
        if choice.form is not None:
            return choice.form, False
        self.timings += 1
        form = "interpreted" if self.timings <= WARM_ENTRIES else "lowered"
        return form, self.timings in (WARM_ENTRIES, 2 * WARM_ENTRIES)

    def _record(self, form: str, seconds: float) -> None:
        choice = self.choice
        if form == "interpreted" and self.timings == WARM_ENTRIES:
            choice.interpreted = seconds
        elif form == "lowered" and self.timings == 2 * WARM_ENTRIES:
            choice.lowered = seconds
        if choice.interpreted is not None and choice.lowered is not None:
            faster = choice.lowered < (1.0 - self.policy.margin) * choice.interpreted
            choice.form = "lowered" if faster else "interpreted"

    def _wait_for_stores(self) -> None:
        """Wait for every stored device value (block stores are host memory)."""
        points = [store.data for store in self.stores.values() if hasattr(store, "data")]
        self.backend.synchronize([[*data.values(), *(v for v, _ in data.rows.values())]
                                  for data in points])

    # -- batched and lowered ---------------------------------------------------------------
    def _instances(self, outer: tuple[int, ...], steps: range) -> Iterator[tuple[str, Statement,
                                                                                np.ndarray, tuple]]:
        """Per statement of the body: the iterations (numbered from 0) it runs at in this
        entry and its points there, as coordinate arrays."""
        loop_values = np.arange(steps.start, steps.stop, steps.step, dtype=np.int64)
        for name, st, index, guards in self.items:
            iterations = np.arange(len(loop_values))
            if guards is not None:
                iterations = np.flatnonzero(np.logical_and.reduce(guards(*outer, loop_values)))
            yield name, st, iterations, index(*outer, loop_values[iterations])

    def _run_batched(self, outer: tuple[int, ...], steps: range) -> None:
        """A loop of point ops and frees: each statement at all its points at once (a
        point is made before it is freed, so statement order is enough)."""
        for name, st, iterations, coords in self._instances(outer, steps):
            points = _tuples(coords, len(iterations))
            if st.kind == "free":
                for point in points:
                    self.namespace[name](point)
            elif points:
                self.batched[name](coords, points)

    def _plan(self, outer: tuple[int, ...], steps: range) -> _Plan:
        """Every read of every iteration of this entry, resolved to the iteration that
        makes it or to a store; raises ``_Unlowerable`` where a scan cannot express it.
        Indices are computed for all iterations at once (``compile_vectorized``)."""
        trips = len(steps)
        runs: list[tuple[np.ndarray, tuple[np.ndarray, ...]]] = []  # per exec: iterations, points
        frees: list[tuple[Op, np.ndarray, tuple[np.ndarray, ...]]] = []
        for name, st, iterations, coords in self._instances(outer, steps):
            if st.kind == "free":
                frees.append((st.op, iterations, coords))
            elif _point_op(st.op):  # computed now, read from its store by the scan
                if len(iterations):
                    self.batched[name](coords, _tuples(coords, len(iterations)))
            else:
                runs.append((iterations, coords))
        made = {op.id: (pos, runs[pos][0], _PointIndex(runs[pos][1], len(runs[pos][0])))
                for pos, (op, _) in enumerate(self.execs) if len(runs[pos][0])}
        branches = {}
        reads: list[list[_Reads | None]] = []
        for pos, (op, edges) in enumerate(self.execs):
            iterations, coords = runs[pos]
            taken = None
            if op.kind == "merge":
                taken = self._branches(op, coords, len(iterations))
                branches[pos] = np.zeros(trips, np.int32)
                branches[pos][iterations] = taken
            reads.append([self._reads(pos, k, edge, iterations, coords, taken, made)
                          for k, edge in enumerate(edges)])
        slots, consts, stacked, init = self._resolve(reads, trips)
        carries = tuple(sorted({s.key for row in slots for s in row if s.kind == "carry"}))
        made_points, later = self._made_and_freed(runs, frees, made)
        exported = [(op.id, k) for op, _ in self.execs for k in range(len(op.outputs))
                    if op.id in made_points and (not all(made_points[op.id].freed)
                                                 or (op.id, k) in self.blocks)]
        # A value kept only from the last iteration (the state a loop leaves) comes out as
        # the scan's final carry: slicing one row of a stacked output costs a dispatch.
        finals = tuple(key for key in exported if key not in self.blocks
                       and made_points[key[0]].kept_rows() == [trips - 1])
        for key in (*carries, *finals):
            if key not in init:  # read only where another branch is taken at the first
                out = self.execs[made[key[0]][0]][0].outputs[key[1]]  # iteration, or final only
                init[key] = self.backend.zeros(tuple(int(d.evaluate(self.bounds)) for d in out.shape),
                                               out.dtype)
        return _Plan(slots, carries, tuple(k for k in exported if k not in finals), finals, consts,
                     stacked, list(branches.values()), init, trips,
                     tuple(bool(len(it)) for it, _ in runs), made_points, later)

    def _branches(self, op: Op, coords: tuple[np.ndarray, ...], count: int) -> np.ndarray:
        """Per point of a merge, the first branch whose condition holds."""
        holds = np.stack([np.broadcast_to(c, (count,)) for c in self.conds[op.id](*coords)])
        if not holds.any(axis=0).all():
            point = _tuples(coords, count)[int(np.argmin(holds.any(axis=0)))]
            raise _Unlowerable(f"no branch of {op.name} holds at {point}")
        return holds.argmax(axis=0)

    def _reads(self, pos: int, k: int, edge: Edge, iterations: np.ndarray,
               coords: tuple[np.ndarray, ...], taken: np.ndarray | None, made: dict) -> _Reads | None:
        """Input ``k`` of the ``pos``-th body op: the points it reads where it runs (a
        merge: where branch ``k`` is taken) and where each value is (``SOURCES``)."""
        if taken is not None:
            iterations, coords = iterations[taken == k], tuple(c[taken == k] for c in coords)
        if not len(iterations):
            return None
        count = len(iterations)
        read = tuple(c if c.shape == (count,) else np.broadcast_to(c, (count,))
                     for c in self.phis[self.execs[pos][0].id][k](*coords))
        sources = np.full(count, STORE, np.int8)
        if edge.src.id in made:
            maker, when, index = made[edge.src.id]
            found = index.find(read, count)
            at = np.where(found >= 0, when[found], -1)
            if ((found >= 0) & (at < iterations - 1)).any():
                raise _Unlowerable(f"{self.execs[pos][0].name} reads {edge.src.name} of another iteration")
            sources[(found >= 0) & (at == iterations) & (maker < pos)] = BODY
            sources[(found >= 0) & (at == iterations - 1)] = CARRY
        return _Reads(edge, iterations, read, sources)

    def _resolve(self, reads: list[list[_Reads | None]], trips: int) -> tuple[Slots, list, list, dict]:
        """Each input's slot, the stored values the scan reads, and the carries' initial values."""
        consts: list[Any] = []
        stacked: list[Any] = []
        init: dict[tuple[int, int], Any] = {}
        init_points: dict[tuple[int, int], tuple] = {}
        slots = []
        for pos, row in enumerate(reads):
            slot_row = []
            for r in row:
                if r is None:
                    slot_row.append(_Slot("unused"))
                    continue
                key = (r.edge.src.id, r.edge.src_out)
                first_from_store = r.iterations[0] == 0 and r.sources[0] == STORE
                counted = (r.iterations > 0) | (r.sources != STORE)
                sources = set(r.sources[counted].tolist())
                read = self.stores[key].reader(False)
                if sources <= {STORE} and (sources or first_from_store):
                    points = r.points()
                    if all((c == c[0]).all() for c in r.coords):
                        consts.append(read(points[0]))
                        slot_row.append(_Slot("const", len(consts) - 1))
                        continue
                    # Iterations that do not read it (a merge branch not taken) reuse a point
                    # that is read: the value is not used there.
                    per_iteration: list[tuple | None] = [None] * trips
                    for n, point in zip(r.iterations.tolist(), points):
                        per_iteration[n] = point
                    whole = self.stores[key].stacked([points[0] if p is None else p for p in per_iteration])
                    stacked.append(whole if whole is not None else
                                   self._stack([None if p is None else read(p) for p in per_iteration]))
                    slot_row.append(_Slot("stacked", len(stacked) - 1))
                elif sources == {BODY} and not first_from_store:
                    slot_row.append(_Slot("body", key))
                elif sources == {CARRY}:
                    if first_from_store:
                        point = r.points()[0]
                        if init_points.setdefault(key, point) != point:
                            raise _Unlowerable(f"{self.execs[pos][0].name} starts from two stored "
                                               f"points of {r.edge.src.name}")
                        init[key] = read(point)
                    slot_row.append(_Slot("carry", key))
                else:
                    where = sorted(SOURCES[s] for s in sources)
                    raise _Unlowerable(f"{self.execs[pos][0].name} reads {r.edge.src.name} from {where}")
            slots.append(tuple(slot_row))
        return tuple(slots), consts, stacked, init

    def _made_and_freed(self, runs: list, frees: list, made: dict) -> tuple[dict[int, _Made], list]:
        """The points each body op makes and whether the loop frees each (those are not
        written to point stores), and the frees of points made before the loop (done after
        it)."""
        freed = {op_id: np.zeros(len(runs[pos][0]), bool) for op_id, (pos, _, _) in made.items()}
        later = []
        for op, iterations, coords in frees:
            count = len(iterations)
            found = made[op.id][2].find(coords, count) if op.id in made else np.full(count, -1)
            if (found >= 0).any():
                freed[op.id][found[found >= 0]] = True
            outside = found < 0
            later += [(op, p) for p in _tuples(tuple(c[outside] for c in coords), int(outside.sum()))]
        points = {op_id: _Made(runs[pos][0].tolist(), _tuples(runs[pos][1], len(runs[pos][0])),
                               freed[op_id].tolist())
                  for op_id, (pos, _, _) in made.items()}
        return points, later

    def _stack(self, values: list[Any]) -> Any:
        """Per-iteration values as one array; iterations that do not read it get zeros."""
        like = next(v for v in values if v is not None)
        zeros = self.backend.zeros(like.shape, like.dtype)
        return self.backend.stack([zeros if v is None else v for v in values])

    def _run_lowered(self, plan: _Plan) -> None:
        fn = self.traced.get(plan.signature)
        args = (plan.consts, plan.stacked, plan.branches, plan.carry_init)
        if fn is None:
            begin = time.perf_counter()
            try:
                fn = self.backend.jax.jit(self._scan(plan)).lower(*args).compile()
            except Exception as err:  # a kernel that does not trace inside a scan
                raise _Unlowerable(f"the scan did not compile: {type(err).__name__}: {err}") from err
            self._compiling = time.perf_counter() - begin
            self.choice.compile_seconds += self._compiling
            self.traced[plan.signature] = fn
        last, outputs = fn(*args)
        if self.wait_for_outputs:
            self.backend.synchronize((last, outputs))
        for key in plan.finals:
            made = plan.made[key[0]]
            self.stores[key].write(made.points[made.rows.index(plan.trips - 1)], last[key])
        for key, values in zip(plan.exported, outputs):
            made = plan.made[key[0]]
            if key in self.blocks:  # every row, then the frees: a block is released when
                self.stores[key].write_rows(made.points, values, made.rows)  # all its rows
                for point, freed in zip(made.points, made.freed):  # were written and freed
                    if freed:
                        self.stores[key].free(point)
            else:
                kept = [(n, p) for n, p, freed in zip(made.rows, made.points, made.freed) if not freed]
                self.stores[key].write_rows([p for _, p in kept], values, [n for n, _ in kept])
        for op, point in plan.frees:
            for k in range(len(op.outputs)):
                self.stores[(op.id, k)].free(point)

    def _scan(self, plan: _Plan) -> Callable:
        """The loop as a function of the plan's values, for ``jax.jit``."""
        jax, xp = self.backend.jax, self.backend.xp
        slots, exported, runs = plan.slots, plan.exported, plan.runs
        carried = sorted({*plan.carries, *plan.finals})
        merges = [pos for pos, (op, _) in enumerate(self.execs) if op.kind == "merge"]
        kernels = [(op, op.definition.kernel, resolve_params(op.params, self.bounds))
                   for op, _ in self.execs]

        def run(consts: list, stacked: list, branches: list, init: dict) -> Any:
            def step(carry: dict, xs: tuple) -> tuple[dict, tuple]:
                per_step, branch = xs
                values: dict[tuple[int, int], Any] = {}

                def value(slot: _Slot) -> Any:
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
                        values[(op.id, 0)] = out
                        continue
                    outs = kernel(xp, params, *(value(s) for s in row))
                    for k, out in enumerate(outs if op.definition.multi_output else (outs,)):
                        values[(op.id, k)] = out
                return {key: values[key] for key in carried}, tuple(values[key] for key in exported)
            return jax.lax.scan(step, init, (stacked, branches))
        return run


def _interpreter(loop: ast.Loop, outer: list[str]) -> Callable[..., None]:
    """The loop as interpreted Python: ``fn(namespace, *outer counters)``."""
    def call(stmt: ast.Stmt) -> str:
        return f"ns[{stmt.name!r}](({''.join(e.to_python() + ', ' for e in stmt.index)}))"
    source = "\n".join([f"def loop({', '.join(['ns', *outer])}):", *ast.to_python(loop, call, indent=1)])
    scope: dict[str, Any] = {"min": min, "max": max}
    exec(compile(source, "<tempo loop>", "exec"), scope)  # noqa: S102 - generated code
    return scope["loop"]
