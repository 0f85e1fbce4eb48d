"""GoSched: a sharded, optimistic-concurrency cluster scheduler for GPU workloads.

Components live in sub-packages: `gosched.common` (shared model and messages),
`gosched.dispatcher`, `gosched.scheduler_shard`, `gosched.binder`, `gosched.agent` (the node
agent), `gosched.api` (gRPC/HTTP server and client), `gosched.cli`, `gosched.runtime` (the
wiring: one process or Ray actors), `gosched.bench` and `gosched.proto`.
`from gosched import Client` loads the client (and grpc) on first use only, so `import gosched`
stays light.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gosched.api.client import Client

__version__ = "0.1.0"
__all__ = ["Client", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from gosched.api.client import Client

        return Client
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
