"""What ``scripts/decode.py`` does with its config (``conf/llm/default.yaml``): load the
checkpoint, encode the prompt, generate, and report the text, tokens/s and peak memory."""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tempo_llm.generate import Generation, LanguageModel, load


@dataclass
class DecodeReport:
    generation: Generation
    texts: list[str]
    compile_seconds: float
    decode_seconds: float
    peak_rss_mb: float

    @property
    def tokens_per_second(self) -> float:
        return float(self.generation.lengths.sum()) / max(self.decode_seconds, 1e-9)


def decode(cfg: dict[str, Any], out: Any = sys.stdout) -> DecodeReport:
    """Run the decoding ``cfg`` describes and print its results to ``out``."""
    lm = load(cfg["checkpoint"], backend=cfg.get("backend", "numpy"))
    prompt = _prompt(lm, cfg)
    ids = np.tile(np.asarray([prompt]), (int(cfg.get("batch", 1)), 1))
    eos = cfg.get("eos_token_id")
    if eos is None:  # the config's; of a list (Llama 3 has several), the first
        eos = lm.cfg.eos_token_id[0] if isinstance(lm.cfg.eos_token_id, list) else lm.cfg.eos_token_id
    options = dict(attention=cfg.get("attention"), window=cfg.get("window"),
                   temperature=float(cfg.get("temperature", 0.0)), top_k=cfg.get("top_k"),
                   top_p=cfg.get("top_p"), eos_token_id=eos, seed=int(cfg.get("seed", 0)),
                   progress=bool(cfg.get("progress", True)))
    n = int(cfg["max_new_tokens"])
    start = time.perf_counter()
    lm.compile_generation(ids, n, **options)
    compiled = time.perf_counter()
    generation = lm.generate(ids, n, **options)
    done = time.perf_counter()
    texts = [_text(lm, row[len(prompt):len(prompt) + length])
             for row, length in zip(generation.tokens, generation.lengths)]
    report = DecodeReport(generation, texts, compiled - start, done - compiled, _peak_rss_mb())
    for k, text in enumerate(texts):
        print(f"[{k}] {text}", file=out)
    print(f"{int(generation.lengths.sum())} tokens in {report.decode_seconds:.2f} s "
          f"({report.tokens_per_second:.1f} tokens/s; compile {report.compile_seconds:.2f} s); "
          f"peak RSS {report.peak_rss_mb:.0f} MiB", file=out)
    return report


def _prompt(lm: LanguageModel, cfg: dict[str, Any]) -> list[int]:
    text = Path(cfg["prompt_file"]).read_text() if cfg.get("prompt_file") else str(cfg.get("prompt", ""))
    if lm.tokenizer is not None:
        ids = lm.encode(text)
    else:
        try:
            ids = [int(word) for word in text.split()]
        except ValueError:
            raise ValueError("this checkpoint has no tokenizer.json: give the prompt as token ids "
                             "(llm.prompt='1 5 9')") from None
    if not ids:
        raise ValueError("the prompt is empty")
    return ids


def _text(lm: LanguageModel, ids: np.ndarray) -> str:
    return lm.decode(ids) if lm.tokenizer is not None else " ".join(str(int(k)) for k in ids)


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024
