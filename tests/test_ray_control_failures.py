"""The master's control plane over real Ray actors (RayControl), beyond scheduling itself: where the
store's actors run, what an idle master costs, and a component that stops answering for a while."""

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from gosched.api.service import Unavailable  # noqa: E402
from gosched.common.config import Settings  # noqa: E402
from gosched.runtime import ray_cluster, ray_control  # noqa: E402
from gosched.runtime.control import ControlUnavailable  # noqa: E402
from gosched.runtime.ray_control import RayControl  # noqa: E402
from gosched.runtime.simulation import sim_nodes  # noqa: E402
from tests.builders import make_job  # noqa: E402
from tests.test_api_unavailable import readyz  # noqa: E402
from tests.test_ray_cluster_lost import master  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def ray_local() -> Iterator[None]:
    ray_cluster._start_ray(None, num_cpus=2, logging_level="error", log_to_driver=False)
    yield
    ray.shutdown()


def settings(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(store_path=str(tmp_path / "gosched.db"), **({"shards": 2} | extra))


# -- the actors that open the store stay on its machine ----------------------------------------
def test_the_binder_and_the_dispatcher_are_pinned_to_the_drivers_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They open the SQLite store, a file of the master's machine: restarted by Ray on another node
    (max_restarts=-1) they would open an empty store there. Shards may go anywhere."""
    made = ray_cluster.make_actor_classes()
    options: dict[str, dict[str, Any]] = {}

    class Spy:
        def __init__(self, name: str, cls: Any) -> None:
            self.name, self.cls = name, cls

        def options(self, **kwargs: Any) -> Any:
            options[self.name] = kwargs
            return self.cls.options(**kwargs)

        def remote(self, *args: Any) -> Any:
            options.setdefault(self.name, {})
            return self.cls.remote(*args)

    spies = tuple(Spy(name, cls) for name, cls in zip(("dispatcher", "binder", "shard"), made, strict=True))
    monkeypatch.setattr(ray_cluster, "make_actor_classes", lambda: spies)
    rs = ray_cluster.RayScheduler(settings(tmp_path), sim_nodes(2))
    try:
        here = ray.get_runtime_context().get_node_id()
        for name in ("dispatcher", "binder"):
            strategy = options[name]["scheduling_strategy"]
            assert isinstance(strategy, NodeAffinitySchedulingStrategy)
            assert (strategy.node_id, strategy.soft) == (here, False)
        assert "scheduling_strategy" not in options["shard"]
        where = ray._private.state.actors(rs.binder._actor_id.hex())["Address"]["NodeID"]
        assert where == here
    finally:
        rs.shutdown()


def test_the_actors_get_each_other_by_name_so_ray_can_restart_them(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A handle among a restartable actor's constructor arguments is an argument Ray may not keep
    for the restart (ray-project/ray#53727); Ray's driver logs an error line for each. The actors
    are handed names instead, and a restarted binder finds the dispatcher by its name."""
    capfd.readouterr()
    rs = ray_cluster.RayScheduler(settings(tmp_path), sim_nodes(2))
    try:
        assert "constructor arguments in the object store" not in capfd.readouterr().err
        rs.submit_many([make_job("before").build()])
        rs.run_until_idle()
        ray.kill(rs.binder, no_restart=False)
        rs.submit_many([make_job("after").build()])
        rs.run_until_idle()  # reports of the restarted binder reach the dispatcher
        assert rs.job_state("after") == "running"
        assert "constructor arguments in the object store" not in capfd.readouterr().err
    finally:
        rs.shutdown()


# -- an idle master costs little, and work still goes at once ------------------------------------
class CountingShard:
    """A shard's handle that counts the rounds asked of it."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.rounds = 0

    @property
    def run_once(self) -> Any:
        shard = self

        class Method:
            def remote(self) -> Any:
                shard.rounds += 1
                return shard.handle.run_once.remote()

        return Method()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def run_loop(control: RayControl, seconds: float) -> None:
    """The service's loop, without a service: step, then sleep until the next step is due."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not control.step():
            time.sleep(min(0.05, control.idle_wait()))


def test_an_idle_master_asks_each_shard_about_once_a_second_and_a_submission_goes_at_once(
    tmp_path: Path,
) -> None:
    # It asked every shard 20 times a second for ever (IDLE_DELAY_MAX_S 0.05): 0.67 of a core idle
    # with 8 shards.
    control = RayControl(settings(tmp_path, shards=4), sim_nodes(4))
    try:
        shards = [CountingShard(h) for h in control.rs.shards]
        control.rs.shards = shards  # type: ignore[assignment]
        run_loop(control, 2.0)  # backs off
        before = [s.rounds for s in shards]
        run_loop(control, 3.0)
        asked = [s.rounds - b for s, b in zip(shards, before, strict=True)]
        assert all(1 <= n <= 6 for n in asked), asked  # was 60 in 3 s
        assert control.idle_wait() <= ray_control.IDLE_DELAY_MAX_S
        # A submission wakes every shard: bound within a round trip, not after the idle delay.
        control.drain_latencies()
        submitted = time.monotonic()
        control.submit_many([make_job("now").cpu("1").build()])
        while control.counters().bound_tasks < 1:
            assert time.monotonic() - submitted < 5
            if not control.step():
                time.sleep(min(0.05, control.idle_wait()))
        waited = ray.get(control.rs.dispatcher.drain_wait_latencies.remote())
        assert len(waited) == 1 and waited[0] < 0.5, waited
    finally:
        control.close()


def test_an_idle_shard_learns_when_a_parked_job_is_due(tmp_path: Path) -> None:
    """A job found unschedulable is parked until its retry: the dispatcher tells an idle shard when
    (the driver asks again then at the latest, whatever its idle back-off)."""
    control = RayControl(settings(tmp_path, shards=1, unschedulable_retry_s=30.0), sim_nodes(2))
    try:
        assert ray.get(control.rs.dispatcher.poll.remote(0))[1:] == (None, None)  # nothing parked
        control.submit_many([make_job("huge").cpu("100000").build()])  # fits nowhere
        deadline = time.monotonic() + 10
        while control.jobs(["huge"], placements=False)[0] is None or "huge" not in control.explain("huge"):
            assert time.monotonic() < deadline
            control.step()
        run_loop(control, 0.5)
        _, data, ready_in = ray.get(control.rs.dispatcher.poll.remote(0))
        assert data is None and ready_in is not None and 0.0 < ready_in <= 30.0
    finally:
        control.close()


# -- a component that stops answering, and comes back ------------------------------------------
def test_a_restarting_binder_makes_the_master_not_ready_until_it_answers_again(tmp_path: Path) -> None:
    # /readyz said 200 all along, while every call failed.
    handle = master(tmp_path)  # the same two-shard master on Ray
    try:
        service = handle.service
        control = service.control
        assert isinstance(control, RayControl)
        ray.kill(control.rs.binder, no_restart=False)  # Ray restarts it
        deadline = time.monotonic() + 30
        while True:  # ray.kill is asynchronous, and the restart quick: call until a call fails
            try:
                service.nodes()
            except (ControlUnavailable, Unavailable) as exc:
                failed = str(exc)
                break
            assert time.monotonic() < deadline, "the restarting binder was never found not answering"
            time.sleep(0.005)
        code, body = readyz(handle)  # at once: the next probe is half a second away
        assert code == 503 and body.startswith("not ready: the scheduler is unavailable: ")
        assert "does not answer" in failed
        deadline = time.monotonic() + 60
        while not service.ready:
            assert time.monotonic() < deadline, f"not ready again: {service.not_ready_reason}"
            time.sleep(0.1)
        assert readyz(handle) == (200, "ready\n")
        job_id, _ = service.submit(make_job("after").cpu("1").build())
        deadline = time.monotonic() + 30
        while service.get(job_id).state.value != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        handle.stop()


def test_the_binders_store_writer_shows_in_the_metrics_of_a_master_on_ray(tmp_path: Path) -> None:
    handle = master(tmp_path)
    try:
        service = handle.service
        job_id, _ = service.submit(make_job("metered").cpu("1").build())
        deadline = time.monotonic() + 30
        while service.get(job_id).state.value != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        url = f"http://127.0.0.1:{handle.http_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            lines = reply.read().decode().splitlines()
        value = {
            line.split()[0]: float(line.split()[1]) for line in lines if line.startswith("gosched_binder_")
        }
        assert value["gosched_binder_unwritten_batches"] >= 0
        assert value["gosched_binder_writer_cpu_seconds_total"] > 0  # it wrote the binding
    finally:
        handle.stop()
