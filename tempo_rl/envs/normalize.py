"""Observation normalization as RT state: a running mean and variance over every
observation seen so far, updated at each step of each iteration.

``NormalizedObservations(env)`` wraps any env: at ``(i, t)`` the statistics take in the
observations of every env at that step, ``obs[0:B, i, t]`` (Chan et al.'s parallel update
of mean, variance and count, starting from mean 0, variance 1 and count 1e-4 as
gymnasium's ``NormalizeObservation``), and the policy, and the learner after it, see
``clip((obs - mean) / sqrt(var + 1e-8), -10, 10)``. The statistics carry over from the
last step of an iteration to the first of the next, and are part of checkpoints
(``state``, ``load_state``), so a resumed run continues them exactly. The final
observation of a step (for bootstrapping on truncation) is normalized with the statistics
of that step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import tempo as tp
from tempo.api.optim import replace_constant
from tempo.api.tensor import RecurrentTensor, constant
from tempo.errors import TempoError
from tempo.symbolic.expr import Symbol
from tempo_rl.envs.base import Env, Policy, Rollout

EPSILON = 1e-8
CLIP = 10.0
INITIAL_COUNT = 1e-4
STATE_PREFIX = "obs_norm."


class NormalizedObservations:
    """``env`` with normalized observations (see the module doc); the rest is ``env``'s."""

    def __init__(self, env: Env):
        self.env = env
        self.initial: dict[str, RecurrentTensor] = {}
        self.statistics: dict[str, RecurrentTensor] = {}
        """``mean``, ``var``, ``count`` over ``(i, t)``, after that step's observations."""
        self.raw_obs: RecurrentTensor | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def rollout(self, policy: Policy, b: Symbol, i: Symbol, t: Symbol, T: Symbol) -> Rollout:
        seen: dict[str, RecurrentTensor] = {}

        def normalizing(obs: RecurrentTensor):
            self.raw_obs = obs
            self.statistics = self._running_statistics(obs, b, i, t, T)
            seen["obs"] = self.normalize(obs)
            return policy(seen["obs"])
        ro = self.env.rollout(normalizing, b, i, t, T)
        return dataclasses.replace(ro, obs=seen["obs"], final_obs=self.normalize(ro.final_obs))

    def normalize(self, obs: RecurrentTensor) -> RecurrentTensor:
        """``obs`` (over ``(b, i, t)``) with that step's statistics."""
        mean, var = self.statistics["mean"], self.statistics["var"]
        return ((obs - mean) / (var + EPSILON).sqrt()).clip(-CLIP, CLIP)

    def _running_statistics(self, obs: RecurrentTensor, b: Symbol, i: Symbol, t: Symbol,
                            T: Symbol) -> dict[str, RecurrentTensor]:
        ctx = obs.ctx
        shape = tuple(int(d.value) for d in obs.shape)
        self.initial = {"mean": constant(ctx, np.zeros(shape, np.float32)),
                        "var": constant(ctx, np.ones(shape, np.float32)),
                        "count": constant(ctx, np.asarray(INITIAL_COUNT, np.float32))}
        # The statistics before each step: the initial ones (a checkpoint's, when resuming),
        # then those after the previous step. The update is one expression over every
        # (i, t), so a resumed run computes its first step with the same kernel as the run
        # it continues (on JAX, two expressions could fuse and round differently).
        before = {name: tp.placeholder(shape=value.shape, dtype="float32", domain=(i, t))
                  for name, value in self.initial.items()}
        every = obs[0:ctx.bound_of[b], i, t]  # the step's observations of every env
        batch_mean = every.mean(0)
        stats = _combined(before, (batch_mean, ((every - batch_mean) ** 2).mean(0),
                                   float(self.env.num_envs)))
        for name, value in self.initial.items():
            before[name][0, 0] = value
            before[name][i + 1, 0] = stats[name][i, T - 1]
            before[name][i, t + 1] = stats[name][i, t]
        return stats

    @property
    def state(self) -> dict[str, RecurrentTensor]:
        """The statistics at the end of each iteration, for checkpoints (over ``(i,)``)."""
        mean = self.statistics["mean"]
        i, t = mean.domain
        T = mean.ctx.bound_of[t]
        return {STATE_PREFIX + name: value[i, T - 1] for name, value in self.statistics.items()}

    def load_state(self, values: dict[str, np.ndarray]) -> None:
        """Start from a checkpoint's statistics (call before compiling)."""
        missing = [STATE_PREFIX + n for n in self.initial if STATE_PREFIX + n not in values]
        if missing:
            raise TempoError(f"the checkpoint has no observation statistics ({', '.join(missing)}); "
                             f"it was written by a run without env.normalize_obs")
        for name, const in self.initial.items():
            replace_constant(const, values[STATE_PREFIX + name], STATE_PREFIX + name)


def _combined(stats: dict[str, Any], batch: tuple) -> dict[str, RecurrentTensor]:
    """Chan et al.'s update of (mean, var, count) with a batch's (mean, var, count)."""
    mean, var, count = stats["mean"], stats["var"], stats["count"]
    batch_mean, batch_var, batch_count = batch
    delta = batch_mean - mean
    total = count + batch_count
    new_mean = mean + delta * (batch_count / total)
    m2 = var * count + batch_var * batch_count + delta * delta * (count * batch_count / total)
    return {"mean": new_mean, "var": m2 / total, "count": total}
