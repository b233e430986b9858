"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and
top-p (nucleus) filtering, as recurrent-tensor ops (``Sampling.choose``): the choice runs
on the device with the rest of a position, so sampled decoding runs in scans as greedy
decoding does, and its draws (``tp.uniform``, keyed by the context's seed and the
position) are the same whatever order the positions run in, and on either backend."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import tempo as tp
from tempo.symbolic.expr import Symbol, as_expr


@dataclass(frozen=True)
class Sampling:
    """``temperature=0``: the most likely token; otherwise a draw from the softmax of
    ``logits / temperature`` restricted to the ``top_k`` most likely tokens and to the
    smallest set whose probability reaches ``top_p``."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        """Whether the choice is the most likely token (no draw)."""
        return self.temperature == 0

    def choose(self, logits: tp.RecurrentTensor, t: Symbol) -> tp.RecurrentTensor:
        """One token per row of ``logits`` (``(B, vocab)`` at each ``t``), as int32: the
        most likely, or a draw by the inverse of the filtered softmax's cumulative sum at
        a uniform point per row (fresh at every ``t``; the context's seed must be
        ``seed``)."""
        if self.greedy:
            return logits.argmax(-1).astype("int32")
        batch, vocab = (int(as_expr(d).value) for d in logits.shape)
        scaled = logits / float(self.temperature)
        if self.top_k is not None and self.top_k < vocab:
            ranked = scaled.gather((-scaled).argsort(-1), -1)  # descending
            scaled = tp.where(scaled < ranked[t, :, self.top_k - 1:self.top_k], -np.inf, scaled)
        probs = scaled.softmax(-1)
        if self.top_p is not None and self.top_p < 1:
            probs = _nucleus(probs, self.top_p, t)
        cumulative = probs.cumsum(-1)
        u = tp.uniform((batch, 1)) * cumulative[t, :, vocab - 1:vocab]
        chosen = (cumulative < u).astype("int32").sum(-1)
        return tp.min(chosen, vocab - 1)


def _nucleus(probs: tp.RecurrentTensor, top_p: float, t: Symbol) -> tp.RecurrentTensor:
    """``probs`` with all but the most likely tokens whose mass first reaches ``top_p``
    zeroed (the most likely token always stays)."""
    order = (-probs).argsort(-1)
    ranked = probs.gather(order, -1)
    keep_ranked = (ranked.cumsum(-1) - ranked < top_p).astype("float32")
    keep = keep_ranked.gather(order.argsort(-1), -1)  # back in vocabulary order
    return probs * keep
