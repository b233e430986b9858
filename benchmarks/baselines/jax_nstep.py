"""n-step advantage actor-critic (A2C) and REINFORCE with a learned baseline, as one jitted
JAX function per iteration, with the semantics of ``tempo_rl/algorithms/nstep.py`` and
``tempo_rl/algorithms/reinforce.py``.

Written the way a JAX user would write them: an iteration is a single ``jax.jit``. The
rollout is a ``lax.scan`` over ``num_steps`` steps of every env that stores each step's
observation (the loss recomputes the log-probabilities, entropies and values from them);
the returns are computed for all steps at once after it; then ONE gradient step on the
whole rollout, with optax (global grad-norm clipping, then Adam with eps 1e-8, as Tempo's
``optim.Adam``; the learning rate annealed linearly to 0 over the run where the config's
``anneal_lr`` says so).

- n-step: the return at ``t`` is ``sum_k gamma^k r[t+k]`` over ``k < min(n, T-t)``, stopped
  after the first step that ends an episode, plus ``gamma^(k+1) V(s')`` for the step ``k``
  where the sum stopped and ``s'`` the observation that step led to (the final observation
  of a truncated episode; 0 for a terminated one). ``V(s')`` is detached: it is computed
  while acting, with the same parameters. Loss: ``-mean(log_prob * A) + vf_coef *
  mean((V - R)^2) - ent_coef * mean(entropy)`` with ``A = R - V`` (V detached) normalized.
- REINFORCE: the return at ``t`` is ``sum_k gamma^k r[t+k]`` over ``r[t:T]``, stopped after
  the first step that ends an episode (no bootstrap), by a reverse ``lax.scan``. Loss:
  ``-mean(log_prob * A) + vf_coef * mean((V - R)^2)``, ``A`` as above.

The env is the synthetic contextual bandit of ``tempo_rl/envs/synthetic.py`` written in JAX
(``jax_ppo.synthetic_env``); the networks are Tempo's ``actor_critic``: separate actor and
critic MLPs over the flattened observation, orthogonal init (``jax_ppo.init_mlp``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.baselines.jax_ppo import JaxEnv, Params, apply_mlp, init_mlp, synthetic_env
from benchmarks.common import EnvSettings

ALGORITHMS = ("nstep", "reinforce")


@dataclass(frozen=True)
class ActorCriticSettings:
    """The hyperparameters of n-step A2C or REINFORCE, as in ``conf/algorithm/{nstep,
    reinforce}.yaml`` and ``conf/network``."""

    algorithm: str
    """``nstep`` or ``reinforce``."""
    num_steps: int
    n: int
    """n-step: the window of rewards before the bootstrap (REINFORCE: unused, 0)."""
    gamma: float
    learning_rate: float
    anneal_lr: bool
    vf_coef: float
    ent_coef: float
    """n-step's entropy bonus (REINFORCE has none: 0)."""
    normalize_advantages: bool
    max_grad_norm: float | None
    hidden: tuple[int, ...]
    activation: str

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ActorCriticSettings:
        """From a Tempo training config (the plain-dict Hydra config)."""
        algo, net = cfg["algorithm"], cfg.get("network", {})
        name = algo["name"]
        if name not in ALGORITHMS:
            raise ValueError(f"the baseline runs {' or '.join(ALGORITHMS)}, not {name!r}")
        if name == "reinforce" and not algo.get("baseline", True):
            raise ValueError("the baseline's REINFORCE always learns a value baseline")
        nstep = name == "nstep"
        return cls(name, int(algo["num_steps"]), int(algo["n"]) if nstep else 0, float(algo["gamma"]),
                   float(algo["learning_rate"]), bool(algo.get("anneal_lr", False)),
                   float(algo["vf_coef"]), float(algo["ent_coef"]) if nstep else 0.0,
                   bool(algo["normalize_advantages"]),
                   None if algo["max_grad_norm"] is None else float(algo["max_grad_norm"]),
                   tuple(int(h) for h in net.get("hidden", (64, 64))), str(net.get("activation", "tanh")))


@dataclass
class BaselineRun:
    """What a run reports: compile time, each iteration's time, loss terms and mean reward
    per env step (in iteration order)."""

    compile_s: float
    iteration_s: list[float]
    losses: list[dict[str, float]]
    mean_reward: list[float]


class Runner(NamedTuple):
    params: Params
    opt_state: Any
    env_state: Any
    obs: jax.Array
    key: jax.Array


Networks = tuple[Callable[[Params, jax.Array], jax.Array], Callable[[Params, jax.Array], jax.Array]]


def networks(hp: ActorCriticSettings, spec: EnvSettings) -> Networks:
    """``(logits_of, value_of)``: the actor's logits and the critic's value of observations
    of shape ``(..., *obs_shape)``, flattened for the MLPs."""
    def flat(obs: jax.Array) -> jax.Array:
        return obs.reshape(*obs.shape[:obs.ndim - len(spec.obs_shape)], -1)

    def logits_of(params: Params, obs: jax.Array) -> jax.Array:
        return apply_mlp(params["actor"], flat(obs), hp.activation)

    def value_of(params: Params, obs: jax.Array) -> jax.Array:
        return apply_mlp(params["critic"], flat(obs), hp.activation)[..., 0]
    return logits_of, value_of


def alive_before(done: jax.Array, axis: int) -> jax.Array:
    """Along ``axis``: 1 where no episode ended strictly before."""
    return ((jnp.cumsum(done, axis) - done) == 0).astype(done.dtype)


def nstep_returns(reward: jax.Array, done: jax.Array, next_value: jax.Array, n: int,
                  gamma: float) -> jax.Array:
    """The n-step returns of a rollout (all ``(T, B)``): at each ``t`` the window
    ``t .. min(t+n, T)-1`` of discounted rewards, up to the first episode end in it, plus
    ``gamma^(k+1) next_value[t+k]`` at the last step ``k`` the sum included. Vectorized over
    ``(t, k)``: a gather of the ``(T, n, B)`` windows."""
    T = reward.shape[0]
    k = jnp.arange(n)
    index = jnp.arange(T)[:, None] + k  # (T, n)
    inside = (index < T).astype(reward.dtype)[..., None]
    index = jnp.minimum(index, T - 1)
    r, d, v = reward[index], done[index] * inside, next_value[index]
    alive = alive_before(d, axis=1) * inside
    length = jnp.minimum(n, T - jnp.arange(T))  # the window's length at each t
    is_last = (k[None, :] == length[:, None] - 1).astype(reward.dtype)[..., None]
    ends = alive * jnp.maximum(d, is_last)  # 1 at exactly one step of each window
    discount = (gamma ** k.astype(reward.dtype))[None, :, None]
    partial = (discount * r * alive).sum(1)
    return partial + gamma * (discount * ends * v).sum(1)


def monte_carlo_returns(reward: jax.Array, done: jax.Array, gamma: float) -> jax.Array:
    """REINFORCE's returns over ``r[t:T]`` (``(T, B)``), stopped after the first step that
    ends an episode: ``G[t] = r[t] + gamma (1 - done[t]) G[t+1]``, ``G[T] = 0``."""
    def back(later: jax.Array, step: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        r, d = step
        ret = r + gamma * (1.0 - d) * later
        return ret, ret
    _, returns = jax.lax.scan(back, jnp.zeros_like(reward[0]), (reward, done), reverse=True)
    return returns


def standardize(x: jax.Array, eps: float = 1e-8) -> jax.Array:
    """``(x - mean) / (std + eps)`` over all entries (population std, as Tempo's)."""
    centered = x - x.mean()
    return centered / (jnp.sqrt((centered * centered).mean()) + eps)


def make_loss(hp: ActorCriticSettings, nets: Networks) -> Callable[..., tuple[jax.Array, dict]]:
    """``loss(params, obs, action, returns) -> (loss, terms)`` over the whole rollout."""
    logits_of, value_of = nets

    def loss_fn(params: Params, obs: jax.Array, action: jax.Array,
                returns: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        log_probs = jax.nn.log_softmax(logits_of(params, obs))
        log_prob = jnp.take_along_axis(log_probs, action[..., None], axis=-1)[..., 0]
        value = value_of(params, obs)
        advantage = returns - jax.lax.stop_gradient(value)
        if hp.normalize_advantages:
            advantage = standardize(advantage)
        policy_loss = -(log_prob * advantage).mean()
        value_loss = ((value - returns) ** 2).mean()
        loss = policy_loss + hp.vf_coef * value_loss
        terms = {"policy_loss": policy_loss, "value_loss": value_loss}
        if hp.algorithm == "nstep":
            entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
            loss = loss - hp.ent_coef * entropy
            terms["entropy"] = entropy
        return loss, terms
    return loss_fn


def make_iteration(hp: ActorCriticSettings, spec: EnvSettings, env: JaxEnv,
                   optimizer: optax.GradientTransformation) -> Callable[[Runner], tuple[Runner, dict]]:
    """One iteration ``Runner -> (Runner, metrics)`` (pure; to be jitted): a rollout of
    ``num_steps`` steps, the returns, one gradient step."""
    nets = networks(hp, spec)
    logits_of, value_of = nets
    loss_fn = make_loss(hp, nets)

    def act(runner: Runner, _: None) -> tuple[Runner, dict[str, jax.Array]]:
        key, act_key, step_key = jax.random.split(runner.key, 3)
        action = jax.random.categorical(act_key, logits_of(runner.params, runner.obs))
        obs, env_state, reward, terminated, truncated, final = env.step(step_key, runner.env_state, action)
        step = {"obs": runner.obs, "action": action, "reward": reward,
                "done": jnp.maximum(terminated, truncated)}
        if hp.algorithm == "nstep":  # the bootstrap: detached, 0 where the episode terminated
            step["next_value"] = value_of(runner.params, final) * (1.0 - terminated)
        return runner._replace(env_state=env_state, obs=obs, key=key), step

    def iteration(runner: Runner) -> tuple[Runner, dict[str, jax.Array]]:
        runner, steps = jax.lax.scan(act, runner, None, length=hp.num_steps)
        if hp.algorithm == "nstep":
            returns = nstep_returns(steps["reward"], steps["done"], steps["next_value"], hp.n, hp.gamma)
        else:
            returns = monte_carlo_returns(steps["reward"], steps["done"], hp.gamma)
        grads, terms = jax.grad(loss_fn, has_aux=True)(runner.params, steps["obs"], steps["action"],
                                                       returns)
        updates, opt_state = optimizer.update(grads, runner.opt_state, runner.params)
        params = optax.apply_updates(runner.params, updates)
        metrics = {**terms, "mean_reward": steps["reward"].mean()}
        return runner._replace(params=params, opt_state=opt_state), metrics

    return iteration


def make_optimizer(hp: ActorCriticSettings, iterations: int) -> optax.GradientTransformation:
    """Global grad-norm clipping, then Adam (eps 1e-8, Tempo's ``optim.Adam``), one update
    per iteration; with ``anneal_lr`` the rate falls linearly to 0 over ``iterations``."""
    def schedule(count: jax.Array) -> jax.Array:
        if not hp.anneal_lr:
            return jnp.asarray(hp.learning_rate)
        return hp.learning_rate * (1.0 - count / iterations)
    chain = [optax.adam(schedule, eps=1e-8)]
    if hp.max_grad_norm is not None:
        chain.insert(0, optax.clip_by_global_norm(hp.max_grad_norm))
    return optax.chain(*chain)


def init_runner(hp: ActorCriticSettings, spec: EnvSettings, env: JaxEnv,
                optimizer: optax.GradientTransformation, seed: int) -> Runner:
    """Fresh networks (gain 0.01 on the policy head, 1 on the value) and env."""
    key = jax.random.PRNGKey(seed)
    key, actor_key, critic_key, env_key = jax.random.split(key, 4)
    params = {"actor": init_mlp(actor_key, [spec.obs_dim, *hp.hidden, spec.num_actions], 0.01),
              "critic": init_mlp(critic_key, [spec.obs_dim, *hp.hidden, 1], 1.0)}
    obs, env_state = env.reset(env_key)
    return Runner(params, optimizer.init(params), env_state, obs, key)


def run(hp: ActorCriticSettings, spec: EnvSettings, iterations: int, seed: int = 0) -> BaselineRun:
    """AOT-compile the iteration, then run ``iterations`` of them; time each one."""
    if spec.name != "synthetic":
        raise ValueError(f"the n-step/REINFORCE baseline has only the synthetic env, not {spec.name!r}")
    env = synthetic_env(spec)
    optimizer = make_optimizer(hp, iterations)
    runner = init_runner(hp, spec, env, optimizer, seed)
    start = time.perf_counter()
    step = jax.jit(make_iteration(hp, spec, env, optimizer)).lower(runner).compile()
    compile_s = time.perf_counter() - start
    times: list[float] = []
    losses: list[dict[str, float]] = []
    rewards: list[float] = []
    for _ in range(iterations):
        start = time.perf_counter()
        runner, metrics = step(runner)
        jax.block_until_ready((runner, metrics))
        times.append(time.perf_counter() - start)
        values = {name: float(np.asarray(value)) for name, value in metrics.items()}
        rewards.append(values.pop("mean_reward"))
        losses.append(values)
    return BaselineRun(compile_s, times, losses, rewards)
