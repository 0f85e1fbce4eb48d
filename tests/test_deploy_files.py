"""The deployment files stay true to the code: the example config loads, and every gosched command
line in the `ray up` file names a real command with real options."""

import re
import shlex
from pathlib import Path

import yaml
from typer.testing import CliRunner

from gosched.cli.main import app
from gosched.common.config import load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_example_config_loads() -> None:
    settings = load_settings(DEPLOY / "gosched.example.yaml")
    assert settings.shards == 8
    # 'default' too: a job that names no queue goes there (without it every such job is refused)
    assert [q.name for q in settings.queues] == ["prod", "research", "batch", "default"]
    assert settings.ray_address == "auto"


def test_ray_up_file_runs_real_gosched_commands() -> None:
    cluster = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    assert cluster["provider"]["type"] == "local"
    lines = [*cluster["head_start_ray_commands"], *cluster["worker_start_ray_commands"]]
    gosched_lines = [line for line in lines if "bin/gosched " in line]
    assert {shlex.split(line)[2] for line in gosched_lines} == {"master", "agent"}
    runner = CliRunner()
    for line in gosched_lines:
        words = shlex.split(line.split(">", 1)[0])
        command, options = words[2], [w for w in words[3:] if w.startswith("--")]
        help_text = runner.invoke(app, [command, "--help"], terminal_width=200).output
        for option in options:
            assert re.search(rf"{option}\b", help_text), f"gosched {command} has no {option}"


def test_a_second_ray_up_stops_the_running_master_and_agents_first() -> None:
    """A re-run would otherwise start a master refused by the store's lock (and an agent by its
    work dir's) while the old ones run on: the start commands kill them first, and only them."""
    cluster = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    for key, kinds in (
        ("head_start_ray_commands", ("master", "agent")),
        ("worker_start_ray_commands", ("agent",)),
    ):
        lines = cluster[key]
        kill = next(i for i, line in enumerate(lines) if line.startswith("pkill -f "))
        start = next(i for i, line in enumerate(lines) if "bin/gosched " in line)
        assert kill < start
        pattern = shlex.split(lines[kill])[2]
        for kind in kinds:
            assert re.search(pattern, f"/opt/gosched-venv/bin/gosched {kind} --work-dir /var/tmp/x")
        assert not re.search(pattern, f"bash -c {lines[kill]}")  # never the shell running it
        assert not re.search(pattern, "python train.py --gosched master")
