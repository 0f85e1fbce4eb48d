from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_PENDING: _ClassVar[TaskState]
    TASK_STATE_SCHEDULED: _ClassVar[TaskState]
    TASK_STATE_BOUND: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_SUCCEEDED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_PREEMPTED: _ClassVar[TaskState]
    TASK_STATE_CANCELLED: _ClassVar[TaskState]

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_READY: _ClassVar[NodeState]
    NODE_STATE_NOT_READY: _ClassVar[NodeState]
    NODE_STATE_CORDONED: _ClassVar[NodeState]
    NODE_STATE_DRAINING: _ClassVar[NodeState]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_PENDING: TaskState
TASK_STATE_SCHEDULED: TaskState
TASK_STATE_BOUND: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_SUCCEEDED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_PREEMPTED: TaskState
TASK_STATE_CANCELLED: TaskState
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_READY: NodeState
NODE_STATE_NOT_READY: NodeState
NODE_STATE_CORDONED: NodeState
NODE_STATE_DRAINING: NodeState

class Resources(_message.Message):
    __slots__ = ("cpu", "memory", "gpus", "gpu_share", "gpu_milli", "gpu_memory", "gpu_memory_mib", "extended")
    class ExtendedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    EXTENDED_FIELD_NUMBER: _ClassVar[int]
    cpu: str
    memory: str
    gpus: str
    gpu_share: str
    gpu_milli: int
    gpu_memory: str
    gpu_memory_mib: int
    extended: _containers.ScalarMap[str, int]
    def __init__(self, cpu: _Optional[str] = ..., memory: _Optional[str] = ..., gpus: _Optional[str] = ..., gpu_share: _Optional[str] = ..., gpu_milli: _Optional[int] = ..., gpu_memory: _Optional[str] = ..., gpu_memory_mib: _Optional[int] = ..., extended: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Requirement(_message.Message):
    __slots__ = ("key", "operator", "values")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeSelectorTerm(_message.Message):
    __slots__ = ("requirements",)
    REQUIREMENTS_FIELD_NUMBER: _ClassVar[int]
    requirements: _containers.RepeatedCompositeFieldContainer[Requirement]
    def __init__(self, requirements: _Optional[_Iterable[_Union[Requirement, _Mapping]]] = ...) -> None: ...

class PreferredTerm(_message.Message):
    __slots__ = ("weight", "match")
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    weight: int
    match: NodeSelectorTerm
    def __init__(self, weight: _Optional[int] = ..., match: _Optional[_Union[NodeSelectorTerm, _Mapping]] = ...) -> None: ...

class Affinity(_message.Message):
    __slots__ = ("required", "preferred")
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_FIELD_NUMBER: _ClassVar[int]
    required: _containers.RepeatedCompositeFieldContainer[NodeSelectorTerm]
    preferred: _containers.RepeatedCompositeFieldContainer[PreferredTerm]
    def __init__(self, required: _Optional[_Iterable[_Union[NodeSelectorTerm, _Mapping]]] = ..., preferred: _Optional[_Iterable[_Union[PreferredTerm, _Mapping]]] = ...) -> None: ...

class AntiAffinity(_message.Message):
    __slots__ = ("topology_key", "match_labels")
    class MatchLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPOLOGY_KEY_FIELD_NUMBER: _ClassVar[int]
    MATCH_LABELS_FIELD_NUMBER: _ClassVar[int]
    topology_key: str
    match_labels: _containers.ScalarMap[str, str]
    def __init__(self, topology_key: _Optional[str] = ..., match_labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Toleration(_message.Message):
    __slots__ = ("key", "operator", "value", "effect")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    value: str
    effect: str
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ...) -> None: ...

class TaskGroup(_message.Message):
    __slots__ = ("role", "replicas", "command", "env", "resources", "gpu_models", "node_selector", "affinity", "anti_affinity", "tolerations", "image", "gpu_topology")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class NodeSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    GPU_MODELS_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_FIELD_NUMBER: _ClassVar[int]
    ANTI_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    TOLERATIONS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    GPU_TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    role: str
    replicas: int
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    resources: Resources
    gpu_models: _containers.RepeatedScalarFieldContainer[str]
    node_selector: _containers.ScalarMap[str, str]
    affinity: Affinity
    anti_affinity: _containers.RepeatedCompositeFieldContainer[AntiAffinity]
    tolerations: _containers.RepeatedCompositeFieldContainer[Toleration]
    image: str
    gpu_topology: str
    def __init__(self, role: _Optional[str] = ..., replicas: _Optional[int] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., gpu_models: _Optional[_Iterable[str]] = ..., node_selector: _Optional[_Mapping[str, str]] = ..., affinity: _Optional[_Union[Affinity, _Mapping]] = ..., anti_affinity: _Optional[_Iterable[_Union[AntiAffinity, _Mapping]]] = ..., tolerations: _Optional[_Iterable[_Union[Toleration, _Mapping]]] = ..., image: _Optional[str] = ..., gpu_topology: _Optional[str] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("id", "tenant", "queue", "priority", "min_member", "preemptible", "kind", "deadline", "labels", "disruption_budget", "submit_time", "submission_id", "groups", "time_limit", "max_retries")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MIN_MEMBER_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DISRUPTION_BUDGET_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    queue: str
    priority: int
    min_member: int
    preemptible: bool
    kind: str
    deadline: float
    labels: _containers.ScalarMap[str, str]
    disruption_budget: int
    submit_time: float
    submission_id: str
    groups: _containers.RepeatedCompositeFieldContainer[TaskGroup]
    time_limit: float
    max_retries: int
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., queue: _Optional[str] = ..., priority: _Optional[int] = ..., min_member: _Optional[int] = ..., preemptible: _Optional[bool] = ..., kind: _Optional[str] = ..., deadline: _Optional[float] = ..., labels: _Optional[_Mapping[str, str]] = ..., disruption_budget: _Optional[int] = ..., submit_time: _Optional[float] = ..., submission_id: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[TaskGroup, _Mapping]]] = ..., time_limit: _Optional[float] = ..., max_retries: _Optional[int] = ...) -> None: ...

class GpuAssignment(_message.Message):
    __slots__ = ("index", "milli")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MILLI_FIELD_NUMBER: _ClassVar[int]
    index: int
    milli: int
    def __init__(self, index: _Optional[int] = ..., milli: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "index", "role", "state", "node", "gpus", "restarts", "last_restart_reason", "last_restart_time", "retries", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    LAST_RESTART_REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_RESTART_TIME_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    index: int
    role: str
    state: TaskState
    node: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuAssignment]
    restarts: int
    last_restart_reason: str
    last_restart_time: float
    retries: int
    reason: str
    def __init__(self, id: _Optional[str] = ..., index: _Optional[int] = ..., role: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., node: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuAssignment, _Mapping]]] = ..., restarts: _Optional[int] = ..., last_restart_reason: _Optional[str] = ..., last_restart_time: _Optional[float] = ..., retries: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "spec", "state", "tasks", "task_counts", "submit_time")
    class TaskCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNTS_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: JobSpec
    state: JobState
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    task_counts: _containers.ScalarMap[str, int]
    submit_time: float
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., state: _Optional[_Union[JobState, str]] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., task_counts: _Optional[_Mapping[str, int]] = ..., submit_time: _Optional[float] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "model", "memory_mib", "numa_node", "nvlink_peers")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODE_FIELD_NUMBER: _ClassVar[int]
    NVLINK_PEERS_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa_node: int
    nvlink_peers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., memory_mib: _Optional[int] = ..., numa_node: _Optional[int] = ..., nvlink_peers: _Optional[_Iterable[int]] = ...) -> None: ...

class Taint(_message.Message):
    __slots__ = ("key", "value", "effect")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    effect: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "cpu_milli", "memory", "gpus", "labels", "taints", "extended", "state")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ExtendedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TAINTS_FIELD_NUMBER: _ClassVar[int]
    EXTENDED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    cpu_milli: int
    memory: int
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    labels: _containers.ScalarMap[str, str]
    taints: _containers.RepeatedCompositeFieldContainer[Taint]
    extended: _containers.ScalarMap[str, int]
    state: NodeState
    def __init__(self, name: _Optional[str] = ..., cpu_milli: _Optional[int] = ..., memory: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., taints: _Optional[_Iterable[_Union[Taint, _Mapping]]] = ..., extended: _Optional[_Mapping[str, int]] = ..., state: _Optional[_Union[NodeState, str]] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node", "cpu_used_milli", "memory_used", "gpu_used_milli", "task_ids", "heartbeat_age_s", "agent_connected", "limits")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CPU_USED_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    GPU_USED_MILLI_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    AGENT_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    node: Node
    cpu_used_milli: int
    memory_used: int
    gpu_used_milli: _containers.RepeatedScalarFieldContainer[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    heartbeat_age_s: float
    agent_connected: bool
    limits: str
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ..., cpu_used_milli: _Optional[int] = ..., memory_used: _Optional[int] = ..., gpu_used_milli: _Optional[_Iterable[int]] = ..., task_ids: _Optional[_Iterable[str]] = ..., heartbeat_age_s: _Optional[float] = ..., agent_connected: _Optional[bool] = ..., limits: _Optional[str] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("task_id", "stream", "offset", "data")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    stream: str
    offset: int
    data: bytes
    def __init__(self, task_id: _Optional[str] = ..., stream: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
