"""The Ray dispatcher actor's body (DispatcherCore, run here in process): the latencies it reports
per task bound, from the dispatcher's timings, and its counts of tasks bound."""

from pathlib import Path

from gosched.common import wire
from gosched.common.config import Settings
from gosched.common.messages import BindReplyRows, UnitBatch
from gosched.runtime.ray_actors import LATENCY_KEEP, DispatcherCore
from gosched.runtime.simulation import sim_nodes
from tests.builders import make_job


def _core(tmp_path: Path) -> DispatcherCore:
    core = DispatcherCore(Settings(store_path=str(tmp_path / "d.db"), shards=1))
    nodes = sim_nodes(4, gpu_every=0)
    core.set_nodes(
        nodes, {"cpu": sum(n.cpu_milli for n in nodes), "memory": sum(n.memory for n in nodes), "gpu": 0}
    )
    return core


def _bind_all(core: DispatcherCore, bind_time: float) -> UnitBatch:
    _, data = core.next_batch(0)
    assert data is not None
    batch = wire.unpack(data)
    assert isinstance(batch, UnitBatch)
    rows = [(u.job.id, u.attempt, u.task_indexes, bind_time, ()) for u in batch.units]
    core.report(wire.pack(BindReplyRows(rows, [], [], 1, 0)), wire.pack([]), core.binder_incarnation)
    return batch


def test_each_task_bound_reports_its_dispatch_and_submission_latencies(tmp_path: Path) -> None:
    core = _core(tmp_path)
    try:
        core.submit_many([make_job("one").cpu("1").build(), make_job("three").cpu("1").replicas(3).build()])
        submitted = {j: core.dispatcher.job(j).submit_time for j in ("one", "three")}
        batch = _bind_all(core, bind_time=1e10)
        dispatched = {u.job.id: u.dispatch_time for u in batch.units}
        assert sorted(dispatched) == ["one", "three"]
        assert core.bound_tasks == 4 and core.last_bind == 1e10
        want = sorted([1e10 - dispatched["one"]] + [1e10 - dispatched["three"]] * 3)
        assert sorted(core.drain_latencies()) == want
        waits = sorted([1e10 - submitted["one"]] + [1e10 - submitted["three"]] * 3)
        assert sorted(core.drain_wait_latencies()) == waits  # drained apart: one does not empty the other
        assert core.drain_latencies() == [] and core.drain_wait_latencies() == []
    finally:
        core.store.close()


def test_the_timings_kept_are_bounded(tmp_path: Path) -> None:
    core = _core(tmp_path)
    try:
        timings = core.dispatcher.timings
        assert timings is not None
        timings.extend([(0.0, 0.0, 1.0, 1)] * (LATENCY_KEEP + 10))  # as if never drained
        core.submit_many([make_job("late").cpu("1").build()])
        _bind_all(core, bind_time=2.0)
        assert len(timings) == LATENCY_KEEP
        assert len(core.drain_latencies()) == LATENCY_KEEP
    finally:
        core.store.close()
