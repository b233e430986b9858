"""Whole-program passes over the SDG, between the point analysis and scheduling.

``PIPELINE`` is the list of passes, in order. Each takes the graph and the shared
``PassState`` (the needed points, which a pass keeps current for the graph it returns)
and returns the new graph; the compile report times each one and records the SDG's size.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import islpy as isl

from tempo.ir.graph import SDG
from tempo.passes.accumulate import accumulate_sums
from tempo.passes.copies import propagate_copies
from tempo.passes.dedup import merge_duplicates
from tempo.passes.defer import defer_statistics
from tempo.passes.domains import reduce_domains
from tempo.passes.fold import fold_constants
from tempo.passes.fusion import fuse_pointwise
from tempo.passes.layout import lay_out_reads
from tempo.passes.lift import lift_recurrences
from tempo.passes.newest import split_newest_rows
from tempo.passes.parallel import vectorize_parallel_dims
from tempo.passes.simplify import simplify_algebra
from tempo.passes.tile import tile_dynamic_slices
from tempo.passes.vectorize import vectorize_innermost_dim
from tempo.symbolic.expr import Symbol


@dataclass
class PassState:
    needed: isl.UnionSet
    bounds: dict[Symbol, int]
    bound_of: dict[Symbol, Symbol]
    """The bound symbol of each dim."""
    keep: set[int]
    """Ids of ops that must stay as they are (outputs: their stores are read at the end);
    fusion alone may take them into a fused op, which then exports their values
    (``renamed``)."""
    next_id: int
    notes: list[str] = field(default_factory=list)
    parallel: tuple[Symbol, ...] = ()
    """The dims declared parallel (``tp.Context(parallel=...)``)."""
    tile: int | None = None
    """Rows per tile of a padded varying-length read (None: ``tempo.passes.tile`` picks)."""
    bounded: bool = False
    """The schedule keeps memory bounded where the program allows it (the incremental
    one): passes may spend computation on it (``tempo.passes.defer``)."""
    sharded: Symbol | None = None
    """The parallel dim split over devices (``tempo.options.Distribution``): where its
    points enter the program laid out, ``tempo.passes.parallel`` places them on the mesh."""
    shapes_compiled: bool = False
    """The backend compiles a program per shape (JAX): varying-length reads are worth
    padding to a few lengths."""
    accelerator: bool = False
    """The backend runs on an accelerator: host work on a device value waits for it
    (``tempo.passes.tile`` pads the slices of values laid out along a dim there)."""
    siblings: bool = True
    """Fusion joins sibling islands (``tempo.passes.fusion``); off where that left the
    program without a schedule."""
    joined: int = 0
    """Sibling islands fusion joined."""
    renamed: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """Where the values of ``keep`` ops went when fusion took them: ``(op, out) -> (fused
    op, out)``."""


Pass = Callable[[SDG, PassState], SDG]


def fusion(graph: SDG, state: PassState) -> SDG:
    """Pointwise islands become single ops (``tempo.passes.fusion``)."""
    result = fuse_pointwise(graph, state.needed, state.bounds, state.keep, state.next_id, state.siblings)
    state.needed = result.needed
    state.renamed = result.renamed
    state.next_id += result.islands
    state.joined = result.siblings
    state.notes.append(f"fusion: {result.fused_ops} ops into {result.islands} fused ops "
                       f"({result.siblings} sibling islands joined)")
    return result.graph


PIPELINE: list[tuple[str, Pass]] = [
    ("defer", defer_statistics),     # statistics scale per-step gradients' sums (tempo.passes.defer)
    ("fold", fold_constants),        # constant expressions computed once (tempo.passes.fold)
    ("simplify", simplify_algebra),  # ops that return their operand go (tempo.passes.simplify)
    ("dedup", merge_duplicates),     # duplicate ops merged (tempo.passes.dedup)
    ("domains", reduce_domains),     # ops computed once per distinct value (tempo.passes.domains)
    ("copies", propagate_copies),    # readers of identity ops read their sources (tempo.passes.copies)
    ("parallel", vectorize_parallel_dims),  # parallel dims laid out spatially (tempo.passes.parallel)
    ("lift", lift_recurrences),      # sums over time become cumsums (tempo.passes.lift)
    ("vectorize", vectorize_innermost_dim),  # the innermost dim laid out spatially (tempo.passes.vectorize)
    ("accumulate", accumulate_sums),  # stepwise gradient sums kept running (tempo.passes.accumulate)
    ("tile", tile_dynamic_slices),   # varying-length reads padded to tiles (tempo.passes.tile)
    ("newest", split_newest_rows),   # a read of k[0:t+1] takes k[t] from its point (tempo.passes.newest)
    ("fusion", fusion),
    ("layout", lay_out_reads),       # tiled reads delivered permuted (tempo.passes.layout)
]


def run_pipeline(graph: SDG, state: PassState, enabled: Collection[str] | None,
                 after_each: Callable[[str, SDG], None]) -> SDG:
    """Run the pipeline's passes named in ``enabled`` (all when None), in order."""
    unknown = set(enabled or ()) - {name for name, _ in PIPELINE}
    if unknown:
        raise ValueError(f"unknown passes {sorted(unknown)}; the pipeline has "
                         f"{[name for name, _ in PIPELINE]}")
    for name, run in PIPELINE:
        if enabled is None or name in enabled:
            graph = run(graph, state)
            after_each(name, graph)
    return graph
