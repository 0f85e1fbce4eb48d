"""The components talk only through gosched.common: check the import graph itself."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# folder -> gosched sub-packages it must never import
FORBIDDEN = {
    "common": {"dispatcher", "scheduler_shard", "binder", "agent", "runtime", "bench", "cli", "api"},
    "scheduler_shard": {"binder", "dispatcher", "runtime", "api"},
    "binder": {"scheduler_shard", "dispatcher", "runtime", "api"},
    "dispatcher": {"scheduler_shard", "binder", "runtime", "api"},
    # The node agent talks to the master through gRPC only: no scheduler component in its process.
    "agent": {"dispatcher", "scheduler_shard", "binder", "runtime", "bench"},
}
# Of gosched.api, the agent may use the proto conversions and the client side of a secured channel
# (TLS, tokens) alone (not the server, service or client).
AGENT_API_ALLOWED = {"gosched.api.convert", "gosched.api.errors", "gosched.api.channel"}


def imported_components(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "gosched" and len(parts) > 1:
                found.add(parts[1])
            elif parts[0] in FORBIDDEN or parts[0] in {"runtime", "api"}:
                found.add(f"bare:{parts[0]}")  # a bare top-level import would bypass the namespace
    return found


@pytest.mark.parametrize("component", sorted(FORBIDDEN))
def test_component_imports(component: str) -> None:
    bad = {}
    for path in (ROOT / component).rglob("*.py"):
        hits = imported_components(path)
        wrong = {h for h in hits if h in FORBIDDEN[component] or h.startswith("bare:")}
        if wrong:
            bad[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not bad, f"{component} imports what it must not: {bad}"


def test_agent_uses_only_the_api_conversions() -> None:
    bad = {}
    for path in (ROOT / "agent").rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            mods: list[str] = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "gosched.api":
                mods = [f"gosched.api.{a.name}" for a in node.names]  # from gosched.api import x
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            for mod in mods:
                if mod.startswith("gosched.api.") and ".".join(mod.split(".")[:3]) not in AGENT_API_ALLOWED:
                    bad.setdefault(str(path.relative_to(ROOT)), []).append(mod)
    assert not bad, f"the agent imports server-side API code: {bad}"
