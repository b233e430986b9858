"""The algorithms by name: an algorithm is a config dataclass and a builder
``build(env, cfg, seed) -> TrainProgram``, registered under the name its
``conf/algorithm/<name>.yaml`` gives::

    @register_algorithm("td0", TD0Config)
    def build(env, cfg, seed=0): ...

An algorithm outside this package registers itself the same way in its own module; the
yaml's ``module:`` key names that module, which ``tempo_rl.train`` imports (with the
current directory on the path) before looking the name up (docs/rl.md, "Adding an
algorithm")."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path

from tempo_rl.algorithms.common import TrainProgram

Builder = Callable[..., TrainProgram]
ALGORITHMS: dict[str, tuple[type, Builder]] = {}


def register_algorithm(name: str, config: type) -> Callable[[Builder], Builder]:
    """Register the decorated builder, with its config dataclass, as algorithm ``name``."""
    def register(build: Builder) -> Builder:
        known = ALGORITHMS.get(name)
        if known is not None and known[1] is not build:
            raise ValueError(f"algorithm {name!r} is already registered (by {known[1].__module__})")
        ALGORITHMS[name] = (config, build)
        return build
    return register


def algorithm(name: str) -> tuple[type, Builder]:
    """The config dataclass and builder registered as ``name``."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; registered: {', '.join(sorted(ALGORITHMS))} "
                         "(an algorithm of your own: give its module in the yaml's `module:`)") from None


def import_algorithm_module(module: str) -> None:
    """Import the user's module that registers an algorithm (the current directory first
    on the path, as ``python -m`` has it)."""
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"cannot import algorithm.module={module!r}: {e}") from None
    finally:
        if added:
            sys.path.remove(cwd)


