"""LocalControl: the ControlPlane over an in-process Pipeline (tests, `gosched bench --ingest
--in-process`, a master started with `--in-process`)."""

from collections.abc import Mapping, Sequence
from pathlib import Path

from gosched.binder import queries
from gosched.common.config import Settings
from gosched.common.job import Job
from gosched.common.node import Node, NodeState
from gosched.common.snapshots import Counters, JobSnapshot, NodeSnapshot
from gosched.common.states import TaskState
from gosched.runtime.control import untolerated, with_placements
from gosched.runtime.pipeline import Pipeline

IDLE_WAIT_S = 0.005  # an idle Pipeline step is cheap: look again soon


class LocalControl:
    def __init__(self, settings: Settings, nodes: Sequence[Node] = (), store_path: str | Path | None = None):
        self.pipeline = Pipeline(settings, store_path=store_path, nodes=nodes)

    # -- scheduling ------------------------------------------------------------------------------------
    def step(self) -> bool:
        return self.pipeline.step()

    def close(self) -> None:
        self.pipeline.close()

    @property
    def unavailable(self) -> str | None:
        return None  # one process: nothing to lose

    def idle_wait(self) -> float:
        return IDLE_WAIT_S

    # -- jobs -------------------------------------------------------------------------------------------
    def submit_many(self, jobs: Sequence[Job]) -> list[str]:
        return self.pipeline.submit_many(jobs)

    def job_ids(self) -> list[str]:
        return self.pipeline.dispatcher.job_ids()

    def jobs(
        self, job_ids: Sequence[str], *, placements: bool, ended: bool = False
    ) -> list[JobSnapshot | None]:
        snaps = self.pipeline.dispatcher.snapshots(job_ids)
        if not placements:
            return snaps
        binder = self.pipeline.binder
        return with_placements(snaps, lambda tids: queries.placements_of(binder, tids), ended=ended)

    def cancel(self, job_id: str) -> None:
        self.pipeline.cancel(job_id)

    def explain(self, job_id: str) -> str:
        return self.pipeline.dispatcher.explain(job_id)

    def drain_latencies(self) -> list[float]:
        out = self.pipeline.stats.latencies
        self.pipeline.stats.latencies = []
        return out

    # -- task lives -------------------------------------------------------------------------------------
    def started(self, task_ids: Sequence[str]) -> None:
        self.pipeline.started(task_ids)

    def task_attempts(self, task_ids: Sequence[str]) -> dict[str, int]:
        return self.pipeline.store.task_attempts(task_ids)

    def finished(
        self, task_ids: Sequence[str], final: TaskState, reasons: Mapping[str, str] | None = None
    ) -> None:
        self.pipeline.complete(task_ids, final, reasons)

    def lost(self, task_ids: Sequence[str]) -> None:
        released = self.pipeline.binder.lose(task_ids)
        self.pipeline.dispatcher.on_released(released, TaskState.PENDING)
        self.pipeline.sync_shards()

    # -- nodes ------------------------------------------------------------------------------------------
    def add_nodes(self, nodes: Sequence[Node]) -> None:
        p = self.pipeline
        p.add_nodes(nodes)
        # A node that came back smaller or with a NoExecute taint gives up what it cannot hold.
        names = [n.name for n in nodes]
        residents = queries.residents_of(p.binder, names)
        evict = queries.misfits(p.binder, names)
        evict += untolerated(nodes, residents, lambda ids: self.jobs(ids, placements=False))
        if evict:
            self.lost(list(dict.fromkeys(evict)))

    def set_node_state(self, name: str, state: NodeState) -> None:
        self.pipeline.set_node_state(name, state)

    def node_lost(self, name: str) -> list[str]:
        p = self.pipeline
        p.set_node_state(name, NodeState.NOT_READY)
        released = p.binder.lose(queries.residents_of(p.binder, [name])[name])
        p.dispatcher.on_released(released, TaskState.PENDING)
        return released

    def remove_node(self, name: str) -> list[str]:
        return self.pipeline.remove_node(name)

    def nodes(self, names: Sequence[str] | None = None) -> list[NodeSnapshot]:
        return queries.node_snapshots(self.pipeline.binder, names)

    def residents(self, names: Sequence[str]) -> dict[str, list[str]]:
        return queries.residents_of(self.pipeline.binder, names)

    def resident_runs(self, names: Sequence[str]) -> dict[str, dict[str, float]]:
        return queries.resident_runs(self.pipeline.binder, names)

    # -- cluster ----------------------------------------------------------------------------------------
    def queue_shares(self) -> dict[str, float]:
        return self.pipeline.dispatcher.queue_shares()

    def counters(self) -> Counters:
        p = self.pipeline
        d = p.dispatcher
        return Counters(
            **queries.cluster_usage(p.binder),
            active_jobs=d.active_count(),
            pending_jobs=d.pending_count(),
            in_flight_units=d.in_flight_count(),
            rounds=p.stats.rounds,
            bound_tasks=p.stats.bound_tasks,
            binder_conflicts=p.stats.rejected_units,
            shards=len(p.shards),
        )

    def pending_tasks(self) -> int:
        return self.pipeline.dispatcher.pending_task_count()
