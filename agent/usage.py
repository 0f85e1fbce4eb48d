"""What the machine uses right now, for heartbeats: CPU and memory (psutil), GPUs (NVML)."""

import contextlib
from typing import Any

import psutil

from gosched.proto.v1 import agent_pb2


class UsageSampler:
    def __init__(self, nvml: Any | None = None) -> None:
        self.nvml = nvml  # an initialised pynvml, or None on a CPU-only node
        self.cpus = psutil.cpu_count(logical=True) or 1
        psutil.cpu_percent(interval=None)  # the first reading only starts the measurement

    def sample(self) -> agent_pb2.NodeUsage:
        busy = psutil.cpu_percent(interval=None) / 100.0
        vm = psutil.virtual_memory()
        return agent_pb2.NodeUsage(
            cpu_used_milli=round(busy * self.cpus * 1000),
            memory_used=int(vm.total - vm.available),
            gpus=self._gpus(),
        )

    def _gpus(self) -> list[agent_pb2.GpuUsage]:
        nvml = self.nvml
        if nvml is None:
            return []
        out = []
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError:
            return []
        for i in range(count):
            # Each query stands alone: a GPU that cannot say one thing still reports the other.
            usage = agent_pb2.GpuUsage(index=i)
            with contextlib.suppress(nvml.NVMLError):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                with contextlib.suppress(nvml.NVMLError):
                    usage.utilization = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
                with contextlib.suppress(nvml.NVMLError):
                    usage.memory_used_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).used) // 2**20
            out.append(usage)
        return out
