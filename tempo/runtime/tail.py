"""Late sinks: the host ops that only feed sinks run one occurrence late.

On an asynchronous backend (JAX; on a CPU unless dispatch is synchronous, as tempo_rl
chooses for host envs) the device works through what the program dispatched while the
host goes on, until a host op reads a device value: then the host waits for the
device, and the device waits for the host's next dispatch. A training iteration ends in
such host work: PPO's metrics sink, its checkpoint sink and the env's record of the
iteration's episodes read the values the iteration just computed, so every iteration
drained the device before the next one was dispatched.

The *tail* of a program is its host ops that nothing but the tail reads (sinks, which
read nothing back, UDFs read only by sinks, and anything else whose values only the tail
or the run's outputs read), with the device ops and merges that read only the tail. A
tail op's statement does not run where the program reaches it: it is queued, with the
values it reads from outside the tail (read there, so later frees do not touch them, and
on an accelerator their copies to host memory start there: ``copy_to_host_ahead``), and
runs when the program reaches the same statement again, or at the end of the run. The
frees of the tail's values are queued behind it. So each tail op runs one occurrence
late, after the next iteration's device work was dispatched, and its ``to_host`` finds
the values ready.

Every other host op first runs what is queued: host ops (and the Python state they keep,
such as an env's episode counts) still run in the program's order among themselves; only
the device work moves ahead of the tail (so a sink that reads the run's memory counters or
the clock sees them one iteration on). A statement that runs once every few iterations (a
checkpoint sink) runs when the next host op outside the tail, a later occurrence of a
tail statement queued after it, or the end of the run comes. A run that fails runs what
was queued before the failure, as the program had reached it (work that itself fails
drops what was queued after it); an interrupt (``KeyboardInterrupt``) drops the queue.

Excluded from the tail: ``tp.stop_when`` (it decides what runs next), point ops, UDFs
over a dim split over processes, ops in lowered loops, and host ops reading a value some
device kernel donates (the queued reference must outlive the read). A program with a
loop lowered in spans (whose sinks wait for spans already), over a mesh or run with a
``RunProfile`` has no late work. A tail host op that reads a slice of a point store still
reads it on the host where the program reaches it (the host reader stacks the points
there, waiting for them).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from tempo.ir.graph import SDG, Edge, Op
from tempo.runtime.plan import point_op
from tempo.symbolic.expr import FALSE, Expr

Work = Callable[[], None]
Launcher = Callable[[tuple[int, ...]], None]


@dataclass(frozen=True)
class Tail:
    """The ops that run late. ``host``: host ops, whose reads from outside the tail are
    made where the program reaches them; ``whole``: the others (every input in the tail),
    run late as a whole."""

    host: frozenset[int]
    whole: frozenset[int]

    def __contains__(self, op_id: int) -> bool:
        return op_id in self.host or op_id in self.whole

    def __bool__(self) -> bool:
        return bool(self.host)


NO_TAIL = Tail(frozenset(), frozenset())


def host_tail(graph: SDG, last_reads: dict[Edge, Expr], excluded: Collection[int]) -> Tail:
    """The largest tail of ``graph`` (see the module): ops outside ``excluded`` every
    reader of which is in it, host ops reading no value a kernel donates
    (``last_reads``), other ops reading only the tail's values. An op leaves it when it
    does not fit, and its inputs' makers are checked again (a worklist: linear in the
    graph's edges, each op checked again only when a neighbour leaves)."""
    donated = {(e.src.id, e.src_out) for e, cond in last_reads.items() if cond is not FALSE}
    readers = graph.consumers()
    tail = {op.id for op in graph.ops.values() if op.id not in excluded and _may_lag(op)}
    pending = list(tail)
    while pending:
        op_id = pending.pop()
        if op_id in tail and not _fits(graph.ops[op_id], graph, readers[op_id], tail, donated):
            tail.discard(op_id)  # its makers now have a reader outside, its readers an input
            pending.extend(e.src.id for e in graph.in_edges(graph.ops[op_id]) if e.src.id in tail)
            pending.extend(e.sink.id for e in readers[op_id] if e.sink.id in tail)
    host = frozenset(k for k in tail if graph.ops[k].definition.host)
    return Tail(host, frozenset(tail - host)) if host else NO_TAIL


def _may_lag(op: Op) -> bool:
    if not op.definition.host:
        return True
    return not point_op(op) and not op.params.get("stops") and op.params.get("rows_of") is None


def _fits(op: Op, graph: SDG, readers: list[Edge], tail: set[int], donated: set[tuple[int, int]]) -> bool:
    if any(e.sink.id not in tail for e in readers):
        return False
    inputs = graph.in_edges(op)
    if op.definition.host:
        return all(e.src.id in tail or (e.src.id, e.src_out) not in donated for e in inputs)
    return all(e.src.id in tail for e in inputs)


class Lag:
    """A run's queue of late work, in program order. Work that fails drops what was queued
    after it (the program would not have reached that)."""

    def __init__(self) -> None:
        self._queue: list[tuple[str | None, Work]] = []

    def defer(self, name: str, work: Work) -> None:
        """Queue statement ``name``'s work, after running what is queued up to and
        including its previous occurrence."""
        last = next((n for n in range(len(self._queue) - 1, -1, -1) if self._queue[n][0] == name), -1)
        if last >= 0:
            due, self._queue = self._queue[:last + 1], self._queue[last + 1:]
            self._run(due)
        self._queue.append((name, work))

    def behind(self, work: Work) -> None:
        """Run ``work`` after what is queued (now, if nothing is)."""
        if self._queue:
            self._queue.append((None, work))
        else:
            work()

    def catch_up(self) -> None:
        """Run everything queued, in order."""
        while self._queue:
            due, self._queue = self._queue, []
            self._run(due)

    def drop(self) -> None:
        """Forget what is queued (an interrupted run)."""
        self._queue = []

    def _run(self, due: list[tuple[str | None, Work]]) -> None:
        for _, work in due:
            try:
                work()
            except BaseException:
                self._queue = []
                raise


def lagging(name: str, launch: Launcher, lag: Lag) -> Launcher:
    """``launch`` (a tail op's whole statement) run one occurrence late."""
    def launch_late(point: tuple[int, ...]) -> None:
        lag.defer(name, lambda: launch(point))
    ahead = getattr(launch, "compile_ahead", None)  # (a block launcher's: see executable)
    if ahead is not None:
        launch_late.compile_ahead = ahead  # type: ignore[attr-defined]
    return launch_late


def freed_behind(free: Launcher, lag: Lag) -> Launcher:
    """``free`` (of a tail op's values) run behind the queued work that reads them."""
    return lambda point: lag.behind(lambda: free(point))


def in_order(launch: Launcher, lag: Lag) -> Launcher:
    """``launch`` (a host op outside the tail) after everything queued."""
    def launch_in_order(point: tuple[int, ...]) -> None:
        lag.catch_up()
        launch(point)
    return launch_in_order
