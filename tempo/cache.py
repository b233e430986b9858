"""The compile cache: results of compiling that a later process can reuse.

Three things are kept, under one directory: isl's schedules, keyed by the schedule
constraints they were computed from (the domains, dependences and proximity of a program:
the same program at the same sizes asks the same question); the loop programs generated
from them, keyed by the times of their statements; and, for the JAX backend, XLA's
compiled programs (JAX's own persistent compilation cache, in ``jax/``). A second run of
the same program then skips isl's scheduler, isl's AST generation and XLA's compiler.

The directory is ``$TEMPO_CACHE_DIR`` when set (``off`` turns the cache off), else
``$XDG_CACHE_HOME/tempo`` or ``~/.cache/tempo``; ``set_cache_dir`` changes it for the
process. XLA's part is kept under 2 GiB (least recently used programs go first); the
schedules are small text files (a few KB to tens of KB each) and are never evicted:
delete the directory to clear the cache. A schedule entry is isl text, parsed by isl; a
loop program is JSON, read as data (statements it names must be the program's, its
expressions ours, its names isl's loop counters: ``tempo.schedule.ast.from_text``);
neither is executed, and a damaged or unreadable entry is recomputed and rewritten.
Entries are written atomically (a temporary file renamed into place), so concurrent runs
may share the directory. JAX's entries are executables: like JAX's own cache, the
directory must be writable by you alone (JAX's documentation: a compilation cache is
trusted code).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

ENV = "TEMPO_CACHE_DIR"
OFF = "off"
JAX_CACHE_MAX_BYTES = 2 << 30
"""JAX's part of the cache is kept under this size, the least recently used programs
evicted first (JAX's ``jax_compilation_cache_max_size``; a PPO config adds 0.3-0.6 MB)."""
FORMAT = "1"
"""Part of every key: bump when what an entry holds changes meaning."""

_UNSET = object()
_chosen: object | Path | None = _UNSET
_jax_dir: str | None = None
"""The JAX cache directory this module set (one set otherwise is the user's)."""


def default_cache_dir() -> Path | None:
    """``$TEMPO_CACHE_DIR`` (``off``: no cache), else the user's cache directory."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in ("", OFF) else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tempo"


def set_cache_dir(path: str | Path | None) -> None:
    """Use ``path`` as this process's cache directory (``None`` or ``"off"``: no cache).
    isl's schedules follow at once; JAX's programs from the next JAX backend made (which
    calls ``enable_jax_cache``)."""
    global _chosen
    _chosen = None if path is None or str(path).strip().lower() == OFF else Path(path).expanduser()


def cache_dir() -> Path | None:
    """The cache directory in use (``None``: caching is off)."""
    global _chosen
    if _chosen is _UNSET:
        _chosen = default_cache_dir()
    return _chosen  # type: ignore[return-value]


def _entry(kind: str, key: str) -> Path | None:
    root = cache_dir()
    if root is None:
        return None
    digest = hashlib.sha256(f"{FORMAT}\n{kind}\n{key}".encode()).hexdigest()
    return root / kind / f"{digest}.txt"


def load(kind: str, key: str) -> str | None:
    """The entry of ``kind`` stored under ``key``, or None (none, unreadable, or no cache)."""
    path = _entry(kind, key)
    if path is None:
        return None
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def store(kind: str, key: str, value: str) -> None:
    """Keep ``value`` under ``key`` (atomically; a cache that cannot be written is skipped:
    it only saves time)."""
    path = _entry(kind, key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(value)
        os.replace(tmp, path)
    except OSError:
        return


def _give_entries_access_times(directory: Path) -> None:
    """Give every entry of JAX's cache in ``directory`` the access-time file its size cap
    needs. An entry written without one (by a process that had no cap, or one killed
    between the two writes) makes JAX's eviction fail on every later write, each with a
    warning, and nothing is cached again. The entry's modification time stands in."""
    try:
        entries = list(directory.glob("*-cache"))
    except OSError:
        return
    for entry in entries:
        atime = entry.with_name(entry.name.removesuffix("-cache") + "-atime")
        try:
            if not atime.exists():
                atime.write_bytes(entry.stat().st_mtime_ns.to_bytes(8, "little"))
        except OSError:
            continue


def enable_jax_cache() -> Path | None:
    """Point JAX's persistent compilation cache at ``<cache dir>/jax`` for every compiled
    program, however fast it compiled (Tempo compiles many small kernels), unless the user
    set JAX's cache directory themselves. Returns the directory JAX uses (None: none)."""
    global _jax_dir
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    current = jax.config.jax_compilation_cache_dir
    if current and current != _jax_dir:
        return Path(current)  # the user's own
    root = cache_dir()
    wanted = None if root is None else str(root / "jax")
    if wanted == current:
        return None if wanted is None else Path(wanted)
    jax.config.update("jax_compilation_cache_dir", wanted)
    if wanted is not None:
        _give_entries_access_times(Path(wanted))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        jax.config.update("jax_compilation_cache_max_size", JAX_CACHE_MAX_BYTES)
    compilation_cache.reset_cache()  # JAX opens its cache once; make it open this one
    _jax_dir = wanted
    return None if wanted is None else Path(wanted)
