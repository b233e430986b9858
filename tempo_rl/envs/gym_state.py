"""A gymnasium env's state as plain data (JSON), for checkpoints that cannot run code.

A gymnasium env is a chain of wrappers around the env proper; its state is the plain
attributes of each layer (``TimeLimit._elapsed_steps``, ``CartPoleEnv.state``, the env's
``np_random`` generator, ...). ``dump`` gives them as one JSON-able document; ``load``
sets them on a freshly made env of the same id. Structure that ``gym.make`` rebuilds (spaces,
the spec, constructor arguments, the wrapped env) is not stored. An attribute of any other
type (a MuJoCo data object, a deque of frames) is an error at checkpoint time naming it,
never a silently incomplete checkpoint.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

REBUILT = frozenset({"env", "spec", "_cached_spec", "_saved_kwargs", "render_mode", "metadata"})
"""Attributes that ``gym.make`` recreates; not part of the state."""
BIT_GENERATORS = {"PCG64": np.random.PCG64, "PCG64DXSM": np.random.PCG64DXSM}
"""The bit generators a stored ``np.random.Generator`` may name (nothing else is built;
these are gymnasium's, and their state is plain integers)."""


class EnvStateError(ValueError):
    """A gymnasium env's state that cannot be stored, or a stored state that does not fit."""


def dump(env: gym.Env) -> list[dict[str, Any]]:
    """``env``'s state: each layer's class and plain attributes, JSON-able."""
    return [{"class": type(layer).__name__,
             "attrs": {name: _encode(value, f"{type(layer).__name__}.{name}")
                       for name, value in vars(layer).items() if _is_state(value, name)}}
            for layer in _layers(env)]


def load(env: gym.Env, stored: Any) -> None:
    """Set the state ``dump`` gave on ``env`` (made with the same id; not reset)."""
    layers = _layers(env)
    classes = [type(layer).__name__ for layer in layers]
    found = [s.get("class") if isinstance(s, dict) else None for s in stored] \
        if isinstance(stored, list) else stored
    if found != classes:
        raise EnvStateError(f"the stored env has layers {found}, this env {classes}")
    for layer, saved in zip(layers, stored):
        where = type(layer).__name__
        known = {name for name, value in vars(layer).items() if _is_state(value, name)}
        attrs = saved.get("attrs")
        if isinstance(attrs, dict) and REBUILT & attrs.keys():
            raise EnvStateError(f"the stored {where} sets {sorted(REBUILT & attrs.keys())}, which only "
                                "gym.make builds")
        # A fresh env lacks what its first reset creates (the generator): more is fine.
        if not isinstance(attrs, dict) or not known <= set(attrs) or any(n.startswith("__") for n in attrs):
            stored_names = sorted(attrs) if isinstance(attrs, dict) else attrs
            raise EnvStateError(f"the stored {where} has attributes {stored_names}, this one {sorted(known)}")
        for name, value in attrs.items():
            setattr(layer, name, _decode(value, f"{where}.{name}"))


def _layers(env: gym.Env) -> list[Any]:
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _is_state(value: Any, name: str) -> bool:
    return name not in REBUILT and not isinstance(value, (gym.Env, gym.spaces.Space, EnvSpec))


def _encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return {"scalar": value.item(), "dtype": value.dtype.str}
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return {"ndarray": value.tolist(), "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, np.random.Generator):
        bits = value.bit_generator
        if type(bits).__name__ not in BIT_GENERATORS:
            raise EnvStateError(f"{where}: a generator on {type(bits).__name__} cannot be stored")
        return {"generator": type(bits).__name__, "state": bits.state}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, f"{where}[{k}]") for k, v in enumerate(value)]
        return items if isinstance(value, list) else {"tuple": items}
    raise EnvStateError(f"{where} holds a {type(value).__name__}, which a checkpoint cannot store "
                        "(checkpoints hold plain data only)")


def _decode(value: Any, where: str) -> Any:
    if not isinstance(value, (dict, list)):
        return value
    if isinstance(value, list):
        return [_decode(v, where) for v in value]
    if "tuple" in value:
        return tuple(_decode(v, where) for v in value["tuple"])
    if "scalar" in value:
        return np.dtype(_numeric(value["dtype"], where)).type(value["scalar"])
    if "ndarray" in value:
        return np.asarray(value["ndarray"], _numeric(value["dtype"], where)).reshape(value["shape"])
    if "generator" in value:
        if value["generator"] not in BIT_GENERATORS:
            raise EnvStateError(f"{where}: unknown bit generator {value['generator']!r}")
        bits = BIT_GENERATORS[value["generator"]]()
        bits.state = value["state"]
        return np.random.Generator(bits)
    raise EnvStateError(f"{where}: unrecognized stored value {sorted(value)}")


def _numeric(dtype: Any, where: str) -> np.dtype:
    try:
        out = np.dtype(str(dtype))
    except TypeError:
        raise EnvStateError(f"{where}: {dtype!r} is not a dtype") from None
    if out.kind not in "biuf":
        raise EnvStateError(f"{where}: dtype {dtype!r} is not numeric")
    return out
