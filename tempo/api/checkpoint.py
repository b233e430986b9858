"""Checkpoints: tensors written to disk at conditional points, loaded as initial values.

``save`` adds a sink that writes the values of named RTs to an ``.npz`` file at every point
where ``when`` holds (e.g. ``(i + 1) % 100 == 0``). Each write goes to a temporary file in
the same directory, is flushed to disk, and then renamed over the target, so a crash
mid-write leaves the previous checkpoint intact. ``load`` reads one back.

A checkpoint holds numeric arrays only (structure goes in JSON documents stored as uint8
arrays). Loading never unpickles: a file holding Python objects is refused, as is a
damaged one, with a ``CheckpointError`` naming the file and what is wrong with it.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from tempo.api.functions import sink
from tempo.api.tensor import RecurrentTensor
from tempo.errors import CheckpointError, TempoError

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
    """The arrays of a checkpoint (and its point under ``__point__``); numeric arrays only."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    if path.is_dir():
        raise CheckpointError(f"{path} is a directory, not a checkpoint file (.npz)")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise CheckpointError(f"{path} is a single array (.npy), not a checkpoint (.npz)")
        with data:
            return {name: _numeric(path, name, data) for name in data.files}
    except CheckpointError:
        raise
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise CheckpointError(f"{path} is not a readable checkpoint: {_reason(e)}") from None


def _numeric(path: Path, name: str, data: Any) -> np.ndarray:
    try:
        array = data[name]
    except ValueError as e:
        if "allow_pickle" in str(e):  # numpy refuses object arrays without it
            raise CheckpointError(f"{path}: entry {name!r} holds Python objects (a pickle); "
                                  "checkpoints hold numeric arrays only and this one is refused") from None
        raise CheckpointError(f"{path}: entry {name!r} is damaged ({_reason(e)})") from None
    if not isinstance(array, np.ndarray):
        raise CheckpointError(f"{path}: entry {name!r} is not an array")
    if array.dtype.kind not in "biufc":
        raise CheckpointError(f"{path}: entry {name!r} is a {array.dtype} array; checkpoints hold "
                              "numeric arrays only")
    return array


def _reason(error: BaseException) -> str:
    if isinstance(error, EOFError) or not str(error):
        return "the file is empty or truncated"
    if "pickle" in str(error):
        return "it is neither an .npz archive nor an .npy array (it would need unpickling)"
    return str(error).splitlines()[0]
