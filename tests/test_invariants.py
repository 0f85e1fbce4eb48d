"""Property tests over random clusters, jobs and shard interleavings, through the real pipeline.

Invariants: no node is ever over-committed (CPU, memory, every GPU's share); no gang is ever
partly bound; every accepted job is in exactly one state and none is lost; a restarted binder
has the same state as the live one.
"""

import os
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gosched.binder.binder import Binder, next_epoch
from gosched.binder.state import arrays_view
from gosched.common.cluster_state import ClusterArrays
from gosched.common.config import Settings
from gosched.common.job import Job, TaskGroup, Toleration, split_task_id, task_id
from gosched.common.messages import ProposalBatch
from gosched.common.node import Node, Taint, TaintEffect, make_node
from gosched.common.resources import ResourceRequest
from gosched.common.states import HOLDS_RESOURCES, TaskState
from gosched.common.store import Store
from gosched.dispatcher.records import job_state_of
from gosched.runtime.local_control import LocalControl
from gosched.runtime.pipeline import Pipeline

GiB = 2**30
# More examples for a deeper run: GOSCHED_PROPERTY_EXAMPLES=2000 pytest tests/test_invariants.py
EXAMPLES = int(os.environ.get("GOSCHED_PROPERTY_EXAMPLES", "60"))


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    n = draw(st.integers(1, 6))
    nodes = []
    for i in range(n):
        gpus = draw(st.sampled_from([0, 0, 1, 2, 4, 8]))
        nodes.append(
            make_node(
                f"n{i}",
                draw(st.integers(1, 16)) * 1000,
                draw(st.integers(1, 64)) * GiB,
                gpus=gpus,
                gpu_model=draw(st.sampled_from(["A100", "V100"])),
                numa_nodes=2 if gpus >= 2 else 1,
                nvlink_pairs=draw(st.booleans()),
            )
        )
    return nodes


@st.composite
def jobs(draw: st.DrawFn, prefix: str) -> list[Job]:
    out = []
    for i in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["cpu", "share", "whole"]))
        req = ResourceRequest(
            cpu_milli=draw(st.integers(1, 8)) * 500,
            memory=draw(st.integers(0, 16)) * GiB,
            gpus=draw(st.integers(1, 4)) if kind == "whole" else 0,
            gpu_milli=draw(st.sampled_from([100, 250, 500, 700])) if kind == "share" else 0,
        )
        replicas = draw(st.integers(1, 4))
        out.append(
            Job(
                id=f"{prefix}{i}",
                groups=(TaskGroup("main", replicas, req, ("true",)),),
                min_member=draw(st.integers(1, replicas)),
                priority=draw(st.integers(0, 3)) * 50,
                max_retries=draw(st.integers(0, 2)),
                disruption_budget=draw(st.sampled_from([None, None, 0, 1, 2])),
            )
        )
    return out


def assert_not_overcommitted(state: ClusterArrays) -> None:
    n = state.n
    assert (state.cpu_used[:n] <= state.cpu_cap[:n]).all()
    assert (state.mem_used[:n] <= state.mem_cap[:n]).all()
    assert (state.gpu_free[:n] >= 0).all()
    # usage equals the residents' sum (no leaked or double-counted allocation)
    for row in range(n):
        residents = state.residents[row].values()
        assert sum(r.cpu_milli for r in residents) == state.cpu_used[row]
        for g in range(state.gpu_free.shape[1]):
            if state.gpu_exists[row, g]:
                held = sum(m for r in residents for gg, m in r.gpus if gg == g)
                assert state.gpu_free[row, g] == 1000 - held


def assert_gangs_whole(p: Pipeline, all_jobs: list[Job]) -> None:
    for job in all_jobs:
        states = p.dispatcher.task_states(job.id)
        assert len(states) == job.total_replicas  # nothing accepted is lost
        holding = sum(1 for s in states if s in HOLDS_RESOURCES)
        finished = sum(1 for s in states if s in (TaskState.SUCCEEDED, TaskState.FAILED))
        # A gang holds nothing, or at least min_member (tasks that already ran count toward it).
        assert holding == 0 or holding + finished >= job.min_member, (job.id, states)
        resident = sum(1 for tid in job.task_ids() if tid in p.binder.state.task_row)
        assert resident == holding


def assert_one_state_each(p: Pipeline, all_jobs: list[Job]) -> None:
    """Every accepted job is in exactly one state, and every record of it says the same.

    At rest (nothing in flight): each task has one state, which the dispatcher, the store and the
    binder agree on (a task holds resources exactly when the binder has it resident, on the node
    the store recorded); the job's state is the one its task states make; the store holds each
    job once; and each job with pending tasks waits exactly once (queued, backing off or dormant).
    """
    d = p.dispatcher
    assert d.in_flight_count() == 0
    stored = p.store.load_jobs()
    assert sorted(job.id for job, _ in stored) == sorted(job.id for job in all_jobs)
    rows_of = {job.id: rows for job, rows in stored}
    waiting = 0
    for job in all_jobs:
        states = d.task_states(job.id)
        assert all(isinstance(s, TaskState) for s in states)
        assert TaskState.SCHEDULED not in states  # nothing is in flight
        assert d.job_state(job.id) == job_state_of(states, job.min_member, False)
        rows = rows_of[job.id]
        assert [idx for idx, *_ in rows] == list(range(job.total_replicas))
        for (idx, stored_state, node, gpus), state in zip(rows, states, strict=True):
            tid = task_id(job.id, idx)
            assert stored_state == state, (tid, stored_state, state)
            got = p.binder.resident(tid)
            assert (got is not None) == (state in HOLDS_RESOURCES), (tid, state)
            if got is not None:
                assert (node, gpus) == (got[0], got[1].gpus)
        waiting += TaskState.PENDING in states
    assert d.pending_count() == waiting


def restarted_pipeline(db: str, shards: int) -> Pipeline:
    return Pipeline(
        Settings(store_path=db, shards=shards, retry_backoff_s=0.0, failure_backoff_s=0.0, batch_size=3)
    )


def assert_shard_views_match(p: Pipeline) -> None:
    """A shard with nothing in flight, brought to the binder's version, sees exactly the binder's
    cluster: no assumption of an answered unit is left behind."""
    for shard in p.shards:
        if not shard.inflight:
            shard.sync(*p.binder.changes_since(shard.version))
            assert arrays_view(shard.state) == p.binder.view(), f"shard {shard.shard_id}"
            assert list(shard.state.down_tasks.items()) == list(p.binder.state.down_tasks.items())


def assert_restart_sees_the_same(p: Pipeline, db: str, shards: int, all_jobs: list[Job]) -> Pipeline:
    """A binder and a dispatcher rebuilt from the store alone have the state of the live ones."""
    reopened = Binder(Store(db))
    assert reopened.view() == p.binder.view()  # nodes, usage, every GPU's share, residents
    # the tasks down that the disruption budgets count
    assert list(reopened.state.down_tasks.items()) == list(p.binder.state.down_tasks.items())
    assert reopened.version == next_epoch(p.binder.version)  # a new incarnation (stored)
    reopened.store.close()
    view, version = p.binder.view(), p.binder.version
    states = {job.id: (p.dispatcher.job_state(job.id), p.dispatcher.task_states(job.id)) for job in all_jobs}
    waiting = p.dispatcher.pending_count()
    p.close()
    q = restarted_pipeline(db, shards)
    assert q.binder.view() == view and q.binder.version == next_epoch(next_epoch(version))
    assert {
        job.id: (q.dispatcher.job_state(job.id), q.dispatcher.task_states(job.id)) for job in all_jobs
    } == states
    assert q.dispatcher.pending_count() == waiting
    assert_one_state_each(q, all_jobs)
    return q


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), first=jobs("a"), second=jobs("b"), shards=st.integers(1, 3), data=st.data())
def test_pipeline_invariants(
    nodes: list[Node], first: list[Job], second: list[Job], shards: int, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "gs.db")
        # A retried task's job waits out its backoff parked (60 s: past the run), or runs at once.
        backoff = data.draw(st.sampled_from([0.0, 60.0]))
        settings = Settings(
            store_path=db, shards=shards, retry_backoff_s=0.0, failure_backoff_s=backoff, batch_size=3
        )
        p = Pipeline(settings, nodes=nodes)
        p.submit_many(first)
        for _ in range(data.draw(st.integers(0, 5))):
            p.step()
            assert_not_overcommitted(p.binder.state)
        p.submit_many(second)  # higher-priority arrivals may preempt
        p.run_until_idle(max_rounds=200)
        assert_not_overcommitted(p.binder.state)
        assert_shard_views_match(p)
        all_jobs = first + second
        assert_gangs_whole(p, all_jobs)
        # finish some tasks, schedule again
        done = [tid for job in first for tid in job.task_ids() if tid in p.binder.state.task_row][:3]
        p.complete(done)
        p.run_until_idle(max_rounds=200)
        assert_not_overcommitted(p.binder.state)
        assert_gangs_whole(p, all_jobs)
        assert_one_state_each(p, all_jobs)
        for tid in done:
            job_id, idx = tid.rsplit("/", 1)
            assert p.dispatcher.task_states(job_id)[int(idx)] == TaskState.SUCCEEDED
        # some fail: those with retries run again (their gangs whole), the others end failed
        failing = [tid for job in second for tid in job.task_ids() if tid in p.binder.state.task_row][:2]
        p.complete(failing, TaskState.FAILED, {tid: "exit code 1" for tid in failing})
        p.run_until_idle(max_rounds=200)
        assert_not_overcommitted(p.binder.state)
        assert_gangs_whole(p, all_jobs)
        assert_one_state_each(p, all_jobs)
        retries = {job.id: job.max_retries for job in all_jobs}
        for tid in failing:
            job_id, idx = tid.rsplit("/", 1)
            failed = p.dispatcher.task_states(job_id)[int(idx)] == TaskState.FAILED
            assert failed == (retries[job_id] == 0), (tid, p.dispatcher.task_states(job_id))
        # a restarted binder (and dispatcher) sees exactly the same cluster and jobs, and goes on
        q = assert_restart_sees_the_same(p, db, shards, all_jobs)
        q.run_until_idle(max_rounds=200)
        assert_not_overcommitted(q.binder.state)
        assert_gangs_whole(q, all_jobs)
        assert_one_state_each(q, all_jobs)
        q.close()


def interleaved_round(p: Pipeline, held: list[ProposalBatch], data: st.DataObject) -> bool:
    """One round with the binder's arrivals in a drawn order: every shard plans on the view it
    has; some batches are held back (still in flight: their shards plan the next round on stale
    views); the shards whose batches go reach the binder in a drawn order, each shard's batches in
    the order it sent them."""
    loads = [len(s.inflight) for s in p.shards]
    batches = p.dispatcher.next_batches(loads)
    held.extend(p.shards[b.shard_id].schedule(b) for b in batches)
    if not held:
        return False
    # with nothing new dispatched, everything held goes (the run must come to rest)
    go = [b for b in held if not batches or data.draw(st.integers(0, 3)) > 0]
    senders = list(dict.fromkeys(b.shard_id for b in go))
    shard_order = data.draw(st.permutations(senders))
    held[:] = [b for b in held if all(b is not g for g in go)]
    for shard_id in shard_order:
        for batch in (b for b in go if b.shard_id == shard_id):
            reply = p.binder.commit(batch)
            if reply.rejected:
                event("the binder rejected a stale proposal")
            if reply.evicted:
                event("a proposal preempted")
            p.shards[batch.shard_id].apply_reply(reply)
            orphaned = p.dispatcher.on_reply(reply)
            if orphaned:
                p.binder.release(orphaned, TaskState.CANCELLED.value)
            if batch.unschedulable:
                p.dispatcher.on_unschedulable(batch.unschedulable)
            assert_not_overcommitted(p.binder.state)
    return True


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), first=jobs("a"), second=jobs("b"), shards=st.integers(2, 3), data=st.data())
def test_interleaved_shard_proposals_keep_every_invariant(
    nodes: list[Node], first: list[Job], second: list[Job], shards: int, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "gs.db")
        settings = Settings(
            store_path=db, shards=shards, retry_backoff_s=0.0, failure_backoff_s=0.0, batch_size=2
        )
        p = Pipeline(settings, nodes=nodes)
        held: list[ProposalBatch] = []
        p.submit_many(first)
        for _ in range(data.draw(st.integers(0, 4))):
            interleaved_round(p, held, data)
        p.submit_many(second)
        for _ in range(300):
            if not interleaved_round(p, held, data) and not held:
                break
        assert not held
        p.run_until_idle(max_rounds=300)
        all_jobs = first + second
        assert_not_overcommitted(p.binder.state)
        assert_shard_views_match(p)
        assert_gangs_whole(p, all_jobs)
        assert_one_state_each(p, all_jobs)
        q = assert_restart_sees_the_same(p, db, shards, all_jobs)
        q.close()


NO_EXECUTE = Taint("dedicated", "x", TaintEffect.NO_EXECUTE)
TOLERATES_IT = (Toleration("dedicated", "Exists", "", TaintEffect.NO_EXECUTE),)


def assert_no_intolerant_resident(p: Pipeline) -> None:
    """No task sits on a node whose NoExecute taint it does not tolerate."""
    a = p.binder.state
    for row in range(a.n):
        node = a.nodes[row]
        if node is None or NO_EXECUTE not in node.taints:
            continue
        for tid in a.residents[row]:
            job = p.dispatcher.job(split_task_id(tid)[0])
            assert job.groups[0].tolerations == TOLERATES_IT, (tid, node.name)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), work=jobs("a"), shards=st.integers(2, 3), data=st.data())
def test_a_node_tainted_noexecute_while_plans_are_in_flight_never_holds_an_intolerant_task(
    nodes: list[Node], work: list[Job], shards: int, data: st.DataObject
) -> None:
    """Taints come and go between rounds while batches planned on older views are still in flight:
    the control plane evicts the intolerant tasks at the taint, and the binder refuses the plans
    made before it (node_current), so none is bound there afterwards either."""
    tolerant = [data.draw(st.booleans()) for _ in work]
    work = [
        replace(job, groups=tuple(replace(g, tolerations=TOLERATES_IT) for g in job.groups)) if tol else job
        for job, tol in zip(work, tolerant, strict=True)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        settings_ = Settings(
            store_path=str(Path(tmp) / "gs.db"),
            shards=shards,
            retry_backoff_s=0.0,
            failure_backoff_s=0.0,
            batch_size=2,
        )
        control = LocalControl(settings_, nodes=nodes)
        p = control.pipeline
        held: list[ProposalBatch] = []
        p.submit_many(work)
        for _ in range(data.draw(st.integers(1, 12))):
            interleaved_round(p, held, data)
            # mostly a node that plans in flight name: the race under test
            planned = sorted({pl.node for b in held for prop in b.proposals for pl in prop.placements})
            name = data.draw(st.sampled_from(planned)) if planned and data.draw(st.integers(0, 3)) else None
            node = next((n for n in nodes if n.name == name), None) or data.draw(st.sampled_from(nodes))
            taints = (NO_EXECUTE,) if data.draw(st.booleans()) else ()
            control.add_nodes([replace(node, taints=taints)])
            if taints:
                event("a node was tainted with plans in flight" if held else "a node was tainted")
            assert_no_intolerant_resident(p)
        for _ in range(300):
            if not interleaved_round(p, held, data) and not held:
                break
            assert_no_intolerant_resident(p)
        assert not held
        p.run_until_idle(max_rounds=300)
        assert_no_intolerant_resident(p)
        assert_not_overcommitted(p.binder.state)
        assert_gangs_whole(p, work)
        assert_one_state_each(p, work)
        p.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=clusters(),
    batch=jobs("a"),
    crash=st.sampled_from(["after begin_retries", "after lose", "after on_retried"]),
    data=st.data(),
)
def test_a_master_that_dies_anywhere_in_a_retry_loses_nothing_and_waits_the_backoff(
    nodes: list[Node], batch: list[Job], crash: str, data: st.DataObject
) -> None:
    """A FAILED report's three steps (begin_retries, the binder's lose, on_retried), each with its
    own store write, and the master dying after any of them: the restarted one holds every
    invariant, and no task its job runs again starts before the backoff ends."""
    backoff = 60.0
    with tempfile.TemporaryDirectory() as tmp:
        clock = _Clock()
        settings = Settings(
            store_path=str(Path(tmp) / "gs.db"),
            shards=1,
            retry_backoff_s=0.0,
            failure_backoff_s=backoff,
            batch_size=3,
        )
        p = Pipeline(settings, nodes=nodes, clock=clock)
        p.submit_many(batch)
        p.run_until_idle(max_rounds=200)
        bound = sorted(p.binder.state.task_row)
        failing = data.draw(st.lists(st.sampled_from(bound), max_size=3, unique=True)) if bound else []
        again = p.dispatcher.begin_retries(failing)
        gone: list[str] = []  # the failed tasks and the gang mates they stop
        if crash != "after begin_retries":
            gone = p.binder.lose(again)
            if crash == "after on_retried":
                p.dispatcher.on_retried(again, gone, {tid: "exit code 1" for tid in again})
        p.close()
        q = Pipeline(settings, clock=clock)  # the nodes come back from the store
        q.run_until_idle(max_rounds=200)
        assert_not_overcommitted(q.binder.state)
        assert_gangs_whole(q, batch)
        assert_one_state_each(q, batch)
        assert not [tid for tid in gone if tid in q.binder.state.task_row]  # the backoff holds them
        # Each failure counts once if its task left its node, whichever write the master died after.
        assert {tid: n for tid, n in q.dispatcher._retried.items() if n} == {tid: 1 for tid in again if gone}
        clock.now += backoff + 1.0
        q.run_until_idle(max_rounds=200)
        assert_not_overcommitted(q.binder.state)
        assert_gangs_whole(q, batch)
        assert_one_state_each(q, batch)
        q.close()
