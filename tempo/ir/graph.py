"""The symbolic dependence graph (SDG): ops with temporal domains, and dependence edges."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tempo.errors import SourceSite
from tempo.ir.ops import OpDef, op_def
from tempo.ir.types import TensorType
from tempo.symbolic.expr import TRUE, Expr, IndexEntry, Slice, Symbol, linear_form


@dataclass(eq=False)
class Op:
    """An operator executing once at every point of its ``domain``."""

    id: int
    kind: str
    params: dict[str, Any]
    domain: tuple[Symbol, ...]
    outputs: tuple[TensorType, ...]
    site: SourceSite
    label: str = ""
    when: Expr = TRUE
    """The op runs only at the points of its domain where this holds (conditional sinks)."""
    requires: tuple[tuple[Expr, str], ...] = ()
    """Conditions over the domain that must hold at every executed point, each with the
    message for when it does not (e.g. a symbolic spatial index within its dim's size)."""

    @property
    def definition(self) -> OpDef:
        return op_def(self.kind)

    @property
    def name(self) -> str:
        return f"{self.label or self.kind}#{self.id}"

    def __repr__(self) -> str:
        dom = ", ".join(d.name for d in self.domain)
        outs = ", ".join(map(repr, self.outputs))
        return f"{self.name}[{dom}] -> {outs}"


@dataclass(frozen=True, eq=False)
class Edge:
    """``sink`` at point ``p`` reads output ``src_out`` of ``src`` at ``phi(p)`` when ``cond(p)``.

    ``phi`` has one entry (a point expression or a slice) per dim of ``src.domain``,
    written over the sink's dim symbols.
    """

    sink: Op
    sink_in: int
    src: Op
    src_out: int
    phi: tuple[IndexEntry, ...]
    cond: Expr = TRUE
    rows_at: int = 0
    """Where a read of one slice puts the slice's rows in the value it delivers: first,
    unless ``tempo.passes.layout`` moved them to where the reader wants them (the store
    then keeps its rows along that axis, and the reader's permute is gone)."""

    @property
    def slices_innermost(self) -> bool:
        """Whether the read takes a slice of the source's innermost dim (its points are then
        kept as rows of a block: ``tempo.runtime.executable._store_for``)."""
        return bool(self.phi) and isinstance(self.phi[-1], Slice)

    @property
    def tiled(self) -> bool:
        """Whether the read's innermost entry is a slice padded to whole tiles
        (``tempo.passes.tile``)."""
        last = self.phi[-1] if self.phi else None
        return isinstance(last, Slice) and last.pad is not None

    @property
    def stop_offset(self) -> int | None:
        """``c`` where the sink at ``(p..., t)`` reads the source's ``[p..., s:t+c]``: the
        same dims, one slice of the innermost ending a constant ``c`` after the point,
        unconditionally; else None."""
        domain = self.sink.domain
        if self.cond is not TRUE or self.src.domain != domain or not domain \
                or self.slices != (len(domain) - 1,) \
                or any(entry is not dim for entry, dim in zip(self.phi[:-1], domain)):
            return None
        form = linear_form(self.phi[-1].stop - domain[-1])
        return form[1] if form is not None and not form[0] else None

    @property
    def slices(self) -> tuple[int, ...]:
        """Positions in ``phi`` that are slices (each adds a leading spatial dim)."""
        return tuple(k for k, e in enumerate(self.phi) if isinstance(e, Slice))

    def __repr__(self) -> str:
        phi = ", ".join(map(str, self.phi))
        cond = "" if self.cond is TRUE else f" if {self.cond}"
        at = f" (rows at axis {self.rows_at})" if self.rows_at else ""
        return f"{self.sink.name}.in{self.sink_in} <- {self.src.name}.out{self.src_out}[{phi}]{at}{cond}"


def rows_moved(shape: tuple, axis: int) -> tuple:
    """``shape`` (a slice read's rows first) with the rows moved to ``axis``
    (``Edge.rows_at``)."""
    return (*shape[1:axis + 1], shape[0], *shape[axis + 1:]) if axis else tuple(shape)


@dataclass
class SDG:
    """Ops and their input edges. Ops are kept in creation order."""

    ops: dict[int, Op] = field(default_factory=dict)
    inputs: dict[int, list[Edge]] = field(default_factory=dict)

    def add_op(self, op: Op) -> Op:
        self.ops[op.id] = op
        self.inputs[op.id] = []
        return op

    def add_edge(self, edge: Edge) -> None:
        edges = self.inputs[edge.sink.id]
        if edge.sink_in != len(edges):
            raise ValueError(f"edges of {edge.sink.name} must be added in input order")
        edges.append(edge)

    def in_edges(self, op: Op) -> list[Edge]:
        return self.inputs[op.id]

    def edges(self) -> Iterator[Edge]:
        for edges in self.inputs.values():
            yield from edges

    def out_edges(self, op: Op) -> list[Edge]:
        return [e for e in self.edges() if e.src is op]

    def consumers(self) -> dict[int, list[Edge]]:
        """Out-edges of every op, computed once."""
        out: dict[int, list[Edge]] = {k: [] for k in self.ops}
        for e in self.edges():
            out[e.src.id].append(e)
        return out

    def reachable_from(self, roots: list[Op]) -> SDG:
        """The subgraph of ``roots`` and every op they read, transitively (same op objects)."""
        seen: set[int] = set()
        stack = [op.id for op in roots]
        while stack:
            k = stack.pop()
            if k not in seen:
                seen.add(k)
                stack.extend(e.src.id for e in self.inputs[k])
        sub = SDG()
        for k in sorted(seen):
            sub.ops[k] = self.ops[k]
            sub.inputs[k] = list(self.inputs[k])
        return sub

    def components_consumers_first(self) -> list[list[Op]]:
        """Strongly connected components (ops that read each other through recurrences),
        each listed after every component that reads it (Tarjan's algorithm, iterative)."""
        consumers = self.consumers()
        index: dict[int, int] = {}
        low: dict[int, int] = {}
        on_stack: set[int] = set()
        stack: list[int] = []
        out: list[list[Op]] = []
        for start in self.ops:
            if start in index:
                continue
            work = [(start, iter(consumers[start]))]
            index[start] = low[start] = len(index)
            stack.append(start)
            on_stack.add(start)
            while work:
                k, successors = work[-1]
                step = next(successors, None)
                if step is not None:
                    nxt = step.sink.id
                    if nxt not in index:
                        index[nxt] = low[nxt] = len(index)
                        stack.append(nxt)
                        on_stack.add(nxt)
                        work.append((nxt, iter(consumers[nxt])))
                    elif nxt in on_stack:
                        low[k] = min(low[k], index[nxt])
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[k])
                if low[k] == index[k]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(self.ops[member])
                        if member == k:
                            break
                    out.append(component)
        return out

    def __len__(self) -> int:
        return len(self.ops)

    def to_text(self) -> str:
        """The graph as text: one op per line with its input edges."""
        lines = []
        for op in self.ops.values():
            lines.append(f"{op!r}    @ {op.site.filename.rsplit('/', 1)[-1]}:{op.site.lineno}")
            lines.extend(f"    in{e.sink_in}: {e.src.name}.out{e.src_out}"
                         f"[{', '.join(map(str, e.phi))}]"
                         + ("" if e.cond is TRUE else f" if {e.cond}") for e in self.in_edges(op))
        return "\n".join(lines)

    def to_dot(self) -> str:
        """The graph in graphviz dot format."""
        lines = ["digraph sdg {", "  node [shape=box, fontname=monospace];"]
        for op in self.ops.values():
            dom = ",".join(d.name for d in op.domain)
            lines.append(f'  op{op.id} [label="{op.name}\\n[{dom}]"];')
        for e in self.edges():
            label = ", ".join(map(str, e.phi)) + ("" if e.cond is TRUE else f" | {e.cond}")
            lines.append(f'  op{e.src.id} -> op{e.sink.id} [label="{label}"];')
        lines.append("}")
        return "\n".join(lines)


def has_static_shapes(op: Op, edges: list[Edge], known: set[Symbol], tiled: bool = False) -> bool:
    """Whether the op's inputs and outputs have one shape at every point: every dim
    depends on ``known`` symbols (the bounds) only. ``tiled``: a dim that is a whole
    number of tiles (``tempo.passes.tile``) counts as static too: it takes a few values,
    each compiled once."""
    shapes = [d for t in op.outputs for d in t.shape]
    for e in edges:
        shapes += [d for d in e.src.outputs[e.src_out].shape]
        shapes += [entry.size for entry in e.phi if isinstance(entry, Slice)]
    return all(d.symbols() <= known or tiled and is_whole_tiles(d) for d in shapes)


def is_whole_tiles(dim: Expr) -> bool:
    """``dim`` is ``(x // Z) * Z`` for a constant ``Z``: a multiple of a tile."""
    if dim.op != "mul" or len(dim.args) != 2:
        return False
    a, b = dim.args
    tiles, size = (a, b) if b.is_const else (b, a)
    return size.is_const and tiles.op == "floordiv" and tiles.args[1] is size


def program_roots(graph: SDG, output_ops: list[Op]) -> list[Op]:
    """Ops whose every point runs: the outputs' ops and every UDF (sinks included)."""
    return [*output_ops, *(op for op in graph.ops.values() if op.kind == "udf")]
