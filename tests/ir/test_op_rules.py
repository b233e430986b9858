"""Every registered op is accounted for by autodiff and by vectorization: it has a gradient
rule or a stated reason to have none, and a batching rule or a stated reason to have none,
so that an op cannot be half-added (docs/development.md, "Adding an op")."""

from __future__ import annotations

import tempo  # noqa: F401 - registers every op, the passes' included
import tempo.passes  # noqa: F401
from tempo.api.autodiff import VJPS
from tempo.ir.ops import OPS
from tempo.passes.vectorize import RULE_KINDS

NO_GRADIENT_RULE = {
    "detach": "stops gradients by definition",
    "merge": "autodiff's own rule: each branch gets the gradient where it was taken",
    "udf": "host code: no gradient flows through it",
    "traced_udf": "an environment step: no gradient flows through it",
    "sum_readers": "made by autodiff itself, after differentiation",
    "scatter_take": "made by autodiff (take's gradient); not differentiated again",
    "scatter_gather": "made by autodiff (gather's gradient); not differentiated again",
    "fused": "made by the fusion pass, after differentiation",
    "mask_rows": "made by the tiling pass, after differentiation",
    "window": "made by the tiling pass, after differentiation",
    "put_row": "made by the newest-rows pass, after differentiation",
    "shard": "made by the parallel pass under a Distribution, after differentiation",
    "linear_recurrence": "made by the lift pass, after differentiation",
}
NO_BATCHING_RULE = {
    "const": "has no point to batch over",
    "arange": "the vectorized form of eval_symbol; has no inputs",
    "eval_symbol": "a point op: batched by the runtime over a loop's points",
    "coords": "a point op: batched by the runtime over a loop's points",
    "udf": "host code; the parallel pass uses its batched form",
    "traced_udf": "the parallel pass vmaps it",
    "merge": "chooses a branch per point",
    "sum_readers": "vectorize's own rule (contract.whole_window_reads)",
    "fused": "made after vectorization",
    "mask_rows": "made after vectorization",
    "window": "made after vectorization (by the tiling pass)",
    "put_row": "made after vectorization (by the newest-rows pass)",
    "linear_recurrence": "made by the lift pass over the innermost dim, which its domain then lacks",
}


def test_every_op_has_a_gradient_rule_or_a_reason():
    missing = sorted(set(OPS) - set(VJPS) - set(NO_GRADIENT_RULE))
    assert not missing, (f"ops without a gradient rule (an elementwise op's derivatives in its register "
                         f"call, another op's rule in VJPS, or a reason here): {missing}")
    stale = sorted(k for k in NO_GRADIENT_RULE if k in VJPS or k not in OPS)
    assert not stale, f"listed as without a gradient rule but have one, or are gone: {stale}"


def test_every_op_has_a_batching_rule_or_a_reason():
    missing = sorted(set(OPS) - set(RULE_KINDS) - set(NO_BATCHING_RULE))
    assert not missing, f"ops without a vectorization rule (add one, or a reason here): {missing}"
    stale = sorted(k for k in NO_BATCHING_RULE if k in RULE_KINDS or k not in OPS)
    assert not stale, f"listed as without a vectorization rule but have one, or are gone: {stale}"
