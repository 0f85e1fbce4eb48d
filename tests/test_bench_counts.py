"""The benchmark's counts on tiny runs: the tasks measured, the distinct tasks bound (each once),
the seconds from the first dispatch to the last binding, and what the table and the CLI say of
them; the ingest line's batching; the writer's CPU on Ray (its arithmetic, without Ray)."""

import functools
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gosched.bench import runner
from gosched.bench.ingest import IngestResult, call_percentiles_ms, ingest_line, run_ingest
from gosched.bench.report import table
from gosched.bench.runner import _Bindings, _writer_cpu_s, run_in_process
from gosched.bench.workloads import WORKLOADS, Workload
from gosched.cli.main import app
from gosched.common.cluster_state import Resident
from gosched.common.config import ProfileConfig, Settings
from gosched.common.job import Job
from gosched.common.messages import (
    AcceptedUnit,
    BindReply,
    Change,
    NodeRemoved,
    Proposal,
    ProposalBatch,
    TaskBound,
    TaskReleased,
)
from gosched.runtime.pipeline import Pipeline
from gosched.runtime.ray_bench import count_bindings
from gosched.runtime.simulation import GiB, basic_jobs, sim_nodes


def test_gpu_mix_measures_the_tasks_asked_not_as_many_jobs() -> None:
    for tasks in (1, 7, 100, 1000):
        w = WORKLOADS["gpu-mix"](40, tasks)
        assert w.measured_tasks == tasks and w.asked == tasks and not w.note
        assert all(j.min_member <= j.total_replicas for j in w.measured)
    # its mix of gangs is kept: more tasks than jobs
    assert len(WORKLOADS["gpu-mix"](40, 100).measured) < 100


def test_fill_90_measures_whole_nodes_and_all_of_them_bind() -> None:
    # 100 tasks on 40 nodes: 2.5 a node cannot fill 90% of whole nodes; 2 a node can (80 tasks).
    w = WORKLOADS["fill-90"](40, 100)
    assert (w.measured_tasks, w.asked, len(w.nodes)) == (80, 100, 40) and "2 a node" in w.note
    cpu = sum(j.groups[0].resources.cpu_milli for j in w.measured)
    assert cpu == pytest.approx(0.9 * sum(n.cpu_milli for n in w.nodes), rel=1e-3)
    r = run_in_process(w, shards=1, profile=ProfileConfig())
    assert r.tasks == r.bound == 80 and r.asked == 100
    # fewer tasks than nodes: as many nodes as tasks, one task each
    w = WORKLOADS["fill-90"](40, 10)
    assert (w.measured_tasks, len(w.nodes)) == (10, 10) and "10 of the 40 nodes" in w.note


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_measured_task_is_bound_once_and_the_rate_is_bound_over_seconds(name: str) -> None:
    w = WORKLOADS[name](40, 100)
    r = run_in_process(w, shards=1, profile=ProfileConfig())
    assert r.tasks == w.measured_tasks
    assert 0 < r.bound <= r.tasks  # distinct measured tasks, whatever the evictions
    assert r.bindings is not None and r.bindings >= r.bound
    if name != "gpu-mix":  # the one with more tasks than the cluster holds
        assert r.bound == r.tasks
    assert r.tasks_per_s == pytest.approx(r.bound / r.seconds)
    assert (r.asked is None) == (w.asked == w.measured_tasks)
    d = r.as_dict()
    assert d["tasks"] == r.tasks and d["bound"] == r.bound and d["bindings"] == r.bindings


def _proposal(job: Job, dispatched: float) -> Proposal:
    return Proposal(job=job, placements=[], min_needed=1, dispatch_time=dispatched)


def test_a_task_bound_again_counts_once_and_other_jobs_not_at_all() -> None:
    class FakeBinder:
        def __init__(self) -> None:
            self.replies: list[BindReply] = []

        def commit(self, batch: ProposalBatch) -> BindReply:
            return self.replies.pop(0)

    class FakePipeline:
        binder = FakeBinder()

    p = FakePipeline()
    measured = basic_jobs(2, prefix="m")  # m-0, m-1
    counted = _Bindings(p, measured)  # type: ignore[arg-type]
    batch = ProposalBatch(
        0, 0, [_proposal(measured[0], 10.0), _proposal(basic_jobs(1, prefix="init")[0], 10.0)]
    )
    p.binder.replies = [
        BindReply([AcceptedUnit("m-0", 0, (0,), 10.5), AcceptedUnit("init-0", 0, (0,), 10.5)], [], [], [], 1),
        BindReply([AcceptedUnit("m-0", 1, (0,), 11.0)], [], [], [], 2),  # evicted, placed again
    ]
    p.binder.commit(batch)
    assert counted.last_s is not None
    first_last = counted.last_s
    p.binder.commit(batch)
    assert counted.bindings == 2 and list(counted.first) == [("m-0", 0)]
    assert counted.first[("m-0", 0)] == pytest.approx(0.5)  # its first binding's latency
    assert counted.last_s >= first_last


def test_the_seconds_end_at_the_last_binding_not_after_the_backoff_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 100 tasks of 36% of a node on 40 nodes: 80 bind, 20 fit nowhere and are retried after a
    # backoff (made 0.3 s here) once the bindings changed the cluster.
    monkeypatch.setattr(runner, "Settings", functools.partial(Settings, retry_backoff_s=0.3))
    jobs = basic_jobs(100, cpu_milli=11_520, memory=46 * GiB)
    w = Workload("too-big", sim_nodes(40, gpu_every=0), [], jobs, 100)
    t0 = time.perf_counter()
    r = run_in_process(w, shards=1, profile=ProfileConfig())
    wall = time.perf_counter() - t0
    assert r.bound == 80 and r.retries > 0
    assert wall >= 0.3  # the run waited out a backoff ...
    assert r.seconds < 0.3  # ... after its last binding: not the run's time


def test_the_table_gives_tasks_and_bound_and_says_why_fewer() -> None:
    runs = [run_in_process(WORKLOADS[n](40, 100), 1, ProfileConfig()) for n in ("gang", "scheduling-basic")]
    text = table(runs)
    head, gang, basic = text.splitlines()[:3]
    assert head.split()[5:8] == ["tasks", "bound", "tasks/s"]
    assert gang.split()[5:7] == ["99", "99"] and basic.split()[5:7] == ["100", "100"]
    assert "gang in-process default 1 shard(s): measures 99 of the 100 tasks asked (whole gangs of 3" in text
    assert "scheduling-basic in-process default 1 shard(s)" not in text  # nothing to say
    r = runs[1]
    r.bound, r.bindings = 90, 95
    assert "10 of its 100 tasks never bound; 5 more bindings of tasks evicted and placed again" in table([r])


def test_the_cli_line_says_bound_of_measured(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        app,
        [
            "bench",
            "--in-process",
            "--workload",
            "gang",
            "--nodes",
            "40",
            "--pods",
            "100",
            "--out",
            str(tmp_path),
        ],
    )
    assert out.exit_code == 0, out.output
    assert "99 of 99 tasks bound in " in out.output and "measures 99 of the 100 tasks asked" in out.output


def test_the_ingest_line_gives_the_calls_and_the_jobs_each() -> None:
    def result(jobs: int, batch: int, calls: int) -> IngestResult:
        return IngestResult(
            runtime="local",
            jobs=jobs,
            replicas=5,
            batch=batch,
            calls=calls,
            accepted_tasks=jobs * 5,
            seconds=0.1,
            p50_call_ms=1.0,
            p99_call_ms=2.0,
        )

    assert "500 tasks in 100 jobs of 5 tasks, 1 call of 100 jobs," in ingest_line(result(100, 100, 1))
    assert "in 250 jobs of 5 tasks, 3 calls of up to 100 jobs," in ingest_line(result(250, 100, 3))
    got = run_ingest(500, replicas=5, batch=500, nodes=10)
    assert (got.jobs, got.batch, got.calls, got.accepted_tasks) == (100, 100, 1, 500)
    assert "1 call of 100 jobs" in ingest_line(got)


def test_the_writers_cpu_is_its_own_reading_while_it_is_the_same_writer() -> None:
    before = {"writer_pid": 7, "writer_busy_s": 0.25}
    assert _writer_cpu_s(before, {"writer_pid": 7, "writer_busy_s": 0.2534}) == pytest.approx(0.0034)
    assert _writer_cpu_s(before, {"writer_pid": 8, "writer_busy_s": 0.01}) is None  # restarted
    assert _writer_cpu_s({"writer_pid": None}, {"writer_pid": None, "writer_busy_s": 0.0}) is None


class _FakeBinder:
    def __init__(self) -> None:
        self.replies: list[BindReply] = []

    def commit(self, batch: ProposalBatch) -> BindReply:
        return self.replies.pop(0)


def test_a_task_dispatched_at_the_clocks_origin_is_counted_with_its_latency() -> None:
    # 0.0 is a dispatch time like any other (a clock that starts with the run): the binding
    # counts, and its latency is bind time - 0.0, not dropped as if the task had no stamp.
    class FakePipeline:
        binder = _FakeBinder()

    p = FakePipeline()
    measured = basic_jobs(2, prefix="m")
    counted = _Bindings(p, measured)  # type: ignore[arg-type]
    batch = ProposalBatch(0, 0, [_proposal(measured[0], 0.0), _proposal(measured[1], 0.5)])
    p.binder.replies = [
        BindReply([AcceptedUnit("m-0", 0, (0,), 0.25), AcceptedUnit("m-1", 0, (0,), 0.75)], [], [], [], 1),
        BindReply([AcceptedUnit("m-0", 1, (0,), 2.0)], [], [], [], 2),  # placed again later
    ]
    p.binder.commit(batch)
    p.binder.commit(batch)
    assert counted.bound == {("m-0", 0), ("m-1", 0)} and counted.bindings == 3
    assert counted.first == {("m-0", 0): pytest.approx(0.25), ("m-1", 0): pytest.approx(0.25)}


def test_a_run_on_a_clock_at_its_origin_counts_every_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole pipeline on a clock frozen at 0.0 (as a simulated-time run starts): every stamp
    # is 0.0, and every binding still counts, in bound, in the rate and in the latencies.
    monkeypatch.setattr(runner, "Pipeline", functools.partial(Pipeline, clock=lambda: 0.0))
    for name in ("scheduling-basic", "gang"):
        r = run_in_process(WORKLOADS[name](10, 30), 1, ProfileConfig())
        assert r.bound == r.bindings == r.tasks == 30
        assert r.tasks_per_s == pytest.approx(r.bound / r.seconds) and r.tasks_per_s > 0
        assert r.p50_ms == r.p99_ms == 0.0  # bound at the dispatch's instant, on that clock


def test_the_pipelines_own_latencies_count_a_dispatch_at_the_clocks_origin(tmp_path: Path) -> None:
    # Its own store: the default one (gosched.db in the working directory) outlives the run.
    p = Pipeline(Settings(shards=1), nodes=sim_nodes(2), clock=lambda: 0.0, store_path=tmp_path / "s.db")
    p.submit_many(basic_jobs(5))
    p.run_until_idle()
    assert p.stats.bound_tasks == 5 and p.stats.latencies == [0.0] * 5
    p.close()


def _bound(task: str, at: float) -> TaskBound:
    job = task.split("/")[0]
    resident = Resident(task_id=task, job_id=job, cpu_milli=500, memory=GiB, start_time=at)
    return TaskBound("sim-00000", resident)


def test_the_binders_log_gives_the_measured_tasks_bound_once_and_every_binding() -> None:
    changes: list[Change] = [
        _bound("init-0/0", 5.0),  # a warm-up task (bound again in the run): not measured
        _bound("job-0/0", 1.0),
        _bound("job-1/0", 2.0),
        TaskReleased("job-0/0", "preempted"),
        NodeRemoved("sim-00001"),
        _bound("job-0/0", 3.0),  # placed again: a binding, not another task
        _bound("job-1/1", 2.5),
    ]
    got = count_bindings(changes, False, ["job-0", "job-1", "job-2"])
    assert (got.bound, got.bindings, got.last_bind) == (3, 4, 3.0)
    # A snapshot (the binder restarted, or its log was trimmed): the tasks it holds, no bindings.
    got = count_bindings([_bound("job-0/0", 3.0), _bound("init-0/0", 5.0)], True, {"job-0"})
    assert (got.bound, got.bindings, got.last_bind) == (1, None, 3.0)
    assert count_bindings([_bound("init-0/0", 5.0)], False, {"job-0"}).last_bind is None


def test_the_ingest_percentiles_read_the_calls_as_the_latencies_are_read() -> None:
    calls = [i / 1000 for i in range(1, 101)]  # 1 .. 100 ms
    p50, p99 = call_percentiles_ms(calls)
    assert p50 == pytest.approx(50.5) and p99 == pytest.approx(99.01)  # not the slowest call
    assert call_percentiles_ms([0.002]) == (pytest.approx(2.0), pytest.approx(2.0))


def test_on_ray_bound_is_the_measured_tasks_and_bindings_count_a_task_placed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node holding warm-up and measured tasks is lost during the measured run: its tasks are
    bound again elsewhere. The dispatcher's bound_tasks counts all those bindings; the run counts
    the measured tasks once in `bound`, their bindings in `bindings`, the warm-up's in neither;
    its seconds end at the last binding of a measured task, not when run_until_idle returns."""
    ray = pytest.importorskip("ray")
    from gosched.runtime.ray_cluster import RayScheduler

    w = WORKLOADS["scheduling-basic"](3, 20)  # 4 warm-up tasks, 20 measured, on 3 nodes
    measured = {j.id for j in w.measured}
    lost: list[str] = []
    run_until_idle = RayScheduler.run_until_idle
    calls = 0

    def and_lose_a_node(rs: RayScheduler, *args: object, **kwargs: object) -> int:
        nonlocal calls
        rounds = run_until_idle(rs, *args, **kwargs)  # type: ignore[arg-type]
        calls += 1
        if calls == 2:  # the measured run (the first one was the warm-up's)
            held = ray.get(rs.binder.residents.remote([n.name for n in w.nodes]))
            name = next(
                (n for n, tids in held.items() if {t.split("-")[0] for t in tids} == {"init", "job"}),
                None,
            )
            assert name is not None, f"no node holds warm-up and measured tasks: {held}"
            lost.extend(rs.remove_node(name))
            rounds += run_until_idle(rs, *args, **kwargs)  # type: ignore[arg-type]
            time.sleep(0.5)  # as a long idle detection after the last binding: not the run's time
        return rounds

    monkeypatch.setattr(RayScheduler, "run_until_idle", and_lose_a_node)
    t0 = time.perf_counter()
    r = runner.run_ray(w, 1, ProfileConfig(), batch_size=8)
    wall = time.perf_counter() - t0
    again = [t for t in lost if t.split("/")[0] in measured]
    assert again and len(again) < len(lost)  # measured and warm-up tasks were bound again
    assert r.tasks == r.bound == 20
    assert r.bindings == 20 + len(again)
    assert r.tasks_per_s == pytest.approx(r.bound / r.seconds) and 0 < r.seconds < 0.5 < wall
    assert "more bindings of tasks evicted and placed again" in table([r])
