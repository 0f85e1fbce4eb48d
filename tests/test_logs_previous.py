"""A task run again keeps its previous run's output beside the current one, as `kubectl logs
--previous` does (one run back, no more), on the master's real log folder."""

from pathlib import Path

import pytest

from gosched.api.logs import LogStore
from tests.loopback import cli, sim_master


def test_a_new_run_keeps_the_last_runs_output_as_the_previous_one(tmp_path: Path) -> None:
    logs = LogStore(tmp_path)
    logs.write("j/0", "stdout", 0, b"first run\n")
    logs.write("j/0", "stderr", 0, b"first err\n")
    logs.reset("j/0")  # the second run starts
    assert logs.read("j/0", "stdout", 0) == b""
    assert logs.read("j/0", "stdout", 0, previous=True) == b"first run\n"
    assert logs.read("j/0", "stderr", 0, previous=True) == b"first err\n"
    logs.write("j/0", "stdout", 0, b"second\n")
    logs.reset("j/0")  # the third: the second run is the previous now, the first is gone
    assert logs.read("j/0", "stdout", 0, previous=True) == b"second\n"
    assert logs.read("j/0", "stderr", 0, previous=True) == b""  # the second wrote none: not the first's
    assert logs.size("j/0", "stdout", previous=True) == len(b"second\n")


@pytest.mark.parametrize("task_id", ["a/0", "x.y/12"])
def test_a_task_never_run_again_has_no_previous_output(task_id: str, tmp_path: Path) -> None:
    logs = LogStore(tmp_path)
    logs.write(task_id, "stdout", 0, b"only run\n")
    assert logs.read(task_id, "stdout", 0, previous=True) == b""
    assert logs.read(task_id, "stdout", 0) == b"only run\n"


def test_the_cli_reads_the_previous_run_and_refuses_to_follow_it(tmp_path: Path) -> None:
    server = sim_master(tmp_path)
    try:
        assert cli(server, "submit", "--name", "once", "--cpus", "1", "--", "true").exit_code == 0
        told = cli(server, "logs", "once", "--previous")
        assert told.exit_code == 0 and "no output from a previous run of task 0 of once" in told.stderr
        refused = cli(server, "logs", "once", "--previous", "--follow")
        assert refused.exit_code == 2 and "so --follow has nothing to follow" in refused.stderr
    finally:
        server.stop()


def test_a_run_that_wrote_one_stream_leaves_the_other_previous_empty_not_an_older_runs(
    tmp_path: Path,
) -> None:
    logs = LogStore(tmp_path)
    logs.write("j/0", "stdout", 0, b"run 1 out\n")
    logs.write("j/0", "stderr", 0, b"run 1 traceback\n")
    logs.reset("j/0")
    logs.write("j/0", "stdout", 0, b"run 2 out\n")  # no stderr this time
    logs.reset("j/0")
    assert logs.read("j/0", "stdout", 0, previous=True) == b"run 2 out\n"
    assert logs.read("j/0", "stderr", 0, previous=True) == b""  # not run 1's


def _append(logs: LogStore, task_id: str, stream: str, data: bytes) -> None:
    """As an agent ships a service's output: at the file's end, restarts and all."""
    logs.write(task_id, stream, logs.size(task_id, stream), data)


def test_a_services_restarts_split_its_run_per_process_each_stream_alike(tmp_path: Path) -> None:
    """Restart marks (the agent's restart statuses) split the run: the current process's output,
    and as the previous the process's before, in both streams at once: a process that wrote no
    stderr (or nothing) leaves that stream's previous empty, not an older process's."""
    logs = LogStore(tmp_path)
    _append(logs, "s/0", "stdout", b"p0 out\n")
    _append(logs, "s/0", "stderr", b"p0 FATAL\n")

    def restart(n: int) -> None:
        logs.mark_restart("s/0", n, {stream: logs.size("s/0", stream) for stream in ("stdout", "stderr")})

    restart(1)
    _append(logs, "s/0", "stdout", b"p1 out\n")  # p1 writes no stderr
    restart(2)
    assert logs.read("s/0", "stdout", 0, previous=True) == b"p1 out\n"
    assert logs.read("s/0", "stderr", 0, previous=True) == b""  # p1's: none, not p0's
    restart(3)  # p2 wrote nothing at all
    assert logs.read("s/0", "stdout", 0, previous=True) == b""
    restart(3)  # the same status again changes nothing
    logs.mark_restart("s/0", 2, {"stdout": 0, "stderr": 0})  # nor an older one
    _append(logs, "s/0", "stdout", b"p3 out\n")
    assert logs.read("s/0", "stdout", 0) == b"p3 out\n"
    assert logs.read("s/0", "stdout", 3) == b"out\n"  # offsets count in the process's output
    assert logs.read("s/0", "stdout", 0, previous=True) == b""


def test_a_new_run_keeps_the_old_runs_last_process_as_the_previous_without_copying_it(tmp_path: Path) -> None:
    logs = LogStore(tmp_path)
    _append(logs, "s/0", "stdout", b"p0\n")
    logs.mark_restart("s/0", 1, {"stdout": logs.size("s/0", "stdout"), "stderr": 0})
    _append(logs, "s/0", "stdout", b"p1 last\n")
    held = logs.path("s/0", "stdout").stat().st_ino
    logs.reset("s/0")  # placed anew
    assert logs.path("s/0", "stdout", previous=True).stat().st_ino == held  # moved, not copied
    assert logs.read("s/0", "stdout", 0, previous=True) == b"p1 last\n"
    assert logs.read("s/0", "stdout", 0) == b""
    _append(logs, "s/0", "stdout", b"run 2\n")
    assert logs.read("s/0", "stdout", 0) == b"run 2\n"  # no mark of the old run applies
    logs.reset("s/0")  # a run without restarts: its whole output is the previous
    assert logs.read("s/0", "stdout", 0, previous=True) == b"run 2\n"
