"""A run's options, checked before anything is built: each option's type comes from the
dataclass that declares it, its range from the field's metadata (``option(0.99, UNIT)``),
and an error names the option as the command line spells it (``algorithm.gamma``).

Algorithms declare their options as dataclasses (``tempo_rl.algorithms``); the run's own
options and the env group's are ``RunOptions`` and ``EnvOptions`` here.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """An option with a value of the wrong type or out of its range."""


@dataclass(frozen=True)
class Range:
    """Allowed values: ``low <= x <= high``, and ``x > above``."""

    low: float | None = None
    high: float | None = None
    above: float | None = None

    def admits(self, x: float) -> bool:
        return ((self.low is None or x >= self.low) and (self.high is None or x <= self.high)
                and (self.above is None or x > self.above))

    def __str__(self) -> str:
        parts = [(">=", self.low), (">", self.above), ("<=", self.high)]
        return " and ".join(f"{op} {x:g}" for op, x in parts if x is not None)


POSITIVE = Range(above=0)
NON_NEGATIVE = Range(low=0)
UNIT = Range(low=0, high=1)
AT_LEAST_ONE = Range(low=1)


def option(default: Any, allowed: Range | None = None) -> Any:
    """A dataclass field with a default and the range its values must lie in."""
    return field(default=default, metadata={"range": allowed} if allowed else {})


@dataclass(frozen=True)
class RunOptions:
    """The top-level options of ``conf/config.yaml``."""

    seed: int = option(0, NON_NEGATIVE)
    total_timesteps: int = option(256000, AT_LEAST_ONE)
    checkpoint_every: int = option(0, NON_NEGATIVE)
    keep_checkpoints: bool = False
    compile_report: bool = False
    profile: bool = False
    progress: bool = True
    resume_override: bool = False
    cpu_async_dispatch: bool | None = None


@dataclass(frozen=True)
class EnvOptions:
    """The options of ``conf/env/*.yaml`` that every kind of env shares or that are sizes."""

    num_envs: int = option(8, AT_LEAST_ONE)
    normalize_obs: bool = False
    episode_length: int = option(1000, AT_LEAST_ONE)
    num_actions: int = option(2, AT_LEAST_ONE)
    obs_shape: tuple[int, ...] = option((4,), AT_LEAST_ONE)


def check_options(cls: type, values: dict[str, Any], group: str = "") -> None:
    """Each of ``values`` that ``cls`` declares has its field's type and lies in its
    range; ``group`` prefixes the names in errors (``"algorithm."``)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in values:
            check_value(f"{group}{f.name}", values[f.name], hints[f.name], f.metadata.get("range"))


def check_value(name: str, value: Any, hint: Any, allowed: Range | None = None) -> None:
    """``value`` of option ``name`` is a ``hint`` (bool, int, float, str, ``X | None``,
    ``tuple[int, ...]``) within ``allowed``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        hint = next(a for a in args if a is not type(None))
        args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(f"{name} must be a non-empty list, got {value!r}")
        for k, item in enumerate(value):
            check_value(f"{name}[{k}]", item, args[0], allowed)
        return
    _check_type(name, value, hint)
    if allowed is not None and not allowed.admits(value):
        raise ConfigError(f"{name} must be {allowed}, got {value!r}")


def _check_type(name: str, value: Any, hint: Any) -> None:
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
    elif hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
    elif hint is str and not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
