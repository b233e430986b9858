"""What an algorithm needs from an environment."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

import tempo as tp
from tempo.api.tensor import RecurrentTensor
from tempo.symbolic.expr import Symbol

Policy = Callable[[RecurrentTensor], tuple[RecurrentTensor, dict[str, RecurrentTensor]]]


@dataclass
class Rollout:
    """The RTs of one rollout, all with domain ``(b, i, t)``: env, iteration, step."""

    obs: RecurrentTensor
    action: RecurrentTensor
    reward: RecurrentTensor
    terminated: RecurrentTensor
    truncated: RecurrentTensor
    final_obs: RecurrentTensor
    """The observation the step led to, before any reset (for bootstrapping)."""
    extras: dict[str, RecurrentTensor] = field(default_factory=dict)
    """What the policy returned beside the action (log-probabilities, entropies)."""
    saved: RecurrentTensor | None = None
    """A scalar over ``(i,)`` computed right after the envs recorded iteration ``i`` (and
    kept their states, ``env.snapshot(i)``, where a checkpoint follows it); host work that
    stores it reads this to run after."""


class EpisodeStats:
    """Returns and lengths of finished episodes, accumulated step by step on the host."""

    KEPT = 100
    """Finished episodes a snapshot keeps."""

    def __init__(self, num_envs: int):
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.running_return = np.zeros(num_envs)
        self.running_length = np.zeros(num_envs, np.int64)

    def record(self, reward: np.ndarray, done: np.ndarray, envs: np.ndarray | None = None) -> None:
        """One step of every env, or of ``envs`` (indices; ``reward`` and ``done`` theirs)."""
        at = slice(None) if envs is None else envs
        self.running_return[at] += reward
        self.running_length[at] += 1
        for n in np.flatnonzero(done):
            self._finish(int(n if envs is None else envs[n]))

    def record_env(self, k: int, reward: np.ndarray, done: np.ndarray) -> None:
        """Steps of env ``k`` (scalars, or one iteration's ``(T,)`` arrays)."""
        if np.ndim(reward):
            self.record_steps(np.asarray(reward)[None], np.asarray(done)[None], np.array([k]))
            return
        self.running_return[k] += reward
        self.running_length[k] += 1
        if done:
            self._finish(k)

    def record_steps(self, rewards: np.ndarray, dones: np.ndarray, envs: np.ndarray | None = None) -> None:
        """``T`` steps of every env, or of ``envs`` at once: ``(envs, T)`` rewards and ends.

        The same as ``record`` step by step, episodes in the same order (by step, then
        env), without a Python loop over the steps: an episode's return is a difference of
        running sums in float64, which equals the step-by-step sum wherever float64 adds
        the rewards exactly (as it adds float32 rewards of one magnitude); the first
        episode of each env in the block is summed in the same order as ``record``'s."""
        at = slice(None) if envs is None else envs
        rewards = np.asarray(rewards, np.float64)
        n, steps = rewards.shape
        sums = np.cumsum(np.concatenate([self.running_return[at][:, None], rewards], axis=1), axis=1)
        if not np.isfinite(sums).all():  # (differences would carry a NaN past its episode's end)
            for t in range(steps):
                self.record(rewards[:, t], np.asarray(dones)[:, t], envs)
            return
        env, step = (a.astype(np.int64) for a in np.nonzero(np.asarray(dones) != 0))  # env-major
        first = np.ones(len(env), bool)
        first[1:] = env[1:] != env[:-1]
        final = np.ones(len(env), bool)  # each env's last end in the block
        final[:-1] = env[1:] != env[:-1]
        before = np.where(first, 0, np.roll(step + 1, 1))  # where the episode began in the block
        returns = sums[env, step + 1] - np.where(first, 0.0, sums[env, before])
        lengths = step + 1 - before + np.where(first, self.running_length[at][env], 0)
        order = np.lexsort((env, step))  # by step, then env: ``record``'s order
        self.returns.extend(returns[order].tolist())
        self.lengths.extend(lengths[order].tolist())
        last = np.full(n, -1, np.int64)  # per env, its last end's step in the block
        last[env[final]] = step[final]
        ended = last >= 0
        running = sums[:, steps].copy()
        running[ended] -= sums[ended, last[ended] + 1]
        length = self.running_length[at] + steps
        length[ended] = steps - 1 - last[ended]
        self.running_return[at], self.running_length[at] = running, length

    def _finish(self, k: int) -> None:
        self.returns.append(float(self.running_return[k]))
        self.lengths.append(int(self.running_length[k]))
        self.running_return[k], self.running_length[k] = 0.0, 0

    def finished(self) -> dict[str, np.ndarray]:
        """The last ``KEPT`` finished episodes, for a snapshot (a resumed run's summary
        covers the whole run)."""
        return {"finished_returns": np.asarray(self.returns[-self.KEPT:], np.float64),
                "finished_lengths": np.asarray(self.lengths[-self.KEPT:], np.int64)}

    def in_progress(self, k: int | None = None) -> dict[str, np.ndarray]:
        """The episodes under way (of env ``k``, or all), for a snapshot."""
        pick = slice(None) if k is None else k
        return {"running_return": np.array(self.running_return[pick]),
                "running_length": np.array(self.running_length[pick])}

    def resume(self, saved: dict[str, np.ndarray]) -> None:
        for name in ("running_return", "running_length"):
            if saved[name].shape != getattr(self, name).shape:
                raise ValueError(f"the env state's {name} has shape {saved[name].shape}, this env's "
                                 f"{getattr(self, name).shape} (another number of envs)")
        self.running_return = saved["running_return"].astype(self.running_return.dtype)
        self.running_length = saved["running_length"].astype(self.running_length.dtype)
        if "finished_returns" in saved:
            self.returns = [float(r) for r in saved["finished_returns"]]
            self.lengths = [int(n) for n in saved["finished_lengths"]]


class Snapshots:
    """An env's state at the end of the last few iterations it was kept at
    (``EnvBase.snapshots_at``), for checkpoints: named numeric arrays (structure as JSON in
    a uint8 array), never Python objects."""

    KEPT = 4

    def __init__(self) -> None:
        self._by_iteration: dict[int, dict[str, np.ndarray]] = {}
        self._parts: dict[int, dict[int, dict[str, np.ndarray]]] = {}

    def keep(self, iteration: int, state: dict[str, Any]) -> None:
        self._by_iteration[iteration] = {name: np.array(value) for name, value in state.items()}
        for old in [k for k in self._by_iteration if k <= iteration - self.KEPT]:
            del self._by_iteration[old]

    def keep_env(self, iteration: int, k: int, num_envs: int, state: dict[str, Any],
                 shared: Callable[[], dict[str, Any]]) -> None:
        """Env ``k``'s part of the state after ``iteration`` (when the env dim was not laid
        out, each env keeps its own); kept as a whole, with ``shared()``, once every env has."""
        parts = self._parts.setdefault(iteration, {})
        parts[k] = state
        if len(parts) == num_envs:
            del self._parts[iteration]
            self.keep(iteration, {**_stacked_parts([parts[n] for n in range(num_envs)]), **shared()})

    def get(self, iteration: int) -> dict[str, np.ndarray]:
        try:
            return self._by_iteration[iteration]
        except KeyError:
            raise RuntimeError(f"no env snapshot for iteration {iteration}; kept: "
                               f"{sorted(self._by_iteration)}") from None


def _stacked_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-env states as one: entries every env has stacked, entries of one env (named
    after it) kept."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if all(key in p for p in parts):
                out.setdefault(key, np.stack([p[key] for p in parts]))
            else:
                out[key] = value
    return out


def json_array(document: Any) -> np.ndarray:
    """``document`` as JSON, in a uint8 array (a checkpoint entry)."""
    return np.frombuffer(json.dumps(document).encode(), np.uint8).copy()


def from_json_array(array: np.ndarray, what: str) -> Any:
    """The JSON document ``json_array`` stored; ``what`` names it in errors."""
    if array.dtype != np.uint8 or array.ndim != 1:
        raise ValueError(f"{what} is not a JSON document (a {array.dtype} array of shape {array.shape})")
    try:
        return json.loads(array.tobytes().decode())
    except ValueError as e:
        raise ValueError(f"{what} is not valid JSON ({e})") from None


class EnvBase:
    """What the envs here share: finished episodes counted on the host, and the env's state
    kept at the end of the iterations a checkpoint may follow."""

    num_envs: int
    obs_shape: tuple[int, ...]

    def __init__(self, num_envs: int):
        self.stats = EpisodeStats(num_envs)
        self.snapshots = Snapshots()
        self._snapshot_at: Callable[[int], bool] = lambda iteration: True
        self._env_dim, self._iteration_dim = "b", "i"

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.obs_shape))

    @property
    def episode_returns(self) -> list[float]:
        return self.stats.returns

    @property
    def episode_lengths(self) -> list[int]:
        return self.stats.lengths

    def snapshot(self, iteration: int) -> dict[str, np.ndarray]:
        return self.snapshots.get(iteration)

    def snapshots_at(self, when: Callable[[int], bool]) -> None:
        """Keep a snapshot only after the iterations ``when`` holds at (the run's
        checkpoint schedule): a state costs host time to build (a gymnasium env's is
        each env's layers as JSON, 0.5 ms an iteration at 8 envs)."""
        self._snapshot_at = when

    def _restored_stats(self, saved: dict[str, np.ndarray], names: tuple[str, ...]) -> None:
        """Check that ``saved`` has ``names`` (and the episodes in progress) for
        ``num_envs`` envs, then continue its episodes."""
        missing = sorted({*names, "running_return", "running_length"} - set(saved))
        if missing:
            raise ValueError(f"the env state has no {missing}; it was written by another kind of env "
                             f"(it has {sorted(saved)})")
        for name, value in saved.items():
            if value.dtype.kind not in "biuf":
                raise ValueError(f"the env state's {name!r} is a {value.dtype} array, not numbers")
        self.stats.resume(saved)

    def _dims(self, b: Symbol, i: Symbol) -> None:
        self._env_dim, self._iteration_dim = b.name, i.name

    def _keep_snapshot(self, point: dict[str, int], state: Callable[[], dict[str, Any]]) -> int:
        """Keep ``state()`` and the episodes in progress as the envs after the iteration of
        ``point`` (a UDF's point: of one env when it has the env dim, else of all), where
        a checkpoint may be written then (``snapshots_at``)."""
        iteration = point[self._iteration_dim]
        if not self._snapshot_at(iteration):
            return iteration
        k = point.get(self._env_dim)
        if k is None or isinstance(k, np.ndarray):  # all envs, or this process's (``own_rows``)
            self.snapshots.keep(iteration, {**state(), **self.stats.in_progress(), **self.stats.finished()})
        else:
            self.snapshots.keep_env(iteration, k, self.num_envs, {**state(), **self.stats.in_progress(k)},
                                    self.stats.finished)
        return iteration

    def _record_rollout(self, point: dict[str, int], rewards: np.ndarray, dones: np.ndarray) -> None:
        """Count the episodes of one iteration's rewards and ends: ``(T,)`` each of env
        ``point[b]``, or ``(num_envs, T)`` of all."""
        k = point.get(self._env_dim)
        if k is not None:
            self.stats.record_env(k, rewards, dones)
        else:
            self.stats.record_steps(rewards, dones)

    def _env_udf(self, fn: Callable[..., tuple], inputs: list[RecurrentTensor],
                 outputs: list[tuple[tuple[int, ...], str]], name: str, domain: tuple = (),
                 batched: Callable[..., tuple] | None = None, own_rows: bool = False
                 ) -> tuple[RecurrentTensor, ...]:
        """A host UDF over the env dim: ``fn(point, *inputs)`` for one env (``point[b]``),
        and for all at once ``batched`` (by default ``fn`` env by env, stacked). With
        ``own_rows``, over several hosts each calls ``batched`` for its own envs (whose
        indices ``point[b]`` then holds; ``tp.udf``)."""
        def every(point: dict[str, Any], *xs: np.ndarray) -> tuple:
            envs = point.get(self._env_dim, range(self.num_envs))
            outs = [fn({**point, self._env_dim: int(k)}, *(x[n] for x in xs)) for n, k in enumerate(envs)]
            return tuple(np.stack(column) for column in zip(*outs))
        return tp.udf(_unwrapped(fn, len(outputs)), inputs, outputs, domain=domain, name=name,
                      pass_point=True, batched=_unwrapped(batched or every, len(outputs)), own_rows=own_rows)


class Env(Protocol):
    num_envs: int
    obs_shape: tuple[int, ...]
    discrete: bool
    num_actions: int | None
    """The number of discrete actions (None for continuous ones)."""
    action_shape: tuple[int, ...]
    """The shape of one continuous action (``()`` for discrete ones)."""
    stats: EpisodeStats

    @property
    def episode_returns(self) -> list[float]: ...

    @property
    def episode_lengths(self) -> list[int]: ...

    @property
    def obs_dim(self) -> int: ...

    def rollout(self, policy: Policy, b: Symbol, i: Symbol, t: Symbol, T: Symbol) -> Rollout:
        """Acting over ``(b, i, t)``: ``policy(obs)`` returns the action (of one env) and
        any extra RTs."""
        ...

    def snapshot(self, iteration: int) -> dict[str, np.ndarray]:
        """The env's state (episodes in progress, RNG, statistics) at the end of
        ``iteration``, for a checkpoint: named numeric arrays."""
        ...

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Continue from a snapshot: the next rollout starts where it was taken."""
        ...


def _unwrapped(fn: Callable[..., tuple], outputs: int) -> Callable[..., Any]:
    """``fn`` returning its single output bare, as ``tp.udf`` takes it."""
    if outputs != 1:
        return fn
    return lambda *args: fn(*args)[0]


def saved_marker(saved: RecurrentTensor, b: Symbol, i: Symbol) -> RecurrentTensor:
    """Over ``(i,)``: computed after every env's ``saved`` at ``(b, i)``."""
    B = saved.ctx.bound_of[b]
    return saved[0:B, i].max()
