"""The class cache's one-row refresh that reads a row's cpu and memory once for every plugin
(class_cache._cpu_memory_row_eval): it must give the per-plugin closures' verdict and float, and
the vector path's, for every row, or two shards with different histories could rank nodes apart."""

import random

import numpy as np
import pytest

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.config import MINIMAL_PROFILE, PluginWeight, ProfileConfig
from gosched.common.job import Job, TaskGroup
from gosched.scheduler_shard.class_cache import ClassCache, _cpu_memory_row_eval, _row_eval
from gosched.scheduler_shard.framework.profile import build_profile
from tests.builders import make_job, make_node

PROFILES = {
    "default": ProfileConfig(),
    "spread": ProfileConfig(
        scores=[PluginWeight(name="least_allocated", weight=1.5), PluginWeight(name="balanced_allocation")]
    ),
    "pack-only": ProfileConfig(scores=[PluginWeight(name="most_allocated", weight=0.7)]),
    "minimal": MINIMAL_PROFILE,  # resources_fit alone: the fit check without scores
}


def _same(kept: np.ndarray, fresh: np.ndarray) -> bool:
    """Equal to the bit where finite, and finite at the same rows."""
    finite = np.isfinite(fresh)
    return bool((np.isfinite(kept) == finite).all() and np.array_equal(kept[finite], fresh[finite]))


def _view(rng: random.Random) -> ClusterArrays:
    state = ClusterArrays()
    for i in range(16):
        # Odd sizes (fractions that do not round evenly), and a node with no cpu or no memory at
        # all (max(capacity, 1) in the fraction).
        cpu = rng.choice(["0", "1", "3", "7", "32"]) if i % 5 else "0"
        mem = rng.choice(["0", "3Gi", "7Gi", "100Gi"]) if i % 7 else "0"
        state.upsert_node(make_node(f"n{i}").cpu(cpu).mem(mem).build())
    return state


@pytest.mark.parametrize("profile_name", sorted(PROFILES))
@pytest.mark.parametrize("seed", range(3))
def test_reading_cpu_and_memory_once_gives_the_same_verdicts_and_floats(profile_name: str, seed: int) -> None:
    rng = random.Random(seed)
    profile = build_profile(PROFILES[profile_name])
    state = _view(rng)
    groups = [
        make_job(f"g{k}").cpu(c).mem(m).build().groups[0]
        for k, (c, m) in enumerate([("500m", "1Gi"), ("1", "3Gi"), ("333m", "700Mi"), ("2", "1")])
    ]
    cache = ClassCache(profile)
    for step in range(200):
        group = rng.choice(groups)
        entry = cache.entry(group, state)
        fused = _cpu_memory_row_eval(entry, state)
        assert fused is not None and entry.row_eval is not None
        assert entry.row_eval.__qualname__ == fused.__qualname__  # the cache refreshes by it
        per_plugin = _row_eval(entry)
        assert per_plugin is not None
        for row in range(state.n):
            assert fused(state, row) == per_plugin(state, row), (step, row)
        # ...and the kept scores (fused, one row at a time) equal a fresh vector computation.
        fresh = ClassCache(profile).entry(group, state).eff
        assert _same(entry.eff, fresh), step
        live = np.flatnonzero(np.isfinite(fresh))
        if state.task_row and (rng.random() < 0.3 or not live.size):
            state.release(rng.choice(sorted(state.task_row)))
        elif live.size:
            row = int(rng.choice(live.tolist()))
            state.place(row, Resident.for_task(Job(f"t{step}", (group,)), 0, (), 0.0))


def _group(**resources: object) -> TaskGroup:
    job = make_job("x")
    for name, value in resources.items():
        job = getattr(job, name)(value)
    return job.build().groups[0]


@pytest.mark.parametrize(
    ("why", "group"),
    [
        ("no memory asked: the scores' fractions are cpu's alone", _group(cpu="1", mem="0")),
        ("GPUs: resources_fit and the scores read them too", _group(cpu="1", mem="1Gi", gpus=1)),
        ("a GPU share", _group(cpu="1", mem="1Gi", gpu_share=250)),
    ],
)
def test_a_class_reading_more_than_cpu_and_memory_keeps_the_per_plugin_refresh(
    why: str, group: TaskGroup
) -> None:
    state = ClusterArrays()
    state.upsert_node(make_node("n0").gpus(4).build())
    entry = ClassCache(build_profile(ProfileConfig())).entry(group, state)
    assert _cpu_memory_row_eval(entry, state) is None, why


def test_the_refresh_follows_the_view_as_it_grows_past_its_capacity() -> None:
    """The view's arrays are replaced when it grows (ClusterArrays._grow): the one-row refresh,
    which reads them through views taken when its class was last rebuilt, must read the new ones."""
    profile = build_profile(ProfileConfig())
    state = ClusterArrays()
    group = make_job("g").cpu("500m").mem("1Gi").build().groups[0]
    cache = ClassCache(profile)
    grown = 0
    for i in range(140):
        capacity = state.capacity
        state.upsert_node(make_node(f"n{i}").cpu(str(1 + i % 5)).mem("8Gi").build())
        grown += state.capacity != capacity
        for step in range(3):  # one-row refreshes on the grown arrays
            entry = cache.entry(group, state)
            row = int(np.argmax(entry.eff))
            state.place(row, Resident.for_task(Job(f"t{i}-{step}", (group,)), 0, (), 0.0))
            kept = cache.entry(group, state).eff
            assert _same(kept, ClassCache(profile).entry(group, state).eff), (i, step)
    assert grown >= 2  # the arrays were replaced (64 -> 128 -> 256 rows)
