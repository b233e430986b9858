"""A parallel dim split over a device mesh (``tp.Distribution``): the same values as the
one-device run and the reference evaluator, stored values actually split over the devices,
and the errors of a distribution that cannot be made.

JAX makes several CPU devices only when ``XLA_FLAGS`` asks for them before it is imported,
and this process imported it already: every check over several devices runs in a fresh
interpreter that prints its results as JSON on its last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tempo as tp
from tempo.reference import evaluate

ROOT = Path(__file__).resolve().parents[2]
DEVICES = 4

# The program, as source: the subprocesses build it too. A recurrence over t in each env b,
# a loss over every env's steps and its gradient, which sums over b (across devices when b
# is split).
PROGRAM = textwrap.dedent("""
    import numpy as np
    import tempo as tp

    T_VALUE, H = 5, 3

    def program(num_envs, parallel=("b",)):
        rng = np.random.default_rng(0)
        xs = rng.normal(size=(num_envs, T_VALUE, H)).astype(np.float32)
        w0 = rng.normal(size=(H, H)).astype(np.float32) * 0.5
        ctx = tp.Context(dims=("b", "t"), parallel=parallel)
        (b, t), (B, T) = ctx.dims, ctx.bounds
        with ctx:
            w = tp.const(w0, requires_grad=True)
            x = tp.const(xs)[b, t]
            s = tp.placeholder(shape=(H,), dtype="float32", domain=(b, t))
            s[b, 0] = x @ w
            s[b, t + 1] = 0.5 * s + x[b, t + 1] @ w
            loss = (s * s).sum()[0:B, 0:T].sum()
            loss.backward()
        return ctx, {B: num_envs, T: T_VALUE}, [s, w.grad]

    def kinds(exe):
        # op kinds of the optimized graph, the members of fused ops included
        found = []
        for op in exe.graph.ops.values():
            found.append(op.kind)
            if op.kind == "fused":
                found.extend(m.kind for m in op.params["members"])
        return found
""")

VALUES = PROGRAM + textwrap.dedent("""
    import json
    import jax
    from tempo.reference import evaluate

    out = {"devices": jax.device_count()}
    ctx, bounds, outputs = program(8)
    ref = evaluate(ctx, bounds, outputs)
    out["reference"] = [np.asarray(ref[rt.key]).tolist() for rt in outputs]
    for name, dist in [("one", None), ("four", tp.Distribution(devices=4)),
                       ("two", tp.Distribution(devices=2))]:
        exe = ctx.compile(bounds, outputs, backend="jax", distribution=dist)
        got = exe.run()
        # per program run one at a time or not: those holding a collective (the sum over
        # b of the gradient) and the others
        waits = [*exe.backend._collectives.values(),
                 *(w for launch in exe._launchers.values() for w in launch.collective.values())]
        out[name] = {"values": [np.asarray(got[rt]).tolist() for rt in outputs],
                     "split_peak": exe.stats.split.run_peak,
                     "device_peak": exe.stats.peak_device_bytes,
                     "shards": kinds(exe).count("shard"),
                     "one_at_a_time": exe.backend.one_at_a_time,
                     "collective_programs": waits.count(True), "other_programs": waits.count(False)}
    print(json.dumps(out))
""")

ERRORS = PROGRAM + textwrap.dedent("""
    import json
    import jax

    def error_of(build, backend="jax", devices=4):
        ctx, bounds, outputs = build()
        try:
            ctx.compile(bounds, outputs, backend=backend, distribution=tp.Distribution(devices=devices))
        except Exception as err:
            return {"type": type(err).__name__, "tempo": isinstance(err, tp.TempoError),
                    "message": str(err)}
        return None

    print(json.dumps({
        "devices": jax.device_count(),
        "uneven": error_of(lambda: program(6)),
        "too_many": error_of(lambda: program(8), devices=8),
        "numpy": error_of(lambda: program(8), backend="numpy"),
        "not_parallel": error_of(lambda: program(8, parallel=())),
    }))
""")


def _run_with_devices(code: str, devices: int = DEVICES, timeout: int = 240) -> dict:
    """Run ``code`` in a fresh interpreter where JAX sees ``devices`` CPU devices; its last
    line of output, parsed."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output\n{done.stderr[-5000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def split_runs() -> dict:
    runs = _run_with_devices(VALUES)
    assert runs["devices"] == DEVICES, "XLA_FLAGS did not make the CPU devices"
    return runs


def _assert_values(got: list, expected: list, rtol: float, atol: float, what: str) -> None:
    for k, name in enumerate(("s", "w.grad")):
        a, b = np.asarray(got[k]), np.asarray(expected[k])
        assert a.shape == b.shape, (what, name, a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{what}: {name}")


@pytest.mark.parametrize("devices", ["four", "two"])
def test_split_run_equals_the_one_device_run_and_the_reference(split_runs, devices):
    run, one = split_runs[devices], split_runs["one"]
    reference = split_runs["reference"]
    _assert_values(run["values"], one["values"], rtol=1e-6, atol=1e-6, what=f"{devices} vs one device")
    _assert_values(run["values"], reference, rtol=1e-5, atol=1e-6, what=f"{devices} vs reference")
    _assert_values(one["values"], reference, rtol=1e-5, atol=1e-6, what="one device vs reference")


@pytest.mark.parametrize("devices", ["four", "two"])
def test_split_run_places_values_on_the_mesh(split_runs, devices):
    run = split_runs[devices]
    assert run["shards"] > 0, "the optimized graph has no shard op"
    assert 0 < run["split_peak"] <= run["device_peak"], run


@pytest.mark.parametrize("devices", ["four", "two"])
def test_only_programs_holding_collectives_run_one_at_a_time(split_runs, devices):
    """Over several CPU devices a program holding a collective runs alone (several in
    flight deadlock in XLA's CPU collectives); the others, here the recurrence over t in
    each env, are dispatched as on one device."""
    run = split_runs[devices]
    assert run["one_at_a_time"]
    assert run["collective_programs"] > 0 and run["other_programs"] > 0, run


# A weight read at every (b, t) outside any recurrence: its gradient is one matmul
# contracting every point's product (``tempo.passes.contract``), over the steps t laid out
# (``vectorize``) of values whose rows are the split envs b (``parallel``).
CONTRACTION = textwrap.dedent("""
    import json
    import jax
    import numpy as np
    import tempo as tp
    from tempo.reference import evaluate
    from tempo.runtime.backends import JaxBackend

    gathers = []  # per program compiled: whether it gathers a split value onto every device
    holds = JaxBackend.holds_collectives

    def recording(self, compiled):
        gathers.append("all-gather" in compiled.as_text())
        return holds(self, compiled)
    JaxBackend.holds_collectives = recording
    rng = np.random.default_rng(1)
    ctx = tp.Context(dims=("b", "t"), parallel=("b",))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(rng.normal(size=(3, 4)).astype(np.float32), requires_grad=True)
        x = tp.const(rng.normal(size=(8, 6, 3)).astype(np.float32))[b, t]
        loss = ((x @ w).tanh() ** 2).sum()[0:B, 0:T].sum()
        loss.backward()
    bounds = {B: 8, T: 6}
    out = {"reference": np.asarray(evaluate(ctx, bounds, [w.grad])[w.grad.key]).tolist()}
    for devices in (4, 2):
        gathers.clear()
        exe = ctx.compile(bounds, [w.grad], backend="jax", distribution=tp.Distribution(devices=devices))
        out[str(devices)] = {"grad": np.asarray(exe.run()[w.grad]).tolist(),
                             "gathering": gathers.count(True), "collective": len(gathers)}
    print(json.dumps(out))
""")


def test_a_gradient_summed_over_split_envs_gathers_nothing():
    """The contraction's merged axis keeps the split env rows major (``split_rows``): each
    device sums its own envs' products and one all-reduce adds the parts (with the steps
    major, XLA gathered the whole stacked rollout onto every device first, and every
    device computed every product). The gradient is the reference evaluator's."""
    runs = _run_with_devices(CONTRACTION)
    for devices in ("4", "2"):
        np.testing.assert_allclose(runs[devices]["grad"], runs["reference"], rtol=1e-5, atol=1e-5)
        assert runs[devices]["collective"] > 0, runs[devices]  # the all-reduce
        assert runs[devices]["gathering"] == 0, runs[devices]


# Keeps the text of each program compiled for the mesh in ``texts``.
RECORDING = textwrap.dedent("""
    import json
    import re
    import numpy as np
    import tempo as tp
    from tempo.reference import evaluate
    from tempo.runtime.backends import JaxBackend

    texts = []  # each program compiled for the mesh
    holds = JaxBackend.holds_collectives

    def recording(self, compiled):
        texts.append(compiled.as_text())
        return holds(self, compiled)
    JaxBackend.holds_collectives = recording
""")

# A minibatch: 64 of the 128 (b, t) rows, drawn by a list of indices from the rollout split
# by env, then a product with a shared weight (PPO's update reads its rollout this way).
MINIBATCH = RECORDING + textwrap.dedent("""
    rng = np.random.default_rng(2)
    E, S, H, N = 8, 16, 3, 64
    ctx = tp.Context(dims=("b", "t"), parallel=("b",))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(rng.normal(size=(H, 5)).astype(np.float32), requires_grad=True)
        x = (tp.const(rng.normal(size=(E, S, H)).astype(np.float32))[b, t] * 2.0).tanh()
        index = tp.const(rng.permutation(E * S)[:N].astype(np.int32))
        rows = x[0:B, 0:T].reshape(E * S, H)[index]
        loss = ((rows @ w).tanh() ** 2).sum()
        loss.backward()
    bounds = {B: E, T: S}
    exe = ctx.compile(bounds, [w.grad], backend="jax", distribution=tp.Distribution(devices=4))
    grad = np.asarray(exe.run()[w.grad]).tolist()
    # the rows of the product rows @ w (shape (rows, 5)) in each device's program
    products = [int(n) for text in texts
                for n in re.findall(r"= f32\\[(\\d+),5\\]\\{[^}]*\\} (?:dot|fusion)\\(", text)]
    print(json.dumps({"reference": np.asarray(evaluate(ctx, bounds, [w.grad])[w.grad.key]).tolist(),
                      "grad": grad, "product_rows": products}))
""")


def test_rows_taken_from_split_envs_stay_split():
    """A minibatch drawn from the split rollout by a list of indices stays split over the
    devices (``XlaNamespace.split_rows``): each device multiplies its 16 of the 64 rows
    (before, every device multiplied all 64). The gradient is the reference evaluator's."""
    run = _run_with_devices(MINIBATCH)
    np.testing.assert_allclose(run["grad"], run["reference"], rtol=1e-5, atol=1e-5)
    assert 16 in run["product_rows"] and 64 not in run["product_rows"], run["product_rows"]


MINIBATCH_LOOP = RECORDING + textwrap.dedent("""
    rng = np.random.default_rng(3)
    E, S, H, N, K = 8, 16, 3, 32, 6
    ctx = tp.Context(dims=("b", "t", "k"), parallel=("b",))
    (b, t, k), (B, T, K_) = ctx.dims, ctx.bounds
    with ctx:
        w = tp.const(rng.normal(size=(H, 5)).astype(np.float32))
        x = (tp.const(rng.normal(size=(E, S, H)).astype(np.float32))[b, t] * 2.0).tanh()
        index = tp.const(np.stack([rng.permutation(E * S)[:N] for _ in range(K)]).astype(np.int32))[k]
        out = ((x[0:B, 0:T].reshape(E * S, H)[index] @ w).tanh()).sum(0)
    bounds = {B: E, T: S, K_: K}
    exe = ctx.compile(bounds, [out], backend="jax", distribution=tp.Distribution(devices=4),
                      loops=tp.LoopPolicy(mode="lowered"))
    got = np.asarray(exe.run()[out]).tolist()
    in_loops, gathered = [], []  # (shape, collective) inside loop bodies; all-gathered shapes
    collective = r"= (\\S+) (all-reduce|all-gather|all-to-all|collective-permute)\\("
    for text in texts:
        gathered += [shape for shape, kind in re.findall(collective, text) if kind == "all-gather"]
        for body in set(re.findall(r"body=(%[\\w.\\-]+)", text)):
            computation = re.search(re.escape(body) + r" \\(.*?\\n\\}", text, re.S).group(0)
            in_loops += re.findall(collective, computation)
    print(json.dumps({"reference": np.asarray(evaluate(ctx, bounds, [out])[out.key]).tolist(),
                      "got": got, "in_loops": in_loops, "gathered": gathered}))
""")


def test_rows_taken_in_a_loop_are_gathered_once_before_it():
    """Minibatches drawn at each step of a loop from rows split over the devices: the rows
    are gathered to every device once, before the loop (``XlaNamespace.gather_source``),
    and the loop's only collective is the sum over the split minibatch rows (before: at
    every step, the indices all-gathered and the masked rows all-reduced too)."""
    run = _run_with_devices(MINIBATCH_LOOP)
    np.testing.assert_allclose(run["got"], run["reference"], rtol=1e-5, atol=1e-5)
    assert [kind for _, kind in run["in_loops"]] == ["all-reduce"], run["in_loops"]
    assert run["in_loops"][0][0].startswith("f32[5]"), run["in_loops"]
    assert any(shape.startswith("f32[128,3]") for shape in run["gathered"]), run["gathered"]


def test_few_rows_taken_in_a_loop_leave_their_source_split():
    """4 rows of 128 a step: a whole copy would cost more than 16 times the rows
    (``GATHER_WHOLE_MAX_RATIO``), so the rows are gathered from the split source at each
    step, as XLA does it (the indices all-gathered, the masked rows summed)."""
    sizes = "E, S, H, N, K = 8, 16, 3, 32, 6"
    assert sizes in MINIBATCH_LOOP
    run = _run_with_devices(MINIBATCH_LOOP.replace(sizes, "E, S, H, N, K = 8, 16, 3, 4, 6"))
    np.testing.assert_allclose(run["got"], run["reference"], rtol=1e-5, atol=1e-5)
    assert not any(shape.startswith("f32[128,3]") for shape in run["gathered"]), run["gathered"]
    assert "all-gather" in [kind for _, kind in run["in_loops"]], run["in_loops"]


def test_one_device_run_splits_nothing(split_runs):
    one = split_runs["one"]
    assert one["shards"] == 0
    assert one["split_peak"] == 0 and one["device_peak"] > 0


def test_distributions_that_cannot_be_made_are_errors():
    errors = _run_with_devices(ERRORS)
    assert errors["devices"] == DEVICES
    for name in ("uneven", "too_many", "numpy", "not_parallel"):
        err = errors[name]
        assert err is not None, f"{name}: compiled without an error"
        assert err["tempo"], f"{name}: {err['type']}: {err['message']}"
    assert "cannot split evenly" in errors["uneven"]["message"], errors["uneven"]
    assert "xla_force_host_platform_device_count" in errors["too_many"]["message"], errors["too_many"]
    assert "jax" in errors["numpy"]["message"], errors["numpy"]
    assert "parallel" in errors["not_parallel"]["message"], errors["not_parallel"]


@pytest.mark.parametrize("devices", [0, -1, True, 2.0])
def test_distribution_needs_a_positive_number_of_devices(devices):
    with pytest.raises(ValueError, match="devices"):
        tp.Distribution(devices=devices)


def test_without_a_distribution_nothing_is_placed():
    """In this process (one device): no shard op, nothing split, the reference's values."""
    scope: dict = {}
    exec(PROGRAM, scope)
    ctx, bounds, outputs = scope["program"](8)
    exe = ctx.compile(bounds, outputs, backend="jax")
    got = exe.run()
    assert "shard" not in scope["kinds"](exe)
    assert exe.stats.split.run_peak == 0
    ref = evaluate(ctx, bounds, outputs)
    for rt in outputs:
        np.testing.assert_allclose(np.asarray(got[rt]), ref[rt.key], rtol=1e-5, atol=1e-6)
