"""Tensor stores: where the points of an op's output live between production and free."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tempo.ir.graph import rows_moved

if TYPE_CHECKING:
    from tempo.runtime.backends import Backend

Relative = Callable[[tuple[int, ...]], "tuple[int, ...] | None"]
"""A point (or a buffer's prefix) relative to an iteration, or None where it is not one a
captured iteration touches (``tempo.runtime.capture``)."""


@dataclass
class Bytes:
    """Bytes held now, and at the peak of the current window (the run, unless
    ``restart`` began a new one) and of the whole run."""

    now: int = 0
    peak: int = 0
    earlier: int = 0
    """The highest peak of the windows before the current one."""

    def add(self, nbytes: int) -> None:
        self.now += nbytes
        if self.now > self.peak:
            self.peak = self.now

    @property
    def run_peak(self) -> int:
        return max(self.earlier, self.peak)

    def restart(self) -> int:
        """The current window's peak; a new window begins at what is held now."""
        peak = self.peak
        self.earlier, self.peak = max(self.earlier, peak), self.now
        return peak


@dataclass
class MemoryStats:
    """Stored points alive now and at the peak of a run, and the bytes the stores reference
    in the backend's memory (the device, on JAX) and in host memory (blocks, swapped
    points). A value two stores hold (a placeholder's branch is its source's array) counts
    in both. ``donated`` counts the kernel inputs whose buffers kernels took over
    (``tempo.schedule.memory``), ``donated_bytes`` their size."""

    live: int = 0
    peak: int = 0
    device: Bytes = field(default_factory=Bytes)
    host: Bytes = field(default_factory=Bytes)
    donated: int = 0
    donated_bytes: int = 0
    split: Bytes = field(default_factory=Bytes)
    """Of the device bytes, those of values split over several devices (a program over a
    mesh, ``SplitPointStore``): with a parallel dim split evenly, most of them."""
    over_dims: Bytes = field(default_factory=Bytes)
    """Of the device and host bytes, those of ops with a domain: the points a run keeps
    between iterations (a decoder's keys and values; a training run's parameters, which
    are over its iterations), without values that have no dims (a decoder's weights)."""

    @property
    def device_bytes(self) -> int:
        return self.device.now

    @property
    def peak_device_bytes(self) -> int:
        return self.device.run_peak

    @property
    def host_bytes(self) -> int:
        return self.host.now

    @property
    def peak_host_bytes(self) -> int:
        return self.host.run_peak

    def restart_byte_peaks(self) -> tuple[int, int]:
        """Peak device and host bytes since the previous call (or the run's start); the
        next window begins now (a training run's metrics give each iteration's peaks)."""
        return self.device.restart(), self.host.restart()


class CountedTwice:
    """A store's byte counter that also counts in a second one (``MemoryStats.over_dims``):
    stores ``add`` to it, or set ``now`` and ``peak``."""

    def __init__(self, total: Bytes, part: Bytes):
        self.total, self.part = total, part

    def add(self, nbytes: int) -> None:
        self.total.add(nbytes)
        self.part.add(nbytes)

    @property
    def now(self) -> int:
        return self.total.now

    @now.setter
    def now(self, value: int) -> None:
        part = self.part
        part.now += value - self.total.now
        if part.now > part.peak:
            part.peak = part.now
        self.total.now = value

    @property
    def peak(self) -> int:
        return self.total.peak

    @peak.setter
    def peak(self, value: int) -> None:
        self.total.peak = value


class _Points(dict):
    """A point store's values by point. Points written as rows of a stacked array (a
    lowered loop's output) wait in ``rows`` and are sliced out when first read, so a
    loop's output costs no dispatch per point unless a point is read alone."""

    def __init__(self, take: Callable[[Any, int], Any]) -> None:
        super().__init__()
        self.rows: dict[tuple[int, ...], tuple[Any, int]] = {}
        self.take = take
        self.on_host: dict[int, np.ndarray] = {}
        """Host copies of stacked arrays (by ``id``) whose rows are taken from the copy
        (``PointStore.rows_on_host``)."""

    def __missing__(self, point: tuple[int, ...]) -> Any:
        values, row = self.rows.pop(point)
        host = self.on_host.get(id(values)) if self.on_host else None
        value = self[point] = self.take(values, row) if host is None else host[row]
        return value


class PointStore:
    """One array per point, in the backend's memory. Fast point reads and writes; slice
    reads stack points."""

    rows_axis = 0
    """The axis of a slice read's rows (see ``BlockStore``)."""

    def __init__(self, backend: Backend, stats: MemoryStats, empty: Callable[[tuple[int, ...]], Any],
                 point_bytes: int | None = None):
        self.backend, self.stats, self.empty = backend, stats, empty
        self.bytes = self._counter(stats)
        self.data = _Points(backend.take)
        self.point_bytes = point_bytes
        """Bytes of every point when the shape is static (a JAX array's ``nbytes`` is a
        Python property costing ~2 us, paid at every write and free)."""

    @staticmethod
    def _counter(stats: MemoryStats) -> Bytes:
        return stats.device

    def holds(self, point: tuple[int, ...]) -> bool:
        """Whether ``point`` was written (and not freed)."""
        return point in self.data or bool(self.data.rows) and point in self.data.rows

    @contextlib.contextmanager
    def rows_on_host(self, stacked: Any, host: np.ndarray) -> Iterator[None]:
        """Within the block, points written as rows of ``stacked`` (``write_rows``) and
        read for the first time are taken from ``host``, its copy on the host, instead of
        being sliced on the device (a slice dispatched now would wait for the work
        dispatched since ``stacked`` was made: the next scan, for a loop's sinks)."""
        self.data.on_host[id(stacked)] = host
        try:
            yield
        finally:
            del self.data.on_host[id(stacked)]

    def write(self, point: tuple[int, ...], value: Any) -> None:
        data, count = self.data, self.bytes
        if point in data:  # rewritten
            count.now -= self.point_bytes if self.point_bytes is not None else data[point].nbytes
        else:
            if data.rows and point in data.rows:  # rewritten, a row not yet read
                self.free(point)
            stats = self.stats
            stats.live += 1
            if stats.live > stats.peak:
                stats.peak = stats.live
        data[point] = value
        count.now += self.point_bytes if self.point_bytes is not None else value.nbytes
        if count.now > count.peak:
            count.peak = count.now

    def write_rows(self, points: list[tuple[int, ...]], values: Any, rows: list[int]) -> None:
        """Write row ``rows[n]`` of ``values`` at ``points[n]`` (a lowered loop's stacked
        output). When at least half of its rows are kept they wait as rows of the stacked
        array, sliced out when first read (no dispatch per point); fewer are sliced now,
        so the stacked array is not kept alive for a few rows. Bytes count per row."""
        if 2 * len(rows) < values.shape[0]:
            for point, row in zip(points, rows):
                self.write(point, self.backend.take(values, row))
            return
        data, stats, count = self.data, self.stats, self.bytes
        for point in (data.keys() & points) | (data.rows.keys() & points):  # rewritten
            self.free(point)
        data.rows.update(zip(points, zip(itertools.repeat(values), rows)))  # distinct points
        stats.live += len(points)
        count.now += len(points) * self._row_bytes(values)
        stats.peak = max(stats.peak, stats.live)
        count.peak = max(count.peak, count.now)

    def stacked(self, points: list[tuple[int, ...]]) -> Any | None:
        """The values at ``points`` as one array when they are all rows of one stacked
        array still waiting to be read (one slice or gather instead of a dispatch per
        point), else None."""
        first = self.data.rows.get(points[0]) if points else None
        if first is None:
            return None
        values, rows = first[0], []
        for point in points:
            entry = self.data.rows.get(point)
            if entry is None or entry[0] is not values:
                return None
            rows.append(entry[1])
        if rows == list(range(rows[0], rows[0] + len(rows))):
            return values if len(rows) == values.shape[0] else self.backend.rows(values, rows[0], len(rows))
        return self.backend.take(values, np.asarray(rows))

    def reader(self, slices: bool, host: bool = False) -> Callable[[tuple], Any]:
        """The read function for an edge: point reads are a plain dict lookup; ``host``:
        slices as host arrays (for a reader that runs on the host)."""
        if not slices:
            return self.data.__getitem__
        if host:
            arrays = HostArrays(self.backend.to_host)
            return lambda index: self.read(index, arrays)
        return self.read

    def read(self, index: tuple, arrays: Any = None) -> Any:
        """The value at ``index`` (slices stacked), made with ``arrays`` (the backend's
        stacking, or ``HostArrays``)."""
        if not any(isinstance(i, slice) for i in index):
            return self.data[index]
        arrays = arrays or self.backend
        sizes = padded_sizes(index)
        rows = iter(sizes)
        points = itertools.product(*(range(i.start, i.start + next(rows)) if isinstance(i, slice) else (i,)
                                     for i in index))
        if any(isinstance(i, slice) and i.step is not None for i in index):  # padded: rows past the points
            stops = [i.stop if isinstance(i, slice) else i + 1 for i in index]
            values = [self.data[p] if all(c < stop for c, stop in zip(p, stops)) else None for p in points]
        else:
            if self.data.rows:  # runs of rows of stacked arrays: one slice each, not one per point
                whole = self._joined(list(points), arrays)
                return whole.reshape(sizes + tuple(whole.shape[1:]))
            values = [self.data[p] for p in points]
        present = next((v for v in values if v is not None), None)
        if present is None:
            return self.empty(sizes)
        if any(v is None for v in values):  # rows of a padded slice past its points
            zero = arrays.zeros(tuple(present.shape), str(present.dtype))
            values = [zero if v is None else v for v in values]
        return arrays.stack(values).reshape(sizes + tuple(present.shape))

    def _joined(self, points: list[tuple[int, ...]], arrays: Any) -> Any:
        """The values at ``points``, stacked: each run of points that are rows of one
        stacked array (a lowered loop's output) taken out at once (a slice where the rows
        are consecutive, else one gather: a backward loop's rows, read forward, are in
        reverse order), the other points stacked."""
        rows, parts, singles = self.data.rows, [], []
        run: list = []  # [stacked values, its rows]
        for point in points:
            entry = rows.get(point)
            if entry is not None and run and entry[0] is run[0]:
                run[1].append(entry[1])
                continue
            if run:
                parts.append(_rows_of(arrays, *run))
                run = []
            if entry is None:
                singles.append(self.data[point])
                continue
            if singles:
                parts.append(arrays.stack(singles))
                singles = []
            run = [entry[0], [entry[1]]]
        if run:
            parts.append(_rows_of(arrays, *run))
        if singles:
            parts.append(arrays.stack(singles))
        return parts[0] if len(parts) == 1 else arrays.concatenate(parts)

    def free(self, point: tuple[int, ...]) -> None:
        value = self.data.pop(point, None)
        if value is not None:
            self.stats.live -= 1
            self.bytes.now -= self.point_bytes if self.point_bytes is not None else value.nbytes
        elif point in self.data.rows:
            values, _ = self.data.rows.pop(point)
            self.stats.live -= 1
            self.bytes.now -= self._row_bytes(values)

    def free_many(self, points: list[tuple[int, ...]]) -> None:
        """``free`` at each of ``points`` (a loop's frees, batched): with a static point
        size, as set operations on the stored points."""
        if self.point_bytes is None:
            for point in points:
                self.free(point)
            return
        data, rows = self.data, self.data.rows
        held = data.keys() & points
        waiting = rows.keys() & points if rows else set()  # a point is in one or the other
        deque(map(data.pop, held), maxlen=0)  # pop each, without a Python loop
        deque(map(rows.pop, waiting), maxlen=0)
        freed = len(held) + len(waiting)
        self.stats.live -= freed
        self.bytes.now -= freed * self.point_bytes

    def _row_bytes(self, values: Any) -> int:
        """Bytes of one point held as a row of the stacked array ``values``."""
        return self.point_bytes if self.point_bytes is not None else values.nbytes // max(1, values.shape[0])

    # ---- a captured iteration's state (``tempo.runtime.capture``) --------------------------
    def state(self, relative: Relative) -> tuple[Hashable, list]:
        """The points ``relative`` names (by their point relative to an iteration; None:
        left out) as ``(structure, values)``: the structure lists the relative points in
        order, and of points waiting as rows of a stacked array which value holds it and
        the row; the values are the arrays."""
        data, waiting = self.data, self.data.rows
        named = sorted((r, p) for p in data if (r := relative(p)) is not None)
        values = [data[p] for _, p in named]
        stacked: dict[int, int] = {}
        rows = []
        for r, p in sorted((r, p) for p in waiting if (r := relative(p)) is not None):
            array, row = waiting[p]
            n = stacked.get(id(array))
            if n is None:
                n = stacked[id(array)] = len(values)
                values.append(array)
            rows.append((r, n, row))
        return (tuple(r for r, _ in named), tuple(rows)), values

    def forget_state(self, structure: Hashable, place: Callable[[tuple], tuple]) -> None:
        """Forget the points of a ``state``'s structure (placed by ``place``), without
        counting them (``set_state``)."""
        named, rows = structure  # type: ignore[misc]
        for r in named:
            del self.data[place(r)]
        for r, _, _ in rows:
            del self.data.rows[place(r)]

    def set_state(self, structure: Hashable, values: list, place: Callable[[tuple], tuple]) -> None:
        """Hold the points of a ``state`` (each relative point placed by ``place``), without
        counting them: a captured iteration accounts for its bytes as a whole."""
        named, rows = structure  # type: ignore[misc]
        data = self.data
        for r, value in zip(named, values):
            data[place(r)] = value
        for r, n, row in rows:
            data.rows[place(r)] = (values[n], row)


def _rows_of(arrays: Any, values: Any, rows: list[int]) -> Any:
    """Rows ``rows`` of stacked ``values``: a slice where they are consecutive, else a
    gather."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return arrays.rows(values, rows[0], len(rows))
    return arrays.take(values, np.asarray(rows))


class HostArrays:
    """Stacking for readers that run on the host: stored values (device arrays too) as
    NumPy arrays (``to_host``: the backend's). A stacked array's rows are sliced from its
    host copy, which JAX keeps with the array: a loop's output read in many windows is
    copied once."""

    def __init__(self, to_host: Callable[[Any], np.ndarray]) -> None:
        self.to_host = to_host

    def rows(self, values: Any, start: int, count: int) -> np.ndarray:
        return self.to_host(values)[start:start + count]

    def take(self, values: Any, rows: np.ndarray) -> np.ndarray:
        return self.to_host(values)[rows]

    def stack(self, values: list[Any]) -> np.ndarray:
        return np.stack([self.to_host(v) for v in values])

    @staticmethod
    def concatenate(values: list[Any]) -> np.ndarray:
        return np.concatenate(values)

    @staticmethod
    def zeros(shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return np.zeros(shape, dtype)


class SplitPointStore(PointStore):
    """A point store on a backend with a device mesh: it also counts the bytes of the
    values split over several of the mesh's devices (``MemoryStats.split``)."""

    def write(self, point: tuple[int, ...], value: Any) -> None:
        old = self.data.get(point)
        if old is not None:
            self.stats.split.add(-self._split_bytes(old, old.nbytes))
        super().write(point, value)
        self.stats.split.add(self._split_bytes(value, value.nbytes))

    def write_rows(self, points: list[tuple[int, ...]], values: Any, rows: list[int]) -> None:
        super().write_rows(points, values, rows)  # fewer than half the rows: through write
        if 2 * len(rows) >= values.shape[0]:  # kept as rows of ``values``
            self.stats.split.add(len(points) * self._split_bytes(values, self._row_bytes(values)))

    def free(self, point: tuple[int, ...]) -> None:
        value = self.data.get(point)
        if value is not None:
            self.stats.split.add(-self._split_bytes(value, value.nbytes))
        elif point in self.data.rows:
            values = self.data.rows[point][0]
            self.stats.split.add(-self._split_bytes(values, self._row_bytes(values)))
        super().free(point)

    def free_many(self, points: list[tuple[int, ...]]) -> None:
        """``free`` at each of ``points``, asking once per stored array whether it is split
        (a lowered loop's outputs are freed a few thousand points an iteration, most of
        them rows of one array: PPO over 4 forced CPU devices, 2,200 an iteration)."""
        if self.point_bytes is None:  # (``PointStore.free_many`` then frees each: ``free``)
            super().free_many(points)
            return
        data, rows = self.data, self.data.rows
        split: dict[int, bool] = {}
        freed = 0
        for point in dict.fromkeys(points):  # (a point named twice is freed once)
            value = data.get(point)
            if value is not None:
                array, nbytes = value, value.nbytes
            elif point in rows:
                array = rows[point][0]
                nbytes = self._row_bytes(array)
            else:
                continue
            is_split = split.get(id(array))
            if is_split is None:
                is_split = split[id(array)] = self.backend.is_split(array)
            freed += nbytes if is_split else 0
        self.stats.split.add(-freed)
        super().free_many(points)

    def _split_bytes(self, value: Any, nbytes: int) -> int:
        return nbytes if self.backend.is_split(value) else 0


class SwappedStore(PointStore):
    """A point store whose values wait in host memory: moved there when written, back to
    the backend's memory when read (``tempo.schedule.memory``'s swapping)."""

    @staticmethod
    def _counter(stats: MemoryStats) -> Bytes:
        return stats.host

    def write(self, point: tuple[int, ...], value: Any) -> None:
        super().write(point, self.backend.to_host(value))

    def write_rows(self, points: list[tuple[int, ...]], values: Any, rows: list[int]) -> None:
        host = self.backend.to_host(values)
        for point, row in zip(points, rows):
            super().write(point, host[row].copy())  # a view would keep all of host alive

    def stacked(self, points: list[tuple[int, ...]]) -> Any | None:
        return None

    def reader(self, slices: bool, host: bool = False) -> Callable[[tuple], Any]:
        read, from_host = super().reader(slices, host), self.backend.from_host
        if host:
            return read
        return lambda index: from_host(read(index))


ALIGNMENT = 64
"""Bytes block buffers are aligned to: XLA's CPU client adopts a 64-byte-aligned host
array as a device buffer without copying it (``jax.device_put``)."""


def aligned_zeros(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """``np.zeros(shape, dtype)`` starting at a multiple of ``ALIGNMENT`` bytes."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = np.zeros(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def padded_sizes(index: tuple) -> tuple[int, ...]:
    """The rows a read of ``index`` delivers along each slice: its points, or the rows a
    padded slice (``Slice.pad``, compiled as the slice's step) asks for."""
    return tuple(max(0, i.stop - i.start) if i.step is None else i.step
                 for i in index if isinstance(i, slice))


def _empty(index: tuple) -> bool:
    return any(isinstance(i, slice) and i.stop <= i.start for i in index)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def return_freed_memory() -> None:
    """Hand the C heap's free memory back to the system where the C library is glibc
    (``malloc_trim``); elsewhere nothing."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class _GrownBuffers:
    """Hands the memory of device buffers that grown ones replaced back to the system
    (``DeviceBuffers.replaced``): at once, or, as a context (``with grown_buffers:``),
    once for all the buffers that grow inside it (a decoder's launch grows eight at one
    position; each trim of its heap takes 1.5-2.5 ms)."""

    def __init__(self) -> None:
        self.depth = 0
        self.grown: list[tuple[Backend, Any]] = []

    def grew(self, backend: Backend, block: Any) -> None:
        self.grown.append((backend, block))
        if not self.depth:
            self._trim()

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1
        if not self.depth:
            self._trim()

    def _trim(self) -> None:
        """Wait for the grown buffers, so that the buffers they replaced are freed, and
        hand the freed memory back."""
        if self.grown:
            grown, self.grown = self.grown, []
            for backend, block in grown:
                backend.synchronize(block)
            return_freed_memory()


grown_buffers = _GrownBuffers()


@dataclass(frozen=True)
class BufferShape:
    """The shape and dtype of a buffer to come (``BlockStore.block_slice`` ahead)."""

    shape: tuple[int, ...]
    dtype: Any


class HostBuffers:
    """Block buffers in host memory (NumPy): rows are written in place; a slice read is a
    view of the buffer, handed to readers through ``view`` (``JaxBackend.view_of_host``:
    the rows as a device array without a copy where the device is this host's memory).

    A buffer's rows lie along ``axis`` (``Edge.rows_at``, ``tempo.passes.layout``); shapes
    given to and values written into the buffers have them first."""

    on_device = False

    def __init__(self, view: Callable[[np.ndarray], Any] = lambda rows: rows, axis: int = 0):
        self.view = view
        self.axis = axis
        self._at = (slice(None),) * axis

    def allocate(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return aligned_zeros(rows_moved(shape, self.axis), dtype)

    @staticmethod
    def incoming(value: Any) -> np.ndarray:
        """A written value as the buffers hold it (a device value is copied to the host)."""
        return np.asarray(value)

    def set_row(self, block: np.ndarray, k: int, row: Any) -> np.ndarray:
        block[(*self._at, k)] = row
        return block

    def set_rows(self, block: np.ndarray, ks: list[int], values: np.ndarray, taken: list[int]) -> np.ndarray:
        block[(*self._at, ks)] = np.moveaxis(values[taken], 0, self.axis)
        return block

    def rows(self, block: np.ndarray, start: int, count: int) -> np.ndarray:
        return block[(*self._at, slice(start, start + count))]

    def gather(self, block: np.ndarray, slots: Any) -> np.ndarray:
        return block[(*self._at, slots)]

    @staticmethod
    def row_of(values: Any, n: int) -> Any:
        """Row ``n`` of written values (rows first)."""
        return values[n]

    def zeros(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return np.zeros(rows_moved(shape, self.axis), dtype)

    @staticmethod
    def stack(values: list[Any]) -> np.ndarray:
        return np.stack(values)

    def concatenate(self, values: list[Any]) -> np.ndarray:
        return np.concatenate(values, self.axis)

    @staticmethod
    def copy(rows: np.ndarray) -> np.ndarray:
        """Rows that later writes to the buffer will not change."""
        return rows.copy()

    @staticmethod
    def replaced(block: np.ndarray) -> None:
        """``block`` replaced a buffer (nothing to do: NumPy freed it)."""

    @staticmethod
    def moveaxis(rows: np.ndarray, source: int, destination: int) -> np.ndarray:
        return np.moveaxis(rows, source, destination)


class DeviceBuffers:
    """Block buffers in the backend's memory (the device, on JAX), for stores that a
    device kernel writes and device kernels read in tiled slices (``tempo.passes.tile``
    pads a growing slice such as ``k[0:t+1]``), or read whole by kernels outside the dim (a
    rollout, ``executable._reads_fixed_rows``): a row is written by
    a kernel that takes the buffer over (no copy, no wait for the value; the kernel making
    the row, where ``tempo.runtime.executable`` can, ``JaxBackend.block_kernel``), the
    kernels reading a slice slice the buffer themselves, and nothing goes through the host
    (a host buffer waits for every written value and copies it). ``tempo.runtime.executable`` chooses
    between the two."""

    on_device = True

    def __init__(self, backend: Backend, axis: int = 0):
        self.backend = backend
        self.axis = axis
        """The axis of a buffer's rows (see ``HostBuffers``)."""
        self.stack = backend.stack

    def allocate(self, shape: tuple[int, ...], dtype: str) -> Any:
        return self.backend.zeros(rows_moved(shape, self.axis), dtype)

    zeros = allocate

    def view(self, rows: Any) -> Any:
        return rows

    @staticmethod
    def incoming(value: Any) -> Any:
        return value

    def set_row(self, block: Any, k: int, row: Any) -> Any:
        return self.backend.update_rows(block, np.int32(k), row, self.axis)

    def set_rows(self, block: Any, ks: list[int], values: Any, taken: list[int]) -> Any:
        rows = values if taken == list(range(len(values))) else self.backend.take(values, np.asarray(taken))
        return self.backend.update_rows(block, np.asarray(ks, np.int32), rows, self.axis)

    def rows(self, block: Any, start: int, count: int) -> Any:
        """A copy, even of the whole buffer: the next write takes the buffer over."""
        return self.backend.rows(block, start, count, self.axis)

    def gather(self, block: Any, slots: Any) -> Any:
        return self.backend.take(block, slots, self.axis)

    def row_of(self, values: Any, n: int) -> Any:
        return self.backend.take(values, n)

    def concatenate(self, values: list[Any]) -> Any:
        return self.backend.concatenate(values, self.axis)

    def moveaxis(self, rows: Any, source: int, destination: int) -> Any:
        return self.backend.moveaxis(rows, source, destination)

    @staticmethod
    def copy(rows: Any) -> Any:
        """Device slices are already copies."""
        return rows

    def replaced(self, block: Any) -> None:
        """``block``, made from a buffer it replaces: wait for it, so that the buffer is
        freed, and hand the freed memory back to the system (``grown_buffers``: once for
        the buffers a kernel's launch grows at once). Otherwise the C heap keeps it
        (glibc keeps freed blocks smaller than the largest it has handed back; a grown
        buffer is larger than any before it): causal decoding, batch 8, 8K positions,
        peak RSS 711 MiB against 608 with it, the same tokens/s (2026-11-26)."""
        if not self.backend.capturing:  # (a captured iteration's buffers are the program's)
            grown_buffers.grew(self.backend, block)


class BlockStore:
    """A preallocated buffer along the innermost dim for each prefix point.

    For RTs read through slices of their innermost dim (``x[0:t+1]``, ``x[t:T]``,
    windows): a slice read is one buffer slice instead of a stack of points. A buffer is
    released once each of its rows has been written and freed (reallocating it whenever
    it is momentarily empty would cost O(T) per step). Buffers are host memory
    (``HostBuffers``), or the device's (``DeviceBuffers``) where a device kernel writes
    them and device kernels read them in tiled slices (or whole, from outside the dim). A
    buffer holds every row from the start, or (``step``) grows by whole tiles as its rows
    are written.
    """

    def __init__(self, stats: MemoryStats, length: int, shape: tuple[int, ...], dtype: str,
                 view: Callable[[np.ndarray], Any] = lambda rows: rows, rows: int | None = None,
                 buffers: HostBuffers | DeviceBuffers | None = None, step: int | None = None,
                 point_reads: bool = False):
        self.stats = stats
        self.buffers = buffers or HostBuffers(view)
        """Where the buffers live and how rows move in and out of them."""
        self.bytes = stats.device if self.buffers.on_device else stats.host
        self.rows_axis = self.buffers.axis
        """The axis of a slice read's rows, as the buffers keep them."""
        self.length, self.shape, self.dtype = length, shape, dtype
        self.rows = max(length, rows or 0)
        """Rows of a buffer: the dim's points, and more where a padded read runs past them
        (``tempo.passes.tile``), so that it is a slice of the buffer too."""
        self.step = step
        """Where set, a buffer holds whole steps of rows up to its last written row only,
        growing by a step (a copy) when a write runs past it (``held``): a kernel reading
        the rows from the first up to that step reads the whole buffer, where XLA's CPU code
        would copy the rows out of a longer one at every read."""
        self.blocks: dict[tuple[int, ...], Any] = {}
        self.live: dict[tuple[int, ...], set[int]] = {}
        self.produced: dict[tuple[int, ...], set[int]] = {}
        self.point_reads = point_reads
        """Device buffers that readers also read a point of (a host env reading the action
        the policy kernel wrote): the kernel writing a row returns it too, and a read of
        that point takes it (``latest``) instead of gathering it from the buffer (a program
        launch: 8-10 us on a CPU). A kernel reading the point last may take that row over
        (donate it), as it would a point store's value: nothing else holds it."""
        self.latest: tuple[tuple[int, ...], Any] | None = None
        """The point a kernel wrote last and its row, where the kernel returned it."""

    def holds(self, point: tuple[int, ...]) -> bool:
        """Whether ``point`` was written (and not freed)."""
        return point[-1] in self.live.get(point[:-1], ())

    def write(self, point: tuple[int, ...], value: Any) -> None:
        prefix, k = point[:-1], point[-1]
        self._put(prefix, k, self.buffers.incoming(value))
        self._written(prefix, k)

    def row_slot(self, point: tuple[int, ...]) -> tuple[Any, int]:
        """The buffer (made if need be) and the row that a write at ``point`` updates, for
        a kernel that writes it itself and returns the buffer (``written_by_kernel``)."""
        prefix = point[:-1]
        return self._block(prefix, point[-1]), self._slot(prefix, point[-1])

    def written_by_kernel(self, point: tuple[int, ...], block: Any, row: Any = None) -> None:
        """``block``, the buffer ``row_slot(point)`` gave with the row at ``point`` written
        at its row, replaces it; ``row``: that row, where the kernel returned it too
        (``point_reads``)."""
        self.blocks[point[:-1]] = block
        self._written(point[:-1], point[-1])
        self.latest = None if row is None else (point, row)

    def buffer_at(self, point: tuple[int, ...]) -> Any:
        """The buffer a write at ``point`` goes to, made or grown as that write would make
        it (a lowered loop's span then writes it, ``written_by_scan``)."""
        return self._block(point[:-1], point[-1])

    def written_by_scan(self, points: list[tuple[int, ...]], block: Any, freed: list[bool]) -> None:
        """``block``, a buffer a lowered loop's span carried (``buffer_at`` gave it at the
        first of ``points``), with the rows of ``points`` (of one prefix, in order) written
        at their rows (``rows_of``), replaces it; those ``freed`` were freed in the span
        again, each after the next was written (as a window's are)."""
        prefix = points[0][:-1]
        self.blocks[prefix] = block
        self.produced[prefix].update(point[-1] for point in points)
        live = self.live[prefix]
        kept = {point[-1] for point, gone in zip(points, freed) if not gone} - live
        live |= kept
        self.stats.live += len(kept)
        self.stats.peak = max(self.stats.peak, self.stats.live + any(freed))
        self._release_if_done(prefix)

    def rows_of(self, prefix: tuple[int, ...], ks: np.ndarray) -> np.ndarray:
        """The buffer rows of points ``ks`` (an array) of ``prefix``."""
        return self._slot(prefix, ks)

    def _written(self, prefix: tuple[int, ...], k: int) -> None:
        self.produced[prefix].add(k)
        if k not in self.live[prefix]:
            self.live[prefix].add(k)
            self.stats.live += 1
            self.stats.peak = max(self.stats.peak, self.stats.live)

    def write_rows(self, points: list[tuple[int, ...]], values: Any, rows: list[int]) -> None:
        """Write row ``rows[n]`` of ``values`` at ``points[n]``, one copy per buffer."""
        values = self.buffers.incoming(values)
        for prefix, (ks, taken) in _by_prefix(points, rows).items():
            if not self._adopted(prefix, values, ks, taken):
                self.blocks[prefix] = self.buffers.set_rows(self._block(prefix, max(ks)), ks, values, taken)
            self.produced[prefix].update(ks)
            live = self.live[prefix]
            new = len(set(ks) - live)
            live.update(ks)
            self.stats.live += new
            self.stats.peak = max(self.stats.peak, self.stats.live)

    def _put(self, prefix: tuple[int, ...], k: int, row: Any) -> None:
        self.blocks[prefix] = self.buffers.set_row(self._block(prefix, k), k, row)

    def _adopted(self, prefix: tuple[int, ...], values: Any, ks: list[int], taken: list[int]) -> bool:
        """Whether the rows ``taken`` of ``values`` became the buffer of ``prefix`` as they
        are: every row of a buffer not yet made, in order, one contiguous slice (a lowered
        acting loop's stacked observations; copying them would hold two copies at once).
        Where they are all of ``values``, on the device, the buffer is ``values`` itself: no
        slice program to compile and run (nothing else holds a scan's stacked output)."""
        if prefix in self.blocks or self.rows_axis or len(ks) != self.length \
                or ks != list(range(self.length)) or taken != list(range(taken[0], taken[0] + self.length)):
            return False
        if tuple(values.shape[1:]) != self.shape or np.dtype(values.dtype) != np.dtype(self.dtype):
            return False
        whole = self.buffers.on_device and taken[0] == 0 and self.length == values.shape[0] \
            and self.buffers.backend.donatable(values)  # (a device array)
        block = self.blocks[prefix] = values if whole else self.buffers.rows(values, taken[0], self.length)
        self.live[prefix], self.produced[prefix] = set(), set()
        self.bytes.add(block.nbytes)
        return True

    def _block(self, prefix: tuple[int, ...], k: int = 0) -> Any:
        """The buffer of ``prefix``, allocated at its first write, able to hold row ``k``."""
        block = self.blocks.get(prefix)
        if block is None:
            block = self.blocks[prefix] = self.buffers.allocate((self.held(k), *self.shape), self.dtype)
            self.live[prefix], self.produced[prefix] = set(), set()
            self.bytes.add(block.nbytes)
        elif block.shape[self.rows_axis] <= k < self.rows:
            more = self.buffers.zeros((self.held(k) - block.shape[self.rows_axis], *self.shape), self.dtype)
            grown = self.buffers.concatenate([block, more])
            self.bytes.add(grown.nbytes)  # both held, for a moment
            self.bytes.add(-block.nbytes)
            self.blocks[prefix] = block = grown
            self.buffers.replaced(block)
        return block

    def held(self, k: int) -> int:
        """The rows of a buffer whose last written row is ``k``."""
        return self.rows if self.step is None else min(self.rows, -(-(k + 1) // self.step) * self.step)

    def stacked(self, points: list[tuple[int, ...]]) -> Any | None:
        """The rows at ``points`` as one array (one copy) when they are rows of one buffer,
        else None (see ``PointStore.stacked``)."""
        if not points:
            return None
        prefix = points[0][:-1]
        block = self.blocks.get(prefix)
        if block is None or any(point[:-1] != prefix for point in points):
            return None
        slots = np.fromiter((self._slot(prefix, point[-1]) for point in points), np.int64, len(points))
        rows = self.buffers.gather(block, slots)
        return self.buffers.moveaxis(rows, self.rows_axis, 0) if self.rows_axis else rows

    def _slot(self, prefix: tuple[int, ...], k: int) -> int:
        """The buffer row holding point ``k`` of ``prefix``."""
        return k

    def block_slice(self, index: tuple, ahead: bool = False) -> tuple[Any, int, int] | None:
        """The buffer, first row and row count of a slice read of ``index`` where it is one
        run of a buffer's rows (a kernel may slice the buffer itself; a padded read of no
        points too: its rows are masked), else None. ``ahead``: of a read to come, with the
        buffer as it will be by then (its ``BufferShape``: grown to the rows the read
        reaches; for a buffer not made yet, made to hold them, ``new_buffer_shape``), to
        compile the reading kernel ahead."""
        prefix, last = index[:-1], index[-1]
        if not isinstance(last, slice) or (last.step is None and last.stop <= last.start) or _empty(prefix) \
                or any(isinstance(i, slice) for i in prefix):
            return None
        block = self.blocks.get(prefix)
        if block is None and not ahead:
            return None
        start = self._slot(prefix, last.start) if block is not None else last.start
        rows = last.stop - last.start if last.step is None else last.step
        if block is None:  # a buffer to come, as its first write will make it
            block = self.new_buffer_shape(start + rows - 1)
            if block is None:
                return None
        elif ahead:
            block = self.shape_ahead(block, start + rows - 1)
        return (block, start, rows) if start + rows <= block.shape[self.rows_axis] else None

    def new_buffer_shape(self, k: int) -> BufferShape | None:
        """The shape of a buffer not made yet, once it holds row ``k``."""
        return BufferShape(rows_moved((self.held(k), *self.shape), self.rows_axis), self.dtype)

    def shape_ahead(self, block: Any, k: int) -> BufferShape:
        """The shape of ``block`` once it holds row ``k`` (``block`` where it does not grow)."""
        if self.step is None:
            return block
        held = max(block.shape[self.rows_axis], self.held(min(k, self.rows - 1)))
        return BufferShape(rows_moved((held, *self.shape), self.rows_axis), block.dtype)

    def reader(self, slices: bool, host: bool = False) -> Callable[[tuple], Any]:
        """Reads of the block's rows (``host`` changes nothing: a store with host readers
        has host buffers)."""
        return self.read if slices else self.read_point

    def read_point(self, index: tuple) -> Any:
        latest = self.latest
        if latest is not None and latest[0] == index:
            return latest[1]
        return self._rows(index[:-1], index[-1])

    def read(self, index: tuple) -> Any:
        prefix, last = index[:-1], index[-1]
        if isinstance(last, slice) and last.stop <= last.start or _empty(prefix):
            return self.buffers.zeros((*padded_sizes(index), *self.shape), self.dtype)
        if any(isinstance(i, slice) for i in prefix):
            axes = [range(i.start, i.stop) if isinstance(i, slice) else (i,) for i in prefix]
            sizes = tuple(len(a) for a in axes if isinstance(a, range))
            rows = [self._rows(p, last) for p in itertools.product(*axes)]
            return self.buffers.view(self.buffers.stack(rows).reshape(sizes + tuple(rows[0].shape)))
        return self.buffers.view(self._rows(prefix, last))

    def _rows(self, prefix: tuple[int, ...], last: int | slice) -> Any:
        """The stored rows of ``prefix`` at ``last`` (a point or a run of points; a padded
        run goes on with the buffer's next rows, unwritten or stale, and zeros past its
        end: the readers mask them)."""
        block, buffers = self.blocks[prefix], self.buffers
        if not isinstance(last, slice):
            return buffers.gather(block, self._slot(prefix, last))
        start = self._slot(prefix, last.start)
        rows = last.stop - last.start if last.step is None else last.step
        held = block.shape[self.rows_axis]
        if start + rows <= held:
            return buffers.rows(block, start, rows)
        tail = buffers.zeros((start + rows - held, *self.shape), self.dtype)
        return buffers.concatenate([buffers.rows(block, start, held - start), tail])

    def free(self, point: tuple[int, ...]) -> None:
        prefix, k = point[:-1], point[-1]
        if self.latest is not None and self.latest[0] == point:
            self.latest = None
        live = self.live.get(prefix)
        if live is None or k not in live:
            return
        live.discard(k)
        self.stats.live -= 1
        self._release_if_done(prefix)

    def free_many(self, points: list[tuple[int, ...]]) -> None:
        """``free`` at each of ``points``, one set difference per buffer."""
        if self.latest is not None and self.latest[0] in points:
            self.latest = None
        for prefix, (ks, _) in _by_prefix(points).items():
            live = self.live.get(prefix)
            if live is None:
                continue
            before = len(live)
            live.difference_update(ks)
            self.stats.live -= before - len(live)
            self._release_if_done(prefix)

    def _release_if_done(self, prefix: tuple[int, ...]) -> None:
        """Release the buffer of ``prefix`` once each row was written and freed."""
        if not self.live[prefix] and len(self.produced[prefix]) == self.length:
            self.bytes.now -= self.blocks[prefix].nbytes
            self._forget(prefix)

    # ---- a captured iteration's state (``tempo.runtime.capture``) --------------------------
    def state(self, relative: Relative) -> tuple[Hashable, list]:
        """``PointStore.state`` for buffers: those of the prefixes ``relative`` names, with
        their written and live rows, and the row a kernel returned last where its prefix is
        named."""
        named = sorted((r, p) for p in self.blocks if (r := relative(p)) is not None)
        values = [self.blocks[p] for _, p in named]
        buffers = tuple((r, tuple(sorted(self.live[p])), tuple(sorted(self.produced[p])), self._ring(p))
                        for r, p in named)
        latest = None
        if self.latest is not None and (r := relative(self.latest[0][:-1])) is not None:
            latest = (r, self.latest[0][-1])
            values.append(self.latest[1])
        return (buffers, latest), values

    def _ring(self, prefix: tuple[int, ...]) -> Hashable:
        """What a ring keeps of ``prefix`` beside its rows (``WindowStore``): nothing here."""
        return None

    def _forget(self, prefix: tuple[int, ...]) -> None:
        """Drop the buffer of ``prefix`` and what the store keeps of it (not counted)."""
        del self.blocks[prefix], self.live[prefix], self.produced[prefix]

    def forget_state(self, structure: Hashable, place: Callable[[tuple], tuple]) -> None:
        """Forget the buffers of a ``state``'s structure (``PointStore.forget_state``)."""
        buffers, latest = structure  # type: ignore[misc]
        for r, *_ in buffers:
            self._forget(place(r))
        if latest is not None:
            self.latest = None

    def set_state(self, structure: Hashable, values: list, place: Callable[[tuple], tuple]) -> None:
        """Hold the buffers of a ``state`` (``PointStore.set_state``)."""
        buffers, latest = structure  # type: ignore[misc]
        for (r, live, produced, ring), block in zip(buffers, values):
            prefix = place(r)
            self.blocks[prefix], self.live[prefix], self.produced[prefix] = block, set(live), set(produced)
            self._set_ring(prefix, ring)
        if latest is not None:
            r, k = latest
            self.latest = ((*place(r), k), values[len(buffers)])

    def _set_ring(self, prefix: tuple[int, ...], ring: Hashable) -> None:
        """Hold what ``_ring`` gave for ``prefix``."""


class WindowStore(BlockStore):
    """A ``BlockStore`` for RTs whose readers see at most ``capacity`` consecutive points
    of the innermost dim at once (``k[max(0, t-w+1):t+1]``): a ring of ``capacity`` rows
    per prefix point instead of a buffer of the whole dim, so its memory does not grow with
    the dim's bound.

    Point ``k`` is row ``k % C`` of a ``C``-row buffer, written once. A read of points in
    their order is a slice of the ring where they do not wrap around its end, and a gather
    of its rows where they do (a copy either way: a ring's rows are overwritten, and a
    reader that keeps what it read, such as a placeholder holding its branch's value, must
    not see it change). A kernel whose reads are all tiled reads of rings reads the whole
    ring instead, its rows in ring order (``ring_slice``). A row is overwritten only once
    its point was freed; were the schedule to keep more than ``C`` points alive, the ring
    doubles (the rows are rewritten) instead of losing one."""

    def __init__(self, stats: MemoryStats, length: int, shape: tuple[int, ...], dtype: str,
                 capacity: int, view: Callable[[np.ndarray], Any] = lambda rows: rows,
                 buffers: HostBuffers | DeviceBuffers | None = None, point_reads: bool = False):
        super().__init__(stats, length, shape, dtype, view, buffers=buffers, point_reads=point_reads)
        self.capacity: dict[tuple[int, ...], int] = {}
        self.initial = capacity
        self.written: dict[tuple[int, ...], dict[int, int]] = {}
        """Per prefix: ring slot -> the point whose row it holds."""

    def write_rows(self, points: list[tuple[int, ...]], values: Any, rows: list[int]) -> None:
        values = self.buffers.incoming(values)
        for point, row in zip(points, rows):
            self.write(point, self.buffers.row_of(values, row))

    def _block(self, prefix: tuple[int, ...], k: int = 0) -> Any:
        block = self.blocks.get(prefix)
        if block is None:
            block = self._allocate(prefix, self.initial)
            self.live[prefix], self.produced[prefix] = set(), set()
        return block

    def _allocate(self, prefix: tuple[int, ...], capacity: int) -> Any:
        """An empty ring of ``capacity`` slots for ``prefix``."""
        self.capacity[prefix], self.written[prefix] = capacity, {}
        block = self.blocks[prefix] = self.buffers.allocate((capacity, *self.shape), self.dtype)
        self.bytes.add(block.nbytes)
        return block

    def _put(self, prefix: tuple[int, ...], k: int, row: Any) -> None:
        block, slot = self.row_slot((*prefix, k))
        self.blocks[prefix] = self.buffers.set_row(block, slot, row)
        self.written[prefix][slot] = k

    def row_slot(self, point: tuple[int, ...]) -> tuple[Any, int]:
        """The ring (made, or grown where the slot's point is still needed) and the row
        that holds point ``point``: its slot."""
        prefix, k = point[:-1], point[-1]
        self._block(prefix)
        while True:
            slot = k % self.capacity[prefix]
            held = self.written[prefix].get(slot)
            if held is None or held == k or held not in self.live[prefix]:
                break
            self._grow(prefix)  # the slot's point is still needed
        return self.blocks[prefix], slot

    def written_by_kernel(self, point: tuple[int, ...], block: Any, row: Any = None) -> None:
        prefix, k = point[:-1], point[-1]
        self.written[prefix][k % self.capacity[prefix]] = k
        super().written_by_kernel(point, block, row)

    def buffer_at(self, point: tuple[int, ...]) -> Any:
        """The ring of ``point``'s prefix, made if need be but never grown here (a span
        overwrites only rows no longer needed, ``first_overwritten``)."""
        return self._block(point[:-1])

    def written_by_scan(self, points: list[tuple[int, ...]], block: Any, freed: list[bool]) -> None:
        prefix = points[0][:-1]
        capacity, written = self.capacity[prefix], self.written[prefix]
        for point in points:
            written[point[-1] % capacity] = point[-1]
        super().written_by_scan(points, block, freed)

    def first_overwritten(self, prefix: tuple[int, ...], ks: list[int], first: int,
                          freed_at: dict[int, int]) -> int:
        """How many of points ``ks`` (written at iterations ``first``, ``first + 1``, ...
        of a loop, in order) go to ring rows whose points are no longer needed by then:
        freed, or freed at an earlier iteration (``freed_at``: point -> iteration), without
        the ring growing (``row_slot``)."""
        capacity, live = self.capacity[prefix], self.live[prefix]
        holders = dict(self.written[prefix])
        made: set[int] = set()
        for n, k in enumerate(ks):
            slot = k % capacity
            held = holders.get(slot)
            if held is not None and held != k and (held in live or held in made) \
                    and freed_at.get(held, first + n) >= first + n:
                return n
            holders[slot] = k
            made.add(k)
        return len(ks)

    def _grow(self, prefix: tuple[int, ...]) -> None:
        old, capacity = self.blocks[prefix], self.capacity[prefix]
        live = self.live[prefix]
        rows = {k: self.buffers.gather(old, slot) for slot, k in self.written[prefix].items() if k in live}
        self._allocate(prefix, min(2 * capacity, self.length))  # at most the whole dim
        self.bytes.add(-old.nbytes)  # (held with the new ring until its rows are copied)
        for k, row in rows.items():
            self._put(prefix, k, row)

    def _slot(self, prefix: tuple[int, ...], k: int) -> int:
        return k % self.capacity[prefix]

    def new_buffer_shape(self, k: int) -> None:
        """Not known ahead: a ring's first capacity depends on its first writes."""
        return None

    def _rows(self, prefix: tuple[int, ...], last: int | slice) -> Any:
        # A copy: a ring's rows are overwritten later. Not aligned on purpose: handing a copy
        # to JAX as a device array (``view_of_host``) cost 80 us a read, more than the copy
        # a jitted kernel makes of a NumPy argument (window decoding, 1024 tokens: ~780 -> ~1000
        # tokens/s).
        capacity = self.capacity[prefix]
        if isinstance(last, slice):
            start = last.start % capacity
            rows = last.stop - last.start if last.step is None else last.step
            if start + rows > capacity:  # wraps around the ring's end
                slots = (start + np.arange(rows)) % capacity
                return self.buffers.gather(self.blocks[prefix], slots)
        return self.buffers.copy(super()._rows(prefix, last))

    def ring_slice(self, index: tuple, put: bool = False) -> tuple[Any, int, int] | None:
        """The whole ring, for a padded read of ``index`` (``tempo.passes.tile``) as long
        as the ring, to be read in ring order: where the read's points (and the row a
        ``put_row`` places after them, ``put``) fill the ring, or lie from its first row
        on, the rows the read's mask keeps (its first points, ``mask_rows``) are the
        rows that hold its points; else None. Only a kernel whose values do not depend on
        the order of the rows may read it so (see ``tempo.runtime.executable``)."""
        prefix, last = index[:-1], index[-1]
        if not isinstance(last, slice) or last.step is None or _empty(prefix) \
                or any(isinstance(i, slice) for i in prefix):
            return None
        block, capacity = self.blocks.get(prefix), self.capacity.get(prefix)
        if block is None or last.step != capacity:
            return None
        points = max(0, last.stop - last.start) + put
        return (block, 0, capacity) if points == capacity or last.start % capacity == 0 else None

    def _ring(self, prefix: tuple[int, ...]) -> Hashable:
        return self.capacity[prefix], tuple(sorted(self.written[prefix].items()))

    def _forget(self, prefix: tuple[int, ...]) -> None:
        super()._forget(prefix)
        self.capacity.pop(prefix, None)
        self.written.pop(prefix, None)

    def _set_ring(self, prefix: tuple[int, ...], ring: Hashable) -> None:
        capacity, written = ring  # type: ignore[misc]
        self.capacity[prefix], self.written[prefix] = capacity, dict(written)


def _by_prefix(points: list[tuple[int, ...]], rows: list[int] | None = None
               ) -> dict[tuple[int, ...], tuple[list[int], list[int] | None]]:
    """Per prefix (all coordinates but the last) of ``points``, the last coordinates of its
    points and their ``rows``, in order (``rows`` itself where all share one prefix). Points
    of one prefix (a loop's entry writing one buffer) take one pass over them instead of a
    dictionary update per point."""
    if not points:
        return {}
    if points[0][:-1] == points[-1][:-1]:
        *columns, last = zip(*points)
        if all(column.count(column[0]) == len(column) for column in columns):
            return {points[0][:-1]: (list(last), rows)}
    groups: dict[tuple[int, ...], tuple[list[int], list[int] | None]] = {}
    for n, point in enumerate(points):
        ks, taken = groups.setdefault(point[:-1], ([], None if rows is None else []))
        ks.append(point[-1])
        if taken is not None:
            taken.append(rows[n])  # type: ignore[index]
    return groups
