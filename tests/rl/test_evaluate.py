"""Greedy evaluation of a checkpoint equals a plain NumPy rollout of the same policy, and
writes the first episode as a GIF."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image

from tempo.api import checkpoint
from tempo_rl.config import load_config as config
from tempo_rl.evaluate import evaluate
from tempo_rl.train import train

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    cfg = config("algorithm.num_steps=16", "env.num_envs=2", "total_timesteps=512")
    return train(cfg, out, progress=False).checkpoint


def _layers(arrays: dict[str, np.ndarray], first: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The policy MLP's (weight, bias) pairs, from checkpoint entry ``param<first>`` on."""
    return [(arrays[f"param{first + 2 * k}"], arrays[f"param{first + 2 * k + 1}"]) for k in range(3)]


def _mlp(layers: list[tuple[np.ndarray, np.ndarray]], h: np.ndarray) -> np.ndarray:
    for k, (w, b) in enumerate(layers):
        h = h @ w + b
        h = np.tanh(h) if k < len(layers) - 1 else h
    return h


def _numpy_return(env_id: str, seed: int, act) -> float:
    """One episode of ``env_id`` from ``seed`` with ``act(obs)``; its return."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(act(obs.astype(np.float32)))
        total += float(reward)
        done = terminated or truncated
    return total


def _numpy_greedy_return(arrays: dict[str, np.ndarray], seed: int) -> float:
    layers = _layers(arrays, 0)
    return _numpy_return("CartPole-v1", seed, lambda obs: int(np.argmax(_mlp(layers, obs))))


def test_greedy_returns_match_a_numpy_rollout(saved, tmp_path):
    result = evaluate(saved, episodes=3, seed=7, video=tmp_path / "episode.gif")
    arrays = checkpoint.load(saved)
    assert result.returns == [_numpy_greedy_return(arrays, 7 + k) for k in range(3)]
    assert result.lengths == [int(r) for r in result.returns]  # CartPole: reward 1 per step
    with Image.open(result.video) as gif:  # the reset, then every step (the GIF writer
        assert 1 < gif.n_frames <= result.lengths[0] + 1  # merges identical frames)


def test_cli_prints_the_mean_return(saved):
    done = subprocess.run([sys.executable, "scripts/evaluate.py", str(saved), "--episodes", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mean return" in done.stdout and "over 2 episodes" in done.stdout


def _numpy_mean_action_return(arrays: dict[str, np.ndarray], seed: int) -> float:
    """Pendulum with the Gaussian policy's mean action (param0 is its log std; then the
    mean MLP's weights and biases), clipped to the action bounds; observations normalized
    with the checkpoint's statistics when it has them."""
    layers = _layers(arrays, 1)

    def act(obs: np.ndarray) -> np.ndarray:
        if "obs_norm.mean" in arrays:
            scale = np.sqrt(arrays["obs_norm.var"] + 1e-8).astype(np.float32)
            obs = np.clip((obs - arrays["obs_norm.mean"]) / scale, -10, 10)
        return np.clip(_mlp(layers, obs), -2.0, 2.0)
    return _numpy_return("Pendulum-v1", seed, act)


@pytest.mark.parametrize("normalize", [False, True])
def test_continuous_actions_evaluate_with_the_mean_action(tmp_path, normalize):
    cfg = config("env=pendulum", "algorithm.num_steps=16", "env.num_envs=2", "total_timesteps=64",
                 f"env.normalize_obs={str(normalize).lower()}")
    saved = train(cfg, tmp_path, progress=False).checkpoint
    result = evaluate(saved, episodes=2, seed=3)
    arrays = checkpoint.load(saved)
    assert result.lengths == [200, 200]
    expected = [_numpy_mean_action_return(arrays, 3 + k) for k in range(2)]
    assert result.returns == pytest.approx(expected, rel=1e-5)


def test_bad_episodes_and_an_unwritable_video_fail_before_playing(saved, tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import evaluate as script
    finally:
        sys.path.pop(0)
    with pytest.raises(SystemExit):
        script.main([str(saved), "--episodes", "0"])
    assert "--episodes must be at least 1" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot write the video"):
        evaluate(saved, episodes=1, video=blocker / "episode.gif")
