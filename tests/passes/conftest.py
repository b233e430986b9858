"""Running one pipeline pass on a program's SDG, as ``compile`` prepares it, and checking
that the needed points it hands on are those of the graph it returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from tempo.analysis.needed import analyze_points
from tempo.ir.graph import SDG, program_roots
from tempo.ir.validate import resolve_bounds
from tempo.passes import PIPELINE, PassState
from tempo.reference import evaluate


@dataclass
class PassRun:
    before: SDG
    after: SDG
    state: PassState

    def kinds(self, which: str = "after") -> list[str]:
        return sorted(op.kind for op in getattr(self, which).ops.values())

    def count(self, kind: str, which: str = "after") -> int:
        return self.kinds(which).count(kind)


def run_one_pass(ctx, bounds: dict, outputs: list, name: str) -> PassRun:
    """The SDG before and after the pass ``name`` alone. Its needed points must be exactly
    what the point analysis finds on the new graph: every op's, and nothing else."""
    roots = program_roots(ctx.graph, [rt.op for rt in outputs])
    graph = ctx.graph.reachable_from(roots)
    values = resolve_bounds(graph, ctx.bound_of, bounds)
    needed = analyze_points(graph, values, ctx.bound_of, roots)
    state = PassState(needed, values, ctx.bound_of, {rt.op.id for rt in outputs},
                      next_id=max(ctx.graph.ops) + 1)
    after = dict(PIPELINE)[name](graph, state)
    assert all(op.id in after.ops for op in roots)
    for op in after.ops.values():
        for edge in after.in_edges(op):
            assert edge.src.id in after.ops, f"{op.name} reads {edge.src.name}, which is gone"
    assert state.needed.is_equal(analyze_points(after, values, ctx.bound_of, roots))
    return PassRun(graph, after, state)


@pytest.fixture
def run_pass():
    return run_one_pass


def compile_against_reference(ctx, bounds: dict, outputs: list, passes, backend: str = "numpy"):
    """Compile with ``passes`` and with none: both runs equal the reference evaluator.
    Returns the optimized executable."""
    exe = ctx.compile(bounds, outputs, backend=backend, passes=passes)
    plain = ctx.compile(bounds, outputs, backend=backend, passes=())
    ref = evaluate(ctx, bounds, outputs)
    for run in (exe.run(), plain.run()):
        for rt in outputs:
            np.testing.assert_allclose(run[rt], ref[rt.key], rtol=1e-5, atol=1e-6)
    return exe


@pytest.fixture
def check():
    return compile_against_reference


@pytest.fixture
def first_schedule_fails(monkeypatch) -> list[SDG]:
    """The compiler's first call to ``build_schedule`` finds no schedule (simulated), the
    others schedule as they would; the graphs each call was given, in order."""
    import tempo.compiler as compiler
    from tempo.errors import UnschedulableError
    real, calls = compiler.build_schedule, []

    def failing_first(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 1:
            raise UnschedulableError("no schedule (simulated)")
        return real(*args, **kwargs)
    monkeypatch.setattr(compiler, "build_schedule", failing_first)
    return calls
