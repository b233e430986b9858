"""The context: temporal dims, their bounds, and the SDG that RT operations build."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tempo.errors import DomainError, ShapeError, TempoError, user_site
from tempo.ir.graph import SDG, Edge, Op
from tempo.ir.ops import op_def, param_symbols
from tempo.symbolic.expr import TRUE, Expr, IndexEntry, Symbol

if TYPE_CHECKING:
    from tempo.api.tensor import RecurrentTensor
    from tempo.options import Distribution, LoopPolicy, MemoryPolicy
    from tempo.runtime.executable import Executable

_ACTIVE: list[Context] = []


class Context:
    """Declares the temporal dims of a program (outermost first) and collects its SDG.

    ``parallel`` names dims whose points never read each other (the env index ``b`` of an
    RL program over ``(b, i, t)``): the compiler computes all their points at once.

    >>> ctx = Context(dims=("i", "t"))
    >>> i, t = ctx.dims
    >>> I, T = ctx.bounds
    """

    def __init__(self, dims: Sequence[str] = ("t",), seed: int = 0, parallel: Sequence[str] = ()):
        names = list(dims)
        if len(set(names)) != len(names):
            raise DomainError(f"dim names must be distinct, got {names}")
        unknown = [n for n in parallel if n not in names]
        if unknown:
            raise DomainError(f"parallel dims {unknown} are not dims of this context (dims: {names})")
        self.dims: tuple[Symbol, ...] = tuple(Symbol(n, "dim") for n in names)
        self.parallel: tuple[Symbol, ...] = tuple(d for d in self.dims if d.name in parallel)
        """Dims no point of which reads another (an env index): laid out spatially by the
        compiler (``tempo.passes.parallel``)."""
        self.bounds: tuple[Symbol, ...] = tuple(Symbol(_bound_name(n, names), "bound") for n in names)
        self.bound_of: dict[Symbol, Symbol] = dict(zip(self.dims, self.bounds))
        self.seed = seed
        self.graph = SDG()
        self.leaves: set[int] = set()
        """Ops whose output is differentiated against (``requires_grad``)."""
        self.grads: dict[tuple[int, int], RecurrentTensor] = {}
        """The gradient RT of each leaf, set by ``backward()``."""

    # ---- activation -------------------------------------------------------------------
    def __enter__(self) -> Context:
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.remove(self)

    # ---- domains ----------------------------------------------------------------------
    def ordered(self, dims: Iterable[Symbol]) -> tuple[Symbol, ...]:
        """``dims`` in context order, without repeats."""
        wanted = set(dims)
        unknown = wanted - set(self.dims)
        if unknown:
            raise DomainError(f"{', '.join(sorted(d.name for d in unknown))} "
                              f"is not a dim of this context (dims: {self._dim_names()})",
                              user_site())
        return tuple(d for d in self.dims if d in wanted)

    def check_symbols(self, expr: Expr | Any, what: str) -> None:
        """Reject symbols that belong to no dim or bound of this context."""
        symbols = expr.symbols() if hasattr(expr, "symbols") else frozenset()
        foreign = [s for s in symbols if s not in self.bound_of and s not in self.bounds]
        if foreign:
            raise DomainError(f"{what} uses {', '.join(s.name for s in foreign)}, which is "
                              f"not a dim or bound of this context (dims: {self._dim_names()})",
                              user_site())

    def _dim_names(self) -> str:
        return ", ".join(d.name for d in self.dims)

    # ---- graph building ---------------------------------------------------------------
    def add_op(self, kind: str, inputs: Sequence[RecurrentTensor], params: dict[str, Any],
               domain: Iterable[Symbol] = (), phis: Sequence[tuple[IndexEntry, ...]] | None = None,
               label: str = "", conds: Sequence[Expr] | None = None) -> Op:
        """Add an op reading ``inputs`` (at identity unless ``phis`` says otherwise, where
        ``conds`` hold when given)."""
        site = user_site()
        if phis is None:
            from_params = [s for s in param_symbols(params) if s in self.bound_of]
            domain = self.ordered([*domain, *from_params, *(d for x in inputs for d in x.domain)])
            phis = [x.domain for x in inputs]
        else:
            domain = self.ordered(domain)
        try:
            out_types = op_def(kind).infer(*(x.type for x in inputs), **params)
        except ShapeError as err:
            raise ShapeError(f"{kind}: {err.args[0]}", site) from None
        op = self.graph.add_op(Op(len(self.graph.ops), kind, params, tuple(domain),
                                  tuple(out_types), site, label))
        for k, (x, phi) in enumerate(zip(inputs, phis)):
            cond = TRUE if conds is None else conds[k]
            self.graph.add_edge(Edge(op, k, x.op, x.out, tuple(phi), cond))
        return op

    def add_branch(self, merge: Op, value: RecurrentTensor, phi: tuple[IndexEntry, ...],
                   cond: Expr = TRUE) -> None:
        k = len(self.graph.in_edges(merge))
        self.graph.add_edge(Edge(merge, k, value.op, value.out, phi, cond))

    def compile(self, bounds: dict[Symbol, int], outputs: Sequence[RecurrentTensor] = (),
                backend: str = "auto", passes: Collection[str] | None = None,
                memory: MemoryPolicy | None = None, loops: LoopPolicy | None = None,
                tile: int | None = None, distribution: Distribution | None = None) -> Executable:
        """Check, optimize and schedule the program for concrete ``bounds``.

        ``backend`` is "jax", "numpy" or "auto" (JAX wherever it imports); ``passes`` names
        the optimization passes to run (all by default, ``()`` for none); ``memory`` is where
        stored points wait (``tp.MemoryPolicy``; by default on the device); ``loops`` how
        loops of device ops run on JAX (``tp.LoopPolicy``: by default one ``lax.scan`` each
        wherever the loop allows it); ``tile`` the rows per tile of reads whose length varies
        (``x[0:t+1]``; by default chosen per read, on JAX only). ``run()`` on the result
        returns the value of every point of ``outputs``; ``report`` on it says where compile
        time went. ``distribution`` (``tp.Distribution``) splits a parallel dim's points over
        devices (JAX): by default everything runs on one."""
        from tempo.compiler import compile_program  # the driver sits above the API
        return compile_program(self, bounds, list(outputs), backend=backend, passes=passes,
                               memory=memory, loops=loops, tile=tile, distribution=distribution)

    def __repr__(self) -> str:
        return f"Context(dims=({self._dim_names()}), ops={len(self.graph)})"


def _bound_name(name: str, names: list[str]) -> str:
    upper = name.upper()
    return upper if upper != name and upper not in names else f"{name}_bound"


def active_context() -> Context:
    if not _ACTIVE:
        raise TempoError("no active context: create RTs inside `with ctx:`", user_site())
    return _ACTIVE[-1]
