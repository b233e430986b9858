"""The reference evaluator: the meaning of an RT program, computed straight from it.

Memoised evaluation of (op, point) pairs on demand, with NumPy kernels, no passes and no
schedule. It is slow and simple on purpose: every compiled result is tested against it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tempo.api.context import Context
from tempo.api.tensor import RecurrentTensor
from tempo.errors import OutOfRangeError, TempoError, UndefinedPointError, UnschedulableError
from tempo.ir.graph import Edge, Op, program_roots
from tempo.ir.ops import resolve_params
from tempo.ir.readers import compile_reader_sum, reader_points
from tempo.ir.validate import check_placeholders, resolve_bounds
from tempo.symbolic.expr import TRUE, Slice, Symbol

Point = tuple[int, ...]
Key = tuple[int, Point]


class ReferenceEvaluator:
    """Evaluates the program of ``ctx`` for concrete ``bounds``."""

    def __init__(self, ctx: Context, bounds: dict, outputs: Sequence[RecurrentTensor] = ()):
        self.ctx = ctx
        self.outputs = list(outputs)
        self.graph = ctx.graph.reachable_from(program_roots(ctx.graph, [rt.op for rt in outputs]))
        self.bounds = resolve_bounds(self.graph, ctx.bound_of, bounds)
        check_placeholders(self.graph)
        self.memo: dict[Key, tuple[np.ndarray, ...]] = {}
        self._reader_sums: dict[int, Any] = {}

    # ---- public -------------------------------------------------------------------------
    def run(self) -> dict[tuple[int, int], np.ndarray]:
        """Values of the outputs at every point (arrays of shape ``(*bounds, *spatial)``).

        UDF ops run at every point of their domain, as in a compiled program.
        """
        for op in self.graph.ops.values():
            if op.kind == "udf":
                for point in self.box(op):
                    self.value(op, point)
        results = {}
        for rt in self.outputs:
            points = list(self.box(rt.op))
            values = [self.value(rt.op, p)[rt.out] for p in points]
            dims = tuple(self.bounds[self.ctx.bound_of[d]] for d in rt.domain)
            results[rt.key] = np.stack(values).reshape(dims + values[0].shape)
        return results

    def box(self, op: Op) -> Iterator[Point]:
        points = itertools.product(*(range(self.bounds[self.ctx.bound_of[d]]) for d in op.domain))
        if op.when is TRUE:
            return points
        return (p for p in points if op.when.evaluate(self.env(op, p)))

    def value(self, op: Op, point: Point) -> tuple[np.ndarray, ...]:
        """The outputs of ``op`` at ``point``, computing what they depend on first."""
        stack: list[Key] = [(op.id, tuple(point))]
        active: set[Key] = set()
        while stack:
            key = stack[-1]
            if key in self.memo:
                stack.pop()
                continue
            reads = self._reads(*key)
            missing = [k for _, keys in reads for k in keys if k not in self.memo]
            if not missing:
                self.memo[key] = self._compute(key, reads)
                active.discard(key)
                stack.pop()
                continue
            if key in active:
                self._raise_cycle(key)
            active.add(key)
            for k in missing:
                if k in active:
                    self._raise_cycle(k)
                stack.append(k)
        return self.memo[(op.id, tuple(point))]

    # ---- internals ------------------------------------------------------------------------
    def env(self, op: Op, point: Point) -> dict[Symbol, int]:
        return {**self.bounds, **dict(zip(op.domain, point))}

    def _reads(self, op_id: int, point: Point) -> list[tuple[Edge, list[Key]]]:
        op = self.graph.ops[op_id]
        env = self.env(op, point)
        edges = self.graph.in_edges(op)
        if op.kind == "merge":
            taken = next((e for e in edges if e.cond.evaluate(env)), None)
            if taken is None:
                fix = op.params.get("undefined", "add a branch (e.g. a base case)")
                raise UndefinedPointError(
                    f"{op.name} is not defined at {_fmt_point(op, point)}: no branch condition "
                    f"holds there; {fix}", op.site)
            edges = [taken]
        if op.kind == "sum_readers":
            (edge,) = edges
            keys = reader_points(op.params["reads"], op.domain, env) if edge.cond.evaluate(env) else []
            return [(edge, [(edge.src.id, p) for p in keys])]
        return [(e, self._source_points(e, env, point)) for e in edges]

    def _source_points(self, edge: Edge, env: dict[Symbol, int], point: Point) -> list[Key]:
        axes = []
        for dim, entry in zip(edge.src.domain, edge.phi):
            size = self.bounds[self.ctx.bound_of[dim]]
            if isinstance(entry, Slice):
                lo, hi = entry.start.evaluate(env), entry.stop.evaluate(env)
                coords = range(lo, hi)
                bad = [c for c in (lo, hi - 1) if hi > lo and not 0 <= c < size]
            else:
                coords = [entry.evaluate(env)]
                bad = [c for c in coords if not 0 <= c < size]
            if bad:
                raise OutOfRangeError(
                    f"{edge.sink.name} at {_fmt_point(edge.sink, point)} reads {edge.src.name} at "
                    f"{dim.name}={bad[0]}, outside 0..{size - 1}", edge.sink.site)
            axes.append(coords)
        return [(edge.src.id, p) for p in itertools.product(*axes)]

    def _compute(self, key: Key, reads: list[tuple[Edge, list[Key]]]) -> tuple[np.ndarray, ...]:
        op = self.graph.ops[key[0]]
        env = self.env(op, key[1])
        for cond, what in op.requires:
            if not cond.evaluate(env):
                raise OutOfRangeError(f"{op.name} at {_fmt_point(op, key[1])}: {what}", op.site)
        if op.kind == "sum_readers":
            return (self._sum_readers(op, key[1], reads[0]),)
        inputs = [self._gather(e, keys, env) for e, keys in reads]
        if op.kind == "merge":
            return (inputs[0],)
        definition = op.definition
        if definition.host:
            out = definition.kernel(op.params, env, *inputs)
        else:
            out = definition.kernel(np, resolve_params(op.params, env), *inputs)
        outs = tuple(np.asarray(o) for o in (out if definition.multi_output else (out,)))
        self._check_types(op, outs, env)
        return outs

    def _sum_readers(self, op: Op, point: Point, read: tuple[Edge, list[Key]]) -> np.ndarray:
        edge, keys = read
        if not keys:
            shape = tuple(d.evaluate(self.env(op, point)) for d in op.outputs[0].shape)
            return np.zeros(shape, op.outputs[0].dtype)
        accumulate = self._reader_sums.get(op.id)
        if accumulate is None:
            accumulate = compile_reader_sum(op.params["reads"], op.domain, self.bounds)
            self._reader_sums[op.id] = accumulate
        return np.asarray(accumulate(point, lambda p: self.memo[(edge.src.id, p)][edge.src_out]))

    def _gather(self, edge: Edge, keys: list[Key], env: dict[Symbol, int]) -> np.ndarray:
        values = [self.memo[k][edge.src_out] for k in keys]
        if not edge.slices:
            return values[0]
        sizes = [e.stop.evaluate(env) - e.start.evaluate(env) for e in edge.phi
                 if isinstance(e, Slice)]
        if not values:
            shape = tuple(d.evaluate(self.bounds) for d in edge.src.outputs[edge.src_out].shape)
            return np.zeros((*sizes, *shape), edge.src.outputs[edge.src_out].dtype)
        return np.stack(values).reshape(*sizes, *values[0].shape)

    def _check_types(self, op: Op, outs: tuple[np.ndarray, ...], env: dict[Symbol, int]) -> None:
        for out, t in zip(outs, op.outputs):
            shape = tuple(d.evaluate(env) for d in t.shape)
            if out.shape != shape or out.dtype != np.dtype(t.dtype):
                raise TempoError(f"internal: {op.name} produced {out.dtype}{out.shape}, "
                                 f"its type says {t!r} = {t.dtype}{shape}", op.site)

    def _raise_cycle(self, key: Key) -> None:
        op = self.graph.ops[key[0]]
        raise UnschedulableError(
            f"{op.name} at {_fmt_point(op, key[1])} depends on itself: a cycle with no "
            f"temporal distance cannot be ordered", op.site)


def _fmt_point(op: Op, point: Any) -> str:
    return "(" + ", ".join(f"{d.name}={v}" for d, v in zip(op.domain, point)) + ")"


def evaluate(ctx: Context, bounds: dict, outputs: Sequence[RecurrentTensor]) -> dict:
    """Reference values of ``outputs``; keyed like ``Executable.run()`` results."""
    return ReferenceEvaluator(ctx, bounds, outputs).run()
