"""Usage accounting: held and in-flight vectors per queue and tenant, shares of the cluster."""

import numpy as np
import pytest

from gosched.dispatcher.usage import UsageTracker
from tests.test_dispatcher_support import CPU, GI


def tracker(cpu: int = 100 * CPU, mem: int = 400 * GI, gpu: int = 8000) -> UsageTracker:
    u = UsageTracker()
    u.set_capacity(cpu, mem, gpu)
    return u


@pytest.mark.parametrize(
    ("capacity", "vec", "dominant"),
    [
        ((100, 400, 8000), (50, 100, 2000), 0.5),  # cpu 0.5, mem 0.25, gpu 0.25
        ((100, 400, 8000), (10, 100, 4000), 0.5),  # gpu dominates
        ((100, 400, 0), (10, 20, 5000), 0.1),  # no GPUs in the cluster: gpu is left out
        ((0, 0, 0), (10, 20, 30), 0.0),  # no capacity known
    ],
)
def test_dominant_share_skips_resources_without_capacity(capacity, vec, dominant):
    u = UsageTracker()
    u.set_capacity(*capacity)
    assert u.dominant_share(vec) == pytest.approx(dominant)
    u.add_held("q", "t", *vec)
    assert u.queue_share("q") == pytest.approx(dominant)
    assert u.tenant_share("t") == pytest.approx(dominant)


def test_held_and_inflight_are_separate_and_commit_moves_between_them():
    u = tracker()
    u.add_inflight("q", "t", 4 * CPU, 8 * GI, 1000)
    assert u.usage("queue", "q", "inflight").tolist() == [4 * CPU, 8 * GI, 1000]
    assert u.usage("queue", "q", "held").tolist() == [0, 0, 0]
    share = u.queue_share("q")
    u.commit("q", "t", 4 * CPU, 8 * GI, 1000)
    assert u.usage("tenant", "t", "held").tolist() == [4 * CPU, 8 * GI, 1000]
    assert u.usage("tenant", "t", "inflight").tolist() == [0, 0, 0]
    assert u.queue_share("q") == share
    assert isinstance(u.usage("queue", "q"), np.ndarray)
    assert u.usage("queue", "unknown").tolist() == [0, 0, 0]


def test_queue_share_after():
    u = tracker()
    u.add_held("q", "t", 30 * CPU, 0, 0)
    assert u.queue_share_after("q", 20 * CPU, 0, 0) == pytest.approx(0.5)
    assert u.queue_share_after("new", 0, 0, 2000) == pytest.approx(0.25)


def test_mean_share_is_over_resources_with_capacity():
    u = tracker(gpu=0)
    u.add_held("q", "t", 50 * CPU, 100 * GI, 0)
    assert u.tenant_mean_share("t") == pytest.approx((0.5 + 0.25) / 2)


def test_shares_and_matrix_for_many_entities():
    u = tracker()
    u.add_held("a", "t1", 10 * CPU, 0, 0)
    u.add_inflight("b", "t2", 0, 0, 4000)
    names, m = u.matrix("queue")
    assert names == ["a", "b"]
    assert m.tolist() == [[10 * CPU, 0, 0], [0, 0, 4000]]
    assert u.shares("queue") == {"a": pytest.approx(0.1), "b": pytest.approx(0.5)}
    assert u.shares("tenant", ["t2", "t9"]) == {"t2": pytest.approx(0.5), "t9": 0.0}
    with pytest.raises(ValueError):
        u.names("node")  # type: ignore[arg-type]


def test_listeners_hear_tenant_changes_but_not_commits():
    u = tracker()
    heard: list[str | None] = []
    u.subscribe(heard.append)
    u.add_inflight("q", "t", CPU, 0, 0)
    u.commit("q", "t", CPU, 0, 0)
    u.add_held("q", "t", -CPU, 0, 0)
    u.set_capacity(1, 1, 1)
    assert heard == ["t", "t", None]


def test_negative_capacity_is_refused():
    with pytest.raises(ValueError):
        UsageTracker().set_capacity(-1, 0, 0)
