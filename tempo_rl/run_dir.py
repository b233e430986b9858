"""A run's output directory, claimed for one run at a time and checked writable before
anything is trained (an unwritable ``checkpoints/`` found after the run loses it).

The claim is an exclusive ``flock`` on a lock file holding the owner's pid: the operating
system releases it when the owner exits, however it exits, so a lock left by a dead run
is simply taken over.
"""

from __future__ import annotations

import fcntl
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
    fd = _take(lock)
    try:
        yield out_dir
    finally:
        lock.unlink(missing_ok=True)  # while still holding it: a waiting run re-checks the path
        os.close(fd)


def _check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise RunDirError(f"cannot write to {folder}: {e.strerror or e}; choose another run dir "
                          "(hydra.run.dir=...) or fix its permissions") from None


def _take(lock: Path) -> int:
    """An open, exclusively locked descriptor of ``lock``, which now holds this pid."""
    while True:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(f"{lock.parent} is in use by another run (pid {owner}); give this run "
                              "its own dir (hydra.run.dir=...), or stop that run") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:  # released (and removed) between our open and our lock
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            return fd
        os.close(fd)
