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


def test_several_updates_per_iteration_match_optax():
    """Parameters over ``(i, u)``: U Adam steps on minibatches within each iteration, the
    next iteration starting from the last; ``model.at(i, 0)`` reads each iteration's start."""
    iterations, updates = 3, 4
    batches = X.reshape(updates, 4, 1)
    ctx = tp.Context(dims=("i", "u"))
    i, u = ctx.dims
    I, U = ctx.bounds
    with ctx:
        model = nn.MLP(1, [8], 1, activation="tanh", domain=(i, u))
        init = {n: p.initial.op.params["value"].copy() for n, p in model.named_parameters()}
        xb = tp.const(batches)[u]
        loss = ((model(xb) - xb.sin()) ** 2).mean()
        loss.backward()
        adam = optim.Adam(model.parameters(), 0.01, max_grad_norm=0.5)
        adam.step()
        start = model.at(i, 0)(tp.const(X))
        saved = adam.checkpoint_state()
    outputs = [*model.parameters(), start, saved["param0"]]
    res = ctx.compile(bounds={I: iterations, U: updates}, outputs=outputs, backend="numpy").run()

    tx = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(0.01))
    params = {n: jnp.asarray(v) for n, v in init.items()}
    state = tx.init(params)
    trajectory = []
    for step in range(iterations * updates):
        trajectory.append(params)
        xb = batches[step % updates]
        grads = jax.grad(lambda p: ((_mlp_jax(p, xb) - np.sin(xb)) ** 2).mean())(params)
        upd, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, upd)
    trajectory.append(params)
    for (n, _), p in zip(model.named_parameters(), model.parameters()):
        expected = np.stack([np.asarray(t[n]) for t in trajectory[:-1]]).reshape(res[p].shape)
        np.testing.assert_allclose(res[p], expected, rtol=1e-5, atol=1e-5, err_msg=n)
    starts = np.stack([np.asarray(_mlp_jax(trajectory[k * updates], X)) for k in range(iterations)])
    np.testing.assert_allclose(res[start], starts, rtol=1e-5, atol=1e-5)
    after = np.stack([np.asarray(trajectory[(k + 1) * updates]["layer0.weight"])
                      for k in range(iterations)])
    np.testing.assert_allclose(res[saved["param0"]], after, rtol=1e-5, atol=1e-5)


def test_one_optimizer_steps_parameters_of_one_domain():
    ctx = tp.Context(dims=("i", "u"))
    i, u = ctx.dims
    with ctx:
        a = nn.Linear(2, 2, domain=(i,))
        b = nn.Linear(2, 2, domain=(i, u))
        with pytest.raises(tp.TempoError, match="one optimizer steps parameters of one domain"):
            optim.Adam(a.parameters() + b.parameters(), 1e-3)
