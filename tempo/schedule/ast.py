"""Our loop-program AST, built from isl's AST, printable and compilable to Python."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import islpy as isl

from tempo.errors import TempoError
from tempo.symbolic.expr import Expr, Symbol, from_data, to_data
from tempo.symbolic.isl_bridge import from_isl_ast_expr


@dataclass(frozen=True)
class Seq:
    body: tuple[Node, ...]


@dataclass(frozen=True)
class Loop:
    var: Symbol
    start: Expr
    cond: Expr
    step: int
    body: Node


@dataclass(frozen=True)
class If:
    cond: Expr
    then: Node
    orelse: Node | None = None


@dataclass(frozen=True)
class Stmt:
    """Run statement ``name`` (an op execution or a deallocation) at ``index``."""

    name: str
    index: tuple[Expr, ...]


Node = Seq | Loop | If | Stmt


def from_isl(node: isl.AstNode, symbols: dict[str, Expr] | None = None) -> Node:
    """Our AST for an isl AST; loop iterators become ``Symbol(name, 'loop')``."""
    symbols = dict(symbols or {})
    kind = node.get_type()
    if kind == isl.ast_node_type.for_:
        name = node.for_get_iterator().get_id().get_name()
        var = Symbol(name, "loop")
        start = from_isl_ast_expr(node.for_get_init(), symbols)
        symbols[name] = var
        cond = from_isl_ast_expr(node.for_get_cond(), symbols)
        step = from_isl_ast_expr(node.for_get_inc(), symbols)
        return Loop(var, start, cond, int(step.value), from_isl(node.for_get_body(), symbols))
    if kind == isl.ast_node_type.if_:
        cond = from_isl_ast_expr(node.if_get_cond(), symbols)
        orelse = from_isl(node.if_get_else_node(), symbols) if node.if_has_else_node() else None
        return If(cond, from_isl(node.if_get_then_node(), symbols), orelse)
    if kind == isl.ast_node_type.block:
        children = node.block_get_children()
        return Seq(tuple(from_isl(children.get_at(k), symbols)
                         for k in range(children.n_ast_node())))
    if kind == isl.ast_node_type.mark:
        return from_isl(node.mark_get_node(), symbols)
    if kind == isl.ast_node_type.user:
        call = node.user_get_expr()
        name = call.get_op_arg(0).get_id().get_name()
        args = tuple(from_isl_ast_expr(call.get_op_arg(k), symbols)
                     for k in range(1, call.get_op_n_arg()))
        return Stmt(name, args)
    raise TempoError(f"internal: unsupported isl AST node {kind}")


def to_text(node: Node) -> str:
    """``node`` as JSON text (``from_text`` reads it back)."""
    return json.dumps(_data(node), separators=(",", ":"))


def _data(node: Node) -> list:
    if isinstance(node, Seq):
        return ["seq", [_data(c) for c in node.body]]
    if isinstance(node, Loop):
        return ["loop", to_data(node.var), to_data(node.start), to_data(node.cond), node.step,
                _data(node.body)]
    if isinstance(node, If):
        return ["if", to_data(node.cond), _data(node.then),
                None if node.orelse is None else _data(node.orelse)]
    return ["stmt", node.name, [to_data(e) for e in node.index]]


def from_text(text: str, names: Collection[str]) -> Node:
    """The AST ``to_text`` wrote as ``text`` for bounds that are numbers (isl's AST of a
    schedule with no parameters), its statements among ``names``; ``ValueError`` for
    anything else. The text is data: what the Python program made from the AST runs is
    ``names``' statements, our operations, and loops over counters ``c0``, ``c1``, ... (as
    isl names them: no other name, so no builtin or statement, can be bound or read)."""
    try:
        return _node(json.loads(text), names, frozenset())
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as err:
        raise ValueError(f"not a loop program: {err}") from err


def _node(data: list, names: Collection[str], counters: frozenset[Symbol]) -> Node:
    """The node of ``data``, inside loops over ``counters``."""
    kind = data[0]
    if kind == "seq" and len(data) == 2:
        return Seq(tuple(_node(c, names, counters) for c in data[1]))
    if kind == "loop" and len(data) == 6 and type(data[4]) is int and data[4] >= 1:
        var = _counter(data[1], counters)
        inside = counters | {var}
        return Loop(var, from_data(data[2], counters), from_data(data[3], inside), data[4],
                    _node(data[5], names, inside))
    if kind == "if" and len(data) == 4:
        orelse = None if data[3] is None else _node(data[3], names, counters)
        return If(from_data(data[1], counters), _node(data[2], names, counters), orelse)
    if kind == "stmt" and len(data) == 3 and data[1] in names:
        return Stmt(data[1], tuple(from_data(e, counters) for e in data[2]))
    raise ValueError(f"not a node: {str(data)[:80]}")


def _counter(data: list, counters: frozenset[Symbol]) -> Symbol:
    """A new loop counter, named as isl names them (``c<k>``)."""
    if not (len(data) == 3 and data[0] == "sym" and data[2] == "loop" and isinstance(data[1], str)
            and re.fullmatch(r"c[0-9]+", data[1]) and Symbol(data[1], "loop") not in counters):
        raise ValueError(f"not a loop counter: {data!r}")
    return Symbol(data[1], "loop")


def guarded_items(node: Node, guard: tuple = ()) -> list[tuple[Stmt | Loop, tuple[Expr, ...]]]:
    """The statements and loops of a loop body, in order, each with the conditions
    (expressions) that guard it."""
    if isinstance(node, (Stmt, Loop)):
        return [(node, guard)]
    if isinstance(node, Seq):
        return [item for c in node.body for item in guarded_items(c, guard)]
    assert isinstance(node, If)
    items = guarded_items(node.then, (*guard, node.cond))
    if node.orelse is not None:
        items += guarded_items(node.orelse, (*guard, ~node.cond))
    return items


def statements(node: Node) -> Iterator[Stmt]:
    """The statements of ``node`` in text order, those of loops and branches included."""
    if isinstance(node, Stmt):
        yield node
    elif isinstance(node, Seq):
        for child in node.body:
            yield from statements(child)
    elif isinstance(node, Loop):
        yield from statements(node.body)
    else:
        yield from statements(node.then)
        if node.orelse is not None:
            yield from statements(node.orelse)


def first_points(node: Node, env: dict[Symbol, int] | None = None) -> dict[str, tuple[int, ...]]:
    """Per statement of ``node`` (bounds substituted), its point at the first iteration of
    each loop around it, in text order: where the program first reaches it, unless a
    guard skips that iteration (guards are not evaluated)."""
    env = env or {}
    if isinstance(node, Stmt):
        return {node.name: tuple(int(e.evaluate(env)) for e in node.index)}
    if isinstance(node, Loop):
        return first_points(node.body, {**env, node.var: int(node.start.evaluate(env))})
    children = node.body if isinstance(node, Seq) else (node.then, node.orelse)
    out: dict[str, tuple[int, ...]] = {}
    for child in children:
        if child is not None:
            for name, point in first_points(child, env).items():
                out.setdefault(name, point)
    return out


def range_stop(loop: Loop) -> Expr | None:
    """``stop`` when the loop condition is ``var < stop`` or ``var <= stop - 1``."""
    c = loop.cond
    if c.op in ("lt", "le") and c.args[0] is loop.var and loop.var not in c.args[1].symbols():
        return c.args[1] if c.op == "lt" else c.args[1] + 1
    return None


def to_python(node: Node, call: Callable[[Stmt], str], indent: int = 1) -> list[str]:
    """Python source lines for ``node``; ``call`` renders one statement."""
    pad = "    " * indent
    if isinstance(node, Seq):
        return [line for child in node.body for line in to_python(child, call, indent)] \
            or [f"{pad}pass"]
    if isinstance(node, Stmt):
        return [f"{pad}{call(node)}"]
    if isinstance(node, If):
        lines = [f"{pad}if {node.cond.to_python()}:", *to_python(node.then, call, indent + 1)]
        if node.orelse is not None:
            lines += [f"{pad}else:", *to_python(node.orelse, call, indent + 1)]
        return lines
    stop = range_stop(node)
    body = to_python(node.body, call, indent + 1)
    var = node.var.name
    if stop is not None:
        step = "" if node.step == 1 else f", {node.step}"
        return [f"{pad}for {var} in range({node.start.to_python()}, {stop.to_python()}{step}):",
                *body]
    return [f"{pad}{var} = {node.start.to_python()}",
            f"{pad}while {node.cond.to_python()}:", *body,
            f"{pad}    {var} += {node.step}"]


def substitute(node: Node, values: dict[Symbol, int]) -> Node:
    """``node`` with symbols (e.g. bounds) replaced by values, simplified."""
    if isinstance(node, Stmt):
        return Stmt(node.name, tuple(e.substitute(values) for e in node.index))
    if isinstance(node, Seq):
        return Seq(tuple(substitute(c, values) for c in node.body))
    if isinstance(node, If):
        orelse = substitute(node.orelse, values) if node.orelse is not None else None
        return If(node.cond.substitute(values), substitute(node.then, values), orelse)
    return Loop(node.var, node.start.substitute(values), node.cond.substitute(values), node.step,
                substitute(node.body, values))
