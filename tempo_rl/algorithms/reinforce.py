"""REINFORCE (Williams, 1992): Monte-Carlo returns ``r[t:T]``, optionally a learned baseline.

The return at ``t`` sums the discounted rewards from ``t`` up to the episode's end or the
rollout's, read as the slice ``r[b, i, t:T]``, so learning for step ``t`` waits for the whole
rollout. Acting and learning are one program: the loss reuses the log-probabilities
computed while acting.
"""

from __future__ import annotations

from dataclasses import dataclass

import tempo as tp
from tempo.api import optim
from tempo_rl.algorithms.common import (
    ActorCriticConfig,
    TrainProgram,
    actor_critic,
    rl_context,
    sampling_policy,
    standardize,
    truncated_returns,
)
from tempo_rl.algorithms.registry import register_algorithm
from tempo_rl.envs import Env
from tempo_rl.options import AT_LEAST_ONE, POSITIVE, option


@dataclass
class ReinforceConfig(ActorCriticConfig):
    num_steps: int = option(200, AT_LEAST_ONE)
    learning_rate: float = option(3e-3, POSITIVE)
    baseline: bool = True


@register_algorithm("reinforce", ReinforceConfig)
def build(env: Env, cfg: ReinforceConfig, seed: int = 0) -> TrainProgram:
    ctx, fixed = rl_context(env, seed, "i", "t")
    b, i, t = ctx.dims
    B, _, T = ctx.bounds
    with ctx:
        policy, critic = actor_critic(env, cfg.hidden, cfg.activation, (i,))
        ro = env.rollout(sampling_policy(policy), b, i, t, T)
        done = tp.max(ro.terminated, ro.truncated)
        returns = truncated_returns(ro.reward[b, i, t:T], done[b, i, t:T], cfg.gamma)
        advantage = returns
        value_loss = None
        rollout = (slice(0, B), i, slice(0, T))  # every env and step of iteration i
        if cfg.baseline:
            value = critic(ro.obs).squeeze(-1)
            advantage = returns - value.detach()
            value_loss = ((value - returns) ** 2)[rollout].mean()
        if cfg.normalize_advantages:
            advantage = standardize(advantage[rollout])
        else:
            advantage = advantage[rollout]
        policy_loss = -(ro.extras["log_prob"][rollout] * advantage.detach()).mean()
        loss = policy_loss if value_loss is None else policy_loss + cfg.vf_coef * value_loss
        loss.backward()
        params = policy.parameters() + (critic.parameters() if cfg.baseline else [])
        opt = optim.Adam(params, lr=cfg.learning_rate, max_grad_norm=cfg.max_grad_norm)
        opt.step()
    metrics = {"losses/policy_loss": policy_loss, "losses/grad_norm": opt.grad_norm}
    if value_loss is not None:
        metrics["losses/value_loss"] = value_loss
    values = {"returns": returns, "advantage": advantage, "reward": ro.reward,
              "terminated": ro.terminated, "truncated": ro.truncated}
    return TrainProgram(ctx, policy, metrics, opt.checkpoint_state(), opt, values, ro, fixed)
