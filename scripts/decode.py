"""Decode with a Llama-family checkpoint from the command line (Hydra; configs in conf/llm/).

    python -m tempo_llm.random_checkpoint /tmp/tiny            # a random model to try it on
    python scripts/decode.py llm.checkpoint=/tmp/tiny llm.prompt="w1 w2 w3" llm.max_new_tokens=64
    python scripts/decode.py llm.checkpoint=/tmp/tiny llm.temperature=0.8 llm.top_p=0.9 llm.batch=4

Prints the generated text (token ids for a checkpoint without a tokenizer), tokens/s and
peak memory.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tempo_llm.cli import decode  # noqa: E402 - after the path fix for running from a checkout


@hydra.main(version_base="1.3", config_path="../conf", config_name="decode")
def main(cfg: DictConfig) -> None:
    logging.getLogger("jax").setLevel(logging.WARNING)  # Hydra logs INFO: "no TPU", cache resets
    try:
        decode(OmegaConf.to_container(cfg.llm, resolve=True))
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
