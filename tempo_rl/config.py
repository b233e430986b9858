"""The CLI's configs (conf/), composed from Python: ``load_config("algorithm=reinforce")``
gives the same dict as ``python scripts/train.py algorithm=reinforce`` trains with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def load_config(*overrides: str) -> dict[str, Any]:
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=False)
