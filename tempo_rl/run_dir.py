"""A run's output directory, claimed for one run at a time and checked writable before
anything is trained (an unwritable ``checkpoints/`` found after the run loses it).

The claim is a lock file holding the owner's pid; a lock left by a process that no longer
runs is taken over.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".tempo-run.lock"
WRITTEN = ("checkpoints", "tensorboard")
"""The subdirectories a run writes (besides the run dir itself)."""


class RunDirError(RuntimeError):
    """A run dir that another run holds, or that this one cannot write."""


@contextmanager
def claimed(out_dir: Path) -> Iterator[Path]:
    """``out_dir``, created and checked writable, locked for this process while in use."""
    for folder in (out_dir, *(out_dir / name for name in WRITTEN)):
        _check_writable(folder)
    lock = out_dir / LOCK_NAME
    _take(lock)
    try:
        yield out_dir
    finally:
        lock.unlink(missing_ok=True)


def _check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise RunDirError(f"cannot write to {folder}: {e.strerror or e}; choose another run dir "
                          "(hydra.run.dir=...) or fix its permissions") from None


def _take(lock: Path) -> None:
    """Create ``lock`` with this pid, or take it over from a process that has exited."""
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        owner = _owner(lock)
        if owner is not None and _alive(owner):
            raise RunDirError(f"{lock.parent} is in use by another run (pid {owner}); give this run "
                              "its own dir (hydra.run.dir=...), or stop that run") from None
        _replace(lock)
        return
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))


def _replace(lock: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=lock.parent, prefix=f".{lock.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, lock)


def _owner(lock: Path) -> int | None:
    try:
        return int(lock.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
