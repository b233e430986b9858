"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and
top-p (nucleus) filtering, as recurrent-tensor ops (``Sampling.choose``): the choice runs
on the device with the rest of a position, so sampled decoding runs in scans as greedy
decoding does. A draw is the inverse of the filtered softmax's cumulative sum at a
uniform number per sequence and position (``uniforms``: per sequence, NumPy's generator
seeded by ``(seed, sequence)``, all drawn at once), the same on either backend, whatever
order positions run in and whatever the batch; ``tempo_llm.generate`` hands them in at
run time, so another seed compiles nothing."""

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
        if not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        """Whether the choice is the most likely token (no draw)."""
        return self.temperature == 0

    def choose(self, logits: tp.RecurrentTensor, t: Symbol,
               uniform: tp.RecurrentTensor | None = None) -> tp.RecurrentTensor:
        """One token per row of ``logits`` (``(B, vocab)`` at each ``t``), as int32: the
        most likely, or (not greedy) a draw by the inverse of the filtered softmax's
        cumulative sum at ``uniform`` (``(B, 1)`` numbers in ``(0, 1]`` at each ``t``: a
        token of zero probability is never drawn). With top-k or top-p the tokens are
        ranked once, most likely first (one sort); the sums are float32 (a token whose
        probability is below the float32 rounding of the running sum is never drawn:
        about 3e-4 of the mass over 128k tokens)."""
        if self.greedy:
            return logits.argmax(-1).astype("int32")
        if uniform is None:
            raise ValueError("a sampled choice needs its uniform numbers")
        batch, vocab = (int(as_expr(d).value) for d in logits.shape)
        scaled = logits / float(self.temperature)
        top_k = self.top_k is not None and self.top_k < vocab
        top_p = self.top_p is not None and self.top_p < 1
        order = (-scaled).argsort(-1) if top_k or top_p else None  # stable: ties keep their order
        if order is not None:
            scaled = scaled.gather(order, -1)
        if top_k:  # (tokens as likely as the k-th stay)
            scaled = tp.where(scaled < scaled[t, :, self.top_k - 1:self.top_k], -np.inf, scaled)
        probs = scaled.softmax(-1)
        if top_p:  # the most likely tokens whose mass first reaches top_p (the first always)
            probs = probs * (probs.cumsum(-1) - probs < self.top_p).astype("float32")
        cumulative = probs.cumsum(-1)
        drawn = (cumulative < uniform * cumulative[t, :, vocab - 1:vocab]).astype("int32").sum(-1)
        drawn = tp.min(drawn, vocab - 1)  # (float rounding of the last sum)
        if order is None:
            return drawn
        return order.gather(drawn.reshape(batch, 1), -1).reshape(batch)


def uniforms(seed: int, positions: int, batch: int) -> np.ndarray:
    """The uniform numbers of a sampled generation, ``(positions, batch, 1)`` float32 in
    ``(0, 1]``: sequence ``b``'s are the stream of NumPy's generator seeded by ``(seed,
    b)``, so they depend neither on ``positions`` nor on the batch they are drawn in."""
    return np.stack([1 - np.random.default_rng([seed, b]).random(positions, dtype=np.float32)
                     for b in range(batch)], axis=1)[..., None]
