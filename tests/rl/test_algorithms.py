"""RL algorithms as RT programs: they learn CartPole, runs are reproducible, and the
schedule overlaps learning with acting exactly where the returns allow it."""

from __future__ import annotations

import numpy as np

from tempo.ir.graph import Op
from tempo.schedule import ast
from tempo.symbolic.expr import Slice
from tempo_rl.algorithms import nstep, reinforce
from tempo_rl.config import load_config as config
from tempo_rl.envs import GymnasiumEnv
from tempo_rl.train import train


def test_reinforce_learns_cartpole(tmp_path):
    """96k env steps (60 iterations x 200 steps x 8 envs); a random policy scores ~22."""
    cfg = config("algorithm=reinforce", "total_timesteps=96000")
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
    """n-step A2C (n = 16): 256k env steps (1000 iterations x 32 steps x 8 envs)."""
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


def _statements(node: ast.Node | None):
    if node is None:
        return
    if isinstance(node, ast.Stmt):
        yield node
    elif isinstance(node, ast.Seq):
        for child in node.body:
            yield from _statements(child)
    elif isinstance(node, ast.If):
        yield from _statements(node.then)
        yield from _statements(node.orelse)
    else:
        yield from _statements(node.body)


def _loops(node: ast.Node | None):
    if node is None or isinstance(node, ast.Stmt):
        return
    if isinstance(node, ast.Loop):
        yield node
    children = {ast.Seq: lambda n: n.body, ast.If: lambda n: (n.then, n.orelse),
                ast.Loop: lambda n: (n.body,)}[type(node)](node)
    for child in children:
        yield from _loops(child)


def _t_loop_of(root: ast.Node, name: str) -> ast.Loop:
    """The loop whose variable is the ``t`` index of statement ``name``."""
    stmt = next(s for s in _statements(root) if s.name == name)
    (var,) = stmt.index[1].symbols()
    return next(loop for loop in _loops(root) if loop.var is var)


def _runs(node: ast.Node | None, name: str) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Stmt):
        return node.name == name
    if isinstance(node, ast.Seq):
        return any(_runs(c, name) for c in node.body)
    if isinstance(node, ast.If):
        return _runs(node.then, name) or _runs(node.orelse, name)
    return _runs(node.body, name)


def _return_window_reader(graph) -> Op:
    """The op reading the rewards through a slice over t: where returns are computed."""
    env_step = next(op for op in graph.ops.values() if op.label == "env_step")
    return next(e.sink for e in graph.edges()
                if e.src is env_step and e.src_out == 1 and any(isinstance(p, Slice) for p in e.phi))


def _learning_shares_the_acting_loop(build, cfg) -> bool:
    env = GymnasiumEnv("CartPole-v1", num_envs=2, seed=0)
    program = build(env, cfg)
    I, T = program.ctx.bounds
    exe = program.ctx.compile({I: 2, T: 24}, backend="numpy")
    names = {s.op.id: name for name, s in exe.schedule.statements.items() if s.kind == "exec"}
    reader = _return_window_reader(exe.graph)
    step = next(op for op in exe.graph.ops.values() if op.label == "env_step")
    return _runs(_t_loop_of(exe.schedule.root, names[step.id]), names[reader.id])


def test_nstep_learns_during_the_rollout_and_reinforce_after_it():
    """Paper §7.4: with n-step returns the work for step t runs inside the acting loop,
    about n steps behind it; with Monte-Carlo returns r[t:T] it cannot start before the
    rollout ends, so it runs in a loop of its own."""
    assert _learning_shares_the_acting_loop(nstep.build, nstep.NStepConfig(n=4))
    assert not _learning_shares_the_acting_loop(reinforce.build, reinforce.ReinforceConfig())


def test_nstep_returns_match_numpy():
    """The program's bootstrapped n-step returns equal a direct NumPy computation on the
    same rollout: rewards up to the first episode end in the window, then the discounted
    value of the state reached (0 if the episode terminated there)."""
    env = GymnasiumEnv("CartPole-v1", num_envs=3, seed=1)
    n, gamma = 3, 0.9
    program = nstep.build(env, nstep.NStepConfig(n=n, gamma=gamma))
    I, T = program.ctx.bounds
    v = program.values
    keys = ["returns", "reward", "terminated", "truncated", "next_value"]
    res = program.ctx.compile({I: 2, T: 40}, [v[k] for k in keys], backend="numpy").run()
    ret, rew, term, trunc, nv = (np.asarray(res[v[k]]) for k in keys)
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
