"""Captured iterations: each steady iteration of a training loop as one XLA program.

An RL program's schedule is a loop over its iterations (``for c0 in range(I)``) around
the iteration's work: an acting loop and an update loop (each one scan, ``lowering``),
the kernels between them, point ops (the coordinates random draws are keyed by) and the
late sinks (metrics, the env's record of its episodes; ``tempo.runtime.tail``). Run
statement by statement, the host makes every plan, launch and store update of every
iteration again: at 8 envs x 64 steps on gymnax that host work takes longer than the
device's, and on an accelerator it is most of an iteration. Here each iteration of the
same *kind* runs as one program instead.

**Kinds.** The loop's body runs the same statements at every iteration, moved along the
loop's dim (a statement's point holds ``c0 + k`` there, or a select between such, and
``c0`` nowhere else; a statement outside the dim holds no ``c0``), except where a guard,
an inner loop's start or a branch condition depends on the iteration (``c0 == 0``,
``i >= 1``): the values of those at ``c0`` are its kind (``IterationPlan.key``); a guard
mixing ``c0`` with the counters of inner loops of constant ranges adds its values over
those ranges (``_Grid``). Iterations of one kind read and write the same points relative
to their own, so one program, traced once, serves them all: it takes the values the
iteration reads from the stores (the points within ``low .. high`` iterations of it, and
whatever the stores of ops outside the loop's dim hold) and the values of its point ops
(computed on the host, their coordinates moved), and returns the values the stores hold
after it, in that window, and those its late sinks read.

**How a kind is captured.** Its first iteration in a run runs statement by statement,
recording which point ops it runs where. Its next is then *traced* (``jax.jit``): the
loop body's own Python runs on fresh stores holding the traced values, with point ops fed
from the program's arguments and the late sinks recorded instead of queued; lowered loops
call their scans' jitted functions, block kernels theirs, so the program holds every scan
and kernel of the iteration. It compiles on a background thread while later iterations
run statement by statement. Its first run is checked: it runs beside the interpreted
iteration on the same values, and both must leave the same points in the stores and hand
the late sinks the same values, bit for bit by default (``IterationRunner.exact``), or the
kind is interpreted from then on (``IterationReport``); how it compared is noted in the
compile cache (``checked_before``). From then on an iteration of the kind exports its
stores' window (whose structure and shapes must be the ones the program was traced for,
else it runs interpreted) or takes the outputs of the program before, runs the program,
puts its outputs back and queues its late sinks with the values it computed for them; the
stores' memory counts move as the traced iteration's did. Nothing is donated: a
program's inputs are held until its outputs replace them.

**What is not captured.** A body holding a host op other than point ops and late sinks in
its steady iterations (a host env's step, ``tp.stop_when``), a loop lowered in spans, a
read along the loop's dim that is not a point moved by a constant (or the dim in another
entry of a read), params or shapes that depend on it, inner loop bounds that depend on
it, branch conditions or guards that mix it with other dims or counters (but those of
``_Grid``), host block buffers holding points from one iteration to the next, stores split
over devices or swapped to the host: the loop then runs as before, and ``IterationReport``
says why."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tempo import cache
from tempo.errors import Uncapturable
from tempo.ir.graph import SDG, Op
from tempo.ir.ops import param_symbols
from tempo.runtime.plan import point_op
from tempo.runtime.stores import (
    BlockStore,
    Bytes,
    DeviceBuffers,
    MemoryStats,
    PointStore,
    WindowStore,
    return_freed_memory,
)
from tempo.runtime.tail import Tail
from tempo.schedule import ast
from tempo.schedule.scheduler import Statement
from tempo.symbolic.expr import Expr, Slice, Symbol, compile_function, compile_vectorized, linear_form

if TYPE_CHECKING:
    from tempo.runtime.backends import JaxBackend
    from tempo.runtime.lowering import LoopLauncher, Lowerable

STATEMENT = "I0"
"""The program's statement that runs one iteration of the captured loop."""
WAIT_FOR_PROGRAMS = False
"""Wait for a kind's program where it is traced instead of compiling it beside the
iterations that follow: its first run is then the very next iteration of the kind, whatever
the machine's speed (tests set it)."""
MARKER = "captured"
"""The compile cache's kind of entry noting how a program's captured iterations compared
with its interpreted ones where they were checked on this machine (``checked_before``)."""
EXACT, CLOSE, DIFFERENT = "exact", "close", "different"
"""How a kind's program compared with the interpreted iteration: bit for bit, up to
rounding, or otherwise."""
OUTCOMES = (EXACT, CLOSE, DIFFERENT)
"""Those outcomes, the worst last: a program's note is its kinds' worst."""
LATE: Key = (-1, -1)
"""Stands for the late sinks' inputs where a check names what differed."""
CPU_FRESH_ITERATIONS = 4000
"""On a CPU, a loop whose captured programs were not checked on this machine before is
captured by default (``LoopPolicy.capture`` None) only where it has at least this many
iterations: the compile runs on the cores the iterations run on. PPO on gymnax at 8 envs x
64 steps on 2 cores (2026-11-28): the program was ready 2.6-2.9 s after it was traced, the
325-370 iterations run meanwhile took about twice their time, and each later one saves
about 1 ms (2.7-3.5 ms against 3.6-4.4): 2,000 iterations took 11.0 s captured from a
fresh cache against 9.1 s interpreted with a warm one, so a first compile pays for itself
after about 4,000."""
CPU_CHECKED_ITERATIONS = 1000
"""The same for a loop whose programs were checked (bit for bit) before, XLA's cache
holding them: tracing still takes the main thread 0.2-0.5 s, and loading the program and
checking its first run cost a few iterations more. The same PPO loaded its program 0.15-0.2
s after tracing it; its time to a mean return of 475 (``benchmarks/ppo.py --time-to 475``,
seed 0, reached after 88 of at most 500 iterations) took 2.22 s captured against 1.90 s
not (seeds 1 and 2, whose programs were not in XLA's cache, 3.6-3.7 s against 2.1-2.5)."""

FREQUENT = 1 / 8
FREQUENT_WITHIN = 256
"""A kind of iteration is traced where it is at least ``FREQUENT`` of the next
``FREQUENT_WITHIN`` iterations (each program compiles once)."""

Key = tuple[int, int]
"""A store: ``(op id, output)``."""


@dataclass(frozen=True)
class IterationPlan:
    """What capturing a loop's iterations needs to know of the program (``plan_iterations``)."""

    loop: ast.Loop
    """The captured loop, as the program runs it (lowered loops as their statements)."""
    dim: Symbol
    """The dim its counter moves along."""
    stop: int
    """Its last counter plus one."""
    key: Callable[[int], tuple]
    """An iteration's kind at a counter (see the module)."""
    low: int
    high: int
    """The iterations, relative to the one running, whose points it reads, writes or frees."""
    at: dict[Key, int | None]
    """Per store the iteration reads or writes: where the dim is in its points (None:
    outside its domain)."""
    written: tuple[Key, ...]
    """The stores it writes or frees points of (the others it only reads)."""
    points: dict[str, int | None]
    """Its point ops' statements, each with where the dim is in the op's points."""
    point_stores: dict[str, Key]
    """The store each of those writes."""
    late: dict[str, int | None]
    """Its late statements (``tempo.runtime.tail``: host ops, ops and frees run one
    occurrence late), each with where the dim is in the op's points."""
    hosts: tuple[str, ...]
    """Its other host ops' statements (a host env's step, an env's first state): a kind
    of iteration that runs one is not captured."""
    loops: tuple[str, ...]
    """The lowered loops in its body."""


def plan_iterations(root: ast.Node, statements: dict[str, Statement], graph: SDG, bounds: dict[Symbol, int],
                    lowered: dict[str, Lowerable], tail: Tail) -> IterationPlan | str:
    """The plan for capturing the iterations of ``root``'s training loop (its outermost
    loop holding a lowered loop), or why they cannot be (see the module)."""
    loop = _training_loop(root, lowered)
    if loop is None:
        return "no outermost loop holds a lowered loop"
    counter = loop.var
    start, stop = loop.start, ast.range_stop(loop)
    if not start.is_const or stop is None or not stop.is_const or loop.step != 1:
        return "the loop's range is not a constant one"
    nodes = list(ast.statements(loop.body))
    inner = [name for name in dict.fromkeys(n.name for n in nodes) if name in lowered]
    if any(lowered[name].spans for name in inner):
        return "a loop inside it is lowered in spans"
    scoped = [item for tree in [loop.body, *(lowered[name].loop for name in inner)] for item in _scoped(tree)]
    stmts = [node for node, _ in scoped if isinstance(node, ast.Stmt) and node.name in statements]
    dims: set[Symbol] = set()
    offsets: dict[int, set[int]] = {}
    keys: list[Expr] = []
    grids: list[_Grid] = []
    for node, enclosing in scoped:
        if not isinstance(node, ast.Stmt):  # a guard or a loop's bound
            found = _kind_of(node, counter, enclosing, keys, grids)
            if found:
                return f"a guard or loop bound {found}"
            continue
        if node.name not in statements:
            continue
        op = statements[node.name].op
        for k, entry in enumerate(node.index):
            if counter not in entry.symbols():
                continue
            moved = _moves(entry, counter)
            if isinstance(moved, str):
                return f"{node.name}'s point holds {entry}: {moved}"
            if moved[0]:
                dims.add(op.domain[k])
                offsets.setdefault(op.id, set()).update(moved[0])
            for atom in moved[1]:
                found = _kind_of(atom, counter, enclosing, keys, grids)
                if found:
                    return f"{node.name}'s point {found}"
    if len(dims) != 1:
        return "its statements' points do not move along one dim" if dims else "no statement moves with it"
    (dim,) = dims
    ops = {statements[n.name].op.id: statements[n.name].op for n in stmts}
    execs = {statements[n.name].op.id for n in stmts if statements[n.name].kind == "exec"}
    low = min(min(v) for v in offsets.values())
    high = max(max(v) for v in offsets.values())
    read: dict[int, Op] = {}
    for op_id in execs:
        op = ops[op_id]
        why = _refusal(op, dim)
        if why:
            return why
        for edge in graph.in_edges(op):
            read[edge.src.id] = edge.src
            moved = _read_offset(edge.phi, edge.src.domain, dim)
            if isinstance(moved, str):
                return f"{op.name} reads {edge.src.name} {moved}"
            if moved is not None:  # (a read of the point before, or after: the window holds it)
                low = min(low, min(offsets.get(op_id, {0})) + moved)
                high = max(high, max(offsets.get(op_id, {0})) + moved)
            for atom in _atoms(edge.cond.substitute(bounds)):
                if dim in atom.symbols():
                    if atom.symbols() != {dim}:
                        return f"{op.name}'s branch condition {atom} mixes {dim.name} with other dims"
                    keys += [atom.substitute({dim: counter + k}) for k in sorted(offsets.get(op_id, {0}))]
    at: dict[Key, int | None] = {}
    for op in [*ops.values(), *read.values()]:
        for k in range(len(op.outputs)):
            if op.id not in tail:  # (late work keeps the tail's own values: ``_late_recorder``)
                at[(op.id, k)] = op.domain.index(dim) if dim in op.domain else None
    written = tuple(sorted((op_id, k) for op_id, op in ops.items() for k in range(len(op.outputs))
                           if op_id not in tail))
    position = {name: (statements[name].op.domain.index(dim) if dim in statements[name].op.domain else None)
                for name in dict.fromkeys(n.name for n in stmts)}
    points = {name: at_dim for name, at_dim in position.items()
              if statements[name].kind == "exec" and point_op(statements[name].op)}
    if any(len(statements[name].op.outputs) != 1 for name in points):
        return "a point op has several outputs"
    late = {name: at_dim for name, at_dim in position.items() if statements[name].op.id in tail}
    hosts = tuple(name for name in position if statements[name].kind == "exec" and name not in points
                  and name not in late and statements[name].op.definition.host)
    steady = _run_at(loop.body, counter, (int(start.value) + int(stop.value)) // 2)
    always = next((name for name in hosts if name in steady), None)
    if always is not None:  # (the iterations of other kinds are few: the first, the last)
        return f"host op {statements[always].op.name} runs in its steady iterations (neither a point op " \
               f"nor a late sink)"
    scalars = compile_function(keys, [counter], {})

    def key(c: int) -> tuple:
        return (*scalars(c), *(grid(c) for grid in grids))
    stores = {name: (statements[name].op.id, 0) for name in points}
    return IterationPlan(loop, dim, int(stop.value), key, low, high, at, written, points, stores, late,
                         hosts, tuple(inner))


def _training_loop(root: ast.Node, lowered: dict[str, Lowerable]) -> ast.Loop | None:
    """The outermost loop (not under a guard) with the most statements, of those holding a
    lowered loop."""
    found = [node for node in _top(root) if isinstance(node, ast.Loop)
             and any(s.name in lowered for s in ast.statements(node.body))]
    return max(found, key=lambda loop: sum(1 for _ in ast.statements(loop.body)), default=None)


def _top(node: ast.Node) -> Iterator[ast.Node]:
    if isinstance(node, ast.Seq):
        for child in node.body:
            yield from _top(child)
    else:
        yield node


def _run_at(node: ast.Node, counter: Symbol, c: int) -> set[str]:
    """The statements of ``node`` that may run at iteration ``c`` (guards on the counter
    alone evaluated, the others taken to hold)."""
    if isinstance(node, ast.Stmt):
        return {node.name}
    if isinstance(node, ast.Seq):
        return {name for child in node.body for name in _run_at(child, counter, c)}
    if isinstance(node, ast.Loop):
        return _run_at(node.body, counter, c)
    branches = [node.then] if node.orelse is None else [node.then, node.orelse]
    if node.cond.symbols() == {counter}:
        branches = [node.then] if node.cond.evaluate({counter: c}) else branches[1:]
    return {name for branch in branches for name in _run_at(branch, counter, c)}


def _scoped(node: ast.Node, loops: tuple[ast.Loop, ...] = ()) -> Iterator[tuple[ast.Stmt | Expr, tuple]]:
    """The statements, guards and loop bounds of ``node``, each with the loops around it
    (inside ``node``)."""
    if isinstance(node, ast.Seq):
        for child in node.body:
            yield from _scoped(child, loops)
    elif isinstance(node, ast.If):
        yield node.cond, loops
        yield from _scoped(node.then, loops)
        if node.orelse is not None:
            yield from _scoped(node.orelse, loops)
    elif isinstance(node, ast.Loop):
        yield node.start, loops
        yield node.cond, loops
        yield from _scoped(node.body, (*loops, node))
    else:
        yield node, loops


class _Grid:
    """A condition mixing the loop's counter with inner counters (``c0 + c1 >= 1``): its
    values over the inner loops' whole range (constant ranges), as bytes, for a counter."""

    def __init__(self, atom: Expr, counter: Symbol, loops: list[ast.Loop]):
        ranges = [np.arange(int(inner.start.value), int(ast.range_stop(inner).value))  # type: ignore[union-attr]
                  for inner in loops]
        self.grid = np.meshgrid(*ranges, indexing="ij") if ranges else []
        self.values = compile_vectorized([atom], [counter, *(inner.var for inner in loops)])

    def __call__(self, c: int) -> bytes:
        return np.asarray(self.values(c, *self.grid)[0], bool).tobytes()


def _kind_of(cond: Expr, counter: Symbol, loops: tuple[ast.Loop, ...], keys: list[Expr],
             grids: list[_Grid]) -> str | None:
    """Add what ``cond`` (under ``loops``) makes of an iteration's kind: its comparisons on
    the counter alone to ``keys``, those mixing it with inner counters to ``grids``; why it
    cannot be, or None."""
    for atom in _atoms(cond):
        symbols = atom.symbols()
        if counter not in symbols:
            continue
        if symbols == {counter}:
            keys.append(atom)
            continue
        used = [inner for inner in loops if inner.var in symbols]
        if symbols - {counter} - {inner.var for inner in used} or any(
                not inner.start.is_const or ast.range_stop(inner) is None
                or not ast.range_stop(inner).is_const or inner.step != 1  # type: ignore[union-attr]
                for inner in used):
            return f"mixes the counter with others: {atom}"
        grids.append(_Grid(atom, counter, used))
    return None


def _moves(entry: Expr, counter: Symbol) -> tuple[set[int], list[Expr]] | str:
    """How a point's entry moves with the loop's counter: the constants ``k`` of the
    ``counter + k`` it holds (none: an entry that does not move; a select between such,
    ``(c0 - 1) if c1 == 0 else c0``: a loop given back its peeled iteration), and the
    conditions on the counter alone that choose between them; a string where it does not
    move so."""
    if entry.op == "select":
        cond, a, b = entry.args
        atoms = list(_atoms(cond))
        found = [_moves(x, counter) for x in (a, b)]
        for moved in found:
            if isinstance(moved, str):
                return moved
        ka, kb = (moved[0] for moved in found)  # type: ignore[union-attr]
        if bool(ka) != bool(kb):
            return "one branch moves with the counter, the other does not"
        return (ka | kb, [atom for atom in atoms if counter in atom.symbols()]
                + [key for moved in found for key in moved[1]])  # type: ignore[union-attr]
    if counter not in entry.symbols():
        return set(), []
    form = linear_form(entry)
    if form is None or form[0] != {counter: 1}:
        return "not the loop's counter moved by a constant"
    return {form[1]}, []


def _atoms(cond: Expr) -> Iterator[Expr]:
    """The comparisons a condition combines."""
    if cond.op in ("and", "or", "not"):
        for arg in cond.args:
            yield from _atoms(arg)
    elif not cond.is_const:
        yield cond


def _refusal(op: Op, dim: Symbol) -> str | None:
    """Why ``op`` keeps its iteration from being captured, or None."""
    if not op.definition.host and dim in param_symbols(op.params):  # (host ops run on the host)
        return f"{op.name}'s params depend on {dim.name}"
    if any(dim in d.symbols() for t in op.outputs for d in t.shape):
        return f"{op.name}'s shape depends on {dim.name}"
    return None


def _read_offset(phi: tuple, domain: tuple[Symbol, ...], dim: Symbol) -> int | str | None:
    """How far along ``dim`` a read reaches (``i - 1``: -1), None where the source is
    outside ``dim``; a string where the read does not move with the iteration (a slice
    along ``dim``, or ``dim`` in another entry: ``x[i, t + i]``, ``x[i, 0:i]``)."""
    offset = None
    for k, entry in enumerate(phi):
        if k < len(domain) and domain[k] is dim:
            if isinstance(entry, Slice):
                return f"through a slice along {dim.name}"
            form = linear_form(entry)
            if form is None or form[0] != {dim: 1}:
                return f"at {entry}, not {dim.name} moved by a constant"
            offset = form[1]
        elif dim in entry.symbols():
            return f"at {entry} along another dim"
    return offset


def program_key(source: str, graph: SDG, backend: JaxBackend) -> str:
    """What identifies a program's captured iterations in the compile cache (its loop
    program, its ops with their types and params, constants and seeds included, JAX and the
    device): ``checked_before`` then says how they compared before, and that XLA's cache
    most likely holds their programs. It only decides whether to capture (``Executable``),
    never what runs: every program is checked at its first run."""
    digest = hashlib.sha256(f"{backend.jax.__version__}\n{backend.jax.default_backend()}\n{source}".encode())
    for op in graph.ops.values():
        digest.update(f"\n{op.id} {op.kind} {op.domain} {op.outputs} ".encode())
        _fingerprint(op.params, digest)
    return digest.hexdigest()


def _fingerprint(value: Any, digest: Any) -> None:
    """Add ``value`` (an op's params: arrays, expressions, nested containers) to ``digest``."""
    if isinstance(value, dict):
        for name in sorted(value, key=str):
            digest.update(f"{name}=".encode())
            _fingerprint(value[name], digest)
    elif isinstance(value, (list, tuple)):
        digest.update(b"(")
        for item in value:
            _fingerprint(item, digest)
        digest.update(b")")
    elif isinstance(value, np.ndarray):
        digest.update(f"{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    elif callable(value):  # (a UDF's function: by name, its address changes from run to run)
        function = getattr(value, "__func__", value)
        name = f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', '')}"
        digest.update(f"{name};".encode())
    else:
        text = repr(value)
        digest.update(f"{type(value).__name__}:{text if ' at 0x' not in text else ''};".encode())


def checked_before(key: str) -> str | None:
    """How the captured iterations of the program ``key`` names compared with the
    interpreted ones where they were checked on this machine before (``EXACT``, ``CLOSE``,
    ``DIFFERENT``; their program was compiled then, and XLA's cache likely holds it), or
    None."""
    found = cache.load(MARKER, key)
    return found if found in OUTCOMES else None


def not_worth_capturing(plan: IterationPlan, key: str, mode: bool | None, on_cpu: bool) -> str | None:
    """Why ``LoopPolicy.capture`` ``mode`` leaves the loop of ``plan`` (the program ``key``
    names) uncaptured, or None. By default: a program that differed from the interpreted
    iteration (even in its last bits only) where it was checked on this machine before
    (the note keeps a program's worst outcome; clearing the cache clears it), and on a CPU
    a loop of fewer than ``CPU_FRESH_ITERATIONS`` iterations whose program was never
    checked here (compiling it would share the run's cores) or of fewer than
    ``CPU_CHECKED_ITERATIONS`` whose program was. ``True`` tries every program."""
    before = checked_before(key)
    if mode is None and before in (CLOSE, DIFFERENT):
        how = " in their last bits (LoopPolicy(capture=True) runs them)" if before == CLOSE else ""
        return (f"its programs' values differed from the interpreted iterations'{how} where they were "
                f"checked on this machine before")
    iterations = plan.stop - int(plan.loop.start.value)
    needed = CPU_FRESH_ITERATIONS if before is None else CPU_CHECKED_ITERATIONS
    if mode is None and on_cpu and iterations < needed:
        why = "a first compile" if before is None else "tracing and loading its program"
        return (f"{iterations} iterations, fewer than the {needed} a CPU needs to pay for {why} "
                f"(LoopPolicy(capture=True) captures them)")
    return None


def replace_loop(root: ast.Node, loop: ast.Loop) -> ast.Node:
    """``root`` with ``loop``'s body replaced by the statement that runs an iteration."""
    if root is loop:
        return ast.Loop(loop.var, loop.start, loop.cond, loop.step, ast.Stmt(STATEMENT, (loop.var,)))
    if isinstance(root, ast.Seq):
        return ast.Seq(tuple(replace_loop(child, loop) for child in root.body))
    return root


def iteration_source(loop: ast.Loop) -> str:
    """Python source of ``iteration(ns, counter)``: one iteration of ``loop``'s body."""
    def call(stmt: ast.Stmt) -> str:
        return f"{stmt.name}(({''.join(e.to_python() + ', ' for e in stmt.index)}))"
    names = sorted({s.name for s in ast.statements(loop.body)})
    return "\n".join([
        f"def iteration(ns, {loop.var.name}):",
        f"    {', '.join(names)}, = {', '.join(f'ns[{n!r}]' for n in names)},",
        "    if True:",
        *ast.to_python(loop.body, call, indent=2),
    ])


# ---- running ------------------------------------------------------------------------------
@dataclass
class IterationReport:
    """What capturing did in the runs so far: iterations run as one program, those run
    statement by statement, the programs compiled and why kinds were not captured."""

    captured: int = 0
    interpreted: int = 0
    programs: int = 0
    compile_seconds: float = 0.0
    refused: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        why = "".join(f"; not captured: {r}" for r in dict.fromkeys(self.refused))
        return (f"iterations: {self.captured} as one program each, {self.interpreted} statement by statement "
                f"({self.programs} programs, ready {self.compile_seconds:.2f} s after they were traced){why}")


@dataclass
class _Kind:
    """One kind of iteration: what its interpreted iteration recorded and its program."""

    calls: list | None = None
    """The point ops it ran, in order: ``(statement, coordinates relative to it, count)``."""
    recorded: int = -1
    """The run (``IterationRunner.runs``) whose iteration recorded them."""
    compiling: Future | None = None
    since: float = 0.0
    """When its program began compiling."""
    program: Callable | None = None
    inputs: Hashable = None
    """The structure of the stores' window the program takes."""
    outputs: Hashable = None
    """That of the window it leaves."""
    late: list = field(default_factory=list)
    """Its late statements, in order: ``(kind, statement, point relative to it, inputs
    given)`` (``given``: which of the host op's inputs the program returns)."""
    counts: tuple = ()
    """How its memory counts move: live points now and at the peak, bytes now and at the peak."""
    moved: list = field(default_factory=list)
    """The stores whose window the program changes: ``(output position, store, structure
    before, structure after)``."""
    verified: bool = False
    refused: str | None = None


@dataclass
class _Last:
    """An iteration run as its kind's program: its counter and outputs."""

    kind: _Kind
    c: int
    out: list
    links: list | None
    """Per input of the kind's program, where the next iteration takes it from
    (``_links``), found when this one followed another of its kind; None: from the stores."""


def _links(leaves: list, out: list, plan: IterationPlan) -> list | None:
    """Where each of an iteration's inputs ``leaves`` comes from: which output of the
    iteration before (``out``) it is, or, in a store outside the loop's dim that the
    iteration only reads (the same points at every iteration), that value itself; None
    where an input is neither (then every iteration reads its stores)."""
    made = {id(value): (s, j) for s, held in enumerate(out) for j, value in enumerate(held)}
    written = set(plan.written)
    links = []
    for key, held in zip(plan.at, leaves):
        row = []
        for value in held:
            source = made.get(id(value))
            if source is None:
                if key in written or plan.at[key] is not None:
                    return None
                source = (-1, value)
            row.append(source)
        links.append(row)
    return links


@dataclass
class IterationRun:
    """What one run gives the captured iterations."""

    stores: dict
    namespace: dict[str, Callable]
    """Its statements (late ones queued on its late queue)."""
    batched: dict[str, Callable]
    """Its batched point ops (``executable._batched_point_ops``)."""
    values: dict[str, tuple[Callable, Callable]]
    """Per point-op statement of the loop, its value at a point and its values at
    coordinate arrays (``OpDef.batched``), as the run's host ops see them."""
    stats: MemoryStats
    make_stores: Callable[[MemoryStats], dict]
    """Empty stores like the run's, counting into the given stats."""
    statement_table: Callable[[dict], dict[str, Callable]]
    """The run's statements over other stores (late ones on a queue never run)."""


class IterationRunner:
    """Statement ``I0``: one iteration of the captured loop, as one program where its kind
    has one (see the module), else statement by statement. Made once per executable (its
    programs serve every run); ``bind`` gives it a run."""

    def __init__(self, plan: IterationPlan, iteration: Callable, backend: JaxBackend,
                 launchers: dict[str, LoopLauncher], exact: bool, marker: str | None = None):
        self.plan, self.iteration, self.backend, self.launchers = plan, iteration, backend, launchers
        self.exact = exact
        """A kind's program is run only where its first run matched the interpreted
        iteration bit for bit (``LoopPolicy.capture`` None): the run's results then do not
        depend on which iterations ran as programs. Else up to rounding (``_close``)."""
        self.marker = marker
        """The compile-cache key under which a checked program's outcome is noted (``checked_before``)."""
        self.kinds: dict[tuple, _Kind] = {}
        self.report = IterationReport()
        self.run: IterationRun | None = None
        self.namespace: dict[str, Callable] = {}
        self.last: _Last | None = None
        """The iteration before, where it ran as a program."""
        self.runs = 0
        """The runs bound so far."""

    def bind(self, namespace: dict[str, Callable], run: IterationRun | None) -> None:
        """Run with a run's statements; ``run`` None: statement by statement only (a
        profiled run, which times each statement)."""
        self.namespace, self.run, self.last = namespace, run, None
        self.runs += run is not None

    def __call__(self, point: tuple[int, ...]) -> None:
        c = point[0]
        if self.run is None:
            self._interpret(c)
            return
        kind = self.kinds.setdefault(self.plan.key(c), _Kind())
        if kind.compiling is not None and kind.compiling.done():
            self._compiled(kind)
        if kind.program is not None and kind.verified and kind.refused is None:
            if not self._replay(kind, c):
                self._interpret(c)
            return
        if kind.refused is not None:
            self._interpret(c)
        elif kind.program is not None:
            self._verify(kind, c)
        elif kind.compiling is None and kind.recorded == self.runs:  # (its second iteration in the run)
            self._capture(kind, c)
            self._interpret(c)
        elif kind.compiling is None:  # (a kind's first iteration in a run: one kind runs once a run)
            kind.calls, kind.recorded = self._recorded(c), self.runs
            if c + 1 < self.plan.stop and self.plan.key(c + 1) == self.plan.key(c):
                self._capture(kind, c + 1)
        else:
            self._interpret(c)

    def _interpret(self, c: int) -> None:
        self.last = None
        self.report.interpreted += 1
        self.iteration(self.namespace, c)

    def _refuse(self, kind: _Kind, why: str) -> None:
        kind.refused = why
        self.report.refused.append(why)

    # ---- recording and tracing ---------------------------------------------------------
    def _recorded(self, c: int) -> list:
        """Run iteration ``c`` statement by statement, recording its point ops."""
        calls: list = []
        run, plan = self.run, self.plan
        assert run is not None
        saved = {name: run.namespace[name] for name in plan.points}
        batched = {name: run.batched[name] for name in plan.points if name in run.batched}

        def point(name: str, launch: Callable) -> Callable:
            def recorded(at: tuple[int, ...]) -> None:
                calls.append(("point", name, _moved(at, plan.points[name], -c), 1))
                launch(at)
            return recorded

        def rows(name: str, launch: Callable) -> Callable:
            def recorded(coords: tuple, points: list) -> None:
                calls.append(("rows", name, _moved_coords(coords, plan.points[name], -c), len(points)))
                launch(coords, points)
            return recorded
        with _swapped(run.namespace, {name: point(name, launch) for name, launch in saved.items()}), \
                _swapped(run.batched, {name: rows(name, launch) for name, launch in batched.items()}):
            self._interpret(c)
        return calls

    def _values(self, calls: list, c: int) -> list:
        """The values of the recorded point ops at iteration ``c``."""
        run = self.run
        assert run is not None
        out = []
        for kind, name, where, count in calls:
            at = self.plan.points[name]
            point, rows = run.values[name]
            if kind == "point":
                out.append(np.asarray(point(_moved(where, at, c))))
            else:
                out.append(np.asarray(rows(_moved_coords(where, at, c), count)))
        return out

    def _capture(self, kind: _Kind, c: int) -> None:
        """Trace iteration ``c`` (the next to run) into its kind's program and start
        compiling it, where the kind is at least ``FREQUENT`` of the iterations to come (a
        checkpoint's iteration, once every few hundred, would compile a program for a few
        iterations)."""
        ahead = range(c, min(self.plan.stop, c + FREQUENT_WITHIN))
        key = self.plan.key(c)
        if sum(self.plan.key(k) == key for k in ahead) < FREQUENT * len(ahead):
            self._refuse(kind, f"its iterations are fewer than 1 in {round(1 / FREQUENT)} of the next "
                               f"{len(ahead)}")
            return
        jax = self.backend.jax
        try:
            inputs, leaves = self._window(self.plan.at, c)
            values = self._values(kind.calls or [], c)
            traced: dict[str, Any] = {}

            def program(leaves: list, values: list) -> tuple[list, list]:
                return self._traced(kind, inputs, leaves, values, c, traced)
            specs = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype),
                                           (leaves, values))
            lowered = jax.jit(program).lower(*specs)
        except Uncapturable as why:
            self._refuse(kind, str(why))
            return
        except Exception as err:  # anything the body does that a trace cannot (reported)
            self._refuse(kind, f"tracing it failed: {type(err).__name__}: {err}")
            return
        finally:
            self._rebind_loops()
        kind.inputs, kind.outputs = inputs, traced["outputs"]
        before = dict(zip(self.plan.at, inputs))
        kind.moved = [(n, key, before[key][0], after[0])
                      for n, (key, after) in enumerate(zip(self.plan.written, kind.outputs))
                      if not (_empty(before[key][0]) and _empty(after[0]))]
        kind.late, kind.counts = traced["late"], traced["counts"]
        self.report.programs += 1
        kind.since = time.perf_counter()
        kind.compiling = self.backend.compile_lowered_in_background(lowered)
        if WAIT_FOR_PROGRAMS:
            kind.compiling.exception()

    def _traced(self, kind: _Kind, inputs: Hashable, leaves: list, values: list, c: int,
                traced: dict[str, Any]) -> tuple[list, list]:
        """The iteration's body run on stores holding ``leaves`` (traced values)."""
        plan, backend, run = self.plan, self.backend, self.run
        assert run is not None
        stats = MemoryStats()
        stores = run.make_stores(stats)
        hosts = _on_device(stores, backend)
        for key, (structure, _), held in zip(plan.at, inputs, leaves):  # type: ignore[call-overload]
            _checked(key, stores[key])
            stores[key].set_state(structure, held, _placer(plan.at[key], c))
        feed = _Feed(kind.calls or [], values, c, plan.points)
        namespace = run.statement_table(stores)
        batched: dict[str, Callable] = {}
        late: list = []
        early: list = []
        for name in plan.points:
            target = stores[plan.point_stores[name]]
            namespace[name] = feed.point(name, target)
            batched[name] = feed.rows(name, target)
        for name, at in plan.late.items():
            namespace[name] = _late_recorder(name, namespace[name], at, c, late, early)
        for name in plan.hosts:
            namespace[name] = _host_refusal(name)
        for name in plan.loops:
            launcher = self.launchers[name]
            launcher.bind(stores, namespace, batched)
            namespace[name] = launcher
        backend.capturing = True
        try:
            self.iteration(namespace, c)
        finally:
            backend.capturing = False
        feed.done()
        outputs, out = self._window(plan.written, c, stores, hosts)
        traced.update(outputs=outputs, late=late, counts=_counts(stats))
        return out, early

    def _rebind_loops(self) -> None:
        """The lowered loops back on the run's stores and statements."""
        run = self.run
        assert run is not None
        for name in self.plan.loops:
            launcher = self.launchers[name]
            launcher.bind(run.stores, run.namespace, run.batched)

    def _compiled(self, kind: _Kind) -> None:
        """Take the kind's program, once compiled (a compile that failed refuses it)."""
        future, kind.compiling = kind.compiling, None
        assert future is not None
        self.report.compile_seconds += time.perf_counter() - kind.since
        try:
            kind.program = future.result()
        except Exception as err:
            self._refuse(kind, f"its program did not compile: {type(err).__name__}: {err}")
            return
        return_freed_memory()  # (what XLA's compiler freed; glibc keeps it otherwise)

    # ---- running a kind's program ------------------------------------------------------
    def _window(self, keys: Any, c: int, stores: dict | None = None,
                hosts: frozenset[Key] = frozenset()) -> tuple[tuple, list]:
        """The structure and values of ``keys``' stores (the run's, or a traced iteration's
        ``stores``, of which ``hosts`` had host buffers) within the iterations the plan
        touches around ``c``. A store with host buffers must hold none there."""
        if stores is None:
            assert self.run is not None
            stores = self.run.stores
        structures, values = [], []
        for key in keys:
            store = stores[key]
            _checked(key, store)
            structure, held = store.state(_relative(self.plan.at[key], c, self.plan.low, self.plan.high))
            if held and (key in hosts or isinstance(store, BlockStore) and not store.buffers.on_device):
                raise Uncapturable(f"output {key[1]} of op {key[0]}, in host buffers, holds values "
                                   f"from one iteration to the next")
            structures.append((structure, tuple((np.shape(v), str(getattr(v, "dtype", type(v).__name__)))
                                                for v in held)))
            values.append(held)
        return tuple(structures), values

    def _run_program(self, kind: _Kind, c: int) -> tuple[list, list] | None:
        """The program's outputs at iteration ``c`` (None: the stores do not hold what it
        takes there)."""
        try:
            inputs, leaves = self._window(self.plan.at, c)
        except Uncapturable:  # (host buffers holding rows another kind of iteration left)
            return None
        if inputs != kind.inputs:
            return None
        assert kind.program is not None
        return kind.program(leaves, self._values(kind.calls or [], c))

    def _verify(self, kind: _Kind, c: int) -> None:
        """The kind's first program run, beside the interpreted iteration (which the run
        keeps): both must leave the same points in the stores and hand the late sinks the
        same values, bit for bit (``exact``) or up to rounding."""
        result = self._run_program(kind, c)
        if result is None:
            self._interpret(c)
            return
        out, early = result
        self.backend.synchronize((out, early))
        given = self._interpret_noting_late_inputs(c)
        try:
            outputs, now = self._window(self.plan.written, c)
        except Uncapturable as why:
            self._refuse(kind, str(why))
            return
        if outputs != kind.outputs:
            key = next(k for k, ours, theirs in zip(self.plan.written, outputs, kind.outputs)
                       if ours != theirs)
            self._checked(kind, DIFFERENT, f"its program left other points of output {key[1]} of op {key[0]} "
                                           f"(or shapes) than iteration {c} did")
            return
        outcome, key = _compared([*self.plan.written, LATE], [*out, early], [*now, given],
                                 self.backend.to_host)
        what = "the late sinks' inputs" if key == LATE else f"output {key[1]} of op {key[0]}" if key else ""
        how = " in their last bits (LoopPolicy(capture=True) allows it)" if outcome == CLOSE else ""
        self._checked(kind, outcome, f"its program's values of {what} differ from iteration {c}'s{how}")

    def _interpret_noting_late_inputs(self, c: int) -> list:
        """Run iteration ``c`` statement by statement; returns the inputs its late host ops
        were given, in order (as a program's ``early``)."""
        run = self.run
        assert run is not None
        given: list = []
        saved = {name: run.namespace[name] for name, _ in self.plan.late.items()
                 if hasattr(run.namespace[name], "early_of")}

        def noting(launch: Callable) -> Callable:
            def noted(point: tuple[int, ...]) -> None:
                given.extend(v for v in launch.early_of(point) if v is not None)
                launch(point)
            return noted
        with _swapped(run.namespace, {name: noting(launch) for name, launch in saved.items()}):
            self._interpret(c)
        return given

    def _checked(self, kind: _Kind, outcome: str, why: str) -> None:
        """Take the outcome of a kind's check: run it from now on, or refuse it; note the
        program's worst outcome in the compile cache."""
        if self.marker is not None:
            noted = checked_before(self.marker)
            if noted is None or OUTCOMES.index(outcome) > OUTCOMES.index(noted):
                cache.store(MARKER, self.marker, outcome)
        if outcome == EXACT or outcome == CLOSE and not self.exact:
            kind.verified = True
        else:
            self._refuse(kind, why)

    def _replay(self, kind: _Kind, c: int) -> bool:
        """Iteration ``c`` as the kind's program; False where the stores do not hold what it
        takes. Where the iteration before ran as the same kind's program, its outputs are
        this one's inputs (``_Last.links``), without reading the stores' window back."""
        run, plan, last = self.run, self.plan, self.last
        assert run is not None
        follows = last is not None and last.kind is kind and last.c + 1 == c
        if follows and last.links is not None:  # type: ignore[union-attr]
            links = last.links  # type: ignore[union-attr]
            leaves = [[last.out[s][j] if s >= 0 else j for s, j in row] for row in links]  # type: ignore[union-attr]
        else:
            try:
                inputs, leaves = self._window(plan.at, c)
            except Uncapturable:  # (host buffers holding rows another kind of iteration left)
                return False
            if inputs != kind.inputs:
                return False
            links = _links(leaves, last.out, plan) if follows else None  # type: ignore[union-attr]
        assert kind.program is not None
        out, early = kind.program(leaves, self._values(kind.calls or [], c))
        for n, key, before, after in kind.moved:
            place = _placer(plan.at[key], c)
            store = run.stores[key]
            store.forget_state(before, place)
            store.set_state(after, out[n], place)
        _count(run.stats, kind.counts)
        given = iter(early)
        for what, name, where, taken in kind.late:
            at = _moved(where, plan.late[name], c)
            if what == "host":
                run.namespace[name].given(at, [next(given) if input_taken else None for input_taken in taken])
            else:
                run.namespace[name](at)
        self.last = _Last(kind, c, out, links)
        self.report.captured += 1
        return True


class _Feed:
    """A traced iteration's point ops: each call takes the next of the program's point-op
    values, in the order the recorded iteration made them."""

    def __init__(self, calls: list, values: list, c: int, points: dict[str, int | None]):
        self.calls, self.values, self.c, self.points = calls, values, c, points
        self.n = 0

    def _next(self, kind: str, name: str, where: Any) -> Any:
        if self.n >= len(self.calls):
            raise Uncapturable("its point ops ran more often than in the iteration before")
        recorded, named, at, _ = self.calls[self.n]
        same = at == where if kind == "point" else len(at) == len(where) and all(
            np.array_equal(a, b) for a, b in zip(at, where))
        if (recorded, named) != (kind, name) or not same:
            raise Uncapturable("its point ops ran otherwise than in the iteration before")
        value = self.values[self.n]
        self.n += 1
        return value

    def point(self, name: str, store: Any) -> Callable:
        def fed(at: tuple[int, ...]) -> None:
            store.write(at, self._next("point", name, _moved(at, self.points[name], -self.c)))
        return fed

    def rows(self, name: str, store: Any) -> Callable:
        def fed(coords: tuple, points: list) -> None:
            where = _moved_coords(coords, self.points[name], -self.c)
            store.write_rows(points, self._next("rows", name, where), list(range(len(points))))
        return fed

    def done(self) -> None:
        if self.n != len(self.calls):
            raise Uncapturable("its point ops ran less often than in the iteration before")


def _late_recorder(name: str, launch: Callable, at: int | None, c: int, late: list, early: list) -> Callable:
    """A late statement of a traced iteration: recorded with the inputs it reads there
    (a host op's from outside the tail, which the program returns), not queued."""
    early_of = getattr(launch, "early_of", None)

    def recorded(point: tuple[int, ...]) -> None:
        where = _moved(point, at, -c)
        if early_of is None:
            late.append(("queued", name, where, ()))
            return
        values = early_of(point)
        late.append(("host", name, where, tuple(v is not None for v in values)))
        early.extend(v for v in values if v is not None)
    return recorded


@contextlib.contextmanager
def _swapped(table: dict[str, Callable], replacements: dict[str, Callable]) -> Iterator[None]:
    """``table`` with ``replacements`` for some of its entries, the originals back after."""
    saved = {name: table[name] for name in replacements}
    table.update(replacements)
    try:
        yield
    finally:
        table.update(saved)


def _host_refusal(name: str) -> Callable:
    def refuse(point: tuple[int, ...]) -> None:
        raise Uncapturable(f"it runs host op {name} (neither a point op nor a late sink)")
    return refuse


def _checked(key: Key, store: Any) -> None:
    """Stores an iteration can be captured over: point stores and block stores (those with
    host buffers only where the iteration begins and ends with none in its window: a
    traced iteration holds them on the device, ``_on_device``)."""
    if type(store) not in (PointStore, BlockStore, WindowStore):
        raise Uncapturable(f"it touches a {type(store).__name__} (output {key[1]} of op {key[0]})")


def _on_device(stores: dict, backend: JaxBackend) -> frozenset[Key]:
    """A traced iteration's block stores with their buffers on the device (a host buffer's
    rows are written in place, by NumPy); returns those that were not."""
    moved = set()
    for key, store in stores.items():
        if isinstance(store, BlockStore) and not isinstance(store.buffers, DeviceBuffers):
            store.buffers = DeviceBuffers(backend, store.buffers.axis)
            moved.add(key)
    return frozenset(moved)


def _relative(at: int | None, c: int, low: int, high: int) -> Callable[[tuple], tuple | None]:
    """Points (or buffers' prefixes) relative to iteration ``c``, those within
    ``low .. high`` of it along the dim at position ``at`` (None: every point)."""
    if at is None:
        return lambda point: point

    def relative(point: tuple[int, ...]) -> tuple[int, ...] | None:
        if len(point) <= at:
            raise Uncapturable("a block store's buffers run along the iteration's dim")
        k = point[at] - c
        return (*point[:at], k, *point[at + 1:]) if low <= k <= high else None
    return relative


def _placer(at: int | None, c: int) -> Callable[[tuple], tuple]:
    return lambda point: _moved(point, at, c)


def _moved(point: tuple[int, ...], at: int | None, by: int) -> tuple[int, ...]:
    return point if at is None else (*point[:at], point[at] + by, *point[at + 1:])


def _moved_coords(coords: tuple, at: int | None, by: int) -> tuple:
    """Coordinate arrays (``OpDef.batched``), those of the dim at ``at`` moved by ``by``."""
    return tuple(np.asarray(x) + by if k == at else np.asarray(x) for k, x in enumerate(coords))


def _counts(stats: MemoryStats) -> tuple:
    """A traced iteration's memory counts, from zero: live points, bytes (now, peak)."""
    return (stats.live, stats.peak, *((b.now, b.peak) for b in _byte_counters(stats)))


def _count(stats: MemoryStats, counts: tuple) -> None:
    """Move a run's memory counts as a captured iteration's moved (``_counts``)."""
    live, peak, *moved = counts
    stats.peak = max(stats.peak, stats.live + peak)
    stats.live += live
    for counter, (now, top) in zip(_byte_counters(stats), moved):
        counter.peak = max(counter.peak, counter.now + top)
        counter.now += now


def _byte_counters(stats: MemoryStats) -> tuple[Bytes, ...]:
    return stats.device, stats.host, stats.split, stats.over_dims


def _compared(keys: list[Key], theirs: list, ours: list,
              to_host: Callable[[Any], np.ndarray]) -> tuple[str, Key | None]:
    """How a program's outputs compare with the interpreted iteration's: ``EXACT``,
    ``CLOSE`` (up to rounding) or ``DIFFERENT``, and the first store where they are not equal."""
    outcome, first = EXACT, None
    for key, programs, interpreted in zip(keys, theirs, ours):
        if len(programs) != len(interpreted):
            return DIFFERENT, key
        for a, b in zip(programs, interpreted):
            a, b = to_host(a), to_host(b)
            if _equal(a, b):
                continue
            first = first or key
            if not _close(a, b):
                return DIFFERENT, key
            outcome = CLOSE
    return outcome, first


def _empty(structure: Hashable) -> bool:
    """Whether a store's ``state`` structure holds nothing."""
    return all(not part for part in structure)  # type: ignore[attr-defined]


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """The same values, bit for bit."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values, floating-point ones up to rounding (XLA fuses a whole iteration)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if np.issubdtype(a.dtype, np.floating):
        return bool(np.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True))
    return bool(np.array_equal(a, b))
