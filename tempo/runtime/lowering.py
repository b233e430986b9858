"""Loop lowering: a loop or loop nest of device ops runs as one ``lax.scan``.

The executor interprets the schedule one statement instance at a time: per step of an
acting loop, a few launches, each reading and writing tensor stores from Python. Where a
loop's bodies hold only device ops with static shapes (and merges between them, point
ops and frees), the whole loop can instead run as a single XLA loop: values the body
produces and reads in the same iteration flow directly, values read at later iterations
are the scan's carry, values produced before the loop come in as constants or as
per-iteration inputs, and the values read after the loop come out stacked and are
written to their stores. A nest is flattened into one sequence of iterations
(``tempo.runtime.nest``), so ``for i: for t:`` is one scan over the points ``(i, t)``;
its interpreted form runs its inner loops as their own lowerable loops.

Each entry's plan (``tempo.runtime.plan``) is made from its concrete points (the outer
loop counters are known then), for all iterations at once (indices, guards and dependences
compiled for NumPy arrays): every read is resolved to the iteration that produced it, or
to a store when no iteration did, so a lowered loop reads exactly what the interpreted
one would. Point ops (``symbol_value``, the coordinates random draws are keyed by) run on
the host while the plan is made, batched (``OpDef.batched``); the scan reads their
values. A loop of point ops alone (and frees) runs batched that way, with no scan. Where
reads do not fit (slices of values made in the loop, older values than the latest) or
the scan does not compile, the loop is interpreted from then on (in the executable's
later runs too), and ``LoopChoice.fallbacks`` says why.

``LoopPolicy.mode`` chooses per loop: ``"lowered"`` (the default) runs every loop that
allows it as one scan from its first entry (a decision that depends only on the program
and its sizes, so that two runs, or a run and its resumption, run the same kernels the same
way); ``"timed"`` interprets the first three entries and runs the next three lowered,
timing the last two of each (the first ones compile kernels, the scan and the stacking of
its inputs; the faster of two timings counts, so that one disturbed entry does not
decide), and keeps the faster form from then on (entries of later runs of the executable
count too: a nest entered once per run is timed over its first six runs);
``"interpreted"`` never lowers. Both forms run the same kernels, but XLA may fuse them
differently inside a scan, so results can differ in the last bits between the forms (PPO
on gymnax CartPole: losses equal to 1e-7): ``timed`` lowers a loop only when that is
clearly faster (``margin``), but which form a close call gets can differ between runs, so
its runs are not bitwise reproducible.

**Spans.** A decoder's loop over positions does not fit one scan: its attention reads
``k[0:t+1]``, a slice whose length changes with ``t``, from device buffers that its own
kernel writes (``tempo.runtime.blocks``); the buffers grow by tiles, and a host op hands
in the prompt's tokens at the first positions. Such a loop (no inner loop but under a
guard, block kernels whose slices are their own outputs' earlier rows, host ops only
under guards but sinks: ``_lowerable_in_spans``) is lowered in *spans*: stretches of
iterations over which no host op (but a sink) or inner loop runs and every block kernel
reads its buffers alike
(whole, or runs of rows of one length) without their growing. Each span is one scan that
carries the buffers and writes each iteration's rows in place (the kernel's body is the
one its launcher compiles, ``JaxBackend.block_body``); the rest is interpreted, one
launch per point. A window's ring is overwritten inside a scan only where the row it
replaces was freed at an earlier iteration (``WindowStore.first_overwritten``); a span is
at least ``MIN_SPAN`` iterations (a scan compiles once per length and buffer shape) and
holds at most ``LoopPolicy.max_stacked_mb`` of stacked outputs. While a span runs, the
scan of the next one, as it will likely be (the buffers a tile longer), compiles on a
background thread. A span reads whole buffers where the launcher would read only their
first rows (below ``blocks.WHOLE_BUFFER_SHARE``): the same values, summed over more
masked zeros. ``timed`` does not apply to spans: they always run lowered, unless the mode
is ``interpreted``. Sinks (a progress bar, ``tp.stop_when``: ``deferrable_sink``) are
called after each span, in order, with host copies of the values the scan wrote back,
once the next span is on its way (or before anything else runs). A span where a sink
runs ends at a multiple of ``SINK_SPAN`` (or of the largest power of two below it that
``max_stacked_mb`` allows), the next one or, where that would leave fewer than
``MIN_SPAN`` iterations, the one after (a span's length is part of its program: spans
mostly have one length), so that sinks lag by two spans at most, and a stop
(``tp.stop_when``) wastes two spans' work at most (the run's outputs end at the stop). On
an accelerator every span ends so (``SINK_SPAN`` says why)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tempo.errors import Uncapturable, Unlowerable
from tempo.ir.graph import SDG, Op, has_static_shapes, rows_moved
from tempo.ir.ops import param_symbols, resolve_params
from tempo.options import LoopPolicy
from tempo.runtime import nest
from tempo.runtime.blocks import WHOLE_BUFFER_SHARE, KernelBuffers
from tempo.runtime.plan import LoopPlanner, Plan, Slot, point_op, tuples
from tempo.runtime.stores import BlockStore, BufferShape, WindowStore, grown_buffers
from tempo.schedule import ast
from tempo.schedule.scheduler import Statement
from tempo.symbolic.expr import Expr, Symbol, compile_vectorized

if TYPE_CHECKING:
    from tempo.runtime.backends import JaxBackend

WARM_ENTRIES = 1
"""Entries of each form ``timed`` runs before timing that form (they compile)."""
TIMED_ENTRIES = 2
"""Entries of each form ``timed`` times; the fastest counts."""
SINK_SPAN = 64
"""Where a sink runs, spans end at multiples of this many iterations (or of a smaller
power of two, ``_sink_cap``): the sinks are called after each span. On an accelerator
every span does: on an H200 (2026-11-27, decoding 8K tokens, small config) the streamed
generation, in spans of 64, ran in 1.3 s at batch 1 and 2.2 s at batch 8, the greedy one,
in spans as long as the stacked outputs allowed (about 1,400), in 4.9-6.0 s and 5.3-5.8 s.
With greedy spans capped so too, an H100 still took about 5 s a greedy generation at batch
1 (``benchmarks/README.md``): the spans' length was not what made it slow."""

CPU_STACKED_MB = 64.0
"""``LoopPolicy.max_stacked_mb``'s default on a CPU (see there)."""
ACCELERATOR_STACKED_SHARE = 1 / 16
"""Its default on an accelerator, as a share of the memory JAX's allocator may use there
(``memory_stats()["bytes_limit"]``: by default 75% of a GPU's): there the stacked
outputs are device memory, and a loop left interpreted for them costs a launch and host
round trips per iteration (on an H100, n-step's acting loop over 3x64x64 observations at
T=250, 95 MiB stacked: see ``benchmarks/README.md``)."""


def stacked_cap_mb(policy: LoopPolicy, backend: JaxBackend) -> float:
    """The most MiB a lowered loop's outputs may hold stacked: the policy's
    ``max_stacked_mb``, or by default ``CPU_STACKED_MB`` on a CPU and
    ``ACCELERATOR_STACKED_SHARE`` of the memory its allocator may use on an accelerator
    (``CPU_STACKED_MB`` where the device does not say)."""
    if policy.max_stacked_mb is not None:
        return policy.max_stacked_mb
    limit = None if backend.on_cpu else (backend.jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    return limit * ACCELERATOR_STACKED_SHARE / 2**20 if limit else CPU_STACKED_MB


@dataclass
class LoopChoice:
    """What the run measured and chose for one lowerable loop (seconds per iteration)."""

    name: str
    statements: list[str]
    depth: int = 1
    """Loops on the longest path of the nest (1: a loop without inner loops)."""
    interpreted: float | None = None
    lowered: float | None = None
    compile_seconds: float = 0.0
    """Seconds the entries spent compiling their scans, or waiting for those compiling in
    the background (``LoopLauncher.compile_ahead``)."""
    form: str | None = None
    fallbacks: list[str] = field(default_factory=list)
    reused: int = 0
    """Lowered entries whose plan was an earlier entry's, moved (``LoopPlanner``), or the
    one made ahead of the run (the first entry, ``LoopPlanner.ahead``)."""
    entries: int = 0
    """Times the loop was entered (a nest's inner loop: only in the nest's interpreted
    entries)."""
    iterations_in_scans: int = 0
    """A loop lowered in spans: its iterations that ran in scans (``scans`` of them)."""
    interpreted_iterations: int = 0
    """A loop lowered in spans: its iterations interpreted."""
    scans: int = 0

    def __str__(self) -> str:
        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x * 1e3:.3f} ms"
        name = self.name if self.depth == 1 else f"{self.name} (a nest {self.depth} loops deep)"
        if not self.entries:
            return f"{name} [{', '.join(self.statements)}]: not entered"
        if self.form == "batched":
            return f"{name} [{', '.join(self.statements)}]: batched on the host (point ops and frees)"
        if self.form == "spans":
            why = f"; then interpreted: {self.fallbacks[0]}" if self.fallbacks else ""
            return (f"{name} [{', '.join(self.statements)}]: lowered in spans; {self.iterations_in_scans} "
                    f"iterations in {self.scans} scans, {self.interpreted_iterations} interpreted "
                    f"(compile {self.compile_seconds:.2f} s){why}")
        why = f" (interpreted: {self.fallbacks[0]})" if self.fallbacks else ""
        return (f"{name} [{', '.join(self.statements)}]: {self.form or 'undecided'}; per iteration "
                f"interpreted {ms(self.interpreted)}, lowered {ms(self.lowered)} "
                f"(compile {self.compile_seconds:.2f} s; plans reused in {self.reused} entries){why}")


# ---- finding the loops -------------------------------------------------------------------
@dataclass(frozen=True)
class Lowerable:
    """A loop (or loop nest) that statement ``L<k>`` runs at its ``outer`` counters, and
    its interpreted form: the loop with the lowerable loops inside it (a nest's inner
    loop) replaced by their own statements. ``spans``: lowered in spans (see the module
    doc)."""

    loop: ast.Loop
    outer: tuple[Symbol, ...]
    interpreted: ast.Loop
    spans: bool = False
    elsewhere: tuple[tuple[Expr, ...], ...] = ()
    """Lowered in spans: the guards of the inner loops ``loop`` leaves out (a window's
    frees after its last iteration): the iterations where one holds are interpreted."""


def peeled_iterations_back(root: ast.Node, statements: dict[str, Statement], graph: SDG,
                           bounds: dict[Symbol, int], nests: bool = True) -> ast.Node:
    """``root`` with each lowerable innermost loop given back the iterations isl peeled off
    it (``_with_peeled_iterations``): the same statement instances in the same order, but
    for frees that run later. ``lower_loops`` takes this program; the interpreted one is
    it too, so that the memory prediction walks those frees where the runs do."""
    lowerable = _lowerability(statements, graph, bounds, nests)
    held = _held_bytes(graph, bounds)

    def visit(node: ast.Node) -> ast.Node:
        if isinstance(node, ast.Seq):
            return ast.Seq(tuple(visit(c) for c in _with_peeled_iterations(_flat(node.body), lowerable,
                                                                           statements, held)))
        if isinstance(node, ast.If):
            orelse = visit(node.orelse) if node.orelse is not None else None
            return ast.If(node.cond, visit(node.then), orelse)
        if isinstance(node, ast.Loop):
            return ast.Loop(node.var, node.start, node.cond, node.step, visit(node.body))
        return node
    return visit(root)


def lower_loops(root: ast.Node, statements: dict[str, Statement], graph: SDG,
                bounds: dict[Symbol, int], nests: bool = True) -> tuple[ast.Node, dict[str, Lowerable]]:
    """``root`` (its peeled iterations back: ``peeled_iterations_back``) with each
    outermost lowerable loop or loop nest replaced by a statement ``L<k>`` at its outer
    loop counters, and what each such statement stands for. Inside a lowerable nest, the
    lowerable loops are found the same way, for its interpreted form: a nest that runs
    interpreted still runs its inner loop in the form that loop chose."""
    found: dict[str, Lowerable] = {}

    def visit(node: ast.Node, outer: tuple[Symbol, ...]) -> ast.Node:
        if isinstance(node, ast.Seq):
            return ast.Seq(tuple(visit(c, outer) for c in node.body))
        if isinstance(node, ast.If):
            orelse = visit(node.orelse, outer) if node.orelse is not None else None
            return ast.If(node.cond, visit(node.then, outer), orelse)
        if isinstance(node, ast.Loop):
            inner = ast.Loop(node.var, node.start, node.cond, node.step,
                             visit(node.body, (*outer, node.var)))
            name = f"L{len(found)}"
            if _lowerable(node, statements, graph, bounds, nests):
                found[name] = Lowerable(node, outer, inner)
                return ast.Stmt(name, outer)
            reduced, guards = _without_inner_loops(node)
            if reduced is None or not _lowerable_in_spans(reduced, statements, graph, bounds):
                return inner
            found[name] = Lowerable(reduced, outer, inner, spans=True, elsewhere=tuple(guards))
            return ast.Stmt(name, outer)
        return node
    return visit(root, ()), found


def _lowerability(statements: dict[str, Statement], graph: SDG, bounds: dict[Symbol, int],
                  nests: bool) -> Callable[[ast.Loop], bool]:
    """Whether a loop lowers, as one scan or in spans."""
    return lambda loop: _lowerable(loop, statements, graph, bounds, nests) \
        or _lowerable_in_spans(loop, statements, graph, bounds)


def _flat(body: tuple[ast.Node, ...]) -> tuple[ast.Node, ...]:
    """``body`` with the sequences nested in it spliced in (isl's AST nests them), so that
    a loop's peeled statements, in a sequence of their own, stand next to it."""
    return tuple(item for node in body
                 for item in (_flat(node.body) if isinstance(node, ast.Seq) else (node,)))


MOVED_FREES_MAX_BYTES = 4 << 20
"""The memory that guarded frees moved after a loop may keep waiting while it runs
(``_with_peeled_iterations``): 4 MiB of points per loop. PPO's acting and update loops
then take back their first iterations, the merges that start them from the iteration
before (interpreted statements an iteration: 51 -> 18 at 8 envs x 64 steps, 51 -> 15 at
512 x 250), keeping the last step's env state (18 KB at 512 envs) and the last update's
outputs the next iteration starts from (73 KB for the 64-64 actor-critic: two values per
parameter) past the loop; a model of half a million parameters keeps those frees where
isl put them."""


def _with_peeled_iterations(body: tuple[ast.Node, ...], lowerable: Callable[[ast.Loop], bool],
                            statements: dict[str, Statement],
                            held: Callable[[Statement], int | None]) -> list[ast.Node]:
    """``body`` with each lowerable innermost loop given back the iterations isl peeled
    off it into the statements around it (``nest.with_peeled_iterations``: a recurrence's
    first step, an update loop's last), where the loop stays lowerable with them: the
    peeled statements then run inside the loop's scan instead of as kernels of their own,
    each compiled a second time outside the scan (PPO's acting step and its update).
    Guarded frees among the statements before the loop (a value's last point, freed at
    the last outer iteration; the previous outer iteration's last point, which the peeled
    iteration read) move after the loop and the statements after it where the loop takes
    statements from before it: a free may run later, but its points wait for it, so the
    frees move only while what they keep (``held``: a free statement's points) totals at
    most ``MOVED_FREES_MAX_BYTES``."""
    out = list(body)
    k = 0
    while k < len(out):
        loop = out[k]
        if isinstance(loop, ast.Loop) and nest.is_nest(loop) and nest.depth(loop) == 1 and lowerable(loop):
            stop = k + 1
            while stop < len(out) and isinstance(out[stop], ast.Stmt):
                stop += 1
            start = _run_before(out, k, statements, held)
            before = [node for node in out[start:k] if isinstance(node, ast.Stmt)]
            deferred = [node for node in out[start:k] if not isinstance(node, ast.Stmt)]
            after = out[k + 1:stop]
            for take_before, take_after in ((True, True), (True, False), (False, True)):
                kept_before, unpeeled, kept_after = nest.with_peeled_iterations(
                    before if take_before else [], loop, after if take_after else [])
                if unpeeled is not loop and lowerable(unpeeled):
                    kept_after = kept_after if take_after else after
                    if take_before:
                        out[start:stop] = [*kept_before, unpeeled, *kept_after, *deferred]
                        k = start + len(kept_before)
                    else:  # (the frees stay where they were)
                        out[k:stop] = [unpeeled, *kept_after]
                    break
        k += 1
    return out


def _run_before(out: list[ast.Node], k: int, statements: dict[str, Statement],
                held: Callable[[Statement], int | None]) -> int:
    """Where the statements just before the loop ``out[k]`` begin: plain statements, and
    guarded frees that may move after it (see ``_with_peeled_iterations``)."""
    room = MOVED_FREES_MAX_BYTES
    start = k
    while start:
        node = out[start - 1]
        if not isinstance(node, ast.Stmt):
            kept = _kept_waiting(node, statements, held)
            if kept is None or kept > room:
                break
            room -= kept
        start -= 1
    return start


def _kept_waiting(node: ast.Node, statements: dict[str, Statement],
                  held: Callable[[Statement], int | None]) -> int | None:
    """The bytes that moving ``node``, a run of guarded frees, keeps waiting; None where
    ``node`` is something else, or what a free keeps is not known (``held``)."""
    if not isinstance(node, ast.If) or node.orelse is not None:
        return None
    kept = 0
    for item, _ in ast.guarded_items(node.then):
        st = statements[item.name] if isinstance(item, ast.Stmt) else None
        size = held(st) if st is not None and st.kind == "free" else None
        if size is None:
            return None
        kept += size
    return kept


def _held_bytes(graph: SDG, bounds: dict[Symbol, int]) -> Callable[[Statement], int | None]:
    """Per free statement, the bytes of one point of the outputs it frees; None where an
    output's shape varies or a reader slices its innermost dim (its points are rows of a
    block or of a window's ring, which the free may release whole or hand back for
    reuse: ``executable._store_for``). A point a lowered loop wrote back as a row of its
    stacked output (``PointStore.write_rows``, where it kept most rows) shares that array:
    if it is the last row left, it keeps the whole array, which is not counted."""
    consumers = graph.consumers()

    def held(st: Statement) -> int | None:
        total = 0
        for k in st.freed:
            size = st.op.outputs[k].nbytes(bounds)
            if size is None or any(e.src_out == k and e.slices_innermost
                                   for e in consumers.get(st.op.id, ())):
                return None
            total += size
        return total
    return held


def _lowerable(loop: ast.Loop, statements: dict[str, Statement], graph: SDG,
               bounds: dict[Symbol, int], nests: bool) -> bool:
    """A ``range`` loop, or a nest of them (``tempo.runtime.nest``), whose statements
    are device ops with static shapes and point-independent params that read points (not
    slices), merges, point ops and frees, each op executed at one place in the bodies (a
    scan), or only point ops and frees (run batched on the host: the values of point ops,
    all at once; frees, one call per store)."""
    if not nest.is_nest(loop) or (nest.depth(loop) > 1 and not nests):
        return False
    body = [item.stmt for item in nest.levels_and_items(nest.unpeeled(loop))[1]]
    ops = [statements[s.name].op for s in body if statements[s.name].kind == "exec"]
    execs = [op for op in ops if not point_op(op)]
    if not execs:
        return bool(body)
    once = len({op.id for op in execs}) == len(execs)  # not unrolled (S4(c, 0); S4(c, 1))
    return once and any(op.kind != "merge" for op in execs) and all(
        _device_op(op, graph, bounds) and not any(e.slices for e in graph.in_edges(op)) for op in execs)


def _without_inner_loops(loop: ast.Loop) -> tuple[ast.Loop | None, list[tuple[Expr, ...]]]:
    """``loop`` without the inner loops its body runs under a guard, and their guards
    (None where an inner loop runs at every iteration)."""
    items = ast.guarded_items(loop.body)
    guards = [guard for node, guard in items if isinstance(node, ast.Loop)]
    if not all(guards):
        return None, []
    body = tuple(_under(node, guard) for node, guard in items if isinstance(node, ast.Stmt))
    return ast.Loop(loop.var, loop.start, loop.cond, loop.step, ast.Seq(body)), guards


def _under(node: ast.Node, guard: tuple[Expr, ...]) -> ast.Node:
    """``node`` under the conditions ``guard``, one ``If`` each."""
    for cond in reversed(guard):
        node = ast.If(cond, node)
    return node


def _lowerable_in_spans(loop: ast.Loop, statements: dict[str, Statement], graph: SDG,
                        bounds: dict[Symbol, int]) -> bool:
    """A ``range`` loop without inner loops whose statements are those of a lowerable
    loop (``_lowerable``), block kernels (``_block_kernel_op``: one at least), host ops
    that run at some iterations only (guarded: a decoder's prompt), and sinks anywhere
    (``deferrable_sink``: called after each span)."""
    if not nest.is_nest(loop) or nest.depth(loop) > 1:
        return False
    items = nest.levels_and_items(nest.unpeeled(loop))[1]
    execs = [(statements[item.stmt.name].op, item.guard) for item in items
             if statements[item.stmt.name].kind == "exec" and not point_op(statements[item.stmt.name].op)]
    if len({op.id for op, _ in execs}) != len(execs) or not any(_block_kernel_op(op, graph, bounds)
                                                                 for op, _ in execs):
        return False
    return all(_block_kernel_op(op, graph, bounds) or op.definition.host and guard
               or deferrable_sink(op, graph)
               or _device_op(op, graph, bounds) and not any(e.slices for e in graph.in_edges(op))
               for op, guard in execs)


def deferrable_sink(op: Op, graph: SDG) -> bool:
    """A host op without outputs (``tp.sink``, ``tp.stop_when``) reading points, each of a
    value read nowhere through a slice (kept in a point store): in a loop lowered in
    spans, its calls can wait for the end of a span, in order; nothing the loop computes
    depends on them."""
    return op.definition.host and not op.outputs and all(
        not e.slices and not any(r.slices and r.src_out == e.src_out for r in graph.out_edges(e.src))
        for e in graph.in_edges(op))


def _block_kernel_op(op: Op, graph: SDG, bounds: dict[Symbol, int]) -> bool:
    """A fused device op whose slice reads are all tiled reads of its own outputs' earlier
    rows along the loop's dim (``tempo.passes.newest``) and whose outputs have one shape
    (no padded value leaves it): on JAX its kernel writes those rows into device buffers
    and reads them there (``tempo.runtime.blocks``), and a scan can carry the buffers."""
    edges = graph.in_edges(op)
    slices = [e for e in edges if e.slices]
    known = set(bounds)
    return bool(slices) and op.kind == "fused" and not op.definition.host \
        and not (param_symbols(op.params) & set(op.domain)) \
        and has_static_shapes(op, edges, known, tiled=True) \
        and all(d.symbols() <= known for t in op.outputs for d in t.shape) \
        and all(e.tiled and e.src.id == op.id and e.slices == (len(e.phi) - 1,) for e in slices)


def _device_op(op: Op, graph: SDG, bounds: dict[Symbol, int]) -> bool:
    if op.kind == "merge":
        return has_static_shapes(op, graph.in_edges(op), set(bounds))
    return (not op.definition.host and op.kind != "sum_readers"
            and not (param_symbols(op.params) & set(op.domain))
            and has_static_shapes(op, graph.in_edges(op), set(bounds)))


# ---- running a loop ----------------------------------------------------------------------
class LoopLauncher:
    """Runs one lowerable loop (statement ``L<k>``) at its outer counters, in the form its
    policy chooses. Made once per executable: its compiled scans, plan templates and
    timings serve every run; ``bind`` gives it a run's stores and statements."""

    def __init__(self, lowerable: Lowerable, statements: dict[str, Statement], graph: SDG,
                 bounds: dict[Symbol, int], backend: JaxBackend, policy: LoopPolicy, choice: LoopChoice):
        loop, outer = lowerable.loop, lowerable.outer
        self.bounds, self.backend, self.policy, self.choice = bounds, backend, policy, choice
        self.max_stacked_mb = stacked_cap_mb(policy, backend)
        deferred = _sinks(loop, statements, graph) if lowerable.spans else frozenset()
        self.planner = LoopPlanner(loop, outer, statements, graph, bounds, backend, deferred)
        self.execs = self.planner.execs
        self.interpret = _interpreter(lowerable.interpreted, [v.name for v in outer])
        self.spans = _span_interpreter(lowerable.interpreted, [v.name for v in outer]) \
            if lowerable.spans else None
        """A loop lowered in spans: its body interpreted at given counter values."""
        self.sinks = _span_interpreter(_only(loop, deferred), [v.name for v in outer]) if deferred else None
        """A loop lowered in spans with sinks: its sinks at given counter values (after a
        span)."""
        self.elsewhere = [compile_vectorized(guard, [*outer, loop.var]) for guard in lowerable.elsewhere]
        """Per inner loop a loop lowered in spans leaves out, its guard, for NumPy arrays."""
        self._row_bytes: list[int] | None = None
        """Per exec, the bytes of its outputs a scan would stack per iteration (not those
        written into buffers; ``_most_stacked``)."""
        self._slice_bounds: dict[tuple[int, int], Callable] = {}
        """Per slice read of a block kernel (a loop lowered in spans): its start, stop and
        rows, for NumPy arrays."""
        self.traced: dict[tuple, Callable] = {}
        """Compiled scans by plan signature."""
        self.jitted: dict[tuple, Callable] = {}
        """Their jitted (traceable) functions, by signature, for iterations captured whole
        (``tempo.runtime.capture``)."""
        self.span_seconds = 0.0
        """A loop lowered in spans: the seconds its scans took (planned, compiled, run)."""
        self.compiling: dict[tuple, Future] = {}
        """Scans compiling in the background by signature (a loop lowered in spans: the
        next span's, ``_compile_next``)."""
        self.ahead_types: dict[tuple, tuple] = {}
        """Per scan compiling ahead of its entry (``compile_ahead``), the types it was
        compiled for (``_types``)."""
        self.collective: dict[tuple, bool] = {}
        """Per plan signature, whether the scan communicates between devices (then it runs
        alone: ``JaxBackend.one_at_a_time``)."""
        self.timings = 0
        self.last_form = ""
        self.stores: dict = {}
        self.namespace: dict[str, Callable] = {}
        self.wait_for_outputs = False
        """A lowered entry returns once its outputs are computed (set by the profiler; a
        scan that holds a collective over several CPU devices always does)."""
        self._compiling = 0.0

    def bind(self, stores: dict, namespace: dict[str, Callable], batched: dict[str, Callable]) -> None:
        """Run with a run's ``stores``, its statements (``namespace``: what the interpreted
        form calls) and its batched point ops."""
        self.stores, self.namespace = stores, namespace
        self.planner.bind(stores, batched)
        self.wait_for_outputs = False

    def __call__(self, outer: tuple[int, ...]) -> None:
        self.choice.entries += 1
        space = self.planner.space(outer)
        if self.spans is not None:
            self._run_in_spans(outer, space)
            return
        if not self.execs:  # point ops and frees only: always cheaper batched
            self.choice.form = self.last_form = "batched"
            self._run_batched(outer, space)
            return
        form, timed = self._form(space.trips)
        self._compiling = 0.0
        if timed:  # charge neither form with device work dispatched before the loop
            self._wait_for_stores()
        begin = time.perf_counter()
        if form == "lowered":
            try:
                reused = self.planner.reused
                plan = self.planner.plan(outer, space)
                self.choice.reused += self.planner.reused - reused
                self._run_lowered(plan)
            except Unlowerable as why:
                if self.backend.capturing:  # (an iteration traced: its loops run as they did)
                    raise Uncapturable(f"loop {self.choice.name}: {why}") from why
                self.choice.fallbacks.append(str(why))
                form = "interpreted"
        self.last_form = form
        if form == "interpreted":
            self.interpret(self.namespace, *outer)
        if timed:
            self._wait_for_stores()
            self._record(form, (time.perf_counter() - begin - self._compiling) / space.trips)

    def compile_ahead(self, outer: tuple[int, ...]) -> None:
        """Plan the entry at ``outer`` now (``LoopPlanner.ahead``) and start compiling its
        scan on the background thread, where the entry will run lowered (the policy's
        ``lowered`` mode): an executable's first run compiles its loops' scans while it
        runs what comes before them (PPO's update scan while its acting loop runs)."""
        if self.spans is not None or not self.execs or self.policy.mode != "lowered" or self.choice.fallbacks:
            return
        space = self.planner.space(outer)
        if space.trips < self.policy.min_trips:
            return
        plan = self.planner.ahead(outer, space)
        if plan is None or plan.signature in self.traced or plan.signature in self.compiling \
                or self._stacked_bytes(plan) / 2**20 > self.max_stacked_mb:
            return
        args = plan.arguments
        self.compiling[plan.signature] = self.backend.compile_in_background(self._jitted(plan, None), args)
        self.ahead_types[plan.signature] = self._types(args)

    def cancel_waiting(self) -> None:
        """Drop the scans compiling ahead that have not started (a run that did not reach
        their entry, or reached it with another plan: a later run compiles what it needs)."""
        for signature in list(self.ahead_types):
            if self.compiling[signature].cancel():
                del self.compiling[signature], self.ahead_types[signature]

    def _types(self, args: tuple) -> tuple:
        """The structure of a scan's arguments and each one's shape and dtype: a program
        compiled ahead for these takes them."""
        leaves, tree = self.backend.jax.tree_util.tree_flatten(args)
        return tree, tuple(_type_of(a) for a in leaves)

    def _form(self, trips: int) -> tuple[str, bool]:
        """The form of this entry, and whether it is timed. ``timed`` runs three entries
        of each form and times the last two of each (the first compiles: the body's
        kernels, the scan, the stacking of its inputs), then keeps the lowered form if its
        faster timing was clearly faster than the interpreted form's."""
        choice = self.choice
        if self.policy.mode == "interpreted" or trips < self.policy.min_trips or choice.fallbacks:
            return "interpreted", False
        if self.policy.mode == "lowered":
            choice.form = "lowered"
            return "lowered", False
        if choice.form is not None:
            return choice.form, False
        self.timings += 1
        per_form = WARM_ENTRIES + TIMED_ENTRIES
        form = "interpreted" if self.timings <= per_form else "lowered"
        return form, (self.timings - 1) % per_form >= WARM_ENTRIES

    def _record(self, form: str, seconds: float) -> None:
        choice = self.choice
        if form == "interpreted":
            choice.interpreted = seconds if choice.interpreted is None else min(choice.interpreted, seconds)
        else:
            choice.lowered = seconds if choice.lowered is None else min(choice.lowered, seconds)
        if self.timings == 2 * (WARM_ENTRIES + TIMED_ENTRIES) and choice.interpreted is not None \
                and choice.lowered is not None:
            faster = choice.lowered < (1.0 - self.policy.margin) * choice.interpreted
            choice.form = "lowered" if faster else "interpreted"

    def _wait_for_stores(self) -> None:
        """Wait for every stored device value: points, and block stores' device buffers."""
        points = [store.data for store in self.stores.values() if hasattr(store, "data")]
        buffers = [list(store.blocks.values()) for store in self.stores.values()
                   if isinstance(store, BlockStore) and store.buffers.on_device]
        self.backend.synchronize([*([*data.values(), *(v for v, _ in data.rows.values())] for data in points),
                                  *buffers])

    def _run_batched(self, outer: tuple[int, ...], space: nest.Space) -> None:
        """A loop of point ops and frees: each statement at all its points at once (a
        point is made before it is freed, so statement order is enough)."""
        for name, st, iterations, coords in self.planner.instances(outer, space):
            points = tuples(coords, len(iterations))
            if st.kind == "free":
                self._free(st.op, st.freed, points)
            elif points:
                self.planner.batched[name](coords, points)

    def _run_in_spans(self, outer: tuple[int, ...], space: nest.Space) -> None:
        """A loop with block kernels, in spans (see the module doc): the iterations where
        a host op or an inner loop runs, or too few for a scan, interpreted; the others as
        scans."""
        choice = self.choice
        if choice.fallbacks:  # (a span failed in an earlier entry)
            self.interpret(self.namespace, *outer)
            return
        choice.form = self.last_form = "spans"
        values = space.counters[self.planner.nest.vars[0]].tolist()
        instances = {name: (st, iterations, coords)
                     for name, st, iterations, coords in self.planner.instances(outer, space)}
        apart = self._apart(outer, space, instances)
        frees: dict[tuple[int, int], dict[int, int]] = {}  # per ring, its points' frees (when needed)
        try:
            self._spans_of_entry(outer, space, values, instances, apart, frees)
        finally:
            self.compiling.clear()  # predictions no span took (their programs are dropped when done)

    def _spans_of_entry(self, outer: tuple[int, ...], space: nest.Space, values: list[int],
                        instances: dict, apart: np.ndarray, frees: dict) -> None:
        """The entry's iterations, each interpreted or in a span (``_span_at``). A span's
        sinks are called once the next span is on its way (the device is not left idle
        while they wait for the span's values), or before anything else runs."""
        choice = self.choice
        sinks_at, sink_frees = None, []
        if self.sinks is not None:
            sinks_at = np.zeros(space.trips, bool)
            for name in self.planner.deferred:
                sinks_at[instances[name][1]] = True
            sink_frees = self._frees_of_sinks_reads(instances)
        n, waiting = 0, None  # (the span whose sinks wait: its iterations and values)
        while n < space.trips:
            span = None if apart[n] else self._span_at(n, space.trips, apart, sinks_at, instances, frees)
            if not isinstance(span, _Span):
                self._call_sinks(waiting, outer, values, sink_frees)
                waiting = None
                stop = n + 1 if span is None else span
                while stop < space.trips and apart[stop] and apart[n]:
                    stop += 1
                self.spans(self.namespace, values[n:stop], *outer)
                choice.interpreted_iterations += stop - n
                n = stop
                continue
            begin = time.perf_counter()
            try:
                read = self._run_lowered(self.planner.plan(outer, space.span(n, span.stop)), span)
            except Unlowerable as why:  # the rest, and the later entries, interpreted
                choice.fallbacks.append(str(why))
                self._call_sinks(waiting, outer, values, sink_frees)
                self.spans(self.namespace, values[n:], *outer)
                choice.interpreted_iterations += space.trips - n
                return
            self.span_seconds += time.perf_counter() - begin
            choice.iterations_in_scans += span.stop - n
            choice.scans += 1
            self._call_sinks(waiting, outer, values, sink_frees)
            waiting = (n, span.stop, read) if self.sinks is not None else None
            n = span.stop
        self._call_sinks(waiting, outer, values, sink_frees)

    def _frees_of_sinks_reads(self, instances: dict) -> list[tuple[Op, tuple[int, ...], np.ndarray, tuple]]:
        """The entry's frees of points the sinks read (the scan leaves them to
        ``_call_sinks``): per free statement, its op, those outputs, iterations and points."""
        kept = self.planner.deferred_keys
        frees = []
        for st, iterations, coords in instances.values():
            outputs = tuple(k for k in st.freed if (st.op.id, k) in kept) if st.kind == "free" else ()
            if outputs:
                frees.append((st.op, outputs, iterations, coords))
        return frees

    def _call_sinks(self, span: tuple[int, int, list] | None, outer: tuple[int, ...], values: list[int],
                    frees: list[tuple[Op, tuple[int, ...], np.ndarray, tuple]]) -> None:
        """The sinks of the iterations ``start .. stop - 1`` of a span (``span``: those and
        the stacked values of the span the sinks read), in order, then the ``frees`` of the
        points they read there (``_frees_of_sinks_reads``). The sinks read the values' host
        copies: a slice on the device would wait for the scan dispatched since."""
        if span is None:
            return
        start, stop, read = span
        with contextlib.ExitStack() as on_host:
            for store, stacked in read:
                on_host.enter_context(store.rows_on_host(stacked, self.backend.to_host(stacked)))
            self.sinks(self.namespace, values[start:stop], *outer)
        for op, outputs, iterations, coords in frees:
            mask = (iterations >= start) & (iterations < stop)
            if mask.any():
                self._free(op, outputs, tuples(tuple(c[mask] for c in coords), int(mask.sum())))

    def _apart(self, outer: tuple[int, ...], space: nest.Space, instances: dict) -> np.ndarray:
        """Per iteration of an entry, whether it is interpreted whatever the buffers: a
        host op (but a sink, called after its span) or an inner loop runs there."""
        apart = np.zeros(space.trips, bool)
        for name, (st, iterations, _) in instances.items():
            if st.kind == "exec" and st.op.definition.host and not point_op(st.op) \
                    and name not in self.planner.deferred:
                apart[iterations] = True
        counters = [space.counters[v] for v in self.planner.nest.vars]
        for guard in self.elsewhere:
            apart |= np.logical_and.reduce([np.broadcast_to(c, apart.shape)
                                            for c in guard(*outer, *counters)])
        return apart

    def _span_at(self, n: int, trips: int, apart: np.ndarray, sinks_at: np.ndarray | None,
                 instances: dict, frees: dict[tuple[int, int], dict[int, int]]) -> _Span | int:
        """The span from iteration ``n`` (the block kernels' buffers made or grown for
        it), or where the iterations to interpret from ``n`` end (after ``n``): a span
        lasts while no host op or inner loop runs (``apart``), its outputs stacked stay
        within ``max_stacked_mb``, and every block kernel can run there as one scan
        (``_kernel_part``); one shorter than ``MIN_SPAN`` iterations is interpreted. Where
        sinks run (``sinks_at``), and everywhere on an accelerator (``SINK_SPAN``), a span
        also ends at the next multiple of its ``cap`` (``_sink_cap``), or at the one after
        where the first would leave it shorter than ``MIN_SPAN``."""
        stop = n + int(np.argmax(apart[n:])) if apart[n:].any() else trips
        most = self._most_stacked(n, stop, instances)
        cap = None
        if not self.backend.on_cpu or sinks_at is not None and sinks_at[n:min(stop, n + most)].any():
            cap = _sink_cap(most)
            stop = min(stop, n + _sink_span(n, cap, most))
        stop = min(stop, n + most)
        parts = []
        for pos, layout in self.planner.buffered.items():
            if stop - n < MIN_SPAN:
                break
            part = self._kernel_part(pos, layout, n, stop, instances, frees)
            if isinstance(part, int):
                return part
            stop = n + len(part.ks)
            parts.append(part)
        if stop - n < MIN_SPAN:
            return max(stop, n + 1)
        return _Span.of(parts, n, stop, trips, most, cap)

    def _kernel_part(self, pos: int, layout: KernelBuffers, n: int, stop: int, instances: dict,
                     frees: dict[tuple[int, int], dict[int, int]]) -> _Part | int:
        """Block kernel ``pos`` from iteration ``n`` (at most to ``stop``): its buffers
        made or grown as its launch at ``n`` would (a ring made, never grown here), and
        for how many iterations it runs at consecutive points of one prefix, the buffers
        hold the rows it writes without growing (a ring: without overwriting a row still
        needed, ``WindowStore.first_overwritten``) and it reads them alike
        (``_block_reads``). Where it does not run at ``n``, or its reads do not fit there:
        where to interpret to."""
        op = self.execs[pos][0]
        _, iterations, coords = instances[self.planner.items[self.planner.exec_items[pos]][0]]
        at = int(np.searchsorted(iterations, n))
        if at >= len(iterations) or iterations[at] != n:
            return n + 1
        its = iterations[at:at + stop - n]
        count = _leading(its == np.arange(n, n + len(its)))
        points = [c[at:at + count] for c in coords]
        count = min([_leading(c == c[0]) for c in points[:-1]], default=count)
        points = [c[:count] for c in points]
        prefix = tuple(int(c[0]) for c in points[:-1])
        ks = points[-1]
        with grown_buffers:
            for store in layout.targets:
                store.buffer_at((*prefix, int(ks[0])))
        reads = self._block_reads(pos, layout, points, prefix)
        if reads.unfit:  # (interpreted a few at a time: the buffers may grow meanwhile)
            return n + min(reads.unfit, MIN_SPAN)
        count, counts, starts = reads.alike, reads.counts, reads.starts
        for k, store in zip(layout.written, layout.targets):
            if isinstance(store, WindowStore):
                if (op.id, k) not in frees:
                    frees[(op.id, k)] = _frees_of(op.id, k, instances)
                count = store.first_overwritten(prefix, ks[:count].tolist(), n, frees[(op.id, k)])
            else:
                count = _leading(ks[:count] < store.blocks[prefix].shape[store.rows_axis])
        return _Part(pos, op.id, layout, prefix, ks[:count], counts, [first[:count] for first in starts])

    def _most_stacked(self, n: int, stop: int, instances: dict) -> int:
        """The most iterations a span from iteration ``n`` (to ``stop`` at most) may have
        for its outputs stacked over them to stay within ``LoopPolicy.max_stacked_mb``: an
        upper bound, counting every output of the ops that run there but the rows written
        into buffers (the constants a loop makes at its first iteration do not count after
        it)."""
        if self._row_bytes is None:
            self._row_bytes = [sum(self._output_bytes((op.id, k)) for k in range(len(op.outputs))
                                   if (op.id, k) not in self.planner.in_buffers) for op, _ in self.execs]
        row = 0
        for pos, nbytes in enumerate(self._row_bytes):
            iterations = instances[self.planner.items[self.planner.exec_items[pos]][0]][1]
            at = int(np.searchsorted(iterations, n))
            if at < len(iterations) and iterations[at] < stop:
                row += nbytes
        return int(self.max_stacked_mb * 2**20 // max(row, 1))

    def _block_reads(self, pos: int, layout: KernelBuffers, points: list[np.ndarray],
                     prefix: tuple[int, ...]) -> _Reads:
        """How a block kernel reads its buffers at its ``points`` from the first on, as
        its launcher may (``blocks.KernelBuffers``): for how many points they read alike,
        the rows each read takes and, per read, its first row at each point. Whole
        buffers where every read may take its whole buffer: where ``widens``, reads of the
        first rows of buffers of one length that grow by tiles (``BlockStore.step``: a
        tile at most is masked) or that the reads cover for more than
        ``WHOLE_BUFFER_SHARE``; where ``rings``, reads as long as the rings that start
        together and whose points fill the ring or start at its first row
        (``WindowStore.ring_slice``). Else runs of the buffer's rows inside it, as long at
        every point. Where the first point reads neither way: for how many points that
        holds (``_Reads.unfit``)."""
        op, edges = self.execs[pos]
        lengths = [store.blocks[prefix].shape[store.rows_axis] for store in layout.sources]
        reads = []
        for k in layout.blocks:
            bounds = self._slice_bounds.get((op.id, k))
            if bounds is None:
                entry = edges[k].phi[-1]
                bounds = self._slice_bounds[(op.id, k)] = compile_vectorized(
                    [entry.start, entry.stop, entry.size], op.domain, self.bounds)
            reads.append(bounds(*points))
        starts = [start for start, _, _ in reads]
        together = np.logical_and.reduce([start == starts[0] for start in starts])
        if layout.rings:
            whole = together
            for (start, stop, size), store in zip(reads, layout.sources):
                capacity = store.capacity[prefix]
                whole &= (size == capacity) & ((np.maximum(0, stop - start) + 1 == capacity)
                                               | (start % capacity == 0))
        elif layout.widens and len(set(lengths)) == 1:  # as ``blocks.whole_buffers`` (a growing
            whole = np.logical_and.reduce([start == 0 for start in starts])  # buffer: always)
            if not all(store.step for store in layout.sources):
                whole &= np.logical_and.reduce([size > WHOLE_BUFFER_SHARE * length
                                                for (_, _, size), length in zip(reads, lengths)])
        else:
            whole = np.zeros(len(starts[0]), bool)
        if whole[0]:
            return _Reads(_leading(whole), tuple(lengths), [np.zeros(len(whole), np.int64) for _ in reads])
        rows = [store.rows_of(prefix, start) for (start, _, _), store in zip(reads, layout.sources)]
        inside = [first + size <= length for (_, _, size), first, length in zip(reads, rows, lengths)]
        sliced = ~whole & np.logical_and.reduce(inside)
        if not sliced[0]:
            return _Reads(0, (), [], unfit=_leading(~(whole | sliced)))
        sliced &= np.logical_and.reduce([size == size[0] for _, _, size in reads])
        return _Reads(_leading(sliced), tuple(int(size[0]) for _, _, size in reads), rows)

    def _free(self, op: Op, outputs: tuple[int, ...], points: list[tuple]) -> None:
        for k in outputs:
            self.stores[(op.id, k)].free_many(points)

    def _run_lowered(self, plan: Plan, span: _Span | None = None) -> list[tuple[Any, Any]]:
        """Run one entry (or span) as its scan, and write back what it made. Returns the
        stacked outputs the loop's sinks read, with their stores, their copy to the host
        started (``_call_sinks``)."""
        signature = plan.signature if span is None else (plan.signature, span.signature)
        fn = self.traced.get(signature)
        if self.backend.capturing:  # traced into an iteration's program (``tempo.runtime.capture``)
            if fn is None or span is not None:
                raise Uncapturable(f"loop {self.choice.name} has no scan for this entry yet")
            if signature not in self.jitted:
                self.jitted[signature] = self._jitted(plan, None)
            fn = self.jitted[signature]
        elif fn is None:  # (a traced plan's outputs fit: their size is part of its signature)
            stacked = self._stacked_bytes(plan) / 2**20
            if stacked > self.max_stacked_mb:
                raise Unlowerable(f"its outputs stacked over the loop would hold {stacked:.0f} MiB, more "
                                  f"than LoopPolicy.max_stacked_mb={self.max_stacked_mb:g}")
        args = plan.arguments
        if span is not None:
            args = (*args, span.buffers, span.rows, span.starts)
        if fn is None:
            begin = time.perf_counter()
            try:
                ahead = self.compiling.pop(signature, None)
                expected = self.ahead_types.pop(signature, None)
                if ahead is not None and expected not in (None, self._types(args)):
                    ahead.cancel()  # compiled ahead for other types (not expected): compiled again
                    ahead = None
                fn = ahead.result() if ahead is not None else self._jitted(plan, span).lower(*args).compile()
            except Exception as err:  # a kernel that does not trace inside a scan
                raise Unlowerable(f"the scan did not compile: {type(err).__name__}: {err}") from err
            self._compiling = time.perf_counter() - begin
            self.choice.compile_seconds += self._compiling
            self.traced[signature] = fn
            backend = self.backend
            self.collective[signature] = backend.one_at_a_time and backend.holds_collectives(fn)
        frees = plan.frees
        if span is None:
            last, outputs = fn(*args)
        else:
            self._compile_next(plan, span)
            last, outputs, buffers = fn(*args)
            for op, freed, points in frees:  # the points made before it that the span frees
                self._free(op, freed, points)
            frees = []
            span.written_back(plan, buffers)
        if not self.backend.capturing and (self.wait_for_outputs or self.collective[signature]):
            self.backend.synchronize((last, outputs))
        lasts: dict[int, tuple] = {}  # per op: its point at the last iteration (its outputs share it)
        for key in plan.finals:  # the one kept point, made at the last iteration
            point = lasts.get(key[0])
            if point is None:
                point = lasts[key[0]] = plan.made[key].last
            self.stores[key].write(point, last[key])
        sparse = {key for key, _ in plan.sparse}
        read = []
        for key, values in zip(plan.exported, outputs):
            if key in self.planner.deferred_keys and self.backend.mesh is None \
                    and hasattr(self.stores[key], "rows_on_host"):  # (split rows: sliced as before)
                values.copy_to_host_async()
                read.append((self.stores[key], values))
            made = plan.made[key]
            if key in self.planner.blocks:  # every row, then the frees: a block is released when
                rows = list(range(len(made.rows))) if key in sparse else made.rows  # all its rows
                self.stores[key].write_rows(made.points, values, rows)
                self.stores[key].free_many([p for p, freed in zip(made.points, made.freed) if freed])
            else:
                rows, points = made.kept
                self.stores[key].write_rows(points, values, made.kept_runs if key in sparse else rows)
        for op, freed, points in frees:
            self._free(op, freed, points)
        return read

    def _jitted(self, plan: Plan, span: _Span | None) -> Callable:
        """The scan of ``plan`` (and ``span``), jitted; a span's buffers are donated."""
        return self.backend.jax.jit(self._scan(plan, span), donate_argnums=(6,) if span is not None else ())

    def _compile_next(self, plan: Plan, span: _Span) -> None:
        """Start compiling, on a background thread, the scan of the span after ``span``
        as it will likely be (``_Span.grown``: a decoder's next tile), while ``span`` runs.
        Its plan is taken to be this one's, moved (``LoopPlanner``'s templates)."""
        grown = span.grown()
        if grown is None or plan.sparse:
            return
        nxt, trips = replace(plan, trips=grown.trips), grown.trips
        signature = (nxt.signature, grown.signature)
        if signature in self.traced or signature in self.compiling:
            return
        jax = self.backend.jax

        def per_iteration(values: list) -> list:
            return [jax.ShapeDtypeStruct((trips, *np.shape(v)[1:]), v.dtype) for v in values]
        specs = (plan.consts, per_iteration(plan.stacked), per_iteration(plan.branches),
                 per_iteration(plan.active), per_iteration(plan.rows_at), plan.carry_init, grown.buffers,
                 grown.rows, grown.starts)
        self.compiling[signature] = self.backend.compile_in_background(self._jitted(nxt, grown), specs)

    def _stacked_bytes(self, plan: Plan) -> int:
        """Bytes of the plan's outputs stacked over the entry's iterations (or runs)."""
        rows = dict(plan.sparse)
        return sum(rows.get(key, plan.trips) * self._output_bytes(key) for key in plan.exported)

    def _output_bytes(self, key: tuple[int, int]) -> int:
        """Bytes of one point of a body op's output ``key``."""
        shape, dtype = self.planner.output_type(key)
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

    def _scan(self, plan: Plan, span: _Span | None = None) -> Callable:
        """The loop as a function of the plan's values (and a span's buffers and the rows
        each iteration writes them at), for ``jax.jit``."""
        jax, xp = self.backend.jax, self.backend.xp
        in_buffers = {} if span is None else self._block_bodies(span)
        slots, runs = plan.slots, plan.runs
        carried = sorted({*plan.carries, *plan.masked, *plan.finals})
        masked = {key: n for n, key in enumerate(plan.masked)}
        sparse = {key: n for n, (key, _) in enumerate(plan.sparse)}
        sparse_rows = []  # per sparse output: a row per run, and one where the op does not run
        for key, count in plan.sparse:
            shape, dtype = self.planner.output_type(key)
            sparse_rows.append(((count + 1, *shape), dtype))
        # Made in the program: as arguments, zeros are moved in at every call (over a mesh
        # of forced CPU devices, PPO's update scan's 9 were copied to each device each time).
        zeros = {key: self.planner.output_type(key) for key in plan.zeros}
        merges = [pos for pos, (op, _) in enumerate(self.execs) if op.kind == "merge"]
        kernels = [(op, op.definition.kernel, resolve_params(op.params, self.bounds))
                   for op, _ in self.execs]

        def run(consts: list, stacked: list, branches: list, active: list, rows_at: list,
                init: dict, buffers: tuple = (), puts: tuple = (), starts: tuple = ()) -> Any:
            def step(state: tuple, xs: tuple) -> tuple[tuple, tuple]:
                carry, rows, held = state
                per_step, branch, runs_now, row_now, put_now, start_now = xs
                held = list(held)
                values: dict[tuple[int, int], Any] = {}

                def made(key: tuple[int, int], out: Any) -> None:
                    """An op's output; where the op does not run, its latest value."""
                    n = masked.get(key)
                    values[key] = out if n is None else xp.where(runs_now[n], out, carry[key])

                def value(slot: Slot) -> Any:
                    if slot.kind == "body":
                        return values[slot.key]
                    if slot.kind == "carry":
                        return carry[slot.key]
                    return consts[slot.key] if slot.kind == "const" else per_step[slot.key]
                for pos, (op, kernel, params) in enumerate(kernels):
                    if not runs[pos]:  # its values are read nowhere in this entry
                        continue
                    row = slots[pos]
                    if pos in in_buffers:  # a block kernel: reads and writes the carried buffers
                        body, counts, where, unwritten, first = in_buffers[pos]
                        reads = iter(start_now[first:first + len(counts)])
                        inputs = [next(reads) if s.kind == "buffer" else value(s) for s in row]
                        outs, written = body(counts, *inputs, *(held[n] for n in where),
                                             *(put_now[n] for n in where))
                        for n, block in zip(where, written):
                            held[n] = block
                        for k, out in zip(unwritten, outs):
                            made((op.id, k), out)
                        continue
                    if op.kind == "merge":
                        chosen = branch[merges.index(pos)]
                        out = value(row[0])  # (its row: the branches taken, ``_canonical_merges``)
                        for k, slot in enumerate(row[1:], 1):
                            out = xp.where(chosen == k, value(slot), out)
                        made((op.id, 0), out)
                        continue
                    outs = kernel(xp, params, *(value(s) for s in row))
                    for k, out in enumerate(outs if op.definition.multi_output else (outs,)):
                        made((op.id, k), out)
                rows = tuple(jax.lax.dynamic_update_index_in_dim(rows[n], values[key], row_now[n], 0)
                             for key, n in sparse.items())
                return ({key: values[key] for key in carried}, rows, tuple(held)), \
                    tuple(values[key] for key in plan.exported if key not in sparse)
            empty = tuple(xp.zeros(shape, dtype) for shape, dtype in sparse_rows)
            init = {**init, **{key: xp.zeros(shape, dtype) for key, (shape, dtype) in zeros.items()}}
            xs = (stacked, branches, active, rows_at, puts, starts)
            (last, rows, held), per_iteration = jax.lax.scan(step, (init, empty, tuple(buffers)), xs,
                                                             length=plan.trips)
            dense = iter(per_iteration)
            outputs = tuple(rows[sparse[key]][:-1] if key in sparse else next(dense) for key in plan.exported)
            return (last, outputs) if span is None else (last, outputs, held)
        run.__name__ = run.__qualname__ = f"scan_{self.choice.name}"  # (JAX's logs, profiles, dumps)
        return run

    def _block_bodies(self, span: _Span) -> dict[int, tuple[Callable, tuple[int, ...], list[int],
                                                             list[int], int]]:
        """Per block kernel of a span: its body as ``block_kernel`` compiles it, the rows it
        reads of each buffer, which of the span's buffers it writes, its outputs not
        written into buffers, and where its reads' first rows are among the span's."""
        out = {}
        for pos, (counts, where, first) in span.kernels.items():
            op, edges = self.execs[pos]
            layout = self.planner.buffered[pos]
            params = resolve_params(op.params, self.bounds)
            writes = tuple((k, t.rows_axis) for k, t in zip(layout.written, layout.targets))
            body = self.backend.block_body(op, params, len(edges), tuple(zip(layout.blocks, layout.axes)),
                                           writes, layout.shared)
            unwritten = [k for k in range(len(op.outputs)) if k not in layout.written]
            out[pos] = (body, counts, where, unwritten, first)
        return out


MIN_SPAN = 16
"""Iterations below which a span of a loop lowered in spans is interpreted instead: a scan
compiles once per length and buffer shape."""


@dataclass
class _Part:
    """One block kernel's share of a span (``LoopLauncher._kernel_part``)."""

    pos: int
    op_id: int
    layout: KernelBuffers
    prefix: tuple[int, ...]
    ks: np.ndarray
    """The innermost coordinate of its point at each iteration."""
    counts: tuple[int, ...]
    """The rows each of its reads takes."""
    starts: list[np.ndarray]
    """Per read, its first row at each iteration."""


class _Reads(NamedTuple):
    """How a block kernel reads its buffers over a stretch (``LoopLauncher._block_reads``)."""

    alike: int
    """For how many points from the first it reads them alike."""
    counts: tuple[int, ...]
    """The rows each read takes."""
    starts: list[np.ndarray]
    """Per read, its first row at each point."""
    unfit: int = 0
    """Where the first point reads them neither whole nor as one run of rows: for how many
    points from it that holds."""


class _Kernel(NamedTuple):
    """A block kernel in a span's scan."""

    counts: tuple[int, ...]
    """The rows each of its reads takes."""
    buffers: list[int]
    """The positions of the buffers it writes among the span's."""
    first: int
    """The position of its first read's first rows among the span's ``starts``."""


@dataclass
class _Span:
    """Iterations of a loop lowered in spans that run as one scan, up to ``stop``
    (exclusive): the block kernels' buffers it carries and the rows it writes them at."""

    stop: int
    kernels: dict[int, _Kernel]
    """Per block kernel (exec position)."""
    targets: list[Any]
    """Per buffer: its store."""
    keys: list[tuple[int, int]]
    """Per buffer: the output written into it."""
    buffers: tuple
    rows: tuple
    """Per buffer: the row each iteration writes (int32)."""
    starts: tuple
    """Per block read: its first row at each iteration (int32)."""
    remaining: int
    """Iterations of the entry after the span."""
    most: int
    """The most iterations a span there may have (``LoopLauncher._most_stacked``)."""
    cap: int | None = None
    """Where sinks run: the multiple spans end at (``LoopLauncher._span_at``)."""

    @classmethod
    def of(cls, parts: list[_Part], n: int, stop: int, trips: int, most: int,
           cap: int | None = None) -> _Span:
        """The span of iterations ``n .. stop - 1`` of an entry of ``trips`` made of the
        block kernels' ``parts`` (each as long at least)."""
        count = stop - n
        kernels, targets, keys, buffers, rows, starts = {}, [], [], [], [], []
        for part in parts:
            written = list(range(len(targets), len(targets) + len(part.layout.targets)))
            kernels[part.pos] = _Kernel(part.counts, written, len(starts))
            starts.extend(first[:count].astype(np.int32) for first in part.starts)
            for k, store in zip(part.layout.written, part.layout.targets):
                targets.append(store)
                keys.append((part.op_id, k))
                buffers.append(store.blocks[part.prefix])
                rows.append(store.rows_of(part.prefix, part.ks[:count]).astype(np.int32))
        return cls(stop, kernels, targets, keys, tuple(buffers), tuple(rows), tuple(starts), trips - stop,
                   most, cap)

    @property
    def signature(self) -> tuple:
        """What the scan's program depends on beyond the plan."""
        return (tuple((pos, kernel.counts) for pos, kernel in sorted(self.kernels.items())),
                tuple((tuple(b.shape), str(b.dtype)) for b in self.buffers))

    @property
    def trips(self) -> int:
        return len(self.rows[0]) if self.rows else 0

    def grown(self) -> _Span | None:
        """The span after this one as it will likely be, where its growing buffers
        (``BlockStore.step``) will be longer by then, or where it will have another length
        (None where neither: its program is this one's): its buffers as ``BufferShape``s,
        the rows its kernels read whole longer with them, and as many iterations as the
        buffers then hold rows to write (at most ``most``, up to the next multiple of
        ``cap``, and what the entry has left)."""
        trips = min(self.remaining, self.most)
        if self.cap is not None:
            trips = min(trips, _sink_span(self.stop, self.cap, self.most))
        lengths, shapes = {}, []
        for store, block, rows in zip(self.targets, self.buffers, self.rows):
            axis, length, first = store.rows_axis, block.shape[store.rows_axis], int(rows[-1]) + 1
            longer = length if isinstance(store, WindowStore) or store.step is None \
                else max(length, store.held(min(first, store.rows - 1)))
            if longer != length:
                trips = min(trips, longer - first)
            lengths[id(store)] = (length, longer)
            shapes.append(BufferShape(rows_moved((longer, *store.shape), axis), block.dtype))
        if all(length == longer for length, longer in lengths.values()) and trips == self.trips \
                or trips < MIN_SPAN:
            return None
        kernels = {}
        for pos, kernel in self.kernels.items():
            now = [lengths[id(self.targets[n])] for n in kernel.buffers]
            counts = tuple(next((longer for length, longer in now if length == count), count)
                           for count in kernel.counts)
            kernels[pos] = kernel._replace(counts=counts)
        return replace(self, kernels=kernels, buffers=tuple(shapes),  # (rows: their shapes only)
                       rows=tuple(np.zeros(trips, np.int32) for _ in self.rows),
                       starts=tuple(np.zeros(trips, np.int32) for _ in self.starts), remaining=0)

    def written_back(self, plan: Plan, buffers: tuple) -> None:
        """The scan's final ``buffers`` back in their stores, with the rows it wrote (those
        the loop freed in the span gone again)."""
        for store, key, block in zip(self.targets, self.keys, buffers):
            made = plan.made[key]
            store.written_by_scan(made.points, block, made.freed)


def _type_of(value: Any) -> tuple[tuple[int, ...], np.dtype, bool]:
    """A scan argument's shape, dtype and whether JAX takes it as weakly typed (an array,
    a ``BufferShape``, or a Python number)."""
    if not hasattr(value, "dtype"):
        value = np.asarray(value)
    return tuple(value.shape), np.dtype(value.dtype), bool(getattr(value, "weak_type", False))


def _leading(holds: np.ndarray) -> int:
    """How many of the first entries of ``holds`` are true."""
    return len(holds) if holds.all() else int(np.argmin(holds))


def _frees_of(op_id: int, k: int, instances: dict) -> dict[int, int]:
    """Per point of output ``k`` of op ``op_id`` (its innermost coordinate) freed in an
    entry, the iteration that frees it."""
    freed: dict[int, int] = {}
    for st, iterations, coords in instances.values():
        if st.kind == "free" and st.op.id == op_id and k in st.freed:
            freed.update(zip(coords[-1].tolist(), iterations.tolist()))
    return freed


def _sink_cap(most: int) -> int:
    """The length of the spans where sinks run: ``SINK_SPAN``, or the largest power of two
    below it within ``most`` (the stacked-output bound), so that spans end at its
    multiples and all have one length (one program)."""
    cap = SINK_SPAN
    while cap > max(most, 1):
        cap //= 2
    return cap


def _sink_span(n: int, cap: int, most: int) -> int:
    """The iterations of a span from iteration ``n`` where sinks run: to the next multiple
    of ``cap``, or to the one after where the first leaves fewer than ``MIN_SPAN`` (and
    ``most`` allows it)."""
    left = cap - n % cap
    return left + cap if left < MIN_SPAN and left + cap <= most else left


def _sinks(loop: ast.Loop, statements: dict[str, Statement], graph: SDG) -> frozenset[str]:
    """The statements of the sinks a loop lowered in spans calls after each span."""
    return frozenset(s.name for s in ast.statements(loop) if statements[s.name].kind == "exec"
                     and deferrable_sink(statements[s.name].op, graph))


def _only(loop: ast.Loop, names: frozenset[str]) -> ast.Loop:
    """``loop`` (without inner loops) with only the statements ``names``, under their guards."""
    body = tuple(_under(node, guard) for node, guard in ast.guarded_items(loop.body)
                 if isinstance(node, ast.Stmt) and node.name in names)
    return ast.Loop(loop.var, loop.start, loop.cond, loop.step, ast.Seq(body))


def _span_interpreter(loop: ast.Loop, outer: list[str]) -> Callable[..., None]:
    """The body of a loop without inner loops as interpreted Python at some of its
    iterations: ``fn(namespace, counter values, *outer counters)``."""
    def call(stmt: ast.Stmt) -> str:
        return f"ns[{stmt.name!r}](({''.join(e.to_python() + ', ' for e in stmt.index)}))"
    lines = [f"def loop({', '.join(['ns', '_values', *outer])}):",
             f"    for {loop.var.name} in _values:", *ast.to_python(loop.body, call, indent=2)]
    scope: dict[str, Any] = {"min": min, "max": max}
    exec(compile("\n".join(lines), "<tempo loop>", "exec"), scope)  # noqa: S102 - generated code
    return scope["loop"]


def _interpreter(loop: ast.Loop, outer: list[str]) -> Callable[..., None]:
    """The loop as interpreted Python: ``fn(namespace, *outer counters)``."""
    def call(stmt: ast.Stmt) -> str:
        return f"ns[{stmt.name!r}](({''.join(e.to_python() + ', ' for e in stmt.index)}))"
    source = "\n".join([f"def loop({', '.join(['ns', *outer])}):", *ast.to_python(loop, call, indent=1)])
    scope: dict[str, Any] = {"min": min, "max": max}
    exec(compile(source, "<tempo loop>", "exec"), scope)  # noqa: S102 - generated code
    return scope["loop"]
