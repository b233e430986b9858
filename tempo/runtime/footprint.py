"""The memory a schedule will need, predicted before it runs.

Sees the schedule's statement instances one at a time in execution order (as
``Executable.predicted_footprint`` walks them) and counts what the tensor stores will
hold, the way ``tempo.runtime.stores`` counts it while the program runs: a point store
holds a point's bytes from its write to its free; a block store holds a buffer of ``T``
rows per prefix point from the first row written until every row has been written and
freed; swapped points and host blocks are host memory, other points and device blocks
the backend's (the device, on JAX); a point whose shape varies with the point counts the
bytes of its shape there. Only what the stores would hold is kept, never the list of instances.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tempo.runtime.stores import BlockStore, Bytes, SwappedStore, WindowStore
from tempo.schedule.scheduler import Statement
from tempo.symbolic.expr import Symbol


@dataclass
class Footprint:
    """Predicted peak bytes held by the stores on the device and in host memory."""

    device: Bytes = field(default_factory=Bytes)
    host: Bytes = field(default_factory=Bytes)

    def __str__(self) -> str:
        return (f"predicted peak memory of stored points: {self.device.peak / 2**20:.1f} MiB on the "
                f"device, {self.host.peak / 2**20:.1f} MiB in host memory")


class Prediction:
    """The footprint of statement instances seen one at a time (``visit``), in execution
    order, with ``stores`` (the stores a run makes; nothing is written to them). It keeps
    what the stores would hold, not the instances: memory bounded by the live points."""

    def __init__(self, stores: dict, bounds: dict[Symbol, int]):
        self.stores, self.bounds = stores, bounds
        self.footprint = Footprint()
        self.live: dict[tuple[int, int], dict[tuple, int]] = {}  # bytes of each held point, per store
        self.blocks: dict[tuple[int, int], dict[tuple, tuple[set, set, list]]] = {}

    def visit(self, stmt: Statement, point: tuple[int, ...]) -> None:
        op, kind = stmt.op, stmt.kind
        for k in stmt.freed if kind == "free" else range(len(op.outputs)):
            key = (op.id, k)
            store = self.stores[key]
            if isinstance(store, BlockStore):
                on = self.footprint.device if store.buffers.on_device else self.footprint.host
                _block_step(on, store, self.blocks.setdefault(key, {}), kind, point)
                continue
            counter = self.footprint.host if isinstance(store, SwappedStore) else self.footprint.device
            held = self.live.setdefault(key, {})
            if kind == "exec" and point not in held:
                size = store.point_bytes
                if size is None:  # a shape that depends on the point
                    size = op.outputs[k].nbytes({**self.bounds, **dict(zip(op.domain, point))})
                held[point] = size
                counter.add(size)
            elif kind == "free" and point in held:
                counter.add(-held.pop(point))


def _block_step(counter: Bytes, store: BlockStore, buffers: dict, kind: str, point: tuple) -> None:
    """A write or free of ``point`` in a block store: a buffer per prefix, allocated at its
    first write, released once every row was written and freed (as ``BlockStore`` does).
    A ``WindowStore``'s buffer is its ring (``C`` rows), doubled when more points than
    ``C`` are held at once; a growing one (``BlockStore.step``) holds whole steps up to
    its last written row. Growing holds the old buffer and the new one at once."""
    prefix, row = point[:-1], point[-1]
    ring = isinstance(store, WindowStore)
    if kind == "exec":
        if prefix not in buffers:
            capacity = store.initial if ring else store.held(row) if store.step else store.length
            buffers[prefix] = (set(), set(), [capacity])
            counter.add(_buffer_bytes(store, capacity))
        produced, held, capacity = buffers[prefix]
        produced.add(row)
        held.add(row)
        while ring and len(held) > capacity[0] and capacity[0] < store.length:
            _grow(counter, store, capacity, min(2 * capacity[0], store.length))
        if not ring and store.step and row >= capacity[0]:
            _grow(counter, store, capacity, store.held(row))
    elif prefix in buffers:
        produced, held, capacity = buffers[prefix]
        held.discard(row)
        if not held and len(produced) == store.length:
            del buffers[prefix]
            counter.add(-_buffer_bytes(store, capacity[0]))


def _grow(counter: Bytes, store: BlockStore, capacity: list[int], grown: int) -> None:
    counter.add(_buffer_bytes(store, grown))
    counter.add(-_buffer_bytes(store, capacity[0]))
    capacity[0] = grown


def _buffer_bytes(store: BlockStore, capacity: int) -> int:
    return capacity * _row_bytes(store)


def _row_bytes(store: BlockStore) -> int:
    return int(np.prod(store.shape, dtype=np.int64)) * np.dtype(store.dtype).itemsize
