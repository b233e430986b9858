"""Llama-family decoding as recurrent tensors: ``tempo_llm.load(path)`` reads a local
Hugging Face-format checkpoint; ``.logits(ids)`` and ``.generate(ids, n)`` run RT
programs in which the key/value cache is the RT slice ``k[0:t+1]`` (or a window of it)."""

from tempo_llm.config import CheckpointFormatError, LlamaConfig
from tempo_llm.generate import Generation, LanguageModel, load
from tempo_llm.model import Attention
from tempo_llm.sampling import Sampling

__all__ = ["Attention", "CheckpointFormatError", "Generation", "LanguageModel", "LlamaConfig", "Sampling",
           "load"]
