"""Gradient sums over a dim being laid out: summed in one op, or contracted.

Autodiff turns a value read at every point of a dim (a shared weight, read at each
``(b, t)``) into a ``sum_readers`` op that adds one contribution per reading point. When
``tempo.passes.parallel`` or ``tempo.passes.vectorize`` lays that dim out, the
contributions arrive stacked along a leading axis. This module holds what both passes do
with them:

- a reader sum over every point of the dim sums the stacked axis in one step
  (``ReaderSum.lead`` gains ``"sum"``) instead of reading the points one by one;
- a reader sum over the dim whose readers lack it and read all of it through one window
  (a loss's mean over ``x[0:T]``) keeps that window whole, stacked first
  (``whole_window_reads``): one sum instead of one per point;
- a per-point matmul read only by such sums (the weight gradient ``x^T g`` of each
  point) becomes one matmul contracting over the dim: ``(m, N k) @ (N k, n)`` instead of
  ``N`` stacked ``(m, n)`` products summed afterwards. For a first-layer weight of a
  large observation this is the difference between an ``(N, m, n)`` buffer and none.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from tempo.ir.graph import SDG, Edge, Op, rows_moved
from tempo.ir.readers import ReaderSum
from tempo.ir.types import TensorType
from tempo.symbolic.expr import TRUE, Slice, Symbol, const


def input_type(edge: Edge) -> TensorType:
    """What the sink reads through ``edge``: the source's type under its windows' sizes."""
    t = edge.src.outputs[edge.src_out]
    sizes = tuple(edge.phi[k].size for k in edge.slices)
    return TensorType(rows_moved((*sizes, *t.shape), edge.rows_at), t.dtype)


def sums_every_point(op: Op, edge: Edge, dim: Symbol, size: int, bounds: dict[Symbol, int]) -> bool:
    """Whether the reader sum ``op`` (reading ``edge``), whose readers are over ``dim``,
    adds the contributions of every point of ``dim`` unconditionally: stacked along
    ``dim``, they can then be summed along that axis, whatever their other dims."""
    reads: ReaderSum = op.params["reads"]
    if dim not in edge.src.domain or dim not in reads.sink_dims or dim in op.domain:
        return False
    entry = reads.inverse[reads.sink_dims.index(dim)]
    return isinstance(entry, Slice) and dim not in reads.sink_cond.symbols() \
        and all(lead == "sum" for lead in reads.lead) \
        and entry.start.substitute(bounds) is const(0) and entry.stop.substitute(bounds) is const(size)


def whole_window_reads(op: Op, edge: Edge, dim: Symbol, size: int,
                       bounds: dict[Symbol, int]) -> ReaderSum | None:
    """The reads of reader sum ``op`` (reading ``edge``) once ``dim``, which its readers
    lack, is laid out: where every reader reads all of ``dim`` through one window starting
    at 0, that window's axis is kept whole and goes first. None where they read otherwise."""
    reads: ReaderSum = op.params["reads"]
    at = op.domain.index(dim)
    if dim in edge.src.domain or dim in edge.cond.symbols() or dim in reads.sink_cond.symbols():
        return None
    windows = [n for n, (k, _) in enumerate(reads.offsets) if k == at]
    if len(windows) != 1:
        return None
    n = windows[0]
    whole = edge.src.outputs[edge.src_out].shape[len(reads.lead) + n].substitute(bounds)
    if reads.offsets[n][1].substitute(bounds) is not const(0) or whole is not const(size):
        return None
    kept = sum(1 for lead in reads.lead if lead == "keep")
    first = kept + sum(1 for k, _ in reads.offsets[:n] if k is None)
    offsets = tuple((None if k == at else shifted_position(k, at), start) for k, start in reads.offsets)
    return replace(reads, offsets=offsets, first=first)


def shifted_position(k: int | None, removed: int) -> int | None:
    """Position ``k`` of a domain once the dim at ``removed`` is gone (None: none)."""
    return k if k is None or k < removed else k - 1


def without_sink_dim(reads: ReaderSum, s: int, offsets: tuple, lead: tuple[str, ...]) -> ReaderSum:
    """``reads`` with sink dim ``s`` gone; ``lead`` says what happens to the leading
    stacked axes each ``g`` now has (``tempo.ir.readers.ReaderSum``)."""
    g_dims = tuple(k if k < s else k - 1 for k in reads.g_dims if k != s)
    return ReaderSum(reads.sink_dims[:s] + reads.sink_dims[s + 1:],
                     reads.inverse[:s] + reads.inverse[s + 1:], reads.sink_cond, offsets, g_dims,
                     lead=lead)


def summed_reader_sum(op: Op, dim: Symbol, contracted: bool) -> Op:
    """The reader sum ``op`` once its readers' dim ``dim`` is laid out: each ``g`` comes
    with a new leading axis over ``dim``, summed away, or already summed (``contracted``:
    a contracted matmul's output)."""
    reads: ReaderSum = op.params["reads"]
    s = reads.sink_dims.index(dim)
    lead = reads.lead if contracted else ("sum", *reads.lead)
    return replace(op, params={**op.params, "reads": without_sink_dim(reads, s, reads.offsets, lead)})


def contracted_matmuls(graph: SDG, laid_out: Collection[int], dim: Symbol, size: int,
                       bounds: dict[Symbol, int], keep: set[int],
                       is_row: Callable[[Edge], bool]) -> set[int]:
    """Matmuls among ``laid_out`` whose inputs are matrices read at ``dim`` itself
    (``is_row``) and which only reader sums over every point of ``dim`` read: laid out,
    each becomes one matmul contracting over the dim."""
    consumers = graph.consumers()
    out: set[int] = set()
    for k in laid_out:
        op = graph.ops[k]
        if op.kind != "matmul" or k in keep:
            continue
        edges = graph.in_edges(op)
        if not all(is_row(e) and not e.slices and input_type(e).ndim == 2 for e in edges):
            continue
        readers = consumers[k]
        if readers and all(e.sink.kind == "sum_readers" and not e.sink.params["reads"].lead
                           and sums_every_point(e.sink, e, dim, size, bounds) for e in readers):
            out.add(k)
    return out


_LAYOUT = frozenset({"permute", "unsqueeze", "squeeze", "reshape"})


def matrix_source(graph: SDG, edge: Edge) -> tuple[Edge, bool]:
    """The operand ``edge`` reads, followed back through layout ops (permutes, unit axes
    added or removed) over the same domain, read at the same point: the same read of
    the value found, whose only axes of size above 1 are the operand's two, and whether
    it holds them transposed. Stacked, that value is contiguous in its own order, so a
    contraction through it needs no transposed copy where that order is the one the
    product needs (XLA folds a transposed 2-D operand into the product; a permuted 3-D
    one it copies)."""
    axes, src, out = [0, 1], edge.src, edge.src_out  # the operand's axes in src's output
    while src.kind in _LAYOUT and len(graph.in_edges(src)) == 1:
        (before,) = graph.in_edges(src)
        moved = _axes_before(src, input_type(before), axes)
        if moved is None or before.cond is not TRUE or before.src.domain != src.domain \
                or before.phi != src.domain:
            break
        axes, src, out = moved, before.src, before.src_out
    return Edge(edge.sink, edge.sink_in, src, out, edge.phi, edge.cond), axes[0] > axes[1]


def _axes_before(op: Op, before: TensorType, axes: list[int]) -> list[int] | None:
    """Positions in ``op``'s input of its output's axes ``axes``, when every other axis
    of both has size 1 (else None)."""
    after = op.outputs[0]
    large_before, large_after = _large_axes(before), _large_axes(after)
    if large_before is None or large_after is None or len(large_before) != 2 or len(large_after) != 2:
        return None
    p = op.params
    if op.kind == "permute":
        dims = [d % after.ndim for d in p["dims"]]
        return [dims[a] for a in axes]
    if op.kind == "unsqueeze":
        at = p["dim"] % after.ndim
        return [a if a < at else a - 1 for a in axes]
    if op.kind == "squeeze":
        at = p["dim"] % before.ndim
        return [a if a < at else a + 1 for a in axes]
    if [before.shape[a] for a in large_before] != [after.shape[a] for a in large_after]:
        return None  # a reshape that moves elements
    return [large_before[large_after.index(a)] for a in axes]


def _large_axes(t: TensorType) -> list[int] | None:
    """The axes of ``t`` of size above 1 (None when a size is not a constant)."""
    if not all(d.is_const for d in t.shape):
        return None
    return [k for k, d in enumerate(t.shape) if d.value != 1]


def contraction_steps(operand: TensorType, index: int, transposed: bool, size: int,
                      split_rows: bool = False) -> list[tuple[str, dict]]:
    """The layout ops that turn ``size`` stacked values of a contracted matmul's operand
    ``index`` (type ``operand`` per point; each value holds it, or its transpose when
    ``transposed``, with unit axes anywhere) into the ``(m, N k)`` (operand 0) or
    ``(N k, n)`` (operand 1) matrix whose product sums the ``N`` products. Values that
    hold the contracted axis first are reshaped (no copy); the others are permuted (a
    copy). ``split_rows``: the values' contracted axis ``k`` may be split over devices (a
    distributed program's env rows): it becomes the major part of the merged axis, ``(k
    N)``, which XLA keeps split (each device sums its own rows, then one all-reduce); a
    split ``k`` inside ``(N k)`` is gathered whole onto every device first."""
    a, b = (d.value for d in operand.shape)
    if split_rows:
        return _rows_first_steps(a, b, index, transposed, size)
    outer, inner = (b, a) if transposed else (a, b)  # the value's two axes, in its order
    if (index == 0) == transposed:  # the contracted axis k is the value's first
        steps = [("reshape", {"shape": (const(size * outer), const(inner))})]
        return steps + [("permute", {"dims": (1, 0)})] if index == 0 else steps
    steps = [("reshape", {"shape": (const(size), const(outer), const(inner))})]
    if index == 0:
        return steps + [("permute", {"dims": (1, 0, 2)}),
                        ("reshape", {"shape": (const(outer), const(size * inner))})]
    return steps + [("permute", {"dims": (0, 2, 1)}),
                    ("reshape", {"shape": (const(size * inner), const(outer))})]


def _rows_first_steps(a: int, b: int, index: int, transposed: bool, size: int) -> list[tuple[str, dict]]:
    """``contraction_steps`` with the merged axis ``(k N)``: the ``N`` stacked values
    (the operand ``(a, b)``, or its transpose) permuted so that ``k`` leads and ``N``
    follows it, then merged."""
    value = (b, a) if transposed else (a, b)  # the value's two axes, in its order
    k_axis = 1 if (index == 0) == transposed else 2  # where k is in the stacked (N, *value)
    other = 3 - k_axis
    k, rest = value[k_axis - 1], value[other - 1]
    if index == 0:  # (m, k N)
        return [("permute", {"dims": (other, k_axis, 0)}),
                ("reshape", {"shape": (const(rest), const(k * size))})]
    return [("permute", {"dims": (k_axis, 0, other)}),
            ("reshape", {"shape": (const(k * size), const(rest))})]
