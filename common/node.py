"""Node model: machines, their GPUs, labels, taints and readiness."""

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gosched.common.fast_pickle import fast_pickle


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


# Set on the nodes that a real node agent registered (the others are simulated or static).
AGENT_LABEL = "gosched.io/agent"
# Set on a node that can run a task's image: by its agent when docker or podman works there (the
# value says which), "simulated" on simulated nodes. The container_runtime filter keeps tasks with
# an image off the other nodes.
RUNTIME_LABEL = "gosched.io/container-runtime"
# An agent that cannot reach the master retries registering at most this far apart (agent/link.py).
# After a master restart its nodes' agents get this long on top of the node timeout to come back.
AGENT_MAX_BACKOFF_S = 5.0


class NodeState(enum.StrEnum):
    READY = "ready"
    NOT_READY = "not_ready"
    CORDONED = "cordoned"
    DRAINING = "draining"


# The states an operator sets: they outlive the node's agent and a restart of the master.
OPERATOR_STATES = frozenset({NodeState.CORDONED, NodeState.DRAINING})


@fast_pickle
@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


@fast_pickle
@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU. `nvlink_peers` holds indexes of GPUs on the same node linked by NVLink."""

    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int = 0
    numa_node: int = -1  # -1: unknown
    nvlink_peers: tuple[int, ...] = ()


@fast_pickle
@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu_milli: int
    memory: int
    gpus: tuple[Gpu, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    extended: tuple[tuple[str, int], ...] = ()
    state: NodeState = NodeState.READY

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def schedulable(self) -> bool:
        return self.state == NodeState.READY


def make_node(
    name: str,
    cpu_milli: int,
    memory: int,
    *,
    gpus: int = 0,
    gpu_model: str = "",
    gpu_memory_mib: int = 0,
    labels: dict[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    extended: dict[str, int] | None = None,
    state: NodeState = NodeState.READY,
    numa_nodes: int = 1,
    nvlink_pairs: bool = False,
) -> Node:
    """A node with `gpus` identical GPUs spread evenly over `numa_nodes`, optionally NVLinked in pairs."""
    per_numa = max(1, -(-gpus // max(1, numa_nodes)))
    gpu_list = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model=gpu_model,
            memory_mib=gpu_memory_mib,
            numa_node=i // per_numa,
            nvlink_peers=((i ^ 1,) if nvlink_pairs and (i ^ 1) < gpus else ()),
        )
        for i in range(gpus)
    )
    return Node(
        name=name,
        cpu_milli=cpu_milli,
        memory=memory,
        gpus=gpu_list,
        labels=tuple(sorted((labels or {}).items())),
        taints=taints,
        extended=tuple(sorted((extended or {}).items())),
        state=state,
    )


@dataclass(slots=True)
class NodeUsage:
    """Per-node allocation figures for display (from the binder's authoritative arrays)."""

    cpu_used: int = 0
    memory_used: int = 0
    gpu_used_milli: list[int] = field(default_factory=list)


def keep_operator_states(nodes: Sequence[Node], known: Iterable[Node]) -> list[Node]:
    """`nodes` given again (a master restarted over its store with the same static nodes), each
    keeping the cordon or drain that the known node of its name has."""
    held = {n.name: n.state for n in known if n.state in OPERATOR_STATES}
    return [replace(n, state=held[n.name]) if n.name in held else n for n in nodes]
