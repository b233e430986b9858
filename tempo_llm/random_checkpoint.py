"""Write a randomly initialised Llama or Mistral checkpoint in Hugging Face's format
(``config.json``, ``model.safetensors``, ``tokenizer.json``), for tests, demos and
benchmarks; no weights are ever downloaded.

    python -m tempo_llm.random_checkpoint OUT --layers 4 --hidden 256 --heads 8 --kv-heads 2
    python -m tempo_llm.random_checkpoint OUT --arch mistral --window 512 --dtype bfloat16

The tokenizer is a word-level one over ``vocab - 3`` made-up words (``w0``, ``w1``, ...)
and ``<unk>``, ``<s>``, ``</s>`` (ids 0, 1, 2; ``</s>`` is the EOS token), built with the
``tokenizers`` package: text of those words round-trips exactly.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tempo_llm.config import LlamaConfig
from tempo_llm.weights import SINGLE, expected_shapes

SPECIAL = ("<unk>", "<s>", "</s>")
BOS, EOS = 1, 2


@dataclass(frozen=True)
class Spec:
    """The sizes of a random model."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 176
    vocab: int = 256
    arch: str = "llama"
    window: int | None = None
    tie: bool = False
    rope_theta: float = 10000.0
    max_positions: int = 8192

    def config(self) -> dict:
        """``config.json``'s contents, as transformers writes them for this architecture."""
        mistral = self.arch == "mistral"
        return {"architectures": ["MistralForCausalLM" if mistral else "LlamaForCausalLM"],
                "model_type": self.arch, "vocab_size": self.vocab, "hidden_size": self.hidden,
                "intermediate_size": self.intermediate, "num_hidden_layers": self.layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
                "head_dim": self.hidden // self.heads, "hidden_act": "silu",
                "max_position_embeddings": self.max_positions, "rms_norm_eps": 1e-6,
                "rope_theta": self.rope_theta, "tie_word_embeddings": self.tie,
                "attention_bias": False, "bos_token_id": BOS, "eos_token_id": EOS,
                "torch_dtype": "float32", **({"sliding_window": self.window} if mistral else {})}


def write(out: str | Path, spec: Spec, seed: int = 0, dtype: str = "float32") -> Path:
    """A random checkpoint of ``spec`` in directory ``out`` (created); weights drawn as
    transformers initialises them (normal, std 0.02; norms 1), stored as ``dtype``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raw = spec.config()
    raw["torch_dtype"] = dtype
    cfg = LlamaConfig.from_dict(raw)
    rng = np.random.default_rng(seed)
    tensors = {name: (np.ones(shape, np.float32) if name.endswith("norm.weight")
                      else rng.normal(0.0, 0.02, shape).astype(np.float32))
               for name, shape in expected_shapes(cfg).items()}
    save_file({name: _stored(value, dtype) for name, value in tensors.items()}, str(out / SINGLE),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    _tokenizer(spec.vocab).save(str(out / "tokenizer.json"))
    return out


def _stored(value: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return value
    if dtype == "bfloat16":  # NumPy has no bfloat16: go through JAX's
        import jax.numpy as jnp
        return np.asarray(jnp.asarray(value, jnp.bfloat16))
    raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")


def _tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = {token: k for k, token in enumerate(SPECIAL)}
    words.update({f"w{k}": k + len(SPECIAL) for k in range(vocab - len(SPECIAL))})
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    defaults = Spec()
    p.add_argument("--layers", type=int, default=defaults.layers)
    p.add_argument("--hidden", type=int, default=defaults.hidden)
    p.add_argument("--heads", type=int, default=defaults.heads)
    p.add_argument("--kv-heads", type=int, default=defaults.kv_heads)
    p.add_argument("--intermediate", type=int, default=defaults.intermediate)
    p.add_argument("--vocab", type=int, default=defaults.vocab)
    p.add_argument("--arch", choices=["llama", "mistral"], default="llama")
    p.add_argument("--window", type=int, default=None, help="mistral's sliding_window (default 4096)")
    p.add_argument("--tie", action="store_true", help="tie the output head to the embedding")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.vocab <= len(SPECIAL):
        p.error(f"--vocab must exceed {len(SPECIAL)} (the special tokens)")
    window = args.window or (4096 if args.arch == "mistral" else None)
    spec = Spec(args.layers, args.hidden, args.heads, args.kv_heads, args.intermediate, args.vocab,
                args.arch, window, args.tie)
    out = write(args.out, spec, args.seed, args.dtype)
    print(f"wrote a random {args.arch} checkpoint ({args.layers} layers, hidden {args.hidden}, "
          f"vocab {args.vocab}, {args.dtype}) to {out}")
    return out


if __name__ == "__main__":
    main()
