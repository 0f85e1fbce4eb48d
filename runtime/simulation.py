"""Simulated nodes and workloads for tests, benchmarks and the local demo."""

import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from gosched.common.job import Job, TaskGroup
from gosched.common.node import RUNTIME_LABEL, Gpu, Node, make_node
from gosched.common.resources import ResourceRequest

if TYPE_CHECKING:  # runtime.control imports much; the type is all this needs
    from gosched.runtime.control import ControlPlane

GiB = 2**30


def sim_nodes(count: int, *, gpu_every: int = 4, prefix: str = "sim", zones: int = 4) -> list[Node]:
    """`count` nodes: CPU nodes (32 cores, 128 GiB) and, one in `gpu_every`, 8-GPU nodes with NUMA/NVLink."""
    nodes = []
    for i in range(count):
        labels = {"zone": f"z{i % zones}", "node-type": "cpu", RUNTIME_LABEL: "simulated"}
        if gpu_every and i % gpu_every == 0:
            labels["node-type"] = "gpu"
            nodes.append(
                make_node(
                    f"{prefix}-{i:05d}",
                    96_000,
                    768 * GiB,
                    gpus=8,
                    gpu_model="A100",
                    gpu_memory_mib=81_920,
                    labels=labels,
                    numa_nodes=2,
                    nvlink_pairs=True,
                )
            )
        else:
            nodes.append(make_node(f"{prefix}-{i:05d}", 32_000, 128 * GiB, labels=labels))
    return nodes


def hgx_node(name: str, *, numa_known: bool = True, labels: dict[str, str] | None = None) -> Node:
    """An 8-GPU H100 SXM server as its agent registers it: 2 sockets, GPUs 0-3 on NUMA node 0 and
    4-7 on NUMA node 1, each GPU NVLinked to every other through the NVSwitches (discovery lists
    them as peers). `numa_known=False`: as on a VM or a driver that reports no NUMA node (-1)."""
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model="NVIDIA H100 80GB HBM3",
            memory_mib=81_559,
            numa_node=i // 4 if numa_known else -1,
            nvlink_peers=tuple(p for p in range(8) if p != i),
        )
        for i in range(8)
    )
    node_labels = {"node-type": "gpu", RUNTIME_LABEL: "simulated", **(labels or {})}
    return Node(
        name=name, cpu_milli=224_000, memory=2048 * GiB, gpus=gpus, labels=tuple(sorted(node_labels.items()))
    )


def drop_stale_simulated(control: "ControlPlane", given: Sequence[Node]) -> list[str]:
    """Remove the simulated nodes an earlier start left in the store and this one does not give
    again (a restart without --sim-nodes, or with fewer): nothing runs their tasks now, so tasks
    bound there would stay bound for ever. Their tasks are queued again, as at a node's loss.
    Returns the names removed."""
    keep = {n.name for n in given}
    stale = [
        snap.node.name
        for snap in control.nodes()
        if snap.node.name not in keep and dict(snap.node.labels).get(RUNTIME_LABEL) == "simulated"
    ]
    for name in stale:
        control.remove_node(name)
    return stale


def basic_jobs(
    count: int, *, prefix: str = "job", cpu_milli: int = 500, memory: int = GiB, start: int = 0
) -> list[Job]:
    """SchedulingBasic-style single-task jobs with identical requests (kube scheduler_perf's shape)."""
    group = TaskGroup(
        role="main",
        replicas=1,
        resources=ResourceRequest(cpu_milli=cpu_milli, memory=memory),
        command=("sleep", "60"),
    )
    groups = (group,)
    return [Job(id=f"{prefix}-{i}", groups=groups) for i in range(start, start + count)]


def mixed_jobs(count: int, *, seed: int = 0, prefix: str = "mix") -> Iterator[Job]:
    """A GPU-heavy mix: CPU tasks, GPU shares, 1/2/4/8-GPU tasks and small gangs."""
    rng = random.Random(seed)
    for i in range(count):
        kind = rng.random()
        if kind < 0.4:
            req = ResourceRequest(cpu_milli=rng.choice([500, 1000, 2000]), memory=rng.choice([1, 2, 4]) * GiB)
            replicas = 1
        elif kind < 0.6:
            req = ResourceRequest(cpu_milli=1000, memory=4 * GiB, gpu_milli=rng.choice([250, 500]))
            replicas = 1
        else:
            req = ResourceRequest(cpu_milli=4000, memory=32 * GiB, gpus=rng.choice([1, 1, 2, 4, 8]))
            replicas = rng.choice([1, 1, 2, 4])
        group = TaskGroup(role="main", replicas=replicas, resources=req, command=("sleep", "60"))
        yield Job(id=f"{prefix}-{i}", groups=(group,), min_member=replicas, priority=rng.randint(0, 100))
