"""Symbolic expressions: hash-consing, evaluation, simplification, substitution, compilation.

Every value is checked against plain Python arithmetic on the same numbers (an oracle
independent of the code under test); random expressions come from hypothesis.
"""

from __future__ import annotations

import operator
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tempo.errors import UnsupportedExpressionError
from tempo.symbolic.expr import (
    Expr,
    Slice,
    Symbol,
    as_expr,
    compile_function,
    compile_vectorized,
    linear_form,
    maximum,
    minimum,
)

t = Symbol("t")
i = Symbol("i")
T = Symbol("T", "bound")
I = Symbol("I", "bound")
SYMBOLS = (t, i, T, I)

# ---- random expressions paired with a plain-Python evaluator -----------------------------
# An "int tree" is (Expr, fn) where fn(env) computes the same value with Python operators.


def _leaf() -> st.SearchStrategy:
    syms = st.sampled_from(SYMBOLS).map(lambda s: (s, lambda env, s=s: env[s.name]))
    consts = st.integers(-6, 6).map(lambda c: (as_expr(c), lambda env, c=c: c))
    return st.one_of(syms, consts)


_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    def arith(op, a, b):
        return (_ARITH[op](a[0], b[0]), lambda env: _ARITH[op](a[1](env), b[1](env)))

    def scale(a, k):  # keep products affine most of the time
        return (a[0] * k, lambda env: a[1](env) * k)

    def div(a, k, which):
        if which == "//":
            return (a[0] // k, lambda env: a[1](env) // k)
        return (a[0] % k, lambda env: a[1](env) % k)

    def div_bound(a, which):  # divisor is the bound T, which is >= 1 in every env
        if which == "//":
            return (a[0] // T, lambda env: a[1](env) // env["T"])
        return (a[0] % T, lambda env: a[1](env) % env["T"])

    def mm(which, a, b):
        fn = min if which == "min" else max
        build = minimum if which == "min" else maximum
        return (build(a[0], b[0]), lambda env: fn(a[1](env), b[1](env)))

    def neg(a):
        return (-a[0], lambda env: -a[1](env))

    nonzero = st.integers(-4, 4).filter(bool)
    return st.one_of(
        st.builds(arith, st.sampled_from(sorted(_ARITH)), children, children),
        st.builds(scale, children, st.integers(-3, 3)),
        st.builds(div, children, nonzero, st.sampled_from(["//", "%"])),
        st.builds(div_bound, children, st.sampled_from(["//", "%"])),
        st.builds(mm, st.sampled_from(["min", "max"]), children, children),
        st.builds(neg, children),
    )


int_trees = st.recursive(_leaf(), _extend, max_leaves=8)

_CMP = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq, "!=": operator.ne}


def _bool_extend(children: st.SearchStrategy) -> st.SearchStrategy:
    def conj(a, b):
        return (a[0] & b[0], lambda env: a[1](env) and b[1](env))

    def disj(a, b):
        return (a[0] | b[0], lambda env: a[1](env) or b[1](env))

    def neg(a):
        return (~a[0], lambda env: not a[1](env))

    return st.one_of(st.builds(conj, children, children), st.builds(disj, children, children),
                     st.builds(neg, children))


def _compare(op, a, b):
    return (_CMP[op](a[0], b[0]), lambda env: _CMP[op](a[1](env), b[1](env)))


bool_trees = st.recursive(
    st.builds(_compare, st.sampled_from(sorted(_CMP)), int_trees, int_trees),
    _bool_extend, max_leaves=4)

envs = st.fixed_dictionaries({"t": st.integers(-12, 12), "i": st.integers(-12, 12),
                              "T": st.integers(1, 12), "I": st.integers(1, 12)})


def _sym_env(env: dict[str, int]) -> dict[Symbol, int]:
    return {s: env[s.name] for s in SYMBOLS}


# ---- construction, identity, truth value --------------------------------------------------
def test_symbols_are_hash_consed_by_name_and_kind():
    assert Symbol("t") is t
    assert Symbol("t", "dim") is t
    assert Symbol("T", "bound") is T
    assert Symbol("t", "bound") is not t
    assert t.name == "t" and t.kind == "dim" and T.kind == "bound"


def test_building_the_same_expression_twice_gives_the_same_object():
    assert (t + 1) is (t + 1)
    assert (t * 2 - T) is (t * 2 - T)
    assert maximum(0, t - 3) is maximum(0, t - 3)
    assert (t // 2) is (t // 2)
    assert ((t < T) & (t % 3 == 0)) is ((t < T) & (t % 3 == 0))
    assert Slice(t, T) == Slice(t, T)


def test_constants_of_different_python_types_are_distinct_nodes():
    assert as_expr(True) is not as_expr(1)
    assert as_expr(1).value == 1 and as_expr(True).value is True


def test_as_expr_accepts_numpy_integers_and_rejects_floats():
    np = pytest.importorskip("numpy")
    assert as_expr(np.int32(4)) is as_expr(4)
    assert as_expr(np.int64(-2)) is as_expr(-2)
    with pytest.raises(UnsupportedExpressionError):
        as_expr(1.5)
    with pytest.raises(UnsupportedExpressionError):
        t + 0.5


def test_affine_forms_are_canonical_regardless_of_construction_order():
    assert (t + 1 - 1) is t
    assert (1 + t) is (t + 1)
    assert ((t + 1) + (T - t)) is (T + 1)
    assert (T - 1 - t) is (T - t - 1) is (-t + T - 1)
    assert (t * 3 - t * 3) is as_expr(0)
    assert (2 * (t + T) - T) is (t * 2 + T)


@settings(max_examples=150, deadline=None)
@given(coeffs=st.lists(st.integers(-3, 3), min_size=4, max_size=4), c=st.integers(-5, 5),
       perm=st.permutations(range(5)))
def test_equal_linear_forms_build_identical_objects(coeffs, c, perm):
    terms = [s * k for s, k in zip(SYMBOLS, coeffs)] + [as_expr(c)]
    left = as_expr(0)
    for term in terms:
        left = left + term
    right = as_expr(0)
    for k in perm:
        right = terms[k] + right
    assert left is right
    assert linear_form(left) == ({s: k for s, k in zip(SYMBOLS, coeffs) if k}, c)


def test_expressions_are_immutable():
    e = t + 1
    with pytest.raises(AttributeError):
        e.op = "sub"


def test_pickle_round_trip_preserves_identity():
    for e in (t, T, t + 1, maximum(0, t - 3), (t % 5 == 0) & (t < T), as_expr(True)):
        assert pickle.loads(pickle.dumps(e)) is e


def test_eq_builds_an_expression_whose_truth_is_structural_identity():
    eq = t + 1 == 1 + t
    assert isinstance(eq, Expr)
    assert bool(eq) is True
    assert bool(t == T) is False
    assert bool(t != T) is True
    assert bool((t + 1) != (t + 1)) is False
    assert bool(maximum(t, 0) == maximum(0, t)) in (True, False)  # defined, no TypeError


def test_eq_expression_evaluates_to_value_equality():
    e = t == T - 1
    assert e.evaluate({t: 4, T: 5}) is True
    assert e.evaluate({t: 3, T: 5}) is False


def test_expressions_work_as_dict_keys_and_in_sets():
    table = {t + 1: "a", T: "b", maximum(0, t - 1): "c"}
    assert table[1 + t] == "a"
    assert table[Symbol("T", "bound")] == "b"
    assert table[maximum(0, t - 1)] == "c"
    assert (t + 2) not in table
    assert t in {t, T}
    assert i not in {t, T}


@pytest.mark.parametrize("make", [
    lambda: t, lambda: t + 1, lambda: t < T, lambda: t <= 3, lambda: (t > 0) & (i > 0),
    lambda: ~(t < 2), lambda: maximum(0, t), lambda: t % 2,
])
def test_truth_value_of_non_eq_symbolic_expression_raises_type_error(make):
    with pytest.raises(TypeError):
        bool(make())
    with pytest.raises(TypeError):
        if make():  # the common way to hit it
            pass


def test_truth_value_of_constants():
    assert bool(as_expr(3)) and not bool(as_expr(0))
    assert bool(as_expr(True)) and not bool(as_expr(False))
    assert bool(t < t) is False and bool(t <= t) is True  # folded: same operand


# ---- evaluation -------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(tree=int_trees, env=envs)
def test_evaluate_matches_python_arithmetic(tree, env):
    expr, fn = tree
    assert expr.evaluate(_sym_env(env)) == fn(env)


@settings(max_examples=200, deadline=None)
@given(tree=bool_trees, env=envs)
def test_evaluate_boolean_expressions_matches_python(tree, env):
    expr, fn = tree
    assert expr.evaluate(_sym_env(env)) == fn(env)


@pytest.mark.parametrize("a,b", [(7, 3), (-7, 3), (7, -3), (-7, -3), (0, 5), (5, 1), (-1, 2)])
def test_floor_division_and_mod_follow_python_semantics(a, b):
    env = {t: a, i: b}
    assert (t // i).evaluate(env) == a // b
    assert (t % i).evaluate(env) == a % b
    assert (t // b).evaluate(env) == a // b
    assert (t % b).evaluate(env) == a % b
    assert (as_expr(a) // b).value == a // b
    assert (as_expr(a) % b).value == a % b


def test_evaluate_with_missing_symbol_raises():
    with pytest.raises(UnsupportedExpressionError):
        (t + T).evaluate({t: 1})


def test_constant_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError):
        as_expr(3) // 0
    with pytest.raises(ZeroDivisionError):
        as_expr(3) % 0


# ---- simplification keeps values ---------------------------------------------------------
def _affine(coeffs, c):
    e = as_expr(c)
    for s, k in zip(SYMBOLS, coeffs):
        e = e + s * k
    return e


affine = st.builds(_affine, st.lists(st.integers(-3, 3), min_size=4, max_size=4),
                   st.integers(-6, 6))


@settings(max_examples=200, deadline=None)
@given(a=affine, b=affine, k=st.integers(-3, 3), env=envs)
def test_simplified_affine_combinations_keep_their_values(a, b, k, env):
    e = _sym_env(env)
    va, vb = a.evaluate(e), b.evaluate(e)
    assert (a + b).evaluate(e) == va + vb
    assert (a - b).evaluate(e) == va - vb
    assert (a * k).evaluate(e) == va * k
    assert (k * a - b * k).evaluate(e) == k * va - vb * k
    assert (-a).evaluate(e) == -va
    assert maximum(a, b).evaluate(e) == max(va, vb)
    assert minimum(a, b).evaluate(e) == min(va, vb)
    assert (maximum(a, b) + k).evaluate(e) == max(va, vb) + k
    assert (minimum(a, b) - k).evaluate(e) == min(va, vb) - k
    assert (a // 1).evaluate(e) == va and (a % 1).evaluate(e) == 0
    assert (a * 0).evaluate(e) == 0


def test_min_max_fold_when_the_difference_is_constant():
    assert maximum(t, t + 1) is t + 1
    assert minimum(t + 4, t + 1) is t + 1
    assert maximum(t - 3, t - 3) is t - 3
    assert minimum(T, T) is T
    assert maximum(2, 5) is as_expr(5)
    assert minimum(t, T).op == "min"  # not comparable: stays symbolic


# ---- substitution ------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(tree=int_trees, repl=int_trees, env=envs)
def test_substitute_equals_evaluating_with_the_substituted_value(tree, repl, env):
    expr, fn = tree
    r_expr, r_fn = repl
    try:
        expected = fn({**env, "t": r_fn(env)})
    except ZeroDivisionError:  # pragma: no cover - divisors are nonzero constants or T >= 1
        return
    substituted = expr.substitute({t: r_expr})
    assert substituted.evaluate(_sym_env(env)) == expected


def test_substitute_simple_cases():
    assert (t + 1).substitute({t: t - 1}) is t
    assert (t + T).substitute({T: 10}) is t + 10
    assert maximum(0, t - 3).substitute({t: 3}) is as_expr(0)
    assert maximum(0, t - 3).substitute({t: 7}) is as_expr(4)
    assert (t % 5 == 0).substitute({t: 10}) is as_expr(True)
    assert Slice(maximum(0, t - 2), t + 1).substitute({t: 1}) == Slice(0, 2)
    assert (t - i).substitute({t: i, i: t}) is (i - t)  # simultaneous, not sequential


# ---- compile_function --------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(trees=st.lists(int_trees, min_size=1, max_size=3), lo=int_trees, hi=int_trees,
       cond=bool_trees, env=envs)
def test_compile_function_matches_evaluate(trees, lo, hi, cond, env):
    exprs = [e for e, _ in trees]
    entries = [*exprs, Slice(lo[0], hi[0]), cond[0]]
    fn = compile_function(entries, [t, i], {T: env["T"], I: env["I"]})
    out = fn(env["t"], env["i"])
    e = _sym_env(env)
    assert isinstance(out, tuple) and len(out) == len(entries)
    for got, (_, py) in zip(out[:len(exprs)], trees):
        assert got == py(env)
    assert out[len(exprs)] == slice(lo[1](env), hi[1](env))
    assert out[len(exprs)] == slice(lo[0].evaluate(e), hi[0].evaluate(e))
    assert bool(out[-1]) == cond[1](env)


def test_compile_function_examples():
    f = compile_function([t - 3, Slice(t, minimum(t + 4, T)), Slice(0, T), t % 5 == 0], [t], {T: 10})
    assert f(3) == (0, slice(3, 7), slice(0, 10), False)
    assert f(8) == (5, slice(8, 10), slice(0, 10), False)
    assert f(5)[3] is True


@settings(max_examples=150, deadline=None)
@given(trees=st.lists(int_trees, min_size=1, max_size=3), cond=bool_trees, env=envs)
def test_compile_vectorized_matches_the_scalar_function(trees, cond, env):
    """Over a range of t (an array) and a scalar i, each entry equals plain Python's
    value at every t, conditions included (elementwise and/or/not)."""
    entries = [*(e for e, _ in trees), cond[0]]
    ts = np.arange(-3, 12)
    columns = compile_vectorized(entries, [t, i], {T: env["T"], I: env["I"]})(ts, env["i"])
    assert all(c.shape == ts.shape for c in columns)
    for k, tv in enumerate(ts.tolist()):
        at = {**env, "t": tv}
        expected = [py(at) for _, py in trees] + [bool(cond[1](at))]
        assert [c[k].item() for c in columns] == expected


def test_compile_vectorized_broadcasts_constants_and_scalars():
    f = compile_vectorized([t - i, as_expr(7), (t > 1) & ~(i == 0)], [i, t])
    d, seven, cond = f(2, np.arange(4))
    assert d.tolist() == [-2, -1, 0, 1] and seven.tolist() == [7] * 4
    assert cond.tolist() == [False, False, True, True]
    assert compile_vectorized([t], [t])(5)[0] == 5


def test_compile_function_parameter_order_and_empty_list():
    f = compile_function([t - i, i * 2], [i, t])
    assert f(2, 7) == (5, 4)
    g = compile_function([], [t])
    assert g(3) == ()


def test_compile_function_handles_negative_constants():
    f = compile_function([t // -2, t % -3, t - (-4), t * -2], [t])
    for v in range(-5, 6):
        assert f(v) == (v // -2, v % -3, v + 4, v * -2)


def test_symbols_and_slice_size():
    assert (t + T * 2 - 1).symbols() == {t, T}
    assert as_expr(4).symbols() == frozenset()
    assert maximum(0, t - i).symbols() == {t, i}
    window = Slice(maximum(0, t - 3), t + 1)
    assert window.symbols() == {t}
    for v in range(8):
        assert window.size.evaluate({t: v}) == min(v, 3) + 1
    assert Slice(t, T).size is (T - t)
    assert Slice(0, 5).size is as_expr(5)


def test_select_evaluates_and_compiles_like_a_conditional_expression():
    from tempo.symbolic.expr import select
    t = Symbol("t")
    e = select(t % 3 >= 1, t - 1, t + 10)
    fn = compile_function([e], [t])
    for v in range(-4, 8):
        want = v - 1 if v % 3 >= 1 else v + 10
        assert e.evaluate({t: v}) == want and fn(v) == (want,)
    assert select(as_expr(True), t, t + 1) is t
