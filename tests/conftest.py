"""Shared fixtures: the backends every end-to-end test runs on."""

import pytest

BACKENDS = ("numpy", "jax")


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param
