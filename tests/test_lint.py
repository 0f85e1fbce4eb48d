"""ruff and mypy are part of the test suite: the tree must stay clean."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed (pip install -e '.[dev]')")
    return found


def package_tree(dest: Path) -> Path:
    """A `gosched/` folder of links to the component folders, as the import namespace sees them.

    mypy cannot follow setuptools' editable-install import hook, so it checks this tree instead.
    """
    sys.path.insert(0, str(ROOT))
    try:
        from setup import COMPONENTS  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    pkg = dest / "gosched"
    pkg.mkdir(parents=True)
    for item in (ROOT / "gosched").iterdir():
        if item.suffix == ".py":
            (pkg / item.name).symlink_to(item)
    for component in COMPONENTS:
        (pkg / component).symlink_to(ROOT / component, target_is_directory=True)
    return dest


def test_ruff_clean() -> None:
    out = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_clean(tmp_path: Path) -> None:
    tree = package_tree(tmp_path)
    cmd = [_tool("mypy"), "--config-file", str(ROOT / "pyproject.toml"), "-p", "gosched"]
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
