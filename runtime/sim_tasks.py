"""Tasks on simulated nodes "run" for a fixed time and succeed, so a cluster of simulated nodes
behaves like a real one from the outside (`gosched up --sim-nodes N`).

A tick hook of the API service (scheduling thread, service lock held): every `period_s` it asks
for the residents of the simulated nodes (every node no agent registered), marks the new ones
running and ends those that have run their time: the job's label SIM_SECONDS_LABEL if it has one
(the timed trace replay sets it per task), else `task_seconds`. A task whose time is past its
job's time limit fails when the limit runs out, as an agent would stop it.
"""

import math
import time

from gosched.common.job import split_task_id
from gosched.common.node import AGENT_LABEL
from gosched.common.spec import format_duration
from gosched.common.states import TaskState
from gosched.runtime.control import ControlPlane

SIM_SECONDS_LABEL = "gosched.io/sim-seconds"


class SimulatedTasks:
    def __init__(self, task_seconds: float, period_s: float = 0.1) -> None:
        self.task_seconds = task_seconds
        self.period_s = period_s
        self._ends: dict[str, float] = {}  # task id -> monotonic time it ends
        self._timed_out: dict[str, str] = {}  # task id -> why it fails at its end (its time limit)
        self._last = 0.0
        self._names: list[str] | None = None
        self._names_at = 0.0

    def _simulated_nodes(self, control: ControlPlane, now: float) -> list[str]:
        if self._names is None or now - self._names_at > 5.0:  # nodes come and go rarely
            self._names = [s.node.name for s in control.nodes() if AGENT_LABEL not in dict(s.node.labels)]
            self._names_at = now
        return self._names

    def tick(self, control: ControlPlane) -> bool:
        now = time.monotonic()
        if now - self._last < self.period_s:
            return False
        self._last = now
        per_node = control.residents(self._simulated_nodes(control, now))
        resident = {t for tids in per_node.values() for t in tids}
        new = [t for t in resident if t not in self._ends]
        if new:
            self._schedule_ends(control, new, now)
        for t in [t for t in self._ends if t not in resident]:  # cancelled or preempted meanwhile
            del self._ends[t]
            self._timed_out.pop(t, None)
        done = [t for t, end in self._ends.items() if end <= now]
        if new:
            control.started(new)
        if done:
            failed = {t: self._timed_out.pop(t) for t in done if t in self._timed_out}
            succeeded = [t for t in done if t not in failed]
            if succeeded:
                control.finished(succeeded, TaskState.SUCCEEDED)
            if failed:
                control.finished(list(failed), TaskState.FAILED, failed)
            for t in done:
                del self._ends[t]
        return bool(new or done)

    def _schedule_ends(self, control: ControlPlane, new: list[str], now: float) -> None:
        job_ids = sorted({split_task_id(t)[0] for t in new})
        seconds: dict[str, float] = {}
        limits: dict[str, float] = {}
        for snap in control.jobs(job_ids, placements=False):
            if snap is not None:
                seconds[snap.job.id] = self._seconds_of(dict(snap.job.labels).get(SIM_SECONDS_LABEL))
                if snap.job.time_limit is not None:
                    limits[snap.job.id] = snap.job.time_limit
        for t in new:
            job_id = split_task_id(t)[0]
            run = seconds.get(job_id, self.task_seconds)
            limit = limits.get(job_id)
            if limit is not None and run > limit:
                run = limit
                self._timed_out[t] = f"killed: time limit of {format_duration(limit)} reached"
            self._ends[t] = now + run

    def _seconds_of(self, label: str | None) -> float:
        """The label's seconds; anyone can set a label, so one that is no duration is ignored."""
        try:
            seconds = float(label) if label else self.task_seconds
        except ValueError:
            return self.task_seconds
        return seconds if math.isfinite(seconds) and seconds >= 0 else self.task_seconds
