"""What this machine has: CPUs and memory from the OS (psutil), GPUs through NVML (nvidia-ml-py).

Every NVML query stands alone: one the driver does not support (NUMA and NVLink often are not, in
VMs) is recorded as unknown, never a crash. Without an NVIDIA library the node is CPU-only, said
once in the log.
"""

import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

import psutil

from gosched.common.node import Gpu, Node, Taint, make_node

log = logging.getLogger("gosched.agent")
T = TypeVar("T")
# 64-bit words needed to hold a CPU mask for every CPU of this machine.
AFFINITY_WORDS = max(1, ((os.cpu_count() or 1) + 63) // 64)


@dataclass(slots=True)
class GpuInfo:
    index: int
    uuid: str = ""
    name: str = ""
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    pci_bus_id: str = ""
    numa_node: int | None = None
    cpu_affinity: list[int] | None = None
    nvlink_peers: list[int] | None = None  # indexes of GPUs linked by NVLink; None: unknown
    mig_enabled: bool | None = None
    mig_devices: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)  # queries the driver could not answer


@dataclass(slots=True)
class MachineInfo:
    hostname: str
    cpu_count: int
    memory_bytes: int
    load_avg: tuple[float, float, float]
    gpus: list[GpuInfo]
    driver_version: str = ""
    cuda_driver_version: str = ""
    nvml_status: str = ""  # "ok" (and the GPUs left out, with why), or why there are no GPUs

    def to_node(
        self,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        taints: tuple[Taint, ...] = (),
        extended: Mapping[str, int] | None = None,
    ) -> Node:
        """The node record the agent registers: discovered facts merged with configured labels, and
        the extended resources the operator says this machine has (the agent cannot count them)."""
        discovered: dict[str, str] = {"gosched.io/hostname": self.hostname}
        if self.gpus:
            discovered["gosched.io/gpu-count"] = str(len(self.gpus))
            discovered["gosched.io/gpu-model"] = _label_value(self.gpus[0].name)
        if self.cuda_driver_version:
            discovered["gosched.io/cuda-driver"] = _label_value(self.cuda_driver_version)
        node = make_node(
            name or self.hostname,
            self.cpu_count * 1000,
            self.memory_bytes,
            labels={**discovered, **(labels or {})},
            taints=taints,
            extended=dict(extended or {}),
        )
        gpus = tuple(
            Gpu(
                index=g.index,
                uuid=g.uuid,
                model=g.name,
                memory_mib=g.memory_total_mib or 0,
                numa_node=-1 if g.numa_node is None else g.numa_node,
                nvlink_peers=tuple(g.nvlink_peers or ()),
            )
            for g in self.gpus
        )
        return Node(
            node.name, node.cpu_milli, node.memory, gpus, node.labels, node.taints, node.extended, node.state
        )


def _label_value(text: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in text.strip())[:63]
    return cleaned.strip("-_.")


def _ask(unsupported: list[str], what: str, nvml: Any, call: Callable[..., T], *args: object) -> T | None:
    """One NVML query; any NVML error makes the answer unknown (recorded), never a crash."""
    try:
        return call(*args)
    except nvml.NVMLError as exc:
        unsupported.append(f"{what}: {exc}")
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover_gpus(nvml: Any, skipped: list[str] | None = None) -> tuple[list[GpuInfo], str, str]:
    """GPUs as NVML reports them, with driver and CUDA driver versions. NVML must be initialised.
    A GPU NVML cannot open (lost, no permission) is left out, the others keep their NVML indexes;
    why it was left out goes into `skipped`."""
    bad: list[str] = []
    driver = _ask(bad, "driver version", nvml, nvml.nvmlSystemGetDriverVersion)
    cuda = _ask(bad, "cuda driver version", nvml, nvml.nvmlSystemGetCudaDriverVersion)
    cuda_text = "" if cuda is None else f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
    count = int(nvml.nvmlDeviceGetCount())
    lost: list[str] = []
    handles = {i: _ask(lost, f"GPU {i}", nvml, nvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)}
    if lost:
        log.warning("GPUs left out (NVML cannot open them): %s", "; ".join(lost))
        if skipped is not None:
            skipped.extend(lost)
    opened = [(i, h) for i, h in handles.items() if h is not None]
    gpus: list[GpuInfo] = []
    bus_to_index: dict[str, int] = {}
    for i, h in opened:
        g = GpuInfo(index=i)
        u = g.unsupported
        g.uuid = _text(_ask(u, "uuid", nvml, nvml.nvmlDeviceGetUUID, h) or "")
        g.name = _text(_ask(u, "name", nvml, nvml.nvmlDeviceGetName, h) or "")
        mem = _ask(u, "memory", nvml, nvml.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            g.memory_total_mib, g.memory_used_mib = int(mem.total) // 2**20, int(mem.used) // 2**20
        util = _ask(u, "utilization", nvml, nvml.nvmlDeviceGetUtilizationRates, h)
        g.utilization_pct = None if util is None else int(util.gpu)
        g.temperature_c = _ask(
            u, "temperature", nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU
        )
        pci = _ask(u, "pci", nvml, nvml.nvmlDeviceGetPciInfo, h)
        g.pci_bus_id = "" if pci is None else _text(pci.busId)
        g.numa_node = _ask(u, "numa node", nvml, nvml.nvmlDeviceGetNumaNodeId, h)
        affinity = _ask(u, "cpu affinity", nvml, nvml.nvmlDeviceGetCpuAffinity, h, AFFINITY_WORDS)
        if affinity is not None:
            g.cpu_affinity = [
                w * 64 + b for w, mask in enumerate(affinity) for b in range(64) if int(mask) >> b & 1
            ]
        mig = _ask(u, "mig mode", nvml, nvml.nvmlDeviceGetMigMode, h)
        if mig is not None:
            g.mig_enabled = bool(mig[0])
            if g.mig_enabled:
                g.mig_devices = _mig_devices(nvml, h, u)
        if g.pci_bus_id:
            bus_to_index[g.pci_bus_id.lower()] = i
        gpus.append(g)
    switched: list[int] = []  # GPUs with a link to an NVSwitch
    for g, (_, h) in zip(gpus, opened, strict=True):
        g.nvlink_peers, on_switch = _nvlink_peers(nvml, h, bus_to_index, g.unsupported)
        if on_switch:
            switched.append(g.index)
    for g in gpus:  # through the switches, each of those GPUs reaches all the others
        if g.index in switched:
            g.nvlink_peers = sorted({*(g.nvlink_peers or ()), *switched} - {g.index})
    if bad:
        log.info("NVML could not answer: %s", "; ".join(bad))
    return gpus, _text(driver or ""), cuda_text


def _mig_devices(nvml: Any, handle: object, unsupported: list[str]) -> list[str]:
    count = _ask(unsupported, "mig device count", nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle)
    out = []
    for i in range(int(count or 0)):
        mig = _ask(
            unsupported,
            f"mig device {i}",
            nvml,
            nvml.nvmlDeviceGetMigDeviceHandleByIndex,
            handle,
            i,
        )
        if mig is not None:
            uuid = _ask(unsupported, f"mig device {i} uuid", nvml, nvml.nvmlDeviceGetUUID, mig)
            if uuid:
                out.append(_text(uuid))
    return out


def _nvlink_peers(
    nvml: Any, handle: object, bus_to_index: dict[str, int], unsupported: list[str]
) -> tuple[list[int] | None, bool]:
    """The GPUs this one is linked to directly (None: unknown), and whether a link goes to an
    NVSwitch: there the remote PCI info is the switch's, which names no GPU."""
    peers: set[int] = set()
    answered = on_switch = False
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                answered = True
                continue
            if _remote_is_switch(nvml, handle, link):
                answered = on_switch = True
                continue
            remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
        except nvml.NVMLError as exc:
            if not answered and link == 0:
                unsupported.append(f"nvlink: {exc}")
                return None, False
            break  # links past the last one the device has
        answered = True
        peer = bus_to_index.get(_text(remote.busId).lower())
        if peer is not None:
            peers.add(peer)
    return (sorted(peers) if answered else None), on_switch


def _remote_is_switch(nvml: Any, handle: object, link: int) -> bool:
    """Does the link end at an NVSwitch? No when NVML cannot say (the query is unsupported, or
    the library is too old to have it): the remote PCI info is then taken as a GPU's."""
    query = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
    if query is None:
        return False
    try:
        kind = query(handle, link)
    except nvml.NVMLError:
        return False
    return bool(kind == getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2))


def load_nvml() -> tuple[ModuleType | None, str]:
    """The initialised pynvml module, or None and why (no package, no library, no driver)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML unavailable: {exc}"
    return pynvml, "ok"


def discover(nvml: Any | None = None, nvml_status: str = "") -> MachineInfo:
    """This machine. Pass an initialised `nvml` (or None to load pynvml here)."""
    if nvml is None and not nvml_status:
        nvml, nvml_status = load_nvml()
    gpus: list[GpuInfo] = []
    driver = cuda = ""
    if nvml is not None:
        try:
            skipped: list[str] = []
            gpus, driver, cuda = discover_gpus(nvml, skipped)
            nvml_status = "ok" if not skipped else f"ok; left out {'; '.join(skipped)}"
        except nvml.NVMLError as exc:
            nvml_status = f"NVML failed: {exc}"
    if not gpus:
        log.info("no NVIDIA GPUs: a CPU-only node (%s)", nvml_status)
    return MachineInfo(
        hostname=socket.gethostname(),
        cpu_count=psutil.cpu_count(logical=True) or 1,
        memory_bytes=int(psutil.virtual_memory().total),
        load_avg=tuple(os.getloadavg()),  # type: ignore[arg-type]
        gpus=gpus,
        driver_version=driver,
        cuda_driver_version=cuda,
        nvml_status=nvml_status,
    )
