"""The agent's state file: the tasks it runs, so that a restarted agent can adopt them again, and
the final statuses it handed to the master's stream, so that it can send them again to a master
that did not get them (were they forgotten, a restarted agent would call such a task lost, and
the master would run a finished task a second time).

A small JSON file in the work dir, replaced atomically on every write (a crash mid-write leaves
the previous version). Unreadable state is set aside, never fatal: those tasks are then unknown.
"""

import base64
import contextlib
import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from gosched.proto.v1 import agent_pb2

log = logging.getLogger("gosched.agent")
VERSION = 1


@dataclass(slots=True)
class SavedTask:
    task_id: str
    launch: str  # the LaunchTask message, serialized and base64-encoded
    pid: int  # 0: no process (a service waiting to restart, or ended)
    create_time: float
    stdout: str
    stderr: str
    stdout_offset: int = 0  # bytes already shipped to the master
    stderr_offset: int = 0
    container_runtime: str = ""
    container_name: str = ""
    cgroup: str = ""
    exit_file: str = ""  # where the task's shim records its exit code; "": an agent without shims
    nonce: str = ""  # the mark in its processes' environment (agent/proctrack.py); "": none known
    final_state: int = 0  # a TaskState once it ended and its status is not yet sent; 0: not ended
    final_exit_code: int = 0
    final_message: str = ""
    restarts: int = 0  # a service's restarts in this run, so far (reported to the master)
    backoff_s: float = 0.0  # a service's wait before its next restart (0: an older agent's file)
    # With restarts: where the process before the latest restart's and that restart's process's
    # output start, [stdout, stderr, stdout, stderr] (the run's later statuses carry them again).
    restart_starts: list[int] = dataclasses.field(default_factory=list)
    # A kill in progress, so that a restarted agent carries it on: the final status's message, when
    # SIGKILL is due (unix seconds; 0: none), and whether the master no longer expects the task.
    killed: str | None = None
    kill_deadline: float = 0.0
    stale: bool = False
    ends_by: float = 0.0  # when its time limit runs out (unix seconds); 0: none

    @staticmethod
    def encode_launch(msg: agent_pb2.LaunchTask) -> str:
        return base64.b64encode(msg.SerializeToString()).decode()

    def decode_launch(self) -> agent_pb2.LaunchTask:
        msg = agent_pb2.LaunchTask()
        msg.ParseFromString(base64.b64decode(self.launch))
        return msg


@dataclass(slots=True)
class SavedFinal:
    """A final status handed to the stream: the master may not have it yet."""

    task_id: str
    state: int
    exit_code: int
    message: str
    time: float  # when it ended (unix seconds)


@dataclass(slots=True)
class SavedState:
    tasks: list[SavedTask] = dataclasses.field(default_factory=list)
    finished: list[SavedFinal] = dataclasses.field(default_factory=list)  # oldest first


class StateFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> SavedState:
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != VERSION:
                raise ValueError(f"unknown state version {data.get('version')!r}")
            names = {f.name for f in dataclasses.fields(SavedTask)}
            tasks = [SavedTask(**{k: v for k, v in t.items() if k in names}) for t in data["tasks"]]
            # An older agent's file has no "finished": it kept them in memory only.
            finished = [SavedFinal(*f) for f in data.get("finished", ())]
            return SavedState(tasks, finished)
        except FileNotFoundError:
            return SavedState()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_suffix(".bad")
            log.warning("unreadable agent state %s (%s): set aside as %s", self.path, exc, aside)
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            return SavedState()

    def save(self, state: SavedState) -> None:
        data = {
            "version": VERSION,
            "tasks": [dataclasses.asdict(t) for t in state.tasks],
            # As rows, not objects: up to FINISHED_KEPT of them are written on every save.
            "finished": [[f.task_id, f.state, f.exit_code, f.message, f.time] for f in state.finished],
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)
