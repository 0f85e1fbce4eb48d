"""Garbage-collector settings for the scheduler's processes.

Scheduling allocates a few short-lived objects per task (placements, residents, messages) while the
process holds a large, long-lived state (node arrays, job records). With CPython's defaults a
young-generation collection runs every 700 allocations, and the older generations, which hold that
state, are rescanned every 10 of those: about 15% of the in-process benchmark's time. Reference
counting frees almost every object at once anyway; the collector is only for cycles, so it can run
far less often. (gc.freeze would also hide the start-up state from it, but would then keep cyclic
garbage of a replaced state forever: not worth it for a process that rebuilds its state.)
"""

import gc

THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """Make cyclic garbage collection rarer in this process (idempotent)."""
    gc.set_threshold(*THRESHOLDS)
