"""Optimizer trajectories equal optax's, step for step, on a small MLP regression."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tempo as tp
from tempo.api import nn, optim

ITERATIONS = 20
X = np.random.default_rng(1).uniform(-2, 2, (16, 1)).astype(np.float32)
Y = np.sin(X)


def _mlp_jax(params, x):
    h = jnp.tanh(x @ params["layer0.weight"] + params["layer0.bias"])
    return h @ params["layer1.weight"] + params["layer1.bias"]


CASES = {
    "sgd": (lambda ps, lr, clip: optim.SGD(ps, lr, max_grad_norm=clip), lambda lr: optax.sgd(lr)),
    "sgd momentum": (lambda ps, lr, clip: optim.SGD(ps, lr, momentum=0.9, max_grad_norm=clip),
                     lambda lr: optax.sgd(lr, momentum=0.9)),
    "sgd nesterov": (lambda ps, lr, clip: optim.SGD(ps, lr, momentum=0.9, nesterov=True,
                                                    max_grad_norm=clip),
                     lambda lr: optax.sgd(lr, momentum=0.9, nesterov=True)),
    "adam": (lambda ps, lr, clip: optim.Adam(ps, lr, max_grad_norm=clip), lambda lr: optax.adam(lr)),
    "adamw": (lambda ps, lr, clip: optim.AdamW(ps, lr, weight_decay=0.05, max_grad_norm=clip),
              lambda lr: optax.adamw(lr, weight_decay=0.05)),
    "rmsprop": (lambda ps, lr, clip: optim.RMSprop(ps, lr, max_grad_norm=clip),
                lambda lr: optax.rmsprop(lr)),
}


@pytest.mark.parametrize("schedule", [False, True], ids=["constant lr", "decaying lr + clip"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_trajectory_matches_optax(name, schedule):
    ours, theirs = CASES[name]
    base = 0.05 if name.startswith("sgd") else 0.01
    ctx = tp.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        model = nn.MLP(1, [8], 1, activation="tanh", domain=(i,))
        init = {n: p.initial.op.params["value"].copy() for n, p in model.named_parameters()}
        loss = ((model(tp.const(X)) - tp.const(Y)) ** 2).mean()
        loss.backward()
        lr = base * 0.9 ** tp.symbol_value(i).astype("float32") if schedule else base
        ours(model.parameters(), lr, 0.05 if schedule else None).step()
    res = ctx.compile(bounds={I: ITERATIONS}, outputs=model.parameters(), backend="numpy").run()

    tx = theirs(optax.exponential_decay(base, 1, 0.9) if schedule else base)
    if schedule:
        tx = optax.chain(optax.clip_by_global_norm(0.05), tx)
    params = {n: jnp.asarray(v) for n, v in init.items()}
    state = tx.init(params)
    trajectory = []
    grad_fn = jax.grad(lambda p: ((_mlp_jax(p, X) - Y) ** 2).mean())
    for _ in range(ITERATIONS):
        trajectory.append(params)
        updates, state = tx.update(grad_fn(params), state, params)
        params = optax.apply_updates(params, updates)
    for (n, _), p in zip(model.named_parameters(), model.parameters()):
        expected = np.stack([np.asarray(t[n]) for t in trajectory])
        # float32 on both sides; XLA's CPU code (FMA or not) differs between machines, and
        # RMSprop's 1/sqrt(nu) amplifies last-bit differences over 20 steps to ~2e-6.
        np.testing.assert_allclose(res[p], expected, rtol=1e-5, atol=1e-5, err_msg=n)


def test_optimizer_needs_parameters_over_an_iteration_dim():
    ctx = tp.Context(dims=("i",))
    with ctx:
        w = tp.const(np.ones(3, np.float32), requires_grad=True)
        with pytest.raises(tp.TempoError, match="iteration dim"):
            optim.Adam([w], 1e-3)
        with pytest.raises(tp.TempoError, match="not a parameter"):
            optim.Adam([tp.const(np.ones(3, np.float32))], 1e-3)
