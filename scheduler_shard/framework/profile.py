"""A profile: the plugins a shard runs, built from plain lists of names (and score weights)."""

from dataclasses import dataclass

from gosched.common.config import ProfileConfig
from gosched.scheduler_shard.framework import registry
from gosched.scheduler_shard.framework.interfaces import (
    CandidateSortingPlugin,
    FilterPlugin,
    GroupingPlugin,
    LocatingPlugin,
    ScorePlugin,
    UnitFilterPlugin,
    VictimSearchingPlugin,
)


@dataclass(slots=True)
class Profile:
    name: str
    locating: list[LocatingPlugin]
    grouping: list[GroupingPlugin]
    static_filters: list[FilterPlugin]
    dynamic_filters: list[FilterPlugin]
    unit_filters: list[UnitFilterPlugin]
    scores: list[tuple[ScorePlugin, float]]
    victim_searching: list[VictimSearchingPlugin]
    candidate_sorting: list[CandidateSortingPlugin]
    preemption: bool

    @property
    def filters(self) -> list[FilterPlugin]:
        return [*self.static_filters, *self.dynamic_filters]


# The filters whose rule the binder's stages check again (binder/stages.py: node_schedulable,
# resources_fit with gpus_free, anti_affinity). A shard without one proposes what the binder always
# refuses, and a refused unit is retried at once: the job would loop without end, starving others.
REQUIRED_FILTERS = {
    "resources_fit": "placements that do not fit (cpu, memory, extended resources, GPUs)",
    "node_ready": "placements on nodes not ready, cordoned or draining",
    "anti_affinity": "placements that break a task's anti-affinity",
}


def check_profile(cfg: ProfileConfig) -> None:
    """ValueError naming the first plugin of `cfg` that is unknown or of the wrong kind, as
    `profile.<list>[i]: reason`, or a filter the binder checks again missing from
    `profile.filters`: config loading asks this, so that a typo is a configuration error before
    anything starts."""
    filter_kinds: tuple[type, ...] = (FilterPlugin, UnitFilterPlugin)
    lists: list[tuple[str, list[str], tuple[type, ...]]] = [
        ("locating", cfg.locating, (LocatingPlugin,)),
        ("grouping", cfg.grouping, (GroupingPlugin,)),
        ("filters", cfg.filters, filter_kinds),
        ("scores", [s.name for s in cfg.scores], (ScorePlugin,)),
        ("victim_searching", cfg.victim_searching, (VictimSearchingPlugin,)),
        ("candidate_sorting", cfg.candidate_sorting, (CandidateSortingPlugin,)),
    ]
    for field, names, kinds in lists:
        for i, name in enumerate(names):
            if not any(name in registry.names(kind) for kind in kinds):
                known = sorted({n for kind in kinds for n in registry.names(kind)})
                raise ValueError(f"profile.{field}[{i}]: unknown plugin {name!r} (known: {', '.join(known)})")
    missing = [name for name in REQUIRED_FILTERS if name not in cfg.filters]
    if missing:
        it = "it" if len(missing) == 1 else "them"
        refused = "; ".join(REQUIRED_FILTERS[name] for name in missing)
        raise ValueError(
            f"profile.filters: must include {', '.join(missing)} (the binder checks {it} again and "
            f"refuses what the shards propose without {it}: {refused}; a refused job is retried at "
            "once, without end)"
        )


def build_profile(cfg: ProfileConfig) -> Profile:
    static: list[FilterPlugin] = []
    dynamic: list[FilterPlugin] = []
    unit: list[UnitFilterPlugin] = []
    for name in cfg.filters:
        # A filter name may be a per-row filter or a unit-scoped one (anti-affinity).
        if name in registry.names(UnitFilterPlugin):
            unit.append(registry.create(name, UnitFilterPlugin))
            continue
        plugin = registry.create(name, FilterPlugin)
        (dynamic if plugin.dynamic else static).append(plugin)
    return Profile(
        name=cfg.name,
        locating=[registry.create(n, LocatingPlugin) for n in cfg.locating],
        grouping=[registry.create(n, GroupingPlugin) for n in cfg.grouping],
        static_filters=static,
        dynamic_filters=dynamic,
        unit_filters=unit,
        scores=[(registry.create(s.name, ScorePlugin), s.weight) for s in cfg.scores if s.weight > 0],
        victim_searching=[registry.create(n, VictimSearchingPlugin) for n in cfg.victim_searching],
        candidate_sorting=[registry.create(n, CandidateSortingPlugin) for n in cfg.candidate_sorting],
        preemption=cfg.preemption,
    )
