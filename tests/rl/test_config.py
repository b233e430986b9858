"""One owner per default: each built-in algorithm's dataclass. The CLI's config of an
algorithm is made from it, so ``PPOConfig()`` and ``algorithm=ppo`` mean the same run."""

from __future__ import annotations

import dataclasses

import pytest

from tempo_rl.algorithms import ALGORITHMS
from tempo_rl.config import NETWORK_KEYS, load_config
from tempo_rl.train import algorithm_config


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_the_cli_config_of_an_algorithm_is_its_dataclass(name):
    cls, _ = ALGORITHMS[name]
    cfg = load_config(f"algorithm={name}")
    built = algorithm_config(cls, cfg["algorithm"], cfg["network"])
    assert built == cls()  # the yaml adds nothing of its own (the network group's are the same)
    fields = {f.name for f in dataclasses.fields(cls)} - set(NETWORK_KEYS)
    assert set(cfg["algorithm"]) == {"name", *fields}  # every option overridable on the CLI


def test_an_override_reaches_the_dataclass():
    cls, _ = ALGORITHMS["nstep"]
    cfg = load_config("algorithm=nstep", "algorithm.n=7", "algorithm.learning_rate=0.01")
    built = algorithm_config(cls, cfg["algorithm"], cfg["network"])
    assert (built.n, built.learning_rate) == (7, 0.01)


def test_an_unknown_option_is_an_error():
    cls, _ = ALGORITHMS["ppo"]
    cfg = load_config()
    with pytest.raises(ValueError, match="has no option"):
        algorithm_config(cls, {**cfg["algorithm"], "clip_coeff": 0.1}, cfg["network"])
