"""`gosched bench --bodies`: the actors' work per task, without Ray.

With many shards, every task still passes through the one dispatcher (dispatched, then answered)
and the one binder (checked, bound, written): their bodies bound the throughput however many
shards run. A shard plans only its share of the tasks, but applies every binding of the cluster
to its view. This times those bodies as Ray runs them (`runtime.ray_actors.DispatcherCore`,
`BinderCore` and a shard's round as `ShardCore` runs it, messages packed and unpacked as through
Ray) in one process, on SchedulingBasic single-task jobs, where a 2-core machine's process
contention does not blur them:

- the dispatcher: `next_batch` then `report` with the binder's verdicts accepting every unit;
- the binder: `commit` of the proposal batches a one-process pipeline made for the same jobs
  (recorded first), over a store that holds the jobs, as the dispatcher's would; and its `writer`,
  the process that writes the batches to the store meanwhile (its CPU time);
- a shard: `plan` (unpack the dispatcher's batch, schedule it, pack the proposals), `reply`
  (unpack the binder's answer with its changes and apply it: the shard's own bindings) and
  `others` (a second shard's view taking the same changes: what every shard pays for each task
  another shard bound).

With S shards on enough cores, a shard's time per task of the cluster is plan/S + reply/S +
others * (S-1)/S; the throughput is bounded by the slowest of that, the dispatcher, the binder
and its writer.
"""

import gc
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gosched.common import wire
from gosched.common.config import Settings
from gosched.common.messages import AcceptedUnit, BindReply, Change, ProposalBatch, UnitBatch
from gosched.runtime.pipeline import Pipeline
from gosched.runtime.ray_actors import BinderCore, DispatcherCore
from gosched.runtime.simulation import basic_jobs, sim_nodes
from gosched.scheduler_shard.shard import SchedulerShard


@dataclass(frozen=True, slots=True)
class BodyCost:
    actor: str
    step: str
    tasks: int
    us_per_task: float  # wall time in the step, per task bound

    def as_dict(self) -> dict[str, object]:
        return {"actor": self.actor, "step": self.step, "tasks": self.tasks, "us_per_task": self.us_per_task}


def measure(tasks: int = 200_000, nodes: int = 10_000) -> list[BodyCost]:
    with tempfile.TemporaryDirectory(prefix="gosched-bodies-") as tmp:
        return [
            *_dispatcher(tasks, nodes, Path(tmp)),
            *_binder(tasks, nodes, Path(tmp)),
            *_shard(tasks, nodes, Path(tmp)),
        ]


def _dispatcher(tasks: int, nodes: int, tmp: Path) -> list[BodyCost]:
    core = DispatcherCore(Settings(store_path=str(tmp / "dispatcher.db"), shards=1))
    cluster = sim_nodes(nodes, gpu_every=0)
    cpu = sum(n.cpu_milli for n in cluster)
    core.set_nodes(cluster, {"cpu": cpu, "memory": sum(n.memory for n in cluster), "gpu": 0})
    core.submit_many(basic_jobs(tasks))
    nothing = wire.pack([])
    gc.collect()
    dispatching = answering = 0.0
    bound = 0
    while True:
        t0 = time.perf_counter()
        _, data = core.next_batch(0)
        dispatching += time.perf_counter() - t0
        if data is None:
            break
        batch = wire.unpack(data)
        assert isinstance(batch, UnitBatch)
        now = time.time()
        accepted = [AcceptedUnit(u.job.id, u.attempt, u.task_indexes, now) for u in batch.units]
        verdicts = wire.pack(BindReply(accepted, [], [], [], 1, shard_id=0))
        t1 = time.perf_counter()
        core.report(verdicts, nothing, core.binder_incarnation)
        answering += time.perf_counter() - t1
        bound += sum(len(u.task_indexes) for u in batch.units)
    if core.bound_tasks != bound or bound != tasks:
        raise RuntimeError(
            f"the dispatcher counted {core.bound_tasks} bound of {bound} answered, {tasks} sent"
        )
    core.store.close()
    return [
        BodyCost("dispatcher", "next_batch", bound, dispatching / bound * 1e6),
        BodyCost("dispatcher", "report", bound, answering / bound * 1e6),
    ]


class _Drop:
    def remote(self, *args: Any) -> None:
        """The binder's report to the dispatcher goes nowhere: only the binder is timed."""


class _NoDispatcher:
    report = _Drop()


def _binder(tasks: int, nodes: int, tmp: Path) -> list[BodyCost]:
    jobs = basic_jobs(tasks)
    cluster = sim_nodes(nodes, gpu_every=0)
    pipeline = Pipeline(Settings(store_path=str(tmp / "record.db"), shards=1), nodes=cluster)
    recorded: list[bytes] = []
    commit = pipeline.binder.commit

    def recording(batch: ProposalBatch, **kw: Any) -> BindReply:
        recorded.append(wire.pack(batch))
        return commit(batch, **kw)

    setattr(pipeline.binder, "commit", recording)  # noqa: B010 (mypy: a method may not be assigned)
    pipeline.submit_many(jobs)
    pipeline.run_until_idle()
    pipeline.store.close()

    core = BinderCore(str(tmp / "binder.db"), _NoDispatcher(), on_writer_failure=None)
    core.add_nodes(cluster)
    core.store.add_jobs(jobs)  # stored at submission by the dispatcher, as in the running system
    gc.collect()
    bound = 0
    t0 = time.perf_counter()
    for data in recorded:
        _, verdicts, _, _, _ = core.commit(data)
        reply = wire.unpack(verdicts)
        assert isinstance(reply, BindReply)
        bound += sum(len(a.task_indexes) for a in reply.accepted)
    seconds = time.perf_counter() - t0
    assert core.writer is not None  # a store on disk, as the running system has
    core.writer.drain()
    writing = core.writer.busy_s
    core.close()
    if bound != tasks:
        raise RuntimeError(f"the binder bound {bound} of {tasks} tasks")
    return [
        BodyCost("binder", "commit", bound, seconds / bound * 1e6),
        BodyCost("binder", "writer", bound, writing / bound * 1e6),
    ]


def _shard(tasks: int, nodes: int, tmp: Path) -> list[BodyCost]:
    """A shard's rounds between a real DispatcherCore and BinderCore on one store (untimed), as
    ShardCore.run_once does them unpipelined, and a second shard's view taking the changes."""
    settings = Settings(store_path=str(tmp / "shard.db"), shards=1)
    dispatcher = DispatcherCore(settings)
    binder = BinderCore(
        settings.store_path, _NoDispatcher(), on_writer_failure=None
    )  # verdicts reach the dispatcher below
    cluster = sim_nodes(nodes, gpu_every=0)
    binder.add_nodes(cluster)
    dispatcher.set_nodes(cluster, binder.cluster()[1])
    dispatcher.submit_many(basic_jobs(tasks))
    shard, other = SchedulerShard(0, settings.profile), SchedulerShard(1, settings.profile)
    for view in (shard, other):
        start = wire.unpack(binder.changes_since(0))
        assert isinstance(start, tuple)
        view.sync(*start)
    gc.collect()
    planning = replying = following = 0.0
    bound = 0
    while True:
        _, data = dispatcher.next_batch(0)
        if data is None:
            break
        t0 = time.perf_counter()
        batch = wire.unpack(data)
        assert isinstance(batch, UnitBatch)
        planned = shard.schedule(batch)
        planned.seen_version = shard.version
        proposals = wire.pack(planned)
        t1 = time.perf_counter()
        _, verdicts, segments, version, resync = binder.commit(proposals)
        t2 = time.perf_counter()
        reply = wire.unpack(verdicts)
        assert isinstance(reply, BindReply)
        for segment in segments:
            reply.changes.extend(wire.unpack(segment))  # type: ignore[arg-type]
        reply.version, reply.resync = version, resync
        shard.apply_reply(reply)
        t3 = time.perf_counter()
        taken: list[Change] = []
        for segment in segments:
            taken.extend(wire.unpack(segment))  # type: ignore[arg-type]
        other.sync(taken, version, resync)
        t4 = time.perf_counter()
        planning += t1 - t0
        replying += t3 - t2
        following += t4 - t3
        bound += sum(len(a.task_indexes) for a in reply.accepted)
        dispatcher.report(verdicts, wire.pack(planned.unschedulable), dispatcher.binder_incarnation)
    binder.close()
    dispatcher.store.close()
    if bound != tasks or other.state.task_row.keys() != shard.state.task_row.keys():
        raise RuntimeError(f"the shard bound {bound} of {tasks} tasks, or its two views differ")
    return [
        BodyCost("shard", "plan", bound, planning / bound * 1e6),
        BodyCost("shard", "reply", bound, replying / bound * 1e6),
        BodyCost("shard", "others", bound, following / bound * 1e6),
    ]


def ceilings(costs: list[BodyCost], shard_counts: tuple[int, ...] = (1, 2, 4, 8, 16)) -> dict[int, float]:
    """Tasks/s the bodies alone allow per shard count, each actor on a core of this machine's
    speed: 1 / the slowest of the dispatcher, the binder (or its writer) and one shard (see the
    module docstring). Ray's own cost per call and message is not in it: a bound, not a forecast."""
    us = {(c.actor, c.step): c.us_per_task for c in costs}
    dispatcher = us[("dispatcher", "next_batch")] + us[("dispatcher", "report")]
    binder = max(us[("binder", "commit")], us[("binder", "writer")])  # two processes
    own, others = us[("shard", "plan")] + us[("shard", "reply")], us[("shard", "others")]
    return {s: 1e6 / max(dispatcher, binder, own / s + others * (s - 1) / s) for s in shard_counts}


def table(costs: list[BodyCost]) -> str:
    lines = [f"{'actor':<11}{'step':<12}{'tasks':>9}{'us/task':>9}"]
    lines += [f"{c.actor:<11}{c.step:<12}{c.tasks:>9,}{c.us_per_task:>9.2f}" for c in costs]
    bound = ", ".join(f"{s}: {t:,.0f}" for s, t in ceilings(costs).items())
    lines.append(f"tasks/s the bodies allow by shard count, one core each, Ray left out: {bound}")
    return "\n".join(lines)
