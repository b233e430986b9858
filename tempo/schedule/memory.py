"""Memory policy: where stored tensors wait, and which kernels reuse their inputs' memory.

The schedule frees every point right after its last use. What remains to decide is where
a point waits between its production and its reads, and whether its last reader may
reuse its buffer.

Swapping. A point read inside the loop that produced it is used again soon; one read only
after that loop has finished (a rollout's observations, read by the learning phase after
the acting loop) waits for the whole loop. With ``swap`` on, such points of tensors at
least ``swap_min_bytes`` large are moved to host memory when written and back to the
device when read, so device memory holds only what the current loop needs. Slices of the
innermost dim are already host blocks (see ``tempo.runtime.stores``); on the NumPy
backend everything is host memory and swapping changes nothing.

Donation. On the JAX backend, a kernel whose read of a point is that point's last use
(``Schedule.last_reads``: the free that the schedule places right after the read) donates
the buffer to XLA, which writes an output of the same shape and dtype into it instead of
allocating one: parameters and optimizer state are updated in place, a recurrent state
``s[t-1] -> s[t]`` lives in one buffer. ``donation_candidates`` picks the edges worth
asking the schedule about; the runtime donates at a point only where the schedule says
the read is the last one and no other store holds the same array (a merge keeps the value
it selects under a second name until its branch's point is freed).

Windows. A tensor read only through slices of its innermost dim that move with the
reader, each at most ``w`` points (``k[max(0, t-w+1):t+1]``), needs only its last ``w``
points at a time: ``window_widths`` finds them, and the runtime keeps each in a ring
(``tempo.runtime.stores.WindowStore``) instead of a buffer of the whole dim.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import numpy as np

from tempo.ir.graph import SDG, Edge, Op, has_static_shapes
from tempo.ir.ops import param_symbols
from tempo.ir.types import TensorType
from tempo.options import MemoryPolicy
from tempo.schedule import ast
from tempo.schedule.scheduler import Schedule
from tempo.symbolic.expr import Slice, Symbol, compile_function


def swapped_ops(graph: SDG, schedule: Schedule, policy: MemoryPolicy,
                sizes: dict[int, int | None]) -> set[int]:
    """Ids of the ops whose points ``policy`` keeps in host memory: points that outlive
    the innermost loop producing them, at least ``swap_min_bytes`` per point (``sizes``:
    bytes per point of each op's outputs, None when they vary)."""
    if not policy.swap:
        return set()
    made, freed = _enclosing_loops(schedule, "exec"), _enclosing_loops(schedule, "free")
    consumers = graph.consumers()
    out = set()
    for op in graph.ops.values():
        size = sizes.get(op.id)
        if size is None or size < policy.swap_min_bytes:
            continue
        readers = {e.sink.id for e in consumers[op.id]}
        if _outlives_its_loop(op, readers, made, freed.get(op.id, [])):
            out.add(op.id)
    return out


def donation_candidates(graph: SDG, bounds: dict[Symbol, int], kept: set[tuple[int, int]],
                        min_bytes: int = 0) -> list[Edge]:
    """The edges whose values their sink could take over: the sink is a device kernel with
    static shapes and params, the edge reads one point (at least ``min_bytes`` large) of an
    op whose points are freed during the run, and an output of the sink has that value's
    shape and dtype (XLA reuses a donated buffer only for such an output; each output
    takes at most one)."""
    known = set(bounds)
    out = []
    for op in graph.ops.values():
        if op.kind in ("merge", "sum_readers") or op.definition.host:
            continue
        edges = graph.in_edges(op)
        if param_symbols(op.params) & set(op.domain) or not has_static_shapes(op, edges, known):
            continue
        free = [_layout(t, bounds) for t in op.outputs]
        for edge in edges:
            src = edge.src
            if edge.slices or not src.domain or (src.id, edge.src_out) in kept:
                continue
            layout = _layout(src.outputs[edge.src_out], bounds)
            if layout in free and np.prod(layout[0]) * np.dtype(layout[1]).itemsize >= min_bytes:
                free.remove(layout)
                out.append(edge)
    return out


def _layout(t: TensorType, bounds: dict[Symbol, int]) -> tuple:
    return tuple(int(d.evaluate(bounds)) for d in t.shape), np.dtype(t.dtype).str


def point_bytes(op: Op, bounds: dict) -> int | None:
    """Bytes of one point of ``op``'s outputs, or None when a shape varies with the point."""
    sizes = [t.nbytes(bounds) for t in op.outputs]
    return None if None in sizes else sum(sizes)


def _outlives_its_loop(op: Op, readers: set[int], made: dict[int, list[tuple[int, ...]]],
                       frees: list[tuple[int, ...]]) -> bool:
    """Whether points of ``op`` wait past the loop that makes them: none is freed inside
    that loop (a loop's peeled last iteration, which reads one point made in the loop, is
    outside it but does not make the loop's points wait), or, for points never freed
    during the run, a reader is outside it."""
    for path in made.get(op.id, []):
        if not path:
            continue
        innermost = path[-1]
        if frees:
            if not any(innermost in free for free in frees):
                return True
        elif any(innermost not in reader for k in readers for reader in made.get(k, [])):
            return True
    return False


def _enclosing_loops(schedule: Schedule, kind: str) -> dict[int, list[tuple[int, ...]]]:
    """For each op, the loops (by position in the AST) around each of its statements of
    ``kind`` (``exec`` or ``free``), outermost first."""
    out: dict[int, list[tuple[int, ...]]] = {}
    for name, path in _statement_paths(schedule.root, ()):
        stmt = schedule.statements[name]
        if stmt.kind == kind:
            out.setdefault(stmt.op.id, []).append(path)
    return out


def _statement_paths(node: ast.Node, path: tuple[int, ...]) -> Iterator[tuple[str, tuple[int, ...]]]:
    if isinstance(node, ast.Stmt):
        yield node.name, path
    elif isinstance(node, ast.Seq):
        for child in node.body:
            yield from _statement_paths(child, path)
    elif isinstance(node, ast.If):
        yield from _statement_paths(node.then, path)
        if node.orelse is not None:
            yield from _statement_paths(node.orelse, path)
    else:
        yield from _statement_paths(node.body, (*path, id(node)))


def window_widths(graph: SDG, bounds: dict[Symbol, int], bound_of: dict[Symbol, Symbol],
                   outputs: Collection[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """The outputs of ops that go in a ``WindowStore`` (read through slices of their
    innermost dim, each at most ``w`` points with ``2w`` under the dim's bound, and not a
    program output, which keeps every point), with ``w``."""
    consumers = graph.consumers()
    widths = {}
    for op in graph.ops.values():
        if not op.domain:
            continue
        length = bounds[bound_of[op.domain[-1]]]
        for k in range(len(op.outputs)):
            readers = [e for e in consumers[op.id] if e.src_out == k]
            if (op.id, k) in outputs or not any(e.slices_innermost for e in readers):
                continue
            width = _widest_window(readers, bounds, bound_of)
            if width is not None and 2 * width < length:
                widths[(op.id, k)] = width
    return widths


def _widest_window(readers: list[Edge], bounds: dict[Symbol, int],
                   bound_of: dict[Symbol, Symbol]) -> int | None:
    """The most consecutive points of the innermost dim any reader sees at once, when every
    reader reads points or slices that move with one of its dims, slices whose size
    depends on one dim at most (a window ``x[max(0, t-w+1):t+1]`` over ``t``); None
    otherwise (a fixed point such as ``x[0]`` would stay alive while the window moves on)."""
    widest = 1
    for edge in readers:
        entry = edge.phi[-1]
        if not isinstance(entry, Slice):
            if not entry.symbols() - set(bounds):  # a fixed point (x[0], x[T-1]): kept long
                return None
            continue
        if not entry.start.symbols() - set(bounds):  # a slice that does not move (x[0:3])
            return None
        size = entry.size  # a padded read's rows past its points are buffer rows too
        free = [s for s in size.symbols() if s not in bounds]
        if len(free) > 1:
            return None
        if not free:
            widest = max(widest, int(size.evaluate(bounds)))
            continue
        dim = free[0]
        if dim not in bound_of or bound_of[dim] not in bounds:
            return None
        size_at = compile_function([size], [dim], bounds)
        widest = max([widest, *(int(size_at(v)[0]) for v in range(bounds[bound_of[dim]]))])
    return widest
