"""The components talk only through gosched.common: check the import graph itself."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# folder -> gosched sub-packages it must never import
FORBIDDEN = {
    "common": {"dispatcher", "scheduler_shard", "binder", "runtime", "bench", "cli", "api"},
    "scheduler_shard": {"binder", "dispatcher", "runtime", "api"},
    "binder": {"scheduler_shard", "dispatcher", "runtime", "api"},
    "dispatcher": {"scheduler_shard", "binder", "runtime", "api"},
}


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
