"""Memory policy: which stored tensors wait in host memory instead of the device's.

The schedule frees every point right after its last use. What remains to decide is where
a point waits between its production and its reads. A point read inside the loop that
produced it is used again soon; one read only after that loop has finished (a rollout's
observations, read by the learning phase after the acting loop) waits for the whole loop.
With ``swap`` on, such points of tensors at least ``swap_min_bytes`` large are moved to
host memory when written and back to the device when read, so device memory holds only
what the current loop needs. Slices of the innermost dim are already host blocks (see
``tempo.runtime.stores``); on the NumPy backend everything is host memory and swapping
changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tempo.ir.graph import SDG, Op
from tempo.schedule import ast
from tempo.schedule.scheduler import Schedule


@dataclass(frozen=True)
class MemoryPolicy:
    """Where stored points wait between production and use (``conf/memory/*.yaml``)."""

    swap: bool = False
    """Keep points that outlive the loop producing them in host memory (JAX backend)."""
    swap_min_bytes: int = 1 << 20
    """Only tensors at least this large (bytes per point) are swapped."""

    def __post_init__(self) -> None:
        if self.swap_min_bytes < 0:
            raise ValueError(f"swap_min_bytes must be >= 0, got {self.swap_min_bytes}")


def swapped_ops(graph: SDG, schedule: Schedule, policy: MemoryPolicy,
                sizes: dict[int, int | None]) -> set[int]:
    """Ids of the ops whose points ``policy`` keeps in host memory: read outside the
    innermost loop that produces them, and at least ``swap_min_bytes`` per point (``sizes``:
    bytes per point of each op's outputs, None when they vary)."""
    if not policy.swap:
        return set()
    loops = _enclosing_loops(schedule)
    consumers = graph.consumers()
    out = set()
    for op in graph.ops.values():
        size = sizes.get(op.id)
        if size is None or size < policy.swap_min_bytes:
            continue
        readers = {e.sink.id for e in consumers[op.id]}
        if _outlives_its_loop(op, readers, loops):
            out.add(op.id)
    return out


def point_bytes(op: Op, bounds: dict) -> int | None:
    """Bytes of one point of ``op``'s outputs, or None when a shape varies with the point."""
    total = 0
    for t in op.outputs:
        if any(d.symbols() - set(bounds) for d in t.shape):
            return None
        count = int(np.prod([int(d.evaluate(bounds)) for d in t.shape], dtype=np.int64))
        total += count * np.dtype(t.dtype).itemsize
    return total


def _outlives_its_loop(op: Op, readers: set[int], loops: dict[int, list[tuple[int, ...]]]) -> bool:
    produced = loops.get(op.id, [])
    for path in produced:
        if not path:
            continue
        innermost = path[-1]
        if any(innermost not in reader_path for k in readers for reader_path in loops.get(k, [])):
            return True
    return False


def _enclosing_loops(schedule: Schedule) -> dict[int, list[tuple[int, ...]]]:
    """For each op, the loops (by position in the AST) around each of its execution
    statements, outermost first."""
    out: dict[int, list[tuple[int, ...]]] = {}
    for name, path in _statement_paths(schedule.root, ()):
        stmt = schedule.statements[name]
        if stmt.kind == "exec":
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
