"""Fixtures shared by test modules: `client` for each module that starts its own `server` (a
master on loopback, tests/loopback.py)."""

from collections.abc import Iterator

import pytest

from gosched import Client
from gosched.api.server import ServerHandle


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> Iterator[Client]:
    """A client of the module's master."""
    with Client(server.target, timeout=10) as c:
        yield c
