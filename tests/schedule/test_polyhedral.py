"""isl relations built from shared parses: renaming a parsed template's tuples gives what
parsing the text with the statements' own names gives, and texts kept by what they are
made of give the relations made anew."""

import islpy as isl
import numpy as np
import pytest

import tempo as tp
import tempo.analysis.polyhedral as polyhedral
from tempo.analysis.polyhedral import (
    ISL,
    SINK,
    SOURCE,
    STATEMENT,
    Polyhedral,
    named_map,
    named_set,
    union_map,
    union_of,
)

MAPS = [
    f"{{ {SINK}[a0, a1] -> {SOURCE}[b0, b1] : 0 <= a0 < 8 and 0 <= a1 < 64 and b0 = a0 and b1 = a1 - 1 "
    f"and a1 >= 1 }}",
    f"{{ {SINK}[a0] -> {SOURCE}[b0] : 0 <= a0 < 16 and max(0, a0 - 3) <= b0 < a0 + 1 }}",
    f"{{ {SINK}[a0] -> {SOURCE}[b0] : 0 <= a0 < 16 and (b0 = 0 or b0 = 2a0) }}",  # two pieces
    f"[p_T] -> {{ {SINK}[a0] -> {SOURCE}[b0] : 0 <= a0 < p_T and a0 <= b0 < p_T }}",
    f"{{ {SINK}[a0] -> {SOURCE}[] : 0 <= a0 < 4 }}",
    f"{{ {SINK}[a0] -> {SOURCE}[b0] : 0 <= a0 < 4 and false }}",  # empty
    # empty, but isl keeps the pieces when it parses it (it does not solve the constraints)
    f"{{ {SINK}[a0, a1] -> {SOURCE}[b0] : a0 + a1 >= 10 and a0 <= 2 and a1 <= 2 }}",
]


def _parsed(text: str, names: dict[str, str]) -> isl.UnionMap | isl.UnionSet:
    for placeholder, name in names.items():
        text = text.replace(f"{placeholder}[", f"{name}[")
    relation = "->" in text.split("{")[1].split(":")[0]
    return isl.UnionMap(text, context=ISL) if relation else isl.UnionSet(text, context=ISL)


@pytest.mark.parametrize("text", MAPS)
@pytest.mark.parametrize("sink, source", [("S7", "S3"), ("S5", "S5")])
def test_named_map_is_the_text_parsed_with_those_names(text, sink, source):
    got = named_map(text, sink, source)
    want = _parsed(text, {SINK: sink, SOURCE: source})
    assert got.is_equal(want), (got, want)
    assert str(got) == str(want)  # (texts are cache keys: isl's schedules are kept by them)


@pytest.mark.parametrize("text", [
    f"{{ {STATEMENT}[a0, a1] : 0 <= a0 < 8 and 0 <= a1 < 64 }}",
    f"[p_T] -> {{ {STATEMENT}[a0] : 0 <= a0 < p_T and a0 % 2 = 0 }}",
    f"{{ {STATEMENT}[] }}",
    f"{{ {STATEMENT}[a0] : 0 <= a0 < 0 }}",
    f"{{ {STATEMENT}[a0, a1] : a0 + a1 >= 10 and a0 <= 2 and a1 <= 2 }}",
])
def test_named_set_is_the_text_parsed_with_that_name(text):
    got = named_set(text, "S12")
    want = _parsed(text, {STATEMENT: "S12"})
    assert got.is_equal(want) and str(got) == str(want), (got, want)


def test_a_rename_leaves_the_shared_parse_alone():
    first = named_map(MAPS[0], "S1", "S2")
    named_map(MAPS[0], "S9", "S8")
    assert first.is_equal(_parsed(MAPS[0], {SINK: "S1", SOURCE: "S2"}))
    assert f"{SINK}[" in str(union_map(MAPS[0])) and "S1[" not in str(union_map(MAPS[0]))


def test_union_of_is_the_union_of_every_set():
    sets = [named_set(f"{{ {STATEMENT}[a0] : {k} <= a0 < {k + 3} }}", f"S{k % 4}") for k in range(10)]
    want = sets[0]
    for s in sets[1:]:
        want = want.union(s)
    assert union_of(sets).is_equal(want)
    assert union_of([]) is None


class _KeepsNothing(dict):
    """A text cache that keeps nothing: every relation made from scratch."""

    def __setitem__(self, key, value) -> None:
        pass


def test_read_relations_kept_by_what_they_are_made_of_are_those_made_anew(monkeypatch):
    """``Polyhedral._reads`` keeps texts across views: at other bounds, or parametric,
    each relation is the one made from scratch."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tp.const(np.arange(8, dtype=np.float32))[t]
        s = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        s[0] = x[0]
        s[t + 1] = s * 0.5 + x[t + 1]
        g = x[t:T].sum()
    del s, g
    views = [Polyhedral(ctx.graph, {T: n}, ctx.bound_of) for n in (5, 7, 5)]
    views.append(Polyhedral(ctx.graph, {T: 5}, ctx.bound_of, parametric=True))
    kept = [view.all_reads() for view in views]
    monkeypatch.setattr(polyhedral, "_READ_TEXTS", _KeepsNothing())
    for view, reads in zip(views, kept):
        fresh = Polyhedral(view.graph, view.bounds, view.bound_of, view.parametric).all_reads()
        assert reads.keys() == fresh.keys()
        assert all(reads[e].is_equal(fresh[e]) for e in reads)
    assert any(not kept[0][e].is_equal(kept[1][e]) for e in kept[0])  # (the bounds matter)
