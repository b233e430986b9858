"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and
top-p (nucleus) filtering, from a generator seeded by ``(seed, position)`` so that a
generation is reproducible whatever order positions run in. ``tempo_llm.generate`` takes a
greedy choice on the device (the argmax as RT ops) and runs ``Sampling.choose`` on the
host for draws."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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

    def choose(self, logits: np.ndarray, position: int) -> np.ndarray:
        """One token per row of ``logits`` (``(B, vocab)``), as int32."""
        if self.greedy:
            return logits.argmax(-1).astype(np.int32)
        scaled = logits.astype(np.float64) / self.temperature
        if self.top_k is not None and self.top_k < scaled.shape[-1]:
            kth = np.sort(scaled, axis=-1)[:, -self.top_k][:, None]
            scaled = np.where(scaled < kth, -np.inf, scaled)
        probs = np.exp(scaled - scaled.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        if self.top_p is not None and self.top_p < 1:
            probs = _nucleus(probs, self.top_p)
        rng = np.random.default_rng([self.seed, position])
        draws = rng.random(len(probs))[:, None]
        cumulative = probs.cumsum(-1)
        chosen = (cumulative < draws * cumulative[:, -1:]).sum(-1)
        return np.minimum(chosen, probs.shape[-1] - 1).astype(np.int32)


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """``probs`` with all but the most likely tokens whose mass first reaches ``top_p``
    zeroed (the most likely token always stays)."""
    order = np.argsort(-probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, -1)
    keep_ranked = ranked.cumsum(-1) - ranked < top_p
    keep = np.zeros_like(keep_ranked)
    np.put_along_axis(keep, order, keep_ranked, -1)
    return np.where(keep, probs, 0.0)
