"""The compile cache (``tempo.cache``): a second compile of a program reuses isl's schedule
and XLA's programs, gives the same values, and survives damaged or missing entries."""

import os
from pathlib import Path

import numpy as np
import pytest

import tempo as tp
from tempo import cache
from tempo.schedule import ast
from tempo.schedule import scheduler as scheduler_module
from tempo.schedule.scheduler import AST_ENTRY, SCHEDULE_ENTRY


@pytest.fixture
def cache_dir(tmp_path):
    """A fresh cache directory for one test; the session's afterwards."""
    cache.set_cache_dir(tmp_path / "cache")
    yield tmp_path / "cache"
    cache.set_cache_dir(os.environ.get(cache.ENV))
    cache.enable_jax_cache()


def _program(length: int = 40):
    """``s[t] = 0.5 s[t-1] + x[t]`` and ``g[t] = sum_{k>=t} 0.9^(k-t) x[k]``."""
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    xs = np.linspace(-1.0, 1.0, length).astype(np.float32)
    with ctx:
        x = tp.const(xs)[t]
        s = tp.placeholder(shape=(), dtype="float32", domain=(t,))
        s[0] = x[0]
        s[t + 1] = s * 0.5 + x[t + 1]
        g = x[t:T].discounted_sum(0.9)
    expected_s = np.zeros(length)
    for k in range(length):
        expected_s[k] = xs[k] + (0.5 * expected_s[k - 1] if k else 0.0)
    expected_g = np.array([sum(0.9 ** (k - n) * xs[k] for k in range(n, length)) for n in range(length)])
    return ctx, {T: length}, [s, g], [expected_s, expected_g]


def _compile_and_check(backend: str):
    ctx, bounds, outputs, expected = _program()
    exe = ctx.compile(bounds, outputs, backend=backend)
    res = exe.run()
    for rt, want in zip(outputs, expected):
        np.testing.assert_allclose(res[rt], want, rtol=1e-5, atol=1e-5)
    return exe


def _entries(root: Path, kind: str = SCHEDULE_ENTRY) -> list[Path]:
    return sorted((root / kind).glob("*.txt"))


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_second_compile_reuses_the_schedule(cache_dir, backend):
    first = _compile_and_check(backend)
    assert not any("compile cache" in n for n in first.report.notes)
    assert len(_entries(cache_dir)) == 1
    second = _compile_and_check(backend)
    assert any("isl's schedule from the compile cache" in n for n in second.report.notes)
    assert second.schedule.isl_schedule.get_map().is_equal(first.schedule.isl_schedule.get_map())


def test_a_damaged_entry_is_computed_again_and_rewritten(cache_dir):
    _compile_and_check("numpy")
    (entry,) = _entries(cache_dir)
    entry.write_text("{ domain: this is not isl")
    again = _compile_and_check("numpy")
    assert not any("compile cache" in n for n in again.report.notes)
    assert entry.read_text().startswith("{ domain: \"")  # rewritten with the real schedule
    assert any("compile cache" in n for n in _compile_and_check("numpy").report.notes)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_second_compile_reuses_the_loop_program(cache_dir, backend, monkeypatch):
    first = _compile_and_check(backend)
    assert len(_entries(cache_dir, AST_ENTRY)) == 1

    def not_again(*args, **kwargs):
        raise AssertionError("the loop program was generated again")
    monkeypatch.setattr(scheduler_module, "schedule_tree", not_again)
    second = _compile_and_check(backend)
    assert second.schedule.root == first.schedule.root
    assert second.source == first.source


def test_a_damaged_loop_program_is_made_again_and_rewritten(cache_dir):
    first = _compile_and_check("numpy")
    (entry,) = _entries(cache_dir, AST_ENTRY)
    stmt = next(ast.statements(first.schedule.root)).name
    for damaged in ('["seq", [["stmt", "S1; import os", []]]]',  # not one of its statements
                    f'["seq", [["stmt", "{stmt}", [["sym", "__import__(\'os\')", "loop"]]]]]',
                    f'["seq", [["stmt", "{stmt}", [["sym", "eval", "dim"]]]]]',  # a builtin read
                    # a builtin bound: later ``min(...)`` would call ``eval``
                    f'["loop", ["sym", "min", "loop"], ["const", 0], ["lt", ["sym", "min", "loop"], '
                    f'["const", 1]], 1, ["stmt", "{stmt}", [["min", ["const", 1], ["const", 2]]]]]',
                    f'["loop", ["sym", "c0", "loop"], ["const", 0], ["lt", ["sym", "c0", "loop"], '
                    f'["const", 1]], 0, ["stmt", "{stmt}", []]]',  # a step of 0: no end
                    '["seq", [["loop", ["sym", "c0", "loop"], ["const", 0], ["exec", 1, 2], 1, '
                    '["seq", []]]]]',  # an operation of no expression
                    '["seq", [["stmt"',  # cut short
                    "not json"):
        with pytest.raises(ValueError):
            ast.from_text(damaged, first.schedule.statements)
        entry.write_text(damaged)
        again = _compile_and_check("numpy")
        assert again.schedule.root == first.schedule.root
        assert ast.from_text(entry.read_text(), first.schedule.statements) == first.schedule.root


def test_a_loop_program_reads_back_as_it_was_written():
    ctx, bounds, outputs, _ = _program()
    root = ctx.compile(bounds, outputs, backend="numpy").schedule.root
    names = [stmt.name for stmt in ast.statements(root)]
    assert ast.from_text(ast.to_text(root), names) == root
    with pytest.raises(ValueError, match="not a node"):
        ast.from_text(ast.to_text(root), names[1:])


def test_off_writes_nothing(tmp_path):
    cache.set_cache_dir("off")
    try:
        assert cache.cache_dir() is None
        _compile_and_check("numpy")
        _compile_and_check("numpy")
    finally:
        cache.set_cache_dir(os.environ.get(cache.ENV))
    assert not list(tmp_path.iterdir())


def test_the_environment_variable_chooses_the_directory(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "mine"))
    assert cache.default_cache_dir() == tmp_path / "mine"
    monkeypatch.setenv(cache.ENV, "off")
    assert cache.default_cache_dir() is None
    monkeypatch.delenv(cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.default_cache_dir() == tmp_path / "xdg" / "tempo"


def test_xla_programs_go_to_the_cache_directory(cache_dir):
    import jax
    import jax.numpy as jnp

    assert cache.enable_jax_cache() == cache_dir / "jax"
    assert jax.config.jax_compilation_cache_dir == str(cache_dir / "jax")
    # a program this process has not compiled before: JAX writes it
    jax.jit(lambda v: jnp.cos(v) * 3.25 + 0.125)(jnp.arange(7.0)).block_until_ready()
    assert list((cache_dir / "jax").iterdir())


def test_an_entry_without_an_access_time_does_not_stop_the_cache(cache_dir):
    """An XLA entry left without JAX's access-time file (written with no size cap, or by
    a process killed between the two writes) would make every later write fail."""
    import warnings

    import jax
    import jax.numpy as jnp

    jax_dir = cache_dir / "jax"
    jax_dir.mkdir(parents=True)
    orphan = jax_dir / ("jit_old-" + "0" * 64 + "-cache")
    orphan.write_bytes(b"an entry of an earlier run")
    cache.enable_jax_cache()
    before = set(jax_dir.glob("*-cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # JAX warns when it cannot write an entry
        jax.jit(lambda v: jnp.sin(v) * 1.75 - 0.375)(jnp.arange(5.0)).block_until_ready()
    assert set(jax_dir.glob("*-cache")) - before  # the new program was written
    assert (jax_dir / ("jit_old-" + "0" * 64 + "-atime")).exists()


def _last_iteration_program(iterations: int):
    """Over (i, t): ``s[i, t] = 0.5 s[i, t-1] + x[t] + h[i]``, ``h[i+1] = tanh(h[i] + 0.1
    s[i, T-1])``; ``2 h`` read at the last iteration only and ``3 h`` at the first only,
    with their expected values."""
    ctx = tp.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    xs = np.linspace(-1.0, 1.0, 6).astype(np.float32)
    with ctx:
        x = tp.const(xs)[t]
        h = tp.placeholder(shape=(), dtype="float32", domain=(i,))
        s = tp.placeholder(shape=(), dtype="float32", domain=(i, t))
        s[t == 0] = x + h
        s[True] = s[i, t - 1] * 0.5 + x + h
        h[0] = tp.const(np.float32(0.25))
        h[i + 1] = (h[i] + s[i, T - 1] * 0.1).tanh()
        last = (h * 2.0)[I - 1]
        first = (h * 3.0)[0]
    state = 0.25
    for _ in range(iterations - 1):
        run = 0.0
        for k, value in enumerate(xs):
            run = (0.5 * run if k else 0.0) + value + state
        state = np.tanh(state + 0.1 * run)
    return ctx, {I: iterations, T: len(xs)}, [last, first], [2.0 * state, 0.75]


def test_a_schedule_serves_every_length_of_the_outer_loop(cache_dir):
    """isl's schedule is kept for the program's structure: values needed at the last or the
    first iteration only are described relative to the bound or as 0, so a compile for
    another number of iterations (a longer training run) takes the schedule from the cache."""
    notes = []
    for iterations in (5, 9):
        ctx, bounds, outputs, expected = _last_iteration_program(iterations)
        exe = ctx.compile(bounds, outputs, backend="numpy")
        results = exe.run()
        for rt, want in zip(outputs, expected):
            np.testing.assert_allclose(results[rt], want, rtol=1e-5)
        notes.append(any("isl's schedule from the compile cache" in n for n in exe.report.notes))
    assert notes == [False, True]
    assert len(_entries(cache_dir)) == 1


def test_constraints_without_a_schedule_are_kept_as_such(cache_dir, monkeypatch):
    """isl finding no schedule is kept too (a compile that then tries the program without
    joined siblings, say, does not search again), and a later lookup says so without
    asking isl."""
    isl = scheduler_module.isl
    domain = isl.UnionSet.read_from_str(scheduler_module.ISL, "{ A[i] : 0 <= i < 3; B[i] : 0 <= i < 3 }")
    cycle = isl.UnionMap.read_from_str(scheduler_module.ISL, "{ A[i] -> B[i]; B[i] -> A[i] }")
    constraints = isl.ScheduleConstraints.on_domain(domain).set_validity(cycle)
    assert scheduler_module._cached_schedule(constraints) == (None, False)
    (entry,) = _entries(cache_dir)
    assert entry.read_text() == scheduler_module.NO_SCHEDULE

    def not_again(self):
        raise AssertionError("isl searched again")
    monkeypatch.setattr(isl.ScheduleConstraints, "compute_schedule", not_again)
    assert scheduler_module._cached_schedule(constraints) == (None, True)
