"""Training split over devices (``distributed=data``): the env dim ``b`` over a mesh of
forced CPU devices trains as the one-device run does (the same final checkpoint), with
the rollout actually split; the config errors of a split that cannot be made; the CLI
names the mesh.

JAX makes several CPU devices only when ``XLA_FLAGS`` asks for them before it is imported,
and this process imported it already: every run over several devices is a fresh
interpreter, which prints its results as JSON on its last line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tempo_rl import distributed
from tempo_rl.checkpoints import CONFIG_KEY
from tempo_rl.config import load_config as config
from tempo_rl.options import ConfigError
from tempo_rl.train import train

ROOT = Path(__file__).resolve().parents[2]
DEVICES = 4
TINY = ("env.num_envs=8", "algorithm.num_steps=16", "total_timesteps=256", "backend=jax")
"""Two iterations of 8 envs x 16 steps."""


def _device_env(devices: int = DEVICES) -> dict[str, str]:
    return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            "JAX_PLATFORMS": "cpu"}


def _run_with_devices(code: str, *args: str, timeout: int = 240) -> dict:
    """Run ``code`` (with ``args``) in a fresh interpreter where JAX sees ``DEVICES`` CPU
    devices; its last line of output, parsed."""
    try:
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=_device_env(),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the subprocess did not return within {timeout} s\n"
                    f"{(err.stdout or b'')[-3000:]!r}\n{(err.stderr or b'')[-3000:]!r}")
    how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
    assert done.returncode == 0, f"the subprocess ended: {how}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output\n{done.stderr[-5000:]}"
    return json.loads(lines[-1])


# Train the same config split over every device (distributed=data) and on one device
# (distributed=none, the same devices visible but unused).
SPLIT_AND_PLAIN = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import jax
    from tempo_rl.config import load_config
    from tempo_rl.train import train

    out = Path(sys.argv[1])
    common = sys.argv[2:]
    result = {"devices": jax.device_count()}
    for name in ("data", "none"):
        run = train(load_config(*common, f"distributed={name}", f"cache_dir={out / 'cache'}"),
                    out / name, progress=False)
        result[name] = {"checkpoint": str(run.checkpoint), "memory": run.memory,
                        "returns": run.episode_returns, "iterations": len(run.history)}
    print(json.dumps(result))
""")


@pytest.mark.parametrize("algorithm,env", [("ppo", "gymnax_cartpole"), ("nstep", "synthetic")])
def test_split_run_trains_as_the_one_device_run(tmp_path, algorithm, env):
    runs = _run_with_devices(SPLIT_AND_PLAIN, str(tmp_path), f"algorithm={algorithm}", f"env={env}", *TINY)
    assert runs["devices"] == DEVICES, "XLA_FLAGS did not make the CPU devices"
    split, plain = runs["data"], runs["none"]
    assert split["iterations"] == plain["iterations"] == 2
    # the rollout is split over the devices; nothing is, on one device
    assert split["memory"]["split_peak_mb"] > 0, split["memory"]
    assert plain["memory"]["split_peak_mb"] == 0, plain["memory"]
    assert split["returns"] == plain["returns"]
    saved = [np.load(run["checkpoint"]) for run in (split, plain)]
    assert set(saved[0].files) == set(saved[1].files)
    names = [k for k in saved[0].files if k != CONFIG_KEY]  # the configs differ by distributed
    assert any(k.startswith("param") for k in names), names
    floats = 0
    for name in names:
        a, b = saved[0][name], saved[1][name]
        assert a.shape == b.shape and a.dtype == b.dtype, name
        if a.dtype.kind == "f":
            floats += 1
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
        else:  # counters, the iteration, env state that is not a float: exactly
            np.testing.assert_array_equal(a, b, err_msg=name)
    assert floats >= 12  # parameters, Adam's moments, env state


# Errors only a process that sees several devices can give: env.num_envs that the devices
# cannot split, more devices asked for than there are.
DEVICE_ERRORS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from tempo_rl.config import load_config
    from tempo_rl.options import ConfigError
    from tempo_rl.train import train

    out = Path(sys.argv[1])

    def error_of(name, *overrides):
        try:
            train(load_config("algorithm=nstep", "env=synthetic", "algorithm.num_steps=16",
                              "backend=jax", "cache_dir=off", "distributed=data", *overrides),
                  out / name, progress=False)
        except ConfigError as err:
            return str(err)
        except Exception as err:
            return f"not a ConfigError: {type(err).__name__}: {err}"
        return None

    # total_timesteps: two whole iterations, so that only the split is wrong
    print(json.dumps({"uneven": error_of("uneven", "env.num_envs=6", "total_timesteps=192"),
                      "too_many": error_of("too_many", "env.num_envs=8", "total_timesteps=256",
                                           "distributed.devices=8")}))
""")


def test_splits_the_devices_cannot_make_are_config_errors(tmp_path):
    errors = _run_with_devices(DEVICE_ERRORS, str(tmp_path))
    assert errors["uneven"] is not None, "env.num_envs=6 trained over 4 devices"
    assert "cannot be split evenly" in errors["uneven"], errors["uneven"]
    assert errors["too_many"] is not None, "distributed.devices=8 trained with 4 devices"
    assert "xla_force_host_platform_device_count" in errors["too_many"], errors["too_many"]


def test_unknown_mode_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="bogus"):
        train(config("algorithm=nstep", "env=synthetic", *TINY, "distributed=data", "distributed.mode=bogus"),
              tmp_path, progress=False)


@pytest.mark.parametrize("given", [
    ["distributed.num_processes=2"],
    ["distributed.num_processes=2", "distributed.process_id=1"],
    ["distributed.process_id=0", "distributed.coordinator_address=127.0.0.1:1234"]])
def test_incomplete_multi_host_options_are_config_errors(given):
    # options() alone: a check that let them through must not join processes in this one
    cfg = config("algorithm=nstep", "env=synthetic", *TINY, "distributed=data", *given)
    with pytest.raises(ConfigError, match="coordinator_address"):
        distributed.options(cfg)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


UNREACHABLE = textwrap.dedent("""
    import json, sys
    from tempo_rl.config import load_config
    from tempo_rl.options import ConfigError
    from tempo_rl.train import train

    cfg = load_config("algorithm=nstep", "env=synthetic", "env.num_envs=8", "algorithm.num_steps=16",
                      "total_timesteps=256", "backend=jax", "cache_dir=off", "distributed=data",
                      "distributed.num_processes=2", "distributed.process_id=1",
                      f"distributed.coordinator_address=127.0.0.1:{sys.argv[2]}",
                      "distributed.initialization_timeout=2")
    try:
        train(cfg, sys.argv[1], progress=False)
        result = {"error": None}
    except ConfigError as err:
        result = {"error": str(err)}
    except Exception as err:
        result = {"error": f"not a ConfigError: {type(err).__name__}: {err}"}
    print(json.dumps(result))
""")


def test_unreachable_coordinator_is_a_one_line_config_error(tmp_path):
    """Process 1 of 2, nothing listening at the coordinator's address: a ConfigError
    within about the timeout, not a hang or a crash."""
    result = _run_with_devices(UNREACHABLE, str(tmp_path / "run"), str(_unused_port()), timeout=90)
    message = result["error"]
    assert message is not None, "trained without its coordinator"
    assert "could not join" in message, message
    assert "\n" not in message, message


def test_cli_names_the_mesh(tmp_path):
    cmd = [sys.executable, "scripts/train.py", "distributed=data", "algorithm=nstep", "env=synthetic",
           "env.num_envs=8", "algorithm.num_steps=16", "total_timesteps=128", "backend=jax",
           "progress=false", "cache_dir=off", f"hydra.run.dir={tmp_path / 'run'}"]
    done = subprocess.run(cmd, cwd=ROOT, env=_device_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = done.stdout.splitlines()
    assert any(line.startswith(f"mesh: b over {DEVICES}") for line in lines), done.stdout
    assert any("split over devices" in line for line in lines), done.stdout


def _two_processes(tmp_path: Path, env: str, *overrides: str, runs: str = "process") -> None:
    """Train ``env`` with ``TINY`` (and ``overrides``, of which ``{k}`` becomes the
    process's index) in two processes on this machine (one CPU device each, JAX's gloo
    collectives between them) joined through the coordinator, each with its own run dir
    ``<runs><k>``."""
    port = _unused_port()
    common = ["scripts/train.py", f"env={env}", *TINY, "progress=false", "cache_dir=off", *overrides,
              "distributed=data", "distributed.num_processes=2", "distributed.initialization_timeout=60",
              f"distributed.coordinator_address=127.0.0.1:{port}"]
    environ = {**_device_env(1), "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    procs = [subprocess.Popen([sys.executable, *(arg.replace("{k}", str(k)) for arg in common),
                               f"distributed.process_id={k}", f"hydra.run.dir={tmp_path / f'{runs}{k}'}"],
                              cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for k in range(2)]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=240))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the two processes did not finish within 240 s")
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    mesh = "mesh: b over 2 cpu device(s) on 2 host(s)"
    assert any(line.startswith(mesh) for line in outputs[0][0].splitlines()), outputs[0][0]


def _assert_same(saved: dict, reference: dict, names: list[str]) -> None:
    for name in names:
        if reference[name].dtype.kind == "f":
            np.testing.assert_allclose(saved[name], reference[name], rtol=1e-5, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(saved[name], reference[name], err_msg=name)


def test_two_processes_train_as_one(tmp_path):
    """Two processes train PPO on gymnax as one process does on one device: both write
    the one-device run's checkpoint (the in-graph envs' state gathered whole)."""
    _two_processes(tmp_path, "gymnax_cartpole")
    alone = train(config("env=gymnax_cartpole", *TINY, "cache_dir=off"), tmp_path / "alone", progress=False)
    reference = np.load(alone.checkpoint)
    for k in range(2):
        saved = np.load(tmp_path / f"process{k}" / "checkpoints" / "last.npz")
        _assert_same(saved, reference, [n for n in reference.files if n != CONFIG_KEY])


def test_two_processes_each_step_their_own_gymnasium_envs(tmp_path):
    """Gymnasium CartPole over two processes: each makes and steps only the 4 envs of its
    own device's shard (its checkpoint holds their state, ``env_indices``), and the
    parameters, optimizer state and those envs' states and observations are the
    one-device run's."""
    _two_processes(tmp_path, "cartpole")
    alone = train(config("env=cartpole", *TINY, "cache_dir=off"), tmp_path / "alone", progress=False)
    reference = np.load(alone.checkpoint)
    env = "__env__."
    shared = [n for n in reference.files if n != CONFIG_KEY and not n.startswith(env)]
    assert any(n.startswith("param") for n in shared), shared
    for k in range(2):
        saved = np.load(tmp_path / f"process{k}" / "checkpoints" / "last.npz")
        _assert_same(saved, reference, shared)  # parameters, optimizer state, iteration
        own = list(range(4 * k, 4 * k + 4))
        np.testing.assert_array_equal(saved[env + "env_indices"], own)
        held = sorted(n for n in saved.files if n.startswith(env + "env") and n[len(env) + 3:].isdigit())
        assert held == sorted(f"{env}env{j}" for j in own), held  # made and stepped only its own
        for j in own:
            np.testing.assert_array_equal(saved[f"{env}env{j}"], reference[f"{env}env{j}"])
        np.testing.assert_allclose(saved[env + "obs"], reference[env + "obs"][own], rtol=1e-6)
        for name in ("running_return", "running_length"):  # its own envs' episodes under way
            np.testing.assert_allclose(saved[env + name][own], reference[env + name][own], rtol=1e-6)
    # each process resumes from its own checkpoint and trains on as the one-device run does
    _two_processes(tmp_path, "cartpole", "total_timesteps=512",
                   f"resume_from={tmp_path / 'process{k}' / 'checkpoints' / 'last.npz'}", runs="resumed")
    on = train(config("env=cartpole", *TINY, "total_timesteps=512", "cache_dir=off",
                      f"resume_from={alone.checkpoint}"), tmp_path / "alone_resumed", progress=False)
    assert len(on.history) == 2  # (two more iterations)
    later = np.load(on.checkpoint)
    for k in range(2):
        saved = np.load(tmp_path / f"resumed{k}" / "checkpoints" / "last.npz")
        _assert_same(saved, later, shared)


def test_a_gymnasium_env_steps_saves_and_restores_only_the_rows_it_is_given():
    """The host side of ``own_rows``, in this process: called with env indices 4-7 of 8,
    a gymnasium env makes and steps only those (the same steps as a whole env's envs 4-7),
    its snapshot holds their state and ``env_indices``, and a fresh env restored from it
    makes only those envs and resets them to the saved observations."""
    from tempo_rl.envs import GymnasiumEnv
    own = np.arange(4, 8)
    part, whole = GymnasiumEnv("CartPole-v1", 8, seed=3), GymnasiumEnv("CartPole-v1", 8, seed=3)
    first = np.stack([part._reset({"b": int(k)})[0] for k in own])
    np.testing.assert_array_equal(first, np.stack([whole._reset({"b": k})[0] for k in range(8)])[own])
    actions = np.array([0, 1, 1, 0, 1, 0, 0, 1])
    for _ in range(30):  # (long enough for some episodes to end and reset)
        ours = part._step_all({"i": 0, "t": 0, "b": own}, actions[own])
        theirs = whole._step_all({"i": 0, "t": 0}, actions)
        for a, b in zip(ours, theirs):
            np.testing.assert_array_equal(a, b[own])
    assert sorted(part.envs) == own.tolist()
    part._carry({"i": 0, "b": own}, ours[0])
    saved = part.snapshot(0)
    np.testing.assert_array_equal(saved["env_indices"], own)
    assert sorted(n for n in saved if n.startswith("env") and n[3:].isdigit()) == [f"env{k}" for k in own]
    fresh = GymnasiumEnv("CartPole-v1", 8, seed=99)
    fresh.restore(saved)
    assert sorted(fresh.envs) == own.tolist()
    np.testing.assert_array_equal(np.stack([fresh._reset({"b": int(k)})[0] for k in own]), ours[0])
    after = fresh._step_all({"i": 1, "t": 0, "b": own}, actions[own])
    np.testing.assert_array_equal(after[0], part._step_all({"i": 1, "t": 0, "b": own}, actions[own])[0])
