"""Bad programs are rejected with Tempo's own exception types, and the message names the problem
and, where the API promises it, the user's source line (``defined at <file>:<line>: <code>``).

The line of an offending statement is taken with ``sys._getframe().f_lineno`` on the line just
before it, so the tests do not depend on where in this file they sit.
"""

import os
import sys

import numpy as np
import pytest

import tempo as tp
from tempo.reference import evaluate

BACKENDS = ("numpy", "jax")
THIS_FILE = os.path.basename(__file__)


def next_line() -> int:
    """The line number after the caller's line."""
    return sys._getframe(1).f_lineno + 1


def assert_site(err: BaseException, line: int | None = None, code: str | None = None) -> None:
    """The message points at this test file (and at ``line``, showing ``code``)."""
    msg = str(err)
    assert "defined at" in msg, msg
    assert THIS_FILE in msg, msg
    if line is not None:
        assert f"{THIS_FILE}:{line}" in msg, msg
    if code is not None:
        assert code in msg, msg


def ctx_t():
    ctx = tp.Context(dims=("t",))
    return ctx, ctx.dims[0], ctx.bounds[0]


# ---- unschedulable cycles ---------------------------------------------------------------------
def test_zero_distance_cycle_is_unschedulable():
    ctx, t, T = ctx_t()
    with ctx:
        a = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        b = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        a[True] = b + 1.0
        b[True] = a + 1.0
    with pytest.raises(tp.UnschedulableError) as info:
        ctx.compile(bounds={T: 5}, outputs=[a], backend="numpy")
    msg = str(info.value)
    assert "cycle" in msg
    assert "a#" in msg or "b#" in msg       # names one of the RTs in the cycle
    assert_site(info.value)
    with pytest.raises(tp.UnschedulableError):
        evaluate(ctx, {T: 5}, [a])


def test_self_cycle_is_unschedulable():
    ctx, t, T = ctx_t()
    with ctx:
        line = next_line()
        x = tp.placeholder(domain=(t,))
        x[True] = x + 1.0
    with pytest.raises(tp.UnschedulableError) as info:
        ctx.compile(bounds={T: 4}, outputs=[x], backend="jax")
    assert "x#" in str(info.value)
    assert_site(info.value, line, "x = tp.placeholder(domain=(t,))")


# ---- out-of-range reads -----------------------------------------------------------------------
def test_recurrence_without_base_case_reads_out_of_range():
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(np.ones(5, np.float32))[t]
        y = tp.placeholder(domain=(t,))
        line = next_line()
        y[True] = y[t - 1] + x
    with pytest.raises(tp.OutOfRangeError) as info:
        ctx.compile(bounds={T: 5}, outputs=[y], backend="numpy")
    msg = str(info.value)
    assert "y#" in msg and "t=-1" in msg
    assert_site(info.value, line, "y[True] = y[t - 1] + x")
    with pytest.raises(tp.OutOfRangeError):
        evaluate(ctx, {T: 5}, [y])


def test_read_of_the_future_past_the_end_is_out_of_range():
    ctx, t, T = ctx_t()
    with ctx:
        y = tp.placeholder(domain=(t,))
        line = next_line()
        y[True] = y[t + 1]
    with pytest.raises(tp.OutOfRangeError) as info:
        ctx.compile(bounds={T: 5}, outputs=[y], backend="numpy")
    msg = str(info.value)
    assert "y#" in msg and "t=5" in msg
    assert_site(info.value, line, "y[True] = y[t + 1]")
    with pytest.raises(tp.OutOfRangeError):
        evaluate(ctx, {T: 5}, [y])


def test_slice_past_the_end_is_out_of_range():
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(np.ones(6, np.float32))[t]
        line = next_line()
        y = x[t:t + 3].sum()
    with pytest.raises(tp.OutOfRangeError) as info:
        ctx.compile(bounds={T: 6}, outputs=[y], backend="numpy")
    assert_site(info.value, line, "y = x[t:t + 3].sum()")


@pytest.mark.parametrize("backend", BACKENDS)
def test_spatial_index_by_symbol_past_the_array_is_rejected(backend):
    """x = const(arange(5))[t] with T = 8 reads entries 5..7 that do not exist: that is a bad
    program (a Tempo error), not a raw IndexError nor silently made-up values."""
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(np.arange(5, dtype=np.float32))[t]
        y = x * 2.0
    with pytest.raises(tp.TempoError):
        ctx.compile(bounds={T: 8}, outputs=[y], backend=backend).run()


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_spatial_index_past_the_array_is_rejected(backend):
    ctx, t, T = ctx_t()
    with pytest.raises(tp.TempoError):
        with ctx:
            x = tp.const(np.arange(5, dtype=np.float32))[7]
            y = x + tp.symbol_value(t).astype("float32")
        ctx.compile(bounds={T: 3}, outputs=[y], backend=backend).run()


# ---- undefined points -------------------------------------------------------------------------
def test_point_no_branch_defines_is_undefined():
    ctx, t, T = ctx_t()
    with ctx:
        line = next_line()
        y = tp.placeholder(domain=(t,))
        y[t % 2 == 0] = 1.0
    with pytest.raises(tp.UndefinedPointError) as info:
        ctx.compile(bounds={T: 5}, outputs=[y], backend="numpy")
    msg = str(info.value)
    assert "y#" in msg and "t=1" in msg
    assert_site(info.value, line, "y = tp.placeholder(domain=(t,))")
    with pytest.raises(tp.UndefinedPointError):
        evaluate(ctx, {T: 5}, [y])


def test_undefined_points_that_nothing_reads_are_fine():
    ctx, t, T = ctx_t()
    with ctx:
        y = tp.placeholder(domain=(t,))
        y[t % 2 == 0] = 1.5
        z = y[0] * 2.0 + y[2]
    res = ctx.compile(bounds={T: 5}, outputs=[z], backend="numpy").run()
    assert float(res[z]) == 4.5


def test_placeholder_without_any_branch():
    ctx, t, T = ctx_t()
    with ctx:
        line = next_line()
        y = tp.placeholder(domain=(t,))
        z = y + 1.0
    with pytest.raises(tp.UndefinedPointError) as info:
        ctx.compile(bounds={T: 3}, outputs=[z], backend="numpy")
    assert "y#" in str(info.value)
    assert_site(info.value, line)


# ---- shapes -------------------------------------------------------------------------------
def test_shape_mismatch_is_reported_at_definition():
    ctx, t, T = ctx_t()
    with ctx:
        a = tp.const(np.ones(3))
        b = tp.const(np.ones(4))
        with pytest.raises(tp.ShapeError) as info:
            line = next_line()
            a + b  # noqa: B018 - the offending line
        assert "(3,)" in str(info.value) and "(4,)" in str(info.value)
        assert_site(info.value, line, "a + b")

        with pytest.raises(tp.ShapeError) as info:
            line = next_line()
            tp.const(np.ones(3)) + tp.const(np.ones(4))
        assert_site(info.value, line, "tp.const(np.ones(3)) + tp.const(np.ones(4))")


def test_matmul_inner_dims_must_match():
    ctx, t, T = ctx_t()
    with ctx:
        a = tp.const(np.ones((2, 3), np.float32))
        b = tp.const(np.ones((4, 2), np.float32))
        with pytest.raises(tp.ShapeError) as info:
            line = next_line()
            a @ b  # noqa: B018
        msg = str(info.value)
        assert "matmul" in msg and "3" in msg and "4" in msg
        assert_site(info.value, line, "a @ b")


def test_assigning_a_value_of_the_wrong_shape():
    ctx, t, T = ctx_t()
    with ctx:
        y = tp.placeholder(shape=(3,), domain=(t,))
        with pytest.raises(tp.ShapeError) as info:
            line = next_line()
            y[True] = tp.const(np.ones(4, np.float32))
        assert "(4,)" in str(info.value) and "(3,)" in str(info.value)
        assert_site(info.value, line)


def test_other_definition_time_shape_errors():
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(np.arange(5, dtype=np.float32))[t]
        with pytest.raises(tp.ShapeError) as info:
            line = next_line()
            x[t, 0]  # noqa: B018 - indexing a scalar
        assert_site(info.value, line)
        with pytest.raises(tp.ShapeError) as info:
            line = next_line()
            tp.const(np.ones(6)).reshape(4, 2)
        assert_site(info.value, line)
        with pytest.raises(tp.ShapeError):
            tp.cat([tp.const(np.ones((2, 3))), tp.const(np.ones((2, 4)))], dim=0)
        with pytest.raises(tp.ShapeError):
            tp.where(tp.const(np.ones(3, bool)), tp.const(np.ones(4)), 0.0)


# ---- bounds -------------------------------------------------------------------------------
def _program_using_T():
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(np.ones(5, np.float32))[t]
        y = x[t:T].sum()
    return ctx, T, y


def test_missing_bound_is_named():
    ctx, T, y = _program_using_T()
    with pytest.raises(tp.BoundsError) as info:
        ctx.compile(bounds={}, outputs=[y], backend="numpy")
    assert "T" in str(info.value)
    with pytest.raises(tp.BoundsError):
        evaluate(ctx, {}, [y])


def test_an_index_of_a_later_dim_in_an_earlier_place_says_how_to_write_it():
    """``G[t+1]`` of a ``(b, i, t)`` tensor would read ``G[t+1, i, t]``: an error that names
    the dim it was applied to and the index meant, at the user's line."""
    ctx = tp.Context(dims=("b", "i", "t"))
    b, i, t = ctx.dims
    with ctx:
        g = tp.placeholder(shape=(), dtype="float32", domain=(b, i, t))
        with pytest.raises(tp.DomainError) as info:
            g[t + 1]  # the mistake
        assert g[b, i, t + 1].domain == (b, i, t)  # the fix
        assert g[0].domain == (i, t) and g[b - 1].domain == (b, i, t)  # indices of b itself are fine
    message = str(info.value)
    assert "applies (t + 1) to dim b" in message and "[b, i, (t + 1)]" in message
    assert info.value.site.filename == __file__ and "g[t + 1]  # the mistake" in info.value.site.line


def test_a_parameter_read_past_its_updates_says_an_optimizer_step_defines_it():
    """Parameters over ``i`` without an optimizer step exist at ``i = 0`` only."""
    from tempo.api import nn
    ctx = tp.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        layer = nn.Linear(3, 2, domain=(i,))
        y = layer(tp.const(np.ones(3, np.float32))).sum()
    with pytest.raises(tp.UndefinedPointError, match=r"weight#\d+ is needed at \(i=1\).*optimizer step"):
        ctx.compile({I: 3}, [y], backend="numpy")
    with pytest.raises(tp.UndefinedPointError, match="optimizer step"):
        evaluate(ctx, {I: 3}, [y])


def test_missing_bound_error_points_at_the_user_code():
    """A bound missing at compile time is reported with the user's source line
    (docs/programming-model.md, "Errors")."""
    ctx, T, y = _program_using_T()
    with pytest.raises(tp.BoundsError) as info:
        ctx.compile(bounds={}, outputs=[y], backend="numpy")
    assert_site(info.value)


def test_invalid_bounds():
    ctx, T, y = _program_using_T()
    with pytest.raises(tp.BoundsError) as info:
        ctx.compile(bounds={T: 0}, outputs=[y], backend="numpy")
    assert "T" in str(info.value)
    with pytest.raises(tp.BoundsError) as info:
        ctx.compile(bounds={T: 5, "Q": 3}, outputs=[y], backend="numpy")
    assert "Q" in str(info.value)


# ---- domains ------------------------------------------------------------------------------
def test_assigning_to_a_non_placeholder():
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(np.ones(5, np.float32))[t]
        with pytest.raises(tp.DomainError) as info:
            line = next_line()
            x[0] = 1.0
        assert "placeholder" in str(info.value)
        assert_site(info.value, line, "x[0] = 1.0")


def test_assigning_a_value_that_varies_over_a_dim_outside_the_domain():
    ctx = tp.Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        x = tp.const(np.ones(5, np.float32))[t]
        y = tp.placeholder(domain=(i,))
        with pytest.raises(tp.DomainError) as info:
            line = next_line()
            y[True] = x
        assert "t" in str(info.value)
        assert_site(info.value, line)


def test_symbol_of_another_context():
    ctx, t, T = ctx_t()
    other = tp.Context(dims=("s",))
    (s,) = other.dims
    with ctx:
        with pytest.raises(tp.DomainError) as info:
            line = next_line()
            tp.const(np.ones(5, np.float32))[s]
        assert "s" in str(info.value)
        assert_site(info.value, line)


def test_non_quasi_affine_index():
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(np.arange(5, dtype=np.float32))[t]
        line = next_line()
        y = x[t * t]
    with pytest.raises(tp.UnsupportedExpressionError) as info:
        ctx.compile(bounds={T: 2}, outputs=[y], backend="numpy")
    assert_site(info.value, line)


# ---- UDFs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_udf_returning_the_wrong_shape_fails_at_run_time(backend):
    ctx, t, T = ctx_t()
    with ctx:
        line = next_line()
        (u,) = tp.udf(lambda: np.zeros(3, np.float32), outputs=[((2,), "float32")], domain=(t,))
    exe = ctx.compile(bounds={T: 3}, outputs=[u], backend=backend)   # fine until it runs
    with pytest.raises(tp.UDFError) as info:
        exe.run()
    msg = str(info.value)
    assert "(3,)" in msg and "(2,)" in msg
    assert_site(info.value, line)


@pytest.mark.parametrize("backend", BACKENDS)
def test_udf_returning_the_wrong_dtype(backend):
    ctx, t, T = ctx_t()
    with ctx:
        (u,) = tp.udf(lambda: np.float32(1.5), outputs=[((), "int32")], domain=(t,))
    with pytest.raises(tp.UDFError) as info:
        ctx.compile(bounds={T: 2}, outputs=[u], backend=backend).run()
    assert "int32" in str(info.value) and "float32" in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_udf_returning_the_wrong_number_of_values(backend):
    """Two outputs declared; three values returned, then a single array returned."""
    ctx, t, T = ctx_t()
    with ctx:
        u, v = tp.udf(lambda: (np.float32(1.0),) * 3, outputs=[((), "float32"), ((), "float32")],
                      domain=(t,))
    with pytest.raises(tp.UDFError) as info:
        ctx.compile(bounds={T: 2}, outputs=[u, v], backend=backend).run()
    assert "3" in str(info.value) and "2" in str(info.value)

    ctx, t, T = ctx_t()
    with ctx:
        u, v = tp.udf(lambda: np.float32(1.0), outputs=[((), "float32"), ((), "float32")],
                      domain=(t,))
    with pytest.raises(tp.UDFError) as info:
        ctx.compile(bounds={T: 2}, outputs=[u, v], backend=backend).run()
    assert "2" in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_exception_inside_a_udf_or_sink_names_the_op_the_point_and_the_line(backend):
    def fails_at_two(value, point):
        if point["t"] == 2:
            raise KeyError("boom")
    ctx, t, T = ctx_t()
    with ctx:
        line = next_line()
        tp.sink(tp.symbol_value(t), fails_at_two, name="my_logger")
    with pytest.raises(KeyError) as info:  # the user's own exception, with a note added
        ctx.compile(bounds={T: 4}, backend=backend).run()
    note = "\n".join(info.value.__notes__)
    assert "'my_logger'" in note and "{'t': 2}" in note
    assert f"{THIS_FILE}:{line}" in note, note


@pytest.mark.parametrize("value,dtype", [(1.5, "int32"), ("float", "int32"), ("int", "bool")])
def test_a_branch_that_would_narrow_its_placeholders_dtype_is_an_error(value, dtype):
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.placeholder(shape=(), dtype=dtype, domain=(t,))
        source = {"float": tp.const(np.float32(0.5)), "int": tp.const(np.int32(3))}.get(value, value)
        with pytest.raises(tp.ShapeError) as info:
            line = next_line()
            x[0] = source
    assert dtype in str(info.value) and ".astype" in str(info.value)
    assert_site(info.value, line)


def test_a_branch_may_widen_to_its_placeholders_dtype():
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        x[0] = tp.const(np.int32(3))  # an int into a float: exact for these values, allowed
        x[t + 1] = x[t] + 0.5
    assert list(ctx.compile(bounds={T: 3}, outputs=[x], backend="numpy").run()[x]) == [3.0, 3.5, 4.0]

# ---- misuse of the API ----------------------------------------------------------------------
def test_reading_a_result_that_is_not_an_output():
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(np.arange(5, dtype=np.float32))[t]
        y = x + 1.0
    res = ctx.compile(bounds={T: 5}, outputs=[x], backend="numpy").run()
    with pytest.raises(tp.TempoError):
        res[y]


def test_output_of_another_context_is_rejected():
    ctx, t, T = ctx_t()
    other, t2, T2 = ctx_t()
    with ctx:
        x = tp.const(np.arange(5, dtype=np.float32))[t]
        x + 1.0
    with other:
        y = tp.const(np.arange(5, dtype=np.float32) * 100.0)[t2]
    with pytest.raises(tp.TempoError):
        ctx.compile(bounds={T: 5}, outputs=[y], backend="numpy").run()


def test_mixing_contexts_in_one_op():
    ctx, t, T = ctx_t()
    other, t2, T2 = ctx_t()
    with ctx:
        x = tp.const(np.ones(3, np.float32))
    with other:
        y = tp.const(np.ones(3, np.float32))
        with pytest.raises(tp.TempoError):
            y + x  # noqa: B018


def test_unknown_backend_and_no_active_context():
    ctx, T, y = _program_using_T()
    with pytest.raises(tp.TempoError) as info:
        ctx.compile(bounds={T: 5}, outputs=[y], backend="torch")
    assert "torch" in str(info.value)
    with pytest.raises(tp.TempoError):
        tp.const(np.ones(3))


def test_recurrent_tensor_has_no_truth_value():
    ctx, t, T = ctx_t()
    with ctx:
        x = tp.const(np.arange(5, dtype=np.float32))[t]
        with pytest.raises(tp.TempoError) as info:
            line = next_line()
            bool(x > 0)
        assert "tp.where" in str(info.value)
        assert_site(info.value, line)


# ---- review findings: bad input gives Tempo errors, not internal ones -------------------------
def _ctx_t():
    ctx = tp.Context(dims=("t",))
    return ctx, ctx.dims[0], ctx.bounds[0]


def test_non_integer_bound_is_a_bounds_error():
    ctx, t, T = _ctx_t()
    with ctx:
        x = tp.symbol_value(t)
    with pytest.raises(tp.BoundsError, match="must be an int"):
        ctx.compile({T: "abc"}, [x], backend="numpy")


def test_non_tensor_output_is_a_tempo_error():
    ctx, t, T = _ctx_t()
    with ctx:
        x = tp.symbol_value(t)
    with pytest.raises(tp.TempoError, match="outputs must be recurrent tensors"):
        ctx.compile({T: 2}, [x, 3], backend="numpy")


def test_empty_cat_and_stack_and_bad_dtypes_are_shape_errors():
    ctx, t, T = _ctx_t()
    with ctx:
        x = tp.symbol_value(t)
        for bad in (lambda: tp.cat([]), lambda: tp.stack([]), lambda: x.astype("notatype"),
                    lambda: tp.placeholder(dtype="foo"), lambda: tp.const(np.array(["a"])),
                    lambda: tp.const(np.ones(3, np.float32))[..., 0, 0],
                    lambda: tp.randint(5, 2, domain=(t,))):
            with pytest.raises(tp.ShapeError):
                bad()


def test_false_branch_condition_never_applies():
    ctx, t, T = _ctx_t()
    with ctx:
        y = tp.placeholder(shape=(), domain=(t,))
        y[False] = tp.const(1.0)
        y[True] = tp.const(2.0)
    np.testing.assert_array_equal(ctx.compile({T: 3}, [y], backend="numpy").run()[y], [2.0] * 3)


def test_sink_may_return_a_value():
    ctx, t, T = _ctx_t()
    seen = {}
    with ctx:
        tp.sink(tp.symbol_value(t), lambda v, p: seen.setdefault(p["t"], int(v)))
    ctx.compile({T: 3}, [], backend="numpy").run()
    assert seen == {0: 0, 1: 1, 2: 2}


def test_output_whose_shape_varies_with_the_point_is_rejected_at_compile():
    ctx, t, T = _ctx_t()
    with ctx:
        x = tp.symbol_value(t)
        prefix = x[0:t + 1]
    with pytest.raises(tp.TempoError, match="varies with the point"):
        ctx.compile({T: 3}, [prefix], backend="numpy")
