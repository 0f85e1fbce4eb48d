"""Deadlines as Slurm's --deadline: a job that could no longer end by its deadline is cancelled,
not started; one submitted so is refused. Dispatcher level on a clock the test moves, whatever the
job is doing when its latest start passes; then through the gRPC API and the CLI's submit."""

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gosched import Client
from gosched.api.errors import InvalidArgument
from gosched.api.server import ServerHandle
from gosched.common.config import Settings
from gosched.common.errors import SpecError
from gosched.common.job import task_id
from gosched.common.messages import Unit
from gosched.common.spec import job_from_spec
from gosched.common.states import JobState, TaskState
from gosched.dispatcher.dispatcher import Dispatcher
from gosched.dispatcher.records import DORMANT, INFLIGHT, PARKED, QUEUED, Where
from gosched.dispatcher.store import MemoryStore
from gosched.runtime.pipeline import Pipeline
from gosched.runtime.ray_actors import DispatcherCore
from tests.builders import make_job, make_node
from tests.loopback import cli, sim_master
from tests.test_dispatcher_support import (
    CPU,
    GI,
    Clock,
    accept,
    accept_tasks,
    dispatcher,
    units,
    unschedulable,
)

LIMIT = 60.0  # the jobs' time_limit
DEADLINE = 100.0  # from the clock's start: the latest start is 40 s in
START_BY = DEADLINE - LIMIT


def _new(**kw: bool) -> tuple[Dispatcher, Clock]:
    d, clock = dispatcher(shards=1, **kw)  # type: ignore[arg-type]
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    return d, clock


def _submit(d: Dispatcher, clock: Clock, job_id: str = "j", replicas: int = 1, min_member: int = 1) -> None:
    job = make_job(job_id).cpu("1").replicas(replicas).min_member(min_member)
    d.submit(job.deadline(clock.now + DEADLINE).time_limit(LIMIT).build())


def _round(d: Dispatcher) -> list[Unit]:
    d.notify_cluster_changed()  # a dormant job would go: only the deadline holds it back
    return [u for u in units(d.next_batches()) if u.job.id == "j"]


# -- where the job is when its latest start passes ---------------------------------------------------
def _queued(d: Dispatcher, clock: Clock) -> Callable[[], None] | None:
    return None


def _parked(d: Dispatcher, clock: Clock) -> Callable[[], None] | None:
    d.settings.retry_backoff_s = d.settings.retry_backoff_max_s = 1e6  # it outlasts the deadline
    (u,) = _round(d)
    d.on_unschedulable([unschedulable(u)])
    return None


def _dormant(d: Dispatcher, clock: Clock) -> Callable[[], None] | None:
    for _ in range(2):
        (u,) = [v for v in units(d.next_batches()) if v.job.id == "j"]
        d.on_unschedulable([unschedulable(u)])
        clock.advance(1.0)
    d.next_batches()  # its backoff ends on an unchanged cluster: dormant
    return None


def _in_flight_then_unschedulable(d: Dispatcher, clock: Clock) -> Callable[[], None]:
    (u,) = _round(d)
    return lambda: d.on_unschedulable([unschedulable(u)])


@pytest.mark.parametrize(
    ("setup", "where"),
    [
        (_queued, QUEUED),
        (_parked, PARKED),
        (_dormant, DORMANT),
        (_in_flight_then_unschedulable, INFLIGHT),
    ],
    ids=["queued", "parked", "dormant", "in-flight-then-unschedulable"],
)
def test_a_job_not_started_by_its_latest_start_is_cancelled(
    setup: Callable[[Dispatcher, Clock], Callable[[], None] | None], where: Where
) -> None:
    store = MemoryStore()
    d, clock = dispatcher(shards=1, store=store)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    _submit(d, clock)
    assert "cancelled unless it starts within 40s (by 1970-01-01T00:17:20+00:00" in d.explain("j")
    answer = setup(d, clock)
    assert d._jobs["j"].where is where
    clock.advance(START_BY - clock.now + 1000.0 - 0.5)  # just before its latest start: still there
    if where is QUEUED:
        assert d.job_state("j") is JobState.PENDING
    else:
        d.next_batches()
        assert d.job_state("j") is JobState.PENDING
    clock.advance(1.0)
    if answer is not None:
        assert _round(d) == []  # in flight: left alone
        assert d.job_state("j") is JobState.PENDING
        answer()  # refused after its latest start: it waits again, and so is cancelled
    assert _round(d) == []
    assert d.job_state("j") is JobState.CANCELLED
    assert store.states["j"] == [TaskState.CANCELLED]
    explained = d.explain("j")
    assert (
        "cancelled: not started by 1970-01-01T00:17:20+00:00, the latest start that ends by its" in explained
    )
    assert "deadline 1970-01-01T00:18:20+00:00 (its time_limit of 1m)" in explained


def test_a_job_started_in_time_runs_past_its_latest_start_and_is_cancelled_if_it_waits_again() -> None:
    """Bound before its latest start, it runs on. Preempted after it, it could no longer end by
    its deadline: cancelled, not queued again."""
    d, clock = _new()
    _submit(d, clock)
    (u,) = _round(d)
    d.on_reply(accept([u]))
    clock.advance(START_BY + 1.0)
    assert _round(d) == []
    assert d.job_state("j") is JobState.RUNNING
    assert "cancelled unless" not in d.explain("j")
    d.on_released([task_id("j", 0)], TaskState.PREEMPTED)
    assert _round(d) == []
    assert d.job_state("j") is JobState.CANCELLED
    assert "cancelled: not started by" in d.explain("j")


def test_an_elastic_job_running_keeps_its_pending_extras_past_its_latest_start() -> None:
    """The deadline stops a job from starting; a job that runs (min_member held) is not cut."""
    d, clock = _new()
    _submit(d, clock, replicas=2, min_member=1)
    _round(d)
    d.on_reply(accept_tasks("j", [0]))
    clock.advance(START_BY + 1.0)
    (extra,) = _round(d)
    assert extra.task_indexes == (1,)
    assert d.job_state("j") is JobState.RUNNING


def _refuse_all(d: Dispatcher) -> None:
    """A round whose every unit fits nowhere."""
    d.on_unschedulable([unschedulable(u) for u in units(d.next_batches())])


def test_a_job_with_no_time_limit_is_cancelled_once_its_deadline_passes() -> None:
    d, clock = _new()
    d.submit(make_job("j").cpu("1").deadline(clock.now + 30).build())
    _refuse_all(d)
    clock.advance(29.0)
    _refuse_all(d)
    assert d.job_state("j") is JobState.PENDING
    clock.advance(1.0)
    _refuse_all(d)
    assert d.job_state("j") is JobState.CANCELLED
    assert "(no time_limit)" in d.explain("j")


def test_deadlines_only_order_where_the_setting_is_off() -> None:
    d, clock = _new(end_missed_deadlines=False)
    _submit(d, clock)
    clock.advance(DEADLINE + 1.0)
    assert len(_round(d)) == 1  # dispatched, past its deadline
    assert "past its deadline by 1s (deadlines order the queue; nothing is stopped)" in d.explain("j")
    late = make_job("late").cpu("1").deadline(clock.now + 10).time_limit(LIMIT).build()
    assert d.submit(late) == "late"  # taken: it could not end in time, but nothing is stopped


# -- submission ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("deadline_in", "limit", "reason"),
    [
        (
            30.0,
            60.0,
            "job x: its time_limit of 1m, from now, would run past its deadline "
            "1970-01-01T00:17:10+00:00 (30s away)",
        ),
        (-5.0, None, "job x: its deadline 1970-01-01T00:16:35+00:00 has passed"),
        (
            60.0,
            60.0,
            "1m, from now, would run past its deadline 1970-01-01T00:17:40+00:00 (1m away)",
        ),  # ending at it exactly: too late
    ],
    ids=["time-limit-too-long", "passed", "no-room-at-all"],
)
def test_a_job_that_could_not_end_by_its_deadline_is_refused_naming_the_field(
    deadline_in: float, limit: float | None, reason: str
) -> None:
    d, clock = _new()
    job = make_job("x").cpu("1").deadline(clock.now + deadline_in)
    built = (job.time_limit(limit) if limit is not None else job).build()
    with pytest.raises(SpecError) as one:
        d.submit(built)
    assert one.value.field == "deadline" and reason in one.value.reason
    with pytest.raises(SpecError) as batch:
        d.submit_many([make_job("ok").cpu("1").build(), built])
    assert batch.value.field == "jobs[1].deadline"
    assert "ok" not in d and "x" not in d  # all or none


def test_a_restart_cancels_a_stored_job_past_its_latest_start() -> None:
    store = MemoryStore()
    d, clock = dispatcher(shards=1, store=store)
    _submit(d, clock)
    clock.advance(START_BY + 5.0)  # the master was down meanwhile
    again, _ = dispatcher(shards=1, store=store, clock=clock)
    assert again.restore() == 1
    assert again.next_batches() == []
    assert again.job_state("j") is JobState.CANCELLED
    assert store.states["j"] == [TaskState.CANCELLED]


@pytest.mark.parametrize(
    ("given", "want"),
    [("now+2h", 1000.0 + 7200), (" now+1h30m ", 1000.0 + 5400), ("now+01:00:00", 1000.0 + 3600)],
)
def test_a_spec_deadline_may_be_written_from_now(given: str, want: float) -> None:
    job = job_from_spec({"id": "r", "command": "true", "cpu": 1, "deadline": given}, now=1000.0)
    assert job.deadline == want


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("now+2x", "'2x' is not a duration"),
        ("soon", "'soon' is not an ISO-8601 time (give unix seconds as a number, or now+DURATION as now+2h)"),
    ],
)
def test_a_bad_deadline_names_the_field(given: str, reason: str) -> None:
    with pytest.raises(SpecError) as bad:
        job_from_spec({"id": "r", "command": "true", "cpu": 1, "deadline": given}, now=1000.0)
    assert bad.value.field == "deadline" and reason in bad.value.reason


# -- through the gRPC API ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    handle = sim_master(tmp_path_factory.mktemp("deadlines"), task_seconds=0.3)
    yield handle
    handle.stop()


def test_the_api_refuses_a_job_that_could_not_end_by_its_deadline(
    server: ServerHandle, tmp_path: Path
) -> None:
    client = Client(server.target)
    try:
        spec = {
            "id": "late",
            "command": "true",
            "cpu": 1,
            "deadline": "2099-01-01T00:00:00Z",
            "time_limit": "1h",
        }
        assert client.submit(spec) == "late"  # far enough: taken
        too_soon = dict(spec, id="too-soon", time_limit="365d")
        too_soon["deadline"] = _iso_in(3600.0)
        with pytest.raises(InvalidArgument) as refused:
            client.submit(too_soon)
        assert refused.value.field == "deadline"
        assert "its time_limit of 365d, from now, would run past its deadline" in str(refused.value)
        assert "too-soon" not in [j.id for j in client.list()]
        result = cli(
            server, "submit", "--deadline", _iso_in(60.0), "--time", "2h", "--cpus", "1", "--", "true"
        )
        assert result.exit_code != 0
        assert (
            "deadline" in result.stderr and "its time_limit of 2h, from now, would run past" in result.stderr
        )
        taken = cli(server, "submit", "--deadline", "now+6h", "--time", "2h", "--cpus", "1", "--", "true")
        assert taken.exit_code == 0, taken.output
        job = client.get(taken.stdout.strip())
        assert job.job.deadline is not None and 6 * 3600 - 60 < job.job.deadline - time.time() <= 6 * 3600
        # A retry under a submission id would carry another moment: refused before it is sent.
        with pytest.raises(InvalidArgument, match="a new moment at every retry") as relative:
            client.submit(dict(spec, id="again", deadline="now+6h"), submission_id="nightly-42")
        assert relative.value.field == "deadline"
        retried = cli(
            server, "submit", "--submission-id", "s1", "--deadline", "now+6h", "--cpus", "1", "--", "true"
        )
        assert retried.exit_code != 0 and "a new moment at every retry" in retried.stderr
    finally:
        client.close()


def _iso_in(seconds: float) -> str:
    return datetime.fromtimestamp(time.time() + seconds, UTC).isoformat(timespec="seconds")


def test_a_late_job_that_stops_holding_resources_while_it_waits_is_cancelled() -> None:
    """An elastic job holds task 0 at its latest start while task 1 is parked; task 0 ends: the
    job holds nothing and has not ended, so it could only start again, too late."""
    d, clock = dispatcher(shards=1, backoff=60.0, backoff_max=60.0)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    _submit(d, clock, replicas=2, min_member=1)
    units(d.next_batches())
    d.on_reply(accept_tasks("j", [0]))  # task 1 left unplaced: parked 60 s
    clock.advance(START_BY + 1.0)
    d.next_batches()
    assert d.job_state("j") is JobState.RUNNING  # it started in time
    d.on_released([task_id("j", 0)], TaskState.SUCCEEDED)
    clock.advance(20.0)
    assert _round(d) == []
    assert d.job_state("j") is JobState.CANCELLED
    assert d.task_states("j") == [TaskState.SUCCEEDED, TaskState.CANCELLED]
    assert not d._deadlines.late


def test_jobs_past_their_latest_start_together_are_cancelled_in_one_store_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    d, clock = dispatcher(shards=1, store=store, backoff=1e6, backoff_max=1e6)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    for i in range(50):
        _submit(d, clock, f"j{i}")
    d.on_unschedulable([unschedulable(u) for u in units(d.next_batches())])  # all parked
    clock.advance(START_BY + 1.0)
    writes = store.calls["set_task_states"]
    with caplog.at_level("INFO", logger="gosched.dispatcher.dispatcher"):
        assert d.next_batches() == []
    assert store.calls["set_task_states"] == writes + 1
    assert all(store.states[f"j{i}"] == [TaskState.CANCELLED] for i in range(50))
    assert "cancelled 50 job(s) that could no longer end by their deadline: j0, j1" in caplog.text
    assert "and 40 more" in caplog.text


def test_a_late_job_that_ends_is_forgotten() -> None:
    d, clock = _new()
    _submit(d, clock)
    (u,) = _round(d)
    d.on_reply(accept([u]))
    clock.advance(START_BY + 1.0)
    d.next_batches()
    assert d._deadlines.late == {"j"}  # running past its latest start: watched
    d.on_released([task_id("j", 0)], TaskState.SUCCEEDED)
    assert d.job_state("j") is JobState.SUCCEEDED
    assert not d._deadlines.late


def test_a_restart_warns_of_the_stored_jobs_it_will_cancel(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    d, clock = dispatcher(shards=1, store=store)
    _submit(d, clock, "gone")
    _submit(d, clock, "kept")
    d.cancel("kept")
    clock.advance(START_BY + 5.0)
    again, _ = dispatcher(shards=1, store=store, clock=clock)
    with caplog.at_level("WARNING", logger="gosched.dispatcher.dispatcher"):
        again.restore()
    assert "1 stored job(s) could no longer end by their deadline and are cancelled at the first round" in (
        caplog.text
    )
    assert caplog.text.rstrip().endswith("gone")


def test_a_deadline_from_now_is_refused_with_a_submission_id() -> None:
    """A retry under the id would carry another moment, and be refused as another request."""
    spec = {"id": "r", "command": "true", "cpu": 1, "deadline": "now+6h", "submission_id": "nightly-42"}
    with pytest.raises(SpecError) as bad:
        job_from_spec(spec, now=1000.0)
    assert bad.value.field == "deadline" and "a new moment at every retry" in bad.value.reason


def test_a_lost_shards_late_proposal_for_a_job_its_deadline_cancelled_evicts_nothing(tmp_path: Path) -> None:
    """The shard planned an eviction for the job, was lost (its unit taken back), and the job's latest
    start passed before its commit reached the binder: the binder refuses it, as after a user's
    cancel, and the victim runs on."""
    clock = Clock(1_000_000.0)
    settings = Settings(store_path=str(tmp_path / "gs.db"), shards=1)
    p = Pipeline(settings, nodes=[make_node("n0").cpu("4").mem("16Gi").build()], clock=clock)
    p.submit(make_job("low").cpu("4").priority(0).preemptible().build())
    p.run_until_idle()
    assert p.dispatcher.job_state("low") is JobState.RUNNING
    p.submit(make_job("j").cpu("4").priority(100).deadline(clock.now + DEADLINE).time_limit(LIMIT).build())
    (batch,) = p.dispatcher.next_batches([0])
    planned = p.shards[0].schedule(batch)
    victims = [v for prop in planned.proposals for pl in prop.placements for v in pl.victims]
    assert victims == [task_id("low", 0)]
    assert p.dispatcher.requeue_in_flight(0) == 1  # the shard is lost: its unit is queued again
    clock.advance(START_BY + 1.0)
    p.step()  # the round cancels j before it dispatches anything
    assert p.dispatcher.job_state("j") is JobState.CANCELLED
    reply = p.binder.commit(planned)  # the lost shard's commit arrives after all
    assert not reply.accepted
    assert p.binder.truth.resident(task_id("low", 0)) is not None
    assert p.dispatcher.job_state("low") is JobState.RUNNING


def test_the_dispatcher_actor_keeps_the_deadline_cancels_until_it_has_a_binder(tmp_path: Path) -> None:
    """Restarted by Ray, the actor has no binder until the driver's reload: what its rounds cancel
    meanwhile waits to be told (reload tells the binder of it)."""
    core = DispatcherCore(Settings(store_path=str(tmp_path / "gs.db"), shards=1))
    core.set_nodes(
        [make_node("n0").cpu("4").mem("16Gi").build()], {"cpu": 4000, "memory": 16 << 30, "gpu": 0}
    )
    start_by = time.time() + 0.3
    core.submit_many([make_job("j").cpu("1").deadline(start_by + 1.0).time_limit(1.0).build()])
    time.sleep(max(0.0, start_by - time.time()) + 0.1)
    assert core.binder is None
    assert core.next_batch(0)[1] is None
    assert core.dispatcher.job_state("j") is JobState.CANCELLED
    assert core.dispatcher.take_deadline_cancels() == ["j"]  # kept for the binder
