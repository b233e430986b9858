"""Checkpoints cannot run code, and a damaged one is a one-line error naming the file.

A crafted checkpoint has, in turn, each of its entries replaced by a malicious pickle (an
object array, which ``np.savez`` pickles, and raw pickle bytes in a uint8 array, the form
env state once had): loading it through every entry point (``tempo.api.checkpoint.load``,
resuming a training run, ``tempo_rl.evaluate`` and ``scripts/evaluate.py``) must fail
cleanly without unpickling, which the payload would reveal by creating a file.
"""

from __future__ import annotations

import collections
import pickle
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from tempo.api import checkpoint
from tempo.errors import CheckpointError, TempoError
from tempo_rl.checkpoints import CONFIG_KEY, ENV_PREFIX
from tempo_rl.config import load_config as config
from tempo_rl.envs import gym_state
from tempo_rl.evaluate import evaluate
from tempo_rl.train import train

ROOT = Path(__file__).resolve().parents[2]
RUN = ("algorithm=nstep", "algorithm.num_steps=8", "env.num_envs=2", "total_timesteps=32")


class _Payload:
    """Unpickling it creates ``marker``: proof that a loader executed pickled code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Path:
    return train(config(*RUN), tmp_path_factory.mktemp("run"), progress=False).checkpoint


def _crafted(genuine: Path, entry: str, form: str, marker: Path, out: Path) -> Path:
    arrays = dict(np.load(genuine))
    payload = _Payload(marker)
    arrays[entry] = np.array([payload], dtype=object) if form == "object" else \
        np.frombuffer(pickle.dumps(payload), np.uint8)
    with open(out, "wb") as f:
        np.savez(f, **arrays)  # pickles the object array
    return out


def _entry_points(path: Path) -> list:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import evaluate as evaluate_script
    finally:
        sys.path.pop(0)
    return [lambda: checkpoint.load(path),
            lambda: train(config(*RUN, f"resume_from={path}"), path.parent / "resumed", progress=False),
            lambda: evaluate(path, episodes=1),
            lambda: evaluate_script.main([str(path), "--episodes", "1"])]


@pytest.mark.parametrize("form", ["object", "bytes"])
def test_no_entry_point_runs_a_pickle_in_any_entry(genuine, tmp_path, form):
    entries = list(np.load(genuine).files)
    assert CONFIG_KEY in entries and any(e.startswith(ENV_PREFIX) for e in entries)
    marker = tmp_path / "executed"
    for entry in entries:
        path = _crafted(genuine, entry, form, marker, tmp_path / "crafted.npz")
        for run in _entry_points(path):
            try:
                run()
            except (CheckpointError, TempoError, ValueError, SystemExit) as e:
                assert "allow_pickle" not in str(e), e
            assert not marker.exists(), f"unpickled the crafted {entry!r}"
    if form == "object":
        with pytest.raises(CheckpointError, match="holds Python objects"):
            checkpoint.load(_crafted(genuine, entries[0], form, marker, tmp_path / "crafted.npz"))


@pytest.mark.parametrize("entry", [CONFIG_KEY, ENV_PREFIX + "env0", "param0"])
def test_resuming_a_checkpoint_with_pickle_bytes_fails_before_training(genuine, tmp_path, entry):
    marker = tmp_path / "executed"
    path = _crafted(genuine, entry, "bytes", marker, tmp_path / "crafted.npz")
    with pytest.raises(CheckpointError, match="crafted.npz"):
        train(config(*RUN, f"resume_from={path}"), tmp_path / "resumed", progress=False)
    assert not marker.exists()
    assert not (tmp_path / "resumed" / "checkpoints" / "last.npz").exists()


def test_a_checkpoint_cannot_make_evaluation_import_a_module(genuine, tmp_path):
    arrays = dict(np.load(genuine))
    cfg = config(*RUN)
    cfg["env"]["id"] = "os:system"
    arrays[CONFIG_KEY] = np.frombuffer(__import__("json").dumps(cfg).encode(), np.uint8)
    path = tmp_path / "module.npz"
    np.savez(path, **arrays)
    with pytest.raises(CheckpointError, match="would import a module"):
        evaluate(path, episodes=1)


def _damaged(kind: str, genuine: Path, tmp: Path) -> Path:
    path = tmp / "damaged.npz"
    if kind == "truncated":
        path.write_bytes(genuine.read_bytes()[:len(genuine.read_bytes()) // 2])
    elif kind == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    elif kind == "npy":
        path = tmp / "array.npy"
        np.save(path, np.zeros(3))
    return path


@pytest.mark.parametrize("kind", ["truncated", "random bytes", "empty", "directory", "npy"])
def test_a_damaged_file_is_a_one_line_error_naming_it(genuine, tmp_path, kind):
    path = _damaged(kind, genuine, tmp_path)
    for load in (lambda: checkpoint.load(path),
                 lambda: train(config(*RUN, f"resume_from={path}"), tmp_path / "run", progress=False)):
        with pytest.raises(CheckpointError) as caught:
            load()
        message = str(caught.value)
        assert str(path) in message and "\n" not in message, message


def test_a_checkpoint_of_another_env_kind_is_refused(tmp_path):
    synthetic = train(config(*RUN, "env=synthetic"), tmp_path / "synthetic", progress=False).checkpoint
    with pytest.raises(CheckpointError, match="env.kind"):
        train(config(*RUN, f"resume_from={synthetic}"), tmp_path / "cartpole", progress=False)
    # forced past the config check, the env state itself does not fit
    with pytest.raises(CheckpointError, match="another kind of env"):
        train(config(*RUN, f"resume_from={synthetic}", "resume_override=true"), tmp_path / "forced",
              progress=False)


def test_a_gymnasium_env_state_round_trips_as_plain_data():
    env = gym.make("CartPole-v1")
    env.reset(seed=5)
    for _ in range(3):
        env.step(1)
    copy = gym.make("CartPole-v1")
    gym_state.load(copy, __import__("json").loads(__import__("json").dumps(gym_state.dump(env))))
    for _ in range(200):  # the same steps, resets and reset draws
        steps = [e.step(0) for e in (env, copy)]
        np.testing.assert_array_equal(steps[0][0], steps[1][0])
        if steps[0][2] or steps[0][3]:
            np.testing.assert_array_equal(env.reset()[0], copy.reset()[0])


def test_an_env_whose_state_is_not_plain_data_is_an_error_at_checkpoint_time():
    env = gym.make("CartPole-v1")
    env.unwrapped.frames = collections.deque([np.zeros(2)])
    with pytest.raises(gym_state.EnvStateError, match=r"CartPoleEnv\.frames holds a deque"):
        gym_state.dump(env)


def test_a_stored_env_state_cannot_set_what_gym_make_builds():
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    stored = gym_state.dump(env)
    stored[0]["attrs"]["env"] = "replaced"
    with pytest.raises(gym_state.EnvStateError, match="only gym.make builds"):
        gym_state.load(gym.make("CartPole-v1"), stored)
    with pytest.raises(gym_state.EnvStateError, match="layers"):
        gym_state.load(gym.make("CartPole-v1"), ["not a layer"] * len(stored))
