"""The deployment files stay true to the code: the example config loads, every gosched command line
of the systemd units names a real command with real options, the units' restart and stop settings
fit what the master and the agent do, and the `ray up` file installs and starts exactly those
units."""

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.main import get_command

from gosched.agent.runner import FLUSH_ON_STOP_S
from gosched.api.agents import LIVE_HEARTBEATS
from gosched.cli.exits import ExitCode
from gosched.cli.main import app
from gosched.common.config import load_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
REPO = DEPLOY.parent
SYSTEMD = DEPLOY / "systemd"
UNITS = {path.stem: path for path in sorted(SYSTEMD.glob("*.service"))}
MASTER, AGENT = "gosched-master", "gosched-agent"
# Where ray-cluster.yaml puts things on the machines: the checkout (file_mounts) and the venv.
CHECKOUT, GOSCHED = "/opt/gosched/", "/opt/gosched-venv/bin/gosched"
ROLES = {"head_start_ray_commands": {MASTER, AGENT}, "worker_start_ray_commands": {AGENT}}

Unit = dict[str, dict[str, list[str]]]  # section -> key -> its values, in order


def parse_unit(path: Path) -> Unit:
    """A unit file's settings (a key may repeat: every value is kept). No line continuations."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}:{number}: a continued line"
        if line.startswith("["):
            section = unit.setdefault(line.strip("[]"), {})
            continue
        key, eq, value = line.partition("=")
        assert eq and section is not None, f"{path.name}:{number}: not key=value in a section"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def one(unit: Unit, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}= is set {len(values)} times, not once"
    return values[0]


def seconds(text: str) -> float:
    """A systemd time span of one unit ("45s", "10min", "5")."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h)?", text)
    assert match, f"not a time span this test reads: {text!r}"
    scale = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, None: 1}[match[2]]
    return float(match[1]) * scale


def cluster() -> dict:
    return yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())


def master_settings():  # the master's config, as the master unit loads it
    return load_settings(DEPLOY / "gosched.example.yaml")


def index(lines: list[str], pattern: str) -> int:
    found = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    assert len(found) == 1, f"{len(found)} start commands match {pattern!r}, not one"
    return found[0]


def test_example_config_loads() -> None:
    settings = load_settings(DEPLOY / "gosched.example.yaml")
    assert settings.shards == 8
    # 'default' too: a job that names no queue goes there (without it every such job is refused)
    assert [q.name for q in settings.queues] == ["prod", "research", "batch", "default"]
    assert settings.ray_address == "auto"


def test_there_is_a_unit_for_the_master_and_one_for_the_agent() -> None:
    assert set(UNITS) == {MASTER, AGENT}


def install(tmp_path: Path, key: str) -> tuple[Path, dict[str, str]]:
    """Run the start commands of `key` that write files, as a machine would (sudo, /etc and the
    checkout pointed into tmp_path; systemctl, ray and pkill left out): (the /etc they made, the
    environment they ran in)."""
    etc = tmp_path / "etc"
    (etc / "systemd" / "system").mkdir(parents=True)
    (etc / "default").mkdir()
    env = {"PATH": "/usr/bin:/bin", "USER": "opsuser", "RAY_HEAD_IP": "10.9.8.7", "HOME": str(tmp_path)}
    for line in cluster()[key]:
        if re.search(r"systemctl|/bin/ray |pkill", line):
            continue
        assert "sudo " in line, f"a start command that needs no sudo: {line}"
        script = line.replace(" /etc/", f" {etc}/").replace(CHECKOUT, f"{REPO}/")
        out = subprocess.run(
            ["bash", "-c", 'sudo() { "$@"; }\n' + script], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, f"{line}\n{out.stderr}"
    return etc, env


@pytest.mark.parametrize("key", sorted(ROLES))
def test_ray_up_installs_and_starts_exactly_the_units(key: str, tmp_path: Path) -> None:
    """Head: the master and an agent; workers: an agent. Together: every unit in deploy/systemd,
    installed unchanged, as the SSH user (a drop-in), then started with systemctl, never nohup."""
    lines = cluster()[key]
    expected = ROLES[key]
    etc, env = install(tmp_path, key)
    installed = {p.stem: p for p in (etc / "systemd" / "system").glob("*.service")}
    assert set(installed) == expected
    for name, path in installed.items():
        assert path.read_text() == UNITS[name].read_text()
        drop_in = parse_unit(etc / "systemd" / "system" / f"{name}.service.d" / "user.conf")
        assert drop_in == {"Service": {"User": [env["USER"]]}}
    assert set().union(*ROLES.values()) == set(UNITS)

    def units_of(pattern: str) -> set[str]:
        words = shlex.split(lines[index(lines, pattern)].split("||")[0])
        return {w.removesuffix(".service") for w in words[words.index("systemctl") + 2 :]}

    assert units_of(r"systemctl restart ") == expected
    assert units_of(r"systemctl stop ") == expected
    assert not [line for line in lines if "nohup" in line or "bin/gosched " in line]
    # A re-run stops them before Ray (the master's parts are Ray actors), and the new units are
    # in place and loaded before they start again.
    order = [
        index(lines, r"systemctl stop "),
        index(lines, r"/bin/ray stop$"),
        index(lines, r"/bin/ray start "),
        index(lines, r"^sudo cp .*\.service"),
        index(lines, r"systemctl daemon-reload$"),
        index(lines, r"systemctl restart "),
    ]
    assert order == sorted(order)
    assert lines[order[0]].endswith("|| true")  # a first run has no units to stop


@pytest.mark.parametrize("key", sorted(ROLES))
def test_every_node_starts_ray_with_the_actors_inline_limit(key: str) -> None:
    """Ray reads the limit from each process's environment at its start, so each node's `ray
    start` sets it, to the value a local start sets (ray_actors.INLINE_BYTES)."""
    from gosched.runtime.ray_actors import INLINE_BYTES, INLINE_ENV

    lines = cluster()[key]
    words = shlex.split(lines[index(lines, r"/bin/ray start ")])
    assert words[0] == f"{INLINE_ENV}={INLINE_BYTES}" and words[1].endswith("/bin/ray")


@pytest.mark.parametrize(
    ("key", "address"), [("head_start_ray_commands", "127.0.0.1"), ("worker_start_ray_commands", "10.9.8.7")]
)
def test_the_agent_finds_the_master_through_its_environment_file(
    key: str, address: str, tmp_path: Path
) -> None:
    """127.0.0.1 on the head, $RAY_HEAD_IP on the workers, the master's gRPC port; in the file the
    unit reads (required: no '-'), under the name its ExecStart uses."""
    etc, _ = install(tmp_path, key)
    unit = parse_unit(UNITS[AGENT])
    env_file = one(unit, "Service", "EnvironmentFile")
    assert env_file.startswith("/etc/")
    written = dict(
        line.split("=", 1) for line in (etc / env_file.removeprefix("/etc/")).read_text().splitlines()
    )
    assert written == {"GOSCHED_MASTER": f"{address}:{master_settings().grpc_port}"}
    used = set(re.findall(r"\$\{(\w+)\}", one(unit, "Service", "ExecStart")))
    assert used == set(written)


def exec_lines() -> list[tuple[str, str, str]]:
    """(unit, key, command line) of every Exec*= of every unit."""
    return [
        (name, key, value)
        for name, path in UNITS.items()
        for key, values in parse_unit(path)["Service"].items()
        if key.startswith("Exec")
        for value in values
    ]


def test_the_units_run_real_gosched_commands_with_real_options() -> None:
    """Each command line parses as its gosched command's own (unknown options, missing or
    ill-typed values raise), with the agent's address as the head's environment file has it."""
    assert {(name, key) for name, key, _ in exec_lines()} == {(MASTER, "ExecStart"), (AGENT, "ExecStart")}
    assert f"python3 -m venv {GOSCHED.removesuffix('/bin/gosched')}" in " ".join(cluster()["setup_commands"])
    commands = get_command(app).commands
    seen = {}
    for name, _, line in exec_lines():
        words = shlex.split(line.replace("${GOSCHED_MASTER}", "127.0.0.1:9090"))
        assert words[0] == GOSCHED
        assert name == f"gosched-{words[1]}"
        seen[words[1]] = commands[words[1]].make_context(words[1], words[2:]).params
    config = seen["master"]["config"]
    assert config.startswith(CHECKOUT) and (REPO / config.removeprefix(CHECKOUT)).is_file()
    assert seen["master"]["address"] == "auto"  # the Ray that `ray start --head` started
    assert seen["agent"]["master"] == "127.0.0.1:9090"
    assert seen["agent"]["work_dir"]  # fixed: a restarted agent adopts the tasks recorded there


@pytest.mark.parametrize("name", [MASTER, AGENT])
def test_units_restart_on_failure_but_not_on_exit_2(name: str) -> None:
    unit = parse_unit(UNITS[name])
    assert one(unit, "Service", "Restart") == "on-failure"
    assert one(unit, "Service", "RestartPreventExitStatus").split() == [str(int(ExitCode.USAGE))]
    assert one(unit, "Service", "Type") == "exec"
    # Not given up too soon (a master started before Ray answers, an old master or agent still
    # holding the store or the work dir): more than systemd's default 5 starts in 10 s, and the
    # starts allowed take minutes at RestartSec apart. In [Unit]: [Service] has no StartLimitIntervalSec.
    restart_s = seconds(one(unit, "Service", "RestartSec"))
    burst = int(one(unit, "Unit", "StartLimitBurst"))
    interval_s = seconds(one(unit, "Unit", "StartLimitIntervalSec"))
    assert burst * restart_s >= 120 and interval_s >= burst * restart_s
    user = one(unit, "Service", "User")
    assert user and user != "root"  # the default the drop-in replaces: never root by accident


def test_the_master_stops_gracefully_and_a_stop_while_starting_is_no_failure() -> None:
    unit = parse_unit(UNITS[MASTER])
    assert one(unit, "Service", "KillMode") == "mixed"  # SIGTERM to the master alone, it handles it
    assert one(unit, "Service", "SuccessExitStatus").split() == [str(int(ExitCode.INTERRUPTED))]
    assert seconds(one(unit, "Service", "TimeoutStopSec")) >= 20
    assert "Delegate" not in unit["Service"]  # it makes no cgroups


def test_the_agent_unit_lets_its_tasks_outlive_a_crash_and_stops_them_itself() -> None:
    unit = parse_unit(UNITS[AGENT])
    # Adopted after a crash: systemd must not kill them with the agent (KillMode=process).
    assert one(unit, "Service", "KillMode") == "process"
    # Its stop: --grace for the tasks, 5 s for them to go, the flush, 2 x 5 s for its threads.
    agent = get_command(app).commands["agent"]
    grace = next(p.default for p in agent.params if p.name == "grace")
    assert seconds(one(unit, "Service", "TimeoutStopSec")) > grace + 5 + FLUSH_ON_STOP_S + 10
    # A crash-restarted agent must not be refused as its own predecessor, which the master counts
    # live for LIVE_HEARTBEATS heartbeats: refused, it would kill the tasks it adopted.
    assert (
        seconds(one(unit, "Service", "RestartSec")) > LIVE_HEARTBEATS * master_settings().heartbeat_interval_s
    )
    # Its tasks go in cgroups of their own (agent/cgroups.py): the subtree is delegated, and the
    # tasks that stay in the unit's cgroup are not capped all together by a service's TasksMax.
    assert one(unit, "Service", "Delegate") == "yes"
    assert one(unit, "Service", "TasksMax") == "infinity"
    # On the head, `systemctl stop gosched-master gosched-agent` stops the agent first.
    assert f"{MASTER}.service" in one(unit, "Unit", "After").split()


@pytest.mark.parametrize(
    ("key", "kinds"),
    [("head_start_ray_commands", ("master", "agent")), ("worker_start_ray_commands", ("agent",))],
)
def test_a_second_ray_up_also_stops_masters_and_agents_started_without_the_units(
    key: str, kinds: tuple[str, ...]
) -> None:
    """A machine last started by hand or by the nohup version of this file: its master or agent
    would hold the store or the work dir. The pkill comes before Ray stops and the units start,
    kills only them (never the shell running it, never a task that mentions them), and matches the
    units' own command lines too: it runs after `systemctl stop`, which leaves none of those."""
    lines = cluster()[key]
    kill = index(lines, r"^pkill -f ")
    assert index(lines, r"systemctl stop ") < kill < index(lines, r"/bin/ray stop$")
    pattern = shlex.split(lines[kill])[2]
    for kind in kinds:
        assert re.search(pattern, f"/opt/gosched-venv/bin/gosched {kind} --work-dir /var/tmp/x")
        assert re.search(pattern, one(parse_unit(UNITS[f"gosched-{kind}"]), "Service", "ExecStart"))
    assert not re.search(pattern, f"bash -c {lines[kill]}")  # never the shell running it
    assert not re.search(pattern, "python train.py --gosched master")


def verify(units: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *map(str, units)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path: Path) -> None:
    """The units as systemd reads them: no unknown key, no value it cannot parse. The venv's path
    is this one's (verify checks that ExecStart's program exists)."""
    gosched = Path(sys.executable).with_name("gosched")
    if not gosched.is_file():  # not a venv with gosched installed: any program does for verify
        gosched = Path(sys.executable)
    copies = []
    for path in UNITS.values():
        copy = tmp_path / path.name
        copy.write_text(path.read_text().replace(GOSCHED, str(gosched)))
        copies.append(copy)
    out = verify(copies)
    said = [line for line in (out.stdout + out.stderr).splitlines() if "gosched" in line]
    assert out.returncode == 0 and not said, out.stdout + out.stderr
    # And it does speak up about these files: a misspelt key is found.
    broken = tmp_path / "broken" / f"{AGENT}.service"
    broken.parent.mkdir()
    text = (tmp_path / f"{AGENT}.service").read_text()
    broken.write_text(text.replace("\n[Service]\n", "\n[Service]\nRestrat=on-failure\n", 1))
    out = verify([broken])
    assert "Restrat" in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize(("mode", "runs"), [("quick", 4), ("full", 8)])
def test_the_bench_suite_runs_real_bench_options_each_into_its_own_folder(
    mode: str, runs: int, tmp_path: Path
) -> None:
    """deploy/bench-suite.sh, run with a stand-in for gosched that records its arguments: every
    invocation parses as `gosched bench`'s own, and each writes to a folder of its own under OUT."""
    calls = tmp_path / "calls"
    fake = tmp_path / "gosched"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(DEPLOY / "bench-suite.sh"), str(out), mode],
        env={"PATH": "/usr/bin:/bin", "GOSCHED": str(fake)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    bench = get_command(app).commands["bench"]
    folders = []
    for line in calls.read_text().splitlines():
        words = line.split()
        assert words[0] == "bench"
        folders.append(bench.make_context("bench", words[1:]).params["out"])
    assert len(folders) == runs
    assert len(set(folders)) == runs and all(Path(f).parent == out for f in folders)
    log = (out / "suite.log").read_text()
    assert "cores: " in log and log.count(": exit 0 after") == runs


def test_the_bench_suite_refuses_an_unknown_mode(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(DEPLOY / "bench-suite.sh"), str(tmp_path), "fast"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "mode: fast" in done.stderr
