"""The plan of one entry into a lowered loop or loop nest (``tempo.runtime.lowering``).

At each entry the outer counters are known, so every statement instance of the entry is
concrete; a nest's iterations are flattened into one sequence (``tempo.runtime.nest``).
The plan resolves every read of every iteration to the value the interpreted program
would read: the latest value its op made up to this point of the iteration (the scan's
body), the latest made before the iteration (the scan's carry), or a store (a constant,
or one value per iteration, stacked). An op that runs at some iterations only (guarded,
or an outer loop's statement in a flattened nest) keeps its latest value in the carry
where a later iteration reads it: the scan's step passes the carry on where the op does
not run. The plan also picks each merge's branch per iteration, and decides which points
the loop keeps and how they are written back. It is computed for all iterations at once:
statement indices, guards, dependences and branch conditions are compiled for NumPy
arrays (``compile_vectorized``), and a read is matched to the point it names by sorted
keys.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from tempo.errors import Unlowerable
from tempo.ir.graph import SDG, Edge, Op
from tempo.runtime.backends import Backend
from tempo.runtime.blocks import KernelBuffers, kernel_buffers
from tempo.runtime.nest import Nest, Space
from tempo.runtime.stores import BlockStore, BufferShape
from tempo.schedule import ast
from tempo.schedule.scheduler import Statement
from tempo.symbolic.expr import Symbol, compile_vectorized, linear_form


def point_op(op: Op) -> bool:
    """A host op without inputs whose value is a function of the point (``OpDef.batched``):
    a lowered loop computes it for all its iterations on the host before its scan, which
    reads the values."""
    return op.definition.batched is not None


@dataclass(frozen=True)
class Slot:
    """Where input ``k`` of a body op comes from: ``body`` (the latest value made up to
    this point of the iteration), ``carry`` (the latest made before the iteration),
    ``const`` (a stored value, the same in every iteration), ``stacked`` (a stored value
    per iteration) or ``unused`` (any input of an op that does not run in this entry: the
    scan skips such ops; a merge's row holds the branches its entry takes only,
    ``_canonical_merges``) or
    ``buffer`` (a slice a block kernel reads from a device buffer the scan carries, see
    ``LoopPlanner.buffered``)."""

    kind: str
    key: Any = None  # (op id, output) for body/carry; the input's number for const/stacked


Slots = tuple[tuple[Slot, ...], ...]
"""Per exec of a loop body, per input."""


@dataclass
class Made:
    """The points one body op makes in an entry: the iteration (row) of each, and whether
    the loop also frees it."""

    rows: list[int]
    coords: tuple[np.ndarray, ...]
    freed: list[bool]

    @cached_property
    def points(self) -> list[tuple]:
        """The points as tuples (only those of values written back are ever needed)."""
        return tuples(self.coords, len(self.rows))

    @cached_property
    def kept_runs(self) -> list[int]:
        """Which of its points (numbered in order) the loop does not free."""
        return [n for n, freed in enumerate(self.freed) if not freed]

    @cached_property
    def kept(self) -> tuple[list[int], list[tuple]]:
        """The rows and points the loop does not free (written back after it)."""
        runs = self.kept_runs
        if len(runs) == len(self.rows):
            return self.rows, self.points
        return [self.rows[n] for n in runs], tuples(tuple(c[runs] for c in self.coords), len(runs))

    @property
    def last(self) -> tuple:
        """The point made at the last of its iterations (a final carry's one kept point)."""
        return tuple(int(c[-1]) for c in self.coords)


@dataclass
class Plan:
    """One entry into the loop, every read resolved: the structure (which decides the
    traced function) and the values to run it with."""

    slots: Slots
    carries: tuple[tuple[int, int], ...]       # outputs read at a later iteration
    masked: tuple[tuple[int, int], ...]        # outputs whose op runs at some iterations only
                                               # and whose latest value the carry keeps
    exported: tuple[tuple[int, int], ...]      # outputs written to their stores afterwards, stacked
    sparse: tuple[tuple[tuple[int, int], int], ...]  # exported outputs whose op runs at some
                                               # iterations only, and at how many: stacked per run
    finals: tuple[tuple[int, int], ...]        # outputs whose one kept point is the last
                                               # iteration's: written from the final carry
    consts: list[Any]
    stacked: list[Any]
    branches: list[Any]                        # per merge of the body: the branch per iteration
                                               # (its place in the merge's row of slots)
    active: list[Any]                          # per masked output: whether its op runs, per iteration
    rows_at: list[Any]                         # per sparse output: per iteration, the row its
                                               # value goes to (one past the last: none)
    carry_init: dict[tuple[int, int], Any]
    zeros: tuple[tuple[int, int], ...]         # carries that start at zeros (no stored point
                                               # gives them): made inside the scan's program
    trips: int
    runs: tuple[bool, ...]                     # per exec of the body: whether it runs in this entry
    made: dict[tuple[int, int], Made]          # (op id, output) -> the points it makes
    frees: list[tuple[Op, tuple[int, ...], list[tuple]]]  # frees (op, outputs, points) of
                                               # points made before the loop

    @cached_property
    def signature(self) -> Signature:
        """What decides its scan's program (the key of compiled scans)."""
        return Signature((self.slots, self.carries, self.masked, self.exported, self.sparse, self.finals,
                          len(self.branches), self.trips, self.runs, self.zeros))

    @property
    def arguments(self) -> tuple:
        """What its scan is called with (``LoopLauncher._scan``'s ``run``)."""
        return self.consts, self.stacked, self.branches, self.active, self.rows_at, self.carry_init


class Signature(tuple):
    """A plan's ``signature``, hashed once: it holds a slot per input of every op of the
    body (PPO's update loop, about 200), and each entry looks its scan up by it. The plans
    of a template's translates share their template's."""

    def __hash__(self) -> int:
        known = self.__dict__.get("hash")
        if known is None:
            known = self.__dict__["hash"] = tuple.__hash__(self)
        return known


STORED, IN_BODY, IN_CARRY = 1, 2, 4
"""Which slots can give a read its value (bits): a stored value (its point is not made in
the loop), the latest value made up to this point of the iteration, the latest made
before the iteration. A stored point read before the loop makes any of its op's points
fits the body or the carry as well: the carry's initial value."""


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
    """The reads of one input of one body op in an entry: iterations, points, the
    iteration that made each (-1: none did) and the slots that fit each (bits)."""

    edge: Edge
    iterations: np.ndarray
    coords: tuple[np.ndarray, ...]
    made_at: np.ndarray
    fits: np.ndarray

    def points(self) -> list[tuple]:
        return tuples(self.coords, len(self.iterations))


    def first(self) -> tuple:
        """The point read at the first of these iterations."""
        return self.first_point

    @cached_property
    def first_point(self) -> tuple:
        """``first()``, computed once (a template's reads are moved at every entry)."""
        return tuple(int(c[0]) for c in self.coords)


@dataclass(frozen=True)
class FirstRead:
    """Of the reads of one input in an entry, the first point only: a constant's or a
    carry's initial value, read once (``LoopPlanner._moved_reads``)."""

    edge: Edge
    point: tuple

    def first(self) -> tuple:
        return self.point


Instances = list[tuple[np.ndarray, tuple[np.ndarray, ...]]]
"""Per statement of a loop body, in an entry: the iterations it runs at (numbered from 0)
and its points there, as coordinate arrays."""

Fetch = tuple[str, int, int, tuple[int, int]]
"""A stored value a plan reads: ``("const" | "stacked" | "init" | "seed", exec position,
input, the output it is a value of)``; a seed's output is the carry it starts
(``LoopPlanner._seeded``)."""

TEMPLATES = 4
"""Planned entries a loop keeps for reuse by later entries (``LoopPlanner.plan``)."""

ANY = None
"""The offset of a statement with no instances in both entries: any offset fits."""


class _MovedRead(NamedTuple):
    """A read of a template that later entries move or check (``_ReadChecks.each``), with
    what doing so looks up, found once per template."""

    pos: int                             # the reader's exec position
    k: int                               # its input
    read: Reads
    maker: int | None                    # the exec position of the op making the point read;
                                         # None: not made in the loop (any offset fits)
    linear: tuple[tuple[int, ...], ...] | None  # the index's coefficients, where it is affine
    kind: str | None                     # how the plan fetches it (``_Template.fetched``); None: it does not


@dataclass
class _ReadChecks:
    """A template's reads, sorted for moving them to a later entry (``_moved_reads``)."""

    shifts: list[tuple[tuple[tuple[int, ...], ...], int, int]]
    """The affine reads of values the loop makes that no store gives, one per kind:
    ``(coefficients, reader, maker)``, an exec position of the reader's index group and of
    the maker's (reads alike in these move alike)."""
    each: list[_MovedRead]
    """The reads moved one by one: those of stored values, and the other reads of values
    the loop makes (an index that is not affine)."""


@dataclass
class _Template:
    """A planned entry with what its plan was made from, for reuse by later entries."""

    groups: Instances                     # per index group of the body: iterations, points
    reads: list[list[Reads | None]]
    taken: dict[int, np.ndarray]          # per merge (exec position): the branch of each point
                                          # (as taken, before ``_seeded``: translates compare it)
    fetches: list[Fetch]
    frees_after: list[tuple[int, np.ndarray, int]]  # the frees after the loop (``_freed_after``)
    plan: Plan                            # its stored values dropped once planned (``plan``)
    checks: _ReadChecks | None = None     # its reads sorted for moving (``_moved_reads``)

    @cached_property
    def fetched(self) -> dict[tuple[int, int], str]:
        """The reads of stored values: ``(exec position, input)``, and their kind (``Fetch``)."""
        return {(pos, k): kind for kind, pos, k, _ in self.fetches}


class LoopPlanner:
    """Makes the plans of one lowerable loop's (or loop nest's) entries, in the run whose
    stores and batched point ops (``Executable``, run while a plan is made) ``bind`` gives.

    An entry's plan is reused from an earlier one (a template) when the entry is that one
    moved in index space: each statement runs at the same iterations, at points offset by a
    constant (the same for an op's execution and its frees), every read names a point
    offset by the offset of the op that makes it (exactly: by the linear part of an affine
    index, or by evaluating a non-affine one), and every merge takes the same branches.
    Which iteration made each value is then the same, and only the stored values (and the
    points written back) are the new entry's. In PPO, entries of the same loop in different
    training iterations are such translates."""

    def __init__(self, loop: ast.Loop, outer: tuple[Symbol, ...], statements: dict[str, Statement],
                 graph: SDG, bounds: dict[Symbol, int], backend: Backend,
                 deferred: frozenset[str] = frozenset()):
        self.bounds, self.backend = bounds, backend
        self.deferred = deferred
        """Sinks the launcher calls after the scan (a loop lowered in spans): not in the
        scan, which writes back every point of the outputs they read (``deferred_keys``)."""
        self.deferred_keys = {(e.src.id, e.src_out) for name in deferred
                              for e in graph.in_edges(statements[name].op)}
        """The outputs the deferred sinks read: the scan frees none of their points, read
        by a sink or not (the launcher frees them after the sinks of their span, which run
        once the next span is on its way: up to two spans of them are kept)."""
        self.stores: dict = {}
        self.batched: dict[str, Callable] = {}
        self.blocks: set[tuple[int, int]] = set()
        self._blocks_known = False
        """Outputs kept in block stores (host buffers): written back whole."""
        self.nest = Nest(loop, outer)
        counters = [*outer, *self.nest.vars]
        self.items: list[tuple[str, Statement, int]] = []
        """Per statement of the body: its name, and its index group."""
        self.indices: list[tuple[tuple[int, int, bool], Callable, Callable | None]] = []
        """Per index group (statements at the same place of the nest with the same index and
        guards, whose instances are the same): the place (``Space.at``), the index and the
        guards, compiled for NumPy arrays."""
        groups: dict[tuple, int] = {}
        for item in self.nest.items:
            s, guard = item.stmt, item.guard
            place = (item.loop, item.after, self.nest.innermost(item.loop))
            key = (place, tuple(map(repr, s.index)), tuple(map(repr, guard)))
            if key not in groups:
                groups[key] = len(self.indices)
                self.indices.append((place, compile_vectorized(s.index, counters),
                                     compile_vectorized(guard, counters) if guard else None))
            self.items.append((s.name, statements[s.name], groups[key]))
        self.item_groups = [group for _, _, group in self.items]
        self.exec_items = [n for n, (name, st, _) in enumerate(self.items)
                           if st.kind == "exec" and not point_op(st.op) and name not in deferred]
        """Per exec, its statement's position among the items."""
        self.execs = [(self.items[n][1].op, graph.in_edges(self.items[n][1].op)) for n in self.exec_items]
        """The body's ops the scan runs, in order, with their input edges."""
        self.positions = {op.id: pos for pos, (op, _) in enumerate(self.execs)}
        self.exec_groups = [self.items[n][2] for n in self.exec_items]
        """Per exec, its index group (execs of one group move by the same offset)."""
        self.point_items = [n for n, (_, st, _) in enumerate(self.items)
                            if st.kind == "exec" and point_op(st.op)]
        """Positions among the items of the point ops, which run on the host as the plan is made."""
        self.frees = [n for n, (_, st, _) in enumerate(self.items) if st.kind == "free"]
        self.free_checks = list(dict.fromkeys(
            (self.items[n][2], self.exec_groups[self.positions[self.items[n][1].op.id]])
            for n in self.frees if self.items[n][1].op.id in self.positions))
        """Per free of a point the loop makes, once per kind: its index group and its op's
        (an entry moves both by one offset, or is no translate)."""
        self.freed_later = {n: tuple(k for k in self.items[n][1].freed
                                     if (self.items[n][1].op.id, k) not in self.deferred_keys)
                            for n in self.frees}
        """Per free statement, the outputs whose points made before the loop it frees after
        it (not those of ``deferred_keys``: the launcher frees them)."""
        self.phis = {op.id: [None if e.slices else compile_vectorized(e.phi, op.domain, bounds)
                             for e in edges] for op, edges in self.execs}
        """Per input of each exec: its index, for NumPy arrays (None: a slice, which only a
        block kernel reads, from a buffer the scan carries)."""
        self.linear = {op.id: [None if e.slices else _linear_index(e.phi, op.domain, bounds) for e in edges]
                       for op, edges in self.execs}
        """Per input of each exec: the coefficients of its index over the op's dims, when affine."""
        self.buffered: dict[int, KernelBuffers] = {}
        """Per exec that reads slices (a loop lowered in spans): the device buffers its
        kernel reads and writes itself, carried by the scan (``bind``: they are the run's
        stores'). Each slice it reads must be such a buffer (``tempo.passes.newest``), else
        the loop does not lower (``_unbuffered`` says why)."""
        self._unbuffered: str | None = None
        self.in_buffers: set[tuple[int, int]] = set()
        """The outputs those kernels write into buffers: no value of the scan's."""
        self.conds = {op.id: compile_vectorized([e.cond for e in edges], op.domain, bounds)
                      for op, edges in self.execs if op.kind == "merge"}
        self.choices = {pos: (self.items[self.exec_items[pos]][2], repr(op.domain),
                              tuple(repr(e.cond) for e in edges))
                        for pos, (op, edges) in enumerate(self.execs) if op.kind == "merge"}
        """Per merge: its index group, dims and conditions (merges alike take the same
        branches)."""
        self.choice_heads = list({choice: pos for pos, choice in reversed(self.choices.items())}.values())
        """The first merge of each kind of ``choices`` (``_taken`` shares its branches with the others)."""
        self.templates: list[_Template] = []
        self.reused = 0
        """Entries whose plan was a template's."""

    def bind(self, stores: dict, batched: dict[str, Callable]) -> None:
        """Plan entries of a run with these stores and batched point ops (templates made in
        earlier runs still serve: they hold no stored value)."""
        if stores and not self._blocks_known:  # which stores are blocks is the same in every run
            self.blocks = {key for key, store in stores.items() if isinstance(store, BlockStore)}
            self._blocks_known = True
        self.stores, self.batched = stores, batched
        self.buffered, self._unbuffered = {}, None
        for pos, (op, edges) in enumerate(self.execs):
            if stores and any(e.slices for e in edges):
                layout = kernel_buffers(op, edges, stores, set(self.bounds))
                shared = {k for k, _ in layout.shared} if layout is not None else set()
                if layout is None or any(e.slices and k not in shared for k, e in enumerate(edges)):
                    self._unbuffered = f"{op.name} reads slices that are not rows of device buffers it writes"
                else:
                    self.buffered[pos] = layout
        self.in_buffers = {(self.execs[pos][0].id, k) for pos, layout in self.buffered.items()
                           for k in layout.written}

    def space(self, outer: tuple[int, ...]) -> Space:
        """The entry's iterations (a nest's, flattened)."""
        return self.nest.space(outer)

    def instances(self, outer: tuple[int, ...], space: Space) -> Iterator[tuple[str, Statement,
                                                                                 np.ndarray, tuple]]:
        """Per statement of the body: the iterations (numbered from 0) it runs at in this
        entry and its points there, as coordinate arrays."""
        for (name, st, _), instance in zip(self.items, self._per_statement(self._groups(outer, space))):
            yield name, st, *instance

    def _groups(self, outer: tuple[int, ...], space: Space) -> Instances:
        """Per index group: the iterations its statements run at, and their points."""
        groups = []
        for place, index, guards in self.indices:
            iterations = space.at(*place)
            counters = [space.counters[v][iterations] for v in self.nest.vars]
            if guards is not None:
                kept = np.flatnonzero(np.logical_and.reduce(guards(*outer, *counters)))
                iterations, counters = iterations[kept], [c[kept] for c in counters]
            groups.append((iterations, index(*outer, *counters)))
        return groups

    def _per_statement(self, groups: Instances) -> Instances:
        """Each statement's instances, from its index group's."""
        return [groups[group] for group in self.item_groups]

    def plan(self, outer: tuple[int, ...], space: Space) -> Plan:
        """Every read of every iteration of this entry, resolved to the iteration that
        makes it or to a store; raises ``Unlowerable`` where a scan cannot express it.
        Point ops run now. The plan is a template's where the entry is a translate of it,
        else made anew (and kept as a template)."""
        if self._unbuffered:
            raise Unlowerable(self._unbuffered)
        trips = space.trips
        groups = self._groups(outer, space)
        instances = self._per_statement(groups)
        for n in self.point_items:
            iterations, coords = instances[n]
            if len(iterations):
                self.batched[self.items[n][0]](coords, tuples(coords, len(iterations)))
        for n, template in enumerate(self.templates):
            plan = self._reuse(template, groups, instances, trips)
            if plan is not None:
                self.templates.insert(0, self.templates.pop(n))
                self.reused += 1
                return plan
        return self._kept(self._plan(groups, instances, trips))

    def ahead(self, outer: tuple[int, ...], space: Space) -> Plan | None:
        """The plan of the entry at ``outer``, made before the run reaches it, with the
        shapes of its stored values (``BufferShape``s) in their place, for its scan to
        compile ahead; kept as a template, which the entry then reuses with the stored
        values. Point ops do not run. None where it cannot be planned so (a span's
        buffers, a read no scan expresses)."""
        if self._unbuffered or self.buffered:
            return None
        groups = self._groups(outer, space)
        try:
            template = self._plan(groups, self._per_statement(groups), space.trips, self._fetch_shapes)
        except Unlowerable:
            return None
        return self._kept(template)

    def _kept(self, template: _Template) -> Plan:
        """``template``'s plan, the template kept first (without the plan's stored values:
        an entry that reuses it reads its own)."""
        self.templates = [template, *self.templates[:TEMPLATES - 1]]
        plan = template.plan
        template.plan = _sharing_signature(replace(plan, consts=[], stacked=[], carry_init={}), plan)
        return plan

    # ---- a new plan ------------------------------------------------------------------------
    def _plan(self, groups: Instances, instances: Instances, trips: int,
              fetch: Callable[..., tuple[list, list, dict]] | None = None) -> _Template:
        runs = [instances[n] for n in self.exec_items]  # per exec: iterations, points
        made = {op.id: (pos, runs[pos][0], PointIndex(runs[pos][1], len(runs[pos][0])))
                for pos, (op, _) in enumerate(self.execs) if len(runs[pos][0])}
        taken = self._taken(runs)
        reads: list[list[Reads | None]] = []
        for pos, (_, edges) in enumerate(self.execs):
            iterations, coords = runs[pos]
            reads.append([None if edge.slices else  # a buffer the scan carries
                          self._reads(pos, k, edge, iterations, coords, taken.get(pos), made)
                          for k, edge in enumerate(edges)])
        self._check_buffer_rows(reads)
        slots, fetches, masked = self._slots(reads)
        slots, fetches, chosen, masked = self._seeded(slots, fetches, taken, runs, masked, trips)
        consts, stacked, init = (fetch or self._fetch)(reads, fetches, trips)
        carries = tuple(sorted({s.key for row in slots for s in row if s.kind == "carry"}))
        made_points, outside = self._made_and_freed(runs, instances, made)
        exported = [(op.id, k) for op, _ in self.execs for k in range(len(op.outputs))
                    if (op.id, k) in made_points and (op.id, k) not in self.in_buffers
                    and (not all(made_points[op.id, k].freed) or (op.id, k) in self.blocks)]
        # A value kept only from its op's last run (the state a loop leaves) comes out as
        # the scan's final carry: slicing one row of a stacked output costs a dispatch.
        finals = tuple(key for key in exported if key not in self.blocks
                       and made_points[key].kept[0] == made_points[key].rows[-1:])
        masked |= {key for key in finals if made_points[key].rows[-1] != trips - 1}
        masked -= self._constant_merges(slots, chosen, runs)
        carried = {*carries, *masked, *finals}
        if any(key not in carried for key in init):  # (a merge seeded a carry and runs throughout)
            fetches = [fetch for fetch in fetches if fetch[0] != "init" or fetch[3] in carried]
            init = {key: value for key, value in init.items() if key in carried}
        # Read only where another branch is taken at the first iteration, or final only.
        zeros = tuple(sorted({key for key in (*carries, *finals, *masked) if key not in init}))
        slots, ordinals = _canonical_merges(slots, chosen, [op.name for op, _ in self.execs])
        branches = [_per_iteration(trips, runs[pos][0], ordinals[pos][branch], 0, np.int32)
                    for pos, branch in chosen.items()]
        active = [_per_iteration(trips, made_points[key].rows, True, False, bool)
                  for key in sorted(masked)]
        stacked_out = tuple(k for k in exported if k not in finals)
        # An op that runs at some iterations only (an outer statement of a nest) comes out
        # stacked per run, not per iteration: the scan writes each run's value at its row.
        sparse = tuple((key, len(made_points[key].rows)) for key in stacked_out
                       if len(made_points[key].rows) < trips)
        rows_at = [_per_iteration(trips, made_points[key].rows, np.arange(count), count, np.int32)
                   for key, count in sparse]
        # Passed to every call of the scan, by this plan and its translates: moved once.
        branches, active, rows_at = ([self.backend.resident(v) for v in values]
                                     for values in (branches, active, rows_at))
        plan = Plan(slots, carries, tuple(sorted(masked)), stacked_out, sparse, finals, consts, stacked,
                    branches, active, rows_at, init, zeros, trips, tuple(bool(len(it)) for it, _ in runs),
                    made_points, self._later(instances, frees_after := self._freed_after(outside)))
        return _Template(groups, reads, taken, fetches, frees_after, plan)

    def _check_buffer_rows(self, reads: list[list[Reads | None]]) -> None:
        """Rows a kernel writes into a buffer are read by nothing else in the loop: the
        scan has no value of them, only the buffer."""
        for row in reads:
            for r in row:
                if r is not None and (r.edge.src.id, r.edge.src_out) in self.in_buffers:
                    raise Unlowerable(f"{r.edge.sink.name} reads a row of {r.edge.src.name} that a kernel "
                                      f"writes into a device buffer")

    def output_type(self, key: tuple[int, int]) -> tuple[tuple[int, ...], str]:
        """The shape and dtype of output ``key`` of a body op."""
        out = self.execs[self.positions[key[0]]][0].outputs[key[1]]
        return tuple(int(d.evaluate(self.bounds)) for d in out.shape), out.dtype

    def _taken(self, runs: list) -> dict[int, np.ndarray]:
        """Per merge, the branch each of its points takes (once per kind of merge)."""
        taken: dict[int, np.ndarray] = {}
        by_choice: dict[tuple, np.ndarray] = {}
        for pos, choice in self.choices.items():
            if choice not in by_choice:
                iterations, coords = runs[pos]
                by_choice[choice] = self._branches(self.execs[pos][0], coords, len(iterations))
            taken[pos] = by_choice[choice]
        return taken

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
        merge: where branch ``k`` is taken), which iteration made each, and which slots
        can give each its value (``STORED``, ``IN_BODY``, ``IN_CARRY``)."""
        if taken is not None:
            iterations, coords = iterations[taken == k], tuple(c[taken == k] for c in coords)
        if not len(iterations):
            return None
        read = self._index(pos, k, coords, len(iterations))
        made_at = np.full(len(iterations), -1, np.int64)
        fits = np.full(len(iterations), STORED, np.int8)
        if edge.src.id in made:
            maker, when, index = made[edge.src.id]
            found = index.find(read, len(iterations))
            made_at = np.where(found >= 0, when[found], -1)
            before = _latest(when, iterations, inclusive=False)
            fits = np.where(found >= 0, 0, STORED) | np.where(made_at == before, IN_CARRY, 0)
            if maker < pos:  # made earlier in the iteration's body
                fits |= np.where(made_at == _latest(when, iterations, inclusive=True), IN_BODY, 0)
            stale = (found >= 0) & (fits == 0)
            if stale.any():
                n = int(np.argmax(stale))
                raise Unlowerable(f"{self.execs[pos][0].name} reads a value of {edge.src.name} that a "
                                  f"later one replaced ({int(iterations[n] - made_at[n])} iterations back)")
        return Reads(edge, iterations, read, made_at, fits.astype(np.int8))

    def _index(self, pos: int, k: int, coords: tuple[np.ndarray, ...], count: int) -> tuple[np.ndarray, ...]:
        """The points input ``k`` of the ``pos``-th body op reads at its points ``coords``."""
        return tuple(c if np.shape(c) == (count,) else np.broadcast_to(c, (count,))
                     for c in self.phis[self.execs[pos][0].id][k](*coords))

    def _slots(self, reads: list[list[Reads | None]]) -> tuple[Slots, list[Fetch], set[tuple[int, int]]]:
        """Each input's slot, the stored values the scan reads (in slot order), and the
        outputs whose latest value the carry must keep where their op does not run (read
        at an iteration, or from a point of the iteration, other than the one before)."""
        fetches: list[Fetch] = []
        counts = {"const": 0, "stacked": 0}
        init_points: dict[tuple[int, int], tuple] = {}
        masked: set[tuple[int, int]] = set()
        slots = []
        for pos, row in enumerate(reads):
            slot_row = []
            for k, r in enumerate(row):
                if r is None:
                    buffered = pos in self.buffered and self.execs[pos][1][k].slices
                    slot_row.append(Slot("buffer") if buffered else Slot("unused"))
                    continue
                key = (r.edge.src.id, r.edge.src_out)
                fits = int(np.bitwise_and.reduce(r.fits))
                if fits & STORED:
                    kind = "const" if all((c == c[0]).all() for c in r.coords) else "stacked"
                    slot_row.append(Slot(kind, counts[kind]))
                    counts[kind] += 1
                    fetches.append((kind, pos, k, key))
                    continue
                if not fits & (IN_BODY | IN_CARRY):
                    raise Unlowerable(f"{self.execs[pos][0].name} reads {r.edge.src.name} "
                                      f"{_mixed(r.fits)}")
                kind = "body" if fits & IN_BODY else "carry"
                stored = (r.fits & STORED) != 0
                if stored.any():  # before the loop made any point: the carry's initial value
                    if init_points.setdefault(key, r.first()) != r.first() or \
                            not all((c[stored] == c[0]).all() for c in r.coords):
                        raise Unlowerable(f"{self.execs[pos][0].name} starts from two stored "
                                          f"points of {r.edge.src.name}")
                    fetches.append(("init", pos, k, key))
                if (r.made_at != (r.iterations if kind == "body" else r.iterations - 1)).any():
                    masked.add(key)
                slot_row.append(Slot(kind, key))
            slots.append(tuple(slot_row))
        return tuple(slots), fetches, masked

    def _seeded(self, slots: Slots, fetches: list[Fetch], taken: dict[int, np.ndarray], runs: list,
                masked: set[tuple[int, int]], trips: int
                ) -> tuple[Slots, list[Fetch], dict[int, np.ndarray], set[tuple[int, int]]]:
        """Merges whose value at the first iteration is a stored one and at every other a
        carry, the carry started from that value instead (a *seed*): the scan then reads
        the carry at every iteration, with no select between the two. Either the merge
        takes a stored value there (its branch), or it does not run there (its point was
        made before the loop: isl peeled it) and the carry of its value keeps it while
        the merge is masked; seeded, it runs at every iteration too. PPO's update loop
        starts its parameters, their Adam moments and its step count from the iteration
        before's (stored points) and carries them over its updates: 37 selects of
        parameter-sized values an update (21 of the first kind, 16 of the second). Only a
        carry that no stored point starts already (``init``), whose every read is of the
        iteration before (not ``masked``), and that one merge alone seeds. Returns the
        slots (a seeded branch's stored read ``unused``, the constants renumbered), the
        fetches (that constant a seed, or the stored value a seed too), the branches each
        merge takes (a seeded merge's: the carry's at every iteration) and the outputs
        masked (no longer a merge that now runs at every iteration)."""
        started = {key: (pos, k) for kind, pos, k, key in fetches if kind == "init"}
        const_of = {(pos, k): n for n, (pos, k) in
                    enumerate((pos, k) for kind, pos, k, _ in fetches if kind == "const")}
        rows, chosen, masked = list(slots), dict(taken), set(masked)
        seeds: dict[tuple[int, int], tuple[int, int]] = {}  # (pos, input) of a stored read -> carry
        for pos, branch in taken.items():
            iterations = runs[pos][0]
            if trips < 2 or len(np.unique(branch[1:])) != 1:
                continue
            later = int(branch[-1])
            carry = rows[pos][later]
            if carry.kind != "carry" or carry.key in started or carry.key in masked \
                    or carry.key in seeds.values():
                continue
            merged = (self.execs[pos][0].id, 0)
            if len(iterations) == trips and rows[pos][int(branch[0])].kind == "const":
                first = int(branch[0])
                seeds[pos, first] = carry.key
                rows[pos] = tuple(Slot("unused") if k == first else slot for k, slot in enumerate(rows[pos]))
                chosen[pos] = np.full(len(branch), later, branch.dtype)
            elif len(iterations) == trips - 1 and iterations[0] == 1 and branch[0] == later \
                    and merged in masked and merged in started:
                seeds[started[merged]] = carry.key
                masked.discard(merged)
        if not seeds:
            return slots, fetches, taken, masked
        kept = [at for at in const_of if at not in seeds]  # the constants left, renumbered
        number = {const_of[at]: n for n, at in enumerate(kept)}
        rows = [tuple(Slot("const", number[slot.key]) if slot.kind == "const" else slot for slot in row)
                for row in rows]
        return tuple(rows), _with_seeds(fetches, seeds), chosen, masked

    def _constant_merges(self, slots: Slots, chosen: dict[int, np.ndarray],
                         runs: list) -> set[tuple[int, int]]:
        """The merges that take one constant (a stored value read at one point) at the first
        iteration and wherever else they run: their value is that constant at every
        iteration, so they may run at every iteration rather than keep it in the carry
        where they do not (``masked``: a select per iteration). PPO's acting loop reads
        its parameters as merges that run at the iteration's first step only: 6 selects
        a step before."""
        return {(self.execs[pos][0].id, 0) for pos, branch in chosen.items()
                if len(runs[pos][0]) and runs[pos][0][0] == 0 and len(np.unique(branch)) == 1
                and slots[pos][int(branch[0])].kind == "const"}

    def _fetch(self, reads: list[list[Reads | FirstRead | None]], fetches: list[Fetch],
               trips: int) -> tuple[list, list, dict]:
        """The stored values the scan reads: constants, per-iteration stacks, carries'
        initial values."""
        consts: list[Any] = []
        stacked: list[Any] = []
        init: dict[tuple[int, int], Any] = {}
        for kind, pos, k, key in fetches:
            r = reads[pos][k]
            assert r is not None
            source = (r.edge.src.id, r.edge.src_out)
            if kind == "stacked":
                assert isinstance(r, Reads)  # (moved whole: ``_moved_reads``)
                stacked.append(self._stacked(source, r, trips))
            elif kind == "const":
                consts.append(self.stores[source].reader(False)(r.first()))
            else:  # (an init's key is its source; a seed's, the carry it starts)
                init[key] = self.stores[source].reader(False)(r.first())
        return consts, stacked, init

    def _fetch_shapes(self, reads: list[list[Reads | FirstRead | None]], fetches: list[Fetch],
                      trips: int) -> tuple[list, list, dict]:
        """What ``_fetch`` would read, as the shapes and dtypes of the values."""
        consts: list[BufferShape] = []
        stacked: list[BufferShape] = []
        init: dict[tuple[int, int], BufferShape] = {}
        for kind, pos, k, key in fetches:
            edge = self.execs[pos][1][k]
            t = edge.src.outputs[edge.src_out]
            shape = tuple(int(d.evaluate(self.bounds)) for d in t.shape)
            if kind == "stacked":
                stacked.append(BufferShape((trips, *shape), t.dtype))
            elif kind == "const":
                consts.append(BufferShape(shape, t.dtype))
            else:
                init[key] = BufferShape(shape, t.dtype)
        return consts, stacked, init

    def _stacked(self, key: tuple[int, int], r: Reads, trips: int) -> Any:
        """The stored points ``r`` reads, one per iteration. Iterations that do not read
        (a merge branch not taken) reuse a point that is read: the value is not used there."""
        points = r.points()
        per_iteration: list[tuple | None] = [None] * trips
        for n, point in zip(r.iterations.tolist(), points):
            per_iteration[n] = point
        store = self.stores[key]
        every = [points[0] if p is None else p for p in per_iteration]
        whole = store.stacked(every)
        if whole is not None:
            return whole
        read = store.reader(False)
        return self.backend.stack([read(p) for p in every])

    def _made_and_freed(self, runs: list, instances: Instances,
                        made: dict) -> tuple[dict[int, Made], dict[int, np.ndarray]]:
        """The points each body op makes and whether the loop frees each (those are not
        written to point stores), and per free statement which of its points were made
        before the loop (freed after it)."""
        keys = {(op_id, k): pos for op_id, (pos, _, _) in made.items()
                for k in range(len(self.execs[pos][0].outputs))}
        freed = {key: np.zeros(len(runs[pos][0]), bool) for key, pos in keys.items()}
        outside = {}
        for n in self.frees:
            st = self.items[n][1]
            iterations, coords = instances[n]
            count = len(iterations)
            found = made[st.op.id][2].find(coords, count) if st.op.id in made else np.full(count, -1)
            if (found >= 0).any():
                for k in st.freed:
                    if (st.op.id, k) not in self.deferred_keys:
                        freed[st.op.id, k][found[found >= 0]] = True
            outside[n] = found < 0
        points = {key: Made(runs[pos][0].tolist(), runs[pos][1], freed[key].tolist())
                  for key, pos in keys.items()}
        return points, outside

    def _freed_after(self, outside: dict[int, np.ndarray]) -> list[tuple[int, np.ndarray, int]]:
        """Per free statement that frees points made before the loop after it (not those
        of ``deferred_keys``: the launcher frees them): its position, which of its
        instances those are, and how many."""
        return [(n, mask, int(mask.sum())) for n, mask in outside.items()
                if self.freed_later[n] and mask.any()]

    def _later(self, instances: Instances, frees: list[tuple[int, np.ndarray, int]]
               ) -> list[tuple[Op, tuple[int, ...], list[tuple]]]:
        """The frees of points made before the loop, done after it: per free of ``frees``
        (``_freed_after``), its op, outputs and points."""
        return [(self.items[n][1].op, self.freed_later[n], _masked_points(instances[n][1], mask, count))
                for n, mask, count in frees]

    # ---- a template's plan -----------------------------------------------------------------
    def _reuse(self, template: _Template, groups: Instances, instances: Instances,
               trips: int) -> Plan | None:
        """The plan of this entry from ``template``'s, if the entry is a translate of it
        (see the class), else None."""
        old = template.plan
        if old.trips != trips:
            return None
        moved = []  # per index group: the offset of its points
        for (was_at, was), (now_at, now) in zip(template.groups, groups):
            if not _same(was_at, now_at):
                return None
            offset = _offset(was, now) if len(now_at) else ANY
            if offset is False:
                return None
            moved.append(offset)
        for freed, making in self.free_checks:
            if moved[freed] is not ANY and moved[making] not in (ANY, moved[freed]):
                return None
        ops = [moved[group] for group in self.exec_groups]  # per exec: the offset of its points
        runs = [instances[n] for n in self.exec_items]
        taken = self._taken(runs)
        if any(not _same(taken[pos], template.taken[pos]) for pos in self.choice_heads):
            return None
        reads = self._moved_reads(template, runs, ops)
        if reads is None:
            return None
        consts, stacked, init = self._fetch(reads, template.fetches, trips)
        made = {key: Made(m.rows, runs[self.positions[key[0]]][1], m.freed)
                for key, m in old.made.items()}
        plan = Plan(old.slots, old.carries, old.masked, old.exported, old.sparse, old.finals, consts,
                    stacked, old.branches, old.active, old.rows_at, init, old.zeros, trips, old.runs, made,
                    self._later(instances, template.frees_after))
        return _sharing_signature(plan, old)

    def _moved_reads(self, template: _Template, runs: list,
                     ops: list) -> list[list[Reads | FirstRead | None]] | None:
        """The template's reads at this entry's points, or None where one of them does not
        move with the op that makes the point it reads. Only the fetched ones (read from
        stores, ``_Template.fetched``) are moved, a constant's or a carry's initial value
        only at its first point; the others are only checked (None), affine ones once per
        kind (``_ReadChecks``)."""
        if template.checks is None:
            template.checks = self._read_checks(template)
        for linear, reader, maker in template.checks.shifts:
            target = ops[maker]
            if target is not ANY and _shifted(linear, ops[reader]) != target:
                return None
        reads: list[list[Reads | FirstRead | None]] = [[None] * len(row) for row in template.reads]
        shifts: dict[tuple, tuple[int, ...]] = {}  # (reads alike, as a model's parameters, move alike)
        for pos, k, r, maker, linear, kind in template.checks.each:
            target = ANY if maker is None else ops[maker]
            if linear is not None:
                offset = ops[pos]
                shift = shifts.get((linear, offset))
                if shift is None:
                    shift = shifts[linear, offset] = _shifted(linear, offset)
                if target is not ANY and shift != target:
                    return None
                if kind != "stacked":  # one stored value: only its first point is read
                    reads[pos][k] = FirstRead(r.edge, tuple(map(operator.add, r.first_point, shift)))
                    continue
                coords = tuple(c + d if d else c for c, d in zip(r.coords, shift))
            else:
                if target is ANY and kind is None:
                    continue  # (nothing to check, nothing to fetch)
                iterations, points = runs[pos]
                if pos in template.taken:
                    chosen = template.taken[pos] == k
                    points = tuple(c[chosen] for c in points)
                coords = self._index(pos, k, points, len(r.iterations))
                if target is not ANY and _offset(r.coords, coords) != target:
                    return None
                if kind is None:
                    continue
            reads[pos][k] = Reads(r.edge, r.iterations, coords, r.made_at, r.fits)
        return reads

    def _read_checks(self, template: _Template) -> _ReadChecks:
        """``template``'s reads sorted for ``_moved_reads``: an affine read of a value the
        loop makes, not fetched, only checks that it moves with its maker, which depends on
        its coefficients and the offsets of the two index groups alone."""
        made, fetched = frozenset(op_id for op_id, _ in template.plan.made), template.fetched
        of_group: dict[int, int] = {}  # per index group: its first exec position
        shifts: dict[tuple, None] = {}
        each = []
        for pos, row in enumerate(template.reads):
            for k, r in enumerate(row):
                if r is None:
                    continue
                src = r.edge.src.id
                linear = self.linear[self.execs[pos][0].id][k]
                if (pos, k) in fetched or (linear is None and src in made):
                    each.append(_MovedRead(pos, k, r, self.positions[src] if src in made else None,
                                           linear, fetched.get((pos, k))))
                elif linear is not None and src in made:
                    reader = of_group.setdefault(self.exec_groups[pos], pos)
                    maker = of_group.setdefault(self.exec_groups[self.positions[src]], self.positions[src])
                    shifts[linear, reader, maker] = None
        return _ReadChecks(list(shifts), each)


def _with_seeds(fetches: list[Fetch], seeds: dict[tuple[int, int], tuple[int, int]]) -> list[Fetch]:
    """``fetches`` with each read of ``seeds`` (``(exec position, input) -> carry``) also a
    seed of its carry: a constant becomes the seed; a masked merge's initial value stays,
    and starts the seeded carry too."""
    out: list[Fetch] = []
    for kind, pos, k, key in fetches:
        carry = seeds.get((pos, k))
        if carry is None or kind != "const":
            out.append((kind, pos, k, key))
        if carry is not None:
            out.append(("seed", pos, k, carry))
    return out


def _sharing_signature(plan: Plan, like: Plan) -> Plan:
    """``plan``, whose structure is ``like``'s, holding ``like``'s signature object: the
    lookups of its scan then find the key by identity."""
    plan.__dict__["signature"] = like.signature
    return plan


def _shifted(linear: tuple[tuple[int, ...], ...], offset: tuple[int, ...]) -> tuple[int, ...]:
    """The offset of the points an affine index (its ``linear`` coefficients) reads, where
    its reader's points move by ``offset``."""
    return tuple(sum(a * d for a, d in zip(coefficients, offset)) for coefficients in linear)


def _canonical_merges(slots: Slots, taken: dict[int, np.ndarray],
                      names: list[str]) -> tuple[Slots, dict[int, np.ndarray]]:
    """Each merge's row as the slots of the branches its entry takes only, in an order of
    their own (kind, then key), and per merge the number of each branch (input) there.

    The scan's program then depends on what the branches read, not on which of a merge's
    inputs they are: PPO's loops start from the initial state at the first training
    iteration and from the iteration before's afterwards, two branches that read a stored
    value each, and both entries run one program (compiled once, not once per branch)."""
    rows = list(slots)
    ordinals = {}
    for pos, chosen in taken.items():
        row = rows[pos]
        used = sorted((k for k, slot in enumerate(row) if slot.kind != "unused"),
                      key=lambda k: (row[k].kind, repr(row[k].key)))
        if not set(np.unique(chosen).tolist()) <= set(used):
            raise Unlowerable(f"{names[pos]} takes a branch the scan has no value of")
        ordinals[pos] = np.zeros(len(row), np.int32)
        ordinals[pos][used] = np.arange(len(used), dtype=np.int32)
        rows[pos] = tuple(row[k] for k in used)
    return tuple(rows), ordinals


def _per_iteration(trips: int, at: Any, values: Any, fill: Any, dtype: Any) -> np.ndarray:
    """An array over an entry's iterations: ``values`` at iterations ``at``, ``fill``
    elsewhere."""
    out = np.full(trips, fill, dtype)
    out[at] = values
    return out


def _latest(when: np.ndarray, iterations: np.ndarray, inclusive: bool) -> np.ndarray:
    """Per iteration, the last of the sorted iterations ``when`` before it (or at it, if
    ``inclusive``), or -1."""
    last = np.searchsorted(when, iterations, side="right" if inclusive else "left") - 1
    return np.where(last >= 0, when[np.maximum(last, 0)], -1)


def _mixed(fits: np.ndarray) -> str:
    """Why no one slot fits a read's values (``Reads.fits``)."""
    if ((fits & STORED) != 0).any():
        return "both from stores and from values the loop made since"
    return "both from this iteration's values and from earlier iterations'"


def _masked_points(coords: tuple[np.ndarray, ...], mask: np.ndarray, count: int) -> list[tuple]:
    """The points of ``coords`` where ``mask`` holds (``count`` of them), as tuples."""
    return tuples(coords if count == len(mask) else tuple(c[mask] for c in coords), count)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.array_equal`` for the integer arrays of plans (iterations, coordinates,
    branches): their bytes compared, about 7x faster on a loop's few dozen points."""
    if type(a) is not np.ndarray or type(b) is not np.ndarray:
        return bool(np.array_equal(a, b))
    if a.shape != b.shape:
        return False
    if a.dtype == b.dtype and a.dtype.kind in "biu":
        return a.tobytes() == b.tobytes()
    return bool(np.array_equal(a, b))


def _offset(was: tuple[np.ndarray, ...], now: tuple[np.ndarray, ...]) -> tuple[int, ...] | bool:
    """The constant offset from points ``was`` to points ``now`` (as many, nonempty), or
    False when they are not a translate."""
    offset = tuple(int(b[0]) - int(a[0]) for a, b in zip(was, now))
    if all(_same(b, a + d if d else a) for a, b, d in zip(was, now, offset)):
        return offset
    return False


def _linear_index(phi: tuple, domain: tuple[Symbol, ...],
                  bounds: dict[Symbol, int]) -> tuple[tuple[int, ...], ...] | None:
    """Per entry of an edge's index, its coefficients over ``domain`` when every entry is
    affine in the domain's dims (bounds are constants), else None."""
    rows = []
    for e in phi:
        form = linear_form(e.substitute(bounds))
        if form is None or set(form[0]) - set(domain):
            return None
        rows.append(tuple(form[0].get(d, 0) for d in domain))
    return tuple(rows)
