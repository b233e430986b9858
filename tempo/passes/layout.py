"""Read layout: tiled reads deliver their rows along the axis their reader moves them to.

A read of a slice stacks its points along a new first axis: an attention's ``k[0:t+1]``
is ``(n, B, heads, d)``. Its reader usually moves that axis at once (the matmuls want
``(B, heads, n, d)`` and ``(B, heads, d, n)``), and XLA then copies the whole read through
a transpose at every step, as much work as the attention itself on a CPU. Where every use
of such a read inside its (fused) reader is the same permute moving the first axis to
position ``a`` and keeping the others in order, this pass marks the read's edge
``rows_at=a`` and drops the permute: the runtime's store keeps its rows along axis ``a``
(``tempo.runtime.stores``), so the read is already laid out as the reader wants it. A
``put_row`` placing the newest row in the read (``tempo.passes.newest``) is looked
through: it then places the row along axis ``a``.

Only tiled reads (``Slice.pad``, ``tempo.passes.tile``) of one slice are laid out: they
are the growing reads of static-shape kernels, read at every step, where the transpose
costs most; other reads keep the first axis.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.ops import op_def
from tempo.symbolic.expr import Slice

if TYPE_CHECKING:
    from tempo.passes import PassState


def lay_out_reads(graph: SDG, state: PassState) -> SDG:
    """``graph`` with the tiled reads that fused ops or permute ops permute at once
    delivered permuted, and those permutes made identities (see the module doc)."""
    moved: dict[tuple[int, int], int] = {}  # (sink id, input) -> the axis of its rows
    final: dict[int, Op] = {}
    for op in graph.ops.values():
        final[op.id] = op
        for k, edge in enumerate(graph.in_edges(op)):
            axis = _moved_to(op, k) if _tiled_single_slice(edge) else None
            if axis is None:
                continue
            moved[op.id, k] = axis
            final[op.id] = _without_permutes(final[op.id], k, axis)
    if not moved:
        return graph
    out = SDG()
    for op in final.values():
        out.add_op(op)
    for op in graph.ops.values():
        for k, edge in enumerate(graph.in_edges(op)):
            out.add_edge(replace(edge, sink=final[op.id], src=final[edge.src.id],
                                 rows_at=moved.get((op.id, k), edge.rows_at)))
    state.notes.append(f"layout: {len(moved)} tiled reads delivered along their readers' axes")
    return out


def _tiled_single_slice(edge: Edge) -> bool:
    slices = edge.slices
    return len(slices) == 1 and edge.rows_at == 0 and isinstance(edge.phi[slices[0]], Slice) \
        and edge.phi[slices[0]].pad is not None


def _moved_to(op: Op, k: int) -> int | None:
    """The axis ``a > 0`` to which ``op`` (a permute), or every member of fused ``op``
    reading its input ``k``, moves the first axis of input ``k`` (keeping the other axes
    in order), or None. A ``put_row`` member that places the newest row in the input
    (``tempo.passes.newest``) is looked through: its readers must move the axis."""
    if op.kind == "permute":
        return _first_axis_move(tuple(op.params["dims"]))
    if op.kind != "fused":
        return None
    _, uses = _row_readers(op.params["members"], k)
    if not uses or any(m.kind != "permute" for m in uses):
        return None
    targets = {_first_axis_move(tuple(m.params["dims"])) for m in uses}
    return targets.pop() if len(targets) == 1 else None


def _row_readers(members: tuple, k: int) -> tuple[set[int], list]:
    """The ``put_row`` members that take input ``k`` as their rows (by index), and the
    other members reading input ``k`` or those members' values."""
    reading = [(n, m) for n, m in enumerate(members) if ("in", k) in m.args]
    puts = {n for n, m in reading if m.kind == "put_row" and m.args[0] == ("in", k)
            and ("in", k) not in m.args[1:]}
    uses = [m for n, m in reading if n not in puts]
    uses += [m for m in members if any(a[0] == "op" and a[1] in puts for a in m.args)]
    return puts, uses


def _first_axis_move(dims: tuple[int, ...]) -> int | None:
    """``a`` where ``dims`` moves axis 0 to ``a > 0`` and keeps the others in order."""
    if 0 not in dims:
        return None
    a = dims.index(0)
    rest = tuple(d for d in dims if d != 0)
    return a if a > 0 and rest == tuple(range(1, len(dims))) else None


def _without_permutes(op: Op, k: int, axis: int) -> Op:
    """``op`` without the permutes of its input ``k`` (which comes with its rows at
    ``axis``): a permute op becomes an identity, a fused op's permuting members
    identities and its ``put_row`` members of that input put their row along ``axis``."""
    if op.kind == "permute":
        return replace(op, kind="identity", params={})
    identity = op_def("identity").kernel
    members = op.params["members"]
    puts, _ = _row_readers(members, k)
    reads = {("in", k), *(("op", n, 0) for n in puts)}

    def moved(n: int, m: Any) -> Any:
        if n in puts:
            return replace(m, params={**m.params, "axis": axis})
        if m.kind == "permute" and reads & set(m.args):
            return replace(m, kind="identity", params={}, multi=False, kernel=identity)
        return m
    return replace(op, params={**op.params, "members": tuple(moved(n, m) for n, m in enumerate(members))})
