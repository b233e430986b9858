"""gymnax envs in the graph: the step equals gymnax's own, and PPO learns CartPole on it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import gymnax
import jax
import jax.numpy as jnp
import numpy as np

import tempo as tp
from tempo_rl.config import load_config as config
from tempo_rl.envs import GymnaxEnv
from tempo_rl.metrics import is_measurement
from tempo_rl.train import algorithm, algorithm_config, make_env, train


def test_step_is_gymnax_step_per_env():
    env = GymnaxEnv("CartPole-v1", num_envs=3, seed=0)
    reference, params = gymnax.make("CartPole-v1")
    for k, action in enumerate([0, 1, 1]):
        _, *leaves = env._reset({"b": k})
        state = jax.tree_util.tree_unflatten(env._treedef, [jnp.asarray(x) for x in leaves])
        seed = jnp.int32(7 + k)
        obs, reward, terminated, truncated, final, *after = env.step(seed, jnp.int32(action), *leaves)
        o, s, r, term, trunc, info = reference.step(jax.random.PRNGKey(seed), state, action, params)
        np.testing.assert_allclose(obs, o, rtol=1e-6)
        np.testing.assert_allclose(final, info["final_observation"], rtol=1e-6)
        assert (reward, terminated, truncated) == (r, term, trunc)
        for ours, theirs in zip(after, jax.tree_util.tree_leaves(s)):
            np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_making_an_env_defers_gymnax_plotting_modules():
    """In a fresh interpreter: making a gymnax env imports neither seaborn nor pyplot
    (gymnax's rendering code imports them); its rendering code still gets them when it
    uses them, and a later ``import seaborn`` is the real module."""
    code = textwrap.dedent("""
        import sys, types
        from tempo_rl.envs import GymnaxEnv
        GymnaxEnv("CartPole-v1", num_envs=2, seed=0)
        assert "seaborn" not in sys.modules and "matplotlib.pyplot" not in sys.modules, \\
            [m for m in ("seaborn", "matplotlib.pyplot") if m in sys.modules]
        from gymnax.environments.misc import pong
        assert len(pong.sns.color_palette("cubehelix", 3)) == 3
        assert callable(pong.plt.subplots)
        import seaborn
        assert type(seaborn) is types.ModuleType and seaborn.color_palette is not None
        from tempo_rl.envs.gymnax_env import _plotting_deferred  # used while gymnax imports
        del sys.modules["matplotlib.pyplot"]
        with _plotting_deferred():
            stand_in = sys.modules["matplotlib.pyplot"]
            assert type(stand_in) is not types.ModuleType
            assert callable(stand_in.subplots)  # imports the real module
        assert type(sys.modules["matplotlib.pyplot"]) is types.ModuleType
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_ppo_learns_gymnax_cartpole(tmp_path):
    """61k env steps; a random policy scores ~22."""
    result = train(config("env=gymnax_cartpole", "total_timesteps=61440"), tmp_path, progress=False)
    assert result.mean_return(last=20) >= 100, result.episode_returns[-20:]
    assert max(result.episode_returns) <= 500  # truncated at gymnax's 500 steps


def test_donating_every_buffer_read_last_trains_bit_for_bit_the_same(tmp_path):
    """Parameters and Adam moments updated in their own buffers (JAX backend, donation of
    every input read last, however small) give exactly the run that allocates anew."""
    common = ("env=gymnax_cartpole", "backend=jax", "total_timesteps=1536", "algorithm.update_epochs=2")
    runs = [train(config(*common, *extra), tmp_path / str(k), progress=False)
            for k, extra in enumerate([["memory.donate_min_bytes=0"], ["memory.donate=false"]])]
    donating, plain = runs
    note = next(n for n in donating.compile_notes if n.startswith("donation: "))
    assert not note.startswith("donation: 0 "), note
    assert not any(n.startswith("donation: ") for n in plain.compile_notes)
    def untimed(history: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if not is_measurement(k)} for row in history]
    assert untimed(donating.history) == untimed(plain.history)
    assert donating.episode_returns == plain.episode_returns
    saved = [np.load(run.checkpoint) for run in runs]
    state = [k for k in saved[0].files if k != "__config__"]
    assert len(state) > 10
    for key in state:
        np.testing.assert_array_equal(saved[0][key], saved[1][key], err_msg=key)


def test_low_memory_swaps_the_rollout_not_the_parameters():
    """``memory=low``: what waits for the learning phase (the rollout's observations and
    actions) waits in host memory; the parameters and Adam moments, read by the next
    minibatch update (and by the update peeled after the update loop), stay on the device."""
    cfg = config("env=gymnax_cartpole", "backend=jax", "memory=low", "env.num_envs=512",
                 "algorithm.num_steps=16")  # 8 KiB of observations per step: above the threshold
    env = make_env(cfg["env"], 0)
    cls, build = algorithm("ppo")
    program = build(env, algorithm_config(cls, cfg["algorithm"], cfg["network"]), seed=0)
    exe = program.ctx.compile(program.bounds(2, int(cfg["algorithm"]["num_steps"])), backend="jax",
                              memory=tp.MemoryPolicy(**cfg["memory"]))
    swapped = {exe.graph.ops[k].label for k in exe.swapped}
    assert "obs" in swapped
    parameters = {op.label for op in exe.graph.ops.values() if op.label in ("weight", "bias")} | \
        {op.label for op in exe.graph.ops.values() if op.label.startswith(("mu", "nu"))}
    assert parameters and not parameters & swapped


def test_a_second_run_compiles_nothing(tmp_path, monkeypatch):
    """With the run's cache dir, a second identical run loads every XLA program from JAX's
    persistent cache: the env's and the parameters' programs too (JAX's cache is pointed
    there before they are made), and the update's short sorts (XLA's own: a program that
    calls NumPy back is never cached). The process's own caches of jitted functions are
    emptied between the runs, as a new process starts."""
    from jax._src import compiler

    from tempo import cache
    from tempo.runtime import backends
    compiles = []
    compile_and_load = compiler.backend_compile_and_load
    monkeypatch.setattr(compiler, "backend_compile_and_load",
                        lambda *args, **kwargs: (compiles.append(1), compile_and_load(*args, **kwargs))[1])
    overrides = ["env=gymnax_cartpole", "total_timesteps=1024", f"cache_dir={tmp_path / 'cache'}",
                 "checkpoint_every=0"]
    try:
        counts = []
        for run in range(2):
            compiles.clear()
            jax.clear_caches()
            backends._JIT_CACHE.clear()
            train(config(*overrides), tmp_path / f"run{run}", progress=False)
            counts.append(len(compiles))
    finally:
        cache.set_cache_dir(os.environ.get(cache.ENV))
        cache.enable_jax_cache()
    assert counts[0] > 0 and counts[1] == 0, counts


def test_lowered_loops_train_as_interpreted_ones_with_seeded_carries(tmp_path, monkeypatch):
    """PPO on gymnax with its loops lowered (the default) trains to the losses of the same
    run interpreted. Its update loop reads every parameter and
    Adam moment through a carry seeded with the iteration before's value
    (``LoopPlanner._seeded``), and its acting loop reads the parameters as merges of one
    constant (``_constant_merges``): no output of either is masked, so no select keeps one."""
    from tempo.runtime.lowering import LoopLauncher
    plans, run_lowered = [], LoopLauncher._run_lowered

    def recorded(self: LoopLauncher, plan, span=None):
        plans.append((self, plan))
        return run_lowered(self, plan, span)
    monkeypatch.setattr(LoopLauncher, "_run_lowered", recorded)
    common = ("env=gymnax_cartpole", "backend=jax", "total_timesteps=1536", "checkpoint_every=0")
    runs = {mode: train(config(*common, f"loops={mode}"), tmp_path / mode, progress=False)
            for mode in ("lowered", "interpreted")}
    lowered, interpreted = runs["lowered"], runs["interpreted"]
    assert len(lowered.history) == len(interpreted.history) == 3
    losses = [name for name in lowered.history[0] if name.startswith("losses/")]
    for fast, plain in zip(lowered.history, interpreted.history):
        for name in losses:
            np.testing.assert_allclose(fast[name], plain[name], rtol=1e-5, atol=1e-6, err_msg=name)
    updates = [(launch, plan) for launch, plan in plans if plan.trips == 16]  # (4 epochs x 4 minibatches)
    assert updates and not any(launch.choice.fallbacks for launch, _ in updates)
    launch, plan = updates[-1]
    assert not plan.masked
    assert sum(fetch[0] == "seed" for fetch in launch.planner.templates[0].fetches) >= 24  # (12 parameters,
    # their Adam moments: each started from the iteration before's)
    acting = [plan for _, plan in plans if plan.trips == 64]  # (the default 64 steps)
    assert acting and not acting[-1].masked
