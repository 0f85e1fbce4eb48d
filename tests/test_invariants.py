"""Property tests over random clusters, jobs and shard interleavings, through the real pipeline.

Invariants: no node is ever over-committed (CPU, memory, every GPU's share); no gang is ever
partly bound; every accepted job is in exactly one state and none is lost; a restarted binder
has the same state as the live one.
"""

import os
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gosched.binder.binder import Binder
from gosched.common.cluster_state import ClusterArrays
from gosched.common.config import Settings
from gosched.common.job import Job, TaskGroup
from gosched.common.node import Node, make_node
from gosched.common.resources import ResourceRequest
from gosched.common.states import HOLDS_RESOURCES, JobState, TaskState
from gosched.common.store import Store
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
        assert isinstance(p.dispatcher.job_state(job.id), JobState)


def same_state(a: ClusterArrays, b: ClusterArrays) -> None:
    assert a.row_of.keys() == b.row_of.keys()
    for name, row in a.row_of.items():
        other = b.row_of[name]
        assert a.cpu_used[row] == b.cpu_used[other]
        assert a.mem_used[row] == b.mem_used[other]
        assert np.array_equal(a.gpu_free[row], b.gpu_free[other])
        assert set(a.residents[row]) == set(b.residents[other])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), first=jobs("a"), second=jobs("b"), shards=st.integers(1, 3), data=st.data())
def test_pipeline_invariants(
    nodes: list[Node], first: list[Job], second: list[Job], shards: int, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "gs.db")
        p = Pipeline(Settings(store_path=db, shards=shards, retry_backoff_s=0.0, batch_size=3), nodes=nodes)
        p.submit_many(first)
        for _ in range(data.draw(st.integers(0, 5))):
            p.step()
            assert_not_overcommitted(p.binder.state)
        p.submit_many(second)  # higher-priority arrivals may preempt
        p.run_until_idle(max_rounds=200)
        assert_not_overcommitted(p.binder.state)
        all_jobs = first + second
        assert_gangs_whole(p, all_jobs)
        # finish some tasks, schedule again
        done = [tid for job in first for tid in job.task_ids() if tid in p.binder.state.task_row][:3]
        p.complete(done)
        p.run_until_idle(max_rounds=200)
        assert_not_overcommitted(p.binder.state)
        assert_gangs_whole(p, all_jobs)
        for tid in done:
            job_id, idx = tid.rsplit("/", 1)
            assert p.dispatcher.task_states(job_id)[int(idx)] == TaskState.SUCCEEDED
        # a restarted binder sees exactly the same cluster
        reopened = Binder(Store(db))
        same_state(p.binder.state, reopened.state)
        p.close()
