"""Checkpoints: tensors written to disk at conditional points, loaded as initial values.

``save`` adds a sink that writes the values of named RTs to an ``.npz`` file at every point
where ``when`` holds (e.g. ``(i + 1) % 100 == 0``). Each write goes to a temporary file in
the same directory, is flushed to disk, and then renamed over the target, so a crash
mid-write leaves the previous checkpoint intact. ``load`` reads one back.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tempo.api.functions import sink
from tempo.api.tensor import RecurrentTensor
from tempo.errors import TempoError

POINT_KEY = "__point__"


def save(tensors: dict[str, RecurrentTensor], path: str | os.PathLike, when: Any = True) -> None:
    """Write ``tensors`` to ``path`` at each point where ``when`` holds (the file is
    replaced each time; ``{i}`` in the path is filled with the point's coordinates)."""
    names = list(tensors)
    if POINT_KEY in names:
        raise TempoError(f"{POINT_KEY} is reserved in checkpoints")

    def write(values: list[np.ndarray], point: dict[str, int]) -> None:
        target = Path(str(path).format(**point))
        arrays = dict(zip(names, values))
        arrays[POINT_KEY] = np.asarray([point[k] for k in sorted(point)], np.int64)
        write_atomically(target, arrays)
    sink([tensors[n] for n in names], write, name="checkpoint", when=when)


def write_atomically(target: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` to a temporary file next to ``target``, fsync, then rename over it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates owner-only files
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint (and its point under ``__point__``)."""
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise TempoError(f"no checkpoint at {path}") from None
