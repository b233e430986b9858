"""Greedy Llama decoding written directly in JAX the usual way: a preallocated KV cache of
the whole sequence's length, padded, and the whole generation (prompt included, one
position per step) as one jitted ``lax.scan``; attention runs over the full padded cache
with a mask (causal: positions up to ``t``; window: the last ``w``). The weights are the
same numpy arrays ``tempo_llm`` loads."""

from __future__ import annotations

import time
from collections.abc import Callable
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
    kv_bytes: int
    """The preallocated key/value cache's bytes."""
    timeline: list[tuple[int, float]] | None = None
    """With ``mark_every``: ``(tokens generated, seconds since the generation started)``
    every ``mark_every`` positions, from a second run of a program that calls back to the
    host there (the timed run has no callbacks)."""


def decode(cfg: LlamaConfig, weights: dict[str, np.ndarray], ids: np.ndarray, new: int,
           window: int | None = None, mark_every: int | None = None) -> DecodeResult:
    """``new`` greedy tokens after ``ids`` (``(B, P)``); ``window``: sliding-window attention."""
    B, P = ids.shape
    total = P + new - 1  # positions whose logits are needed
    params = jax.tree_util.tree_map(jnp.asarray, _params(cfg, weights))
    prompt = jnp.asarray(np.pad(ids, ((0, 0), (0, total - P))), jnp.int32)
    start = time.perf_counter()
    run = jax.jit(lambda p, prompt: _generate(cfg, p, prompt, P, total, window))
    compiled = run.lower(params, prompt).compile()
    compiled_at = time.perf_counter()
    chosen = np.asarray(jax.block_until_ready(compiled(params, prompt)))
    done = time.perf_counter()
    tokens = np.concatenate([ids, chosen[:, P - 1:]], axis=1)
    kv_bytes = 4 * 2 * cfg.num_hidden_layers * B * cfg.num_key_value_heads * total * cfg.head_dim
    timeline = None if mark_every is None else _timeline(cfg, params, prompt, P, total, window, mark_every)
    return DecodeResult(tokens, compiled_at - start, done - compiled_at, kv_bytes, timeline)


def _timeline(cfg: LlamaConfig, params: dict, prompt: jax.Array, P: int, total: int, window: int | None,
              every: int) -> list[tuple[int, float]]:
    """When each ``every``-th position was reached, in a run that calls back to the host there."""
    marks: list[tuple[int, float]] = []

    def mark(t: jax.Array) -> None:  # (position t chose the (t - P + 2)-th generated token)
        marks.append((int(t) - P + 2, time.perf_counter()))
    run = jax.jit(lambda p, prompt: _generate(cfg, p, prompt, P, total, window, (every, mark)))
    jax.block_until_ready(run(params, prompt))  # (compiles)
    marks.clear()
    start = time.perf_counter()
    jax.block_until_ready(run(params, prompt))
    end = time.perf_counter()
    return [(n, at - start) for n, at in marks if n > 0] + [(total - P + 1, end - start)]


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
              window: int | None, marker: tuple[int, Callable] | None = None) -> jax.Array:
    """The token chosen at each of ``total`` positions (``(B, total)``), the prompt's
    tokens fed in at the first ``prompt_length``; ``marker`` ``(every, fn)``: ``fn(t)`` on
    the host once position ``t`` is done, every ``every`` positions."""
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
        if marker is not None:
            every, fn = marker
            jax.lax.cond((t + 1 - prompt_length) % every == 0,
                         lambda: jax.debug.callback(fn, t), lambda: None)
        return (cache, chosen), chosen

    _, chosen = jax.lax.scan(step, (cache, jnp.zeros(B, jnp.int32)), positions)
    return chosen.T
