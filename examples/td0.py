"""A one-step actor-critic (TD(0)) registered from outside tempo_rl: the algorithm a user
adds (docs/rl.md, "Adding an algorithm"). Train it with

    python scripts/train.py hydra.searchpath=[file://examples/conf] algorithm=td0
"""

from __future__ import annotations

from dataclasses import dataclass

from tempo.api import optim
from tempo_rl.algorithms import TrainProgram, register_algorithm
from tempo_rl.algorithms.common import actor_critic, rl_context
from tempo_rl.options import AT_LEAST_ONE, POSITIVE, UNIT, option


@dataclass
class TD0Config:
    num_steps: int = option(32, AT_LEAST_ONE)      # steps of each env per iteration (every algorithm has it)
    gamma: float = option(0.99, UNIT)              # checked before a run: a float in [0, 1]
    learning_rate: float = option(1e-3, POSITIVE)
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"


@register_algorithm("td0", TD0Config)
def build(env, cfg: TD0Config, seed: int = 0) -> TrainProgram:
    ctx, fixed = rl_context(env, seed, "i", "t")   # dims (b, i, t), b parallel; fixes B = num_envs
    b, i, t = ctx.dims
    B, _, T = ctx.bounds
    with ctx:
        policy, critic = actor_critic(env, cfg.hidden, cfg.activation, (i,))

        def act(obs):
            dist = policy.distribution(obs)        # categorical or Gaussian, as the env's actions
            action = dist.sample()
            return action, {"log_prob": dist.log_prob(action)}
        ro = env.rollout(act, b, i, t, T)
        value = critic(ro.obs).squeeze(-1)
        bootstrap = critic(ro.final_obs).squeeze(-1).detach()
        target = ro.reward + cfg.gamma * (1.0 - ro.terminated) * bootstrap
        advantage = (target - value).detach()
        policy_loss = -(ro.extras["log_prob"] * advantage)[0:B, i, 0:T].mean()
        value_loss = ((value - target) ** 2)[0:B, i, 0:T].mean()
        (policy_loss + 0.5 * value_loss).backward()
        opt = optim.Adam(policy.parameters() + critic.parameters(), lr=cfg.learning_rate)
        opt.step()
    return TrainProgram(ctx, policy, {"losses/policy_loss": policy_loss, "losses/value_loss": value_loss},
                        opt.checkpoint_state(), opt, rollout=ro, fixed_bounds=fixed)
