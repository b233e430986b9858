"""Greedy evaluation of a training checkpoint: the policy's most likely action (the argmax
of a categorical policy's logits, a Gaussian policy's mean clipped to the action bounds;
observations normalized with the checkpoint's statistics if the run normalized them), one
episode in each of ``episodes`` envs, as a small RT program over ``t`` (the policy's
parameters are constants loaded from the checkpoint; the env steps in a UDF)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import tempo as tp
from tempo.api import checkpoint
from tempo.errors import CheckpointError
from tempo_rl.algorithms import ALGORITHMS, algorithm
from tempo_rl.algorithms.common import CategoricalPolicy, GaussianPolicy
from tempo_rl.checkpoints import CONFIG_KEY, saved_config
from tempo_rl.envs.normalize import CLIP, EPSILON, STATE_PREFIX
from tempo_rl.train import algorithm_config


@dataclass
class Evaluation:
    returns: list[float]
    lengths: list[int]
    video: Path | None = None

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns))


class _FirstEpisodes:
    """A vector env whose copies each play one episode; later episodes are not counted."""

    def __init__(self, env_id: str, episodes: int, seed: int, record: bool):
        self.envs = gym.make_vec(env_id, num_envs=episodes, vectorization_mode="sync",
                                 render_mode="rgb_array" if record else None)
        self.seed, self.record = seed, record
        self.returns = np.zeros(episodes)
        self.lengths = np.zeros(episodes, np.int64)
        self.running = np.ones(episodes, bool)
        self.frames: list[np.ndarray] = []

    def reset(self) -> np.ndarray:
        obs, _ = self.envs.reset(seed=self.seed)
        self._capture()
        return obs.astype(np.float32)

    def step(self, action: np.ndarray) -> np.ndarray:
        space = self.envs.single_action_space
        if isinstance(space, gym.spaces.Box):  # the policy's actions are flat
            action = action.reshape(len(action), *space.shape)
            action = np.clip(action, space.low, space.high).astype(space.dtype)
        else:
            action = action.astype(np.int64)
        obs, reward, terminated, truncated, _ = self.envs.step(action)
        was_running = self.running.copy()
        self.returns += reward * was_running
        self.lengths += was_running
        self.running &= ~(terminated | truncated)
        if was_running[0]:
            self._capture()
        return obs.astype(np.float32)

    def _capture(self) -> None:
        if self.record:
            self.frames.append(np.asarray(self.envs.render()[0]))


def evaluate(path: str | Path, episodes: int = 10, seed: int | None = None,
             video: str | Path | None = None, max_steps: int | None = None,
             env_id: str | None = None) -> Evaluation:
    """Play ``episodes`` episodes with the greedy policy of checkpoint ``path`` (written by
    ``tempo_rl.train``); ``video``: write the first episode as a GIF there. ``env_id``: the
    gymnasium id to play (by default the checkpoint's; an id that imports a module,
    ``module:Env``, is taken from the caller only, never from a checkpoint)."""
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    out = Path(video) if video is not None else None
    if out is not None:
        _check_writable(out)
    saved = checkpoint.load(path)
    if CONFIG_KEY not in saved:
        raise CheckpointError(f"{path} holds no run config; it was not written by tempo_rl.train")
    cfg = saved_config(saved, path)
    env_cfg = cfg.get("env", {})
    if env_cfg.get("kind", "gymnasium") != "gymnasium":
        raise ValueError(f"evaluation supports gymnasium envs, not {env_cfg.get('kind')!r}")
    module = cfg.get("algorithm", {}).get("module")
    if module and cfg["algorithm"].get("name") not in ALGORITHMS:
        raise CheckpointError(f"{path} was trained with algorithm {cfg['algorithm'].get('name')!r} from "
                              f"module {module!r}, which is not imported; import it first "
                              "(scripts/evaluate.py --import MODULE) if you trust it")
    if env_id is None:
        env_id = str(env_cfg.get("id"))
        if ":" in env_id:
            raise CheckpointError(f"{path} names the env {env_id!r}, which would import a module; "
                                  "pass the id yourself (--env-id) if you trust it")
    seed = int(cfg["seed"]) + 10_000 if seed is None else seed  # episodes training did not see
    env = _FirstEpisodes(env_id, episodes, seed, record=out is not None)
    if not isinstance(env.envs.single_action_space, gym.spaces.Discrete | gym.spaces.Box):
        raise ValueError(f"evaluation supports discrete and box actions, not "
                         f"{env.envs.single_action_space}")
    steps = max_steps or (env.envs.spec.max_episode_steps if env.envs.spec else None)
    if not steps:
        raise ValueError(f"{env_id} has no episode step limit; pass max_steps")
    _run_greedy(env, _policy_config(cfg), saved, steps)
    if out is not None:
        _write_gif(env.frames, out)
    return Evaluation([float(r) for r in env.returns], [int(n) for n in env.lengths], out)


def _check_writable(path: Path) -> None:
    """Fail before playing, not after, when the video cannot be written."""
    if path.is_dir():
        raise ValueError(f"the video path {path} is a directory; name a .gif file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as e:
        raise ValueError(f"cannot write the video to {path}: {e.strerror or e}") from None


def _policy_config(cfg: dict[str, Any]) -> Any:
    cls, _ = algorithm(cfg["algorithm"]["name"])
    return algorithm_config(cls, cfg["algorithm"], cfg.get("network", {}))


def _run_greedy(env: _FirstEpisodes, algo: Any, saved: dict[str, np.ndarray], steps: int) -> None:
    n = env.envs.num_envs
    obs_shape = tuple(env.envs.single_observation_space.shape)
    space = env.envs.single_action_space
    discrete = isinstance(space, gym.spaces.Discrete)
    ctx = tp.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        policy = CategoricalPolicy(obs_shape, int(space.n), algo.hidden, algo.activation, ()) \
            if discrete else GaussianPolicy(obs_shape, int(np.prod(space.shape)), algo.hidden,
                                            algo.activation, ())
        names = [name for name, _ in policy.named_parameters()]  # the optimizer's first params
        policy.load_state({name: saved[f"param{k}"] for k, name in enumerate(names)})
        obs = tp.placeholder(shape=(n, *obs_shape), dtype="float32", domain=(t,))
        (first,) = tp.udf(env.reset, [], [((n, *obs_shape), "float32")], name="env_reset")
        seen = _normalized(obs, saved)
        action = policy(seen).argmax(-1) if discrete else policy(seen)
        (nxt,) = tp.udf(env.step, [action], [((n, *obs_shape), "float32")], name="env_step")
        obs[0] = first
        obs[t + 1] = nxt
    ctx.compile({T: steps}, backend="numpy").run()


def _normalized(obs: tp.RecurrentTensor, saved: dict[str, np.ndarray]) -> tp.RecurrentTensor:
    """``obs`` as the policy saw it in training: normalized with the checkpoint's running
    statistics when the run normalized observations."""
    if STATE_PREFIX + "mean" not in saved:
        return obs
    mean = saved[STATE_PREFIX + "mean"].astype(np.float32)
    scale = np.sqrt(saved[STATE_PREFIX + "var"] + EPSILON).astype(np.float32)
    return ((obs - tp.const(mean)) / tp.const(scale)).clip(-CLIP, CLIP)


def _write_gif(frames: list[np.ndarray], path: Path) -> None:
    from PIL import Image
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(f) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=20, loop=0)
