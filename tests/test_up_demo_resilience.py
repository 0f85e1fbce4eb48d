"""`gosched up`'s demo never stops the cluster: sample jobs that fail, are cancelled or are still
unfinished after --demo-wait are reported one line each and the cluster serves on (only
--exit-after-demo turns them into exit 1, still one line each, no traceback, and leaves none of
them pending in the store); the cluster line tells agent nodes from simulated ones; a port another
master holds is refused before anything starts. All without Ray (runtime: local)."""

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import psutil
import pytest
from typer.testing import CliRunner

from gosched import Client
from gosched.api.client import FINAL_STATES
from gosched.cli import master_cmds
from gosched.cli.main import app
from gosched.common.states import JobState
from tests.loopback import sim_master

GOSCHED = Path(sys.executable).with_name("gosched")
LOCAL = {k: v for k, v in os.environ.items() if k != "GOSCHED_CONFIG"} | {"GOSCHED_RUNTIME": "local"}
NO_TRACEBACK = ("Traceback", "╭")
FREE_PORTS = ["--grpc-port", "0", "--http-port", "0"]
QUICK_AGENT = ["--grace", "1", "--runtime-probe", "0", "--work-dir"]  # then the folder
EXIT_AFTER_2S = ["--exit-after-demo", "--demo-wait", "2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Up:
    """`gosched up` (runtime local) running in the background, its output read line by line."""

    def __init__(self, work: Path, *args: str) -> None:
        self.port = _free_port()
        argv = [
            str(GOSCHED),
            "up",
            "--work-dir",
            str(work),
            "--grpc-port",
            str(self.port),
            "--http-port",
            "0",
        ]
        self.proc = subprocess.Popen(
            [*argv, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=LOCAL
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, needle: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            with contextlib.suppress(queue.Empty):
                self.lines.append(self._queue.get(timeout=0.2))
                continue
            assert self.proc.poll() is None, f"up ended ({self.proc.returncode}):\n{self.text}"
            assert time.monotonic() < deadline, f"no {needle!r} in:\n{self.text}"

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(60)
        with contextlib.suppress(queue.Empty):
            while True:
                self.lines.append(self._queue.get(timeout=0.5))
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def up_runs() -> Iterator[list[Up]]:
    runs: list[Up] = []
    yield runs
    for run in runs:
        run.kill()


def _jobs_in_store(work: Path) -> dict[str, JobState]:
    """The jobs the store holds, read by a master of its own started on it."""
    handle = sim_master(work, nodes=0)
    try:
        with Client(handle.target) as client:
            return {info.id: info.state for info in client.list()}
    finally:
        handle.stop()


def _up_to_the_demos_end(work: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    """`gosched up ARGS --exit-after-demo --demo-wait 2` on free ports, run to its end."""
    argv = [str(GOSCHED), "up", "--work-dir", str(work), *args, *FREE_PORTS, *EXIT_AFTER_2S]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=LOCAL, check=False)


# == 1: unfinished sample jobs ==========================================================================
def test_exit_after_demo_reports_unfinished_sample_jobs_one_line_each_and_leaves_none_pending(
    tmp_path: Path,
) -> None:
    """GPU sample jobs still running when --demo-wait is over: one line each, cancelled, exit 1.
    The demo used to wait 60 s per job and end with a DeadlineExceeded traceback, leaving its
    too-big job pending in the store."""
    work = tmp_path / "up"
    done = _up_to_the_demos_end(work, "--sim-nodes", "2", "--sim-task-seconds", "600")
    assert done.returncode == 1, done.stdout + done.stderr
    assert not any(mark in done.stdout + done.stderr for mark in NO_TRACEBACK), done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, done.stderr
    train, notebooks = errors
    assert train.startswith("error: demo: sample job train-") and "after 2s" in train, train
    assert train.endswith("; cancelled"), train
    assert notebooks.startswith("error: demo: sample job notebooks-"), notebooks
    assert "output of hello-" in done.stdout  # the rest of the demo still shows
    assert "why too-big-" in done.stdout
    states = _jobs_in_store(work)
    assert len(states) == 4 and all(state in FINAL_STATES for state in states.values()), states
    assert {state for job_id, state in states.items() if job_id.startswith("hello-")} == {JobState.SUCCEEDED}


def test_without_gpus_the_demo_leaves_out_its_gpu_jobs_and_succeeds(tmp_path: Path) -> None:
    """--sim-nodes 0 on a machine without GPUs: the GPU samples could never run, so the demo says
    it leaves them out (it used to wait --demo-wait for them and fail), and --exit-after-demo
    exits 0."""
    work = tmp_path / "up"
    done = _up_to_the_demos_end(work, "--sim-nodes", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no GPUs in the cluster: the GPU sample jobs (a gang, GPU shares) are left out" in done.stdout
    assert "output of hello-" in done.stdout and "why too-big-" in done.stdout
    states = _jobs_in_store(work)
    assert sorted(job_id.split("-")[0] for job_id in states) == ["hello", "too"], states


def test_up_serves_on_when_sample_jobs_are_still_unfinished(tmp_path: Path, up_runs: list[Up]) -> None:
    up = Up(tmp_path / "up", "--sim-nodes", "2", "--sim-task-seconds", "600", "--demo-wait", "2")
    up_runs.append(up)
    up.wait_for("Ctrl-C stops it all")
    demo = [line for line in up.lines if line.startswith("demo: ")]
    assert len(demo) == 2 and all("after 2s" in line for line in demo), up.text
    assert "left to run (gosched cancel train-" in up.text
    with Client(f"127.0.0.1:{up.port}") as client:
        jobs = {info.id.rsplit("-", 1)[0]: info for info in client.list()}
        assert jobs["too-big"].state is JobState.CANCELLED  # it could never run: not left pending
        assert jobs["train"].state not in FINAL_STATES  # left to run, as the line says
        job = client.submit(master_cmds._sample_job("after-the-demo"))
        assert client.wait(job, timeout=60).state is JobState.SUCCEEDED
    assert up.interrupt() == 0, up.text
    assert not any(mark in up.text for mark in NO_TRACEBACK), up.text


def test_an_up_killed_outright_takes_its_agent_along(tmp_path: Path, up_runs: list[Up]) -> None:
    """`up` SIGKILLed (or OOM-killed): its agent used to run on, retrying for ever against a master
    that was gone; it stops with its parent now (PR_SET_PDEATHSIG)."""
    up = Up(tmp_path / "up", "--sim-nodes", "0", "--demo-wait", "2")
    up_runs.append(up)
    up.wait_for("Ctrl-C stops it all")
    (agent,) = [p for p in psutil.Process(up.proc.pid).children() if "agent" in p.cmdline()]
    up.kill()
    assert psutil.wait_procs([agent], timeout=30)[1] == [], "the agent outlived its up"


# == 2: a sample job cancelled during the demo ==========================================================
def test_cancelling_a_sample_job_during_the_demo_does_not_stop_the_cluster(
    tmp_path: Path, up_runs: list[Up]
) -> None:
    up = Up(tmp_path / "up", "--sim-nodes", "2", "--sim-task-seconds", "5")
    up_runs.append(up)
    target = f"127.0.0.1:{up.port}"
    deadline = time.monotonic() + 90
    train = ""
    while not train:
        assert up.proc.poll() is None and time.monotonic() < deadline, up.text
        with contextlib.suppress(Exception), Client(target, timeout=2) as client:
            train = next((j.id for j in client.list() if j.id.startswith("train-")), "")
            if train:
                assert client.cancel(train).state is JobState.CANCELLED
        time.sleep(0.05)
    up.wait_for("Ctrl-C stops it all")
    assert f"demo: sample job {train} ended cancelled" in up.text
    assert "error:" not in up.text
    with Client(target) as client:
        assert client.wait(client.submit(master_cmds._sample_job("still-serving")), timeout=60).state is (
            JobState.SUCCEEDED
        )
    assert up.interrupt() == 0, up.text


# == 3: the cluster line ================================================================================
def test_the_cluster_line_counts_other_agents_apart_from_simulated_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a second real agent connected, `up` said "this machine (a1) and 3 simulated"."""
    handle = sim_master(tmp_path / "m", nodes=2, task_seconds=0.2)
    agents = []
    try:
        for name in ("a1", "a2"):
            agents.append(
                subprocess.Popen(
                    [
                        str(GOSCHED),
                        "agent",
                        "--master",
                        handle.target,
                        "--name",
                        name,
                        *QUICK_AGENT,
                        str(tmp_path / name),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
            )
        with Client(handle.target) as client:
            deadline = time.monotonic() + 60
            while {"a1", "a2"} - {n.name for n in client.nodes()}:
                assert time.monotonic() < deadline, [n.name for n in client.nodes()]
                time.sleep(0.1)
            problems = master_cmds._show_working(client, "a1", time.monotonic())
        out = capsys.readouterr().out
        assert "cluster: 4 nodes, 8 GPUs: this machine (a1), 1 other agent node and 2 simulated\n" in out, out
        assert not problems and "up and working in" in out
    finally:
        for proc in agents:
            proc.send_signal(signal.SIGTERM)
        for proc in agents:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        handle.stop()


# == 4: ports taken, refused before anything starts ====================================================
@pytest.mark.parametrize("taken", ["--grpc-port", "--http-port"])
def test_a_taken_port_is_refused_before_up_says_it_starts(tmp_path: Path, taken: str) -> None:
    with socket.socket() as holder:  # another master's listening socket
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ports = {"--grpc-port": "0", "--http-port": "0", taken: str(port)}
        done = subprocess.run(
            [str(GOSCHED), "up", "--work-dir", str(tmp_path / "up")]
            + [a for kv in ports.items() for a in kv],
            capture_output=True,
            text=True,
            timeout=60,
            env=LOCAL,
            check=False,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "starting" not in done.stdout, done.stdout  # it used to say "starting Ray and the master"
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: cannot start the master: cannot "), line
    assert f":{port}: the port is taken" in line and line.endswith(f"choose another with {taken}"), line
    assert not (tmp_path / "up" / "gosched.db").exists()


def test_demo_wait_must_be_positive(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["up", "--work-dir", str(tmp_path / "up"), "--demo-wait", "0"])
    assert result.exit_code == 2, result.output
    assert "error: --demo-wait: must be a finite number of seconds > 0, got 0.0" in result.stderr
