"""The benchmark's own arithmetic on tiny runs, and its command line."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gosched.bench.report import table, write
from gosched.bench.runner import run_in_process
from gosched.bench.workloads import WORKLOADS
from gosched.cli.main import app
from gosched.common.config import MINIMAL_PROFILE, ProfileConfig


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_measured_task_is_counted_once(name: str) -> None:
    w = WORKLOADS[name](40, 60)
    r = run_in_process(w, shards=2, profile=ProfileConfig())
    assert r.tasks == w.measured_tasks
    assert 0 < r.bound <= r.tasks
    if name in ("scheduling-basic", "node-affinity", "gang"):
        assert r.bound == r.tasks  # room for all of them
    assert r.tasks_per_s == pytest.approx(r.bound / r.seconds)
    assert 0.0 <= r.conflict_rate <= 1.0


def test_report_files(tmp_path: Path) -> None:
    w = WORKLOADS["scheduling-basic"](20, 50)
    runs = [
        run_in_process(w, shards=s, profile=p) for s in (1, 2) for p in (ProfileConfig(), MINIMAL_PROFILE)
    ]
    paths = write(runs, tmp_path, "gosched bench test")
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [r["shards"] for r in data["runs"]] == [1, 1, 2, 2]
    assert data["runs"][0]["tasks_per_s"] == pytest.approx(runs[0].bound / runs[0].seconds)
    assert "scheduling-basic" in table(runs) and all(p.exists() for p in paths)


def test_cli_prints_tasks_per_second(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        app,
        ["bench", "--in-process", "--nodes", "50", "--pods", "200", "--shards", "1", "--out", str(tmp_path)],
    )
    assert out.exit_code == 0, out.output
    assert " tasks/s" in out.output and (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("args", [["--workload", "nope"], ["--shards", "0"], ["--profile", "fast"]])
def test_cli_rejects_bad_arguments(args: list[str]) -> None:
    out = CliRunner().invoke(app, ["bench", "--in-process", *args])
    assert out.exit_code == 2
