"""Plugins registered by name; a profile names the ones it uses."""

from collections.abc import Callable
from typing import TypeVar

from gosched.scheduler_shard.framework.interfaces import (
    CandidateSortingPlugin,
    FilterPlugin,
    GroupingPlugin,
    LocatingPlugin,
    ScorePlugin,
    UnitFilterPlugin,
    VictimSearchingPlugin,
)

PluginT = TypeVar("PluginT")

Plugin = (
    FilterPlugin
    | ScorePlugin
    | UnitFilterPlugin
    | LocatingPlugin
    | GroupingPlugin
    | VictimSearchingPlugin
    | CandidateSortingPlugin
)

_REGISTRY: dict[str, type] = {}


def register(cls: type[PluginT]) -> type[PluginT]:
    """Class decorator: register a plugin class under its `name`."""
    name = getattr(cls, "name", "")
    if not name:
        raise ValueError(f"{cls.__name__} has no plugin name")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"plugin name {name!r} registered twice")
    _REGISTRY[name] = cls
    return cls


def create(name: str, kind: type[PluginT]) -> PluginT:
    """Instantiate the plugin `name`, checking it is of `kind`; unknown names list the known ones."""
    _load_builtins()
    cls = _REGISTRY.get(name)
    if cls is None:
        known = ", ".join(sorted(n for n, c in _REGISTRY.items() if issubclass(c, kind)))
        raise ValueError(f"unknown {kind.__name__} {name!r} (known: {known})")
    if not issubclass(cls, kind):
        raise ValueError(f"plugin {name!r} is a {cls.__mro__[1].__name__}, not a {kind.__name__}")
    instance: PluginT = cls()
    return instance


def names(kind: type) -> list[str]:
    _load_builtins()
    return sorted(n for n, c in _REGISTRY.items() if issubclass(c, kind))


_loaded: list[Callable[[], None]] = []


def _load_builtins() -> None:
    if not _loaded:
        import gosched.scheduler_shard.plugins  # noqa: F401  (registers on import)

        _loaded.append(lambda: None)
