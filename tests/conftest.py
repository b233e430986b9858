"""Shared fixtures: the backends every end-to-end test runs on. The session's compile
cache (``tempo.cache``) is a fresh directory, so no test reads what another session (or the
user's own runs) left; subprocesses inherit it."""

import os
import tempfile

import pytest

_CACHE = tempfile.TemporaryDirectory(prefix="tempo-test-cache-")
os.environ["TEMPO_CACHE_DIR"] = _CACHE.name

BACKENDS = ("numpy", "jax")


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param
