"""Core rules without a table elsewhere: the task-state machine, the plugin registry and profiles,
and the shard's caches (per-class results kept up to date row by row, and never carried over to a
different view).
"""

from dataclasses import replace
from itertools import pairwise, product

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.config import PluginWeight, ProfileConfig
from gosched.common.errors import IllegalTransition
from gosched.common.job import Job, TaskGroup, Toleration
from gosched.common.messages import NodeUpserted, TaskBound, Unit
from gosched.common.node import Gpu, Node, NodeState, Taint, TaintEffect
from gosched.common.resources import ResourceRequest
from gosched.common.states import HOLDS_RESOURCES, LEGAL, TERMINAL, TaskState, check_transition
from gosched.scheduler_shard.class_cache import ALL_ROWS, NEG_INF, ClassCache, best_row
from gosched.scheduler_shard.framework import registry
from gosched.scheduler_shard.framework.interfaces import (
    CandidateSortingPlugin,
    FilterPlugin,
    GroupingPlugin,
    LocatingPlugin,
    Rows,
    ScorePlugin,
    Scores,
    UnitFilterPlugin,
    VictimSearchingPlugin,
)
from gosched.scheduler_shard.framework.profile import build_profile
from gosched.scheduler_shard.framework.task_class import TaskClass, class_of
from gosched.scheduler_shard.gpu_assign import choose_gpus
from gosched.scheduler_shard.plugins.allocation_scores import fractions_after
from gosched.scheduler_shard.plugins.gpu_fragmentation import REFRESH_GROWTH, GpuFragmentation, TaskTypes
from gosched.scheduler_shard.plugins.locating import PartitionFirst
from gosched.scheduler_shard.shard import SchedulerShard
from tests.builders import make_job, make_node
from tests.shard_helpers import profile_with_scores, run_units, shard_with

S = TaskState

# -- the task-state machine -------------------------------------------------------------------------
# The intended edges, written out (not read from LEGAL) so that a change to the machine is a
# deliberate change to this table too. The issue's lifecycle: pending -> scheduled -> bound ->
# running -> succeeded/failed, plus preempted and cancelled; the rest are the requeue edges.
EXPECTED_LEGAL = {
    (S.PENDING, S.SCHEDULED),  # dispatched to a shard
    (S.PENDING, S.BOUND),  # bound while the dispatcher had it back as pending (a late reply)
    (S.PENDING, S.CANCELLED),
    (S.SCHEDULED, S.BOUND),  # the binder committed it
    (S.SCHEDULED, S.PENDING),  # rejected or unschedulable: queued again
    (S.SCHEDULED, S.CANCELLED),
    (S.BOUND, S.RUNNING),
    (S.BOUND, S.SUCCEEDED),
    (S.BOUND, S.FAILED),
    (S.BOUND, S.PREEMPTED),
    (S.BOUND, S.CANCELLED),
    (S.BOUND, S.PENDING),  # its node was lost before it started
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.PREEMPTED),
    (S.RUNNING, S.CANCELLED),
    (S.RUNNING, S.PENDING),  # its node was lost
    (S.PREEMPTED, S.PENDING),  # requeued for a new attempt
    (S.PREEMPTED, S.CANCELLED),
}
ALL_PAIRS = list(product(TaskState, TaskState))


@pytest.mark.parametrize(("current", "target"), ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS])
def test_every_transition_is_legal_or_raises(current: TaskState, target: TaskState) -> None:
    if (current, target) in EXPECTED_LEGAL:
        check_transition("j/0", current, target)
        assert target in LEGAL[current]
    else:
        with pytest.raises(IllegalTransition, match=rf"task j/0: {current.value} -> {target.value} "):
            check_transition("j/0", current, target)


def test_the_lifecycle_of_the_issue_is_a_path_of_legal_edges() -> None:
    for path in (
        [S.PENDING, S.SCHEDULED, S.BOUND, S.RUNNING, S.SUCCEEDED],
        [S.PENDING, S.SCHEDULED, S.BOUND, S.RUNNING, S.FAILED],
        [S.PENDING, S.SCHEDULED, S.BOUND, S.RUNNING, S.PREEMPTED, S.PENDING, S.SCHEDULED],
        [S.PENDING, S.SCHEDULED, S.BOUND, S.CANCELLED],
    ):
        for a, b in pairwise(path):
            check_transition("j/0", a, b)


def test_terminal_states_have_no_way_out_and_hold_nothing() -> None:
    assert {S.SUCCEEDED, S.FAILED, S.CANCELLED} == TERMINAL
    for state in TERMINAL:
        assert LEGAL[state] == frozenset()
    assert {S.BOUND, S.RUNNING} == HOLDS_RESOURCES
    assert set(LEGAL) == set(TaskState)  # every state has a row


# -- the plugin registry and profiles ---------------------------------------------------------------
ISSUE_PLUGINS = {
    FilterPlugin: [
        "resources_fit",
        "gpu_model",
        "gpu_memory",
        "node_ready",
        "node_selector",
        "node_affinity",
        "taint_toleration",
    ],
    UnitFilterPlugin: ["anti_affinity"],
    ScorePlugin: [
        "preferred_affinity",
        "taint_prefer_no_schedule",
        "most_allocated",
        "least_allocated",
        "balanced_allocation",
        "gpu_topology",
        "gpu_fragmentation",
    ],
    LocatingPlugin: ["partition_first"],
    GroupingPlugin: ["topology_domain"],
    VictimSearchingPlugin: ["priority_victims", "capacity_reclaim"],
    CandidateSortingPlugin: ["lexicographic"],
}


@pytest.mark.parametrize("kind", list(ISSUE_PLUGINS), ids=lambda k: k.__name__)
def test_every_plugin_of_the_issue_is_registered_by_name(kind: type) -> None:
    for name in ISSUE_PLUGINS[kind]:
        assert name in registry.names(kind)
        assert isinstance(registry.create(name, kind), kind)


def test_unknown_and_mistyped_plugin_names_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown FilterPlugin 'no_such' \(known: .*resources_fit"):
        registry.create("no_such", FilterPlugin)
    with pytest.raises(ValueError, match="plugin 'most_allocated' is a ScorePlugin, not a FilterPlugin"):
        registry.create("most_allocated", FilterPlugin)
    with pytest.raises(ValueError, match="unknown"):
        build_profile(ProfileConfig(filters=["node_ready", "typo_fit"]))


def test_a_name_is_registered_once() -> None:
    class Nameless(ScorePlugin):
        pass

    with pytest.raises(ValueError, match="no plugin name"):
        registry.register(Nameless)

    class Clash(ScorePlugin):
        name = "most_allocated"

    with pytest.raises(ValueError, match="registered twice"):
        registry.register(Clash)


def test_profile_is_built_from_names_and_weights() -> None:
    cfg = ProfileConfig(
        filters=["node_ready", "resources_fit", "node_selector", "anti_affinity"],
        scores=[
            PluginWeight(name="least_allocated", weight=3.0),
            PluginWeight(name="gpu_topology", weight=0.0),
        ],
        victim_searching=["priority_victims"],
        candidate_sorting=["lexicographic"],
        locating=[],
        grouping=["topology_domain"],
    )
    p = build_profile(cfg)
    assert [f.name for f in p.static_filters] == ["node_ready", "node_selector"]
    assert [f.name for f in p.dynamic_filters] == ["resources_fit"]
    assert [f.name for f in p.unit_filters] == ["anti_affinity"]
    assert [(s.name, w) for s, w in p.scores] == [("least_allocated", 3.0)]  # weight 0: left out
    assert [v.name for v in p.victim_searching] == ["priority_victims"]
    assert [c.name for c in p.candidate_sorting] == ["lexicographic"]
    assert p.locating == [] and [g.name for g in p.grouping] == ["topology_domain"]


@registry.register
class _PreferNodeZ(ScorePlugin):
    """A plugin from outside the built-ins: 100 on node "z", 0 elsewhere."""

    name = "test_prefer_node_z"

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        names = [None if n is None else n.name for n in state.nodes]
        return np.array([100.0 if name == "z" else 0.0 for name in names[: state.n]])[rows]


def test_a_registered_plugin_runs_when_a_profile_names_it() -> None:
    nodes = [make_node(n).build() for n in ("a", "z", "b")]
    job = make_job("j").cpu("1").build()
    assert run_units(shard_with(nodes), [job]).proposals[0].placements[0].node == "a"  # tie: first
    shard = shard_with(nodes, profile=profile_with_scores("test_prefer_node_z"))
    assert run_units(shard, [job]).proposals[0].placements[0].node == "z"


# -- caches: a shard's view replaced by a resync ------------------------------------------------------
def test_gpu_eligibility_is_not_carried_over_to_a_resynced_view() -> None:
    # The first view: a (small GPUs) at row 0, b (big GPUs) at row 1. After a resync the view is
    # b, c in rows 0, 1 (a is gone, c is new) and has seen as many node changes as the first: a cache
    # keyed by a per-view generation count would still think b's row holds small GPUs.
    small = make_node("a").gpus(4, memory_mib=16384).build()
    big = make_node("b").gpus(4, memory_mib=81920).build()
    other = make_node("c").gpus(4, memory_mib=16384).build()
    shard = SchedulerShard(0)
    shard.sync([NodeUpserted(small), NodeUpserted(big)], 2)

    def job(i: int) -> Job:
        return make_job(f"j{i}").cpu("1").gpus(1).gpu_memory(40000).build()

    assert run_units(shard, [job(1)]).proposals[0].placements[0].node == "b"
    shard.inflight.clear()  # answered (rejected): nothing of it stays assumed
    shard.sync([NodeUpserted(big), NodeUpserted(other)], 10, resync=True)
    out = run_units(shard, [job(2)])
    assert out.unschedulable == []
    assert out.proposals[0].placements[0].node == "b"


def test_partition_rows_are_not_carried_over_to_a_resynced_view() -> None:
    nodes = [make_node(n).build() for n in ("a", "b", "c")]
    shard = SchedulerShard(0, profile_with_scores("most_allocated"))
    shard.sync([NodeUpserted(n) for n in nodes], 3)
    shard.set_partition(["c"])
    assert run_units(shard, [make_job("j1").cpu("1").build()]).proposals[0].placements[0].node == "c"
    shard.inflight.clear()
    # the same three nodes in another row order
    shard.sync([NodeUpserted(nodes[2]), NodeUpserted(nodes[0]), NodeUpserted(nodes[1])], 9, resync=True)
    assert run_units(shard, [make_job("j2").cpu("1").build()]).proposals[0].placements[0].node == "c"


def test_partition_mask_is_reused_read_only_and_rebuilt_when_the_view_grows() -> None:
    state = ClusterArrays()
    for name in ("a", "b", "c"):
        state.upsert_node(make_node(name).build())
    plugin = PartitionFirst()
    unit = Unit(make_job("j").build(), (0,), 1)
    rows = np.array([0, 2], np.int64)
    first = plugin.locate(unit, rows, state)[0]
    assert first is not None and first.tolist() == [True, False, True]
    assert plugin.locate(unit, rows, state)[0] is first  # one mask for every unit
    with pytest.raises(ValueError):
        first[1] = True  # shared, so read-only
    state.upsert_node(make_node("d").build())
    grown = plugin.locate(unit, rows, state)[0]
    assert grown is not None and grown.tolist() == [True, False, True, False]
    moved = plugin.locate(unit, np.array([1, 3], np.int64), state)[0]
    assert moved is not None and moved.tolist() == [False, True, False, True]


# Scores with many ties and unplaceable (-inf) rows, and masks of any shape including empty.
_scores = st.lists(st.sampled_from([NEG_INF, 0.0, 1.0, 2.5]), min_size=0, max_size=30)


@given(
    _scores.flatmap(
        lambda s: st.tuples(st.just(s), st.lists(st.booleans(), min_size=len(s), max_size=len(s)))
    )
)
def test_best_row_among_allowed_rows_matches_masking_every_row(case: tuple[list[float], list[bool]]) -> None:
    eff = np.array(case[0], np.float64)
    mask = np.array(case[1], np.bool_)
    row = best_row(eff, np.flatnonzero(mask))
    dense = np.where(mask, eff, NEG_INF)
    expected = int(dense.argmax()) if dense.size else -1
    fits = expected >= 0 and dense[expected] != NEG_INF
    # Same node whenever one fits; otherwise both report that none does.
    assert (row >= 0 and eff[row] != NEG_INF) == fits
    if fits:
        assert row == expected
    else:
        assert row == -1 or (mask[row] and eff[row] == NEG_INF)


def test_memoised_fractions_belong_to_one_view() -> None:
    tc = class_of(TaskGroup("main", 1, ResourceRequest(cpu_milli=1000), ("true",)))
    rows = slice(0, 1)
    views = []
    for used in (0, 7000):
        state = ClusterArrays()
        state.upsert_node(make_node("n").cpu("8").build())
        if used:
            job = make_job("f").cpu(str(used // 1000)).build()
            state.place(0, Resident.for_task(job, 0, (), 0.0))
        else:
            state.mark_dirty(0)
        views.append(state)
    # the same rows object, the same class, the same log position (each view logged two row
    # changes): the second call must still read its own view
    assert views[0].dirty_position == views[1].dirty_position
    first = fractions_after(tc, views[0], rows)[0][0]
    second = fractions_after(tc, views[1], rows)[0][0]
    assert (first, second) == (1 / 8, 1.0)


# -- property: per-class results kept row by row equal a fresh computation ----------------------------
GiB = 2**30
MODELS = ["A100", "V100"]


@st.composite
def cache_nodes(draw: st.DrawFn, name: str) -> Node:
    n_gpus = draw(st.sampled_from([0, 0, 1, 2, 4]))
    gpus = tuple(
        Gpu(
            g,
            f"{name}-{g}",
            draw(st.sampled_from(MODELS)),
            draw(st.sampled_from([16384, 81920])),
            g // 2,
            ((g ^ 1,) if (g ^ 1) < n_gpus else ()),
        )
        for g in range(n_gpus)
    )
    taints: tuple[Taint, ...] = ()
    if draw(st.integers(0, 3)) == 0:
        taints = (Taint("t", "x", draw(st.sampled_from(list(TaintEffect)))),)
    return Node(
        name,
        draw(st.integers(2, 16)) * 1000,
        draw(st.integers(2, 32)) * GiB,
        gpus,
        (("zone", draw(st.sampled_from(["a", "b"]))),),
        taints,
        (("fpga", 2),) if draw(st.booleans()) else (),
        draw(st.sampled_from([NodeState.READY, NodeState.READY, NodeState.CORDONED])),
    )


@st.composite
def cache_groups(draw: st.DrawFn) -> TaskGroup:
    kind = draw(st.sampled_from(["cpu", "whole", "share"]))
    req = ResourceRequest(
        cpu_milli=draw(st.integers(1, 4)) * 500,
        memory=draw(st.integers(0, 4)) * GiB,
        gpus=draw(st.integers(1, 2)) if kind == "whole" else 0,
        gpu_milli=draw(st.sampled_from([250, 500])) if kind == "share" else 0,
        gpu_memory_mib=draw(st.sampled_from([0, 40000])) if kind != "cpu" else 0,
        extended=(("fpga", 1),) if draw(st.integers(0, 4)) == 0 else (),
    )
    return TaskGroup(
        "main",
        1,
        req,
        ("true",),
        gpu_models=tuple(draw(st.sets(st.sampled_from(MODELS), max_size=1))) if kind != "cpu" else (),
        node_selector=(("zone", "a"),) if draw(st.integers(0, 3)) == 0 else (),
        tolerations=(Toleration("t", "Exists"),) if draw(st.booleans()) else (),
    )


def same_results(kept: np.ndarray, fresh: np.ndarray) -> bool:
    # Exactly equal: the one-row scalar path must do the vector path's arithmetic, or two shards
    # with different histories could rank the same nodes differently.
    finite = np.isfinite(fresh)
    return bool((np.isfinite(kept) == finite).all() and np.array_equal(kept[finite], fresh[finite]))


SPREAD_PROFILE = ProfileConfig(
    scores=[PluginWeight(name="least_allocated", weight=1.5), PluginWeight(name="balanced_allocation")]
)


@pytest.mark.parametrize("profile_config", [ProfileConfig(), SPREAD_PROFILE], ids=["default", "spread"])
@pytest.mark.parametrize("seed", range(3))
def test_the_one_row_refresh_scores_exactly_as_a_fresh_computation(
    profile_config: ProfileConfig, seed: int
) -> None:
    """Placements and releases one at a time (each refresh is the one-row, scalar path) on
    plain nodes where every class passes the static filters: after each, the kept scores equal
    a fresh vector computation bit for bit."""
    import random

    rng = random.Random(seed)
    profile = build_profile(profile_config)
    state = ClusterArrays()
    for i in range(12):
        gpus = rng.choice([0, 2, 4])
        state.upsert_node(make_node(f"n{i}").cpu(str(rng.choice([4, 8, 16]))).mem("64Gi").gpus(gpus).build())
    groups = [
        make_job("c").cpu("500m").mem("1Gi").build().groups[0],
        make_job("m").cpu("1").build().groups[0],  # no memory: one fraction
        make_job("w").cpu("1").mem("2Gi").gpus(1).build().groups[0],
        make_job("s").cpu("1").mem("1Gi").gpu_share(250).build().groups[0],
    ]
    cache = ClassCache(profile)
    scalar_refreshes = 0
    for step in range(150):
        group = rng.choice(groups)
        entry = cache.entry(group, state)
        scalar_refreshes += any(f is not None for f in entry.row_scores)
        live = [r for r in range(state.n) if np.isfinite(entry.eff[r])]
        if state.task_row and (rng.random() < 0.3 or not live):
            state.release(rng.choice(sorted(state.task_row)))
        elif live:
            row = rng.choice(live)
            gpus = choose_gpus(entry.tc, state, row)
            assert gpus is not None
            state.place(row, Resident.for_task(Job(f"t{step}", (group,)), 0, gpus, 0.0))
        for g in groups:
            kept = cache.entry(g, state).eff
            fresh = ClassCache(profile).entry(g, state).eff
            assert same_results(kept, fresh), (step, g.resources)
    assert scalar_refreshes > 50  # the scalar path was under test (most classes, most steps)


@pytest.mark.parametrize("profile_config", [ProfileConfig(), SPREAD_PROFILE], ids=["default", "spread"])
@pytest.mark.parametrize("seed", range(3))
def test_the_remembered_best_row_is_always_the_argmax(profile_config: ProfileConfig, seed: int) -> None:
    """ClassCache.best_row remembers the argmax between refreshes. Greedy placements (mostly on
    the best row, as the placer does), placements elsewhere, releases, and several changes
    between looks (the vector refresh): after each look, over every row and over a read-only
    mask, it is the argmax of the kept scores, ties to the lowest row."""
    import random

    rng = random.Random(seed)
    profile = build_profile(profile_config)
    state = ClusterArrays()
    for i in range(10):
        state.upsert_node(make_node(f"n{i}").cpu(str(rng.choice([16, 32, 64]))).mem("128Gi").build())
    groups = [
        make_job(f"g{k}").cpu(c).mem(m).build().groups[0]
        for k, (c, m) in enumerate([("500m", "1Gi"), ("1", "0"), ("2", "2Gi")])
    ]
    cache = ClassCache(profile)
    mask = np.arange(state.n) % 3 != 1
    mask.flags.writeable = False
    masked = np.flatnonzero(mask)
    remembered = 0
    for step in range(300):
        for _ in range(rng.choice([1, 1, 1, 3])):  # sometimes several changes before a look
            group = rng.choice(groups)
            entry = cache.entry(group, state)
            if state.task_row and rng.random() < 0.15:
                state.release(rng.choice(sorted(state.task_row)))
                continue
            live = [r for r in range(state.n) if np.isfinite(entry.eff[r])]
            if not live:
                continue
            row = cache.remembered_best_row(entry, None, None) if rng.random() < 0.7 else rng.choice(live)
            if np.isfinite(entry.eff[row]):
                state.place(
                    row, Resident.for_task(Job(f"t{step}-{row}-{rng.random()}", (group,)), 0, (), 0.0)
                )
        for group in groups:
            entry = cache.entry(group, state)
            for key, rows in ((None, None), (mask, masked)):
                remembered += entry.best_key is (ALL_ROWS if key is None else key)
                got = cache.remembered_best_row(entry, key, rows)
                assert got == best_row(entry.eff, rows), (step, group.resources)
    if profile_config is not SPREAD_PROFILE:  # spreading lowers the row just placed on: forgotten
        assert remembered > 100  # bin-packing keeps it: many looks were answered from memory


@pytest.mark.parametrize("looks_between", [1, 2], ids=["one-row", "vector"])
def test_the_remembered_best_row_breaks_a_tie_to_the_lowest_row(looks_between: int) -> None:
    """A lower row that comes level with the remembered best takes its place, as argmax would."""
    profile = build_profile(ProfileConfig())
    state = ClusterArrays()
    for i in range(3):
        state.upsert_node(make_node(f"n{i}").cpu("8").mem("32Gi").build())
    group = make_job("g").cpu("1").mem("1Gi").build().groups[0]
    cache = ClassCache(profile)

    def place(row: int, name: str) -> None:
        state.place(row, Resident.for_task(Job(name, (group,)), 0, (), 0.0))

    place(2, "a")  # the fullest row is the bin-packing best
    entry = cache.entry(group, state)
    assert cache.remembered_best_row(entry, None, None) == 2
    place(0, "b")  # row 0 comes level with row 2
    if looks_between == 2:
        place(1, "c")  # and row 1 too: two rows changed before the next look
    entry = cache.entry(group, state)
    assert entry.eff[0] == entry.eff[2]
    assert entry.best_key is ALL_ROWS  # still remembered, not recomputed
    assert cache.remembered_best_row(entry, None, None) == 0


def test_the_one_row_refresh_of_a_three_resource_balance_matches_to_the_bit() -> None:
    """cpu, memory and GPU fractions: balanced_allocation's variance. A Python float's ** 2 (pow)
    differs from the product in the last bit for these values; the scalar path must not use it."""
    profile = build_profile(ProfileConfig())
    group = make_job("w").cpu("1").mem("2Gi").gpus(1).build().groups[0]
    state = ClusterArrays()
    state.upsert_node(make_node("n0").cpu("96").mem("384Gi").gpus(8).build())
    cache = ClassCache(profile)
    cache.entry(group, state)
    state.place(0, Resident("busy/0", "busy", 92374, 75564760450, ((0, 1000), (1, 1000), (2, 990))))
    kept = cache.entry(group, state).eff[0]  # the one-row refresh
    assert kept == ClassCache(profile).entry(group, state).eff[0]


def test_the_learned_fragmentation_model_leaves_no_stale_score() -> None:
    """gpu_fragmentation learns task types from the units a shard schedules. When its model
    changes, every cached score computed under the old one must go: after each batch the kept
    scores equal a fresh computation under the current model (the rows the batch did not touch
    included)."""
    import random

    rng = random.Random(7)
    nodes = [make_node(f"n{i}").cpu("64").mem("256Gi").gpus(rng.choice([2, 4, 8])).build() for i in range(10)]
    shard = shard_with(nodes)
    (learner,) = [p for p, _ in shard.profile.scores if isinstance(p, GpuFragmentation)]
    shares = [
        make_job(f"s{m}").cpu("2").mem("4Gi").gpu_share(m).build().groups[0] for m in (150, 300, 450, 700)
    ]
    whole = [make_job(f"w{k}").cpu("4").mem("8Gi").gpus(k).build().groups[0] for k in (1, 2)]
    groups = shares + whole
    for step in range(120):
        group = rng.choice(groups)
        run_units(shard, [Job(f"j{step}", (group,))])
        for g in groups:
            kept = shard.cache.entry(g, shard.state).eff
            fresh = ClassCache(shard.profile).entry(g, shard.state).eff
            assert same_results(kept, fresh), (step, g.resources)
    assert learner.types.generation >= 5  # the model did change under the cache, several times


def test_task_types_change_the_scored_model_only_in_steps() -> None:
    types = TaskTypes()
    total = sum(types.count.values())
    types.observe(300, 2000, n=int(total * REFRESH_GROWTH) + 1)
    assert types.generation == 1
    model = types.arrays()
    types.observe(450, 2000)
    assert types.arrays() is model and types.generation == 1  # one task more: not yet a step
    demand, weight, _, _ = types.arrays()
    assert 300 in demand.tolist() and weight.sum() == pytest.approx(1.0)
    types.observe(0, 4000, n=1000)  # CPU-only tasks are no GPU type and make no step
    assert types.generation == 1


def test_a_steady_task_mix_stops_changing_the_scored_model() -> None:
    """Once the learned weights settle, looking again retakes nothing: the scores stay cached."""
    types = TaskTypes()
    mix = [(300, 2000), (300, 2000), (1000, 8000), (450, 4000)]
    generations = []
    for i in range(40_000):
        types.observe(*mix[i % len(mix)])
        generations.append(types.generation)
    assert generations[1_000] >= 1  # the prior was replaced by the mix seen
    assert generations[-1] == generations[4_000]  # and nothing changed after that
    demand, weight, _, _ = types.arrays()
    assert dict(zip(demand.tolist(), weight.tolist(), strict=True))[300] == pytest.approx(0.5, abs=0.02)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_class_cache_kept_row_by_row_equals_a_fresh_computation(data: st.DataObject) -> None:
    draw = data.draw
    profile = build_profile(draw(st.sampled_from([ProfileConfig(), SPREAD_PROFILE])))
    state = ClusterArrays()
    for i in range(draw(st.integers(1, 5))):
        state.upsert_node(draw(cache_nodes(f"n{i}")))
    groups = draw(st.lists(cache_groups(), min_size=1, max_size=4))
    cache = ClassCache(profile)
    masks: dict[int, np.ndarray] = {}
    placed = 0
    for _ in range(draw(st.integers(1, 25))):
        op = draw(st.sampled_from(["place", "place", "place", "release", "node", "node-state", "remove"]))
        live = state.live_rows()
        if op == "place" and live:
            group = draw(st.sampled_from(groups))
            row = draw(st.sampled_from(live))
            gpus = choose_gpus(cache.entry(group, state).tc, state, row)
            job = Job(f"t{placed}", (replace(group, replicas=1),))
            resident = Resident.for_task(job, 0, gpus or (), 0.0)
            if gpus is not None and state.fits(row, resident) is None:
                state.place(row, resident)
                placed += 1
        elif op == "release" and state.task_row:
            state.release(draw(st.sampled_from(sorted(state.task_row))))
        elif op == "node":
            state.upsert_node(draw(cache_nodes(f"n{state.n}")))
        elif op == "node-state" and live:
            node = state.nodes[draw(st.sampled_from(live))]
            assert node is not None
            state.set_state(node.name, draw(st.sampled_from(list(NodeState))))
        elif op == "remove" and len(live) > 1:
            node = state.nodes[draw(st.sampled_from(live))]
            assert node is not None
            state.remove_node(node.name)
        # the shard compacts its dirty log up to the oldest reader after each batch
        oldest = cache.oldest_position()
        state.compact_dirty_log(state.dirty_position if oldest is None else oldest)
        for group in draw(st.lists(st.sampled_from(groups), max_size=len(groups))):
            kept = cache.entry(group, state)
            fresh = ClassCache(profile).entry(group, state)
            assert np.array_equal(kept.static_ok, fresh.static_ok)
            assert same_results(kept.eff, fresh.eff), (group, kept.eff, fresh.eff)
            # The remembered argmax, over every row and over a fixed read-only mask, is the
            # argmax of the kept scores (ties to the lowest row) after every kind of change.
            assert cache.remembered_best_row(kept, None, None) == best_row(kept.eff, None)
            mask = masks.get(state.n)
            if mask is None:
                mask = masks[state.n] = np.arange(state.n) % 2 == 0
                mask.flags.writeable = False
            rows = np.flatnonzero(mask)
            assert cache.remembered_best_row(kept, mask, rows) == best_row(kept.eff, rows)


def test_identical_tasks_share_one_class_entry() -> None:
    shard = shard_with([make_node("n").build()])
    job = make_job("j").cpu("1").replicas(5).build()
    run_units(shard, [job, make_job("k").cpu("1").build()])
    assert len(shard.cache.entries) == 1
    run_units(shard, [make_job("other").cpu("2").build()])
    assert len(shard.cache.entries) == 2


def test_a_shard_view_follows_the_binder_changes_incrementally() -> None:
    node = make_node("n").cpu("4").build()
    shard = shard_with([node])
    first = make_job("a").cpu("3").build()
    shard.sync([TaskBound("n", Resident.for_task(first, 0, (), 0.0))], shard.version + 1)
    out = run_units(shard, [make_job("b").cpu("2").build()])
    assert out.proposals == []  # 1 CPU left
    from gosched.common.messages import TaskReleased

    shard.sync([TaskReleased("a/0", "succeeded")], shard.version + 1)
    assert run_units(shard, [make_job("c").cpu("2").build()]).proposals[0].placements[0].node == "n"


def test_taint_effects_round_trip_through_the_view() -> None:
    # A NoExecute taint applied by a node update rules the node out at once for untolerating tasks.
    node = make_node("n").build()
    shard = shard_with([node])
    job = make_job("j").cpu("1").build()
    assert run_units(shard, [job]).proposals
    shard.inflight.clear()
    tainted = replace(node, taints=(Taint("maint", "", TaintEffect.NO_EXECUTE),))
    shard.sync([NodeUpserted(tainted)], shard.version + 1)
    out = run_units(shard, [make_job("k").cpu("1").build()])
    assert out.proposals == [] and "taint maint" in out.unschedulable[0].diagnosis.ruled_out
