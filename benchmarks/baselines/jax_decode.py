"""Greedy Llama decoding written directly in JAX the usual way: a preallocated KV cache of
the whole sequence's length, padded, and the whole generation (prompt included, one
position per step) as one jitted ``lax.scan``; attention runs over the full padded cache
with a mask (causal: positions up to ``t``; window: the last ``w``). The weights are the
same numpy arrays ``tempo_llm`` loads."""

from __future__ import annotations

import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from tempo_llm.config import LlamaConfig


@dataclass
class DecodeResult:
    tokens: np.ndarray
    """``(B, P + N)``."""
    compile_s: float
    decode_s: float


def decode(cfg: LlamaConfig, weights: dict[str, np.ndarray], ids: np.ndarray, new: int,
           window: int | None = None) -> DecodeResult:
    """``new`` greedy tokens after ``ids`` (``(B, P)``); ``window``: sliding-window attention."""
    B, P = ids.shape
    total = P + new - 1  # positions whose logits are needed
    params = jax.tree_util.tree_map(jnp.asarray, _params(cfg, weights))
    run = jax.jit(lambda p, prompt: _generate(cfg, p, prompt, P, total, window))
    prompt = jnp.asarray(np.pad(ids, ((0, 0), (0, total - P))), jnp.int32)
    start = time.perf_counter()
    compiled = run.lower(params, prompt).compile()
    compiled_at = time.perf_counter()
    chosen = np.asarray(jax.block_until_ready(compiled(params, prompt)))
    done = time.perf_counter()
    tokens = np.concatenate([ids, chosen[:, P - 1:]], axis=1)
    return DecodeResult(tokens, compiled_at - start, done - compiled_at)


def _params(cfg: LlamaConfig, w: dict[str, np.ndarray]) -> dict:
    layers = [{name: w[f"model.layers.{n}.{name}"].T if name.endswith("proj.weight") else
               w[f"model.layers.{n}.{name}"]
               for name in ("input_layernorm.weight", "post_attention_layernorm.weight",
                            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                            "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                            "mlp.down_proj.weight")} for n in range(cfg.num_hidden_layers)]
    head = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return {"embed": w["model.embed_tokens.weight"], "norm": w["model.norm.weight"], "head": head.T,
            "layers": layers, "inv_freq": cfg.inverse_frequencies()}


def _rms(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def _generate(cfg: LlamaConfig, p: dict, prompt: jax.Array, prompt_length: int, total: int,
              window: int | None) -> jax.Array:
    """The token chosen at each of ``total`` positions (``(B, total)``), the prompt's
    tokens fed in at the first ``prompt_length``."""
    B = prompt.shape[0]
    L, kv, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    cache = jnp.zeros((L, 2, B, kv, total, d), jnp.float32)
    positions = jnp.arange(total)

    def step(carry, t):
        cache, previous = carry
        token = jnp.where(t < prompt_length, prompt[:, t], previous)
        x = p["embed"][token]
        angles = t.astype(jnp.float32) * p["inv_freq"]
        angles = jnp.concatenate([angles, angles])
        cos, sin = jnp.cos(angles), jnp.sin(angles)
        visible = positions <= t
        if window is not None:
            visible &= positions > t - window
        for n, layer in enumerate(p["layers"]):
            h = _rms(x, layer["input_layernorm.weight"], cfg.rms_norm_eps)
            q = _rope((h @ layer["self_attn.q_proj.weight"]).reshape(B, cfg.num_attention_heads, d), cos, sin)
            k = _rope((h @ layer["self_attn.k_proj.weight"]).reshape(B, kv, d), cos, sin)
            v = (h @ layer["self_attn.v_proj.weight"]).reshape(B, kv, d)
            cache = cache.at[n, 0, :, :, t].set(k).at[n, 1, :, :, t].set(v)
            scores = jnp.einsum("bkgd,bknd->bkgn", q.reshape(B, kv, cfg.group_size, d), cache[n, 0])
            scores = jnp.where(visible, scores / np.sqrt(d), -jnp.inf)
            out = jnp.einsum("bkgn,bknd->bkgd", jax.nn.softmax(scores, -1), cache[n, 1])
            x = x + out.reshape(B, -1) @ layer["self_attn.o_proj.weight"]
            h = _rms(x, layer["post_attention_layernorm.weight"], cfg.rms_norm_eps)
            gate, up = h @ layer["mlp.gate_proj.weight"], h @ layer["mlp.up_proj.weight"]
            x = x + (jax.nn.silu(gate) * up) @ layer["mlp.down_proj.weight"]
        logits = _rms(x, p["norm"], cfg.rms_norm_eps) @ p["head"]
        chosen = logits.argmax(-1).astype(jnp.int32)
        return (cache, chosen), chosen

    _, chosen = jax.lax.scan(step, (cache, jnp.zeros(B, jnp.int32)), positions)
    return chosen.T
