"""PPO in eager PyTorch, in the style of CleanRL's single-file ``ppo.py``, with the
semantics of ``tempo_rl/algorithms/ppo.py``.

Written from the algorithm: separate actor and critic MLPs (orthogonal init, gain
sqrt(2) on hidden layers, 0.01 on the policy head, 1 on the value head), a categorical
policy, a rollout of ``num_steps`` steps of ``num_envs`` envs, GAE that bootstraps
truncated episodes from the value of their final observation (as Tempo's PPO does; CleanRL
treats truncation as termination), then ``update_epochs`` epochs of ``num_minibatches``
shuffled minibatches with per-minibatch advantage normalization, a clipped surrogate, a
clipped value loss, an entropy bonus, global grad-norm clipping and Adam (eps 1e-5) with a
linearly annealed learning rate.

Envs: the synthetic contextual bandit of ``tempo_rl/envs/synthetic.py`` written in torch,
and gymnasium's CartPole-v1 as a ``SyncVectorEnv`` that resets finished episodes in the
same step (``AutoresetMode.SAME_STEP``, as Tempo's gymnasium wrapper).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch import nn

from benchmarks.common import Cell, EnvSettings, Measurement, PPOSettings


def mlp(in_features: int, hidden: tuple[int, ...], out_features: int, out_gain: float,
        activation: str) -> nn.Sequential:
    """Linear layers with tanh (or relu) between them; CleanRL's orthogonal init."""
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    sizes = [in_features, *hidden, out_features]
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        linear = nn.Linear(a, b)
        nn.init.orthogonal_(linear.weight, out_gain if k == len(sizes) - 2 else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if k < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


class SyntheticEnv:
    """The contextual bandit of ``tempo_rl/envs/synthetic.py``: standard-normal observations,
    reward 1 when the action is the bucket of the first entry's normal CDF, truncation after
    ``episode_length`` steps; the next observation is a fresh draw."""

    def __init__(self, env: EnvSettings, generator: torch.Generator):
        self.env, self.generator = env, generator
        self.count = torch.zeros(env.num_envs)

    def _draw(self) -> torch.Tensor:
        return torch.randn((self.env.num_envs, *self.env.obs_shape), generator=self.generator)

    def reset(self) -> torch.Tensor:
        self.count.zero_()
        self.obs = self._draw()
        return self.obs

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(next_obs, reward, terminated, truncated, final_obs)``."""
        first = self.obs.reshape(self.env.num_envs, -1)[:, 0]
        target = torch.clamp((torch.special.ndtr(first) * self.env.num_actions).to(torch.int64),
                             max=self.env.num_actions - 1)
        reward = (action == target).float()
        self.count += 1.0
        truncated = (self.count >= self.env.episode_length).float()
        self.count *= 1.0 - truncated
        self.obs = self._draw()
        return self.obs, reward, torch.zeros_like(reward), truncated, self.obs


class GymnasiumEnv:
    """CartPole-v1 (or another discrete gymnasium env) as a ``SyncVectorEnv``."""

    def __init__(self, env_id: str, num_envs: int, seed: int):
        import gymnasium as gym
        self.seed = seed
        self.envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(num_envs)],
                                             autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    def reset(self) -> torch.Tensor:
        obs, _ = self.envs.reset(seed=self.seed)
        return torch.as_tensor(obs, dtype=torch.float32)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        obs, reward, terminated, truncated, info = self.envs.step(action.numpy())
        final = obs.copy()
        done = terminated | truncated
        if done.any() and "final_obs" in info:
            for k in np.flatnonzero(done):
                final[k] = info["final_obs"][k]
        as_float = [torch.as_tensor(x, dtype=torch.float32) for x in (obs, reward, terminated, truncated)]
        return (*as_float, torch.as_tensor(final, dtype=torch.float32))


def ppo_loss(actor: nn.Module, critic: nn.Module, hp: PPOSettings, obs: torch.Tensor,
             action: torch.Tensor, old_log_prob: torch.Tensor, old_value: torch.Tensor,
             adv: torch.Tensor, ret: torch.Tensor) -> torch.Tensor:
    """The clipped surrogate, clipped value loss and entropy bonus on one minibatch."""
    if hp.normalize_advantages:
        centered = adv - adv.mean()
        adv = centered / (centered.pow(2).mean().sqrt() + 1e-8)
    dist = torch.distributions.Categorical(logits=actor(obs))
    log_ratio = dist.log_prob(action) - old_log_prob
    ratio = log_ratio.exp()
    policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - hp.clip_coef, 1 + hp.clip_coef)).mean()
    new_value = critic(obs).squeeze(-1)
    value_error = (new_value - ret) ** 2
    if hp.clip_vloss:
        clipped = old_value + (new_value - old_value).clamp(-hp.clip_coef, hp.clip_coef)
        value_error = torch.max(value_error, (clipped - ret) ** 2)
    value_loss = 0.5 * value_error.mean()
    return policy_loss - hp.ent_coef * dist.entropy().mean() + hp.vf_coef * value_loss


def run(cell: Cell) -> Measurement:
    """Train for ``cell.total_iterations`` iterations; time each one."""
    hp, spec = cell.ppo, cell.env
    torch.manual_seed(cell.seed)
    generator = torch.Generator().manual_seed(cell.seed)
    if cell.impl == "synthetic":
        env: SyntheticEnv | GymnasiumEnv = SyntheticEnv(spec, generator)
    elif cell.impl == "gymnasium":
        env = GymnasiumEnv("CartPole-v1", spec.num_envs, cell.seed)
    else:
        raise ValueError(f"the torch baseline has no env {cell.impl!r}")
    actor = mlp(spec.obs_dim, hp.hidden, spec.num_actions, 0.01, hp.activation)
    critic = mlp(spec.obs_dim, hp.hidden, 1, 1.0, hp.activation)
    params = list(actor.parameters()) + list(critic.parameters())
    optimizer = torch.optim.Adam(params, lr=hp.learning_rate, eps=hp.adam_eps)

    T, N = hp.num_steps, spec.num_envs
    batch = T * N
    minibatch = batch // hp.num_minibatches
    obs_buf = torch.zeros((T, N, spec.obs_dim))
    final_buf = torch.zeros((T, N, spec.obs_dim))
    actions, log_probs, values = (torch.zeros((T, N), dtype=torch.int64), torch.zeros((T, N)),
                                  torch.zeros((T, N)))
    rewards, terminated, dones = torch.zeros((T, N)), torch.zeros((T, N)), torch.zeros((T, N))
    running = np.zeros(N)
    returns_seen: list[float] = []
    times: list[float] = []
    obs = env.reset().reshape(N, -1)
    total = cell.total_iterations
    for iteration in range(total):
        start = time.perf_counter()
        if hp.anneal_lr:
            optimizer.param_groups[0]["lr"] = hp.learning_rate * (1.0 - iteration / total)
        with torch.no_grad():
            for t in range(T):
                obs_buf[t] = obs
                dist = torch.distributions.Categorical(logits=actor(obs))
                action = dist.sample()
                actions[t], log_probs[t] = action, dist.log_prob(action)
                values[t] = critic(obs).squeeze(-1)
                nxt, reward, term, trunc, final = env.step(action)
                rewards[t], terminated[t], dones[t] = reward, term, torch.max(term, trunc)
                final_buf[t] = final.reshape(N, -1)
                obs = nxt.reshape(N, -1)
                running += reward.numpy()
                done = dones[t].numpy() > 0
                if done.any():
                    returns_seen.extend(running[done].tolist())
                    running[done] = 0.0
            # Bootstrap every step from its final observation unless it terminated.
            next_values = critic(final_buf).squeeze(-1) * (1.0 - terminated)
            delta = rewards + hp.gamma * next_values - values
            advantages = torch.zeros_like(delta)
            advantages[T - 1] = delta[T - 1]
            for t in reversed(range(T - 1)):
                advantages[t] = delta[t] + hp.gamma * hp.gae_lambda * (1.0 - dones[t]) * advantages[t + 1]
            returns = advantages + values

        b_obs, b_actions = obs_buf.reshape(batch, -1), actions.reshape(batch)
        b_log_probs, b_values = log_probs.reshape(batch), values.reshape(batch)
        b_adv, b_ret = advantages.reshape(batch), returns.reshape(batch)
        for _ in range(hp.update_epochs):
            order = torch.randperm(batch, generator=generator)
            for k in range(hp.num_minibatches):
                idx = order[k * minibatch:(k + 1) * minibatch]
                loss = ppo_loss(actor, critic, hp, b_obs[idx], b_actions[idx], b_log_probs[idx],
                                b_values[idx], b_adv[idx], b_ret[idx])
                optimizer.zero_grad()
                loss.backward()
                if hp.max_grad_norm is not None:
                    nn.utils.clip_grad_norm_(params, hp.max_grad_norm)
                optimizer.step()
        times.append(time.perf_counter() - start)
    return Measurement(None, times, returns_seen)
