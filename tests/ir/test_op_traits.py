"""The traits an op is registered with (``OpDef``) hold for its kernel: the passes act on
them (``tempo.passes.defer`` splits chains of ``linear`` ops, tiling pads ``keeps_zero``
ops with zeros), so a wrong trait would be a wrong program. Checked with NumPy against
the definitions of linearity, additivity and f(0) = 0 on random inputs."""

from __future__ import annotations

import numpy as np
import pytest

import tempo  # noqa: F401 - registers every op
from tempo.ir.ops import OPS, kinds_with

RNG = np.random.default_rng(3)


def _x(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


INDEX = np.array([2, 0, 1], np.int32)
ALONG = np.array([[1, 0, 2], [2, 2, 0]], np.int32)
EXAMPLES = {  # kind -> (params, a function making its inputs)
    "neg": ({}, lambda: [_x(2, 3)]),
    "add": ({}, lambda: [_x(2, 3), _x(3)]),
    "sub": ({}, lambda: [_x(2, 3), _x(2, 1)]),
    "mul": ({}, lambda: [_x(2, 3), _x(2, 3)]),
    "div": ({}, lambda: [_x(2, 3), np.abs(_x(2, 3)) + 0.5]),
    "where": ({}, lambda: [_x(2, 3) > 0, _x(2, 3), _x(3)]),
    "astype": ({"dtype": "float64"}, lambda: [_x(2, 3)]),
    "identity": ({}, lambda: [_x(2, 3)]),
    "detach": ({}, lambda: [_x(2, 3)]),
    "matmul": ({}, lambda: [_x(2, 3), _x(3, 4)]),
    "reduce_sum": ({"dims": (1,), "keepdims": False}, lambda: [_x(2, 3)]),
    "reduce_mean": ({"dims": (0, 1), "keepdims": True}, lambda: [_x(2, 3)]),
    "cumsum": ({"dim": 1}, lambda: [_x(2, 3)]),
    "discounted_sum": ({"dim": 1, "gamma": 0.9}, lambda: [_x(2, 3)]),
    "reshape": ({"shape": (3, 2)}, lambda: [_x(2, 3)]),
    "permute": ({"dims": (1, 0)}, lambda: [_x(2, 3)]),
    "expand": ({"shape": (4, 2, 3)}, lambda: [_x(2, 3)]),
    "squeeze": ({"dim": 0}, lambda: [_x(1, 3)]),
    "unsqueeze": ({"dim": 1}, lambda: [_x(2, 3)]),
    "slice": ({"dim": 1, "start": 1, "stop": 3}, lambda: [_x(2, 3)]),
    "pad": ({"dim": 1, "before": 1, "after": 2}, lambda: [_x(2, 3)]),
    "take": ({"dim": 1}, lambda: [_x(2, 3), INDEX]),
    "gather": ({"dim": 1}, lambda: [_x(2, 3), ALONG]),
    "scatter_take": ({"dim": 1, "size": 4}, lambda: [_x(2, 3), INDEX]),
    "scatter_gather": ({"dim": 1, "shape": (2, 3)}, lambda: [_x(2, 3), ALONG]),
    "tanh": ({}, lambda: [_x(2, 3)]),
    "sqrt": ({}, lambda: [np.abs(_x(2, 3))]),
    "abs": ({}, lambda: [_x(2, 3)]),
    "sin": ({}, lambda: [_x(2, 3)]),
    "floor": ({}, lambda: [_x(2, 3)]),
    "shard": ({"dim": 0}, lambda: [_x(2, 3)]),  # NumPy has no mesh: the value as it is
}
NO_KERNEL = {"sum_readers": "autodiff's transpose of an edge: the runtime sums what readers read"}


def _run(kind: str, params: dict, inputs: list) -> np.ndarray:
    return np.asarray(OPS[kind].kernel(np, params, *inputs), dtype=np.float64)


def test_every_op_with_a_trait_the_passes_act_on_has_an_example():
    acted_on = kinds_with("linear") | kinds_with("keeps_zero")
    missing = sorted(acted_on - set(EXAMPLES) - set(NO_KERNEL))
    assert not missing, f"ops with linear/keeps_zero traits and no example here: {missing}"


@pytest.mark.parametrize("kind", sorted(kinds_with("linear") - set(NO_KERNEL)))
def test_a_linear_op_is_linear_in_its_linear_inputs(kind):
    """Each linear input on its own, the others fixed; an additive op's all together."""
    params, make = EXAMPLES[kind]
    d = OPS[kind]
    groups = [d.linear] if d.additive else [(k,) for k in d.linear]
    for group in groups:
        base, u, v = make(), make(), make()
        a, b = 0.7, -1.3

        def at(values, base=base, group=group):
            return _run(kind, params, [values[k] if k in group else x for k, x in enumerate(base)])
        mixed = [a * x + b * y for x, y in zip(u, v)]
        np.testing.assert_allclose(at(mixed), a * at(u) + b * at(v), rtol=1e-5, atol=1e-5,
                                   err_msg=f"{kind} inputs {group}")


@pytest.mark.parametrize("kind", sorted(kinds_with("additive")))
def test_an_additive_op_is_the_sum_of_one_term_per_linear_input(kind):
    params, make = EXAMPLES[kind]
    inputs = make()
    linear = OPS[kind].linear
    terms = [_run(kind, params, [x if j == k or j not in linear else np.zeros_like(x)
                                 for j, x in enumerate(inputs)]) for k in linear]
    np.testing.assert_allclose(_run(kind, params, inputs), sum(terms), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(kinds_with("keeps_zero")))
def test_a_zero_keeping_op_maps_zeros_to_zeros(kind):
    params, make = EXAMPLES[kind]
    (x,) = make()
    zeros = np.zeros_like(x)
    assert np.all(_run(kind, params, [zeros]) == 0)
    assert OPS[kind].elementwise


def test_ops_of_a_kind_are_elementwise_or_work_along_axes_not_both():
    for name, d in OPS.items():
        assert sum((d.elementwise, d.reduction, d.along_dim)) <= 1, name
        assert not d.additive or d.linear, name
