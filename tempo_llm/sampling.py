"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and
top-p (nucleus) filtering, as recurrent-tensor ops (``Sampling.choose``): the choice runs
on the device with the rest of a position, so sampled decoding runs in scans as greedy
decoding does. A draw is the inverse of the filtered softmax's cumulative sum at a
uniform number per sequence and position (``uniforms``: NumPy's generator seeded by
``seed``, all drawn at once), the same on either backend and whatever order positions
run in; ``tempo_llm.generate`` hands them in at run time, so another seed compiles
nothing."""

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

    def choose(self, logits: tp.RecurrentTensor, t: Symbol,
               uniform: tp.RecurrentTensor | None = None) -> tp.RecurrentTensor:
        """One token per row of ``logits`` (``(B, vocab)`` at each ``t``), as int32: the
        most likely, or (not greedy) a draw by the inverse of the filtered softmax's
        cumulative sum at ``uniform`` (``(B, 1)`` numbers in ``[0, 1)`` at each ``t``)."""
        if self.greedy:
            return logits.argmax(-1).astype("int32")
        vocab = int(as_expr(logits.shape[-1]).value)
        scaled = logits / float(self.temperature)
        if self.top_k is not None and self.top_k < vocab:
            ranked = scaled.gather((-scaled).argsort(-1), -1)  # descending
            scaled = tp.where(scaled < ranked[t, :, self.top_k - 1:self.top_k], -np.inf, scaled)
        probs = scaled.softmax(-1)
        if self.top_p is not None and self.top_p < 1:
            probs = _nucleus(probs, self.top_p, t)
        if uniform is None:
            raise ValueError("a sampled choice needs its uniform numbers")
        cumulative = probs.cumsum(-1)
        chosen = (cumulative < uniform * cumulative[t, :, vocab - 1:vocab]).astype("int32").sum(-1)
        return tp.min(chosen, vocab - 1)


def uniforms(seed: int, positions: int, batch: int) -> np.ndarray:
    """The uniform numbers of a sampled generation, ``(positions, batch, 1)`` float32 in
    ``[0, 1)``: position ``t``'s do not depend on ``positions``."""
    return np.random.default_rng(seed).random((positions, batch, 1), dtype=np.float32)


def _nucleus(probs: tp.RecurrentTensor, top_p: float, t: Symbol) -> tp.RecurrentTensor:
    """``probs`` with all but the most likely tokens whose mass first reaches ``top_p``
    zeroed (the most likely token always stays)."""
    order = (-probs).argsort(-1)
    ranked = probs.gather(order, -1)
    keep_ranked = (ranked.cumsum(-1) - ranked < top_p).astype("float32")
    keep = keep_ranked.gather(order.argsort(-1), -1)  # back in vocabulary order
    return probs * keep
