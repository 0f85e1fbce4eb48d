"""The master's purge of old finished jobs from the store (Settings.finished_job_ttl_s).

A thread of its own, on connections of its own: the scan of the task rows takes no lock another
writer waits on, and the deletes go in small paced transactions (Store.purge_finished), so neither
the scheduler nor the binder stalls behind it. The jobs it purges are past the newest
FINISHED_RETENTION finished, so none that the API still shows goes; their ids stay taken.

With the master's LogStore, the log files of the jobs purged go too, after each transaction that
purged them (outside it: no writer waits on the files' removal), a transaction's jobs at a time:
a job that stays (one the transaction found run again) keeps its logs."""

import logging
import sqlite3
import threading
import time
from collections.abc import Callable

from gosched.api.logs import LogStore
from gosched.common.store import Store
from gosched.dispatcher.dispatcher import FINISHED_RETENTION

log = logging.getLogger(__name__)

# The first purge waits this long after the start (the restore reads the store first), then they
# come every PURGE_EVERY_S.
FIRST_PURGE_AFTER_S = 60.0
PURGE_EVERY_S = 3_600.0
# The purge's connection waits this long for the write lock, then gives up until the next round:
# the scheduler's writers (30 s) are the ones that wait it out.
PURGE_BUSY_S = 2.0


class StorePurger:
    """Purges the store at `store_path` of jobs finished more than `ttl_s` ago, every `every_s`."""

    def __init__(
        self,
        store_path: str,
        ttl_s: float,
        *,
        logs: LogStore | None = None,
        keep: int = FINISHED_RETENTION,
        first_after_s: float = FIRST_PURGE_AFTER_S,
        every_s: float = PURGE_EVERY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store_path, self.ttl_s, self.keep = store_path, ttl_s, keep
        self.logs = logs  # the purged jobs' log files go too (None: no logs are kept)
        self.first_after_s, self.every_s, self.clock = first_after_s, every_s, clock
        self.purged = 0  # jobs deleted since the start
        self.rounds = 0  # purges run (each may delete none)
        self.log_files_removed = 0  # since the start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gosched-store-purge", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop, after the purge's transaction under way (if any): it no longer writes after."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def purge_once(self) -> int:
        """One purge; the jobs it deleted."""
        with Store(self.store_path, busy_timeout_s=PURGE_BUSY_S) as store:
            n = store.purge_finished(
                before=self.clock() - self.ttl_s,
                keep=self.keep,
                stop=self._stop,
                on_purged=self._remove_logs if self.logs is not None else None,
            )
        self.purged += n
        self.rounds += 1
        if n:
            log.info("purged %d job(s) finished more than %.0f s ago from the store", n, self.ttl_s)
        return n

    def _remove_logs(self, jobs: list[tuple[str, int]]) -> None:
        """The log files of jobs one purge transaction made tombstones (job id, task ids 0..n-1).
        A failure is logged: the purge goes on (its store rows are gone either way)."""
        assert self.logs is not None
        for job_id, tasks in jobs:
            try:
                self.log_files_removed += self.logs.remove_job(job_id, tasks)
            except Exception:  # never the purge's end: the next jobs' logs still go
                log.exception("removing the log files of purged job %s failed", job_id)

    def _run(self) -> None:
        wait = self.first_after_s
        while not self._stop.wait(wait):
            wait = self.every_s
            try:
                self.purge_once()
            except sqlite3.Error as exc:  # the next round tries again; the jobs stay meanwhile
                log.warning("purging finished jobs from the store failed, tried again later: %s", exc)
