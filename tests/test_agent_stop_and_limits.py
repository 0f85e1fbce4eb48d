"""A user-level review of the node agent: --cpus/--memory above the machine's are refused (as
--help promised), an agent stopped on purpose takes its node out at once (as a kubelet or slurmd
going away does), and a service's process is restarted whatever its exit code (restartPolicy:
Always). Real parts throughout: the `gosched agent` program or AgentRunner agents, the master in
process on loopback gRPC, real shell tasks."""

import subprocess
from pathlib import Path

import psutil
import pytest

from gosched.agent.runner import AgentRunner, MoreThanTheMachine
from tests.test_agent_gateway import GOSCHED

MACHINE_CPUS = psutil.cpu_count(logical=True) or 1
MACHINE_MEMORY = int(psutil.virtual_memory().total)


# == 1. --cpus / --memory: at most the machine's ======================================================
def agent_cli(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`gosched agent` with `flags`, toward a master that is not there: a refused flag ends it first."""
    argv = [str(GOSCHED), "agent", "--master", "127.0.0.1:1", "--name", "x1", "--work-dir", str(tmp_path)]
    return subprocess.run([*argv, *flags], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    ("flags", "named", "has"),
    [
        (("--cpus", str(MACHINE_CPUS + 98)), f"--cpus: {MACHINE_CPUS + 98} is", f"({MACHINE_CPUS:g} CPUs)"),
        (
            ("--cpus", f"{MACHINE_CPUS * 1000 + 1}m"),
            f"--cpus: {MACHINE_CPUS * 1000 + 1}m is",
            f"({MACHINE_CPUS:g} CPUs)",
        ),
        (("--memory", "100Ti"), "--memory: 100Ti is", f"({MACHINE_MEMORY / 2**30:.1f} GiB)"),
    ],
)
def test_advertising_more_than_the_machine_has_is_refused(
    tmp_path: Path, flags: tuple[str, ...], named: str, has: str
) -> None:
    """It registered "with 100 CPUs" on a 2-core machine, a warning aside, although --help says
    "less than the machine's": the scheduler then packed tasks onto room that is not there."""
    done = agent_cli(tmp_path, *flags)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert named in line and "more than this machine has" in line and has in line, line
    assert "registered" not in done.stdout


def test_the_runner_takes_the_machines_whole_cpus_and_memory_but_no_more(tmp_path: Path) -> None:
    common = {"work_dir": tmp_path, "nvml": None, "container_runtime": None}
    whole = AgentRunner("127.0.0.1:1", "x1", cpu_milli=MACHINE_CPUS * 1000, memory=MACHINE_MEMORY, **common)
    assert (whole.node.cpu_milli, whole.node.memory) == (MACHINE_CPUS * 1000, MACHINE_MEMORY)
    with pytest.raises(MoreThanTheMachine) as cpus:
        AgentRunner("127.0.0.1:1", "x1", cpu_milli=MACHINE_CPUS * 1000 + 1, **common)
    assert (cpus.value.resource, cpus.value.has) == ("cpu_milli", MACHINE_CPUS * 1000)
    with pytest.raises(MoreThanTheMachine) as memory:
        AgentRunner("127.0.0.1:1", "x1", memory=MACHINE_MEMORY + 1, **common)
    assert (memory.value.resource, memory.value.asked) == ("memory", MACHINE_MEMORY + 1)
