"""GoSched: a sharded, optimistic-concurrency cluster scheduler for GPU workloads.

Components live in sub-packages: `gosched.common` (shared model and messages),
`gosched.dispatcher`, `gosched.scheduler_shard`, `gosched.binder`, `gosched.cli`.
"""

__version__ = "0.1.0"
