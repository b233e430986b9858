"""Which XLA programs the test's thread compiles, from JAX's compile log."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import jax


@contextlib.contextmanager
def compiled_here(name: str | None = None) -> Iterator[list[str]]:
    """Within the block, the log line of each compile of a program named ``jit(name)`` (of
    any program: None) on this thread (JAX's ``log_compiles`` logs the thread that sets it
    only: the compiles of background threads are not there)."""
    lines: list[str] = []

    class Compiles(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Compiling jit(" if name is None else f"Compiling jit({name})"):
                lines.append(record.getMessage())
    handler, logger = Compiles(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            yield lines
    finally:
        logger.removeHandler(handler)
