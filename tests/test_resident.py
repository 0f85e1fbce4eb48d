"""Resident.for_task builds its record positionally (the hot path): every field lands where named."""

from gosched.common.cluster_state import Resident
from tests.builders import make_job


def test_for_task_fills_every_field_from_the_job_and_the_tasks_group() -> None:
    job = (
        make_job("j")
        .cpu("1")
        .mem("1Gi")
        .role("ps")
        .extended("fpga", 2)
        .group("worker")
        .cpu("3")
        .replicas(2)
        .priority(7)
        .queue("q")
        .tenant("t")
        .labels(app="x")
        .min_member(2)
        .preemptible(False)
        .disruption_budget(1)
        .build()
    )
    got = Resident.for_task(job, 2, ((1, 500),), 42.0)
    worker = job.group_of(2)
    assert got == Resident(
        task_id="j/2",
        job_id="j",
        cpu_milli=worker.resources.cpu_milli,
        memory=worker.resources.memory,
        gpus=((1, 500),),
        extended=worker.resources.extended,
        priority=7,
        preemptible=job.preemptible,
        queue="q",
        tenant="t",
        start_time=42.0,
        job_labels=(("app", "x"),),
        role="worker",
        min_member=2,
        disruption_budget=job.disruption_budget,
    )
    assert Resident.for_task(job, 0, (), 1.0).role == "ps"
    assert Resident.for_task(job, 0, (), 1.0).extended == (("fpga", 2),)
