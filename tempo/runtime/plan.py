"""The plan of one entry into a lowered loop (``tempo.runtime.lowering``).

At each entry the loop's outer counters are known, so every statement instance of the
entry is concrete. The plan resolves every read of every iteration to the iteration that
made its point (the same one: the value flows inside the scan's body; the previous one:
the scan's carry) or to a store (a constant, or one value per iteration, stacked), picks
each merge's branch per iteration, and decides which points the loop keeps and how they
are written back. It is computed for all iterations at once: statement indices, guards,
dependences and branch conditions are compiled for NumPy arrays
(``compile_vectorized``), and a read is matched to the point it names by sorted keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tempo.ir.graph import SDG, Edge, Op
from tempo.runtime.stores import BlockStore
from tempo.schedule import ast
from tempo.schedule.scheduler import Statement
from tempo.symbolic.expr import Symbol, compile_vectorized


def point_op(op: Op) -> bool:
    """A host op without inputs whose value is a function of the point (``OpDef.batched``):
    a lowered loop computes it for all its iterations on the host before its scan, which
    reads the values."""
    return op.definition.batched is not None


@dataclass(frozen=True)
class Slot:
    """Where input ``k`` of a body op comes from: ``body`` (made earlier in the same
    iteration), ``carry`` (made in the previous one), ``const`` (a stored value, the same
    in every iteration), ``stacked`` (a stored value per iteration) or ``unused`` (a merge
    branch that no iteration of this entry takes, or any input of an op that does not run
    in this entry: the scan skips such ops)."""

    kind: str
    key: Any = None  # (op id, output) for body/carry; the input's number for const/stacked


Slots = tuple[tuple[Slot, ...], ...]
"""Per exec of a loop body, per input."""


@dataclass
class Made:
    """The points one body op makes in an entry: the iteration (row) of each, and whether
    the loop also frees it."""

    rows: list[int]
    points: list[tuple]
    freed: list[bool]

    def kept(self) -> tuple[list[int], list[tuple]]:
        """The rows and points the loop does not free (written back after it)."""
        kept = [(n, p) for n, p, freed in zip(self.rows, self.points, self.freed) if not freed]
        return [n for n, _ in kept], [p for _, p in kept]


@dataclass
class Plan:
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
    made: dict[int, Made]                     # op id -> the points it makes
    frees: list[tuple[Op, tuple]]              # frees of points made before the loop

    @property
    def signature(self) -> tuple:
        return (self.slots, self.carries, self.exported, self.finals, len(self.branches), self.trips,
                self.runs)


class Unlowerable(Exception):
    """This entry's reads do not fit a scan; the message says why."""


STORE, BODY, CARRY = 0, 1, 2
"""Where a read's value is, per iteration: a store, this iteration's body, the carry."""
SOURCES = ("store", "body", "carry")


def tuples(coords: tuple[np.ndarray, ...], count: int) -> list[tuple]:
    """Points as tuples, from their coordinates as arrays (``count`` of them)."""
    return list(zip(*(c.tolist() for c in coords))) if coords else [()] * count


class PointIndex:
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
class Reads:
    """The reads of one input of one body op in an entry: iterations, points, sources."""

    edge: Edge
    iterations: np.ndarray
    coords: tuple[np.ndarray, ...]
    sources: np.ndarray

    def points(self) -> list[tuple]:
        return tuples(self.coords, len(self.iterations))


class LoopPlanner:
    """Makes the plans of one lowerable loop's entries; ``batched`` holds the batched
    launchers of its point ops (``Executable``), run while a plan is made."""

    def __init__(self, loop: ast.Loop, outer: tuple[Symbol, ...], statements: dict[str, Statement],
                 graph: SDG, stores: dict, bounds: dict[Symbol, int], backend: Any,
                 batched: dict[str, Callable]):
        self.stores, self.bounds, self.backend, self.batched = stores, bounds, backend, batched
        counters = [*outer, loop.var]
        self.items = [(s.name, statements[s.name], compile_vectorized(s.index, counters),
                       compile_vectorized(guard, counters) if guard else None)
                      for s, guard in ast.guarded_items(loop.body)]
        self.execs = [(st.op, graph.in_edges(st.op)) for _, st, _, _ in self.items
                      if st.kind == "exec" and not point_op(st.op)]
        """The body's ops the scan runs, in order, with their input edges."""
        self.phis = {op.id: [compile_vectorized(e.phi, op.domain, bounds) for e in edges]
                     for op, edges in self.execs}
        self.conds = {op.id: compile_vectorized([e.cond for e in edges], op.domain, bounds)
                      for op, edges in self.execs if op.kind == "merge"}
        self.blocks = {key for key, store in stores.items() if isinstance(store, BlockStore)}
        """Outputs kept in block stores (host buffers): written back whole."""

    def instances(self, outer: tuple[int, ...], steps: range) -> Iterator[tuple[str, Statement,
                                                                                np.ndarray, tuple]]:
        """Per statement of the body: the iterations (numbered from 0) it runs at in this
        entry and its points there, as coordinate arrays."""
        loop_values = np.arange(steps.start, steps.stop, steps.step, dtype=np.int64)
        for name, st, index, guards in self.items:
            iterations = np.arange(len(loop_values))
            if guards is not None:
                iterations = np.flatnonzero(np.logical_and.reduce(guards(*outer, loop_values)))
            yield name, st, iterations, index(*outer, loop_values[iterations])

    def plan(self, outer: tuple[int, ...], steps: range) -> Plan:
        """Every read of every iteration of this entry, resolved to the iteration that
        makes it or to a store; raises ``Unlowerable`` where a scan cannot express it.
        Indices are computed for all iterations at once (``compile_vectorized``)."""
        trips = len(steps)
        runs: list[tuple[np.ndarray, tuple[np.ndarray, ...]]] = []  # per exec: iterations, points
        frees: list[tuple[Op, np.ndarray, tuple[np.ndarray, ...]]] = []
        for name, st, iterations, coords in self.instances(outer, steps):
            if st.kind == "free":
                frees.append((st.op, iterations, coords))
            elif point_op(st.op):  # computed now, read from its store by the scan
                if len(iterations):
                    self.batched[name](coords, tuples(coords, len(iterations)))
            else:
                runs.append((iterations, coords))
        made = {op.id: (pos, runs[pos][0], PointIndex(runs[pos][1], len(runs[pos][0])))
                for pos, (op, _) in enumerate(self.execs) if len(runs[pos][0])}
        branches = {}
        reads: list[list[Reads | None]] = []
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
                       and made_points[key[0]].kept()[0] == [trips - 1])
        for key in (*carries, *finals):
            if key not in init:  # read only where another branch is taken at the first
                out = self.execs[made[key[0]][0]][0].outputs[key[1]]  # iteration, or final only
                init[key] = self.backend.zeros(tuple(int(d.evaluate(self.bounds)) for d in out.shape),
                                               out.dtype)
        return Plan(slots, carries, tuple(k for k in exported if k not in finals), finals, consts,
                    stacked, list(branches.values()), init, trips,
                    tuple(bool(len(it)) for it, _ in runs), made_points, later)

    def _branches(self, op: Op, coords: tuple[np.ndarray, ...], count: int) -> np.ndarray:
        """Per point of a merge, the first branch whose condition holds."""
        holds = np.stack([np.broadcast_to(c, (count,)) for c in self.conds[op.id](*coords)])
        if not holds.any(axis=0).all():
            point = tuples(coords, count)[int(np.argmin(holds.any(axis=0)))]
            raise Unlowerable(f"no branch of {op.name} holds at {point}")
        return holds.argmax(axis=0)

    def _reads(self, pos: int, k: int, edge: Edge, iterations: np.ndarray,
               coords: tuple[np.ndarray, ...], taken: np.ndarray | None, made: dict) -> Reads | None:
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
                raise Unlowerable(f"{self.execs[pos][0].name} reads {edge.src.name} of another iteration")
            sources[(found >= 0) & (at == iterations) & (maker < pos)] = BODY
            sources[(found >= 0) & (at == iterations - 1)] = CARRY
        return Reads(edge, iterations, read, sources)

    def _resolve(self, reads: list[list[Reads | None]], trips: int) -> tuple[Slots, list, list, dict]:
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
                    slot_row.append(Slot("unused"))
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
                        slot_row.append(Slot("const", len(consts) - 1))
                        continue
                    # Iterations that do not read it (a merge branch not taken) reuse a point
                    # that is read: the value is not used there.
                    per_iteration: list[tuple | None] = [None] * trips
                    for n, point in zip(r.iterations.tolist(), points):
                        per_iteration[n] = point
                    whole = self.stores[key].stacked([points[0] if p is None else p for p in per_iteration])
                    stacked.append(whole if whole is not None else
                                   self._stack([None if p is None else read(p) for p in per_iteration]))
                    slot_row.append(Slot("stacked", len(stacked) - 1))
                elif sources == {BODY} and not first_from_store:
                    slot_row.append(Slot("body", key))
                elif sources == {CARRY}:
                    if first_from_store:
                        point = r.points()[0]
                        if init_points.setdefault(key, point) != point:
                            raise Unlowerable(f"{self.execs[pos][0].name} starts from two stored "
                                              f"points of {r.edge.src.name}")
                        init[key] = read(point)
                    slot_row.append(Slot("carry", key))
                else:
                    where = sorted(SOURCES[s] for s in sources)
                    raise Unlowerable(f"{self.execs[pos][0].name} reads {r.edge.src.name} from {where}")
            slots.append(tuple(slot_row))
        return tuple(slots), consts, stacked, init

    def _made_and_freed(self, runs: list, frees: list, made: dict) -> tuple[dict[int, Made], list]:
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
            later += [(op, p) for p in tuples(tuple(c[outside] for c in coords), int(outside.sum()))]
        points = {op_id: Made(runs[pos][0].tolist(), tuples(runs[pos][1], len(runs[pos][0])),
                              freed[op_id].tolist())
                  for op_id, (pos, _, _) in made.items()}
        return points, later

    def _stack(self, values: list[Any]) -> Any:
        """Per-iteration values as one array; iterations that do not read it get zeros."""
        like = next(v for v in values if v is not None)
        zeros = self.backend.zeros(like.shape, like.dtype)
        return self.backend.stack([zeros if v is None else v for v in values])
