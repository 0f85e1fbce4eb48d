"""A plain (non-editable) install holds everything under `gosched` and nothing else top-level."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_installs_one_namespace(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(tmp_path),
        str(ROOT),
    ]
    subprocess.run(cmd, check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("gosched-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"gosched", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    for expected in (
        "gosched/common",
        "gosched/dispatcher",
        "gosched/scheduler_shard/plugins",
        "gosched/binder",
    ):
        assert expected in packages
    # every folder with an __init__.py under a component is shipped (sub-packages are discovered)
    for init in (ROOT / "scheduler_shard").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT).as_posix()
        assert f"gosched/{rel}" in packages
