"""A node that comes back changed (an agent re-registering, an operator's update) gives up the
residents it can no longer hold: those on a GPU it lost, those over its new capacity (least
important first), those that do not tolerate a new NoExecute taint. They are queued again."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from gosched.common.config import Settings
from gosched.common.job import Job
from gosched.common.node import Node
from gosched.runtime.local_control import LocalControl
from tests.builders import make_job, make_node


@dataclass
class Case:
    before: Node
    after: Node
    jobs: list[Job]
    kept: list[str]  # task ids still on the node afterwards


GPU4 = make_node("n").cpu("32").mem("128Gi").gpus(4).build()
CPU8 = make_node("n").cpu("8").mem("64Gi").build()

CASES = {
    "a GPU gone": Case(
        GPU4,
        make_node("n").cpu("32").mem("128Gi").gpus(2).build(),
        [make_job(f"g{i}").cpu("1").gpus(1).build() for i in range(4)],
        kept=["g0/0", "g1/0"],  # on GPUs 0 and 1, which the node still has
    ),
    "less cpu: the least important go": Case(
        CPU8,
        make_node("n").cpu("4").mem("64Gi").build(),
        [make_job(f"p{i}").cpu("1").priority(i).build() for i in range(8)],
        kept=["p4/0", "p5/0", "p6/0", "p7/0"],
    ),
    "a NoExecute taint evicts the untolerating": Case(
        CPU8,
        make_node("n").cpu("8").mem("64Gi").taint("maint", "yes", "NoExecute").build(),
        [
            make_job("plain").cpu("1").build(),
            make_job("tolerant").cpu("1").tolerate("maint", "yes", "NoExecute").build(),
            make_job("any").cpu("1").tolerate(exists=True).build(),  # an empty key tolerates all
        ],
        kept=["any/0", "tolerant/0"],
    ),
    "a NoSchedule taint evicts nothing": Case(
        CPU8,
        make_node("n").cpu("8").mem("64Gi").taint("maint", "yes", "NoSchedule").build(),
        [make_job("plain").cpu("1").build()],
        kept=["plain/0"],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_changed_node_gives_up_what_it_can_no_longer_hold(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    control = LocalControl(Settings(store_path=str(tmp_path / "gs.db"), shards=1), [case.before])
    try:
        control.submit_many(case.jobs)
        while control.step():
            pass
        every = sorted(f"{j.id}/0" for j in case.jobs)
        assert sorted(control.residents(["n"])["n"]) == every
        control.add_nodes([case.after])
        assert sorted(control.residents(["n"])["n"]) == case.kept
        node = control.nodes(["n"])[0]
        assert node.cpu_used_milli <= case.after.cpu_milli  # not over-committed any more
        assert all(used <= 1000 for used in node.gpu_used_milli)
        # The others are queued again, not lost: pending (nothing else fits them here).
        for snap in control.jobs([j.id for j in case.jobs], placements=False):
            assert snap is not None
            expected = "bound" if f"{snap.job.id}/0" in case.kept else "pending"
            assert snap.task_states[0].value == expected, snap.job.id
    finally:
        control.close()


def test_static_nodes_given_again_at_a_restart_keep_an_operators_cordon_or_drain(tmp_path: Path) -> None:
    from gosched.common.node import NodeState
    from gosched.runtime.pipeline import Pipeline

    nodes = [make_node(n).cpu("4").mem("8Gi").build() for n in ("a", "b", "c", "d")]
    settings = Settings(store_path=str(tmp_path / "gs.db"))
    first = Pipeline(settings, nodes=nodes)
    first.binder.set_node_state("a", NodeState.CORDONED)
    first.binder.set_node_state("b", NodeState.DRAINING)
    first.binder.set_node_state("c", NodeState.NOT_READY)  # not the operator's: the node is given ready
    first.close()
    again = Pipeline(settings, nodes=nodes)
    try:
        states = {n.name: n.state for n in again.binder.snapshot_nodes()}
        assert states == {
            "a": NodeState.CORDONED,
            "b": NodeState.DRAINING,
            "c": NodeState.READY,
            "d": NodeState.READY,
        }
    finally:
        again.close()


@pytest.mark.parametrize(
    ("again", "kept"),
    [
        (0, []),  # restarted without --sim-nodes: none of the earlier ones stays
        (1, ["sim-00000"]),  # with fewer: those given again stay
        (2, ["sim-00000", "sim-00001"]),
    ],
)
def test_simulated_nodes_of_an_earlier_start_leave_with_it(
    tmp_path: Path, again: int, kept: list[str]
) -> None:
    from gosched.api.server import control_factory
    from gosched.runtime.simulation import sim_nodes

    settings = Settings(store_path=str(tmp_path / "gs.db"), shards=1)
    static = make_node("static").cpu("1").mem("1Gi").build()  # no agent, not simulated: stays
    first = control_factory(settings, [*sim_nodes(2), static])()
    try:
        jobs = [make_job(f"j{i}").cpu("20").build() for i in range(2)]  # one per simulated node
        first.submit_many(jobs)
        while first.step():
            pass
        assert sorted(t for ts in first.residents(["sim-00000", "sim-00001"]).values() for t in ts) == [
            "j0/0",
            "j1/0",
        ]
    finally:
        first.close()
    second = control_factory(settings, sim_nodes(again))()
    try:
        assert sorted(n.node.name for n in second.nodes()) == sorted([*kept, "static"])
        while second.step():
            pass
        # Tasks of the nodes removed are queued again (nothing would ever run them there): bound
        # only on the nodes kept, else pending.
        states = {s.job.id: s.task_states[0].value for s in second.jobs(["j0", "j1"], placements=False) if s}
        on_kept = sorted(t for ts in second.residents(kept).values() for t in ts)
        assert sorted(f"{j}/0" for j, st in states.items() if st == "bound") == on_kept
        assert len(states) == 2 and (kept or set(states.values()) == {"pending"})
    finally:
        second.close()
