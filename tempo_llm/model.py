"""A Llama-family decoder as recurrent tensors over the position dim ``t``.

The batch is a spatial axis: every RT here is indexed by ``t`` and holds the values of all
``B`` sequences at that position. The key/value cache is not a data structure: the keys
and values of each layer are RTs over ``t``, and attention at position ``t`` reads
``k[0:t+1]`` (causal) or ``k[max(0, t-w+1):t+1]`` (a window of ``w`` positions, Mistral's
``sliding_window``); the compiler stores and frees those points.

Numerics follow Hugging Face's ``LlamaForCausalLM`` (RMSNorm in float32, RoPE on the
rotate-half layout, grouped-query attention by sharing each key/value head with
``group_size`` query heads, SwiGLU MLP), so that logits agree to float32 rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import tempo as tp
from tempo.api.tensor import RecurrentTensor
from tempo.symbolic.expr import Symbol
from tempo_llm.config import LlamaConfig


@dataclass(frozen=True)
class Attention:
    """Which past positions a position attends to: ``causal`` (all) or ``window`` (the
    last ``window``, itself included)."""

    kind: str = "causal"
    window: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("causal", "window"):
            raise ValueError(f"attention must be 'causal' or 'window', got {self.kind!r}")
        if self.kind == "window" and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"window attention needs a window of at least 1 position, got {self.window!r}")

    def keys(self, k: RecurrentTensor, t: Symbol) -> RecurrentTensor:
        """The positions of ``k`` that position ``t`` reads."""
        if self.kind == "causal":
            return k[0:t + 1]
        return k[tp.max(0, t - self.window + 1):t + 1]


class Decoder:
    """The decoder's weights as constants, and its forward pass at one position."""

    def __init__(self, cfg: LlamaConfig, weights: dict[str, np.ndarray]):
        self.cfg = cfg
        self.weights = weights
        self.inv_freq = cfg.inverse_frequencies()

    def _w(self, name: str, transpose: bool = False) -> RecurrentTensor:
        value = self.weights[name]
        if transpose:  # (read-only, as the loaded weights: the JAX backend then keeps it without a copy)
            value = np.ascontiguousarray(value.T)
            value.setflags(write=False)
        return tp.const(value)

    def logits(self, tokens: RecurrentTensor, t: Symbol, attention: Attention) -> RecurrentTensor:
        """Next-token logits ``(B, vocab)`` at position ``t`` of ``tokens`` (``(B,)`` ints
        over ``t``)."""
        cfg = self.cfg
        x = self._w("model.embed_tokens.weight")[tokens]  # (B, hidden)
        cos, sin = self._rotation(t)
        for n in range(cfg.num_hidden_layers):
            p = f"model.layers.{n}."
            h = self._rms_norm(x, p + "input_layernorm.weight")
            x = x + self._attention(h, p, cos, sin, t, attention)
            h = self._rms_norm(x, p + "post_attention_layernorm.weight")
            x = x + self._mlp(h, p)
        x = self._rms_norm(x, "model.norm.weight")
        head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
        return x @ self._w(head, transpose=True)

    def _rms_norm(self, x: RecurrentTensor, weight: str) -> RecurrentTensor:
        variance = (x * x).mean(-1, keepdim=True)
        return x / (variance + self.cfg.rms_norm_eps).sqrt() * self._w(weight)

    def _rotation(self, t: Symbol) -> tuple[RecurrentTensor, RecurrentTensor]:
        """RoPE's cosines and sines at position ``t`` (``head_dim``, the half repeated)."""
        angles = tp.symbol_value(t).astype("float32") * tp.const(self.inv_freq)
        angles = tp.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def _rope(self, x: RecurrentTensor, cos: RecurrentTensor, sin: RecurrentTensor,
              t: Symbol) -> RecurrentTensor:
        """Rotate each head of ``x`` (``(B, heads, head_dim)`` at ``t``), rotate-half layout."""
        half = self.cfg.head_dim // 2
        rotated = tp.cat([-x[t, ..., half:], x[t, ..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _attention(self, h: RecurrentTensor, p: str, cos: RecurrentTensor, sin: RecurrentTensor,
                   t: Symbol, attention: Attention) -> RecurrentTensor:
        cfg = self.cfg
        B = h.shape[0]
        d, kv, group = cfg.head_dim, cfg.num_key_value_heads, cfg.group_size
        q = (h @ self._w(p + "self_attn.q_proj.weight", True)).reshape(B, cfg.num_attention_heads, d)
        k = (h @ self._w(p + "self_attn.k_proj.weight", True)).reshape(B, kv, d)
        v = (h @ self._w(p + "self_attn.v_proj.weight", True)).reshape(B, kv, d)
        q, k = self._rope(q, cos, sin, t), self._rope(k, cos, sin, t)
        keys = attention.keys(k, t).permute(1, 2, 3, 0)      # (B, kv, d, n)
        values = attention.keys(v, t).permute(1, 2, 0, 3)    # (B, kv, n, d)
        scores = q.reshape(B, kv, group, d) @ keys / math.sqrt(d)   # (B, kv, group, n)
        out = scores.softmax(-1) @ values                              # (B, kv, group, d)
        return out.reshape(B, cfg.num_attention_heads * d) @ self._w(p + "self_attn.o_proj.weight", True)

    def _mlp(self, h: RecurrentTensor, p: str) -> RecurrentTensor:
        gate = h @ self._w(p + "mlp.gate_proj.weight", True)
        up = h @ self._w(p + "mlp.up_proj.weight", True)
        return (gate * gate.sigmoid() * up) @ self._w(p + "mlp.down_proj.weight", True)
