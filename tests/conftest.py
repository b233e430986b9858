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


@pytest.fixture
def captures_checked_alone(monkeypatch, tmp_path):
    """For tests of captured iterations (``tempo.runtime.capture``): a compile cache of the
    test's own (what one test's programs noted there, ``capture.checked_before``, must not
    decide what another's default does), and each kind's program compiled before the next
    iteration of the kind runs (which iterations run as programs does not depend on the
    machine's speed)."""
    from tempo import cache
    from tempo.runtime import capture
    monkeypatch.setattr(cache, "_chosen", tmp_path / "cache")
    monkeypatch.setattr(capture, "WAIT_FOR_PROGRAMS", True)
