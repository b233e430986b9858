"""Pieces every algorithm uses: returns over windows that stop at episode ends, the
program a builder returns, and the actor/critic networks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import tempo as tp
from tempo.api import nn, optim
from tempo.api.distributions import Categorical, Normal
from tempo.api.tensor import RecurrentTensor, arange
from tempo.symbolic.expr import Expr, Symbol
from tempo_rl.envs.base import Env, Rollout
from tempo_rl.options import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT, option


@dataclass
class ActorCriticConfig:
    """Options every actor-critic builder here shares (CleanRL's names). Each algorithm's
    dataclass owns its defaults: ``conf/algorithm/<name>.yaml`` takes them from it
    (``tempo_rl.config.store_algorithm_defaults``), except ``hidden`` and ``activation``,
    which the ``network`` group sets."""

    num_steps: int = option(128, AT_LEAST_ONE)
    """Steps of each env per iteration (the rollout length ``T``)."""
    gamma: float = option(0.99, UNIT)
    learning_rate: float = option(1e-3, POSITIVE)
    hidden: tuple[int, ...] = option((64, 64), AT_LEAST_ONE)
    activation: str = "tanh"
    vf_coef: float = option(0.5, NON_NEGATIVE)
    normalize_advantages: bool = True
    max_grad_norm: float | None = option(0.5, POSITIVE)


@dataclass
class TrainProgram:
    """An RL algorithm as one RT program over dims ``(b, i, t)``, env, iteration and step
    (PPO adds ``u``, the update within an iteration): acting and learning.

    ``metrics`` are scalars per iteration (domain ``(i,)``), named as CleanRL names them;
    ``state`` are the RTs a checkpoint holds (parameters and optimizer state, as of
    the next iteration)."""

    ctx: tp.Context
    policy: nn.Module
    metrics: dict[str, RecurrentTensor] = field(default_factory=dict)
    state: dict[str, RecurrentTensor] = field(default_factory=dict)
    optimizer: optim.Optimizer | None = None
    values: dict[str, RecurrentTensor] = field(default_factory=dict)
    """Named intermediate RTs (returns, advantages, ...), for inspection and tests."""
    rollout: Rollout | None = None
    """The acting RTs (a checkpoint waits for ``rollout.saved``)."""
    fixed_bounds: dict[Symbol, int] = field(default_factory=dict)
    """Bounds the builder fixed (the number of envs; PPO's rollout length and updates per
    iteration)."""

    def dim(self, name: str) -> Symbol:
        """The dim named ``name`` (``"b"``, ``"i"``, ``"t"``)."""
        return next(d for d in self.ctx.dims if d.name == name)

    def bound(self, dim: str) -> Symbol:
        """The bound symbol of the dim named ``dim`` (``"b"``, ``"i"``, ``"t"``)."""
        return self.ctx.bound_of[self.dim(dim)]

    def bounds(self, iterations: int, num_steps: int) -> dict[Symbol, int]:
        """Every bound of the program, for ``iterations`` rollouts of ``num_steps`` steps."""
        bounds = {self.bound("i"): iterations, self.bound("t"): num_steps}
        fixed = self.fixed_bounds.get(self.bound("t"), num_steps)
        if fixed != num_steps:
            raise ValueError(f"the program was built for rollouts of {fixed} steps, not {num_steps}")
        return {**bounds, **self.fixed_bounds}


def rl_context(env: Env, seed: int, *dims: str) -> tuple[tp.Context, dict[Symbol, int]]:
    """A context over ``(b, *dims)`` with the env dim ``b`` parallel (the compiler steps
    every env at once), and the bound it fixes: ``B`` is the number of envs."""
    ctx = tp.Context(dims=("b", *dims), seed=seed, parallel=("b",))
    return ctx, {ctx.bounds[0]: env.num_envs}


def annealed(learning_rate: float, i: Symbol, I: Symbol) -> RecurrentTensor:
    """The learning rate at iteration ``i``, linearly annealed to 0 at ``I`` (CleanRL's)."""
    progress = tp.symbol_value(i).astype("float32") / tp.symbol_value(I).astype("float32")
    return learning_rate * (1.0 - progress)


def alive_before(done: RecurrentTensor) -> RecurrentTensor:
    """Over a window of steps (dim 0): 1 where no episode ended strictly before."""
    ended_before = done.cumsum(0) - done
    return (ended_before == 0).astype("float32")


def truncated_returns(reward: RecurrentTensor, done: RecurrentTensor, gamma: float) -> RecurrentTensor:
    """``sum_k gamma^k reward[k]`` over a window (dim 0), up to and including the first
    step that ends an episode."""
    return (reward * alive_before(done)).discounted_sum(gamma)


def last_included(done: RecurrentTensor, length: Expr) -> RecurrentTensor:
    """Over a window of ``length`` steps: 1 at the last step a return from the window's
    first step includes (the first episode end, else the window's last step)."""
    ctx = done.ctx
    is_last = (arange(ctx, length) == length - 1).astype("float32")
    while is_last.ndim < done.ndim:
        is_last = is_last.unsqueeze(-1)
    return alive_before(done) * tp.max(done, is_last)


def standardize(x: RecurrentTensor, eps: float = 1e-8) -> RecurrentTensor:
    """``(x - mean) / (std + eps)`` over all of ``x``'s entries."""
    centered = x - x.mean()
    return centered / ((centered * centered).mean().sqrt() + eps)


class CategoricalPolicy(nn.Module):
    """Discrete actions: a categorical over the MLP's logits."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, hidden: tuple[int, ...],
                 activation: str, domain: tuple):
        super().__init__(domain)
        self.logits = self.add("logits", nn.MLP(obs_shape, hidden, num_actions, activation=activation,
                                                out_gain=0.01, domain=domain))

    def forward(self, obs: RecurrentTensor) -> RecurrentTensor:
        return self.logits(obs)

    def distribution(self, obs: RecurrentTensor) -> Categorical:
        return Categorical(self.logits(obs))


class GaussianPolicy(nn.Module):
    """Continuous actions: a diagonal Gaussian with the MLP's mean and a learned,
    state-independent log standard deviation (as CleanRL's ``ppo_continuous_action``)."""

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, hidden: tuple[int, ...],
                 activation: str, domain: tuple):
        super().__init__(domain)
        self.log_std = self.param("log_std", (action_dim,), nn.zeros)
        self.mean = self.add("mean", nn.MLP(obs_shape, hidden, action_dim, activation=activation,
                                            out_gain=0.01, domain=domain))

    def forward(self, obs: RecurrentTensor) -> RecurrentTensor:
        return self.mean(obs)

    def distribution(self, obs: RecurrentTensor) -> Normal:
        return Normal(self.mean(obs), log_std=self.log_std)


Policy = CategoricalPolicy | GaussianPolicy


def sampling_policy(policy: Policy, entropy: bool = False):
    """``obs -> (action, extras)`` for ``env.rollout``: a sample from the policy's
    distribution, with its log-probability (and entropy) for the learner to reuse."""
    def act(obs: RecurrentTensor):
        dist = policy.distribution(obs)
        action = dist.sample()
        extras = {"log_prob": dist.log_prob(action)}
        if entropy:
            extras["entropy"] = dist.entropy()
        return action, extras
    return act


def actor_critic(env: Env, hidden: tuple[int, ...], activation: str,
                 domain: tuple) -> tuple[Policy, nn.MLP]:
    """CleanRL's networks for ``env``'s actions: orthogonal init, gain 0.01 on the policy
    head, 1 on the value. Observations of more than one dim are flattened."""
    if env.discrete:
        policy: Policy = CategoricalPolicy(env.obs_shape, int(env.num_actions), hidden, activation, domain)
    else:
        action_dim = int(np.prod(env.action_shape))
        policy = GaussianPolicy(env.obs_shape, action_dim, hidden, activation, domain)
    critic = nn.MLP(env.obs_shape, hidden, 1, activation=activation, out_gain=1.0, domain=domain)
    return policy, critic
