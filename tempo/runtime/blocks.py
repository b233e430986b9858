"""Block kernels: the reads and writes a device kernel does in block stores' device
buffers itself (``JaxBackend.block_kernel``), and when it may read whole buffers.

A decoder's attention at position ``t`` reads ``k[0:t+1]``: where the keys' store keeps
its rows in a device buffer, the kernel slices that buffer inside its own program (no
copy out first), and where it computes ``k[t]`` too it writes the row into the buffer
itself (``tempo.passes.newest``). Both the executor's launcher of such a kernel
(``tempo.runtime.executable``) and a loop lowered in spans (``tempo.runtime.lowering``)
decide from here which of its inputs and outputs are buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tempo.ir.graph import Edge, Op
from tempo.runtime.stores import BlockStore, WindowStore
from tempo.symbolic.expr import Slice, Symbol


def source_store(edge: Edge, stores: dict) -> Any:
    """The store that ``edge`` reads."""
    return stores[(edge.src.id, edge.src_out)]


def device_block_slice(edge: Edge, stores: dict) -> bool:
    """Whether ``edge`` reads a slice of the innermost dim only (points of the others) of a
    block store whose buffers are on the device, with the rows where the store keeps them."""
    store = source_store(edge, stores)
    return device_blocks(store) and len(edge.slices) == 1 and edge.slices[0] == len(edge.phi) - 1 \
        and edge.rows_at == store.rows_axis


def written_by_kernel(op: Op, k: int, edges: list[Edge], blocks: list[int], stores: dict) -> bool:
    """Whether ``op``'s kernel can write its output ``k`` into its store's device buffers
    itself: where it reads that buffer too, only as the earlier rows its ``put_row``
    members complete with the row it writes (``tempo.passes.newest``)."""
    store = stores[(op.id, k)]
    return device_blocks(store) and all(
        n in blocks and _rows_put(op, n) for n, e in enumerate(edges) if source_store(e, stores) is store)


def _rows_put(op: Op, n: int) -> bool:
    """Whether fused ``op`` uses its input ``n`` only as the rows of ``put_row`` members."""
    if op.kind != "fused":
        return False
    uses = [m for m in op.params["members"] if ("in", n) in m.args]
    return bool(uses) and all(m.kind == "put_row" and m.args.index(("in", n)) == 0
                              and m.args.count(("in", n)) == 1 for m in uses)


def device_blocks(store: Any) -> bool:
    """Whether ``store`` is a block (or window) store with device buffers, which kernels
    slice and write themselves."""
    return isinstance(store, BlockStore) and store.buffers.on_device


WHOLE_BUFFER_SHARE = 0.6
"""A kernel whose tiled reads of a buffer's first rows (``k[0:t+1]``, padded) cover more
than this share of the buffer reads the whole buffer instead (``widens_prefix_reads``).
On XLA CPU, slicing the rows out inside the kernel copies them, and the copy costs about
as much as the attention over them: batch 8, 8,208-row buffers, attention alone over
4,096 sliced rows 1.6 ms against 1.1 ms over the whole buffer masked (0.25 against 1.15
ms at 1,024 rows). Greedy decoding (small config, causal, one kernel per position,
2026-11-26, two rounds, tokens/s at shares 1/3, 0.5, 0.6, 0.75, 1 (never)): batch 1 at
8K tokens 892 / 961 at 1/3, 917 / 1,074 at 0.5, 1,000-1,054 at 0.6, 994 / 1,047 at 0.75,
938 / 1,016 never; batch 8 at 8K 1,275 / 1,192, 1,373 / 1,408, 1,334-1,430, 1,385 /
1,386, 1,035 / 1,138; batch 8 at 2K 3,847 / 3,987 at 1/3, 4,477 / 4,453 at 0.6."""


ORDERED_KINDS = frozenset({"cumsum", "discounted_sum", "linear_recurrence", "arange", "window"})
"""Ops whose values depend on the order of a padded axis's rows (``tempo.passes.tile``
lets one through: a cumulative or discounted sum or a linear recurrence along it, an
``arange`` of its length, a padded slice): a kernel holding one reads its rows in the points' order."""


def _kinds(op: Op) -> set[str]:
    """The kinds of op ``op`` runs: a fused op's members'."""
    return {m.kind for m in op.params["members"]} if op.kind == "fused" else {op.kind}


def widens_prefix_reads(op: Op, edges: list[Edge], blocks: list[int], stores: dict,
                         known: set[Symbol]) -> bool:
    """Whether ``op``'s kernel may read whole buffers where its reads ``blocks`` ask for
    their first rows: every such read is padded to tiles (``tempo.passes.tile``: the
    kernel masks every row past the read's points, whatever their number) from a growing
    block store (a window's ring does not start at row 0), and nothing else the kernel
    reads or makes has the padded length (it would not match the whole buffer's), nor does
    an op inside it (``ORDERED_KINDS``: an ``arange`` or a ``window`` of the padded length)."""
    reads = [edges[k] for k in blocks]
    if not reads or not all(e.tiled and not isinstance(source_store(e, stores), WindowStore) for e in reads):
        return False
    if _kinds(op) & ORDERED_KINDS:
        return False
    others = [e for k, e in enumerate(edges) if k not in blocks]
    shapes = [d for t in op.outputs for d in t.shape]
    for e in others:
        shapes += [*e.src.outputs[e.src_out].shape, *(x.size for x in e.phi if isinstance(x, Slice))]
    return all(d.symbols() <= known for d in shapes)


def reads_rings_whole(op: Op, edges: list[Edge], blocks: list[int], sources: list[Any]) -> bool:
    """Whether ``op``'s kernel may read its block reads ``blocks`` (from ``sources``) as
    whole rings, their rows in ring order (``WindowStore.ring_slice``): every one is a
    tiled read of a ring, and nothing else the kernel reads or makes has a padded read's
    length. Such a value would have its rows in the points' order: a slice read the
    kernel does not take from a device buffer, or a value of the padded axis made by
    another kernel or read by one (without fusion, the scores' matmul is a kernel of its
    own). A value of that length for another reason (a hidden size equal to the window)
    is refused too: the points' order is then kept. So is a kernel holding an op whose
    values depend on that order (``ORDERED_KINDS``)."""
    reads = [edges[k] for k in blocks]
    if not reads or not all(e.tiled and isinstance(store, WindowStore) for e, store in zip(reads, sources)):
        return False
    if _kinds(op) & ORDERED_KINDS:
        return False
    padded = {e.phi[-1].pad for e in reads}
    others = [e for k, e in enumerate(edges) if k not in blocks]
    if any(e.slices for e in others):
        return False
    made = {d for t in op.outputs for d in t.shape}
    read = {d for e in others for d in e.src.outputs[e.src_out].shape}
    return not padded & (made | read)


def whole_buffers(found: list[tuple[Any, int, int]], axes: list[int]) -> list[tuple[Any, int, int]]:
    """``found`` (a kernel's block reads: buffer, first row, rows) with whole buffers where
    every read is of the first rows, all of one length, of buffers of one length, and that
    length covers more than ``WHOLE_BUFFER_SHARE`` of it."""
    lengths = {block.shape[axis] for (block, _, _), axis in zip(found, axes)}
    rows = {count for _, _, count in found}
    if len(lengths) != 1 or len(rows) != 1 or any(start for _, start, _ in found):
        return found
    (length,), (count,) = lengths, rows
    if count >= length or count <= WHOLE_BUFFER_SHARE * length:
        return found
    return [(block, 0, length) for block, _, _ in found]


@dataclass(frozen=True)
class KernelBuffers:
    """The device buffers a block kernel reads and writes itself."""

    blocks: tuple[int, ...]
    """Its inputs that are slices of device buffers (``device_block_slice``)."""
    written: tuple[int, ...]
    """Its outputs it writes into their stores' device buffers (``written_by_kernel``)."""
    sources: tuple[Any, ...]
    """Per input of ``blocks``, the store it reads."""
    targets: tuple[Any, ...]
    """Per output of ``written``, its store."""
    shared: tuple[tuple[int, int], ...]
    """``(input, n)``: input ``input`` reads the buffer of ``written[n]``, as the earlier
    rows its ``put_row`` members complete with the row the kernel writes."""
    widens: bool
    """Long reads of the buffers' first rows may read the whole buffers
    (``widens_prefix_reads``)."""
    rings: bool
    """Its reads may take whole rings, their rows in ring order (``reads_rings_whole``)."""

    @property
    def axes(self) -> tuple[int, ...]:
        """Per input of ``blocks``, the axis of its buffer's rows."""
        return tuple(store.rows_axis for store in self.sources)


def kernel_buffers(op: Op, edges: list[Edge], stores: dict, known: set[Symbol]) -> KernelBuffers | None:
    """The buffers ``op``'s kernel reads and writes itself, or None where it does neither."""
    blocks = tuple(k for k, e in enumerate(edges) if device_block_slice(e, stores))
    written = tuple(k for k in range(len(op.outputs))
                    if written_by_kernel(op, k, edges, list(blocks), stores))
    if not blocks and not written:
        return None
    sources = tuple(source_store(edges[k], stores) for k in blocks)
    targets = tuple(stores[(op.id, k)] for k in written)
    shared = tuple((k, next(j for j, t in enumerate(targets) if t is store))
                   for k, store in zip(blocks, sources) if any(t is store for t in targets))
    return KernelBuffers(blocks, written, sources, targets, shared,
                         widens_prefix_reads(op, edges, list(blocks), stores, known),
                         reads_rings_whole(op, edges, list(blocks), list(sources)))
