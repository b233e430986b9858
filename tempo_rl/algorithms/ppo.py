"""Proximal policy optimization (Schulman et al., 2017), as CleanRL's ``ppo.py`` runs it.

One program over dims ``(b, i, u, t)``: env, iteration, update, timestep. Acting runs over
``(b, i, t)`` with the parameters as they are at the iteration's start, ``(i, 0)``; GAE is
the anti-causal recurrence

    A[t] = delta[t] + gamma * lambda * (1 - done[t]) * A[t+1],    A[T-1] = delta[T-1],

so it runs backwards once the rollout is complete; learning runs over ``(i, u)``:
``update_epochs x num_minibatches`` Adam steps, each on a minibatch of the flattened
rollout drawn by a permutation that is reshuffled every epoch. The parameters are
placeholders over ``(i, u)``: updated at ``(i, u + 1)``, carried to ``(i + 1, 0)``.
Truncated episodes bootstrap from the value of their final observation.
"""

from __future__ import annotations

from dataclasses import dataclass

import tempo as tp
from tempo.api import optim
from tempo.api.tensor import RecurrentTensor
from tempo_rl.algorithms.common import (
    ActorCriticConfig,
    TrainProgram,
    actor_critic,
    annealed,
    rl_context,
    sampling_policy,
    standardize,
)
from tempo_rl.algorithms.registry import register_algorithm
from tempo_rl.envs import Env
from tempo_rl.options import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT, option


@dataclass
class PPOConfig(ActorCriticConfig):
    """CleanRL's ppo.py, but 64 steps x 8 envs (CleanRL's 4 x 128 batch) and a rate of 1e-3:
    CleanRL's 2.5e-4 needs ~300k steps on CartPole-v1, this ~100k."""

    num_steps: int = option(64, AT_LEAST_ONE)
    learning_rate: float = option(1e-3, POSITIVE)
    anneal_lr: bool = True
    gae_lambda: float = option(0.95, UNIT)
    update_epochs: int = option(4, AT_LEAST_ONE)
    num_minibatches: int = option(4, AT_LEAST_ONE)
    clip_coef: float = option(0.2, NON_NEGATIVE)
    clip_vloss: bool = True
    ent_coef: float = option(0.01, NON_NEGATIVE)
    adam_eps: float = option(1e-5, POSITIVE)


@register_algorithm("ppo", PPOConfig)
def build(env: Env, cfg: PPOConfig, seed: int = 0) -> TrainProgram:
    batch = cfg.num_steps * env.num_envs
    if batch % cfg.num_minibatches:
        raise ValueError(f"num_steps x num_envs = {batch} does not split into "
                         f"{cfg.num_minibatches} minibatches")
    minibatch = batch // cfg.num_minibatches
    ctx, fixed = rl_context(env, seed, "i", "u", "t")
    b, i, u, t = ctx.dims
    B, I, U, T = ctx.bounds
    with ctx:
        policy, critic = actor_critic(env, cfg.hidden, cfg.activation, (i, u))
        actor, acting_critic = policy.at(i, 0), critic.at(i, 0)  # parameters at (i, 0)
        ro = env.rollout(sampling_policy(actor), b, i, t, T)
        value = acting_critic(ro.obs).squeeze(-1).detach()
        next_value = acting_critic(ro.final_obs).squeeze(-1).detach() * (1.0 - ro.terminated)
        done = tp.max(ro.terminated, ro.truncated)
        delta = ro.reward + cfg.gamma * next_value - value
        advantage = tp.placeholder(shape=(), dtype="float32", domain=(b, i, t))
        advantage[t == T - 1] = delta
        advantage[True] = delta + cfg.gamma * cfg.gae_lambda * (1.0 - done) * advantage[b, i, t + 1]
        returns = advantage + value

        # One shuffle per epoch: keys drawn at each epoch's first update, read by the rest.
        keys = tp.uniform((batch,), domain=(i, u))
        order = keys[i, u - u % cfg.num_minibatches].argsort()
        index = order.reshape(cfg.num_minibatches, minibatch)[i, u, u % cfg.num_minibatches]

        def minibatch_of(x: RecurrentTensor) -> RecurrentTensor:
            """The rollout's ``(num_envs, num_steps, ...)`` values, flattened, at ``index``."""
            flat = x[0:B, i, 0:cfg.num_steps].detach().reshape(batch, *x.shape)
            return flat[i, index]

        obs, action = minibatch_of(ro.obs), minibatch_of(ro.action)
        old_log_prob, old_value = minibatch_of(ro.extras["log_prob"]), minibatch_of(value)
        adv, ret = minibatch_of(advantage), minibatch_of(returns)
        if cfg.normalize_advantages:
            adv = standardize(adv)

        dist = policy.distribution(obs)
        log_ratio = dist.log_prob(action) - old_log_prob
        ratio = log_ratio.exp()
        policy_loss = tp.max(-adv * ratio, -adv * ratio.clip(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
        new_value = critic(obs).squeeze(-1)
        value_error = (new_value - ret) ** 2
        if cfg.clip_vloss:
            clipped = old_value + (new_value - old_value).clip(-cfg.clip_coef, cfg.clip_coef)
            value_error = tp.max(value_error, (clipped - ret) ** 2)
        value_loss = 0.5 * value_error.mean()
        entropy = dist.entropy().mean()
        loss = policy_loss - cfg.ent_coef * entropy + cfg.vf_coef * value_loss
        loss.backward()

        lr: float | RecurrentTensor = cfg.learning_rate
        if cfg.anneal_lr:
            lr = annealed(cfg.learning_rate, i, I)
        opt = optim.Adam(policy.parameters() + critic.parameters(), lr=lr, eps=cfg.adam_eps,
                         max_grad_norm=cfg.max_grad_norm)
        opt.step()

        approx_kl = ((ratio - 1.0) - log_ratio).mean().detach()
        clipfrac = ((ratio - 1.0).abs() > cfg.clip_coef).astype("float32").mean()
        predicted = value[0:B, i, 0:cfg.num_steps]
        target = returns[0:B, i, 0:cfg.num_steps]
        residual = target - predicted
        explained = 1.0 - _variance(residual) / _variance(target)

    last = {name: x[i, U - 1] for name, x in {
        "losses/policy_loss": policy_loss, "losses/value_loss": value_loss,
        "losses/entropy": entropy, "losses/approx_kl": approx_kl,
        "losses/clipfrac": clipfrac, "losses/grad_norm": opt.grad_norm}.items()}
    metrics = {**last, "losses/explained_variance": explained}
    if cfg.anneal_lr:
        metrics["charts/learning_rate"] = lr
    values = {"obs": ro.obs, "action": ro.action, "log_prob": ro.extras["log_prob"],
              "reward": ro.reward, "terminated": ro.terminated, "truncated": ro.truncated,
              "final_obs": ro.final_obs, "value": value, "next_value": next_value,
              "advantage": advantage, "returns": returns, "minibatch_index": index}
    bounds = {**fixed, T: cfg.num_steps, U: cfg.update_epochs * cfg.num_minibatches}
    return TrainProgram(ctx, actor, metrics, opt.checkpoint_state(), opt, values, ro, bounds)


def _variance(x: RecurrentTensor) -> RecurrentTensor:
    centered = x - x.mean()
    return (centered * centered).mean()
