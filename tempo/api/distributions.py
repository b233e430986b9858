"""Probability distributions over RTs: sampling (seeded RNG), log-probabilities, entropy.

Samples are fresh at every point of the parameters' domain and reproducible from the
context seed and the point. ``log_prob`` and ``entropy`` are differentiable RTs.
"""

from __future__ import annotations

import math

from tempo.api.functions import _random
from tempo.api.tensor import RecurrentTensor, lift
from tempo.errors import ShapeError, user_site

_LOG_2PI = math.log(2.0 * math.pi)


def _static_shape(x: RecurrentTensor, what: str) -> tuple[int, ...]:
    if not all(d.is_const for d in x.shape):
        raise ShapeError(f"{what} needs parameters with a static shape, got {x.shape}", user_site())
    return tuple(int(d.value) for d in x.shape)


def _uniform_like(x: RecurrentTensor) -> RecurrentTensor:
    """Uniform samples in (0, 1), one per entry of ``x`` at every point of its domain."""
    tiny = 1e-7
    return _random("uniform", _static_shape(x, "sampling"), "float32", x.domain,
                   low=tiny, high=1.0 - tiny)


class Categorical:
    """A categorical distribution over the last dim, from unnormalized ``logits``."""

    def __init__(self, logits: RecurrentTensor):
        self.logits = logits
        self.log_probs = logits.log_softmax(-1)

    def sample(self) -> RecurrentTensor:
        """Gumbel-max sampling: ``argmax(logits + Gumbel noise)`` (int32)."""
        gumbel = -(-_uniform_like(self.logits).log()).log()
        return (self.logits.detach() + gumbel).argmax(-1)

    def log_prob(self, value: RecurrentTensor) -> RecurrentTensor:
        index = lift(self.logits.ctx, value).astype("int32").unsqueeze(-1)
        return self.log_probs.gather(index, dim=-1).squeeze(-1)

    def entropy(self) -> RecurrentTensor:
        return -(self.log_probs.exp() * self.log_probs).sum(-1)

    def mode(self) -> RecurrentTensor:
        return self.logits.argmax(-1)


class Normal:
    """A diagonal Normal: independent ``loc``/``scale`` entries; ``log_prob`` and
    ``entropy`` sum over the last ``event_dims`` dims (1: a vector-valued action)."""

    def __init__(self, loc: RecurrentTensor, scale: RecurrentTensor | float | None = None,
                 log_std: RecurrentTensor | float | None = None, event_dims: int = 1):
        if (scale is None) == (log_std is None):
            raise ShapeError("Normal needs exactly one of scale and log_std", user_site())
        self.loc = loc
        ctx = loc.ctx
        self.log_std = lift(ctx, log_std, like=loc) if log_std is not None \
            else lift(ctx, scale, like=loc).log()
        self.scale = self.log_std.exp()
        self.event_dims = event_dims

    def _event_sum(self, x: RecurrentTensor) -> RecurrentTensor:
        if self.event_dims == 0:
            return x
        return x.sum(tuple(range(-self.event_dims, 0)))

    def sample(self) -> RecurrentTensor:
        noise = _random("normal", _static_shape(self.loc, "sampling"), "float32", self.loc.domain,
                        loc=0.0, scale=1.0)
        return (self.loc + self.scale * noise).detach()

    def log_prob(self, value: RecurrentTensor) -> RecurrentTensor:
        z = (value - self.loc) / self.scale
        return self._event_sum(-0.5 * z * z - self.log_std - 0.5 * _LOG_2PI)

    def entropy(self) -> RecurrentTensor:
        per_entry = (self.log_std + (0.5 + 0.5 * _LOG_2PI)) + self.loc * 0.0
        return self._event_sum(per_entry)

    def mode(self) -> RecurrentTensor:
        return self.loc


class Bernoulli:
    """Independent binary variables with probability ``sigmoid(logits)``."""

    def __init__(self, logits: RecurrentTensor):
        self.logits = logits

    def sample(self) -> RecurrentTensor:
        return (_uniform_like(self.logits) < self.logits.detach().sigmoid()).astype("float32")

    def log_prob(self, value: RecurrentTensor) -> RecurrentTensor:
        value = lift(self.logits.ctx, value, like=self.logits).astype(self.logits.dtype)
        return value * self.logits - self.logits.softplus()

    def entropy(self) -> RecurrentTensor:
        p = self.logits.sigmoid()
        return p * (-self.logits).softplus() + (1.0 - p) * self.logits.softplus()

    def mode(self) -> RecurrentTensor:
        return (self.logits > 0).astype("float32")
