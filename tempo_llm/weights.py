"""A Llama-family checkpoint's weights from a local Hugging Face directory:
``model.safetensors``, or shards listed by ``model.safetensors.index.json``. float32,
float16 and bfloat16 tensors load as float32. Every tensor the model needs must be there
with its shape; a missing or mismatched one is an error naming it. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import safe_open

from tempo_llm.config import CheckpointFormatError, LlamaConfig

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the decoder reads (Hugging Face's names and layout:
    a linear layer's weight is ``(out, in)``)."""
    h, d = cfg.hidden_size, cfg.head_dim
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (cfg.num_attention_heads * d, h),
            p + "self_attn.k_proj.weight": (cfg.num_key_value_heads * d, h),
            p + "self_attn.v_proj.weight": (cfg.num_key_value_heads * d, h),
            p + "self_attn.o_proj.weight": (h, cfg.num_attention_heads * d),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, cfg.intermediate_size)})
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


def load_weights(directory: str | Path, cfg: LlamaConfig) -> dict[str, np.ndarray]:
    """The tensors of ``expected_shapes(cfg)`` from ``directory``, as read-only float32 arrays."""
    directory = Path(directory)
    files = _weight_files(directory)
    wanted = expected_shapes(cfg)
    biases = sorted(name for names in files.values() for name in names if name.endswith(".bias"))
    if biases:
        raise CheckpointFormatError(f"{directory} has bias tensors ({', '.join(biases[:3])}), which "
                                    "this model has none of; it is not a Llama-family checkpoint")
    out: dict[str, np.ndarray] = {}
    for file, names in files.items():
        with safe_open(str(file), framework="numpy") as f:
            for name in names & wanted.keys():
                out[name] = np.require(_float32(f, name, file), requirements="O")  # (its own memory,
                out[name].setflags(write=False)  # read-only: the JAX backend then need not copy it)
    missing = sorted(wanted.keys() - out.keys())
    if missing:
        raise CheckpointFormatError(f"{directory} lacks {len(missing)} tensor(s) the model needs: "
                                    f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    for name, shape in wanted.items():
        if out[name].shape != shape:
            raise CheckpointFormatError(f"{directory}: {name} has shape {out[name].shape}, the config "
                                        f"implies {shape}")
    return out


def _weight_files(directory: Path) -> dict[Path, set[str]]:
    """Each weight file and the tensor names it holds."""
    if not directory.is_dir():
        raise CheckpointFormatError(f"{directory} is not a model directory")
    if (directory / INDEX).exists():
        try:
            index = json.loads((directory / INDEX).read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointFormatError(f"{directory / INDEX} is not a safetensors index ({e})") from None
        files: dict[Path, set[str]] = {}
        for name, shard in index.items():
            path = directory / Path(shard).name  # shards live beside the index, nowhere else
            files.setdefault(path, set()).add(name)
        absent = [p.name for p in files if not p.exists()]
        if absent:
            raise CheckpointFormatError(f"{directory}: the index lists missing shard(s) {absent}")
        return files
    single = directory / SINGLE
    if not single.exists():
        raise CheckpointFormatError(f"{directory} has neither {SINGLE} nor {INDEX}")
    try:
        with safe_open(str(single), framework="numpy") as f:
            return {single: set(f.keys())}
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise CheckpointFormatError(f"{single} is not a readable safetensors file ({e})") from None


def _float32(f: object, name: str, file: Path) -> np.ndarray:
    """Tensor ``name`` as float32; bfloat16 (which NumPy lacks) widened from its bits."""
    try:
        return np.asarray(f.get_tensor(name), np.float32)  # type: ignore[attr-defined]
    except TypeError:  # bfloat16: read the raw 16 bits as the top half of float32s
        pass
    with safe_open(str(file), framework="flax") as g:
        return np.asarray(g.get_tensor(name).astype("float32"))
