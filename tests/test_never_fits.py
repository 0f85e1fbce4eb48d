"""A gang the cluster's nodes could not hold even empty says so in "why pending", with how many of
its tasks they would hold at most; a gang that only waits for room does not. The bound counts each
resource (CPU, memory, whole and shared GPUs, extended) on the nodes its static filters allow,
and follows the nodes as they change."""

from pathlib import Path

import pytest

from gosched.common.config import Settings
from gosched.common.job import Job
from gosched.common.node import Node
from gosched.runtime.pipeline import Pipeline
from tests.builders import make_job, make_node

NEVER = "it can never fit as the cluster is"


def _gpu_nodes() -> list[Node]:
    return [
        make_node(f"n{i}").cpu("8").mem("32Gi").gpus(4).label(zone="a" if i else "b").build()
        for i in range(2)
    ]


def _pending_note(tmp_path: Path, nodes: list[Node], job: Job) -> str:
    settings = Settings(store_path=str(tmp_path / "gs.db"), shards=1, retry_backoff_s=0.0)
    p = Pipeline(settings, nodes=nodes)
    p.submit(job)
    p.run_until_idle()
    text = p.dispatcher.explain(job.id)
    p.close()
    return text


@pytest.mark.parametrize(
    ("job", "most"),
    [
        (make_job("g").cpu("1").gpus(8).replicas(2).min_member(2).build(), 0),  # 8 GPUs a task
        (make_job("g").cpu("1").gpus(4).replicas(3).min_member(3).build(), 2),  # one a node
        (make_job("g").cpu("1").gpus(2).replicas(5).min_member(5).build(), 4),
        (make_job("g").cpu("1").gpu_share(500).replicas(17).min_member(17).build(), 16),  # shares
        (make_job("g").cpu("3").replicas(5).min_member(5).build(), 4),  # CPU bound
        (make_job("g").cpu("1").mem("20Gi").replicas(3).min_member(3).build(), 2),  # memory bound
        (make_job("g").cpu("1").gpus(1).selector(zone="a").replicas(5).min_member(5).build(), 4),
        (make_job("g").cpu("1").extended("example.com/fpga", 1).replicas(2).min_member(2).build(), 0),
    ],
)
def test_a_gang_larger_than_the_cluster_is_told_it_can_never_fit(job: Job, most: int, tmp_path: Path) -> None:
    text = _pending_note(tmp_path, _gpu_nodes(), job)
    assert f"{NEVER}: even empty, the ready nodes it may use hold at most {most} of its tasks" in text
    assert f"its gang needs {job.min_member}" in text


@pytest.mark.parametrize(
    "job",
    [
        make_job("g").cpu("1").gpus(4).replicas(2).min_member(2).build(),  # fits: placed
        make_job("g").cpu("1").gpus(1).replicas(8).min_member(8).build(),
        make_job("g").cpu("1").gpus(8).build(),  # no gang: "too few GPUs" says it already
        make_job("g").cpu("1").gpus(4).replicas(4).min_member(2).build(),  # elastic: its minimum fits
    ],
)
def test_a_gang_the_empty_cluster_could_hold_is_not_told_so(job: Job, tmp_path: Path) -> None:
    assert NEVER not in _pending_note(tmp_path, _gpu_nodes(), job)


def test_the_bound_follows_the_nodes(tmp_path: Path) -> None:
    """Busy, the gang waits for room without the note; a node joining makes it fit at last."""
    settings = Settings(store_path=str(tmp_path / "gs.db"), shards=1, retry_backoff_s=0.0)
    p = Pipeline(settings, nodes=_gpu_nodes())
    p.submit(make_job("g").cpu("1").gpus(4).replicas(3).min_member(3).build())
    p.run_until_idle()
    assert "at most 2 of its tasks" in p.dispatcher.explain("g")
    p.add_nodes([make_node("n2").cpu("8").mem("32Gi").gpus(4).build()])
    p.run_until_idle()
    assert p.dispatcher.job_state("g").value == "running"
    p.close()


def test_a_gang_that_waits_for_room_is_not_told_it_never_fits(tmp_path: Path) -> None:
    settings = Settings(store_path=str(tmp_path / "gs.db"), shards=1, retry_backoff_s=0.0)
    p = Pipeline(settings, nodes=_gpu_nodes())
    for name in ("first", "second"):
        p.submit(make_job(name).cpu("1").gpus(4).replicas(2).min_member(2).build())
    p.run_until_idle()
    assert p.dispatcher.job_state("second").value == "pending"
    text = p.dispatcher.explain("second")
    assert "insufficient GPU" in text and NEVER not in text
    p.close()
