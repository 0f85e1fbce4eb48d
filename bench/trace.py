"""Reading the Alibaba GPU cluster trace (openb, 2023) used by the FGD study."""

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from gosched.common.job import Job, TaskGroup
from gosched.common.node import Gpu, Node
from gosched.common.resources import GPU_MILLI, ResourceRequest

MiB = 2**20
TRACE_ENV = "GOSCHED_TRACE_DIR"
DEFAULT_TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "openb-v2023"


@dataclass(frozen=True, slots=True)
class TraceTask:
    cpu_milli: int
    memory: int
    num_gpu: int
    gpu_milli: int  # per GPU; < 1000 with num_gpu == 1 is a share of one GPU

    @property
    def gpu_demand(self) -> int:
        """Milli-GPU this task asks for in all."""
        return self.num_gpu * self.gpu_milli

    def request(self) -> ResourceRequest:
        if self.num_gpu == 0:
            return ResourceRequest(cpu_milli=self.cpu_milli, memory=self.memory)
        if self.num_gpu == 1 and self.gpu_milli < GPU_MILLI:
            return ResourceRequest(cpu_milli=self.cpu_milli, memory=self.memory, gpu_milli=self.gpu_milli)
        return ResourceRequest(cpu_milli=self.cpu_milli, memory=self.memory, gpus=self.num_gpu)

    def job(self, job_id: str) -> Job:
        return Job(id=job_id, groups=(TaskGroup("main", 1, self.request(), ("true",)),))


def trace_dir(explicit: str | Path | None = None) -> Path:
    """The trace folder: the argument, $GOSCHED_TRACE_DIR, or ../shared/traces/openb-v2023."""
    return Path(explicit or os.environ.get(TRACE_ENV) or DEFAULT_TRACE)


def load_nodes(path: Path) -> list[Node]:
    """GPU nodes from `openb_node_list_gpu_node.csv` (sn, cpu_milli, memory_mib, gpu, model)."""
    nodes = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            model = row["model"]
            gpus = tuple(Gpu(i, f"{row['sn']}-gpu{i}", model) for i in range(int(row["gpu"])))
            labels = (("gpu-model", model),) if model else ()
            nodes.append(Node(row["sn"], int(row["cpu_milli"]), int(row["memory_mib"]) * MiB, gpus, labels))
    return nodes


def task_from_row(r: dict[str, str]) -> TraceTask:
    """One row of `openb_pod_list_default.csv` (cpu_milli, memory_mib, num_gpu, gpu_milli, ...)."""
    return TraceTask(int(r["cpu_milli"]), int(r["memory_mib"]) * MiB, int(r["num_gpu"]), int(r["gpu_milli"]))


def load_tasks(path: Path) -> list[TraceTask]:
    """Tasks from `openb_pod_list_default.csv`, in file order."""
    with path.open(newline="") as f:
        return [task_from_row(r) for r in csv.DictReader(f)]
