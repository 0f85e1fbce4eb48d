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
