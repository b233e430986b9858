"""Running a scheduled program (``tempo.compiler`` makes it).

The schedule's AST becomes generated Python source (one function, loops and calls), so
index expressions are compiled once and the executor's inner loop is plain Python. Each
statement calls a *launcher*: it evaluates the input dependences at the point, reads the
tensor stores, runs the kernel and writes the outputs.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Callable, Collection
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from tempo.errors import StopRun, TempoError
from tempo.ir.graph import SDG, Edge, Op, has_static_shapes, rows_moved
from tempo.ir.ops import param_symbols, resolve_params
from tempo.ir.readers import compile_reader_sum
from tempo.options import LoopPolicy, MemoryPolicy
from tempo.runtime.backends import Backend
from tempo.runtime.blocks import (
    KernelBuffers,
    device_block_slice,
    device_blocks,
    kernel_buffers,
    source_store,
    whole_buffers,
)
from tempo.runtime.capture import (
    STATEMENT,
    IterationPlan,
    IterationRun,
    IterationRunner,
    iteration_source,
    not_worth_capturing,
    plan_iterations,
    program_key,
    replace_loop,
)
from tempo.runtime.footprint import Footprint, Prediction
from tempo.runtime.lowering import LoopChoice, LoopLauncher, Lowerable, lower_loops, peeled_iterations_back
from tempo.runtime.nest import depth, statement_names
from tempo.runtime.plan import point_op
from tempo.runtime.profile import RunProfile, XlaCompiles
from tempo.runtime.stores import (
    BlockStore,
    BufferShape,
    CountedTwice,
    DeviceBuffers,
    HostBuffers,
    MemoryStats,
    PointStore,
    SplitPointStore,
    SwappedStore,
    WindowStore,
    grown_buffers,
)
from tempo.runtime.tail import NO_TAIL, Lag, Launcher, Tail, freed_behind, host_tail, in_order, lagging
from tempo.schedule import ast
from tempo.schedule.memory import point_bytes, swapped_ops, window_widths
from tempo.schedule.scheduler import Schedule, Statement
from tempo.symbolic.expr import FALSE, Expr, Slice, Symbol, compile_function, const


class ProgramDims(Protocol):
    """What the runtime needs of a program's context (``tempo.Context`` is one): its dims,
    outermost first, each dim's bound symbol, and the parallel dims laid out."""

    @property
    def dims(self) -> tuple[Symbol, ...]: ...
    @property
    def bound_of(self) -> dict[Symbol, Symbol]: ...
    @property
    def parallel(self) -> tuple[Symbol, ...]: ...


class Output(Protocol):
    """An output of a program (``tempo.RecurrentTensor`` is one): the op output it names
    (``key``: op id and output index), that op and the output's domain."""

    @property
    def key(self) -> tuple[int, int]: ...
    @property
    def op(self) -> Op: ...
    @property
    def domain(self) -> tuple[Symbol, ...]: ...


class Results:
    """Values of a run's outputs, indexed by the RTs themselves: ``res[x]``."""

    def __init__(self, values: dict[tuple[int, int], np.ndarray], stopped_at: dict[str, int] | None = None):
        self._values = values
        self.stopped_at = stopped_at
        """Where ``tp.stop_when`` ended the run (``{dim: value}``), or None."""

    def __getitem__(self, rt: Output) -> np.ndarray:
        try:
            return self._values[rt.key]
        except KeyError:
            raise TempoError(f"{rt!r} is not an output of this program; list it in "
                             f"compile(outputs=[...])") from None

    def __len__(self) -> int:
        return len(self._values)


class Executable:
    """A scheduled program for fixed bounds. ``run()`` executes it from scratch."""

    def __init__(self, ctx: ProgramDims, graph: SDG, bounds: dict[Symbol, int],
                 outputs: list[Output], schedule: Schedule, backend: Backend,
                 memory: MemoryPolicy | None = None, loops: LoopPolicy | None = None,
                 renamed: dict[tuple[int, int], tuple[int, int]] | None = None):
        self.ctx, self.graph, self.bounds = ctx, graph, bounds
        self.outputs, self.schedule, self.backend = outputs, schedule, backend
        self.stored = {rt.key: (renamed or {}).get(rt.key, rt.key) for rt in outputs}
        """Per output, the ``(op, output)`` whose store holds its points in ``graph``: its
        own, or the fused op's that took it (``tempo.passes.fusion``)."""
        self.report: Any = None
        """Where compile time went (``tempo.compiler.CompileReport``; the compiler sets it)."""
        self.stats = MemoryStats()
        self.memory = memory or MemoryPolicy()
        self.swapped = swapped_ops(graph, schedule, self.memory,
                                   {op.id: point_bytes(op, bounds) for op in graph.ops.values()}) \
            if backend.name != "numpy" else set()
        """Ids of the ops whose points wait in host memory (``tempo.schedule.memory``)."""
        self.windows = window_widths(graph, bounds, ctx.bound_of, set(self.stored.values()))
        """Per stored output read only through bounded windows: their width (a ``WindowStore``)."""
        self.loops = loops or LoopPolicy()
        root = ast.substitute(schedule.root, bounds)
        lowering = backend.name == "jax" and self.loops.mode != "interpreted"
        if lowering:
            root = peeled_iterations_back(root, schedule.statements, graph, bounds, self.loops.nests)
        self._interpreted = _compile_source(_program_source(root, schedule.statements))
        self._lowered: dict[str, Lowerable] = {}
        if lowering:
            root, self._lowered = lower_loops(root, schedule.statements, graph, bounds, self.loops.nests)
        self.loop_choices = {name: LoopChoice(name, statement_names(lowerable.loop), depth(lowerable.loop))
                             for name, lowerable in self._lowered.items()}
        """Per lowerable loop: its statements, the timings and the form the runs chose
        (``tempo.runtime.lowering``)."""
        self._spanned = {schedule.statements[s].op.id for lowerable in self._lowered.values()
                         if lowerable.spans for s in statement_names(lowerable.loop)}
        """The ops of loops lowered in spans (``tempo.runtime.lowering``)."""
        in_loops = {schedule.statements[s].op.id for lowerable in self._lowered.values()
                    for s in statement_names(lowerable.loop)}
        one_device = getattr(backend, "mesh", None) is None
        capture = lowering and self.loops.capture is not False and self.loops.mode == "lowered" and one_device
        late_sinks = self.loops.late_sinks
        if late_sinks is None:  # (late on an accelerator, and where iterations are captured)
            late_sinks = not backend.on_cpu or capture
        late = backend.name == "jax" and not self._spanned and one_device and late_sinks
        self.tail = host_tail(graph, schedule.last_reads, in_loops) if late else NO_TAIL
        """The host ops that only feed sinks, which run one occurrence late, with the ops
        and frees between them (``tempo.runtime.tail``)."""
        self.iterations: IterationPlan | None = None
        """The captured training loop (``LoopPolicy.capture``, ``tempo.runtime.capture``)."""
        self.capture_refused: str | None = None
        """Why the program's training loop is not captured where that was asked."""
        program_root, marker = root, None
        if capture:
            found = self._captured_loop(root)
            if isinstance(found, str):
                self.capture_refused = found
                if self.loops.late_sinks is None and backend.on_cpu:  # (late only for the capture)
                    self.tail = NO_TAIL
            else:
                self.iterations, marker = found
                program_root = replace_loop(root, self.iterations.loop)
        self._launchers: dict[str, LoopLauncher] = {}
        """Each lowerable loop's launcher, made at the first run and kept across runs (its
        compiled scans, plan templates and timings with it)."""
        self._programs: dict[int, _Programs] = {}
        """Per op with a block launcher, its compiled programs, kept across runs."""
        self._root = root
        self._compiled_ahead = False
        self._loops_ahead = False
        """Whether a run has started compiling the lowered loops' scans for their first
        entries (``LoopLauncher.compile_ahead``): the first run does."""
        self.xla = XlaCompiles()
        """What making XLA programs cost during the runs (JAX backend)."""
        extra = [STATEMENT] if self.iterations is not None else []
        self.source = _program_source(program_root, [*schedule.statements, *self._lowered, *extra])
        self._program = _compile_source(self.source) if self._lowered else self._interpreted
        self._runner: IterationRunner | None = None
        if self.iterations is not None:
            self._runner = IterationRunner(self.iterations, _compile_source(
                iteration_source(self.iterations.loop), "iteration"), backend, self._launchers,  # type: ignore[arg-type]
                exact=self.loops.capture is None, marker=marker)

    def _captured_loop(self, root: ast.Node) -> tuple[IterationPlan, str] | str:
        """The training loop to capture (``LoopPolicy.capture``) and its compile-cache key,
        or why it is not captured."""
        found = plan_iterations(root, self.schedule.statements, self.graph, self.bounds, self._lowered,
                                self.tail)
        if isinstance(found, str):
            return found
        marker = program_key(iteration_source(found.loop), self.graph, self.backend)  # type: ignore[arg-type]
        why = not_worth_capturing(found, marker, self.loops.capture, self.backend.on_cpu)
        return why if why is not None else (found, marker)

    def run(self, origin: dict[Symbol, int] | None = None,
            profile: RunProfile | None = None) -> Results:
        """Execute every statement of the schedule; return the outputs' values. With
        ``profile``, every statement is timed into it (``tempo.runtime.profile``).

        ``origin`` (``{i: k}``) runs the program as the continuation of a longer run from
        point ``k`` of dim ``i`` (a run resumed from a checkpoint): host ops (the coordinates
        random draws are keyed by, ``symbol_value``, UDFs and sinks) see every coordinate
        of ``i`` shifted by ``k`` and its bound by ``k`` too, so they observe what the
        longer run observed there.
        Branch conditions are not shifted: the first point still takes the initial branch,
        whose value the checkpoint supplies."""
        shift = _checked_origin(self.ctx, origin or {})
        self.stats = MemoryStats()
        stores = _make_stores(self.graph, self.bounds, self.ctx.bound_of, self.backend, self.stats,
                              self.swapped, self.windows)
        lag = Lag() if self.tail and profile is None else None  # (a profile times each statement)
        namespace = _statement_table(self.graph, self.schedule, stores, self.bounds,
                                     self.backend, shift, self.ctx.bound_of, self._programs, self._spanned,
                                     (self.tail, lag) if lag is not None else None)
        ahead: list[Future] = []  # (cancelled at the end: kernels of statements not reached)
        if not self._compiled_ahead:  # later runs find the kernels compiled
            self._compiled_ahead = True
            try:
                _compile_ahead(self._root, self.schedule, self.graph, stores, self.bounds,
                               self.backend, namespace, ahead)
            except BaseException:
                for future in ahead:
                    future.cancel()
                raise
        if profile is not None:
            namespace = profile.instrument(namespace, self.schedule.statements, stores, self.backend)
        batched = _batched_point_ops(self.schedule, stores, self.bounds, shift) if self._lowered else {}
        stopped = None
        recording = self.xla.recording() if self.backend.name == "jax" else contextlib.nullcontext()
        try:
            self._bind_loops(stores, namespace, batched, profile)
            self._bind_iterations(stores, namespace, batched, shift, profile is not None)
            with recording:
                self._program(namespace)
                if lag is not None:
                    lag.catch_up()
        except StopRun as stop:  # its point is as host ops see it: moved by the origin
            by_name = {d.name: k for d, k in shift.items()}
            stopped = {name: v - by_name.get(name, 0) for name, v in stop.point.items()}
        except Exception as err:  # what was queued before the failure, as a prompt run did it
            if lag is not None:
                try:
                    lag.catch_up()
                except Exception as late:
                    err.add_note(f"then the late host work queued before it failed too: {late!r}")
            raise
        finally:
            if lag is not None:  # (an interrupt: its late work is not done)
                lag.drop()
            for launch in self._launchers.values():  # the launchers outlive the run, its values must not
                launch.bind({}, {}, {})
                launch.cancel_waiting()
            if self._runner is not None:
                self._runner.bind({}, None)
            for programs in self._programs.values():  # (a run that stopped early)
                programs.cancel_waiting()
            for future in ahead:  # kernels of statements the run did not reach
                future.cancel()
        return Results({rt.key: self._gather(rt, stores, stopped) for rt in self.outputs}, stopped)

    def _bind_loops(self, stores: dict, namespace: dict[str, Callable], batched: dict[str, Callable],
                    profile: RunProfile | None) -> None:
        """Each lowerable loop's launcher (made at the first run) bound to this run, as
        statement ``L<k>`` of ``namespace``; at the first run each starts compiling the
        scan of its first entry (``LoopLauncher.compile_ahead``)."""
        firsts = ast.first_points(self._root) if self._lowered and not self._loops_ahead else {}
        self._loops_ahead = True
        for name, lowerable in self._lowered.items():
            launch = self._launchers.get(name)
            if launch is None:
                launch = self._launchers[name] = LoopLauncher(
                    lowerable, self.schedule.statements, self.graph, self.bounds, self.backend,
                    self.loops, self.loop_choices[name])
            launch.bind(stores, namespace, batched)
            if name in firsts and self.backend.mesh is None:  # (not a nest's inner loop)
                launch.compile_ahead(firsts[name])
            namespace[name] = launch if profile is None else profile.instrument_loop(name, launch)

    def _bind_iterations(self, stores: dict, namespace: dict[str, Callable], batched: dict[str, Callable],
                         shift: dict[Symbol, int], profile_run: bool) -> None:
        """The captured loop's iterations (statement ``I0``) bound to this run: as one
        program each where their kind allows it; in a profiled run (which times each
        statement), statement by statement."""
        runner, plan = self._runner, self.iterations
        if runner is None or plan is None:
            return
        namespace[STATEMENT] = runner
        if profile_run:
            runner.bind(namespace, None)
            return
        statements = self.schedule.statements
        values = {name: (_point_value(statements[name].op, self.bounds, shift),  # (point ops are batched)
                         _rows_value(statements[name].op, self.bounds, shift)) for name in plan.points}

        def make_stores(stats: MemoryStats) -> dict:
            return _make_stores(self.graph, self.bounds, self.ctx.bound_of, self.backend, stats, self.swapped,
                                self.windows)

        def statement_table(over: dict) -> dict[str, Callable]:
            return _statement_table(self.graph, self.schedule, over, self.bounds, self.backend, shift,
                                    self.ctx.bound_of, self._programs, self._spanned, (self.tail, Lag()))
        runner.bind(namespace, IterationRun(stores, namespace, batched, values, self.stats, make_stores,
                                            statement_table))

    @property
    def iteration_report(self) -> str:
        """What capturing the training loop's iterations did (``LoopPolicy.capture``)."""
        if self._runner is not None:
            return str(self._runner.report)
        return f"iterations not captured: {self.capture_refused}" if self.capture_refused else ""

    def execution_order(self) -> list[tuple[str, Op, tuple[int, ...]]]:
        """What ``run()`` executes, in order, without running it: ``("exec" | "free", op,
        point)`` per statement instance."""
        return [(stmt.kind, stmt.op, point) for stmt, point in self._instances()]

    def predicted_footprint(self) -> Footprint:
        """The peak bytes the stores will hold on the device and in host memory when this
        schedule runs, found by walking its statements without running them
        (``tempo.runtime.footprint``)."""
        stores = _make_stores(self.graph, self.bounds, self.ctx.bound_of, self.backend, MemoryStats(),
                              self.swapped, self.windows)
        prediction = Prediction(stores, self.bounds)  # each instance counted as the walk meets it

        def visitor(stmt: Statement) -> Callable[[tuple[int, ...]], None]:
            return lambda point: prediction.visit(stmt, tuple(point))
        self._interpreted({name: visitor(s) for name, s in self.schedule.statements.items()})
        return prediction.footprint

    def _instances(self) -> list[tuple[Statement, tuple[int, ...]]]:
        """Every statement instance ``run()`` executes, in order, with its point."""
        trace: list[tuple[Statement, tuple[int, ...]]] = []

        def recorder(stmt: Statement) -> Callable[[tuple[int, ...]], None]:
            return lambda point: trace.append((stmt, tuple(point)))
        self._interpreted({name: recorder(s) for name, s in self.schedule.statements.items()})
        return trace

    def _gather(self, rt: Output, stores: dict, stopped: dict[str, int] | None = None) -> np.ndarray:
        key = self.stored[rt.key]
        store = stores[key]
        sizes = [self.bounds[self.ctx.bound_of[d]] for d in rt.domain]
        domain = self.graph.ops[key[0]].domain
        if stopped is not None:
            sizes = _until(rt, sizes, stopped, store, domain)
        # Parallel dims laid out (tempo.passes.parallel): the last one laid out leads.
        stacked = [rt.domain.index(d) for d in reversed(self.ctx.parallel)
                   if d in rt.domain and d not in domain]
        kept = [rt.domain.index(d) for d in domain]

        points = list(itertools.product(*(range(n) for n in sizes)))
        whole = store.stacked([tuple(p[k] for k in kept) for p in points]) if not stacked and points else None
        if whole is not None:  # rows of one array (a lowered loop's output): one gather
            whole = self.backend.to_host(whole)
            return whole.reshape((*sizes, *whole.shape[1:]))

        def at(p: tuple[int, ...]) -> np.ndarray:
            value = store.read(tuple(p[k] for k in kept))
            for k in stacked:
                value = value[p[k]]
            return self.backend.to_host(value)
        values = [at(p) for p in points]
        return np.stack(values).reshape((*sizes, *values[0].shape))


# ---- code generation ----------------------------------------------------------------------
def _program_source(root: ast.Node, statements: Collection[str]) -> str:
    def call(stmt: ast.Stmt) -> str:
        return f"{stmt.name}(({''.join(e.to_python() + ', ' for e in stmt.index)}))"
    body = ast.to_python(root, call, indent=2)
    names = sorted(statements)
    return "\n".join([
        "def program(ns):",
        f"    {', '.join(names)}{',' if len(names) == 1 else ''} = "
        f"{', '.join(f'ns[{n!r}]' for n in names)}" if names else "    pass",
        "    if True:",
        *body,
    ])


def _compile_source(source: str, name: str = "program") -> Callable[..., None]:
    namespace: dict[str, Any] = {"min": min, "max": max}
    exec(compile(source, "<tempo program>", "exec"), namespace)  # noqa: S102 - generated code
    return namespace[name]


def _checked_origin(ctx: ProgramDims, origin: dict[Symbol, int]) -> dict[Symbol, int]:
    """``origin`` as a shift of every dim and bound symbol (0 where not given)."""
    for dim, start in origin.items():
        if dim not in ctx.bound_of:
            raise TempoError(f"origin names {dim}, which is not a dim of this program "
                             f"(dims: {', '.join(d.name for d in ctx.dims)})")
        if int(start) != start or start < 0:
            raise TempoError(f"origin of {dim} must be a non-negative integer, got {start}")
    shift = {d: int(origin.get(d, 0)) for d in ctx.dims}
    return {**shift, **{ctx.bound_of[d]: k for d, k in shift.items()}}


def _statement_table(graph: SDG, schedule: Schedule, stores: dict, bounds: dict[Symbol, int],
                     backend: Backend, shift: dict[Symbol, int], bound_of: dict[Symbol, Symbol],
                     programs: dict[int, _Programs], spanned: Collection[int] = (),
                     late: tuple[Tail, Lag] | None = None) -> dict[str, Callable]:
    """Per statement, its launcher. The ops of ``spanned`` run in a loop lowered in spans:
    their later points run in scans, so a block launcher of theirs compiles no later row
    counts ahead (``_block_launcher``). With ``late``, the tail's statements run one
    occurrence late, and other host ops after them (``tempo.runtime.tail``)."""
    table: dict[str, Callable] = {}
    tail, lag = late or (NO_TAIL, Lag())
    for name, stmt in schedule.statements.items():
        op = stmt.op
        if stmt.kind != "exec":
            free = _free(op, stmt.freed, stores)
            table[name] = freed_behind(free, lag) if op.id in tail else free
            continue
        edges = graph.in_edges(op)
        if op.id in tail.host:
            table[name] = _late_host_launcher(name, op, edges, stores, bounds, backend, shift, tail, lag)
            continue
        extent = bounds[bound_of[op.domain[-1]]] if op.domain and op.id not in spanned else 0
        launch = make_launcher(op, edges, stores, bounds, backend, shift, schedule.last_reads, extent,
                               programs)
        if op.id in tail.whole:
            launch = lagging(name, launch, lag)
        elif late is not None and op.definition.host and not point_op(op):
            launch = in_order(launch, lag)
        table[name] = launch
    return table


def _compile_ahead(root: ast.Node, schedule: Schedule, graph: SDG, stores: dict, bounds: dict[Symbol, int],
                   backend: Backend, namespace: dict[str, Callable], futures: list[Future]) -> None:
    """Start compiling the kernels of the statements the program launches one by one
    (outside lowered loops), on the backend's background thread, in the order the program
    first reaches them (into ``futures``); each such statement's first launch waits for
    its kernel's compile if it has begun, and takes it over if not. The program's own
    thread meanwhile goes on (compiling a lowered loop's scan: PPO's first iteration
    compiles the acting and update scans while the kernels after them compile). Only
    kernels whose inputs are stored points as they are (shapes known from the types) are
    compiled ahead; a statement that donates inputs also gets the kernel donating all it
    may (its first launch often donates nothing: an initial value is held by the constant
    it came from too; later ones donate)."""
    seen = set()
    first = ast.first_points(root)
    for node in ast.statements(root):
        stmt = schedule.statements.get(node.name)  # (not a lowered loop's statement)
        if stmt is None or stmt.kind != "exec" or node.name in seen:
            continue
        seen.add(node.name)
        op = stmt.op
        edges = graph.in_edges(op)
        inputs = _kernel_inputs(op, edges, stores, bounds)
        if inputs is None:
            future = _block_launch_ahead(op, edges, stores, bounds, namespace[node.name], first[node.name])
            if future is not None:
                futures.append(future)
            continue
        donate = tuple(k for k, e in enumerate(edges)  # device values: a host op's stay NumPy
                       if schedule.last_reads.get(e, FALSE) is not FALSE and not e.src.definition.host
                       and type(source_store(e, stores)) is PointStore)
        params = resolve_params(op.params, bounds)
        variants = ((), donate) if donate else ((),)
        started = [future for given in variants
                   if (future := backend.compile_ahead(op, params, inputs, given)) is not None]
        if started:
            futures.extend(started)
            namespace[node.name] = _after_compiling(started, namespace[node.name])


def _kernel_inputs(op: Op, edges: list[Edge], stores: dict,
                   bounds: dict[Symbol, int]) -> list[tuple[tuple[int, ...], str]] | None:
    """The shapes and dtypes ``op``'s device launcher calls its jitted kernel with, where
    they are known before the run: a kernel with static shapes and params reading points
    of point stores and of host block buffers, and slices of point stores or of host
    block buffers (a slice's rows where the edge wants them, ``Edge.rows_at``), writing
    no device block buffer. Else None."""
    if not _kernel_known_ahead(op, edges, bounds) \
            or any(device_blocks(stores[(op.id, k)]) for k in range(len(op.outputs))):
        return None
    inputs = [_input_type(edge, stores, bounds) for edge in edges]
    return None if None in inputs else inputs  # type: ignore[return-value]


def _kernel_known_ahead(op: Op, edges: list[Edge], bounds: dict[Symbol, int]) -> bool:
    """A device kernel with static shapes and params."""
    return not (op.definition.host or op.kind in ("merge", "sum_readers", "const")
                or param_symbols(op.params) & set(op.domain) or not has_static_shapes(op, edges, set(bounds)))


def _input_type(edge: Edge, stores: dict, bounds: dict[Symbol, int]) -> tuple[tuple[int, ...], str] | None:
    """The shape and dtype of what a device launcher reads through ``edge``, where known
    before the run: a point of a point store or of host block buffers, a slice of a point
    store or of host block buffers (its rows where the edge wants them); else None."""
    store = source_store(edge, stores)
    if type(store) not in (PointStore, BlockStore, WindowStore) or device_blocks(store) \
            or len(edge.slices) > 1 and (type(store) is not PointStore or edge.rows_at):
        return None
    t = edge.src.outputs[edge.src_out]
    sizes = tuple(edge.phi[k].size for k in edge.slices)
    shape = rows_moved((*sizes, *t.shape), edge.rows_at) if sizes else t.shape
    return tuple(int(d.evaluate(bounds)) for d in shape), t.dtype


def _block_launch_ahead(op: Op, edges: list[Edge], stores: dict, bounds: dict[Symbol, int],
                        launch: Callable, point: tuple[int, ...]) -> Future | None:
    """Start compiling the first launch of a block launcher reading device buffers (a
    learner reading a rollout whole: the buffers are not made yet, their shapes are
    known), where its other inputs' types are known; None where nothing was started."""
    ahead = getattr(launch, "compile_ahead", None)
    if ahead is None or not _kernel_known_ahead(op, edges, bounds):
        return None
    inputs: list[BufferShape | None] = []
    for edge in edges:
        if device_block_slice(edge, stores):  # a buffer the kernel slices (``kernel_buffers``)
            inputs.append(None)
            continue
        known = _input_type(edge, stores, bounds)
        if known is None:
            return None
        inputs.append(BufferShape(*known))
    return ahead(point, inputs)


def _after_compiling(futures: list[Future], launch: Callable) -> Callable:
    """``launch``, whose first calls each wait for one of ``futures`` (its kernels
    compiling ahead, in the order they were started), or cancel it if it has not begun
    (the call then compiles what it needs itself)."""
    pending = list(reversed(futures))

    def launch_after_compile(point: tuple[int, ...]) -> None:
        if pending:
            future = pending.pop()
            if not future.cancel():
                future.exception()  # wait; a compile that failed ahead fails again in the launch
        launch(point)
    return launch_after_compile


def _free(op: Op, outputs: tuple[int, ...], stores: dict) -> Callable:
    targets = [stores[(op.id, k)] for k in outputs]
    if len(targets) == 1:
        return targets[0].free

    def free(point: tuple[int, ...]) -> None:
        for store in targets:
            store.free(point)
    return free


# ---- stores ------------------------------------------------------------------------------
def _make_stores(graph: SDG, bounds: dict[Symbol, int], bound_of: dict[Symbol, Symbol],
                 backend: Backend, stats: MemoryStats, swapped: set[int],
                 windows: dict[tuple[int, int], int]) -> dict:
    consumers = graph.consumers()
    known = set(bounds)
    on_device = {op.id for op in graph.ops.values()  # device kernels (a merge passes values on)
                 if not op.definition.host and op.kind not in ("merge", "sum_readers")
                 and has_static_shapes(op, graph.in_edges(op), known, tiled=True)}
    merges = _merges_stepped_on_device(graph, on_device)
    stores = {}
    for op in graph.ops.values():
        for k in range(len(op.outputs)):
            readers = [e for e in consumers[op.id] if e.src_out == k]
            store = stores[(op.id, k)] = _store_for(op, k, readers, bounds, bound_of, backend, stats,
                                                    op.id in swapped, windows.get((op.id, k)), on_device,
                                                    op.id in merges)
            if op.domain:
                store.bytes = CountedTwice(store.bytes, stats.over_dims)
    return stores


def _merges_stepped_on_device(graph: SDG, on_device: Collection[int]) -> set[int]:
    """The merges whose values along their innermost dim come from device kernels (or
    such merges): every input read at a point that moves with that dim has one as its
    source (an env's observation in the graph: the reset, a host op's, only at the first
    step). The others, read at points that do not move with it (a reset, the last
    iteration's last step), may be host values, written into a device buffer a row each
    (not checked: a host value broadcast along the dim costs a row's move per step)."""
    merges = [op for op in graph.ops.values() if op.kind == "merge" and op.domain]
    found: set[int] = set()
    changed = True
    while changed:
        changed = False
        for op in merges:
            if op.id in found:
                continue
            inner = op.domain[-1]
            stepped = [e for e in graph.in_edges(op) if any(inner in x.symbols() for x in e.phi)]
            if stepped and all(e.src.id in on_device or e.src.id in found for e in stepped):
                found.add(op.id)
                changed = True
    return found


def _until(rt: Output, sizes: list[int], stopped: dict[str, int], store: Any,
           stored_domain: tuple[Symbol, ...]) -> list[int]:
    """``rt``'s sizes when the run stopped at ``stopped``: its points up to the stop along
    the stop's last dim, each of which must have been computed."""
    last = list(stopped)[-1]
    names = [d.name for d in rt.domain]
    if last in names:
        sizes = list(sizes)
        sizes[names.index(last)] = min(sizes[names.index(last)], stopped[last] + 1)
    kept = [rt.domain.index(d) for d in stored_domain]
    for point in itertools.product(*(range(n) for n in sizes)):
        if not store.holds(tuple(point[k] for k in kept)):
            raise TempoError(f"the run stopped at {stopped} before {rt!r} was computed at "
                             f"{dict(zip(names, point))}; make the stop condition depend on it", rt.op.site)
    return sizes


def _padded_end(readers: list[Edge], bounds: dict[Symbol, int], bound_of: dict[Symbol, Symbol]) -> int:
    """The row a padded read of the innermost dim reaches at the readers' last point
    (``tempo.passes.tile``; the reads move forward with the dim): ``start + pad``. A
    read that runs further is padded with zeros by a copy."""
    end = 0
    for edge in readers:
        if edge.tiled:
            entry = edge.phi[-1]
            last = {d: bounds[bound_of[d]] - 1 for d in edge.sink.domain}
            end = max(end, int((entry.start + entry.pad).substitute(bounds).evaluate(last)))
    return end


def _growth_step(readers: list[Edge], bounds: dict[Symbol, int]) -> int | None:
    """The rows by which a device buffer grows (``BlockStore.step``) where every slice
    reader reads its first rows, padded to tiles of the same size (a causal attention's
    ``k[0:t+1]``, ``tempo.passes.tile``): the fewest rows a read has, other than none, at
    the readers' first points. None otherwise."""
    steps = set()
    for edge in readers:
        entry = edge.phi[-1]
        if not isinstance(entry, Slice):
            continue
        if not edge.tiled or entry.start.substitute(bounds) is not const(0):
            return None
        pad, inner = entry.pad.substitute(bounds), edge.sink.domain[-1]
        firsts = (int(pad.evaluate({**{d: 0 for d in edge.sink.domain}, inner: k})) for k in range(3))
        steps.add(min((rows for rows in firsts if rows > 0), default=0))
    return steps.pop() if len(steps) == 1 and min(steps) > 0 else None


CPU_DEVICE_BUFFER_BYTES = 32 << 20
"""On a CPU, the largest block-store buffer kept as a device array (measured up to 16 MiB;
larger ones stay host buffers until measured). A kernel reads a device buffer's rows
inside its own program (``JaxBackend.block_kernel``; XLA's CPU code copies sliced rows out
first, so long reads of the first rows take the whole buffer, ``WHOLE_BUFFER_SHARE``); a
host buffer's rows are copied by NumPy (strided, along the readers' axis) and converted
by the kernel, and each written row waits for its kernel. Greedy decoding, small config,
causal, tokens/s with device against host buffers (2026-11-26, 2-core CPU): batch 1 at 8K
positions (2 MiB buffers) 780 against 606-647, batch 8 at 2K (4 MiB) 3,015 against 2,728,
at 4K (8 MiB) 1,834 against 1,605; at 8K (16 MiB) 1,140 / 1,053 against 892 / 841 in
two rounds, in 533 / 586 against 736 / 722 MB peak RSS (631-643 against 951 before long
reads took whole buffers). On an accelerator a host buffer would cross to the device at
every read: device arrays always."""


def _reads_fixed_rows(edge: Edge, op: Op, bounds: dict[Symbol, int]) -> bool:
    """Whether ``edge`` reads a run of ``op``'s innermost dim fixed by the bounds alone
    (``0:T``), from a point outside that dim: a read of rows that are all written before."""
    entry = edge.phi[-1]
    return isinstance(entry, Slice) and op.domain[-1] not in edge.sink.domain \
        and entry.symbols() <= set(bounds)


def _store_for(op: Op, k: int, readers: list[Edge], bounds: dict[Symbol, int],
               bound_of: dict[Symbol, Symbol], backend: Backend, stats: MemoryStats,
               swapped: bool, window: int | None = None, on_device: Collection[int] = (),
               merge_on_device: bool = False) -> Any:
    """The store of output ``k`` of ``op``. Where readers slice its innermost dim, a block
    store. Its buffers are on the device where ``op`` and every such reader are ops in
    ``on_device`` (device kernels with static shapes; a host op's values are host arrays
    already, and a merge's may be), the readers' slices are tiled (a growing slice read at
    every step, ``tempo.passes.tile``: a host buffer would wait for each row written) or
    read at fixed rows (``_reads_fixed_rows``: a rollout read whole by the learner; there
    also where ``op`` is a merge of device values, ``merge_on_device``) and, on a CPU, a
    buffer holds at most ``CPU_DEVICE_BUFFER_BYTES``; else in host memory. A host buffer
    for fixed reads would cost the rows' trip to the host as soon as a lowered loop made
    them (``BlockStore.write_rows`` waits for the loop) and back at every read, and the
    wait stops the host from running ahead of the device: on an H100 (2026-11-27) n-step
    and REINFORCE over 3x64x64 observations at T=250 ran 0.38 and 0.26 s an iteration
    against 0.88 and 0.77, and on a 2-core CPU PPO on gymnax CartPole at its default size
    4.2-5.0 ms an iteration against 5.1-6.8 (its paper size, n-step and REINFORCE: the
    same within the noise; ``benchmarks/README.md``, 2026-11-27, session 4).
    Otherwise a point store (in host memory if ``swapped``; counting split values over a
    mesh)."""
    t = op.outputs[k]
    static = all(not (d.symbols() - set(bounds)) for d in t.shape)
    shape = tuple(int(d.evaluate(bounds)) for d in t.shape) if static else None
    inner_slices = op.domain and any(e.slices_innermost for e in readers)
    split = backend.mesh is not None  # host blocks would gather split values
    if shape is not None and inner_slices and not split:
        length = bounds[bound_of[op.domain[-1]]]
        rows = _padded_end(readers, bounds, bound_of)
        buffer_bytes = max(length, rows) * int(np.prod(shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
        device = backend.name == "jax" and not swapped and (op.id in on_device or merge_on_device) \
            and (not backend.on_cpu or buffer_bytes <= CPU_DEVICE_BUFFER_BYTES) \
            and all(not e.slices or e.sink.id in on_device
                    and (e.tiled or _reads_fixed_rows(e, op, bounds)) for e in readers)
        axis = _rows_axis(op, readers)
        buffers = DeviceBuffers(backend, axis) if device else HostBuffers(backend.view_of_host, axis)
        point_reads = device and any(not e.slices for e in readers)
        if window is not None:
            return WindowStore(stats, length, shape, t.dtype, window, buffers=buffers,
                               point_reads=point_reads)
        step = _growth_step(readers, bounds) if device and backend.on_cpu else None
        return BlockStore(stats, length, shape, t.dtype, rows=rows, buffers=buffers, step=step,
                          point_reads=point_reads)

    def empty(sizes: tuple[int, ...]) -> Any:
        if shape is None:
            raise TempoError(f"cannot read an empty slice of {op.name}, whose shape varies",
                             op.site)
        return backend.zeros((*sizes, *shape), t.dtype)
    nbytes = None if shape is None else int(np.prod(shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
    kind = SwappedStore if swapped else SplitPointStore if split else PointStore
    return kind(backend, stats, empty, nbytes)


def _rows_axis(op: Op, readers: list[Edge]) -> int:
    """The axis a block store of ``op`` keeps its rows along: the one its slice readers
    want them at (``Edge.rows_at``) when they agree and ``op`` has one dim (buffers
    without a prefix: a read of several prefixes stacks them first), else the first."""
    wanted = {e.rows_at for e in readers if e.slices}
    return wanted.pop() if len(op.domain) == 1 and len(wanted) == 1 else 0


# ---- launchers ---------------------------------------------------------------------------
def make_launcher(op: Op, edges: list[Edge], stores: dict, bounds: dict[Symbol, int],
                  backend: Backend, shift: dict[Symbol, int] | None = None,
                  last_reads: dict[Edge, Expr] | None = None, extent: int = 0,
                  programs: dict[int, _Programs] | None = None) -> Launcher:
    """The function that executes ``op`` at a point (host ops see coordinates and bounds
    moved by ``shift``, see ``Executable.run``'s origin; device kernels donate the inputs
    they read last, where ``last_reads`` says so, see ``tempo.schedule.memory``).
    ``extent``: the points of ``op``'s innermost dim (0: not known); ``programs``: per op,
    the programs a block launcher compiled, kept across runs (``_Programs``)."""
    if op.kind == "sum_readers":
        return _reader_sum_launcher(op, edges[0], stores, bounds, backend)
    static_shapes = not op.definition.host and has_static_shapes(op, edges, set(bounds), tiled=True)
    reads = _reads(op, edges, stores, bounds, backend, not static_shapes)
    writes = [stores[(op.id, k)].write for k in range(len(op.outputs))]
    if op.kind == "merge":
        return _merge_launcher(op, edges, reads, writes[0], bounds)
    if op.definition.host:
        return _host_launcher(op, reads, writes, bounds, backend, shift or {}, _kept_on_host(op, stores))
    return _device_launcher(op, edges, reads, writes, bounds, backend, last_reads or {}, stores,
                            static_shapes, extent, {} if programs is None else programs)


def _reads(op: Op, edges: list[Edge], stores: dict, bounds: dict[Symbol, int], backend: Backend,
           host: bool) -> list[tuple[Callable[[tuple], Any], Callable]]:
    """Per input of ``op``, its store's reader and the index it reads at a point."""
    return [(_reader(source_store(e, stores), e, host, backend), compile_function(e.phi, op.domain, bounds))
            for e in edges]


def _reader(store: Any, edge: Edge, host: bool, backend: Backend) -> Callable[[tuple], Any]:
    """The reads of ``edge`` from ``store``, with a slice's rows at ``edge.rows_at``
    (moved there where the store keeps them elsewhere)."""
    read = store.reader(bool(edge.slices), host=host)
    if not edge.slices or edge.rows_at == store.rows_axis:
        return read
    source, destination = store.rows_axis, edge.rows_at
    return lambda index: backend.moveaxis(read(index), source, destination)


def _merge_launcher(op: Op, edges: list[Edge], reads: list, write: Callable,
                    bounds: dict[Symbol, int]) -> Launcher:
    branches = [(compile_function([e.cond], op.domain, bounds), read, phi)
                for e, (read, phi) in zip(edges, reads)]

    def launch(point: tuple[int, ...]) -> None:
        for cond, read, phi in branches:
            if cond(*point)[0]:
                write(point, read(phi(*point)))
                return
        raise TempoError(f"internal: no branch of {op.name} holds at {point}", op.site)
    return launch


def _reader_sum_launcher(op: Op, edge: Edge, stores: dict, bounds: dict[Symbol, int],
                         backend: Backend) -> Launcher:
    accumulate = compile_reader_sum(op.params["reads"], op.domain, bounds)
    read = source_store(edge, stores).reader(False)
    write = stores[(op.id, 0)].write
    out = op.outputs[0]
    shape = compile_function(out.shape, op.domain, bounds)
    region = compile_function([edge.cond], op.domain, bounds)

    def launch(point: tuple[int, ...]) -> None:
        total = accumulate(point, read) if region(*point)[0] else None
        write(point, backend.zeros(shape(*point), out.dtype) if total is None else total)
    return launch


def _host_view(op: Op, bounds: dict[Symbol, int], shift: dict[Symbol, int]) -> tuple[dict, list[int]]:
    """The bounds a host op sees and the offsets of its coordinates: moved by the run's
    origin (``shift``), except for an index into this run's values (``in_run``, see
    ``tempo.passes.vectorize``)."""
    if op.params.get("in_run"):
        shift = {}
    return {b: v + shift.get(b, 0) for b, v in bounds.items()}, [shift.get(d, 0) for d in op.domain]


def _host_launcher(op: Op, reads: list, writes: list[Callable], bounds: dict[Symbol, int],
                   backend: Backend, shift: dict[Symbol, int], on_host: list[bool]) -> Launcher:
    """A host op's launcher: its inputs as NumPy arrays, its outputs moved to the backend
    (``from_host``) except those kept in host memory (``on_host``: a block store's host
    buffers, which would copy a device value back)."""
    dim, size = op.params.get("rows_of") or (None, 0)
    rows = backend.process_rows(dim, size) if dim is not None else None
    if rows is not None:  # a batched UDF over a dim split over processes: this process's rows
        shifted, offsets = _host_view(op, bounds, shift)
        return _own_rows_launcher(op, reads, writes, backend, shifted, offsets, rows)
    call, to_host = _host_call(op, writes, bounds, backend, shift, on_host), backend.to_host

    def launch(point: tuple[int, ...]) -> None:
        call(point, [to_host(read(phi(*point))) for read, phi in reads])
    return launch


def _kept_on_host(op: Op, stores: dict) -> list[bool]:
    """Per output of a host op, whether its store keeps it in host memory (a block store's
    host buffers)."""
    return [isinstance(stores[(op.id, k)], BlockStore) and not stores[(op.id, k)].buffers.on_device
            for k in range(len(op.outputs))]


def _host_call(op: Op, writes: list[Callable], bounds: dict[Symbol, int], backend: Backend,
               shift: dict[Symbol, int], on_host: list[bool]) -> Callable[[tuple[int, ...], list], None]:
    """A host op's kernel at a point, given its inputs on the host, writing its outputs
    (see ``_host_launcher``)."""
    kernel, params, multi = op.definition.kernel, op.params, op.definition.multi_output
    seen = _host_point(op, bounds, shift)
    moves = [(lambda value: value) if kept else backend.from_host for kept in on_host]

    def call(point: tuple[int, ...], inputs: list) -> None:
        outs = kernel(params, seen(point), *inputs)
        for write, move, value in zip(writes, moves, outs if multi else (outs,)):
            write(point, move(value))
    return call


def _late_host_launcher(name: str, op: Op, edges: list[Edge], stores: dict, bounds: dict[Symbol, int],
                        backend: Backend, shift: dict[Symbol, int], tail: Tail, lag: Lag) -> Launcher:
    """A host op of the tail: it reads its inputs from outside the tail where the program
    reaches it (references: the values stay as they are, whatever is freed meanwhile), and
    runs one occurrence late (``tempo.runtime.tail``), reading the tail's values then."""
    reads = [(read, phi, e.src.id in tail)
             for (read, phi), e in zip(_reads(op, edges, stores, bounds, backend, True), edges)]
    call = _host_call(op, [stores[(op.id, k)].write for k in range(len(op.outputs))], bounds, backend,
                      shift, _kept_on_host(op, stores))
    to_host, ahead = backend.to_host, backend.copy_to_host_ahead

    def early_of(point: tuple[int, ...]) -> list:
        """The inputs read where the program reaches the op (None: those of the tail)."""
        return [None if late else read(phi(*point)) for read, phi, late in reads]

    def given(point: tuple[int, ...], early: list) -> None:
        """Queue the op at ``point`` with ``early`` (``early_of``) its inputs from outside
        the tail: a captured iteration's (``tempo.runtime.capture``) come from its program."""
        ahead(early)

        def run_late() -> None:
            call(point, [to_host(read(phi(*point)) if late else value)
                         for (read, phi, late), value in zip(reads, early)])
        lag.defer(name, run_late)

    def launch(point: tuple[int, ...]) -> None:
        given(point, early_of(point))
    launch.early_of, launch.given = early_of, given  # type: ignore[attr-defined]
    return launch


def _own_rows_launcher(op: Op, reads: list, writes: list[Callable], backend: Backend, shifted: dict,
                       offsets: list[int], rows: tuple[int, int]) -> Launcher:
    """A host UDF's batched form over a dim split over several processes, called in each
    with the rows its devices hold (``Backend.process_rows``): its inputs' rows of the dim
    (``row_inputs``; the others whole), and its point holding the dim's indices of those
    rows (``{dim name: array}``). Its outputs are those rows, which make the value split
    over the mesh with the other processes' (the hosts' envs are stepped once, each by its
    own host)."""
    params, multi = op.params, op.definition.multi_output
    dim, size = params["rows_of"]
    inputs = [(read, phi, own) for (read, phi), own in zip(reads, params["row_inputs"])]
    own = {**shifted, Symbol(dim): np.arange(*rows)}

    def launch(point: tuple[int, ...]) -> None:
        env = {**own, **{d: p + k for d, p, k in zip(op.domain, point, offsets)}}
        values = [backend.local_rows(read(phi(*point)), rows) if own else backend.to_host(read(phi(*point)))
                  for read, phi, own in inputs]
        outs = op.definition.kernel(params, env, *values)
        for write, value in zip(writes, outs if multi else (outs,)):
            write(point, backend.from_local_rows(value, dim, size))
    return launch


def _batched_point_ops(schedule: Schedule, stores: dict, bounds: dict[Symbol, int],
                       shift: dict[Symbol, int]) -> dict[str, Callable]:
    """Per statement of an op with a batched kernel (``OpDef.batched``): a function that
    writes its values at many points at once, ``fn(coordinate arrays, points)``; a
    lowered loop's plan runs these instead of one launch per point."""
    return {name: _batched_launcher(_rows_value(stmt.op, bounds, shift), stores[(stmt.op.id, 0)])
            for name, stmt in schedule.statements.items()
            if stmt.kind == "exec" and stmt.op.definition.batched is not None}


def _batched_launcher(values: Callable[[tuple, int], Any], store: Any) -> Callable[[tuple, list], None]:
    def launch(coords: tuple, points: list[tuple]) -> None:
        store.write_rows(points, values(coords, len(points)), list(range(len(points))))
    return launch


def _host_point(op: Op, bounds: dict[Symbol, int], shift: dict[Symbol, int]) -> Callable[[tuple], dict]:
    """The point (or coordinate arrays, one per dim) as a host op sees it: its bounds and
    coordinates moved by the run's origin (``_host_view``)."""
    shifted, offsets = _host_view(op, bounds, shift)
    domain = op.domain

    def seen(point: tuple) -> dict:
        return {**shifted, **{d: p + k for d, p, k in zip(domain, point, offsets)}}
    return seen


def _rows_value(op: Op, bounds: dict[Symbol, int], shift: dict[Symbol, int]) -> Callable[[tuple, int], Any]:
    """A batched point op's values at ``count`` points given by coordinate arrays."""
    seen = _host_point(op, bounds, shift)
    return lambda coords, count: op.definition.batched(op.params, seen(coords), count)


def _point_value(op: Op, bounds: dict[Symbol, int], shift: dict[Symbol, int]) -> Callable[[tuple], Any]:
    """A point op's value at a point, as its host launcher computes it (``_host_call``)."""
    seen = _host_point(op, bounds, shift)
    return lambda point: op.definition.kernel(op.params, seen(point))


def _device_launcher(op: Op, edges: list[Edge], reads: list, writes: list[Callable],
                     bounds: dict[Symbol, int], backend: Backend, last_reads: dict[Edge, Expr],
                     stores: dict, static_shapes: bool, extent: int = 0,
                     programs: dict[int, _Programs] | None = None) -> Launcher:
    multi = op.definition.multi_output
    symbolic = bool(param_symbols(op.params) & set(op.domain))  # params vary with the point
    static_params = None if symbolic else resolve_params(op.params, bounds)
    kernel = backend.kernel(op, static_params, static_shapes)
    domain = op.domain
    buffers = kernel_buffers(op, edges, stores, set(bounds))
    if buffers is not None and static_params is not None and static_shapes and backend.name == "jax":
        # shapes that change along the dim: tiled reads' row counts, growing buffers' lengths
        changing = any(edges[k].tiled for k in buffers.blocks) or any(t.step for t in buffers.targets)
        kept = _Programs(backend) if programs is None else programs.setdefault(op.id, _Programs(backend))
        return _block_launcher(op, edges, reads, writes, static_params, backend, kernel, buffers,
                               kept, extent if changing else 0)
    donors = [(k, compile_function([last_reads[e]], domain, bounds), source_store(e, stores))
              for k, e in enumerate(edges) if last_reads.get(e, FALSE) is not FALSE]
    if donors and static_params is not None and static_shapes:
        return _donating_launcher(op, reads, writes, static_params, backend, kernel, donors)
    if len(reads) == 1 and len(writes) == 1 and not symbolic and not multi:
        (read, phi), = reads
        write = writes[0]

        def launch_unary(point: tuple[int, ...]) -> None:
            write(point, kernel(static_params, read(phi(*point))))
        return launch_unary

    def launch(point: tuple[int, ...]) -> None:
        params = resolve_params(op.params, {**bounds, **dict(zip(domain, point))}) \
            if symbolic else static_params
        outs = kernel(params, *(read(phi(*point)) for read, phi in reads))
        for write, value in zip(writes, outs if multi else (outs,)):
            write(point, value)
    return launch


def _block_launcher(op: Op, edges: list[Edge], reads: list, writes: list[Callable], params: dict,
                    backend: Backend, kernel: Callable, layout: KernelBuffers, programs: _Programs,
                    bound: int = 0) -> Launcher:
    """A device launcher whose kernel (``JaxBackend.block_kernel``) slices the device
    buffers its inputs ``layout.blocks`` read and writes its outputs ``layout.written``
    into their stores' device buffers itself (a read of a buffer it writes is of the rows
    its ``put_row`` members complete, ``blocks.written_by_kernel``), returning the rows too
    where their stores are read at points as well (``BlockStore.point_reads``). Where a read is not
    one run of a buffer's rows (an empty unpadded slice, a buffer not made yet), the plain
    kernel runs on the reads' values and writes through the stores. Its other inputs are
    not donated. ``layout.widens``: long reads of the buffers' first rows read the whole
    buffers (``blocks.whole_buffers``).

    A kernel whose block reads are all tiled reads of windows' rings reads the whole rings,
    their rows in ring order rather than in the points' (no slice: a window decoder's
    attention reads its keys and values as they lie), where nothing else it reads or makes
    has the padded length and it holds no op whose values depend on the rows' order
    (``reads_rings_whole``, ``blocks.ORDERED_KINDS``). The order does not matter to such a
    kernel: the tile pass lets a padded axis flow otherwise only through elementwise ops
    between values of the same reads, permutes, matmuls and reductions, and masks the rows
    past a read's points, so one permutation of every read's rows that keeps the masked
    rows masked changes the values only by the order of floating-point sums.

    The kernel is compiled for each count of rows the reads take (a tiled read's few
    lengths). At the first launch the counts of the later points along the innermost dim
    (up to ``bound``) start compiling on a background thread, in the order they come
    (``_Programs``, ``JaxBackend.compile_later``): a decoder's first generation compiles
    its next tiles while it decodes."""
    multi = op.definition.multi_output
    blocks, written, sources, targets = layout.blocks, layout.written, layout.sources, layout.targets
    axes, shared, widens = list(layout.axes), layout.shared, layout.widens
    slices = tuple(zip(blocks, axes))
    slicers = [(k, store.block_slice) for k, store in zip(blocks, sources)]
    in_buffer = {k for k, _ in shared}
    others = [write for k, write in enumerate(writes) if k not in written]
    rings = [(k, store.ring_slice) for k, store in zip(blocks, sources)] if layout.rings else []

    def located(indices: list[tuple], ahead: bool = False) -> list[tuple[Any, int, int] | None]:
        """Each block read's buffer, first row and rows (None: not one run of a buffer's
        rows): whole rings, in ring order, where every read is a tiled read of a ring that
        allows it (``WindowStore.ring_slice``) and all start at the same point; else runs
        of rows in the points' order (widened where ``widens``). ``ahead``: of a later
        point, with the buffers' shapes as they will be then."""
        if rings and len({indices[k][-1].start for k in blocks}) == 1:
            whole = [ring(indices[k], k in in_buffer) for k, ring in rings]
            if all(w is not None for w in whole) and len({rows for _, _, rows in whole}) == 1:
                return whole
        found = [slicer(indices[k], ahead) for k, slicer in slicers]
        return found if any(f is None for f in found) or not widens else whole_buffers(found, axes)

    def arguments(xs: list[Any], found: list[tuple[Any, int, int]], buffers: list[Any],
                  slots: list[int]) -> tuple:
        """The kernel's arguments: its inputs, with each block read's buffer and first row
        (a first row only where it reads a buffer it writes), the buffers it writes, and
        the rows it writes them at."""
        xs = list(xs)
        for (k, _), (block, start, _) in zip(slicers, found):
            xs[k] = np.int32(start) if k in in_buffer else (block, np.int32(start))
        return (*xs, *buffers, *(np.int32(row) for row in slots))

    returned = tuple(n for n, store in enumerate(targets) if store.point_reads)
    buffer_kernel = backend.block_kernel(op, params, len(edges), slices,
                                          tuple((k, t.rows_axis) for k, t in zip(written, targets)), shared,
                                          returned)

    def later_launches(point: tuple[int, ...], xs: list[Any], buffers: list[Any],
                       slots: list[int]) -> list[tuple[tuple[int, ...], tuple]]:
        """The row counts of the reads at the points after ``point`` along its last dim
        and the kernel's arguments there (their shapes: the buffers grown as they will
        be, a window's ring as it is; the other inputs as at ``point``)."""
        out = []
        for t in range(point[-1] + 1, bound) if point else ():
            later = (*point[:-1], t)
            found = located([phi(*later) for _, phi in reads], ahead=True)
            if all(f is not None for f in found):
                grown = [store.shape_ahead(block, t) for store, block in zip(targets, buffers)]
                out.append((launch_shape(found, grown), arguments(xs, found, grown, slots)))
        return out

    def launch_shape(found: list[tuple[Any, int, int]], buffers: list[Any]) -> tuple:
        """What a launch's program depends on beyond the inputs' types: the reads' row
        counts, the lengths of the buffers read and of those written (growing buffers)."""
        return (tuple(count for _, _, count in found),
                tuple(block.shape[axis] for (block, _, _), axis in zip(found, axes)),
                tuple(block.shape[store.rows_axis] for store, block in zip(targets, buffers)))

    def launch(point: tuple[int, ...]) -> None:
        with grown_buffers:  # one trim for the buffers this launch grows
            slots = [store.row_slot(point) for store in targets]  # first: a ring may grow
        indices = [phi(*point) for _, phi in reads]
        found = located(indices)
        if any(f is None for f in found):
            outs = kernel(params, *(read(index) for (read, _), index in zip(reads, indices)))
            for write, value in zip(writes, outs if multi else (outs,)):
                write(point, value)
            return
        xs: list[Any] = [None if k in blocks else read(index)
                         for k, ((read, _), index) in enumerate(zip(reads, indices))]
        buffers, rows_written = [b for b, _ in slots], [row for _, row in slots]
        args = arguments(xs, found, buffers, rows_written)
        shape = launch_shape(found, buffers)
        if shape not in programs.compiled:
            later = later_launches(point, xs, buffers, rows_written) if programs.first else []
            programs.ready(buffer_kernel, shape, later)
        outs = buffer_kernel(shape[0], *args)
        if written:  # the outputs not written into buffers, the buffers (and rows point reads take)
            outs, buffers, *rows = outs
            row_of = dict(zip(returned, rows[0])) if rows else {}
            for n, (store, block) in enumerate(zip(targets, buffers)):
                store.written_by_kernel(point, block, row_of.get(n))
        elif not multi:
            outs = (outs,)
        for write, out in zip(others, outs, strict=True):
            write(point, out)

    def compile_ahead(point: tuple[int, ...], inputs: list[BufferShape | None]) -> Future | None:
        """Start compiling the launch at ``point`` before the run reaches it, its buffers as
        they will be then and its other inputs shaped as ``inputs`` (None at the buffers'
        positions); only for a kernel writing no buffer and reading no window's ring (a
        ring's first size depends on its writes; None: no launch to compile)."""
        if written or rings:
            return None
        found = located([phi(*point) for _, phi in reads], ahead=True)
        if any(f is None for f in found):
            return None
        args = arguments(inputs, found, [], [])
        return programs.ahead(buffer_kernel, launch_shape(found, []), args, first=True)
    launch.compile_ahead = compile_ahead  # type: ignore[attr-defined]
    return launch


class _Programs:
    """The launch shapes a block launcher's kernel has programs for (the reads' row
    counts and the buffers' lengths), compiled or being compiled in the background; kept
    across runs (``Executable``)."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.compiled: set[tuple] = set()
        self.compiling: dict[tuple, Future] = {}  # shape -> the background compile
        self.launched = False

    @property
    def first(self) -> bool:
        """Whether no launch has been readied yet."""
        return not self.launched

    def ahead(self, kernel: Callable, shape: tuple, args: tuple, first: bool = False) -> Future | None:
        """Start compiling launch ``shape`` of jitted ``kernel`` for arguments shaped as
        ``args`` in the background (``first``: the first launch, before the run reaches
        it: ``compile_later``), unless it has a program or one on the way (None)."""
        if shape in self.compiled or shape in self.compiling:
            return None
        future = self.compiling[shape] = self.backend.compile_later(kernel, shape[0], args, first)
        return future

    def ready(self, kernel: Callable, shape: tuple, later: list[tuple[tuple, tuple]]) -> None:
        """Before the first launch of ``shape`` (its reads' row counts first, the static
        argument) of jitted ``kernel``: at the very first, start compiling the ``later``
        launches (shapes, and arguments or their shapes) in the background; where
        ``shape`` is being compiled there, wait for it (where it has not started, or
        failed, the call compiles in the foreground)."""
        if self.first:
            self.launched = True
            first_launches: dict[tuple, tuple] = {}
            for later_shape, args in later:
                first_launches.setdefault(later_shape, args)
            for later_shape, args in first_launches.items():
                if later_shape != shape:
                    self.ahead(kernel, later_shape, args)
        pending = self.compiling.pop(shape, None)
        if pending is not None and not pending.cancel():
            pending.exception()  # waits
        self.compiled.add(shape)

    def cancel_waiting(self) -> None:
        """Drop the background compiles that have not started (a run that stopped early
        leaves them; a later run compiles them where it needs them)."""
        for key, pending in list(self.compiling.items()):
            if pending.cancel():
                del self.compiling[key]


def _refs_of_a_stored_input() -> int:
    """``sys.getrefcount`` of an input that only its store and the launcher's argument
    list hold, as the donating launcher calls it (the count differs between Pythons)."""
    store = {0: object()}
    xs = [store[0]]
    return sys.getrefcount(xs[0])


_STORED_ONCE = _refs_of_a_stored_input()


def _donating_launcher(op: Op, reads: list, writes: list[Callable], params: dict, backend: Backend,
                       kernel: Callable, donors: list[tuple[int, Callable, Any]]) -> Launcher:
    """A device launcher that donates input ``k`` of ``donors`` (``(k, last, store)``)
    where ``last`` holds (the read is the last use of the point) and no other store holds
    the same array (a merge's store and its branch's share one until the branch's point is
    freed). A donated point is freed at once (the schedule's free that follows finds it
    gone). Each set of donated inputs that occurs gets its own compiled kernel."""
    multi, donatable = op.definition.multi_output, backend.donatable
    kernels: dict[tuple[int, ...], Callable] = {(): kernel}
    stats = donors[0][2].stats

    def launch(point: tuple[int, ...]) -> None:
        xs = [read(phi(*point)) for read, phi in reads]
        given = [(k, store) for k, last, store in donors
                 if last(*point)[0] and sys.getrefcount(xs[k]) == _STORED_ONCE and donatable(xs[k])]
        if given:
            ks = tuple(k for k, _ in given)
            run = kernels.get(ks)
            if run is None:
                run = kernels[ks] = backend.kernel(op, params, True, ks)
            for k, store in given:
                stats.donated += 1
                stats.donated_bytes += xs[k].nbytes
                store.free(reads[k][1](*point))
        else:
            run = kernel
        outs = run(params, *xs)
        for write, value in zip(writes, outs if multi else (outs,)):
            write(point, value)
    return launch
