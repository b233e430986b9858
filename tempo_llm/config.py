"""A Llama-family model's hyperparameters, read from a Hugging Face ``config.json``.

Llama (``LlamaForCausalLM``) and Mistral (``MistralForCausalLM``: the same blocks, with
``sliding_window``) are supported, with RoPE scaling ``default``, ``linear`` and ``llama3``.
A field that would change the computation and that this module does not implement (an
attention or MLP bias, another activation, dynamic RoPE scaling) is an error naming it,
never silently ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral"}
ROPE_TYPES = ("default", "linear", "llama3")
ROPE_KEYS = {"linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


class CheckpointFormatError(ValueError):
    """A model directory, config or weight file that this module cannot load."""


@dataclass(frozen=True)
class LlamaConfig:
    """What the decoder needs of ``config.json`` (Hugging Face's names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    """Mistral's attention window (tokens a position sees, itself included); None: causal."""
    model_type: str = "llama"
    eos_token_id: int | list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_file(cls, path: str | Path) -> LlamaConfig:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise CheckpointFormatError(f"no config.json at {path}") from None
        except ValueError as e:
            raise CheckpointFormatError(f"{path} is not valid JSON ({e})") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> LlamaConfig:
        """The config of ``raw`` (a parsed ``config.json``); errors name ``where``."""
        architectures = raw.get("architectures") or []
        unknown = [a for a in architectures if a not in ARCHITECTURES]
        if unknown or raw.get("model_type", "llama") not in ARCHITECTURES.values():
            found = unknown or raw.get("model_type")
            raise CheckpointFormatError(f"{where}: unsupported architecture {found}; this module loads "
                                        f"{', '.join(ARCHITECTURES)}")
        _refuse_unsupported(raw, where)
        heads = _positive_int(raw, "num_attention_heads", where)
        hidden = _positive_int(raw, "hidden_size", where)
        kv_heads = _positive_int(raw, "num_key_value_heads", where) if "num_key_value_heads" in raw \
            and raw["num_key_value_heads"] is not None else heads
        if heads % kv_heads:
            raise CheckpointFormatError(f"{where}: num_attention_heads={heads} is not a multiple of "
                                        f"num_key_value_heads={kv_heads}")
        head_dim = int(raw.get("head_dim") or hidden // heads)
        theta, scaling = _rope(raw)
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise CheckpointFormatError(f"{where}: rope_scaling type {kind!r} is not supported "
                                            f"(supported: {', '.join(ROPE_TYPES)})")
            missing = [k for k in ROPE_KEYS.get(kind, ()) if not isinstance(scaling.get(k), (int, float))]
            if missing:
                raise CheckpointFormatError(f"{where}: {kind} RoPE scaling needs {', '.join(missing)}")
        window = raw.get("sliding_window") if raw.get("model_type") == "mistral" else None
        return cls(vocab_size=_positive_int(raw, "vocab_size", where), hidden_size=hidden,
                   intermediate_size=_positive_int(raw, "intermediate_size", where),
                   num_hidden_layers=_positive_int(raw, "num_hidden_layers", where),
                   num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                   rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                   rope_theta=theta, rope_scaling=scaling,
                   tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                   sliding_window=int(window) if window else None,
                   model_type=raw.get("model_type", "llama"), eos_token_id=raw.get("eos_token_id"),
                   extra=raw)

    def inverse_frequencies(self) -> np.ndarray:
        """RoPE's per-pair rotation frequencies (``head_dim / 2`` of them), scaled as
        ``rope_scaling`` says."""
        exponents = np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** exponents)
        scaling = self.rope_scaling or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "linear":
            inv_freq = inv_freq / float(scaling["factor"])
        elif kind == "llama3":
            inv_freq = _llama3_frequencies(inv_freq, scaling)
        return inv_freq.astype(np.float32)


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """RoPE's base and scaling, from ``rope_parameters`` (transformers 5) or the older
    ``rope_theta`` and ``rope_scaling``."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict):
        theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
        kind = params.get("rope_type", params.get("type", "default"))
        return theta, None if kind == "default" else params
    return float(raw.get("rope_theta", 10000.0)), raw.get("rope_scaling")


def _llama3_frequencies(inv_freq: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    """Llama 3.1's scaling: long wavelengths divided by ``factor``, short ones kept, the
    band between interpolated smoothly."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    context = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    scaled = np.where(wavelength > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= context / high) & (wavelength <= context / low)
    return np.where(medium, blended, scaled)


UNSUPPORTED = {"attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "pretraining_tp": 1}
"""Fields whose other values change the computation in ways this module does not implement."""


def _refuse_unsupported(raw: dict[str, Any], where: str) -> None:
    for name, supported in UNSUPPORTED.items():
        if name in raw and raw[name] not in (supported, None):
            raise CheckpointFormatError(f"{where}: {name}={raw[name]!r} is not supported "
                                        f"(only {supported!r})")


def _positive_int(raw: dict[str, Any], name: str, where: str) -> int:
    value = raw.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointFormatError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value
