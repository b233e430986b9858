"""PPO's program against a JAX/optax reference written from the maths (CleanRL's loss):
GAE over the program's own rollout, then every minibatch update of two iterations, with
discrete (CartPole) and continuous (Pendulum, Gaussian policy) actions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tempo_rl.algorithms import ppo
from tempo_rl.envs import GymnasiumEnv

CFG = ppo.PPOConfig(num_steps=16, update_epochs=2, num_minibatches=2, learning_rate=1e-2,
                    hidden=(8, 8), gamma=0.9, gae_lambda=0.8)
ITERATIONS, ENVS = 2, 3


def _mlp(params, x):
    w0, b0, w1, b1, w2, b2 = params
    h = jnp.tanh(x @ w0 + b0)
    h = jnp.tanh(h @ w1 + b1)
    return h @ w2 + b2


def _policy(params, obs, action):
    """Log-probability of ``action`` and the entropy: categorical over the MLP's logits
    (6 policy parameters), or a Gaussian with a state-independent log std (7: log_std
    first, then the mean's MLP)."""
    if len(params) == 12:
        log_probs = jax.nn.log_softmax(_mlp(params[:6], obs))
        chosen = jnp.take_along_axis(log_probs, action[..., None], -1)[..., 0]
        return chosen, -(jnp.exp(log_probs) * log_probs).sum(-1)
    log_std, mean = params[0], _mlp(params[1:7], obs)
    z = (action - mean) / jnp.exp(log_std)
    log_2pi = jnp.log(2 * jnp.pi)
    log_prob = (-0.5 * z * z - log_std - 0.5 * log_2pi).sum(-1)
    return log_prob, jnp.broadcast_to((log_std + 0.5 + 0.5 * log_2pi).sum(), log_prob.shape)


def _critic(params, obs):
    return _mlp(params[-6:], obs)[..., 0]


def _loss(params, obs, action, old_log_prob, adv, ret, old_value):
    log_prob, entropy = _policy(params, obs, action)
    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    adv = (adv - adv.mean()) / (jnp.sqrt(((adv - adv.mean()) ** 2).mean()) + 1e-8)
    c = CFG.clip_coef
    policy_loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - c, 1 + c)).mean()
    value = _critic(params, obs)
    clipped = old_value + jnp.clip(value - old_value, -c, c)
    value_loss = 0.5 * jnp.maximum((value - ret) ** 2, (clipped - ret) ** 2).mean()
    return policy_loss - CFG.ent_coef * entropy.mean() + CFG.vf_coef * value_loss


def _gae(reward, value, next_value, done):
    adv = np.zeros_like(reward)
    carry = np.zeros_like(reward[0])
    for t in reversed(range(len(reward))):
        delta = reward[t] + CFG.gamma * next_value[t] - value[t]
        carry = delta + CFG.gamma * CFG.gae_lambda * (1.0 - done[t]) * carry
        adv[t] = carry
    return adv


@pytest.fixture(scope="module", params=["CartPole-v1", "Pendulum-v1"])
def run(request):
    env = GymnasiumEnv(request.param, num_envs=ENVS, seed=3)
    program = ppo.build(env, CFG, seed=5)
    params = program.optimizer.params
    outputs = [*program.values.values(), *params]
    exe = program.ctx.compile(program.bounds(ITERATIONS, CFG.num_steps), outputs=outputs,
                              backend="numpy")
    res = exe.run()
    return {name: res[rt] for name, rt in program.values.items()}, [res[p] for p in params]


def test_gae_and_every_update_match_a_jax_reference(run):
    values, params = run
    updates = CFG.update_epochs * CFG.num_minibatches
    current = [jnp.asarray(p[0, 0]) for p in params]
    adam = optax.chain(optax.clip_by_global_norm(CFG.max_grad_norm), optax.scale_by_adam(eps=CFG.adam_eps))
    state = adam.init(current)
    grad = jax.grad(_loss)
    for i in range(ITERATIONS):
        v = {k: x[:, i] for k, x in values.items() if k != "minibatch_index"}  # (env, step, ...)
        obs, final = v["obs"], v["final_obs"]
        np.testing.assert_allclose(v["log_prob"], _policy(current, obs, v["action"])[0],
                                   rtol=1e-5, atol=1e-5)
        value = np.asarray(_critic(current, obs))
        next_value = np.asarray(_critic(current, final)) * (1 - v["terminated"])
        done = np.maximum(v["terminated"], v["truncated"])
        adv = _gae(v["reward"].T, value.T, next_value.T, done.T).T  # over steps, per env
        np.testing.assert_allclose(v["advantage"], adv, rtol=1e-4, atol=1e-4)
        flat = {k: v[k].reshape(CFG.num_steps * ENVS, *v[k].shape[2:])  # env-major, as the program
                for k in ("obs", "action", "log_prob")}
        flat_adv, flat_ret = adv.reshape(-1), (adv + value).reshape(-1)
        lr = CFG.learning_rate * (1 - i / ITERATIONS)
        for u in range(updates):
            for ours, theirs in zip(params, current):
                np.testing.assert_allclose(ours[i, u], theirs, rtol=1e-4, atol=1e-5,
                                           err_msg=f"parameters at (i={i}, u={u})")
            idx = values["minibatch_index"][i, u]
            g = grad(current, flat["obs"][idx], flat["action"][idx], flat["log_prob"][idx],
                     flat_adv[idx], flat_ret[idx], value.reshape(-1)[idx])
            step, state = adam.update(g, state)
            current = [p - lr * s for p, s in zip(current, step)]


def test_each_epoch_shuffles_the_whole_rollout_anew(run):
    index = run[0]["minibatch_index"]
    batch = CFG.num_steps * ENVS
    for i in range(ITERATIONS):
        epochs = index[i].reshape(CFG.update_epochs, -1)
        for epoch in epochs:
            assert sorted(epoch.tolist()) == list(range(batch))
        assert not np.array_equal(epochs[0], epochs[1])
    assert not np.array_equal(index[0], index[1])


def test_gae_lifted_to_one_op_trains_as_the_stepwise_one():
    """Where the advantages are not an output, the lift pass makes GAE one
    ``linear_recurrence`` over the steps (no step loop); the parameters it trains are those
    of the same program with GAE step by step (the advantages an output, which the test
    above checks against the reference)."""
    trained = []
    for keep_advantages in (True, False):
        program = ppo.build(GymnasiumEnv("CartPole-v1", num_envs=ENVS, seed=3), CFG, seed=5)
        params = program.optimizer.params
        outputs = [program.values["advantage"], *params] if keep_advantages else params
        exe = program.ctx.compile(program.bounds(ITERATIONS, CFG.num_steps), outputs=outputs, backend="numpy")
        kinds = {m.kind for op in exe.graph.ops.values()
                 for m in (op.params["members"] if op.kind == "fused" else [op])}
        assert ("linear_recurrence" in kinds) is not keep_advantages
        res = exe.run()
        trained.append([res[p] for p in params])
    for stepwise, lifted in zip(*trained):
        np.testing.assert_allclose(lifted, stepwise, rtol=1e-4, atol=1e-5)
