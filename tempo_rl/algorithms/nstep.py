"""n-step advantage actor-critic (A2C): returns bootstrapped after ``n`` steps,
``r[t:min(t+n, T)]`` plus the discounted value of the state reached.

The return at ``t`` needs rewards up to ``t+n-1`` only, so Tempo can schedule the
learning work for step ``t`` during the rollout, about ``n`` steps behind acting, instead
of after it (compare ``reinforce.py``, whose returns read ``r[t:T]``); it does when the
``vectorize`` and ``fusion`` passes are off, and otherwise batches that work over the
rollout's steps. Episode ends inside the window stop the sum; a terminated episode
bootstraps with 0, a truncated one with the value of its final observation.
"""

from __future__ import annotations

from dataclasses import dataclass

import tempo as tp
from tempo.api import optim
from tempo_rl.algorithms.common import (
    ActorCriticConfig,
    TrainProgram,
    actor_critic,
    annealed,
    last_included,
    rl_context,
    sampling_policy,
    standardize,
    truncated_returns,
)
from tempo_rl.algorithms.registry import register_algorithm
from tempo_rl.envs import Env
from tempo_rl.options import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, option


@dataclass
class NStepConfig(ActorCriticConfig):
    """CartPole, 256k steps, mean of the last 20 episodes: seeds 0-4 494, 486, 408, 500, 498
    (a rate of 3e-3: 474, 497, 482, 500, then 112 after a collapse; T=32, n=16 without
    annealing at 5e-4 to 1e-3: 170 to 492)."""

    num_steps: int = option(64, AT_LEAST_ONE)
    learning_rate: float = option(2e-3, POSITIVE)
    n: int = option(32, AT_LEAST_ONE)
    ent_coef: float = option(0.01, NON_NEGATIVE)
    anneal_lr: bool = True
    """Linearly to 0 over the run, as PPO."""


@register_algorithm("nstep", NStepConfig)
def build(env: Env, cfg: NStepConfig, seed: int = 0) -> TrainProgram:
    ctx, fixed = rl_context(env, seed, "i", "t")
    b, i, t = ctx.dims
    B, I, T = ctx.bounds
    with ctx:
        policy, critic = actor_critic(env, cfg.hidden, cfg.activation, (i,))
        ro = env.rollout(sampling_policy(policy, entropy=True), b, i, t, T)
        done = tp.max(ro.terminated, ro.truncated)
        value = critic(ro.obs).squeeze(-1)
        # Value of the state each step led to, 0 where the episode terminated there.
        next_value = critic(ro.final_obs).squeeze(-1).detach() * (1.0 - ro.terminated)
        stop = tp.min(t + cfg.n, T)
        window = (b, i, slice(t, stop))
        partial = truncated_returns(ro.reward[window], done[window], cfg.gamma)
        ends = last_included(done[window], stop - t)
        bootstrap = cfg.gamma * (ends * next_value[window]).discounted_sum(cfg.gamma)
        returns = partial + bootstrap
        rollout = (slice(0, B), i, slice(0, T))  # every env and step of iteration i
        advantage = returns - value.detach()
        if cfg.normalize_advantages:  # statistics of the whole rollout: learning waits for it
            advantage = standardize(advantage[rollout])
            policy_loss = -(ro.extras["log_prob"][rollout] * advantage).mean()
        else:  # each step's term needs its own window only: learning can trail acting by n steps
            policy_loss = -(ro.extras["log_prob"] * advantage)[rollout].mean()
            advantage = advantage[rollout]
        value_loss = ((value - returns) ** 2)[rollout].mean()
        entropy = ro.extras["entropy"][rollout].mean()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
        loss.backward()
        params = policy.parameters() + critic.parameters()
        lr = annealed(cfg.learning_rate, i, I) if cfg.anneal_lr else cfg.learning_rate
        opt = optim.Adam(params, lr=lr, max_grad_norm=cfg.max_grad_norm)
        opt.step()
    metrics = {"losses/policy_loss": policy_loss, "losses/value_loss": value_loss,
               "losses/entropy": entropy, "losses/grad_norm": opt.grad_norm}
    if cfg.anneal_lr:
        metrics["charts/learning_rate"] = lr
    values = {"returns": returns, "advantage": advantage, "reward": ro.reward,
              "terminated": ro.terminated, "truncated": ro.truncated, "next_value": next_value}
    return TrainProgram(ctx, policy, metrics, opt.checkpoint_state(), opt, values, ro, fixed)
