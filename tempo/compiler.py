"""The compiler driver: an RT program -> checks -> passes -> schedule -> an executable.

``compile_program`` (what ``Context.compile`` calls) checks the program's graph, finds the
points it needs, runs the pass pipeline (``tempo.passes.PIPELINE``), schedules the result
with isl (``tempo.schedule``), and hands the schedule to the runtime
(``tempo.runtime.Executable``), with a ``CompileReport`` of where the time went. Under a
memory policy it compiles several schedules and keeps one (``MemoryPolicy.schedule``,
``budget_mb``). This module sits above both the API and the runtime: the runtime only
executes, and knows nothing of contexts or recurrent tensors.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tempo import cache
from tempo.analysis.needed import analyze_points
from tempo.errors import MemoryBudgetError, TempoError, UnschedulableError
from tempo.ir.graph import SDG, Op, program_roots
from tempo.ir.validate import check_graph, check_parallel, check_placeholders, resolve_bounds
from tempo.options import SCHEDULES, SMALLEST, SMALLEST_SLACK, Distribution, LoopPolicy, MemoryPolicy
from tempo.passes import PIPELINE, PassState, run_pipeline
from tempo.runtime.backends import make_backend, make_mesh
from tempo.runtime.executable import Executable
from tempo.schedule.memory import donation_candidates
from tempo.schedule.scheduler import Schedule, build_schedule
from tempo.symbolic.expr import FALSE, TRUE, Symbol

if TYPE_CHECKING:
    from tempo.api.context import Context
    from tempo.api.tensor import RecurrentTensor


@dataclass
class CompileReport:
    """Time spent in each compile stage (seconds), the SDG's size (ops) after each stage
    that changes it, and what the passes did."""

    stages: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.stages.values())

    def __str__(self) -> str:
        lines = [f"{k:<12} {v * 1000:9.1f} ms" + (f"   {self.sizes[k]} ops" if k in self.sizes else "")
                 for k, v in self.stages.items()]
        return "\n".join([*lines, f"{'total':<12} {self.total * 1000:9.1f} ms", *self.notes])


def compile_program(ctx: Context, bounds: dict, outputs: Sequence[RecurrentTensor],
                    backend: str = "auto", passes: Collection[str] | None = None,
                    memory: MemoryPolicy | None = None, loops: LoopPolicy | None = None,
                    tile: int | None = None, distribution: Distribution | None = None) -> Executable:
    """Check, optimize, schedule and prepare ``ctx``'s program for concrete ``bounds``.

    ``passes`` names the pipeline passes to run (``tempo.passes.PIPELINE``; all when None,
    none when empty); ``memory`` says where stored points wait (default: the device);
    ``loops`` how loops of device ops run on JAX (default: one ``lax.scan`` each
    wherever the loop allows it; ``tp.LoopPolicy``); ``tile`` the rows per tile of
    varying-length reads (``tempo.passes.tile``; default: chosen per read, and only on
    backends that compile per shape); ``distribution`` the devices a parallel dim is split
    over (default: one device)."""
    with _collector_paused:
        return _compile_program(ctx, bounds, outputs, backend, passes, memory, loops, tile, distribution)


class _CollectorPause:
    """Python's cyclic garbage collector paused while any compile is in progress (in any
    thread): a compile makes some 10^5 short-lived objects, enough to set off collections
    of the oldest generation, each of which walks every object of the process (JAX's, the
    user's): about 0.1 s of PPO's 1.1 s compile. What the compiles leave for the collector
    is collected once it runs again, when the last of them ends (if it was on when the
    first began)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.compiles = 0
        self.was_enabled = False

    def __enter__(self) -> None:
        with self.lock:
            if not self.compiles:
                self.was_enabled = gc.isenabled()
                gc.disable()
            self.compiles += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.compiles -= 1
            if not self.compiles and self.was_enabled:
                gc.enable()


_collector_paused = _CollectorPause()


def _compile_program(ctx: Context, bounds: dict, outputs: Sequence[RecurrentTensor], backend: str,
                     passes: Collection[str] | None, memory: MemoryPolicy | None, loops: LoopPolicy | None,
                     tile: int | None, distribution: Distribution | None) -> Executable:
    """``compile_program``'s work."""
    if tile is not None and (not isinstance(tile, int) or isinstance(tile, bool) or tile < 1):
        raise ValueError(f"tile must be a positive number of rows, got {tile!r}")
    report = CompileReport()
    clock = time.perf_counter()

    def stage(name: str, graph: SDG | None = None) -> None:
        nonlocal clock
        now = time.perf_counter()
        report.stages[name] = now - clock
        if graph is not None:
            report.sizes[name] = len(graph)
        clock = now

    outputs = list(outputs)
    _check_outputs(ctx, outputs)
    roots = program_roots(ctx.graph, [rt.op for rt in outputs])
    graph = ctx.graph.reachable_from(roots)
    values = resolve_bounds(graph, ctx.bound_of, bounds)
    check_graph(graph, ctx.bound_of)
    check_parallel(graph, ctx.parallel)
    check_placeholders(graph)
    sharded, mesh = _placement(ctx, values, distribution)
    runtime = make_backend(backend, mesh)
    for op in graph.ops.values():
        runtime.check_dtype(op)
    stage("check", graph)
    needed = analyze_points(graph, values, ctx.bound_of, roots)
    stage("points")
    kept = {rt.op.id for rt in outputs}
    policy = memory or MemoryPolicy()
    job = _Job(ctx, graph, values, outputs, roots, kept, needed, runtime, policy, loops, tile, stage, sharded)
    if policy.budget_mb is not None:
        return _within_budget(job, passes, report, policy.budget_mb)
    if policy.schedule == SMALLEST:
        return _smallest(job, passes, report)
    return job.compile(_passes_of(policy.schedule, passes), report, policy.schedule == "incremental")


@dataclass
class _Job:
    """A checked program, its needed points and what to compile it with."""

    ctx: Context
    graph: SDG
    bounds: dict[Symbol, int]
    outputs: list[RecurrentTensor]
    roots: list[Op]
    kept: set[int]
    needed: Any
    runtime: Any
    policy: MemoryPolicy
    loops: LoopPolicy | None
    tile: int | None
    stage: Callable[..., None]
    sharded: Symbol | None = None

    def compile(self, passes: Collection[str] | None, report: CompileReport,
                bounded: bool = False) -> Executable:
        """Optimize with ``passes`` (all when None), schedule and prepare the program;
        ``bounded``: for a schedule that keeps memory bounded (``PassState.bounded``)."""
        ctx, runtime, policy, stage = self.ctx, self.runtime, self.policy, self.stage
        attempts, joined = _pipelines_to_try(passes), 0
        for n, (enabled, siblings) in enumerate(attempts):
            if n and attempts[n - 1] == (enabled, True) and not joined:
                continue  # (fusion joined no siblings: the program would be the same again)
            state = PassState(self.needed, self.bounds, ctx.bound_of, self.kept,
                              next_id=max(ctx.graph.ops) + 1, parallel=ctx.parallel, tile=self.tile,
                              shapes_compiled=runtime.name == "jax", accelerator=not runtime.on_cpu,
                              bounded=bounded, sharded=self.sharded, siblings=siblings)
            optimized = run_pipeline(self.graph, state, enabled, stage) if enabled else self.graph
            joined = state.joined
            _check_split(optimized, self.sharded, state.notes)
            renamed = state.renamed if enabled else {}
            kept = {renamed.get(rt.key, rt.key) for rt in self.outputs}
            roots = _renamed_roots(self.roots, renamed, optimized)
            try:
                donors = donation_candidates(optimized, self.bounds, kept, policy.donate_min_bytes) \
                    if runtime.name == "jax" and policy.donate else []
                schedule = build_schedule(optimized, self.bounds, ctx.bound_of, roots, kept,
                                          state.needed, donors, explain=not enabled)
                report.notes.extend(state.notes)  # only the notes of the program that runs
                if schedule.from_cache:
                    report.notes.append(f"schedule: isl's schedule from the compile cache "
                                        f"({cache.cache_dir()})")
                if donors:
                    report.notes.append(_donation_note(schedule))
                break
            except UnschedulableError as err:
                if not enabled:
                    raise
                # The passes keep dependences acyclic by construction but for joined siblings
                # (tempo.passes.fusion), which the program is scheduled without first; should
                # it defeat them, it is scheduled without vectorization (the pass that changes
                # the most), and failing that unoptimized, which is still correct.
                undone = "siblings joined by fusion undone" if siblings and state.joined else \
                    f"passes undone ({', '.join(enabled)})"
                report.notes.append(f"{undone}, the optimized program had no schedule: {err}")
        stage("schedule")
        exe = Executable(ctx, optimized, self.bounds, self.outputs, schedule, runtime, policy, self.loops,
                         renamed)
        exe.report = report
        stage("codegen")
        return exe


@dataclass
class _Candidate:
    """A schedule compiled for comparison, with its report and predicted peak (MiB)."""

    schedule: str
    exe: Executable
    report: CompileReport
    peak_mb: float


def _candidates(job: _Job, passes: Collection[str] | None) -> Iterator[_Candidate]:
    """Each schedule of ``SCHEDULES`` (fastest first), compiled, with its predicted peak of
    stored points (device and host)."""
    for schedule in SCHEDULES:
        attempt = CompileReport()
        exe = job.compile(_passes_of(schedule, passes), attempt, schedule == "incremental")
        footprint = exe.predicted_footprint()
        yield _Candidate(schedule, exe, attempt, (footprint.device.peak + footprint.host.peak) / 2**20)


def _chosen(candidate: _Candidate, report: CompileReport, why: str, peaks: dict[str, float]) -> Executable:
    """``candidate``'s executable, with its compile report merged into ``report`` and a note
    saying why it was chosen."""
    report.stages.update(candidate.report.stages)
    report.sizes.update(candidate.report.sizes)
    report.notes.extend([*candidate.report.notes, f"memory: the {candidate.schedule} schedule, {why} "
                         f"(predicted: {_peaks_text(peaks)})"])
    candidate.exe.report = report
    return candidate.exe


def _within_budget(job: _Job, passes: Collection[str] | None, report: CompileReport,
                   budget_mb: float) -> Executable:
    """The first schedule of ``SCHEDULES`` (fastest first) whose predicted peak of stored
    points fits ``budget_mb``; the report says which and why."""
    peaks: dict[str, float] = {}
    for candidate in _candidates(job, passes):
        peaks[candidate.schedule] = candidate.peak_mb
        if candidate.peak_mb <= budget_mb:
            return _chosen(candidate, report, "the fastest whose predicted peak of stored points fits "
                           f"memory.budget_mb={budget_mb:g}", peaks)
    smallest = min(peaks, key=peaks.__getitem__)
    raise MemoryBudgetError(f"no schedule fits memory.budget_mb={budget_mb:g}: the predicted peaks of "
                            f"stored points are {_peaks_text(peaks)}; the smallest is {smallest} "
                            f"{peaks[smallest]:.1f} MiB")


def _smallest(job: _Job, passes: Collection[str] | None, report: CompileReport) -> Executable:
    """The schedule with the smallest predicted peak of stored points; a faster one within
    ``SMALLEST_SLACK`` of it is kept instead."""
    candidates = list(_candidates(job, passes))
    least = min(c.peak_mb for c in candidates)
    chosen = next(c for c in candidates if c.peak_mb <= least * SMALLEST_SLACK)
    peaks = {c.schedule: c.peak_mb for c in candidates}
    return _chosen(chosen, report, f"memory.schedule={SMALLEST}: the fastest predicted within "
                   f"{SMALLEST_SLACK - 1:.0%} of the smallest peak of stored points", peaks)


def _peaks_text(peaks: dict[str, float]) -> str:
    return ", ".join(f"{schedule} {mb:.1f} MiB" for schedule, mb in peaks.items())


def _passes_of(schedule: str, passes: Collection[str] | None) -> Collection[str] | None:
    """The passes (all when None) that compile ``schedule``: the incremental one without
    vectorization of the innermost dim."""
    if schedule != "incremental":
        return passes
    return [name for name, _ in PIPELINE if (passes is None or name in passes) and name != "vectorize"]


def _donation_note(schedule: Schedule) -> str:
    donating = {e: c for e, c in schedule.last_reads.items() if c is not FALSE}
    kernels = {e.sink.id for e in donating}
    always = sum(c is TRUE for c in donating.values())
    return (f"donation: {len(donating)} inputs of {len(kernels)} kernels donated where read last "
            f"({always} at every point)")


def _pipelines_to_try(passes: Collection[str] | None) -> list[tuple[list[str], bool]]:
    """The passes to compile with, each with whether fusion joins siblings: all of them,
    then (should the program not schedule) the same with fusion joining no siblings, then
    without vectorization, then none."""
    enabled = [name for name, _ in PIPELINE] if passes is None else list(passes)
    attempts = [(enabled, "fusion" in enabled)]
    if "fusion" in enabled:
        attempts.append((enabled, False))
    without = [name for name in enabled if name != "vectorize"]
    if without != enabled and without:
        attempts.append((without, False))
    return [*attempts, ([], False)] if enabled else [([], False)]


def _placement(ctx: Context, bounds: dict[Symbol, int], distribution: Distribution | None
               ) -> tuple[Symbol | None, Any]:
    """The parallel dim ``distribution`` splits and the mesh it is split over (None, None
    without one), after checking that its points split evenly."""
    if distribution is None:
        return None, None
    if not ctx.parallel:
        raise TempoError("a Distribution splits a parallel dim over devices, and this context declares "
                         "none (tp.Context(dims=..., parallel=(...)))")
    names = {d.name: d for d in ctx.parallel}
    name = distribution.dim or ctx.parallel[0].name
    if name not in names:
        raise TempoError(f"Distribution(dim={name!r}): the parallel dims are {', '.join(names)}")
    dim = names[name]
    mesh = make_mesh(distribution.devices, name)
    size = bounds[ctx.bound_of[dim]]
    if size % mesh.size:
        raise TempoError(f"{name} has {size} points, which {mesh.size} devices cannot split evenly; "
                         f"make {ctx.bound_of[dim].name} a multiple of {mesh.size}")
    return dim, mesh


def _check_split(graph: SDG, sharded: Symbol | None, notes: list[str]) -> None:
    """An error unless the passes laid ``sharded`` out: a dim that stays a loop runs
    point by point, on one device."""
    if sharded is None:
        return
    looped = next((op for op in graph.ops.values() if sharded in op.domain), None)
    if looped is not None:
        why = next((n for n in notes if n.startswith(f"parallel: {sharded.name} stays")),
                   "the parallel pass did not run")
        raise TempoError(f"{sharded.name} cannot be split over devices: {why}", looped.site)


def _renamed_roots(roots: list[Op], renamed: dict[tuple[int, int], tuple[int, int]],
                   graph: SDG) -> list[Op]:
    """``roots`` as ``graph`` has them: an output fusion took is its fused op (which
    exports every output of it)."""
    out: dict[int, Op] = {}
    for root in roots:
        op_id = renamed.get((root.id, 0), (root.id, 0))[0]
        out[op_id] = graph.ops.get(op_id, root)
    return list(out.values())


def _check_outputs(ctx: Context, outputs: list[RecurrentTensor]) -> None:
    """Outputs are RTs of this context with one spatial shape at every point."""
    for rt in outputs:
        if not hasattr(rt, "key") or not hasattr(rt, "ctx"):
            raise TempoError(f"outputs must be recurrent tensors, got {rt!r}")
        if rt.ctx is not ctx:
            raise TempoError(f"output {rt!r} belongs to another context", rt.op.site)
        varying = [d for d in rt.shape if d.symbols() & set(ctx.dims)]
        if varying:
            raise TempoError(f"output {rt!r} has a shape that varies with the point "
                             f"({', '.join(map(str, varying))}); outputs are stacked into one "
                             f"array, so reduce it or read it through tp.sink", rt.op.site)
