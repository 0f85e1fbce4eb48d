from gosched.proto.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("node", "agent_version", "limits")
    NODE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    node: _types_pb2.Node
    agent_version: str
    limits: str
    def __init__(self, node: _Optional[_Union[_types_pb2.Node, _Mapping]] = ..., agent_version: _Optional[str] = ..., limits: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("node_name", "session_id", "heartbeat_interval_s", "expected_task_ids", "log_resume")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    LOG_RESUME_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    session_id: str
    heartbeat_interval_s: float
    expected_task_ids: _containers.RepeatedScalarFieldContainer[str]
    log_resume: _containers.RepeatedCompositeFieldContainer[LogOffset]
    def __init__(self, node_name: _Optional[str] = ..., session_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., expected_task_ids: _Optional[_Iterable[str]] = ..., log_resume: _Optional[_Iterable[_Union[LogOffset, _Mapping]]] = ...) -> None: ...

class LogOffset(_message.Message):
    __slots__ = ("task_id", "stream", "offset")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    stream: str
    offset: int
    def __init__(self, task_id: _Optional[str] = ..., stream: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class GpuUsage(_message.Message):
    __slots__ = ("index", "utilization", "memory_used_mib")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_MIB_FIELD_NUMBER: _ClassVar[int]
    index: int
    utilization: float
    memory_used_mib: int
    def __init__(self, index: _Optional[int] = ..., utilization: _Optional[float] = ..., memory_used_mib: _Optional[int] = ...) -> None: ...

class NodeUsage(_message.Message):
    __slots__ = ("cpu_used_milli", "memory_used", "gpus")
    CPU_USED_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    cpu_used_milli: int
    memory_used: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuUsage]
    def __init__(self, cpu_used_milli: _Optional[int] = ..., memory_used: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuUsage, _Mapping]]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("time", "usage", "running_task_ids")
    TIME_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    time: float
    usage: NodeUsage
    running_task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, time: _Optional[float] = ..., usage: _Optional[_Union[NodeUsage, _Mapping]] = ..., running_task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TaskStatus(_message.Message):
    __slots__ = ("task_id", "state", "exit_code", "message", "time", "restarts", "last_exit_time", "stdout_start", "stderr_start", "previous_stdout_start", "previous_stderr_start")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    LAST_EXIT_TIME_FIELD_NUMBER: _ClassVar[int]
    STDOUT_START_FIELD_NUMBER: _ClassVar[int]
    STDERR_START_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STDOUT_START_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STDERR_START_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    state: _types_pb2.TaskState
    exit_code: int
    message: str
    time: float
    restarts: int
    last_exit_time: float
    stdout_start: int
    stderr_start: int
    previous_stdout_start: int
    previous_stderr_start: int
    def __init__(self, task_id: _Optional[str] = ..., state: _Optional[_Union[_types_pb2.TaskState, str]] = ..., exit_code: _Optional[int] = ..., message: _Optional[str] = ..., time: _Optional[float] = ..., restarts: _Optional[int] = ..., last_exit_time: _Optional[float] = ..., stdout_start: _Optional[int] = ..., stderr_start: _Optional[int] = ..., previous_stdout_start: _Optional[int] = ..., previous_stderr_start: _Optional[int] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("node_name", "session_id", "heartbeat", "task_status", "log", "node_update")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    TASK_STATUS_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    NODE_UPDATE_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    session_id: str
    heartbeat: Heartbeat
    task_status: TaskStatus
    log: _types_pb2.LogChunk
    node_update: _types_pb2.Node
    def __init__(self, node_name: _Optional[str] = ..., session_id: _Optional[str] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., task_status: _Optional[_Union[TaskStatus, _Mapping]] = ..., log: _Optional[_Union[_types_pb2.LogChunk, _Mapping]] = ..., node_update: _Optional[_Union[_types_pb2.Node, _Mapping]] = ...) -> None: ...

class LaunchTask(_message.Message):
    __slots__ = ("task_id", "job_id", "index", "role", "command", "env", "cpu_milli", "memory", "gpus", "attempt", "service", "image", "time_limit_s", "num_tasks", "role_index", "role_replicas", "task_hosts", "leader_port")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    NUM_TASKS_FIELD_NUMBER: _ClassVar[int]
    ROLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ROLE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TASK_HOSTS_FIELD_NUMBER: _ClassVar[int]
    LEADER_PORT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    job_id: str
    index: int
    role: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    cpu_milli: int
    memory: int
    gpus: _containers.RepeatedCompositeFieldContainer[_types_pb2.GpuAssignment]
    attempt: int
    service: bool
    image: str
    time_limit_s: float
    num_tasks: int
    role_index: int
    role_replicas: int
    task_hosts: _containers.RepeatedScalarFieldContainer[str]
    leader_port: int
    def __init__(self, task_id: _Optional[str] = ..., job_id: _Optional[str] = ..., index: _Optional[int] = ..., role: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., cpu_milli: _Optional[int] = ..., memory: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[_types_pb2.GpuAssignment, _Mapping]]] = ..., attempt: _Optional[int] = ..., service: _Optional[bool] = ..., image: _Optional[str] = ..., time_limit_s: _Optional[float] = ..., num_tasks: _Optional[int] = ..., role_index: _Optional[int] = ..., role_replicas: _Optional[int] = ..., task_hosts: _Optional[_Iterable[str]] = ..., leader_port: _Optional[int] = ...) -> None: ...

class KillTask(_message.Message):
    __slots__ = ("task_id", "grace_period_s", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    grace_period_s: float
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., grace_period_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class SchedulerMessage(_message.Message):
    __slots__ = ("launch", "kill")
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    KILL_FIELD_NUMBER: _ClassVar[int]
    launch: LaunchTask
    kill: KillTask
    def __init__(self, launch: _Optional[_Union[LaunchTask, _Mapping]] = ..., kill: _Optional[_Union[KillTask, _Mapping]] = ...) -> None: ...
