"""The memory a schedule will need, predicted before it runs.

Walks the schedule's statement instances in execution order (``Executable.execution_order``)
and counts what the tensor stores will hold, the way ``tempo.runtime.stores`` counts it
while the program runs: a point store holds a point's bytes from its write to its free; a
block store holds a buffer of ``T`` rows per prefix point from the first row written until
every row has been written and freed; swapped points and blocks are host memory, other
points the backend's (the device, on JAX); a point whose shape varies with the point
counts the bytes of its shape there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from tempo.ir.graph import Op
from tempo.runtime.stores import BlockStore, Bytes, PointStore, SwappedStore
from tempo.symbolic.expr import Symbol


@dataclass
class Footprint:
    """Predicted peak bytes held by the stores on the device and in host memory."""

    device: Bytes = field(default_factory=Bytes)
    host: Bytes = field(default_factory=Bytes)

    def __str__(self) -> str:
        return (f"predicted peak memory of stored points: {self.device.peak / 2**20:.1f} MiB on the "
                f"device, {self.host.peak / 2**20:.1f} MiB in host memory")


def predict(order: Iterable[tuple[str, Op, tuple[int, ...], tuple[int, ...]]], stores: dict,
            bounds: dict[Symbol, int]) -> Footprint:
    """The footprint of running ``order`` (``(kind, op, outputs, point)`` per statement
    instance) with ``stores`` (the stores a run makes; nothing is written to them)."""
    out = Footprint()
    sizes: dict[tuple[int, int], int] = {}  # bytes of each live point whose shape varies
    live: dict[tuple[int, int], set] = {}
    blocks: dict[tuple[int, int], dict[tuple, tuple[set, set]]] = {}
    for kind, op, outputs, point in order:
        for k in outputs:
            key = (op.id, k)
            store = stores[key]
            if isinstance(store, BlockStore):
                _block_step(out.host, store, blocks.setdefault(key, {}), kind, point)
            elif isinstance(store, PointStore):
                counter = out.host if isinstance(store, SwappedStore) else out.device
                held = live.setdefault(key, set())
                if kind == "exec" and point not in held:
                    held.add(point)
                    size = store.point_bytes
                    if size is None:
                        size = sizes[(*key, *point)] = _varying_bytes(op, k, point, bounds)
                    counter.add(size)
                elif kind == "free" and point in held:
                    held.discard(point)
                    size = store.point_bytes
                    counter.add(-(size if size is not None else sizes.pop((*key, *point))))
    return out


def _block_step(counter: Bytes, store: BlockStore, buffers: dict, kind: str, point: tuple) -> None:
    """A write or free of ``point`` in a block store: a buffer per prefix, allocated at its
    first write, released once every row was written and freed (as ``BlockStore`` does)."""
    prefix, row = point[:-1], point[-1]
    size = store.length * _row_bytes(store)
    if kind == "exec":
        if prefix not in buffers:
            buffers[prefix] = (set(), set())
            counter.add(size)
        produced, held = buffers[prefix]
        produced.add(row)
        held.add(row)
    elif prefix in buffers:
        produced, held = buffers[prefix]
        held.discard(row)
        if not held and len(produced) == store.length:
            del buffers[prefix]
            counter.add(-size)


def _varying_bytes(op: Op, k: int, point: tuple[int, ...], bounds: dict[Symbol, int]) -> int:
    """Bytes of output ``k`` of ``op`` at ``point``, whose shape depends on it."""
    env = {**bounds, **dict(zip(op.domain, point))}
    t = op.outputs[k]
    return int(np.prod([d.evaluate(env) for d in t.shape], dtype=np.int64)) * np.dtype(t.dtype).itemsize


def _row_bytes(store: BlockStore) -> int:
    return int(np.prod(store.shape, dtype=np.int64)) * np.dtype(store.dtype).itemsize
