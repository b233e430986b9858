"""Differential test on an RL program: the optimized pipeline (every pass) and the unoptimized
one (no pass) train identically: the same losses at every iteration, the same episodes.
REINFORCE runs here; PPO's optimized program is checked update by update against JAX in
test_ppo.py, n-step's returns against NumPy in test_algorithms.py (compiling them without
passes takes a minute or more, too long for the suite; the core differential test compiles
random programs both ways)."""

from __future__ import annotations

import numpy as np
import pytest

from tempo.api import checkpoint
from tempo_rl.checkpoints import ENV_PREFIX
from tempo_rl.config import load_config as config
from tempo_rl.train import train


def test_every_pass_or_none_trains_the_same(tmp_path):
    common = ("algorithm=reinforce", "algorithm.num_steps=24", "env.num_envs=2", "total_timesteps=96")
    runs = {name: train(config(*common, f"passes={passes}"), tmp_path / name, progress=False)
            for name, passes in [("optimized", "null"), ("unoptimized", "[]")]}
    optimized, unoptimized = runs["optimized"], runs["unoptimized"]
    assert len(optimized.history) == len(unoptimized.history) == 2
    losses = [name for name in unoptimized.history[0] if name.startswith("losses/")]
    assert losses
    for fast, plain in zip(optimized.history, unoptimized.history):
        for name in losses:
            np.testing.assert_allclose(fast[name], plain[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert optimized.episode_returns, "no episode ended: the returns compared nothing"
    # the same episodes; unoptimized, each env runs on its own and records them in its order
    assert sorted(optimized.episode_returns) == sorted(unoptimized.episode_returns)
    # each env kept its own part of the state for the checkpoint: together, the batched one
    fast, plain = (checkpoint.load(run.checkpoint) for run in (optimized, unoptimized))
    for key in ("obs", "running_return", "running_length", "env0", "env1"):
        np.testing.assert_array_equal(fast[ENV_PREFIX + key], plain[ENV_PREFIX + key], err_msg=key)


@pytest.mark.parametrize("algorithm", ["ppo", "nstep", "reinforce"])
def test_vectorized_and_unvectorized_programs_train_the_same(tmp_path, algorithm):
    """The vectorization pass (and lifting) changes where the per-step work runs, not
    what it computes: every algorithm's losses and episodes match those of its program
    compiled without them."""
    common = (f"algorithm={algorithm}", "env.num_envs=2", "total_timesteps=192",
              *(["algorithm.num_steps=32"] if algorithm != "ppo" else
                ["algorithm.num_steps=32", "algorithm.num_minibatches=2", "algorithm.update_epochs=2"]))
    without = "[fold,simplify,dedup,domains,copies,parallel,fusion]"
    runs = [train(config(*common, f"passes={passes}"), tmp_path / str(k), progress=False)
            for k, passes in enumerate(["null", without])]
    vectorized, plain = runs
    assert any(n.startswith("vectorize: ") and not n.startswith("vectorize: 0 ")
               for n in vectorized.compile_notes)
    assert any(n.startswith("parallel: ") and "ops over b vectorized" in n  # every env at once
               for n in vectorized.compile_notes), vectorized.compile_notes
    losses = [name for name in plain.history[0] if name.startswith("losses/")]
    assert losses and len(vectorized.history) == len(plain.history) == 3
    for fast, slow in zip(vectorized.history, plain.history):
        for name in losses:
            np.testing.assert_allclose(fast[name], slow[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert vectorized.episode_returns == plain.episode_returns


@pytest.mark.parametrize("algorithm", ["nstep", "reinforce", "ppo"])
def test_programs_compiled_as_for_an_accelerator_train_the_same(tmp_path, monkeypatch, algorithm):
    """What an accelerator compiles differently (windows of laid-out rewards padded into
    ``window`` ops, ``PassState.accelerator``), forced either way, changes where the work
    runs, not what it computes: the same losses and episodes as the CPU's program."""
    from tempo import compiler
    from tempo.passes import PassState
    common = (f"algorithm={algorithm}", "env.num_envs=2", "total_timesteps=192", "algorithm.num_steps=32",
              "backend=jax", *(["algorithm.num_minibatches=2", "algorithm.update_epochs=2"]
                               if algorithm == "ppo" else []))
    runs = {}
    for name, on in (("cpu", False), ("accelerator", True)):  # whatever this machine has
        monkeypatch.setattr(compiler, "PassState",
                            lambda *a, on=on, **k: PassState(*a, **{**k, "accelerator": on}))
        runs[name] = train(config(*common), tmp_path / name, progress=False)
    cpu, accelerator = runs["cpu"], runs["accelerator"]
    if algorithm != "ppo":  # n-step's and REINFORCE's windows became window ops
        assert any(n.startswith("tile: ") and "padded to" in n for n in accelerator.compile_notes), \
            accelerator.compile_notes
        assert not any(n.startswith("tile: ") and "padded to" in n for n in cpu.compile_notes)
    losses = [name for name in cpu.history[0] if name.startswith("losses/")]
    assert losses and len(accelerator.history) == len(cpu.history) == 3
    for fast, slow in zip(accelerator.history, cpu.history):
        for name in losses:
            np.testing.assert_allclose(fast[name], slow[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert accelerator.episode_returns == cpu.episode_returns and cpu.episode_returns
