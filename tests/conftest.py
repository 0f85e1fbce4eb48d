"""Fixtures shared by test modules: `client` for each module that starts its own `server` (a
master on loopback, tests/loopback.py)."""

import os
from collections.abc import Iterator

# As cli/main.py sets it for the master: tests start local Rays beside gRPC servers, where gRPC's
# fork support makes some of Ray's daemons abort before they exec (grpc/grpc#43055). Before grpc
# is imported, which the imports below do.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest

from gosched import Client
from gosched.api.server import ServerHandle


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> Iterator[Client]:
    """A client of the module's master."""
    with Client(server.target, timeout=10) as c:
        yield c
