"""The SDG as polyhedra: statement domains and read relations as isl objects.

Each op becomes an isl statement ``S<id>`` whose instances are the op's points; each edge
becomes a read relation ``{ S<sink>[p] -> S<src>[q] : q in phi(p), cond(p) }``. The mapping
from statement names to ops is kept in a dict, never parsed back from names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from tempo.errors import (
    OutOfRangeError,
    UndefinedPointError,
    UnschedulableError,
    UnsupportedExpressionError,
)
from tempo.ir.graph import SDG, Edge, Op
from tempo.symbolic.expr import TRUE, Expr, Slice, Symbol, logical_and, logical_not
from tempo.symbolic.isl_bridge import to_isl


@dataclass
class Polyhedral:
    """Isl views of an SDG for concrete bounds."""

    graph: SDG
    bounds: dict[Symbol, int]
    bound_of: dict[Symbol, Symbol]
    statements: dict[str, Op] = field(default_factory=dict)

    def name(self, op: Op) -> str:
        name = f"S{op.id}"
        self.statements[name] = op
        return name

    def _vars(self, op: Op, prefix: str) -> dict[Symbol, str]:
        return {d: f"{prefix}{k}" for k, d in enumerate(op.domain)}

    def _names(self, op: Op, prefix: str) -> dict[Symbol, str]:
        consts = {b: str(v) for b, v in self.bounds.items()}
        return {**consts, **self._vars(op, prefix)}

    def _box_text(self, op: Op, prefix: str) -> list[str]:
        return [f"0 <= {v} < {self.bounds[self.bound_of[d]]}"
                for d, v in self._vars(op, prefix).items()]

    def box(self, op: Op) -> isl.UnionSet:
        """Every point of ``op``'s domain."""
        vars_ = ", ".join(self._vars(op, "a").values())
        return isl.UnionSet(f"{{ {self.name(op)}[{vars_}] : "
                            f"{' and '.join(self._box_text(op, 'a')) or 'true'} }}")

    def reads(self, edge: Edge, cond: Expr = TRUE) -> isl.UnionMap:
        """``{ sink[p] -> src[q] }``: the source points the sink reads at each of its points.

        Read points outside the source's range are kept (``check_reads`` reports them).
        """
        try:
            return self._reads(edge, cond)
        except UnsupportedExpressionError as err:
            raise UnsupportedExpressionError(
                f"{edge.sink.name} reads {edge.src.name} at [{', '.join(map(str, edge.phi))}]: "
                f"{err.args[0]}", edge.sink.site) from None

    def _reads(self, edge: Edge, cond: Expr) -> isl.UnionMap:
        sink_names = self._names(edge.sink, "a")
        src_vars = self._vars(edge.src, "b")
        constraints = self._box_text(edge.sink, "a")
        full_cond = logical_and(edge.cond, cond)
        if full_cond is not TRUE:
            constraints.append(to_isl(full_cond, sink_names))
        for dim, entry in zip(edge.src.domain, edge.phi):
            b = src_vars[dim]
            if isinstance(entry, Slice):
                constraints.append(f"{to_isl(entry.start, sink_names)} <= {b} < "
                                   f"{to_isl(entry.stop, sink_names)}")
            else:
                constraints.append(f"{b} = {to_isl(entry, sink_names)}")
        sink_vars = ", ".join(self._vars(edge.sink, "a").values())
        return isl.UnionMap(f"{{ {self.name(edge.sink)}[{sink_vars}] -> "
                            f"{self.name(edge.src)}[{', '.join(src_vars.values())}] : "
                            f"{' and '.join(constraints) or 'true'} }}")

    def condition_set(self, op: Op, cond: Expr) -> isl.UnionSet:
        vars_ = ", ".join(self._vars(op, "a").values())
        return isl.UnionSet(f"{{ {self.name(op)}[{vars_}] : "
                            f"{to_isl(cond, self._names(op, 'a'))} }}")

    def all_reads(self) -> dict[Edge, isl.UnionMap]:
        """Read relations of every edge; a merge branch is taken only where no earlier one is."""
        out: dict[Edge, isl.UnionMap] = {}
        for op in self.graph.ops.values():
            earlier: Expr = TRUE
            for edge in self.graph.in_edges(op):
                out[edge] = self.reads(edge, earlier if op.kind == "merge" else TRUE)
                if op.kind == "merge":
                    earlier = logical_and(earlier, logical_not(edge.cond))
        return out


def needed_points(poly: Polyhedral, roots: list[Op], reads: dict[Edge, isl.UnionMap],
                  max_rounds: int = 64) -> isl.UnionSet:
    """Points of every op that the roots depend on, transitively (roots included)."""
    needed = _union_sets(poly.box(op) for op in roots)
    relation = _union_maps(reads.values())
    for _ in range(max_rounds):
        grown = needed.union(needed.apply(relation)).coalesce()
        if grown.is_equal(needed):
            return needed
        needed = grown
    closure, _exact = relation.transitive_closure()
    return needed.union(needed.apply(closure)).coalesce()


def check_reads(poly: Polyhedral, needed: isl.UnionSet, reads: dict[Edge, isl.UnionMap]) -> None:
    """Every read from a needed point stays inside the source's range."""
    for edge, rel in reads.items():
        live = rel.intersect_domain(needed)
        outside = live.subtract_range(poly.box(edge.src))
        if not outside.is_empty():
            sink_pt = outside.domain().sample_point()
            src_pt = outside.intersect_domain(isl.UnionSet(isl.Set.from_point(sink_pt))) \
                .range().sample_point()
            sink_point, src_point = _coords(sink_pt), _coords(src_pt)
            raise OutOfRangeError(
                f"{edge.sink.name} at {_fmt(edge.sink, sink_point)} reads {edge.src.name} at "
                f"{_fmt(edge.src, src_point)}, outside its domain "
                f"({_ranges(poly, edge.src)}); add a branch for those points or narrow the index",
                edge.sink.site)


def check_branches(poly: Polyhedral, needed: isl.UnionSet) -> None:
    """Every needed point of a placeholder has a branch whose condition holds."""
    for op in poly.graph.ops.values():
        if op.kind != "merge":
            continue
        covered = _union_sets(poly.condition_set(op, e.cond) for e in poly.graph.in_edges(op))
        missing = needed.intersect(poly.box(op)).subtract(covered)
        if not missing.is_empty():
            raise UndefinedPointError(
                f"{op.name} is needed at {_fmt(op, _sample(missing))} but no branch defines "
                f"it there; add a branch (e.g. a base case)", op.site)


def check_acyclic_points(poly: Polyhedral, needed: isl.UnionSet,
                         reads: dict[Edge, isl.UnionMap]) -> None:
    """No point depends on itself (a cycle with zero temporal distance)."""
    relation = _union_maps(reads.values()).intersect_domain(needed)
    closure, _exact = relation.transitive_closure()
    for op in poly.graph.ops.values():
        vars_ = ", ".join(poly._vars(op, "a").values())
        name = poly.name(op)
        identity = isl.UnionMap(f"{{ {name}[{vars_}] -> {name}[{vars_}] }}")
        loops = closure.intersect(identity)
        if not loops.is_empty():
            raise UnschedulableError(
                f"{op.name} at {_fmt(op, _sample(loops.domain()))} depends on itself: a cycle "
                f"with no temporal distance cannot be ordered (e.g. a = b + 1; b = a + 1); "
                f"read an earlier point such as x[t-1] somewhere in the cycle", op.site)


def _union_sets(sets) -> isl.UnionSet:
    out = isl.UnionSet("{ }")
    for s in sets:
        out = out.union(s)
    return out


def _union_maps(maps) -> isl.UnionMap:
    out = isl.UnionMap("{ }")
    for m in maps:
        out = out.union(m)
    return out


def _sample(s: isl.UnionSet) -> list[int]:
    return _coords(s.sample_point())


def _coords(point: isl.Point) -> list[int]:
    n = point.get_space().dim(isl.dim_type.set)
    return [point.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(n)]


def _fmt(op: Op, values: list[int]) -> str:
    return "(" + ", ".join(f"{d.name}={v}" for d, v in zip(op.domain, values)) + ")"


def _ranges(poly: Polyhedral, op: Op) -> str:
    return ", ".join(f"0 <= {d.name} < {poly.bounds[poly.bound_of[d]]}" for d in op.domain) \
        or "a single point"
