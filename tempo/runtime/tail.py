"""Late sinks: the host ops that only feed sinks run one occurrence late.

On an asynchronous backend (JAX) the device works through what the program dispatched
while the host goes on, until a host op reads a device value: then the host waits for the
device, and the device waits for the host's next dispatch. A training iteration ends in
such host work: PPO's metrics sink, its checkpoint sink and the env's record of the
iteration's episodes read the values the iteration just computed, so every iteration
drained the device before the next one was dispatched.

The *tail* of a program is its host ops that nothing but the tail reads (sinks, which
read nothing back, and UDFs read only by sinks), with the device ops and merges that read
only the tail. A tail op's statement does not run where the program reaches it: it is
queued, with the values it reads from outside the tail (read there, so later frees do not
touch them), and runs when the program reaches the same statement again, or at the end of
the run. The frees of the tail's values are queued behind it. So each tail op runs one
occurrence late, after the next iteration's device work was dispatched, and its
``to_host`` finds the values ready.

Every other host op first runs what is queued: host ops (and the Python state they keep,
such as an env's episode counts) still run in the program's order among themselves; only
the device work moves ahead of the tail. Excluded from the tail: ``tp.stop_when`` (it
decides what runs next), UDFs over a dim split over processes, ops in loops lowered in
spans (their sinks wait for spans already), and host ops reading a value some device
kernel donates (the queued reference must outlive the read).
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
    (``last_reads``), other ops reading only the tail's values."""
    donated = {(e.src.id, e.src_out) for e, cond in last_reads.items() if cond is not FALSE}
    tail = {op.id for op in graph.ops.values() if op.id not in excluded and _may_lag(op)}
    changed = True
    while changed:
        changed = False
        for op_id in list(tail):
            op = graph.ops[op_id]
            if not _fits(op, graph, tail, donated):
                tail.discard(op_id)
                changed = True
    host = frozenset(k for k in tail if graph.ops[k].definition.host)
    return Tail(host, frozenset(tail - host)) if host else NO_TAIL


def _may_lag(op: Op) -> bool:
    if not op.definition.host:
        return True
    return not point_op(op) and not op.params.get("stops") and op.params.get("rows_of") is None


def _fits(op: Op, graph: SDG, tail: set[int], donated: set[tuple[int, int]]) -> bool:
    if any(e.sink.id not in tail for e in graph.out_edges(op)):
        return False
    inputs = graph.in_edges(op)
    if op.definition.host:
        return all(e.src.id in tail or (e.src.id, e.src_out) not in donated for e in inputs)
    return all(e.src.id in tail for e in inputs)


class Lag:
    """A run's queue of late work, in program order."""

    def __init__(self) -> None:
        self._queue: list[tuple[str | None, Work]] = []

    def defer(self, name: str, work: Work) -> None:
        """Queue statement ``name``'s work, after running what is queued up to and
        including its previous occurrence."""
        last = next((n for n in range(len(self._queue) - 1, -1, -1) if self._queue[n][0] == name), -1)
        if last >= 0:
            due, self._queue = self._queue[:last + 1], self._queue[last + 1:]
            for _, earlier in due:
                earlier()
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
            for _, earlier in due:
                earlier()

    def drop(self) -> None:
        self._queue = []


def lagging(name: str, launch: Launcher, lag: Lag) -> Launcher:
    """``launch`` (a tail op's whole statement) run one occurrence late."""
    return lambda point: lag.defer(name, lambda: launch(point))


def freed_behind(free: Launcher, lag: Lag) -> Launcher:
    """``free`` (of a tail op's values) run behind the queued work that reads them."""
    return lambda point: lag.behind(lambda: free(point))


def in_order(launch: Launcher, lag: Lag) -> Launcher:
    """``launch`` (a host op outside the tail) after everything queued."""
    def launch_in_order(point: tuple[int, ...]) -> None:
        lag.catch_up()
        launch(point)
    return launch_in_order
