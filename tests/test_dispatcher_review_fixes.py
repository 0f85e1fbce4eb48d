"""Regressions of the dispatcher review: a binder refusal of part of a unit is a race (retried at
once), restore keeps submission order, and a submission the store refuses takes no tokens."""

from collections.abc import Callable
from pathlib import Path

import pytest

from gosched.common.config import AdmissionConfig, QueueConfig, QueuePolicy, Settings
from gosched.common.errors import SpecError
from gosched.common.job import Job
from gosched.common.messages import AcceptedUnit, BindReply, Placement, RejectedUnit
from gosched.common.states import TaskState
from gosched.common.store import Store
from gosched.dispatcher.store import JobStore, MemoryStore
from gosched.runtime.pipeline import Pipeline
from tests.builders import make_job, make_node
from tests.test_dispatcher_support import CPU, dispatcher, job_ids, units

P, B = TaskState.PENDING, TaskState.BOUND


# -- 1. a unit bound in part and refused in part by the binder is retried at once -------------------------
@pytest.mark.parametrize(
    ("refusals", "said"),
    [
        pytest.param(
            [((2, 3), "gpus taken by another shard", "resources_fit")],
            ["task(s) 2, 3 (resources_fit): gpus taken by another shard"],
            id="one-stage",
        ),
        pytest.param(
            [((2,), "node n2 is gone", "node_exists"), ((3,), "cpu taken", "resources_fit")],
            ["task(s) 2 (node_exists): node n2 is gone", "task(s) 3 (resources_fit): cpu taken"],
            id="two-stages",
        ),
    ],
)
def test_elastic_unit_refused_in_part_by_the_binder_is_retried_at_once(
    refusals: list[tuple[tuple[int, ...], str, str]], said: list[str]
) -> None:
    d, _ = dispatcher(backoff=30.0, backoff_max=60.0, periodic=600.0, shards=1)
    d.set_cluster_capacity(100 * CPU, 0, 0)
    # "j": the binder binds 0 and 1 and refuses the rest; "k": the shard placed 0 and 1 only.
    d.submit_many([make_job(n).cpu("1").replicas(4).min_member(1).build() for n in ("j", "k")])
    uj, uk = units(d.next_batches())
    accepted = [
        AcceptedUnit.of(u.job.id, u.attempt, [Placement(0, "n1"), Placement(1, "n1")], 0.0) for u in (uj, uk)
    ]
    rejected = [RejectedUnit("j", idx, reason, stage) for idx, reason, stage in refusals]
    d.on_reply(BindReply(accepted, rejected, [], [], 1, shard_id=0))

    assert d.task_states("j") == [B, B, P, P]
    assert d._jobs["j"].failures == 0  # a race is no unschedulable attempt
    explained = d.explain("j")
    assert "queued" in explained and "backing off" not in explained
    assert all(part in explained for part in said), explained
    # Retried with no wait; the job whose tasks the shard could not fit still backs off.
    assert job_ids(d.next_batches()) == ["j"]
    assert "backing off" in d.explain("k")


def test_pipeline_race_on_an_elastic_job_binds_it_without_waiting_for_a_retry(tmp_path: Path) -> None:
    # Two shards race: A (shard 0) takes the room on n1 that shard 1 planned B/0 onto, so the
    # binder binds B/1 and B/2 and refuses B/0 while n5 is free. B must not wait out a backoff.
    s = Settings(store_path=str(tmp_path / "gs.db"), retry_backoff_s=30.0, retry_backoff_max_s=60.0, shards=2)
    sizes = (4, 4, 4, 1, 4)
    p = Pipeline(
        s, nodes=[make_node(f"n{i}").cpu(str(c)).mem("16Gi").build() for i, c in enumerate(sizes, 1)]
    )
    try:
        # A round first, so that each shard's view is current.
        p.submit_many([make_job("w0").cpu("0.01").build(), make_job("w1").cpu("0.01").build()])
        p.run_until_idle()
        p.submit_many(
            [make_job("A").cpu("2.5").build(), make_job("B").cpu("3").replicas(3).min_member(2).build()]
        )
        p.step()
        d = p.dispatcher
        assert d.task_states("B") == [P, B, B]
        assert "rejected in part by the binder, retried at once: task(s) 0 (resources_fit)" in d.explain("B")
        p.run_until_idle()  # no waiting for backoff
        assert d.task_states("B") == [B, B, B]
    finally:
        p.close()


# -- 2. restore keeps submission order, whatever submit_time a client gave -------------------------------
def _open(kind: str, tmp_path: Path) -> JobStore:
    return MemoryStore() if kind == "memory" else Store(str(tmp_path / "gosched.db"))


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize(
    "queue",
    [
        QueueConfig(name="default"),  # FIFO
        QueueConfig(name="default", policy=QueuePolicy.PRIORITY, aging_per_s=0.0),  # ties by submission
        QueueConfig(name="default", policy=QueuePolicy.DEADLINE),  # ties by submission
        QueueConfig(name="default", policy=QueuePolicy.FAIR),  # one tenant: its FIFO
    ],
    ids=lambda q: q.policy.value,
)
def test_restore_keeps_the_order_of_submission(kind: str, queue: QueueConfig, tmp_path: Path) -> None:
    store = _open(kind, tmp_path)
    d, _ = dispatcher(queue, store=store, shards=1)
    d.submit(make_job("first").cpu("1").deadline(5000.0).build())  # stamped now (1000)
    d.submit(make_job("second").cpu("1").deadline(5000.0).submitted(500.0).build())  # a past time
    d.submit(make_job("third").cpu("1").deadline(5000.0).submitted(800.0).build())
    before = job_ids(d.next_batches())
    assert before == ["first", "second", "third"]
    if isinstance(store, Store):
        store.close()
        store = _open(kind, tmp_path)
    d2, _ = dispatcher(queue, store=store, shards=1)
    assert d2.restore() == 3
    assert job_ids(d2.next_batches()) == before


# -- 3. a submission the store refuses takes no rate-limit tokens -------------------------------------------
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize(
    "refused",
    [
        pytest.param(lambda old: [old], id="one-job"),
        pytest.param(lambda old: [make_job("fresh").cpu("1").build(), old], id="in-a-batch"),
    ],
)
def test_submission_refused_by_the_store_takes_no_tokens(
    kind: str, refused: Callable[[Job], list[Job]], tmp_path: Path
) -> None:
    store = _open(kind, tmp_path)
    old = make_job("old").cpu("1").submitted(1.0).build()
    store.add_jobs([old])  # finished and past retention, say: known to the store only
    d, _ = dispatcher(store=store, admission=AdmissionConfig(tenant_rate_per_s=0.001, tenant_burst=2))
    for _ in range(2):
        with pytest.raises(SpecError, match="already"):
            d.submit_many(refused(old))
    assert d.admission.bucket("default").tokens == 2.0
    assert d.submit_many([make_job("a").cpu("1").build(), make_job("b").cpu("1").build()]) == ["a", "b"]
    assert d.admission.bucket("default").tokens == 0.0  # an accepted submission still pays
