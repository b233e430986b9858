"""Distributions: closed-form log-probabilities and entropies, statistically sound and
reproducible samples."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import tempo as tp
from tempo.api.distributions import Bernoulli, Categorical, Normal

LOGITS = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
N = 3000


def _run(ctx, outputs, bounds):
    return ctx.compile(bounds=bounds, outputs=outputs, backend="numpy").run()


def _categorical_program(seed):
    ctx = tp.Context(dims=("t",), seed=seed)
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        logits = tp.const(LOGITS) + tp.symbol_value(t).astype("float32") * 0.0
        dist = Categorical(logits)
        sample = dist.sample()
        lp = dist.log_prob(tp.symbol_value(t % 4))
        ent = dist.entropy()
        mode = dist.mode()
    return ctx, T, [sample, lp, ent, mode]


def test_categorical_log_prob_entropy_mode_closed_form():
    ctx, T, (sample, lp, ent, mode) = _categorical_program(0)
    res = _run(ctx, [lp, ent, mode], {T: 8})
    log_p = LOGITS - np.log(np.exp(LOGITS).sum())
    np.testing.assert_allclose(res[lp], log_p[np.arange(8) % 4], rtol=1e-6)
    np.testing.assert_allclose(res[ent], -(np.exp(log_p) * log_p).sum(), rtol=1e-6)
    assert (res[mode] == 2).all()


def test_categorical_samples_follow_the_probabilities():
    ctx, T, (sample, *_) = _categorical_program(0)
    counts = np.bincount(_run(ctx, [sample], {T: N})[sample], minlength=4)
    probs = np.exp(LOGITS) / np.exp(LOGITS).sum()
    chi2 = ((counts - N * probs) ** 2 / (N * probs)).sum()
    assert chi2 < 16.27  # 99.9% quantile of chi-square with 3 degrees of freedom


def test_same_seed_same_samples_other_seed_other_samples():
    draws = []
    for seed in (7, 7, 8):
        ctx, T, (sample, *_) = _categorical_program(seed)
        draws.append(_run(ctx, [sample], {T: 50})[sample])
    assert np.array_equal(draws[0], draws[1])
    assert not np.array_equal(draws[0], draws[2])


def test_categorical_log_prob_gradient_matches_jax():
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        logits = tp.const(LOGITS, requires_grad=True)
        dist = Categorical(logits * (1.0 + tp.symbol_value(t).astype("float32")))
        loss = (dist.log_prob(tp.symbol_value(t % 4)) + 0.1 * dist.entropy())[0:T].sum()
        loss.backward()
    got = _run(ctx, [logits.grad], {T: 6})[logits.grad]

    def jax_loss(lg):
        total = 0.0
        for k in range(6):
            lp = jax.nn.log_softmax(lg * (1.0 + k))
            total += lp[k % 4] - 0.1 * (jnp.exp(lp) * lp).sum()
        return total
    np.testing.assert_allclose(got, jax.grad(jax_loss)(jnp.asarray(LOGITS)), rtol=1e-5, atol=1e-6)


def test_normal_closed_form_and_sample_moments():
    loc = np.array([0.5, -2.0], np.float32)
    log_std = np.array([-0.5, 0.3], np.float32)
    ctx = tp.Context(dims=("t",), seed=1)
    (t,), (T,) = ctx.dims, ctx.bounds
    value = np.array([0.1, -1.0], np.float32)
    with ctx:
        dist = Normal(tp.const(loc) + tp.symbol_value(t).astype("float32") * 0.0,
                      log_std=tp.const(log_std))
        sample, lp, ent = dist.sample(), dist.log_prob(tp.const(value)), dist.entropy()
    res = _run(ctx, [sample, lp, ent], {T: N})
    std = np.exp(log_std)
    expected_lp = (-0.5 * ((value - loc) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum()
    np.testing.assert_allclose(res[lp], expected_lp, rtol=1e-5)
    np.testing.assert_allclose(res[ent], (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(),
                               rtol=1e-5)
    s = res[sample]
    assert np.all(np.abs(s.mean(0) - loc) < 4 * std / math.sqrt(N))
    assert np.all(np.abs(s.std(0) / std - 1) < 0.06)


def test_bernoulli_closed_form_and_sample_mean():
    logits = np.array([-1.5, 0.0, 2.0], np.float32)
    ctx = tp.Context(dims=("t",), seed=2)
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        dist = Bernoulli(tp.const(logits) + tp.symbol_value(t).astype("float32") * 0.0)
        sample = dist.sample()
        lp = dist.log_prob(tp.const(np.array([1.0, 0.0, 1.0], np.float32)))
        ent, mode = dist.entropy(), dist.mode()
    res = _run(ctx, [sample, lp, ent, mode], {T: N})
    p = 1 / (1 + np.exp(-logits))
    np.testing.assert_allclose(res[lp][0], np.log([p[0], 1 - p[1], p[2]]), rtol=1e-5)
    np.testing.assert_allclose(res[ent][0], -(p * np.log(p) + (1 - p) * np.log(1 - p)), rtol=1e-5)
    np.testing.assert_array_equal(res[mode][0], [0.0, 0.0, 1.0])
    assert np.all(np.abs(res[sample].mean(0) - p) < 4 * np.sqrt(p * (1 - p) / N))
