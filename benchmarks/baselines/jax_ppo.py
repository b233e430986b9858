"""PPO as one jitted JAX function per iteration, in the style of PureJaxRL, with the
semantics of ``tempo_rl/algorithms/ppo.py``.

Written from the algorithm: an iteration is a single ``jax.jit``: the rollout is a
``lax.scan`` over ``num_steps`` (the env stepped inside it), GAE a reverse ``lax.scan``,
and the update ``update_epochs`` x ``num_minibatches`` Adam steps as nested ``lax.scan``s
over a fresh permutation per epoch. optax does Adam (eps 1e-5), global grad-norm clipping
and the linear learning-rate schedule. Truncated episodes bootstrap from the value of their
final observation, as Tempo's PPO does.

Envs: the synthetic contextual bandit of ``tempo_rl/envs/synthetic.py`` written in JAX, and
gymnax's CartPole-v1 vmapped over the copies (gymnax resets finished episodes and reports
the final observation).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.common import Cell, EnvSettings, Measurement, PPOSettings

Params = dict[str, list[dict[str, jax.Array]]]
Batch = tuple[jax.Array, ...]
Carry = tuple[Params, Any, jax.Array]


def init_mlp(key: jax.Array, sizes: list[int], out_gain: float) -> list[dict[str, jax.Array]]:
    """Orthogonal weights (gain sqrt(2) on hidden layers, ``out_gain`` on the last), zero biases."""
    layers = []
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, sub = jax.random.split(key)
        gain = out_gain if k == len(sizes) - 2 else math.sqrt(2)
        layers.append({"w": jax.nn.initializers.orthogonal(gain)(sub, (a, b), jnp.float32),
                       "b": jnp.zeros((b,), jnp.float32)})
    return layers


def apply_mlp(layers: list[dict[str, jax.Array]], x: jax.Array, activation: str) -> jax.Array:
    act = {"tanh": jnp.tanh, "relu": jax.nn.relu}[activation]
    for k, layer in enumerate(layers):
        x = x @ layer["w"] + layer["b"]
        if k < len(layers) - 1:
            x = act(x)
    return x


class JaxEnv(NamedTuple):
    """A batched env as pure functions: ``reset(key) -> (obs, state)`` and
    ``step(key, state, action) -> (obs, state, reward, terminated, truncated, final_obs)``."""

    reset: Callable[[jax.Array], tuple[jax.Array, Any]]
    step: Callable[[jax.Array, Any, jax.Array], tuple[Any, ...]]


def synthetic_env(spec: EnvSettings) -> JaxEnv:
    """The contextual bandit of ``tempo_rl/envs/synthetic.py``; its state is the
    observation and the step count within the episode."""
    shape = (spec.num_envs, *spec.obs_shape)

    def reset(key: jax.Array) -> tuple[jax.Array, Any]:
        obs = jax.random.normal(key, shape)
        return obs, (obs, jnp.zeros(spec.num_envs))

    def step(key: jax.Array, state: Any, action: jax.Array) -> tuple[Any, ...]:
        obs, count = state
        first = obs.reshape(spec.num_envs, -1)[:, 0]
        target = jnp.minimum((jax.scipy.stats.norm.cdf(first) * spec.num_actions).astype(jnp.int32),
                             spec.num_actions - 1)
        reward = (action.astype(jnp.int32) == target).astype(jnp.float32)
        count = count + 1.0
        truncated = (count >= spec.episode_length).astype(jnp.float32)
        fresh = jax.random.normal(key, shape)
        return fresh, (fresh, count * (1.0 - truncated)), reward, jnp.zeros_like(reward), truncated, fresh

    return JaxEnv(reset, step)


def gymnax_env(env_id: str, num_envs: int) -> JaxEnv:
    """gymnax env ``env_id`` vmapped over ``num_envs`` copies."""
    import gymnax
    env, params = gymnax.make(env_id)

    def reset(key: jax.Array) -> tuple[jax.Array, Any]:
        return jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(key, num_envs), params)

    def step(key: jax.Array, state: Any, action: jax.Array) -> tuple[Any, ...]:
        obs, state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(key, num_envs), state, action.astype(jnp.int32), params)
        as_float = [x.astype(jnp.float32) for x in (reward, terminated, truncated)]
        return obs, state, *as_float, info["final_observation"]

    return JaxEnv(reset, step)


class Runner(NamedTuple):
    params: Params
    opt_state: Any
    env_state: Any
    obs: jax.Array
    running_return: jax.Array
    key: jax.Array


def make_iteration(hp: PPOSettings, spec: EnvSettings, env: JaxEnv,
                   optimizer: optax.GradientTransformation) -> Callable[[Runner], tuple[Runner, Any]]:
    """One PPO iteration ``Runner -> (Runner, (returns, done))`` (pure; to be jitted):
    ``returns`` holds each step's episode return where ``done``."""
    T, N = hp.num_steps, spec.num_envs
    batch = T * N
    minibatch = batch // hp.num_minibatches

    def value_of(params: Params, obs: jax.Array) -> jax.Array:
        return apply_mlp(params["critic"], obs.reshape(*obs.shape[:-len(spec.obs_shape)], -1),
                         hp.activation)[..., 0]

    def logits_of(params: Params, obs: jax.Array) -> jax.Array:
        return apply_mlp(params["actor"], obs.reshape(*obs.shape[:-len(spec.obs_shape)], -1),
                         hp.activation)

    def act(runner: Runner, _: None) -> tuple[Runner, tuple[jax.Array, ...]]:
        key, act_key, step_key = jax.random.split(runner.key, 3)
        logits = logits_of(runner.params, runner.obs)
        action = jax.random.categorical(act_key, logits)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
        value = value_of(runner.params, runner.obs)
        obs, env_state, reward, terminated, truncated, final = env.step(step_key, runner.env_state, action)
        done = jnp.maximum(terminated, truncated)
        running = runner.running_return + reward
        step = (runner.obs, action, log_prob, value, reward, terminated, done, final, running)
        return runner._replace(env_state=env_state, obs=obs, running_return=running * (1.0 - done),
                               key=key), step

    def loss_fn(params: Params, mb: tuple[jax.Array, ...]) -> jax.Array:
        obs, action, old_log_prob, old_value, adv, ret = mb
        if hp.normalize_advantages:
            centered = adv - adv.mean()
            adv = centered / (jnp.sqrt((centered * centered).mean()) + 1e-8)
        log_probs = jax.nn.log_softmax(logits_of(params, obs))
        log_ratio = jnp.take_along_axis(log_probs, action[:, None], axis=-1)[:, 0] - old_log_prob
        ratio = jnp.exp(log_ratio)
        clipped_ratio = jnp.clip(ratio, 1 - hp.clip_coef, 1 + hp.clip_coef)
        policy_loss = jnp.maximum(-adv * ratio, -adv * clipped_ratio).mean()
        new_value = value_of(params, obs)
        value_error = (new_value - ret) ** 2
        if hp.clip_vloss:
            clipped = old_value + jnp.clip(new_value - old_value, -hp.clip_coef, hp.clip_coef)
            value_error = jnp.maximum(value_error, (clipped - ret) ** 2)
        value_loss = 0.5 * value_error.mean()
        entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
        return policy_loss - hp.ent_coef * entropy + hp.vf_coef * value_loss

    def iteration(runner: Runner) -> tuple[Runner, Any]:
        runner, steps = jax.lax.scan(act, runner, None, length=T)
        obs, action, log_prob, value, reward, terminated, done, final, running = steps
        next_value = value_of(runner.params, final) * (1.0 - terminated)
        delta = reward + hp.gamma * next_value - value

        def gae(later: jax.Array, step: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
            delta_t, done_t = step
            adv = delta_t + hp.gamma * hp.gae_lambda * (1.0 - done_t) * later
            return adv, adv
        # A[T-1] = delta[T-1]: start the reverse scan from zero.
        _, advantages = jax.lax.scan(gae, jnp.zeros(N), (delta, done), reverse=True)
        returns = advantages + value
        data = tuple(x.reshape(batch, *x.shape[2:])
                     for x in (obs, action, log_prob, value, advantages, returns))

        def epoch(carry: Carry, _: None) -> tuple[Carry, None]:
            params, opt_state, key = carry
            key, sub = jax.random.split(key)
            order = jax.random.permutation(sub, batch)
            mbs = tuple(x[order].reshape(hp.num_minibatches, minibatch, *x.shape[1:]) for x in data)

            def update(state: tuple[Params, Any], mb: Batch) -> tuple[tuple[Params, Any], None]:
                params, opt_state = state
                grads = jax.grad(loss_fn)(params, mb)
                updates, opt_state = optimizer.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), None
            (params, opt_state), _ = jax.lax.scan(update, (params, opt_state), mbs)
            return (params, opt_state, key), None

        (params, opt_state, key), _ = jax.lax.scan(epoch, (runner.params, runner.opt_state, runner.key),
                                                   None, length=hp.update_epochs)
        return runner._replace(params=params, opt_state=opt_state, key=key), (running, done)

    return iteration


CACHE_MAX_BYTES = 2 << 30
"""The JAX cache's size limit, Tempo's (``tempo.cache.JAX_CACHE_MAX_BYTES``): with a limit
JAX evicts the least recently used programs, and reads and writes entries as Tempo's do."""


def keep_compiled_programs(directory: str) -> None:
    """JAX's persistent compilation cache in ``directory``, set as Tempo sets its own
    (``tempo.cache.enable_jax_cache``): every program kept, however fast it compiled."""
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    compilation_cache.reset_cache()  # (JAX decides at its first compile whether a cache is on)


def run(cell: Cell) -> Measurement:
    """Initialize and AOT-compile the iteration, then run ``cell.total_iterations`` of
    them; time each one. The setup (``Measurement.setup_s``) starts after the imports, as
    Tempo's does (gymnax's alone takes about 1 s), and initializes in one jitted program
    (PureJaxRL folds the initialization into its one program): eagerly, each operation
    would compile its own (about 0.5 s more on 2 cores). With ``cell.jax_cache_dir`` the
    compiled programs are kept in JAX's persistent cache there (``--baseline-cache``)."""
    if cell.impl == "gymnax":
        import gymnax  # noqa: F401
    if cell.jax_cache_dir is not None:
        keep_compiled_programs(cell.jax_cache_dir)
    began = time.perf_counter()
    hp, spec = cell.ppo, cell.env
    if cell.impl == "synthetic":
        env = synthetic_env(spec)
    elif cell.impl == "gymnax":
        env = gymnax_env("CartPole-v1", spec.num_envs)
    else:
        raise ValueError(f"the JAX baseline has no env {cell.impl!r}")
    total = cell.total_iterations
    updates_per_iteration = hp.update_epochs * hp.num_minibatches

    def schedule(count: jax.Array) -> jax.Array:
        if not hp.anneal_lr:
            return jnp.asarray(hp.learning_rate)
        return hp.learning_rate * (1.0 - (count // updates_per_iteration) / total)
    chain = [optax.adam(schedule, eps=hp.adam_eps)]
    if hp.max_grad_norm is not None:
        chain.insert(0, optax.clip_by_global_norm(hp.max_grad_norm))
    optimizer = optax.chain(*chain)

    def initial(key: jax.Array) -> Runner:
        key, actor_key, critic_key, env_key = jax.random.split(key, 4)
        params = {"actor": init_mlp(actor_key, [spec.obs_dim, *hp.hidden, spec.num_actions], 0.01),
                  "critic": init_mlp(critic_key, [spec.obs_dim, *hp.hidden, 1], 1.0)}
        obs, env_state = env.reset(env_key)
        return Runner(params, optimizer.init(params), env_state, obs, jnp.zeros(spec.num_envs), key)
    key = jax.random.PRNGKey(cell.seed)
    start = time.perf_counter()
    init = jax.jit(initial).lower(key).compile()
    init_compile_s = time.perf_counter() - start
    runner = init(key)

    start = time.perf_counter()
    step = jax.jit(make_iteration(hp, spec, env, optimizer)).lower(runner).compile()
    compile_s = time.perf_counter() - start
    setup_s = time.perf_counter() - began
    times: list[float] = []
    episodes = []
    for _ in range(total):
        start = time.perf_counter()
        runner, ends = step(runner)
        jax.block_until_ready((runner, ends))
        times.append(time.perf_counter() - start)
        episodes.append(ends)
    returns: list[float] = []
    finished: list[int] = []
    for running, done in episodes:  # (T, N) each, in step order
        ended = np.asarray(running)[np.asarray(done) > 0].tolist()
        returns.extend(ended)
        finished.append(len(ended))
    return Measurement(compile_s, times, returns, setup_s=setup_s, episodes=finished,
                       init_compile_s=init_compile_s)
