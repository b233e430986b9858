"""The CLI's configs (conf/), composed from Python: ``load_config("algorithm=reinforce")``
gives the same dict as ``python scripts/train.py algorithm=reinforce`` trains with."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
NETWORK_KEYS = ("hidden", "activation")
"""Options of the algorithms' dataclasses that the ``network`` group sets instead."""


def store_algorithm_defaults() -> None:
    """Give Hydra each registered algorithm's defaults, from its dataclass, as the config
    ``algorithm/<name>_defaults`` that ``conf/algorithm/<name>.yaml`` starts from: the
    dataclass is the one owner of an algorithm's defaults, for the CLI and Python alike."""
    from tempo_rl.algorithms import ALGORITHMS
    store = ConfigStore.instance()
    for name, (cls, _) in ALGORITHMS.items():
        instance = cls()
        defaults = {f.name: getattr(instance, f.name) for f in dataclasses.fields(cls)
                    if f.name not in NETWORK_KEYS}
        node = {"name": name, **{k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()}}
        store.store(group="algorithm", name=f"{name}_defaults", node=node)


def load_config(*overrides: str) -> dict[str, Any]:
    store_algorithm_defaults()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=False)
