"""Machine discovery: real OS figures; NVML's not-installed and not-supported paths.

NVML itself cannot run without an NVIDIA driver, so its error paths are driven by a small stand-in
with NVML's own error classes (pynvml's), answering some queries and refusing others.
"""

from types import SimpleNamespace
from typing import Any

import psutil
import pynvml

from gosched.agent.discovery import discover, discover_gpus, load_nvml


class FakeNvml:
    """Two GPUs; NUMA, NVLink and temperature unsupported (as in many VMs)."""

    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_NVLINK_MAX_LINKS = 4

    def __init__(self, nvlink: bool = False) -> None:
        self.nvlink = nvlink

    def _unsupported(self, *_: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    nvmlDeviceGetNumaNodeId = _unsupported
    nvmlDeviceGetTemperature = _unsupported
    nvmlDeviceGetCpuAffinity = _unsupported

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=80 * 2**30, used=2**30)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=7)

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=f"00000000:0{h}:00.0")

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        return (0, 0)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if not self.nvlink:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link > 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=f"00000000:0{1 - h}:00.0")


def test_no_nvidia_library_means_a_cpu_only_node() -> None:
    nvml, status = load_nvml()
    if nvml is not None:  # a machine with a driver: the real path ran instead
        return
    assert "NVML" in status or "not installed" in status
    info = discover(None, status)
    assert info.gpus == [] and info.nvml_status == status
    assert info.cpu_count == psutil.cpu_count(logical=True)
    assert info.memory_bytes == psutil.virtual_memory().total
    node = info.to_node(labels={"zone": "a"})
    assert node.cpu_milli == info.cpu_count * 1000 and dict(node.labels)["zone"] == "a"


def test_unsupported_queries_are_unknown_not_fatal() -> None:
    gpus, driver, cuda = discover_gpus(FakeNvml())
    assert driver == "550.54" and cuda == "12.4"
    assert [g.uuid for g in gpus] == ["GPU-0", "GPU-1"]
    g = gpus[0]
    assert g.name == "NVIDIA H100 80GB HBM3" and g.memory_total_mib == 80 * 1024 and g.utilization_pct == 7
    assert g.numa_node is None and g.temperature_c is None and g.nvlink_peers is None
    assert any(u.startswith("numa node") for u in g.unsupported)
    assert g.mig_enabled is False


def test_nvlink_peers_resolved_by_pci_bus() -> None:
    gpus, _, _ = discover_gpus(FakeNvml(nvlink=True))
    assert gpus[0].nvlink_peers == [1] and gpus[1].nvlink_peers == [0]


def test_discovered_labels_and_gpus_in_the_node() -> None:
    info = discover(FakeNvml(nvlink=True), "ok")
    node = info.to_node(name="n1")
    labels = dict(node.labels)
    assert labels["gosched.io/gpu-count"] == "2" and labels["gosched.io/cuda-driver"] == "12.4"
    assert labels["gosched.io/gpu-model"] == "NVIDIA-H100-80GB-HBM3"
    assert [g.nvlink_peers for g in node.gpus] == [(1,), (0,)] and node.gpus[0].numa_node == -1
