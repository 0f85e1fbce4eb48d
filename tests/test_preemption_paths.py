"""The arithmetic victim search (CPU/memory work) agrees with the trial search on the view."""

from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.config import ProfileConfig
from gosched.common.job import TaskGroup
from gosched.common.node import make_node
from gosched.common.resources import ResourceRequest
from gosched.scheduler_shard.class_cache import ClassCache
from gosched.scheduler_shard.framework.profile import build_profile
from gosched.scheduler_shard.framework.task_class import class_of
from gosched.scheduler_shard.preemption import _cpu_memory_victims, _victims_by_trial

GiB = 2**30


@settings(max_examples=200, deadline=None)
@given(
    residents=st.lists(
        st.tuples(st.integers(1, 8), st.integers(0, 8), st.integers(0, 100), st.floats(0, 1000)), max_size=8
    ),
    want=st.tuples(st.integers(1, 16), st.integers(0, 16)),
)
def test_arithmetic_and_trial_agree(
    residents: list[tuple[int, int, int, float]], want: tuple[int, int]
) -> None:
    state = ClusterArrays()
    row = state.upsert_node(make_node("n", 16_000, 16 * GiB))
    placed = []
    for i, (cpu, mem, prio, start) in enumerate(residents):
        r = Resident(f"v{i}", f"v{i}", cpu * 1000, mem * GiB, priority=prio, start_time=start)
        if state.fits(row, r) is None:
            state.place(row, r)
            placed.append(r)
    group = TaskGroup("main", 1, ResourceRequest(cpu_milli=want[0] * 1000, memory=want[1] * GiB))
    tc = class_of(group)
    entry = ClassCache(build_profile(ProfileConfig())).entry(group, state)
    fast = _cpu_memory_victims(tc, state, row, placed)
    slow = _victims_by_trial(entry, state, row, placed)
    assert (fast is None) == (slow is None)
    if fast is not None and slow is not None:
        assert {v.task_id for v in fast} == {v.task_id for v in slow}
    assert set(state.residents[row]) == {r.task_id for r in placed}  # the trial left the view as it was
