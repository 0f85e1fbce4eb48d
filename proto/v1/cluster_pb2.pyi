from gosched.proto.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListNodesRequest(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: _types_pb2.NodeState
    def __init__(self, state: _Optional[_Union[_types_pb2.NodeState, str]] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[_types_pb2.NodeInfo]
    def __init__(self, nodes: _Optional[_Iterable[_Union[_types_pb2.NodeInfo, _Mapping]]] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CordonNodeRequest(_message.Message):
    __slots__ = ("name", "uncordon")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNCORDON_FIELD_NUMBER: _ClassVar[int]
    name: str
    uncordon: bool
    def __init__(self, name: _Optional[str] = ..., uncordon: _Optional[bool] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteNodeRequest(_message.Message):
    __slots__ = ("name", "force")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    force: bool
    def __init__(self, name: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteNodeResponse(_message.Message):
    __slots__ = ("name", "requeued_task_ids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    requeued_task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., requeued_task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Queue(_message.Message):
    __slots__ = ("name", "policy", "guarantee", "max_share", "share")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    GUARANTEE_FIELD_NUMBER: _ClassVar[int]
    MAX_SHARE_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    name: str
    policy: str
    guarantee: float
    max_share: float
    share: float
    def __init__(self, name: _Optional[str] = ..., policy: _Optional[str] = ..., guarantee: _Optional[float] = ..., max_share: _Optional[float] = ..., share: _Optional[float] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[Queue]
    def __init__(self, queues: _Optional[_Iterable[_Union[Queue, _Mapping]]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("ready", "nodes", "schedulable_nodes", "cpu_milli", "cpu_used_milli", "memory", "memory_used", "gpu_milli", "gpu_used_milli", "active_jobs", "pending_jobs", "in_flight_units", "rounds", "bound_tasks", "binder_conflicts", "binder_version", "shards", "schedulable_cpu_milli", "schedulable_memory", "schedulable_gpu_milli")
    READY_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_NODES_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    CPU_USED_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    GPU_USED_MILLI_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_JOBS_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_UNITS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    BOUND_TASKS_FIELD_NUMBER: _ClassVar[int]
    BINDER_CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    BINDER_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_GPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    nodes: int
    schedulable_nodes: int
    cpu_milli: int
    cpu_used_milli: int
    memory: int
    memory_used: int
    gpu_milli: int
    gpu_used_milli: int
    active_jobs: int
    pending_jobs: int
    in_flight_units: int
    rounds: int
    bound_tasks: int
    binder_conflicts: int
    binder_version: int
    shards: int
    schedulable_cpu_milli: int
    schedulable_memory: int
    schedulable_gpu_milli: int
    def __init__(self, ready: _Optional[bool] = ..., nodes: _Optional[int] = ..., schedulable_nodes: _Optional[int] = ..., cpu_milli: _Optional[int] = ..., cpu_used_milli: _Optional[int] = ..., memory: _Optional[int] = ..., memory_used: _Optional[int] = ..., gpu_milli: _Optional[int] = ..., gpu_used_milli: _Optional[int] = ..., active_jobs: _Optional[int] = ..., pending_jobs: _Optional[int] = ..., in_flight_units: _Optional[int] = ..., rounds: _Optional[int] = ..., bound_tasks: _Optional[int] = ..., binder_conflicts: _Optional[int] = ..., binder_version: _Optional[int] = ..., shards: _Optional[int] = ..., schedulable_cpu_milli: _Optional[int] = ..., schedulable_memory: _Optional[int] = ..., schedulable_gpu_milli: _Optional[int] = ...) -> None: ...
