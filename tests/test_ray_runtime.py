"""GoSched on real local Ray: the same components as actors, failures included."""

import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from gosched.common.config import ProfileConfig, Settings  # noqa: E402
from gosched.common.job import Job  # noqa: E402
from gosched.common.node import Node  # noqa: E402
from gosched.common.states import TaskState  # noqa: E402
from gosched.runtime import ray_actors, ray_cluster  # noqa: E402
from gosched.runtime.ray_bench import run_ray_bench  # noqa: E402
from gosched.runtime.ray_cluster import RayScheduler  # noqa: E402
from gosched.runtime.simulation import basic_jobs, sim_nodes  # noqa: E402
from tests.builders import make_job, make_node  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def ray_local() -> Iterator[None]:
    # As the runtime starts it: a start-up that timed out on a loaded machine is tried again.
    ray_cluster._start_ray(None, num_cpus=2, logging_level="error", log_to_driver=False)
    yield
    ray.shutdown()


def scheduler(tmp_path: Path, nodes: Sequence[Node], **settings: object) -> RayScheduler:
    opts: dict[str, object] = {"store_path": str(tmp_path / "gosched.db"), "shards": 2} | settings
    return RayScheduler(Settings(**opts), nodes)  # type: ignore[arg-type]


def assert_all_bound_once(rs: RayScheduler, jobs: Sequence[Job]) -> None:
    expected = sorted(f"{j.id}/{i}" for j in jobs for i in range(j.total_replicas))
    ids = rs.resident_ids()
    assert len(ids) == len(set(ids)), "a task is resident twice"
    assert sorted(ids) == expected
    assert rs.task_state_counts([j.id for j in jobs]) == {"bound": len(expected)}


class _Answers:
    def answer(self, size: int) -> bytes:
        return b"x" * size


def _in_object_store() -> int:
    """Objects in the shared-memory object store now (Ray's memory summary)."""
    from ray._private.internal_api import memory_summary

    line = next(x for x in memory_summary(stats_only=True).splitlines() if "Plasma memory usage" in x)
    return int(line.split(",")[1].split()[0])


def test_a_local_start_has_large_answers_sent_inline_not_through_the_object_store() -> None:
    """A commit's answer with 8 shards passes Ray's 100 KiB default: the local Ray this module
    started (as the runtime starts it) keeps such an answer in the call's reply. An actor given
    Ray's default back sends it through the object store (which holds it while its ref lives)."""
    size = 2**20
    assert size < ray_actors.INLINE_BYTES
    ours = ray.remote(**ray_actors.actor_options())(_Answers).remote()
    default = {"env_vars": {ray_actors.INLINE_ENV: str(100 * 1024)}}
    plain = ray.remote(num_cpus=0, runtime_env=default)(_Answers).remote()
    before = _in_object_store()
    kept = ours.answer.remote(size)
    ray.wait([kept])
    assert _in_object_store() == before  # inline, within INLINE_BYTES
    assert ray.get(kept) == b"x" * size
    held = plain.answer.remote(size)
    ray.wait([held])
    assert _in_object_store() == before + 1  # Ray's default: through the store
    for actor in (plain, ours):
        ray.kill(actor)


def test_gang_and_2000_jobs_bind_exactly_once(tmp_path: Path) -> None:
    rs = scheduler(tmp_path, sim_nodes(100))
    try:
        gang = make_job("gang").cpu("4").mem("16Gi").gpus(4).replicas(4).min_member(4).build()
        jobs = [gang, *basic_jobs(2000)]
        rs.submit(gang)
        rs.submit_many(jobs[1:])
        rs.run_until_idle(timeout=60)
        assert_all_bound_once(rs, jobs)
        assert rs.job_state("gang") == "running"
        stats = rs.stats()
        assert stats["bound_tasks"] == 2004
        assert stats["shard_restarts"] == 0
    finally:
        rs.shutdown()


def test_two_shards_race_for_the_last_gpu(tmp_path: Path) -> None:
    # Two one-GPU nodes. Without partition-first both shards, on the same view with the same
    # profile, pick the same node for their task: exactly one wins, the other goes elsewhere.
    nodes = [make_node("a").gpus(1).build(), make_node("b").gpus(1).build()]
    rs = scheduler(tmp_path, nodes, profile=ProfileConfig(locating=[]), batch_size=1)
    try:
        rs.submit_many([make_job("x").cpu("1").gpus(1).build(), make_job("y").cpu("1").gpus(1).build()])
        # One unit to each shard; both plan at once, the binder judges them in turn.
        data = [ray.get(rs.dispatcher.next_batch.remote(s))[1] for s in (0, 1)]
        assert all(d is not None for d in data)
        results = ray.get([rs.shards[s].process.remote(d) for s, d in zip((0, 1), data, strict=True)])
        assert sum(r["proposals"] for r in results) == 2
        assert sum(r["bound"] for r in results) == 1
        placed = {t: rs.resident_node(t) for t in ("x/0", "y/0")}
        (winner,) = [t for t, node in placed.items() if node is not None]
        rs.run_until_idle(timeout=30)
        loser = "y/0" if winner == "x/0" else "x/0"
        assert {rs.resident_node(winner), rs.resident_node(loser)} == {"a", "b"}
        assert rs.stats()["rejected_units"] == 1
    finally:
        rs.shutdown()


def killer(rs: RayScheduler, target: str, at_round: int) -> tuple[list[int], Callable[[int], None]]:
    """An on_round hook that kills shard 0, the binder, the dispatcher (Ray restarts it) or the
    binder's store writer process (the binder ends itself, and Ray restarts it)."""
    killed: list[int] = []

    def on_round(n: int) -> None:
        if n == at_round and not killed:
            if target == "writer":
                os.kill(ray.get(rs.binder.stats.remote())["writer_pid"], signal.SIGKILL)
            else:
                handle = rs.shards[0] if target == "shard" else getattr(rs, target)
                ray.kill(handle, no_restart=False)
            killed.append(n)

    return killed, on_round


def test_shard_killed_while_10000_jobs_flow(tmp_path: Path) -> None:
    rs = scheduler(tmp_path, sim_nodes(200), batch_size=256)
    try:
        jobs = basic_jobs(10_000)
        rs.submit_many(jobs)
        killed, on_round = killer(rs, "shard", 5)
        rs.run_until_idle(timeout=120, on_round=on_round)
        assert killed == [5]
        assert rs.stats()["shard_restarts"] >= 1
        assert_all_bound_once(rs, jobs)
    finally:
        rs.shutdown()


@pytest.mark.parametrize("target", ["binder", "dispatcher", "writer"])
def test_control_actor_restart_mid_run(tmp_path: Path, target: str) -> None:
    rs = scheduler(tmp_path, sim_nodes(100), batch_size=100)
    try:
        gang = make_job("gang").cpu("4").mem("16Gi").gpus(4).replicas(4).min_member(4).build()
        jobs = [gang, *basic_jobs(2000)]
        rs.submit_many(jobs)
        killed, on_round = killer(rs, target, 3)
        rs.run_until_idle(timeout=60, on_round=on_round)
        assert killed == [3]
        assert rs.stats()["control_recoveries"] >= 1
        assert_all_bound_once(rs, jobs)
        assert rs.job_state("gang") == "running"
    finally:
        rs.shutdown()


def test_a_restarted_dispatcher_stops_a_gang_whose_failure_the_binder_stored_first(tmp_path: Path) -> None:
    """The binder stored g/0 failed and the dispatcher actor died before it heard: restarted, it
    finds the gang failed and has the binder free the other tasks (sent after the reload)."""
    rs = scheduler(tmp_path, sim_nodes(4))
    try:
        rs.submit_many([make_job("g").cpu("1").replicas(3).min_member(3).build()])
        rs.run_until_idle(timeout=30)
        assert all(rs.resident_node(f"g/{i}") for i in range(3))
        assert ray.get(rs.binder.release.remote(["g/0"], "failed")) == ["g/0"]
        ray.kill(rs.dispatcher, no_restart=False)  # before it hears of the failure
        deadline = time.monotonic() + 60
        while rs.resident_node("g/1") is not None or rs.resident_node("g/2") is not None:
            rs.run_until_idle(timeout=30)  # the rounds notice the restart and reload it
            assert time.monotonic() < deadline, "the gang's other tasks were never freed"
            time.sleep(0.2)
        assert rs.job_state("g") == "failed"
        assert rs.task_states("g") == ["failed", "cancelled", "cancelled"]
    finally:
        rs.shutdown()


def test_ray_bench_probe() -> None:
    out = run_ray_bench(nodes=50, tasks=500, shards=2)
    assert out["tasks"] == out["bound"] == out["bindings"] == 500  # the binder's, each task once
    assert out["tasks_per_s"] > 0


def test_a_dispatcher_that_does_not_answer_is_unavailable_to_clients_not_an_internal_error(
    tmp_path: Path,
) -> None:
    import grpc

    from gosched.api.servicers import _status_of
    from gosched.runtime.control import ControlUnavailable
    from gosched.runtime.ray_control import RayControl

    control = RayControl(Settings(store_path=str(tmp_path / "gosched.db"), shards=1), sim_nodes(4))
    try:
        assert control.submit_many([make_job("before").cpu("1").build()]) == ["before"]
        ray.kill(control.rs.dispatcher, no_restart=True)
        deadline = time.monotonic() + 30
        while True:  # ray.kill is asynchronous: wait until the actor no longer answers
            try:
                control.job_ids()
            except ControlUnavailable:
                break
            assert time.monotonic() < deadline, "the killed dispatcher still answers"
            time.sleep(0.05)
        with pytest.raises(ControlUnavailable, match="may or may not have been accepted") as err:
            control.submit_many([make_job("during").cpu("1").build()])
        assert _status_of(err.value) == (grpc.StatusCode.UNAVAILABLE, str(err.value))
    finally:
        control.close()


def test_a_node_back_with_fewer_gpus_gives_up_their_tasks_through_the_actors(tmp_path: Path) -> None:
    from gosched.runtime.ray_control import RayControl

    before = make_node("n").cpu("32").mem("128Gi").gpus(4).build()
    control = RayControl(Settings(store_path=str(tmp_path / "gosched.db"), shards=1), [before])
    try:
        jobs = [make_job(f"g{i}").cpu("1").gpus(1).build() for i in range(4)]
        control.submit_many(jobs)
        for _ in range(500):
            control.step()
            if len(control.residents(["n"])["n"]) == 4:
                break
        control.add_nodes([make_node("n").cpu("32").mem("128Gi").gpus(2).build()])
        assert sorted(control.residents(["n"])["n"]) == ["g0/0", "g1/0"]
        states = {
            s.job.id: s.task_states[0].value
            for s in control.jobs([j.id for j in jobs], placements=False)
            if s
        }
        assert states == {"g0": "bound", "g1": "bound", "g2": "pending", "g3": "pending"}
    finally:
        control.close()


def test_a_duplicate_job_id_is_refused_through_the_actors_naming_the_field(tmp_path: Path) -> None:
    from gosched.common.errors import SpecError
    from gosched.runtime.ray_control import RayControl

    control = RayControl(Settings(store_path=str(tmp_path / "gosched.db"), shards=1), sim_nodes(2))
    try:
        assert control.submit_many([make_job("dup").cpu("1").build()]) == ["dup"]
        with pytest.raises(SpecError, match="already exists") as err:
            control.submit_many([make_job("dup").cpu("1").build()])
        assert type(err.value) is SpecError and err.value.field == "id"  # itself, not Ray's wrapper
        assert control.job_ids() == ["dup"]
    finally:
        control.close()


def test_a_deleted_node_gives_its_tasks_to_the_other_nodes_through_the_actors(tmp_path: Path) -> None:
    from gosched.runtime.ray_control import RayControl

    nodes = [make_node(n).cpu("2").mem("16Gi").build() for n in ("a", "b")]
    control = RayControl(Settings(store_path=str(tmp_path / "gosched.db"), shards=2), nodes)

    def placed(*names: str) -> dict[str, list[str]]:
        return {n: sorted(t) for n, t in control.residents(list(names)).items()}

    def settle(until: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 60  # by time, not steps: a step returns at once when busy
        while time.monotonic() < deadline:
            control.step()
            if until():
                return
        # Say what the system says of every job, so that a failure tells which wait gave up and why.
        snaps = control.jobs(control.job_ids(), placements=False)
        told = {s.job.id: (s.task_states, control.explain(s.job.id)) for s in snaps if s is not None}
        pytest.fail(f"not settled in 60 s: {what}; residents {placed('a', 'b', 'c')}; jobs {told}")

    try:
        control.submit_many([make_job(f"j{i}").cpu("1").build() for i in range(4)])
        settle(lambda: sum(map(len, placed("a", "b").values())) == 4, "both nodes full")
        on_a = placed("a")["a"]
        assert len(on_a) == 2
        assert sorted(control.remove_node("a")) == on_a
        with pytest.raises(KeyError):
            control.remove_node("a")
        assert [s.node.name for s in control.nodes()] == ["b"]
        control.add_nodes([make_node("c").cpu("2").mem("16Gi").build()])
        settle(lambda: len(placed("c")["c"]) == 2, "the tasks of a queued again and bound on c")
        assert placed("a", "c") == {"a": [], "c": on_a}
    finally:
        control.close()


def test_a_relative_store_path_is_the_masters_not_the_actors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The actors run in their raylet's working directory: a relative store path (the default is
    gosched.db) must name the file the master locks, in the master's directory."""
    from gosched.api.server import control_factory
    from gosched.common.store import Store

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    control = control_factory(Settings(shards=1), sim_nodes(1), runtime="ray", store_path="rel.db")()
    try:
        assert control.submit_many([make_job("mine").cpu("1").build()]) == ["mine"]
    finally:
        control.close()
    stored = Store(str(here / "rel.db"))
    try:
        assert [job.id for job, _ in stored.load_jobs()] == ["mine"]
    finally:
        stored.close()


def test_the_dispatcher_hears_of_no_binding_before_it_is_stored_and_a_crash_then_loses_none(
    tmp_path: Path,
) -> None:
    # The store is held by another connection: the binder's writer cannot write, the shards still
    # have their answers and the binder runs ahead in memory; the dispatcher must hear of nothing
    # the store lacks. Then the binder dies with its batches unwritten, and every job still binds once.
    rs = scheduler(tmp_path, sim_nodes(200), batch_size=100)
    blocker = sqlite3.connect(tmp_path / "gosched.db", isolation_level=None)
    seen: dict[str, int] = {}
    try:
        jobs = basic_jobs(3000)
        rs.submit_many(jobs)

        def on_round(n: int) -> None:
            if n == 1:
                blocker.execute("BEGIN IMMEDIATE")  # the writer's next transaction waits on it
            if n == 6 and not seen:
                time.sleep(0.5)  # reports due by now have arrived
                seen["heard"] = ray.get(rs.dispatcher.stats.remote())["bound_tasks"]
                seen["stored"] = blocker.execute(
                    "SELECT count(*) FROM tasks WHERE state = 'bound'"
                ).fetchone()[0]
                seen["stored_version"] = int(
                    blocker.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()[0]
                )
                seen["binder_version"] = ray.get(rs.binder.stats.remote())["version"]
                ray.kill(rs.binder, no_restart=False)
                blocker.execute("ROLLBACK")

        rs.run_until_idle(timeout=120, on_round=on_round)
        assert seen["binder_version"] > seen["stored_version"]  # the binder had run ahead of the store
        assert seen["heard"] <= seen["stored"]  # and the dispatcher had heard only of what was stored
        assert rs.stats()["control_recoveries"] >= 1
        assert_all_bound_once(rs, jobs)
    finally:
        blocker.close()
        rs.shutdown()


def test_a_lost_shards_late_commit_for_a_job_its_deadline_cancelled_evicts_nothing(tmp_path: Path) -> None:
    """The shard's unit for `j` (which would evict `low`) is taken back as from a lost shard, and
    the next round cancels `j` at its latest start: the dispatcher actor tells the binder, which
    refuses the commit when it comes after all."""
    rs = scheduler(tmp_path, [make_node("n0").cpu("4").mem("16Gi").build()], shards=1)
    try:
        rs.submit(make_job("low").cpu("4").priority(0).preemptible().build())
        rs.run_until_idle(timeout=30)
        start_by = time.time() + 1.0
        rs.submit(make_job("j").cpu("4").priority(100).deadline(start_by + 2.0).time_limit(2.0).build())
        data = ray.get(rs.dispatcher.next_batch.remote(0))[1]
        assert data is not None
        assert ray.get(rs.binder.requeue_shard.remote(0)) == 1
        time.sleep(max(0.0, start_by - time.time()) + 0.1)
        assert ray.get(rs.dispatcher.next_batch.remote(0))[1] is None  # j's round cancels it
        assert rs.job_state("j") == "cancelled"
        time.sleep(0.5)  # the dispatcher's note to the binder is sent, not waited for
        result = ray.get(rs.shards[0].process.remote(data))
        assert (result["proposals"], result["bound"]) == (1, 0)
        assert rs.resident_node("low/0") == "n0"
        assert rs.job_state("low") == "running"
    finally:
        rs.shutdown()


def test_the_largest_reply_counts_from_its_reset(tmp_path: Path) -> None:
    """A benchmark resets it after its warm-up: the binder's own count is over its whole life."""
    rs = scheduler(tmp_path, sim_nodes(20), batch_size=64)
    try:
        rs.submit_many(basic_jobs(300))
        rs.run_until_idle(timeout=60)
        warm = rs.stats()
        assert warm["largest_reply"] > 0
        rs.reset_largest_reply()
        assert rs.stats()["largest_reply"] == 0
        rs.submit(make_job("one").cpu("1").build())
        rs.run_until_idle(timeout=30)
        after = rs.stats()
        sent = after["reply_bytes"] - warm["reply_bytes"]
        assert 0 < after["largest_reply"] <= sent < warm["largest_reply"]
    finally:
        rs.shutdown()


def test_a_preemptor_a_budget_held_back_goes_ahead_once_the_task_down_runs_through_the_actors(
    tmp_path: Path,
) -> None:
    """svc's evicted task is bound again but has not started: its budget (1) still counts it, so h1
    waits. Its agent's start report reaches the binder through the control plane and wakes h1,
    which then runs well before the periodic retry of an unschedulable job (60 s)."""
    from gosched.runtime.ray_control import RayControl

    nodes = [make_node(n).cpu("1").mem("4Gi").label(slot=n).build() for n in ("a", "b")]
    control = RayControl(Settings(store_path=str(tmp_path / "gosched.db"), shards=1), nodes)

    def placed() -> dict[str, list[str]]:
        return {n: sorted(t) for n, t in control.residents(["a", "b"]).items()}

    def bound() -> set[str]:
        return {tid for tasks in placed().values() for tid in tasks}

    def settle(until: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            control.step()
            if until():
                return
        pytest.fail(f"not settled in {seconds} s: {what}; residents {placed()}")

    try:
        control.submit_many([make_job("svc").cpu("1").replicas(2).disruption_budget(1).build()])
        settle(lambda: sum(map(len, placed().values())) == 2, "svc bound")
        control.started(["svc/0", "svc/1"])
        control.submit_many([make_job("h0").cpu("1").priority(100).build()])
        settle(lambda: "h0/0" in bound(), "h0 evicts one of svc's tasks")
        (back,) = {"svc/0", "svc/1"} - bound()
        control.started(["h0/0"])
        control.finished(["h0/0"], TaskState.SUCCEEDED)
        settle(lambda: back in bound(), "svc's task bound again")
        node = next(n for n, tasks in placed().items() if back in tasks)
        control.submit_many([make_job("h1").cpu("1").priority(100).require("slot", "NotIn", node).build()])
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            control.step()
        assert "h1/0" not in bound()
        assert "disruption budget (1, 1 down already)" in control.explain("h1")
        control.started([back])
        settle(lambda: "h1/0" in bound(), "h1 runs once svc's task does", 20.0)
    finally:
        control.close()
