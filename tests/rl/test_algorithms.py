"""RL algorithms as RT programs: they learn CartPole, runs are reproducible, and the
schedule overlaps learning with acting exactly where the returns allow it."""

from __future__ import annotations

import numpy as np

from tempo.ir.graph import Op
from tempo.passes import PIPELINE
from tempo.symbolic.expr import Slice
from tempo_rl.algorithms import nstep, reinforce
from tempo_rl.config import load_config as config
from tempo_rl.envs import GymnasiumEnv
from tempo_rl.train import train


def test_reinforce_learns_cartpole(tmp_path):
    """128k env steps (80 iterations x 200 steps x 8 envs); a random policy scores ~22.
    (Seeds 0-2 end at 357-476 on NumPy and 393-483 on JAX; at 96k steps one seed was at 140.)"""
    cfg = config("algorithm=reinforce", "total_timesteps=128000")
    result = train(cfg, tmp_path, progress=False)
    assert result.mean_return(last=20) >= 200, result.episode_returns[-20:]


def test_ppo_learns_cartpole_with_the_default_config(tmp_path):
    """`python scripts/train.py`: PPO, 256k env steps (500 iterations x 64 steps x 8 envs,
    4 epochs x 4 minibatches each); a random policy scores ~22."""
    result = train(config(), tmp_path, progress=False)
    assert result.mean_return(last=20) >= 400, result.episode_returns[-20:]
    names = set().union(*(row.keys() for row in result.history))
    assert {"losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
            "losses/clipfrac", "losses/explained_variance", "charts/learning_rate",
            "charts/SPS"} <= names


def test_nstep_learns_cartpole(tmp_path):
    """n-step A2C (n = 32): 256k env steps (500 iterations x 64 steps x 8 envs), the learning
    rate annealed."""
    result = train(config("algorithm=nstep"), tmp_path, progress=False)
    assert result.mean_return(last=20) >= 400, result.episode_returns[-20:]
    names = set().union(*(row.keys() for row in result.history))
    assert {"losses/policy_loss", "losses/value_loss", "losses/entropy", "charts/SPS"} <= names


def test_same_seed_same_run_other_seed_other_run(tmp_path):
    def returns(seed: int) -> list[float]:
        cfg = config("algorithm=reinforce", "total_timesteps=8000", f"seed={seed}")
        return train(cfg, tmp_path / str(seed), progress=False).episode_returns
    first, again, other = returns(0), returns(0), returns(1)
    assert first == again
    assert first != other


def _return_window_reader(graph) -> Op:
    """The op computing returns: it reads the rewards through a slice over t at each step."""
    env_step = next(op for op in graph.ops.values() if op.label == "env_step")
    return next(e.sink for e in graph.edges()
                if e.src is env_step and e.src_out == 1 and any(isinstance(p, Slice) for p in e.phi)
                and e.sink.domain == env_step.domain)


def _steps_acted_before_learning(build, cfg, num_steps: int = 24) -> int:
    """How many env steps of the first iteration run before the first point that computes
    returns from a window of rewards (learning for step 0), in the executed order."""
    env = GymnasiumEnv("CartPole-v1", num_envs=2, seed=0)
    program = build(env, cfg)
    exe = program.ctx.compile(program.bounds(2, num_steps), backend="numpy", passes=_MEMORY_LEAN)
    reader = _return_window_reader(exe.graph)
    acted = 0
    for kind, op, point in exe.execution_order():
        if kind == "exec" and point[:1] == (0,):
            if op is reader:
                return acted
            acted += op.label == "env_step"
    raise AssertionError("the returns were never computed in the first iteration")


# Without vectorization (which batches the per-step learning after the rollout) and
# fusion (whose islands join the returns with learner ops that isl then places after the
# rollout, in the program over (b, i, t)).
_MEMORY_LEAN = [name for name, _ in PIPELINE if name not in ("vectorize", "fusion")]


def test_nstep_learns_during_the_rollout_and_reinforce_after_it():
    """Paper §7.4: with n-step returns the work for step t runs while acting goes on,
    about n steps behind it; with Monte-Carlo returns r[t:T] it cannot start before the
    rollout ends. (Vectorized, the per-step work of both runs batched after the rollout:
    the schedule that holds less memory is the one without vectorization and fusion.)"""
    assert 4 <= _steps_acted_before_learning(nstep.build, nstep.NStepConfig(n=4)) <= 4 + 1
    assert _steps_acted_before_learning(reinforce.build, reinforce.ReinforceConfig()) == 24


def test_nstep_returns_match_numpy():
    """The program's bootstrapped n-step returns equal a direct NumPy computation on the
    same rollout: rewards up to the first episode end in the window, then the discounted
    value of the state reached (0 if the episode terminated there)."""
    env = GymnasiumEnv("CartPole-v1", num_envs=3, seed=1)
    n, gamma = 3, 0.9
    program = nstep.build(env, nstep.NStepConfig(n=n, gamma=gamma))
    v = program.values
    keys = ["returns", "reward", "terminated", "truncated", "next_value"]
    res = program.ctx.compile(program.bounds(2, 40), [v[k] for k in keys], backend="numpy").run()
    # (env, iteration, step) -> (iteration, step, env): the loops below run over steps
    ret, rew, term, trunc, nv = (np.moveaxis(np.asarray(res[v[k]]), 0, 2) for k in keys)
    assert (term + trunc).sum() > 0  # episodes end inside the rollout
    done = np.maximum(term, trunc)
    expected = np.zeros_like(ret)
    for i in range(2):
        for t in range(40):
            total, discount = np.zeros(3), np.ones(3)
            alive = np.ones(3)
            for k in range(t, min(t + n, 40)):
                total += alive * discount * rew[i, k]
                last = alive * np.maximum(done[i, k], float(k == min(t + n, 40) - 1))
                total += last * discount * gamma * nv[i, k]
                alive = alive * (1 - done[i, k])
                discount = discount * gamma
            expected[i, t] = total
    np.testing.assert_allclose(ret, expected, rtol=1e-5, atol=1e-5)
