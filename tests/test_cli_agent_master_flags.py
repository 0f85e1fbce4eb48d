"""Bad agent/master/up flags (and bench --ingest's --pods): a usage error naming the flag (exit 2), refused
before the agent probes the machine or the master starts; and the note for a store that does not exist."""

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gosched.agent import runner as agent_runner
from gosched.cli import master_cmds
from gosched.cli.exits import ExitCode
from gosched.cli.main import app


class _Started(Exception):
    """Raised where the command would start its real work: reaching it means the flags passed."""


@pytest.fixture(autouse=True)
def _nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_agent(*args: Any, **kwargs: Any) -> None:
        raise _Started("AgentRunner")

    def no_master(*args: Any, **kwargs: Any) -> None:
        raise _Started("the master")

    monkeypatch.setattr(agent_runner, "AgentRunner", no_agent)
    monkeypatch.setattr(master_cmds, "_start", no_master)


# (command line, the flag its error must name)
BAD: list[tuple[list[str], str]] = [
    (["agent", "--grace", "-1"], "--grace"),
    (["agent", "--grace", "nan"], "--grace"),
    (["agent", "--grace", "inf"], "--grace"),
    (["agent", "--runtime-probe", "-5"], "--runtime-probe"),
    (["agent", "--runtime-probe", "nan"], "--runtime-probe"),
    (["agent", "--runtime-probe", "inf"], "--runtime-probe"),
    (["agent", "--cpus", "-1"], "--cpus"),
    (["agent", "--cpus", "0"], "--cpus"),
    (["agent", "--cpus", "0.0001"], "--cpus"),  # rounds to 0 milli-CPUs
    (["agent", "--cpus", "2Gi"], "--cpus"),
    (["agent", "--memory", "0"], "--memory"),
    (["agent", "--memory", "-4Gi"], "--memory"),
    (["agent", "--memory", "lots"], "--memory"),
    (["agent", "--labels", "gosched.io/agent=false"], "--labels"),
    (["agent", "--labels", "zone=a,gosched.io/container-runtime=docker"], "--labels"),
    (["agent", "--labels", "novalue"], "--labels"),
    (["agent", "--taints", "a=b:Sometimes"], "--taints"),
    (["agent", "--token-file", "/nonexistent/agent.token"], "--token-file"),
    (["agent", "--tls-ca", "/nonexistent/ca.crt"], "--tls-ca"),
    (["agent", "--tls-cert", "/nonexistent/agent.crt"], "--tls-key"),  # a certificate needs its key
    (["master", "--in-process", "--sim-nodes", "-1"], "--sim-nodes"),
    (["master", "--in-process", "--sim-nodes", "2", "--sim-task-seconds", "nan"], "--sim-task-seconds"),
    (["master", "--in-process", "--sim-nodes", "2", "--sim-task-seconds", "-1"], "--sim-task-seconds"),
    (["up", "--sim-nodes", "-3"], "--sim-nodes"),
    (["up", "--sim-task-seconds", "inf"], "--sim-task-seconds"),
    (["bench", "--ingest", "--in-process", "--pods", "5", "--replicas", "10"], "--pods"),
    (["bench", "--ingest", "--in-process", "--pods", "25", "--replicas", "10"], "--pods"),
]


@pytest.mark.parametrize(("args", "flag"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_flag_is_a_usage_error_naming_it(args: list[str], flag: str, tmp_path: Path) -> None:
    extra = {"bench": ["--out", str(tmp_path / "out")], "up": ["--work-dir", str(tmp_path / "up")]}
    started = time.monotonic()
    result = CliRunner().invoke(app, [*args, *extra.get(args[0], [])])
    assert time.monotonic() - started < 5, "refused only after starting work"
    assert not isinstance(result.exception, _Started), result.output
    assert result.exit_code == ExitCode.USAGE, result.output
    assert f"error: {flag}: " in result.stderr and "Traceback" not in result.output, result.output
    assert not list(tmp_path.iterdir())  # nothing made: refused before any folder or store


def test_good_agent_flags_reach_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def record(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Started("AgentRunner")

    monkeypatch.setattr(agent_runner, "AgentRunner", record)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # never reached; pytest keeps its own
    flags = ["--grace", "0", "--runtime-probe", "0", "--cpus", "1500m", "--memory", "4Gi"]
    labels = ["--labels", "zone=a,gosched.io/gpu-model=H100", "--taints", "spot:NoExecute"]
    result = CliRunner().invoke(app, ["agent", *flags, *labels])
    assert isinstance(result.exception, _Started), result.output
    assert seen["shutdown_grace_s"] == 0 and seen["runtime_probe_s"] == 0
    assert seen["cpu_milli"] == 1500 and seen["memory"] == 4 * 2**30
    assert seen["labels"] == {"zone": "a", "gosched.io/gpu-model": "H100"}  # discovered ones: overridable


def test_bench_ingest_takes_a_multiple_of_replicas(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gosched.cli import main

    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(main, "_bench_ingest", lambda tasks, replicas, *rest: seen.append((tasks, replicas)))
    args = ["bench", "--ingest", "--in-process", "--pods", "30", "--replicas", "10", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen == [(30, 10)]


def test_flag_error_exits_2_without_a_traceback() -> None:
    from gosched.cli.flags import FlagError, refuse

    with pytest.raises(typer.Exit) as exited:
        refuse(FlagError("--x", "bad"))
    assert exited.value.exit_code == 2
