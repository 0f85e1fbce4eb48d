"""GoSched configuration: one YAML file, then environment variables (GOSCHED_*), then flags.

Validated at load with errors that name the field. Every component reads its part of it. Merged
key by key: a nested env var or flag changes one key of a section; lists are replaced whole. The
profile's plugin names, and that its filters include those the binder checks again, are checked by
the CLI (`cli/master_cmds.checked_settings`), not here: the plugins live in the shard's package.
"""

import difflib
import enum
import logging
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from gosched.common.secret_files import check_key_pair, read_certificates, read_tokens
from gosched.common.strict_yaml import DuplicateKeyError, load_yaml

# Queue, tenant and role names: lower-case DNS-label-like words.
log = logging.getLogger(__name__)

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"


_NULL_WORDS = frozenset({"null", "none", "~"})


def _number_kinds(annotation: Any) -> tuple[bool, bool]:
    """(whether a field of this annotation takes a number and no boolean, whether it takes None)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    args = typing.get_args(annotation) if union else ()
    kinds = set(args or (annotation,))
    takes_none = type(None) in kinds
    kinds.discard(type(None))
    return bool(kinds) and kinds <= {int, float}, takes_none


class _Strict(BaseModel):
    """What pydantic's lax mode would take and no one means: a boolean for a number (`true` read
    as 1: a TTL of a second), and, from the environment, where None is allowed, no way to say it
    (GOSCHED_FINISHED_JOB_TTL_S=null was "not a number"): "null", "none" and "~" are None there."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None:
            return value
        number, takes_none = _number_kinds(field.annotation)
        if takes_none and isinstance(value, str) and value.strip().lower() in _NULL_WORDS:
            return None
        if number and isinstance(value, bool):
            raise ValueError(f"must be a number, not a boolean ({str(value).lower()})")
        return value


class QueuePolicy(enum.StrEnum):
    FIFO = "fifo"
    PRIORITY = "priority"  # priority with aging
    DRF = "drf"  # dominant resource fairness across tenants
    FAIR = "fair"  # weighted fair share across tenants
    DEADLINE = "deadline"  # earliest latest start (deadline less time_limit), then earliest deadline


class QueueConfig(_Strict):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=63, pattern=NAME_PATTERN)
    policy: QueuePolicy = QueuePolicy.FIFO
    # Capacity: share of the cluster (dominant resource) guaranteed to the queue, and its cap.
    guarantee: float = Field(default=0.0, ge=0.0, le=1.0)
    max_share: float = Field(default=1.0, gt=0.0, le=1.0)
    # Effective priority rises by this much per second of waiting (priority policy).
    aging_per_s: float = Field(default=1.0, ge=0.0)
    # Waiting counts toward aging for this long at most (Slurm's PriorityMaxAge, 7 days by
    # default): a job that has waited longer ages no more, so no wait outranks every priority.
    aging_max_s: float = Field(default=7 * 86_400.0, ge=0.0)
    # fifo, priority, deadline: a job that has waited this long and fits nowhere only because nodes
    # are busy reserves the queue: the jobs behind it wait until it starts, so the room the queue
    # frees gathers for it (dispatcher/reservation.py). None: never (small jobs may starve a big one).
    reserve_after_s: float | None = Field(default=300.0, ge=0.0)
    # Tenant weights for drf / fair; tenants not listed weigh 1.
    tenant_weights: dict[str, float] = Field(default_factory=dict)
    # A job the queue's max_share holds back may evict the queue's own lower-priority preemptible
    # tasks to get within it (Kueue's withinClusterQueue: LowerPriority; YARN's intra-queue
    # preemption). "never" (the default, as theirs): it waits for the queue's usage to fall. In a
    # fifo queue an evicted job returns to its place in line and waits there at the cap, holding
    # the later jobs back: use policy priority for priority to order the queue.
    within_queue_preemption: Literal["never", "lower_priority"] = "never"

    @model_validator(mode="after")
    def _guarantee_below_max(self) -> "QueueConfig":
        if self.guarantee > self.max_share:
            raise ValueError(
                f"queue {self.name}: guarantee {self.guarantee} exceeds max_share {self.max_share}"
            )
        return self

    @field_validator("tenant_weights")
    @classmethod
    def _positive_weights(cls, v: dict[str, float]) -> dict[str, float]:
        for tenant, w in v.items():
            # A job's tenant has the queue-name syntax (common/spec.py): any other key never matches.
            if not (len(tenant) <= 63 and re.fullmatch(NAME_PATTERN, tenant)):
                raise ValueError(
                    f"tenant_weights[{tenant!r}]: not a valid tenant name (1-63 lowercase letters, "
                    "digits, '-', '_', '.', starting and ending with a letter or digit)"
                )
            if not (math.isfinite(w) and w > 0):  # `w <= 0` alone lets NaN through
                raise ValueError(f"weight of tenant {tenant!r} must be a finite number > 0, got {w}")
        return v


class AdmissionConfig(_Strict):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_pending_jobs: int = Field(default=1_000_000, ge=1)
    # Jobs of one tenant submitted and not yet ended, pending or running (Slurm's
    # MaxSubmitJobsPerUser): one tenant cannot fill the global pending limit alone. None: no limit.
    # Jobs of queues no longer configured (kept apart at a restart, never scheduled) do not count.
    max_jobs_per_tenant: int | None = Field(default=None, ge=1)
    tenant_rate_per_s: float = Field(default=100_000.0, gt=0)  # token bucket refill
    tenant_burst: int = Field(default=1_000_000, ge=1)


class PluginWeight(_Strict):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str
    weight: float = Field(default=1.0, ge=0.0)


DEFAULT_FILTERS = [
    "node_ready",
    "resources_fit",
    "gpu_model",
    "gpu_memory",
    "gpu_topology_hardware",  # both: only for tasks whose gpu_topology mode is a required one
    "gpu_topology_fit",
    "node_selector",
    "node_affinity",
    "container_runtime",
    "taint_toleration",
    "anti_affinity",
]
DEFAULT_SCORES = [
    PluginWeight(name="most_allocated", weight=1.0),
    PluginWeight(name="balanced_allocation", weight=1.0),
    PluginWeight(name="gpu_topology", weight=2.0),
    PluginWeight(name="gpu_fragmentation", weight=2.0),
    # Tasks that want no GPU stay off GPU nodes while others fit: weighted to outweigh bin-packing
    # (see scheduler_shard/plugins/gpu_node_avoidance.py).
    PluginWeight(name="gpu_node_avoidance", weight=3.0),
    PluginWeight(name="preferred_affinity", weight=1.0),
    PluginWeight(name="taint_prefer_no_schedule", weight=1.0),
]


class ProfileConfig(_Strict):
    """A shard profile: plugins as plain lists of names (and weights for scores)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = "default"
    locating: list[str] = Field(default_factory=lambda: ["partition_first"])
    grouping: list[str] = Field(default_factory=lambda: ["topology_domain"])
    filters: list[str] = Field(default_factory=lambda: list(DEFAULT_FILTERS))
    scores: list[PluginWeight] = Field(default_factory=lambda: list(DEFAULT_SCORES))
    victim_searching: list[str] = Field(default_factory=lambda: ["priority_victims", "capacity_reclaim"])
    candidate_sorting: list[str] = Field(default_factory=lambda: ["lexicographic"])
    preemption: bool = True


MINIMAL_PROFILE = ProfileConfig(
    name="minimal",
    locating=["partition_first"],
    grouping=[],
    # The filters the binder checks again (scheduler_shard/framework/profile.py REQUIRED_FILTERS);
    # anti_affinity costs nothing for a task without such rules.
    filters=["node_ready", "resources_fit", "anti_affinity"],
    scores=[],
    victim_searching=[],
    candidate_sorting=[],
    preemption=False,
)


class Settings(BaseSettings, _Strict):
    """Everything configurable. Sources, lowest first: defaults, YAML file, env (GOSCHED_*), flags."""

    model_config = SettingsConfigDict(
        env_prefix="GOSCHED_", env_nested_delimiter="__", extra="forbid", allow_inf_nan=False
    )

    store_path: str = "gosched.db"
    shards: int = Field(default=2, ge=1, le=256)
    batch_size: int = Field(default=512, ge=1, le=100_000)
    queues: list[QueueConfig] = Field(default_factory=lambda: [QueueConfig(name="default")])
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    profile: ProfileConfig = Field(default_factory=ProfileConfig)
    # Seconds an unschedulable unit waits before it is tried again (doubles per attempt, capped).
    retry_backoff_s: float = Field(default=0.05, ge=0.0)
    retry_backoff_max_s: float = Field(default=5.0, ge=0.0)
    # A unit found unschedulable waits for a change that may make room (a release, a node, more
    # capacity); this is how long after its last attempt it is retried anyway, on an unchanged
    # cluster, in case a change went unnoticed. Longer than the backoff cap: a backlog of units
    # that fit nowhere costs one attempt each per interval (kube-scheduler waits 5 min).
    unschedulable_retry_s: float = Field(default=60.0, ge=0.0)
    # A failed task its job runs again (max_retries) waits this long before its job is queued
    # again, doubling with each retry of that task, capped: a task that fails at once is not
    # started again and again without a pause (Kubernetes' restart backoff: 10 s doubling to 5 min).
    failure_backoff_s: float = Field(default=10.0, ge=0.0)
    failure_backoff_max_s: float = Field(default=300.0, ge=0.0)
    # A job with a deadline that could no longer end by it (started now, its time_limit would run
    # past it; without one, the deadline itself has passed) is not started but cancelled, and one
    # submitted so is refused, as Slurm's --deadline. False: deadlines only order a deadline queue.
    end_missed_deadlines: bool = True
    # A finished job is purged from the store this long after its last task ended, once it is also
    # past the newest 100,000 finished (those stay queryable), as Kubernetes' ttlSecondsAfterFinished:
    # without it the store grows with every job and a restart reads every row. Its spec and task
    # rows go; its id and submission id stay taken (a tombstone). None: keep every job.
    finished_job_ttl_s: float | None = Field(default=7 * 86_400.0, gt=0.0)
    # The master process (gosched master / up).
    runtime: Literal["ray", "local"] = "ray"  # components as Ray actors, or all in the master process
    ray_address: str | None = None  # join this Ray cluster; None: this machine's if one runs, else start one
    grpc_port: int = Field(default=9090, ge=0, le=65535)
    http_port: int = Field(default=8080, ge=0, le=65535)
    # Threads serving gRPC. Each agent's stream, WatchJob and followed StreamLogs holds one while it
    # lasts; watchers may take a quarter, so the calls and the agents always find one free.
    grpc_workers: int = Field(default=512, ge=16, le=100_000)
    log_dir: str | None = None  # task output shipped by agents; None: beside the store
    heartbeat_interval_s: float = Field(default=1.0, gt=0.0, le=60.0)
    # An agent silent this long loses its node: not ready, its tasks queued again.
    node_timeout_s: float = Field(default=10.0, gt=0.0)
    # Securing the gRPC API (none set: plaintext, no tokens). TLS: the server's PEM certificate
    # (chain) and key, both or neither; with tls_client_ca, mutual TLS: clients and agents must
    # present a certificate signed by it. Token files hold one token a line (several, to rotate):
    # api_token_file guards JobService, ClusterService and reflection, agent_token_file the
    # AgentService; health stays open for probes.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    api_token_file: str | None = None
    agent_token_file: str | None = None

    @field_validator("queues")
    @classmethod
    def _some_queue(cls, v: list[QueueConfig]) -> list[QueueConfig]:
        # Every job names a queue ("default" unless it says otherwise): with none, no submission passes.
        if not v:
            raise ValueError("needs at least one queue (jobs go to 'default' unless they name another)")
        return v

    @model_validator(mode="after")
    def _unique_queues(self) -> "Settings":
        names = [q.name for q in self.queues]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"queues: duplicate queue name(s) {', '.join(dupes)}")
        total = sum(q.guarantee for q in self.queues)
        if total > 1.0 + 1e-9:
            raise ValueError(f"queues: guarantees add up to {total:.2f}, more than the whole cluster (1.0)")
        return self

    @model_validator(mode="after")
    def _backoff_cap_above_base(self) -> "Settings":
        for base, cap in (
            ("retry_backoff_s", "retry_backoff_max_s"),
            ("failure_backoff_s", "failure_backoff_max_s"),
        ):
            if getattr(self, cap) < getattr(self, base):
                raise ValueError(
                    f"{cap} ({getattr(self, cap)}) is below {base} ({getattr(self, base)}): "
                    "the cap would cut every backoff to it"
                )
        return self

    @model_validator(mode="after")
    def _timeout_spans_heartbeats(self) -> "Settings":
        if self.node_timeout_s < 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"node_timeout_s ({self.node_timeout_s}) must be at least twice heartbeat_interval_s "
                f"({self.heartbeat_interval_s}), or one late heartbeat loses a node"
            )
        return self

    @field_validator("api_token_file", "agent_token_file")
    @classmethod
    def _token_file_readable(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None:
            read_tokens(v, str(info.field_name))
        return v

    @field_validator("tls_client_ca")
    @classmethod
    def _client_ca_readable(cls, v: str | None) -> str | None:
        if v is not None:
            read_certificates(v, "tls_client_ca")
        return v

    @model_validator(mode="after")
    def _tls_pair(self) -> "Settings":
        # Checked here, not by gRPC: a bad certificate there fails as a port it cannot bind.
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("tls_cert", "tls_key") if self.tls_key is None else ("tls_key", "tls_cert")
            raise ValueError(f"{missing}: must be set with {given} (TLS needs both, plaintext neither)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca: needs tls_cert and tls_key (mutual TLS is TLS)")
        if self.tls_cert is not None and self.tls_key is not None:
            check_key_pair(self.tls_cert, self.tls_key, "tls_cert", "tls_key")
        return self

    def queue(self, name: str) -> QueueConfig:
        for q in self.queues:
            if q.name == name:
                return q
        raise KeyError(name)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) win over env, env over the YAML file (read in load_settings).
        return (init_settings, env_settings)


def load_settings(
    path: str | Path | None = None, *, defaults: dict[str, Any] | None = None, **overrides: Any
) -> Settings:
    """Load settings from an optional YAML file (or $GOSCHED_CONFIG), env vars, and flag overrides,
    over a command's own `defaults` (below the file: `gosched up` runs 4 shards unless told)."""
    file_values: dict[str, Any] = {}
    source = path or os.environ.get("GOSCHED_CONFIG")
    if source:
        text = Path(source).read_text()
        try:
            loaded = load_yaml(text) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{source}: not valid YAML: {yaml_problem(exc)}") from None
        except DuplicateKeyError as exc:
            raise ValueError(f"{source}: {exc}: the last would silently win") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{source}: the config file must hold a mapping at the top level")
        file_values = loaded
    # The env's raw values, checked once merged: checked alone, against the defaults, a pair
    # such as node_timeout_s and the file's heartbeat_interval_s would be judged apart.
    env_values = EnvSettingsSource(Settings)() if env_has_settings() else {}
    _warn_unknown_env()
    merged = _deep_merge(_deep_merge(defaults or {}, file_values), env_values)
    merged = _deep_merge(merged, {k: v for k, v in overrides.items() if v is not None})
    return Settings(**merged)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: where (line and column, from 1) and what ("line 2, column 1:
    expected the node content, but found '<stream end>'"), not PyYAML's lines with the snippet."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if problem is None:
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}" + (f" ({context})" if context else "")


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, section by section: GOSCHED_PROFILE__PREEMPTION=false changes that one
    key of the file's profile, not the whole section back to its defaults."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        out[key] = _deep_merge(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return out


def env_has_settings() -> bool:
    return any(k.startswith("GOSCHED_") and k != "GOSCHED_CONFIG" for k in os.environ)


# GOSCHED_* names that are not settings: the config file, the client's master and credentials,
# the trace folder, what the agent tells a task about itself, and the test suite's depth of
# property runs.
OTHER_ENV = frozenset(
    {
        "CONFIG",
        "DEBUG",  # tracebacks of the master's start-up failures
        "MASTER",
        "TLS_CA",
        "CLIENT_CERT",
        "CLIENT_KEY",
        "TOKEN",
        "TOKEN_FILE",
        "TRACE_DIR",
        "JOB_ID",
        "TASK_ID",
        "TASK_INDEX",
        "TASK_ROLE",
        "TASK_NONCE",  # the mark the agent finds a task's escaped processes by (agent/proctrack.py)
        "ATTEMPT",
        "PROPERTY_EXAMPLES",
    }
)


def _warn_unknown_env() -> None:
    """A GOSCHED_* name that is no setting is ignored by pydantic-settings without a word, so a
    typo (GOSCHED_SHARD=8) would silently do nothing: say so, with the nearest setting."""
    fields = [name.upper() for name in Settings.model_fields]
    for key in sorted(os.environ):
        if not key.startswith("GOSCHED_"):
            continue
        name = key.removeprefix("GOSCHED_")
        if name in OTHER_ENV or name.split("__")[0] in fields:
            continue
        near = difflib.get_close_matches(name.split("__")[0], fields, n=1)
        hint = f" (did you mean GOSCHED_{near[0]}?)" if near else ""
        log.warning("%s is not a setting and is ignored%s", key, hint)
